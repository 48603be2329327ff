"""Benchmark: ``python -m lp_fa4.bench [--quick] [--json PATH] [--plot PATH] [--demo]``.

Dense: the FA3-paper sweep (bf16, head dims 64/128/256, sequence 512..16k with B·S = 16k tokens and
H·D = 2048, causal and not, forward and backward) plus FA4's reference shape (4, 16, 4096, 128).
Varlen: B = 1152, H = 4, D = 128, max length 512..2048, sparsity 1.0 / 0.5 (the upstream GDPA rule).
FLOPs = 4·H·D·Σ Lq·Lk forward (halved for causal, exact per sequence), x2.5 backward, for every
provider, so padded peers are credited with useful work only.

Providers: ours (the portable Triton kernels; ``--variants`` adds ours[tma], the forward with TMA
descriptor loads, and ours[dq-atomic], the backward with atomic dQ), FA4 CuTe (when
``flash_attn.cute`` imports), cuDNN and flash through torch SDPA (dense; padded for varlen).
"""

from __future__ import annotations

import sys

import torch

from ads_kernel_tools.bench.cli import env as cli_env

# H200 targets from the issue (FA4 4.0.0b36 measured 708 / 577 TFLOP/s at (4, 16, 4096, 128))
FA4_DENSE = {"fwd": 708.0, "bwd": 577.0}
FA4_VARLEN = {(2048, 1.0): (542.0, 481.0), (2048, 0.5): (458.0, 426.0)}


