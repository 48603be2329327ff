"""Benchmark: ``python -m ads_gdpa.bench [--quick] [--json PATH] [--plot PATH] [--variants]``.

Upstream shapes (B=1152, H=4, D=128, bf16, fast_gelu, scale 1): self attention at max length
256..2048 and sparsity 1.0 / 0.5 (--quick: 2048 at 1.0 and 0.5, 1024 at 1.0, 512 at 0.5);
short-KV cross attention (dense KV of 256 keys, Q up to 2048); dense (4, 16, 4096, 128).
FLOPs = 4·H·D·Σ Lq·Lk forward, x2.5 backward (spec §4) for every provider, so padded peers are
credited with useful work only.

Providers: ours (default dispatch: on Hopper the warp-specialised Gluon forward, and the CuTe DSL
backward where the extra is installed and ``dispatch.PREFER`` takes it, else the Gluon one; Triton
where neither supports the call); with the CuTe DSL installed, ours[cute-bwd] and ours[gluon-bwd]
(backward only: the one backend at every row) and, with --variants, ours[cute-fwd] (forward only:
the opt-in CuTe DSL forward, ADS_GDPA_BACKEND=cute), ours[triton] (the portable Triton kernels); ours[fp8] and
ours[fp8,triton] (self-attention rows, forward only: e4m3 inputs quantised with per-head amax
descales, bf16 out, scale 1/max_len as upstream; the note gives the relative error against the fp32
GDPA of the dequantised inputs on the first sequences); naive
PyTorch GDPA (padded, eager and torch.compile; skipped where the S×S scores would not fit); FA4
CuTe varlen and cuDNN SDPA (softmax attention: speed references only).
"""

from __future__ import annotations

import sys

import torch

from ads_kernel_tools.bench.cli import env as cli_env

TARGETS = {"fwd": 600.0, "bwd": 420.0}
_NAIVE_MAX_SCORE_ELEMS = 6e9  # B·H·Sq·Sk above which the naive S×S buffers (x ~8 bf16 copies) would OOM


def _lengths(batch: int, max_len: int, sparsity: float, seed: int) -> list[int]:
    from ads_kernel_tools.testing import jagged_lengths

    return jagged_lengths(batch, max_len, sparsity, seed=seed)


def _naive(q, k, v, mask, scale=1.0):
    """Padded dense GDPA the way a user writes it: (B, H, S, D) in, S×S scores materialised."""
    s = q @ k.transpose(-1, -2)
    p = torch.nn.functional.gelu(s, approximate="tanh") * scale
    if mask is not None:
        p = p * mask
    return p @ v


def _pad(x: torch.Tensor, lens: list[int], s: int) -> torch.Tensor:
    """(T, H, D) jagged -> (B, H, S, D) zero-padded."""
    out = x.new_zeros(len(lens), s, x.shape[1], x.shape[2])
    mask = torch.arange(s, device=x.device)[None, :] < torch.tensor(lens, device=x.device)[:, None]
    out[mask] = x
    return out.transpose(1, 2).contiguous()


