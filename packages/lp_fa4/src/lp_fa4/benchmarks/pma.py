"""``python -m lp_fa4.benchmarks.pma``: broadcast_q (PMA) forward and backward, by plan and tile.

One block of Lq learned queries attends to each of B jagged kv sequences (default: ads-jfa's PMA
shape, B = 1152, lengths by ``ads_kernel_tools.testing.jagged_lengths`` at max 2048 and sparsity
0.5, H = 4, D = 128, bf16, scale 1/√D). For each ``--lq`` the script times, in ``--rounds``
interleaved rounds within one process (every sample of every round is kept):

- forward ``repeat``: the Gluon kernel on the queries repeated per kv sequence
  (``LP_FA4_BQ_SMALL_FWD=0``), and ``inplace``: the Triton kernel's in-place broadcast at
  ``config.bq_fwd_tile`` (``LP_FA4_BQ_SMALL_FWD=1``; query blocks of at most ``config.BQ_SMALL_Q``
  rows);
- backward ``repeat``: the Gluon backward on repeated queries (``LP_FA4_BROADCAST_Q=repeat``), and
  ``resident N,W,S``: the Triton query-resident kernel (``LP_FA4_BROADCAST_Q=resident``,
  ``LP_FA4_RESIDENT_KERNEL=triton``) at each ``--tiles`` entry (``LP_FA4_RESIDENT_TILE``; ``default``
  = ``config.resident_tile``), and at D = 128 ``resident gluon``, the Hopper one
  (``LP_FA4_RESIDENT_KERNEL=gluon``), each variant's gradients compared with the first tile's (the
  largest difference is reported).

TFLOP/s as ads-jfa counts them: 4·H·D·Lq·ΣLk forward, 2.5x that backward; medians of
``ads_kernel_tools.bench.time_fn``. The knobs are set through the environment, as a user would, and
restored afterwards. ``--json`` writes the rows and the environment. Without a GPU,
``TRITON_INTERPRET=1`` runs it on the CPU as a smoke test of the harness (use ``--tiny``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ads_kernel_tools.bench import environment, time_fn
from ads_kernel_tools.bench.cli import env
from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.testing import apply_interpreter_patches, jagged_lengths, lengths_to_offsets

from .. import config as cfg
from ..gluon.bwd_resident_sm90 import HEAD_DIM
from ..interface import jagged_attention

PROG = "python -m lp_fa4.benchmarks.pma"
KNOBS = ("LP_FA4_BQ_SMALL_FWD", "LP_FA4_BROADCAST_Q", "LP_FA4_RESIDENT_TILE", "LP_FA4_RESIDENT_KERNEL")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Time lp_fa4's broadcast_q (PMA) paths.")
    ap.add_argument("--lq", type=int, nargs="+", default=[32, 64, 128], help="query block lengths")
    ap.add_argument("--batch", type=int, default=1152, help="kv sequences")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tiles", nargs="+", default=["default"], help="resident tiles N,W,S (or default)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep-ms", type=float, default=40.0)
    ap.add_argument("--tiny", action="store_true", help="a small case (the CPU smoke test)")
    ap.add_argument("--json", type=Path, help="write the rows and the environment here")
    return ap


def _inputs(args, lq: int, device) -> dict[str, Any]:
    lens = jagged_lengths(args.batch, args.max_len, args.sparsity, seed=0)
    gen = torch.Generator(device=device).manual_seed(lq)
    total, h, d = sum(lens), args.heads, args.head_dim

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    q, k, v = rand(lq, h, d), rand(total, h, d), rand(total, h, d)
    return dict(q=q, k=k, v=v, do=rand(args.batch * lq, h, d), lq=lq, max_k=max(lens),
                cu_q=torch.tensor([0, lq], dtype=torch.int32, device=device),
                cu_k=lengths_to_offsets(lens, device=device), flop=4 * h * d * lq * total)  # fmt: skip


def _call(x: dict[str, Any], q, k, v):
    return jagged_attention(q, k, v, x["cu_q"], x["cu_k"], x["lq"], x["max_k"], broadcast_q=True,
                            softmax_scale=x["q"].shape[-1] ** -0.5)[0]  # fmt: skip


def _forward(x: dict[str, Any]):
    return lambda: _call(x, x["q"], x["k"], x["v"])


def _backward(x: dict[str, Any]):
    """A timed backward on a retained graph, and the gradients of one call."""
    leaves = [t.detach().requires_grad_() for t in (x["q"], x["k"], x["v"])]
    out = _call(x, *leaves)

    def grad():
        return torch.autograd.grad(out, leaves, x["do"], retain_graph=True)

    return grad, grad()


def _variants(lq: int, d: int, tiles: Sequence[str]) -> list[tuple[str, str, dict[str, str]]]:
    """(pass, name, knob settings) of every timed variant for a query block of lq rows."""
    rows: list[tuple[str, str, dict[str, str]]] = [
        ("fwd", "repeat", dict(LP_FA4_BQ_SMALL_FWD="0", LP_FA4_BROADCAST_Q="repeat")),
    ]
    if lq <= cfg.BQ_SMALL_Q:
        rows.append(("fwd", "inplace", dict(LP_FA4_BQ_SMALL_FWD="1", LP_FA4_BROADCAST_Q="resident")))
    rows.append(("bwd", "repeat", dict(LP_FA4_BROADCAST_Q="repeat")))
    if lq <= cfg.RESIDENT_LQ:
        for tile in tiles:
            raw = "" if tile == "default" else tile  # empty: config.resident_tile's own pick
            knobs = dict(
                LP_FA4_BROADCAST_Q="resident", LP_FA4_RESIDENT_TILE=raw, LP_FA4_RESIDENT_KERNEL="triton"
            )
            rows.append(("bwd", f"resident {tile}", knobs))
        if d == HEAD_DIM:
            rows.append(
                ("bwd", "resident gluon", dict(LP_FA4_BROADCAST_Q="resident", LP_FA4_RESIDENT_KERNEL="gluon"))
            )
    return rows


def run(args) -> list[dict[str, Any]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: list[dict[str, Any]] = []
    for lq in args.lq:
        x = _inputs(args, lq, device)
        rows = {
            (p, n): dict(lq=lq, pass_=p, variant=n, tflops=[])
            for p, n, _ in _variants(lq, args.head_dim, args.tiles)
        }
        first_grads = None
        for _ in range(args.rounds):
            for p, name, knobs in _variants(lq, args.head_dim, args.tiles):
                with env(**knobs):
                    if p == "fwd":
                        fn, flop = _forward(x), x["flop"]
                    else:
                        fn, grads = _backward(x)
                        flop = 2.5 * x["flop"]
                        if name.startswith("resident"):
                            if first_grads is None:
                                first_grads = grads
                            diff = max(
                                float((a.float() - b.float()).abs().max()) for a, b in zip(grads, first_grads)
                            )
                            rows[(p, name)]["max_diff_to_first_tile"] = diff
                    ms = time_fn(fn, warmup_ms=min(10.0, args.rep_ms), rep_ms=args.rep_ms)["ms"]
                rows[(p, name)]["tflops"].append(flop / ms / 1e9)
        for row in rows.values():
            row["median"] = statistics.median(row["tflops"])
            results.append(row)
    return results


def _print(results: list[dict[str, Any]]) -> None:
    print(f"{'Lq':>4} {'pass':<4} {'variant':<22} {'median':>8}  rounds (TFLOP/s)")
    for r in results:
        extra = f"  max diff {r['max_diff_to_first_tile']:.3g}" if "max_diff_to_first_tile" in r else ""
        rounds = " / ".join(f"{t:.1f}" for t in r["tflops"])
        print(f"{r['lq']:>4} {r['pass_']:<4} {r['variant']:<22} {r['median']:>8.1f}  {rounds}{extra}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.batch, args.max_len, args.heads, args.head_dim, args.rep_ms = 3, 40, 2, 32, 1.0
        args.lq = sorted({min(lq, 20) for lq in args.lq})
    if not torch.cuda.is_available():
        if not interpreter_active():
            print(f"{PROG}: no CUDA device (set TRITON_INTERPRET=1 for the CPU smoke test)", file=sys.stderr)
            return 2
        apply_interpreter_patches()
    results = run(args)
    _print(results)
    if args.json is not None:
        rec = dict(
            argv=list(argv if argv is not None else sys.argv[1:]), rows=results, environment=environment()
        )
        args.json.write_text(json.dumps(rec, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