class Bench:
    def __init__(self, args) -> None:
        from ads_kernel_tools.bench import Report

        self.args = args
        self.report = Report("lp_fa4: softmax attention bf16 (TFLOP/s, 4·H·D·ΣLqLk; causal /2; bwd x2.5)",
                             progress=True)  # fmt: skip
        self.x = 0

    def _time(self, fn) -> float:
        from ads_kernel_tools.bench import time_fn

        warm, rep = (10, 40) if self.args.quick else (25, 150)
        return time_fn(fn, warmup_ms=warm, rep_ms=rep)["ms"]

    def _add(self, op, provider, mode, shape, ms, flop):
        from ads_kernel_tools.bench import Row

        tf = flop / (ms * 1e-3) / 1e12 if ms else None
        self.report.add(Row(op, provider, mode, shape, ms, tf, extra={"x": self.x}))

    def fwd_bwd(self, op, provider, shape, run, flop, grad=True):
        """``run(grad)`` returns the output, or (output, leaves) with grad: time fwd, then bwd alone."""
        from ads_kernel_tools.bench import peers

        with peers.skip_on_error(f"{provider} {op} {shape}"):
            self._add(op, provider, "fwd", shape, self._time(lambda: run(False)), flop)
            if grad:
                out, leaves = run(True)
                do = torch.randn_like(out)
                ms = self._time(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
                self._add(op, provider, "bwd", shape, ms, 2.5 * flop)
                del out
        torch.cuda.empty_cache()

    def variants(self, op, shape, ours, flop) -> None:
        """--variants: ours[tma] (LP_FA4_TMA=1 forward) and ours[dq-atomic] (LP_FA4_DQ=atomic backward)."""
        if not self.args.variants:
            return
        with cli_env(LP_FA4_TMA="1"):
            self.fwd_bwd(op, "ours[tma]", shape, ours, flop, grad=False)
        with cli_env(LP_FA4_DQ="atomic"):
            self.fwd_bwd(op, "ours[dq-atomic]", shape, ours, flop)

    def dense(self, b: int, s: int, h: int, d: int, causal: bool) -> None:
        from ads_kernel_tools.bench import flops, peers

        from . import flash_attn_func

        op = f"dense d{d}{' causal' if causal else ''}"
        shape = f"B={b} S={s} H={h} D={d}"
        self.x = s
        flop = flops.attention_fwd([s] * b, [s] * b, h, d, causal=causal)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        def leaves(grad):
            return [t.detach().requires_grad_(grad) for t in (q, k, v)]

        def ours(grad):
            ls = leaves(grad)
            out = flash_attn_func(*ls, causal=causal)[0]
            return (out, ls) if grad else out

        self.fwd_bwd(op, "ours", shape, ours, flop)
        self.variants(op, shape, ours, flop)
        fa4 = peers.fa4()
        if fa4 is not None:

            def fa(grad):
                ls = leaves(grad)
                out = fa4.flash_attn_func(*ls, causal=causal)
                out = out[0] if isinstance(out, tuple) else out
                return (out, ls) if grad else out

            self.fwd_bwd(op, "fa4-cute", shape, fa, flop)
        for backend in ("cudnn", "flash"):
            sdpa = peers.sdpa(backend)
            if sdpa is None:
                continue

            def run(grad, sdpa=sdpa):
                ls = [t.detach().transpose(1, 2).contiguous().requires_grad_(grad) for t in (q, k, v)]
                out = sdpa(*ls, is_causal=causal)
                return (out, ls) if grad else out

            self.fwd_bwd(op, f"sdpa-{backend}", shape, run, flop)

    def varlen(self, max_len: int, sparsity: float, batch: int = 1152, h: int = 4, d: int = 128) -> None:
        from ads_kernel_tools.bench import peers
        from ads_kernel_tools.testing import jagged_lengths, lengths_to_offsets

        from . import flash_attn_varlen_func

        lens = jagged_lengths(batch, max_len, sparsity, seed=max_len)
        op = f"varlen s={sparsity}"
        shape = f"B={batch} H={h} D={d} max={max_len} Σ={sum(lens)}"
        self.x = max_len
        flop = 4.0 * h * d * sum(n * n for n in lens)
        t = sum(lens)
        q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = lengths_to_offsets(lens, device="cuda")

        def leaves(grad):
            return [x.detach().requires_grad_(grad) for x in (q, k, v)]

        def ours(grad):
            ls = leaves(grad)
            out = flash_attn_varlen_func(*ls, cu, cu, max_len, max_len)[0]
            return (out, ls) if grad else out

        self.fwd_bwd(op, "ours", shape, ours, flop)
        self.variants(op, shape, ours, flop)
        fa4 = peers.fa4()
        if fa4 is not None:

            def fa(grad):
                ls = leaves(grad)
                out = fa4.flash_attn_varlen_func(*ls, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                                                 max_seqlen_k=max_len)  # fmt: skip
                out = out[0] if isinstance(out, tuple) else out
                return (out, ls) if grad else out

            self.fwd_bwd(op, "fa4-cute-varlen", shape, fa, flop)
        cudnn = peers.sdpa("cudnn")
        if cudnn is not None:
            mask = torch.arange(max_len, device="cuda")[None, :] < torch.tensor(lens, device="cuda")[:, None]

            def pad(x):
                out = x.new_zeros(batch, max_len, h, d)
                out[mask] = x
                return out.transpose(1, 2).contiguous()

            qp, kp, vp = pad(q), pad(k), pad(v)
            attn = (mask[:, None, None, :]).expand(batch, 1, max_len, max_len)

            def padded(grad):
                ls = [x.detach().requires_grad_(grad) for x in (qp, kp, vp)]
                out = cudnn(*ls, attn_mask=attn if sparsity < 1.0 else None)
                return (out, ls) if grad else out

            self.fwd_bwd(op, "sdpa-cudnn(padded)", shape, padded, flop)


def main(argv: list[str] | None = None) -> int:
    from ads_kernel_tools.bench import cli

    from ._demo import demo

    flags = {"--dense-only": "skip the varlen rows", "--variants": "also time ours[tma] and ours[dq-atomic]"}
    prog = "python -m lp_fa4.bench"
    return cli.main(prog, __doc__.splitlines()[0], measure, demo=demo, flags=flags, argv=argv)


def measure(args) -> int:
    from ads_kernel_tools.bench import cli, peers

    bench = Bench(args)
    dims = (128,) if args.quick else (64, 128, 256)
    seqs = (2048, 4096, 8192) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    for d in dims:
        for causal in (False, True):
            for s in seqs:
                bench.dense(16384 // s, s, 2048 // d, d, causal)
    if not args.dense_only:
        rows = (
            [(2048, 1.0), (2048, 0.5)]
            if args.quick
            else [(n, sp) for n in (512, 1024, 2048) for sp in (1.0, 0.5)]
        )
        for n, sp in rows:
            bench.varlen(n, sp)
    bench.report.print_table()
    for name, why in peers.notes().items():
        print(f"  note: {name}: {why}")
    print(f"targets (H200): dense D=128 S>=2k fwd >= {0.9 * FA4_DENSE['fwd']:.0f}, bwd >= "
          f"{0.85 * FA4_DENSE['bwd']:.0f} (0.9x / 0.85x FA4 at 4x16x4096x128); varlen fwd >= FA4 varlen, "
          f"bwd >= 0.9x: {FA4_VARLEN}")  # fmt: skip
    cli.save(bench.report, args, x_key="x", x_label="sequence length (dense) / max length (varlen)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
