"""``python -m lp_fa4.benchmarks.mxfp8``: the MXFP8 attention benchmark with upstream's flags and JSON.

Protocol (spec §1.5): the inputs are quantised once, outside timing (``--mode fwd``: Q/K hdim, V seq;
otherwise every orientation); one untimed call compiles; warm-up samples run until ``--warmup-ms``
of them have elapsed; a sample is ``--launches-per-sample`` back-to-back calls between two CUDA
events, reported per call; sampling continues until ``--measure-ms`` is covered. Results keep the raw
samples with mean / median / min / max / pstdev and TFLOP/s = flop / (mean_ms · 1e9), FLOPs
4·H·128·Σ Lq·Lk forward and 10·H·128·Σ Lq·Lk backward (broadcast: Lq·Σ Lk), the backward always with
``output_mxfp8_dkv=True``. Reference shape: ``--batch-size 8 --seqlen-q 2048 --seqlen-k 2048
--num-heads 16``.

Additions to upstream, each behind a flag: ``--bf16-peer`` times ``flash_attn_varlen_func`` on the
bf16 inputs at the same shape (the target is MXFP8 forward >= our BF16 forward) and ``--accuracy``
records cosine / SQNR of out (and dQ/dK/dV) against fp32 attention of the unquantised inputs.

Without a GPU the same code runs on the CPU under ``TRITON_INTERPRET=1`` with wall-clock samples (a
smoke test of the harness, not a measurement; use tiny shapes). On Hopper the MXFP8 functions are the
dequantise-then-BF16 path (see :mod:`lp_fa4.mxfp8.attention`), so expect BF16 speed minus the
dequantisation.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from ads_kernel_tools.bench import environment, flops
from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.testing import apply_interpreter_patches

from .. import __version__
from ..interface import flash_attn_varlen_func
from ..mxfp8 import (
    Mxfp8VarlenMeta,
    mxfp8_flash_attn_varlen_backward,
    mxfp8_flash_attn_varlen_forward,
    quantize_mxfp8_varlen,
)

HEAD_DIM = 128
PROG = "python -m lp_fa4.benchmarks.mxfp8"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Time lp_fa4's MXFP8 varlen attention (D=128 MHA).")
    ap.add_argument("--mode", choices=("fwd", "bwd", "both"), default="both")
    ap.add_argument("--batch-size", type=int, required=True, help="number of K/V sequences")
    q = ap.add_mutually_exclusive_group(required=True)
    q.add_argument("--seqlen-q", type=int, help="every query sequence's length")
    q.add_argument("--q-lengths", help="comma-separated query lengths (one with --broadcast-q)")
    k = ap.add_mutually_exclusive_group(required=True)
    k.add_argument("--seqlen-k", type=int, help="every K/V sequence's length")
    k.add_argument("--k-lengths", help="comma-separated K/V lengths, --batch-size of them")
    ap.add_argument("--num-heads", type=int, required=True)
    ap.add_argument("--broadcast-q", action="store_true", help="one query sequence attends to each K/V one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-ms", type=float, default=1000.0)
    ap.add_argument("--measure-ms", type=float, default=5000.0)
    ap.add_argument("--launches-per-sample", type=int, default=5)
    ap.add_argument("--scaling-mode", choices=("rceil", "floor"), default="rceil")
    ap.add_argument("--dq-accum-dtype", choices=("fp32", "fp16"), default="fp32")
    ap.add_argument("--p-scale-mode", choices=("const_p", "dynamic"), default="const_p")
    ap.add_argument("--output", type=Path, help="also write the JSON record to this file")
    ap.add_argument("--bf16-peer", action="store_true", help="also time the BF16 API on the same inputs")
    ap.add_argument("--accuracy", action="store_true", help="also record accuracy vs fp32 attention")
    return ap


def _lengths(raw: str | None, fixed: int | None, count: int, name: str) -> tuple[int, ...]:
    if raw is None:
        if fixed is None or fixed < 0:
            raise ValueError(f"--seqlen-{name} must be a non-negative int, got {fixed}")
        return (fixed,) * count
    try:
        values = tuple(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--{name}-lengths must be comma-separated ints, got {raw!r}") from None
    if any(n < 0 for n in values):
        raise ValueError(f"--{name}-lengths must be non-negative, got {raw!r}")
    return values


def resolve_lengths(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query lengths, K/V lengths) from the flags, checked against --batch-size and --broadcast-q."""
    if args.batch_size < 1 or args.num_heads < 1:
        raise ValueError("--batch-size and --num-heads must be positive")
    k_lengths = _lengths(args.k_lengths, args.seqlen_k, args.batch_size, "k")
    n_q = 1 if args.broadcast_q else args.batch_size
    q_lengths = _lengths(args.q_lengths, args.seqlen_q, n_q, "q")
    if len(k_lengths) != args.batch_size:
        raise ValueError(f"--k-lengths has {len(k_lengths)} entries, --batch-size is {args.batch_size}")
    if len(q_lengths) != n_q:
        raise ValueError(
            f"--q-lengths needs {n_q} entries ({'broadcast' if args.broadcast_q else 'per batch'})"
        )
    if sum(q_lengths) == 0 or sum(k_lengths) == 0:
        raise ValueError("the query and K/V batches each need at least one token")
    return q_lengths, k_lengths