class Bench:
    def __init__(self, args) -> None:
        from ads_kernel_tools.bench import Report

        self.args = args
        self.report = Report("ads_gdpa: GDPA fast_gelu bf16 (TFLOP/s, 4·H·D·ΣLqLk; bwd x2.5)", progress=True)
        self._max_len = 0

    def _time(self, fn) -> float:
        from ads_kernel_tools.bench import time_fn

        warm, rep = (10, 50) if self.args.quick else (25, 200)
        return time_fn(fn, warmup_ms=warm, rep_ms=rep)["ms"]

    def _add(self, op, provider, mode, shape, ms, flop, note=""):
        from ads_kernel_tools.bench import Row

        tf = flop / (ms * 1e-3) / 1e12 if ms else None
        extra = {"max_len": self._max_len}
        self.report.add(Row(op, provider, mode, shape, ms, tf, note=note, extra=extra))

    def _fwd_bwd(self, op, provider, shape, fwd, flop, make_grad=True, time_fwd=True):
        """Time fwd (unless ``time_fwd`` is False: a backend switch that leaves the forward alone),
        then bwd alone (autograd.grad with a retained graph)."""
        from ads_kernel_tools.bench import peers

        with peers.skip_on_error(provider):
            if time_fwd:
                self._add(op, provider, "fwd", shape, self._time(lambda: fwd()), flop)
            if make_grad:
                out, leaves = fwd(grad=True)
                do = torch.randn_like(out)
                ms = self._time(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
                self._add(op, provider, "bwd", shape, ms, 2.5 * flop)
                del out
        torch.cuda.empty_cache()

    def case(self, op: str, lq: list[int], lk: list[int], heads: int, d: int) -> None:
        from ads_kernel_tools.bench import peers
        from ads_kernel_tools.testing import lengths_to_offsets

        from . import gdpa_varlen
        from .dispatch import cute_importable

        dev, dt = "cuda", torch.bfloat16
        b = len(lq)
        mq, mk = max(lq), max(lk)
        self._max_len = mq
        shape = f"B={b} H={heads} D={d} maxq={mq} maxk={mk} Σq={sum(lq)}"
        flop = 4.0 * heads * d * sum(a * c for a, c in zip(lq, lk))
        q = torch.randn(sum(lq), heads, d, device=dev, dtype=dt) * 0.3
        k = torch.randn(sum(lk), heads, d, device=dev, dtype=dt) * 0.3
        v = torch.randn(sum(lk), heads, d, device=dev, dtype=dt)
        # self attention: one set of offsets for queries and keys, as users pass them
        cu_q = lengths_to_offsets(lq, device=dev)
        cu_k = cu_q if lk is lq else lengths_to_offsets(lk, device=dev)
        hq = cu_q.tolist()
        hk = hq if cu_k is cu_q else cu_k.tolist()

        def ours(grad=False, **kw):
            leaves = [t.detach().requires_grad_(grad) for t in (q, k, v)]
            out = gdpa_varlen(*leaves, cu_q, cu_k, mq, mk, activation="fast_gelu",
                              cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk, **kw)  # fmt: skip
            return (out, leaves) if grad else out

        self._fwd_bwd(op, "ours", shape, ours, flop)
        if cute_importable():  # each sm_90 backward at every row, beside the dispatch's choice
            for backend in ("cute", "gluon"):
                with cli_env(ADS_GDPA_BWD_BACKEND=backend):
                    self._fwd_bwd(op, f"ours[{backend}-bwd]", shape, ours, flop, time_fwd=False)
            if self.args.variants:  # until its GPU tests have passed, not in the default run
                with cli_env(ADS_GDPA_BACKEND="cute"):
                    self._fwd_bwd(op, "ours[cute-fwd]", shape, ours, flop, make_grad=False)
        with cli_env(ADS_GDPA_BACKEND="triton"):
            self._fwd_bwd(op, "ours[triton]", shape, ours, flop)
        if op.startswith("self"):
            self._fp8_rows(op, shape, (q, k, v), (cu_q, cu_k, hq, hk), mq, mk, flop)
        if self.args.variants:
            self._fwd_bwd(op, "ours[det]", shape, lambda grad=False: ours(grad, deterministic=True), flop)
            with cli_env(ADS_GDPA_BWD_BACKEND="triton", ADS_GDPA_BWD_TMA="1"):
                self._fwd_bwd(op, "ours[triton-bwd-tma-loads]", shape, ours, flop)
            with cli_env(ADS_GDPA_BACKEND="triton", ADS_GDPA_PERSISTENT="1"):
                self._fwd_bwd(op, "ours[triton-persistent]", shape, ours, flop, make_grad=False)
            with cli_env(ADS_GDPA_PACKED_ACT="1"):
                self._fwd_bwd(op, "ours[packed-act]", shape, ours, flop, make_grad=False)

        # padded dense peers
        dense_ok = b * heads * mq * mk <= _NAIVE_MAX_SCORE_ELEMS
        if self.args.quick and op != "dense":
            dense_ok = False
        if dense_ok:
            qp, kp, vp = _pad(q, lq, mq), _pad(k, lk, mk), _pad(v, lk, mk)
            mask = None
            if min(lk) < mk or min(lq) < mq:
                lq_t, lk_t = torch.tensor(lq, device=dev), torch.tensor(lk, device=dev)
                rows = torch.arange(mq, device=dev)[None, :] < lq_t[:, None]
                cols = torch.arange(mk, device=dev)[None, :] < lk_t[:, None]
                mask = (rows[:, None, :, None] & cols[:, None, None, :]).to(dt)

            def naive(fn):
                def run(grad=False):
                    leaves = [t.detach().requires_grad_(grad) for t in (qp, kp, vp)]
                    out = fn(*leaves, mask)
                    return (out, leaves) if grad else out

                return run

            self._fwd_bwd(op, "torch-eager", shape, naive(_naive), flop)
            # A fresh static compile per shape: one compiled function reused across the sweep goes
            # dynamic after its first recompile and then ran the dense case at 147 instead of 219
            # TFLOP/s (H200), which flattered the ratio to it.
            torch._dynamo.reset()
            self._fwd_bwd(op, "torch-compile", shape, naive(peers.compiled(_naive, dynamic=False)), flop)
        else:
            why = "skipped: the padded S×S scores would not fit (or --quick)"
            peers.note(f"torch-naive {op} {shape}", why)
        self._softmax_peers(op, shape, q, k, v, lq, lk, cu_q, cu_k, flop)
        torch.cuda.empty_cache()

    def _fp8_rows(self, op, shape, qkv, offsets, mq, mk, flop) -> None:
        """FP8 forward rows, each with its accuracy: quantised as users do (per-head amax / 448)."""
        from ads_kernel_tools.bench import peers
        from ads_kernel_tools.reference.gdpa import gdpa_ref
        from ads_kernel_tools.tolerance import rel_norm_error

        from . import gdpa_varlen

        cu_q, cu_k, hq, hk = offsets
        fp8, descale = [], []
        for x in qkv:
            ds = (x.float().abs().amax(dim=(0, 2)) / 448.0).clamp_min(1e-12)
            fp8.append((x.float() / ds[None, :, None]).to(torch.float8_e4m3fn))
            descale.append(ds)
        scale = 1.0 / mq
        # accuracy on the first sequences (the reference materialises their S×S scores)
        n_seq = min(4, len(hq) - 1)
        rq, rk = hq[n_seq], hk[n_seq]
        deq = [
            (x.float() * ds[None, :, None])[: (rq if i == 0 else rk)]
            for i, (x, ds) in enumerate(zip(fp8, descale))
        ]
        sub_q, sub_k = cu_q[: n_seq + 1], cu_k[: n_seq + 1]
        ref = gdpa_ref(*deq, sub_q, sub_k, mq, mk, activation="fast_gelu", scale=scale)

        def run():
            return gdpa_varlen(*fp8, cu_q, cu_k, mq, mk, activation="fast_gelu", scale=scale,
                               q_descale=descale[0], k_descale=descale[1], v_descale=descale[2],
                               cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk)  # fmt: skip

        for provider, env in (("ours[fp8]", {}), ("ours[fp8,triton]", {"ADS_GDPA_BACKEND": "triton"})):
            with cli_env(**env), peers.skip_on_error(provider):
                err = rel_norm_error(run()[:rq], ref)
                self._add(op, provider, "fwd", shape, self._time(run), flop, note=f"rel err {err:.3f}")
        torch.cuda.empty_cache()

    def _softmax_peers(self, op, shape, q, k, v, lq, lk, cu_q, cu_k, flop) -> None:
        from ads_kernel_tools.bench import peers

        mq, mk = max(lq), max(lk)
        fa = peers.fa4_varlen()
        if fa is not None:

            def fa_run(grad=False):
                leaves = [t.detach().requires_grad_(grad) for t in (q, k, v)]
                out = fa(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
                out = out[0] if isinstance(out, tuple) else out
                return (out, leaves) if grad else out

            self._fwd_bwd(op, "fa4-varlen(softmax)", shape, fa_run, flop)
        cudnn = peers.sdpa("cudnn")
        if cudnn is not None and len(lq) * max(mq, mk) * q.shape[1] * q.shape[2] * 2 * 4 < 40e9:
            qp, kp, vp = _pad(q, lq, mq), _pad(k, lk, mk), _pad(v, lk, mk)

            def cudnn_run(grad=False):
                leaves = [t.detach().requires_grad_(grad) for t in (qp, kp, vp)]
                out = cudnn(*leaves)
                return (out, leaves) if grad else out

            self._fwd_bwd(op, "cudnn-sdpa(softmax,padded)", shape, cudnn_run, flop)


def main(argv: list[str] | None = None) -> int:
    from ads_kernel_tools.bench import cli

    from ._demo import demo

    variants = (
        "also time ours[det] (deterministic backward), "
        "ours[triton-bwd-tma-loads] (Triton backward with TMA Q/dO loads), ours[triton-persistent] "
        "(Triton forward, persistent grid), ours[packed-act] (Gluon forward, ADS_GDPA_PACKED_ACT=1)"
    )
    return cli.main(
        "python -m ads_gdpa.bench", __doc__.splitlines()[0], measure, demo=demo,
        flags={"--variants": variants}, argv=argv,
    )  # fmt: skip


def measure(args) -> int:
    from ads_kernel_tools.bench import cli, peers

    bench = Bench(args)
    batch, heads, d = 1152, 4, 128
    self_lens = [(2048, 1.0), (2048, 0.5), (1024, 1.0), (512, 0.5)] if args.quick else [
        (n, s) for n in (256, 512, 1024, 2048) for s in (1.0, 0.5)]  # fmt: skip
    for n, s in self_lens:
        lens = _lengths(batch, n, s, seed=n)
        bench.case(f"self s={s}", lens, lens, heads, d)
    for n in (2048,) if args.quick else (256, 512, 1024, 2048):
        bench.case("shortkv kv=256", _lengths(batch, n, 1.0, seed=n), [256] * batch, heads, d)
    bench.case("dense", [4096] * 4, [4096] * 4, 16, d)
    bench.report.print_table()
    for name, why in peers.notes().items():
        print(f"  note: {name}: {why}")
    fwd_t, bwd_t = TARGETS["fwd"], TARGETS["bwd"]
    print(f"targets (H200, max len 2048, s=1.0): fwd >= {fwd_t:.0f}, bwd >= {bwd_t:.0f} TFLOP/s")
    cli.save(bench.report, args, x_key="max_len")
    return 0


if __name__ == "__main__":
    sys.exit(main())
