"""Benchmark: ``python -m lp_fa4.bench [--quick] [--json PATH] [--plot PATH] [--demo]``.

Dense: the FA3-paper sweep (bf16, head dims 64/128/256, sequence 512..16k with B·S = 16k tokens and
H·D = 2048, causal and not, forward and backward) plus FA4's reference shape (4, 16, 4096, 128).
Varlen: B = 1152, H = 4, D = 128, max length 512..2048, sparsity 1.0 / 0.5 (the upstream GDPA rule).
FLOPs = 4·H·D·Σ Lq·Lk forward (halved for causal, exact per sequence), x2.5 backward, for every
provider, so padded peers are credited with useful work only.

FP8: float8_e4m3fn forward and backward rows (``fp8 ...`` ops) at D=128: dense B·S = 16k, H = 16, S
4096/8192, causal and not, and the Llama-style GQA shape (64 query / 8 kv heads, B = 1, S
4096..16384); provider ours[fp8] beside ours[bf16] on the same shape. Inputs are quantised once,
outside timing, with per-(batch, kv head) amax/448 scales; the notes give the out cosine and relative
error against fp32 attention of the dequantised inputs (torch SDPA in fp32) and, for the backward,
the dQ/dK/dV cosines and relative errors against the fp32 reference backward (batch 0, kv head 0 and
its query heads) and the cosines against ours[bf16]'s gradients of the unquantised inputs.

Providers: ours (the default dispatch: the Gluon kernels on sm_90 where their predicates admit the
call, else the portable Triton ones; ``--variants`` adds ours[triton], the portable kernels alone by
LP_FA4_BACKEND=triton), FA4 CuTe (when ``flash_attn.cute`` imports), cuDNN and flash through torch
SDPA (dense; padded for varlen).
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

    def _time_bwd(self, out, leaves, do) -> float:
        return self._time(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))

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
        """--variants: ours[triton] (LP_FA4_BACKEND=triton: the portable kernels, forward and backward)."""
        if not self.args.variants:
            return
        with cli_env(LP_FA4_BACKEND="triton"):
            self.fwd_bwd(op, "ours[triton]", shape, ours, flop)

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

    def fp8(self, b: int, s: int, h: int, hkv: int, d: int, causal: bool) -> None:
        """ours[fp8] and ours[bf16] forward and backward at one shape; accuracy of the FP8 output and
        gradients in the notes. The FP8 backward is timed as users run it: bf16 q, k, v quantised by
        ``fp8_bwd.quantize_fp8`` (outside timing), gradients to those sources."""
        from ads_kernel_tools.bench import Row, flops, peers

        from . import flash_attn_func
        from .fp8_bwd import quantize_fp8

        op = f"fp8 {'gqa' if hkv < h else 'dense'} d{d}{' causal' if causal else ''}"
        shape = f"B={b} S={s} H={h}/{hkv} D={d}"
        self.x = s
        flop = flops.attention_fwd([s] * b, [s] * b, h, d, causal=causal)
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        (q8, qd), (k8, kd), (v8, vd) = (quantise_fp8(t, hkv) for t in (q, k, v))
        with peers.skip_on_error(f"ours[fp8] {op} {shape}"), torch.no_grad():
            out = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)[0]
            cos, rel = _accuracy(
                out, *(dequantise_fp8(t, sc) for t, sc in ((q8, qd), (k8, kd), (v8, vd))), causal
            )
            del out
            ms = self._time(lambda: flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                                    v_descale=vd))  # fmt: skip
            tf = flop / (ms * 1e-3) / 1e12
            note = f"out cos {cos:.5f} rel err {rel:.4f}"
            self.report.add(Row(op, "ours[fp8]", "fwd", shape, ms, tf, note=note,
                                extra={"x": self.x, "cos": cos, "rel": rel}))  # fmt: skip
        with peers.skip_on_error(f"ours[bf16] {op} {shape}"), torch.no_grad():
            self._add(
                op,
                "ours[bf16]",
                "fwd",
                shape,
                self._time(lambda: flash_attn_func(q, k, v, causal=causal)),
                flop,
            )
        torch.cuda.empty_cache()
        if self.args.no_fp8_bwd:
            return
        do = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        bf16_grads = None
        with peers.skip_on_error(f"ours[bf16] bwd {op} {shape}"):
            out = flash_attn_func(*leaves, causal=causal)[0]
            bf16_grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
            self._add(op, "ours[bf16]", "bwd", shape, self._time_bwd(out, leaves, do), 2.5 * flop)
            del out
        with peers.skip_on_error(f"ours[fp8] bwd {op} {shape}"):
            (q8g, qdg), (k8g, kdg), (v8g, vdg) = (quantize_fp8(t, hkv) for t in leaves)
            descales = dict(q_descale=qdg, k_descale=kdg, v_descale=vdg)
            out = flash_attn_func(q8g, k8g, v8g, causal=causal, **descales)[0]
            grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
            ms = self._time_bwd(out, leaves, do)
            tf = 2.5 * flop / (ms * 1e-3) / 1e12
            ref = _grad_accuracy(grads, (q8g, k8g, v8g), (qdg, kdg, vdg), do, causal)
            vs_bf16 = [_cos(g, r) for g, r in zip(grads, bf16_grads)] if bf16_grads is not None else []
            note = ("d{q,k,v} cos vs fp32 " + "/".join(f"{c:.5f}" for c, _ in ref) + " rel err "
                    + "/".join(f"{r:.3f}" for _, r in ref) + "; cos vs ours[bf16] grads "
                    + "/".join(f"{c:.4f}" for c in vs_bf16))  # fmt: skip
            extra = {"x": self.x, "grad_cos": [c for c, _ in ref], "grad_rel": [r for _, r in ref],
                     "grad_cos_vs_bf16": vs_bf16}  # fmt: skip
            self.report.add(Row(op, "ours[fp8]", "bwd", shape, ms, tf, note=note, extra=extra))
            del out, grads
        del leaves, bf16_grads
        torch.cuda.empty_cache()

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


def quantise_fp8(x: torch.Tensor, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, H, D) -> (float8_e4m3fn x, fp32 (B, hkv) descales): amax/448 per (batch, kv head), the
    query heads of a GQA group sharing one scale (FA3's layout)."""
    b, s, h, d = x.shape
    amax = x.float().abs().reshape(b, s, hkv, h // hkv, d).amax(dim=(1, 3, 4))
    scale = (amax / 448.0).clamp_min(1e-12)
    return (x / scale.repeat_interleave(h // hkv, 1)[:, None, :, None]).to(torch.float8_e4m3fn), scale


def dequantise_fp8(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    g = x8.shape[2] // scale.shape[1]
    return x8.float() * scale.repeat_interleave(g, 1)[:, None, :, None]


def _accuracy(out, q, k, v, causal) -> tuple[float, float]:
    """(cosine, relative error) of ``out`` against fp32 SDPA of q, k, v (B, S, H·, D), per batch."""
    g = q.shape[2] // k.shape[2]
    dot = err = n_o = n_r = 0.0
    step = 4 if q.shape[1] <= 8192 else 1  # heads at a time: SDPA's fp32 math path holds S x S scores
    for i in range(q.shape[0]):
        for h0 in range(0, q.shape[2], step):
            heads = slice(h0, h0 + step)
            kv = [t[i, :, heads].contiguous() for t in (k.repeat_interleave(g, 2), v.repeat_interleave(g, 2))]
            qh, kh, vh = (t.transpose(0, 1) for t in [q[i, :, heads].contiguous(), *kv])
            ref = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(
                0, 1
            )
            o = out[i, :, heads].float()
            dot += float((o * ref).sum())
            err += float(((o - ref) ** 2).sum())
            n_o += float((o * o).sum())
            n_r += float((ref * ref).sum())
            del ref, kv
    return dot / (n_o * n_r) ** 0.5, (err / n_r) ** 0.5


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def _grad_accuracy(grads, x8, descales, do, causal) -> list[tuple[float, float]]:
    """(cosine, relative error) of dq, dk, dv against the fp32 reference backward of the dequantised
    inputs, on a sample that is exact for its entries: batch 0, kv head 0 and its query heads, one
    query head at a time (dK and dV summed over them) so that S x S fp32 scores fit at S = 16k."""
    from ads_kernel_tools.reference.attention import softmax_attention_ref

    g = x8[0].shape[2] // x8[1].shape[2]
    q, k, v = (dequantise_fp8(t[:1].detach(), sc[:1])[:, :, : (g if i == 0 else 1)]
               for i, (t, sc) in enumerate(zip(x8, descales)))  # fmt: skip
    k, v = k.contiguous().requires_grad_(), v.contiguous().requires_grad_()
    dq = torch.empty_like(q)
    for h in range(g):
        qh = q[:, :, h : h + 1].contiguous().requires_grad_()
        ref, _ = softmax_attention_ref(qh, k, v, causal=causal)
        ref.backward(do[:1, :, h : h + 1].float())
        dq[:, :, h : h + 1] = qh.grad
        del ref, qh
    res = []
    for got, r, n in zip(grads, (dq, k.grad, v.grad), (g, 1, 1)):
        o, r = got[:1, :, :n].float().flatten(), r.flatten()
        res.append((_cos(o, r), ((o - r).norm() / r.norm()).item()))
    return res


def main(argv: list[str] | None = None) -> int:
    from ads_kernel_tools.bench import cli

    from ._demo import demo

    flags = {
        "--dense-only": "skip the varlen rows",
        "--variants": "also time ours[triton] (LP_FA4_BACKEND=triton)",
        "--fp8-only": "only the FP8 rows (ours[fp8] beside ours[bf16])",
        "--no-fp8": "skip the FP8 rows",
        "--no-fp8-bwd": "FP8 rows: forward only",
    }
    prog = "python -m lp_fa4.bench"
    return cli.main(prog, __doc__.splitlines()[0], measure, demo=demo, flags=flags, argv=argv)


def measure(args) -> int:
    from ads_kernel_tools.bench import cli, peers

    bench = Bench(args)
    if not args.no_fp8:
        for causal in (False, True):
            for s in (4096, 8192):
                bench.fp8(16384 // s, s, 16, 16, 128, causal)
            for s in (4096,) if args.quick else (4096, 8192, 16384):
                bench.fp8(1, s, 64, 8, 128, causal)
    if args.fp8_only:
        bench.report.print_table()
        cli.save(bench.report, args, x_key="x", x_label="sequence length")
        return 0
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
    print("targets (H200): FP8 fwd >= 1000 at D=128 S>=4k non-causal and >= 1.4x ours[bf16]; "
          "FP8 bwd >= 1.25x ours[bf16]")  # fmt: skip
    cli.save(bench.report, args, x_key="x", x_label="sequence length (dense) / max length (varlen)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