def _timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """ms per call of ``launches`` back-to-back calls: CUDA events on a GPU, the wall clock otherwise."""
    if device.type == "cuda":

        def sample(fn, launches):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(launches):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / launches

    else:

        def sample(fn, launches):
            t0 = time.perf_counter()
            for _ in range(launches):
                fn()
            return (time.perf_counter() - t0) * 1e3 / launches

    return sample


def measure(fn: Callable[[], object], args: argparse.Namespace, device: torch.device) -> list[float]:
    """Per-call ms of each measured sample (at least one): an untimed compile call, warm-up, sampling."""
    sample = _timer(device)
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    warm = 0.0
    while warm < args.warmup_ms:
        warm += sample(fn, args.launches_per_sample) * args.launches_per_sample
    samples: list[float] = []
    covered = 0.0
    while covered < args.measure_ms or not samples:
        ms = sample(fn, args.launches_per_sample)
        samples.append(ms)
        covered += ms * args.launches_per_sample
    return samples


def summarise(samples: Sequence[float], flop: float) -> dict[str, Any]:
    mean = statistics.fmean(samples)
    return {
        "samples": len(samples),
        "samples_ms": list(samples),
        "mean_ms": mean,
        "median_ms": statistics.median(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "pstdev_ms": statistics.pstdev(samples),
        "flop": flop,
        "tflops": flop / (mean * 1e9),
    }


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def describe_environment(device: torch.device) -> dict[str, Any]:
    env = dict(environment())  # date, GPU, clocks, torch/triton/CUDA/cuDNN, peers, git revision
    env.update(
        python=sys.version,
        platform=platform.platform(),
        lp_fa4=_version("lp-fa4") or __version__,
        ads_kernel_tools=_version("ads-kernel-tools"),
        device=str(device),
        interpreter=interpreter_active(),
    )
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        env["compute_capability"] = f"{major}.{minor}"
    return env


def _accuracy(q, k, v, dout, q_meta, k_meta, out, grads, broadcast_q) -> dict[str, Any]:
    """Cosine and SQNR against fp32 attention of the unquantised inputs (the spec's gates' metrics)."""
    from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
    from ads_kernel_tools.tolerance import cosine_similarity, sqnr_db

    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    cu_q = q_meta.cu_seqlens
    q_in = qf
    if broadcast_q:
        n_b, lq = k_meta.batch_size, q_meta.total_tokens
        q_in = qf.repeat(n_b, 1, 1)
        cu_q = torch.arange(n_b + 1, dtype=torch.int32, device=q.device) * lq
    ref_out, _ = softmax_attention_varlen_ref(q_in, kf, vf, cu_q, k_meta.cu_seqlens)
    pairs = {"out": (out, ref_out.detach())}
    if grads is not None:
        ref_grads = torch.autograd.grad(ref_out, (qf, kf, vf), dout.float())
        pairs.update(zip(("dq", "dk", "dv"), zip(grads, ref_grads)))
    return {
        name: {"cosine": cosine_similarity(got.float(), ref), "sqnr_db": sqnr_db(got.float(), ref)}
        for name, (got, ref) in pairs.items()
    }


def run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Quantise, time and (with --accuracy) check; returns the JSON record."""
    q_lengths, k_lengths = resolve_lengths(args)
    h, bq = args.num_heads, args.broadcast_q
    gen = torch.Generator().manual_seed(args.seed)

    def rand(tokens: int) -> torch.Tensor:
        return torch.randn((tokens, h, HEAD_DIM), generator=gen).to(device=device, dtype=torch.bfloat16)

    q, k, v = rand(sum(q_lengths)), rand(sum(k_lengths)), rand(sum(k_lengths))
    out_rows = sum(q_lengths) * (args.batch_size if bq else 1)
    dout = rand(out_rows)
    q_meta = Mxfp8VarlenMeta.from_lengths(q_lengths, device=device)
    k_meta = Mxfp8VarlenMeta.from_lengths(k_lengths, device=device)
    fwd_only = args.mode == "fwd"
    orient = ("hdim", "hdim", "seq") if fwd_only else ("both", "both", "both")
    mq, mk, mv = (
        quantize_mxfp8_varlen(t, m, orientations=o, scaling_mode=args.scaling_mode)
        for t, m, o in zip((q, k, v), (q_meta, k_meta, k_meta), orient)
    )
    out, lse = mxfp8_flash_attn_varlen_forward(mq, mk, mv, q_meta, k_meta, broadcast_q=bq)
    flop_fwd = flops.attention_fwd(q_lengths, k_lengths, h, HEAD_DIM)
    flop_bwd = flops.attention_bwd(q_lengths, k_lengths, h, HEAD_DIM)
    dq_dtype = torch.float16 if args.dq_accum_dtype == "fp16" else torch.float32

    def bwd(output_mxfp8_dkv: bool = True):
        return mxfp8_flash_attn_varlen_backward(
            mq, mk, mv, out, dout, lse, q_meta, k_meta, broadcast_q=bq, dq_accum_dtype=dq_dtype,
            p_scale_mode=args.p_scale_mode, output_mxfp8_dkv=output_mxfp8_dkv,
        )  # fmt: skip

    results: dict[str, Any] = {}
    if args.mode in ("fwd", "both"):
        fwd = lambda: mxfp8_flash_attn_varlen_forward(
            mq, mk, mv, q_meta, k_meta, broadcast_q=bq, return_lse=False
        )
        results["fwd"] = summarise(measure(fwd, args, device), flop_fwd)
    if args.mode in ("bwd", "both"):
        results["bwd"] = summarise(measure(bwd, args, device), flop_bwd)
    if args.bf16_peer:
        cu_q, cu_k = q_meta.cu_seqlens, k_meta.cu_seqlens
        kw = dict(broadcast_q=bq, cpu_cu_seqlens_k=k_meta.cpu_cu_seqlens)
        call = lambda qq, kk, vv: flash_attn_varlen_func(
            qq, kk, vv, cu_q, cu_k, q_meta.max_seqlen, k_meta.max_seqlen, **kw
        )[0]
        if args.mode in ("fwd", "both"):
            with torch.no_grad():
                results["bf16_fwd"] = summarise(measure(lambda: call(q, k, v), args, device), flop_fwd)
        if args.mode in ("bwd", "both"):
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            o = call(qg, kg, vg)
            step = lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
            results["bf16_bwd"] = summarise(measure(step, args, device), flop_bwd)
    record: dict[str, Any] = {
        "argv": sys.argv[1:] if args.argv is None else list(args.argv),
        "environment": describe_environment(device),
        "seed": args.seed,
        "mode": args.mode,
        "num_heads": h,
        "head_dim": HEAD_DIM,
        "broadcast_q": bq,
        "q_lengths": list(q_lengths),
        "k_lengths": list(k_lengths),
        "cu_seqlens_q": q_meta.cpu_cu_seqlens.tolist(),
        "cu_seqlens_k": k_meta.cpu_cu_seqlens.tolist(),
        "cu_seqlens_sf_q": q_meta.cu_seqlens_sf.tolist(),
        "cu_seqlens_sf_k": k_meta.cu_seqlens_sf.tolist(),
        "scaling_mode": args.scaling_mode,
        "dq_accum_dtype": args.dq_accum_dtype,
        "p_scale_mode": args.p_scale_mode,
        "bwd_output_mxfp8_dkv": args.mode in ("bwd", "both"),
        "warmup_ms": args.warmup_ms,
        "measure_ms": args.measure_ms,
        "launches_per_sample": args.launches_per_sample,
        "path": "dequantise-then-bf16",
        "results": results,
    }
    if args.accuracy:
        grads = None if fwd_only else bwd(output_mxfp8_dkv=False)
        record["accuracy"] = _accuracy(q, k, v, dout, q_meta, k_meta, out, grads, bq)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.argv = argv
    if min(args.warmup_ms, args.measure_ms) < 0 or args.launches_per_sample < 1:
        ap.error("--warmup-ms and --measure-ms must be >= 0 and --launches-per-sample >= 1")
    try:
        resolve_lengths(args)
    except ValueError as e:
        ap.error(str(e))
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    elif interpreter_active():
        device = torch.device("cpu")
        apply_interpreter_patches()  # the interpreter's bf16 dot, as in the test suites and bench demos
        print(
            f"{PROG}: no GPU, running on the CPU interpreter (a smoke test, not a measurement)",
            file=sys.stderr,
        )
    else:
        print(
            f"{PROG} needs a CUDA GPU, or TRITON_INTERPRET=1 for a CPU smoke run on tiny shapes",
            file=sys.stderr,
        )
        return 2
    record = run(args, device)
    text = json.dumps(record, indent=2, sort_keys=True)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
