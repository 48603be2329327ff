"""The FP8 (float8_e4m3fn) backward of ``flash_attn_func`` / ``flash_attn_varlen_func``.

Gradient contract. The FP8 forward is the attention of the dequantised inputs ``q·q_descale`` etc.,
so its backward computes bf16 dQ, dK, dV of those dequantised values. Autograd casts a gradient to
its input's dtype, so a float8 leaf could only ever receive a float8 gradient: at the usual amax/448
scales the chain-rule gradient dQ·q_descale is far below e4m3's smallest subnormal (2^-9) and
flushes to zero. Users hold FP8 inputs quantised from bf16 tensors that require grad, so:

- :func:`quantize_fp8` is the differentiable quantiser (per (batch, kv head) power-of-two scales
  from amax/448, FA3's descale layout). The float8 tensor it returns remembers its source; the
  attention then sends the bf16 gradient of the dequantised input straight to that source (the
  straight-through rule of FP8 training: d loss / d x := d loss / d dequant(quant(x))), in the
  source's dtype. Pass the returned
  tensor to the attention as it is: a view or copy drops the link, and a gradient that then reaches
  the quantiser as float8 raises instead of flowing on silently. Eager mode only.
- Float8 leaves that require grad (and descales that require grad) get the true chain-rule
  gradients of the user's math: dQ·q_descale for q (cast to float8 by autograd, as said) and
  Σ dQ·q over each (sequence, kv head) for q_descale (fp32, exact). This works through the custom
  op too (torch.compile).
- :func:`fp8_attn_backward` returns bf16 (dq, dk, dv) of the dequantised inputs explicitly, from the
  forward's out and LSE, as upstream's ``mxfp8_flash_attn_varlen_backward`` does.

Kernel path: q, k, v are dequantised to bf16 (fp32 product, one rounding; one Triton pass each,
``scale_rows``; k_descale moves onto Q so that K stays exact, ``dequantised_grads``) and the BF16
backward runs
(``gluon.bwd_dispatch``: the Gluon kernel on sm_90, Triton elsewhere and on the interpreter). That is
the accuracy reference; FP8 GEMMs inside the backward are future work (BENCHMARKS.md, "FP8 backward").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ads_kernel_tools import checks
from ads_kernel_tools.kernels.grid import cdiv

from .triton.launch import BIG, _pad

Tensor = torch.Tensor
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_SOURCE = "_lp_fa4_fp8_source"


def _row_batch(cu: Tensor, rows: int) -> Tensor:
    """(rows,) int32: the sequence of each row of a varlen tensor (rows outside every sequence take
    the nearest one; their gradients are zero or unused)."""
    n_b = cu.shape[0] - 1
    idx = torch.arange(rows, device=cu.device, dtype=cu.dtype)
    rb = torch.searchsorted(cu[1:].contiguous(), idx, right=True, out_int32=True)
    return rb.clamp_(max=max(n_b - 1, 0))


def _row_scales(descale: Tensor, cu: Tensor, rows: int, heads: int) -> Tensor:
    """(rows, heads) fp32: each row's descale per head (the heads of a GQA group share one)."""
    per_row = descale[_row_batch(cu, rows)]  # (rows, Hkv)
    return per_row.repeat_interleave(heads // descale.shape[1], dim=1)


@triton.jit
def _scale_rows_kernel(X, Y, SC, RB, rows, HKV, HX: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """Y[r, h] = X[r, h] · SC[RB[r], h // G] in fp32, one rounding to Y's dtype; X, Y (rows, HX, D)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = tl.program_id(1)
    col = tl.arange(0, BLOCK_D)
    live = r < rows
    b = tl.load(RB + r, mask=live, other=0)
    sc = tl.load(SC + b.to(tl.int64) * HKV + h // G, mask=live, other=0.0)
    off = r[:, None].to(tl.int64) * (HX * D) + h * D + col[None, :]
    m = live[:, None] & (col[None, :] < D)
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + off, (x * sc[:, None]).to(Y.dtype.element_ty), mask=m)


@torch.library.custom_op("lp_fa4::scale_rows", mutates_args=())
def _scale_rows_op(x8: Tensor, descale: Tensor, cu: Tensor) -> Tensor:
    x8 = x8.contiguous()
    rows, hx, d = x8.shape
    if descale.numel() == 0:  # no sequence: no row belongs to one
        return torch.zeros(x8.shape, dtype=torch.bfloat16, device=x8.device)
    y = torch.empty(x8.shape, dtype=torch.bfloat16, device=x8.device)
    if rows == 0 or hx == 0:
        return y
    block_r = max(1, min(64, 8192 // _pad(d)))
    grid = (cdiv(rows, block_r), hx)
    _scale_rows_kernel[grid](x8, y, descale.contiguous(), _row_batch(cu, rows), rows, descale.shape[1], HX=hx,
                          G=hx // descale.shape[1], D=d, BLOCK_R=block_r, BLOCK_D=_pad(d))  # fmt: skip
    return y


@_scale_rows_op.register_fake
def _(x8, descale, cu):
    return torch.empty(x8.shape, dtype=torch.bfloat16, device=x8.device)


def scale_rows(x: Tensor, scale: Tensor, cu: Tensor) -> Tensor:
    """Varlen (rows, Hx, D) float8/bf16 -> bf16: x·scale[sequence, head // G], the product in fp32
    and one rounding; one Triton pass (for float8: 1 byte read, 2 written per element), a custom op
    (traceable)."""
    return torch.ops.lp_fa4.scale_rows(x, scale, cu)


def dequantised_grads(q8, k8, v8, descales, cu_q, cu_k, run_bwd):
    """bf16 (dq, dk, dv) of the dequantised inputs, ``run_bwd(q, k, v)`` being the BF16 backward.

    The backward recomputes the scores, and a bf16 rounding of both dequantised operands puts them
    off the forward's (exact e4m3 products, whose LSE the backward reuses) by enough to dominate the
    gradient error when K has outlier channels. So the kernel gets Q' = q8·q_descale·k_descale
    (rounded once) and K' = k8 (exact: e4m3 values are bf16 values), the same scores, and the
    gradients are mapped back: dQ = dQ'·k_descale, dK = dK' / k_descale (a zero k_descale keeps
    K' = 0 and dQ = dQ')."""
    qd, kd, vd = descales
    fold = torch.where(kd != 0, kd, torch.ones_like(kd))
    qb = scale_rows(q8, qd * fold, cu_q)
    kb = scale_rows(k8, kd / fold, cu_k)
    vb = scale_rows(v8, vd, cu_k)
    dq, dk, dv = run_bwd(qb, kb, vb)
    return scale_rows(dq, fold, cu_q), scale_rows(dk, 1.0 / fold, cu_k), dv


def _descale_grad(dx: Tensor, x8: Tensor, cu: Tensor, n_kv: int) -> Tensor:
    """d loss / d descale (B, Hkv) fp32 = Σ over each sequence's rows, the group's heads and D of
    d loss / d dequant(x) · x8."""
    rows, hx, d = x8.shape
    n_b = cu.shape[0] - 1
    per_row = (dx.float() * x8.float()).reshape(rows, n_kv, (hx // n_kv) * d).sum(-1)  # (rows, Hkv)
    idx = torch.arange(rows, device=cu.device)
    live = (idx >= cu[0]) & (idx < cu[-1])
    per_row = per_row * live[:, None]
    out = torch.zeros(n_b, n_kv, dtype=torch.float32, device=x8.device)
    return out.index_add_(0, _row_batch(cu, rows), per_row)


# --- the backward of lp_fa4::fwd for float8 inputs --------------------------------------------------


def _dequantised_grads(ctx, dout, dlse):
    """(dq, dk, dv) bf16 of the dequantised inputs, and the saved (q8, k8, v8, descales, cu_q, cu_k)."""
    from . import _ops

    q8, k8, v8, out, lse, cu_q, cu_k, used_q, used_k, sink, qd, kd, vd = ctx.saved_tensors

    def run_bwd(qb, kb, vb):
        return _ops.bwd_call(ctx, dout, dlse, qb, kb, vb, out, lse, cu_q, cu_k, used_q, used_k, sink)[:3]

    grads = dequantised_grads(q8, k8, v8, (qd, kd, vd), cu_q, cu_k, run_bwd)
    return grads, (q8, k8, v8), (qd, kd, vd), (cu_q, cu_k, cu_k)


def _input_grads(needs, grads, fp8, descales, cus):
    """Gradients for lp_fa4::fwd's inputs (``needs`` = their needs_input_grad): the float8 leaves'
    chain rule dX·descale (autograd casts it to float8) and the descales' Σ dX·x8."""
    from . import _ops

    res = [None] * len(needs)
    for i, (dx, x8, sc, cu) in enumerate(zip(grads, fp8, descales, cus)):
        if needs[i]:
            res[i] = dx.float() * _row_scales(sc, cu, x8.shape[0], x8.shape[1])[..., None]
        j = _ops.fwd_input_index(("q_descale", "k_descale", "v_descale")[i])
        if j < len(needs) and needs[j]:
            res[j] = _descale_grad(dx, x8, cu, sc.shape[1])
    return tuple(res)


def op_backward(ctx, dout, dlse):
    """``lp_fa4::fwd``'s backward for float8_e4m3fn q, k, v (``_ops._backward`` sends it here)."""
    grads, fp8, descales, cus = _dequantised_grads(ctx, dout, dlse)
    needs = getattr(ctx, "needs_input_grad", None) or (True,) * ctx.n_inputs
    return _input_grads(needs, grads, fp8, descales, cus)


# --- the differentiable quantiser and the straight-through path -------------------------------------


class _Quantise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_kv, cu, pow2):
        rows = x.shape[0]
        hx, d = x.shape[-2], x.shape[-1]
        xf = x.detach().float().reshape(rows, hx, d)
        amax = xf.abs().reshape(rows, n_kv, (hx // n_kv) * d).amax(-1)  # (rows, Hkv)
        n_b = cu.shape[0] - 1
        idx = torch.arange(rows, device=x.device)
        live = (idx >= cu[0]) & (idx < cu[-1])
        amax = amax * live[:, None]
        per_seq = torch.zeros(n_b, n_kv, dtype=torch.float32, device=x.device)
        per_seq = per_seq.scatter_reduce(0, _row_batch(cu, rows)[:, None].expand(-1, n_kv), amax, "amax")
        descale = per_seq / E4M3_MAX
        if pow2:  # 2^ceil(log2(amax / 448)): frexp gives amax/448 = m·2^e, m in [0.5, 1)
            m, e = torch.frexp(descale)
            descale = torch.ldexp(torch.ones_like(descale), torch.where(m == 0.5, e - 1, e))
        # all-zero and empty sequences: descale 1.0 (the forward's None)
        descale = torch.where(per_seq > 0, descale, 1.0)
        s = _row_scales(descale, cu, rows, hx)
        x8 = (xf / s[..., None]).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(x.shape)
        ctx.mark_non_differentiable(descale)
        return x8, descale

    @staticmethod
    def backward(ctx, dx8, ddescale):
        raise RuntimeError(
            "lp_fa4: a gradient reached quantize_fp8's output as float8: pass the float8 tensor that "
            "quantize_fp8 returned to flash_attn_func / flash_attn_varlen_func unchanged (a view, "
            "reshape or copy drops the link that sends bf16 gradients to its source)"
        )


def quantize_fp8(x: Tensor, kv_heads: int | None = None, cu_seqlens: Tensor | None = None, *,
                 power_of_two: bool = True):  # fmt: skip
    """Quantise a bf16/fp16/fp32 tensor for the FP8 attention: (float8_e4m3fn x8, fp32 descale (B, Hkv)).

    x is dense (B, S, H, D) or, with ``cu_seqlens`` (B+1,), varlen (T, H, D). The descale covers each
    (sequence, kv head) (``kv_heads`` groups H heads; None = H, i.e. k and v, or q without GQA):
    2^ceil(log2(amax/448)) by default, amax/448 with ``power_of_two=False``; 1.0 where a sequence is
    empty or all zeros; x8 = x / descale rounded to e4m3 (never saturating). Power-of-two descales
    cost the forward nothing measurable and make the backward's dequantised q, k, v exact in bf16, so
    its recomputed scores are the forward's (``dequantised_grads``): with outlier channels in K the
    dK and dV errors fall to the bf16 path's (BENCHMARKS.md, "FP8 backward"). Differentiable when x
    requires grad: the attention given x8 sends bf16 gradients of dequant(x8) straight to x (module
    docstring)."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dtype in (E4M3, torch.float8_e5m2):
        raise ValueError(f"lp_fa4: quantize_fp8 takes a bf16/fp16/fp32 tensor, got {getattr(x, 'dtype', x)}")
    dims = 3 if cu_seqlens is not None else 4
    if x.dim() != dims:
        raise ValueError(f"lp_fa4: quantize_fp8 needs a {dims}-D x here, got shape {tuple(x.shape)}")
    hx = x.shape[-2]
    n_kv = hx if kv_heads is None else checks.integer("kv_heads", kv_heads, prefix="lp_fa4: ", minimum=1)
    if hx % n_kv:
        raise ValueError(f"lp_fa4: kv_heads must be a positive divisor of x's {hx} heads, got {kv_heads!r}")
    if cu_seqlens is None:
        b, s = x.shape[0], x.shape[1]
        cu = torch.arange(0, b + 1, dtype=torch.int64, device=x.device) * s
        xv = x.reshape(b * s, hx, x.shape[-1])
    else:
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError("lp_fa4: cu_seqlens must be a 1-D int32 tensor")
        cu, xv = cu_seqlens, x
    if not isinstance(power_of_two, bool):
        raise ValueError(f"lp_fa4: power_of_two must be a bool, got {power_of_two!r}")
    x8, descale = _Quantise.apply(xv, n_kv, cu, power_of_two)
    x8 = x8.view(x.shape) if x8.shape != x.shape else x8
    if x.requires_grad and torch.is_grad_enabled():
        setattr(x8, _SOURCE, x)
    return x8, descale


def sources(q: Tensor, k: Tensor, v: Tensor):
    """(q_src, k_src, v_src) for float8 tensors made by :func:`quantize_fp8` from sources that require
    grad (None where there is none), or None when no gradient goes to a source."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    srcs = tuple(getattr(t, _SOURCE, None) for t in (q, k, v))
    if not any(s is not None and s.requires_grad for s in srcs):
        return None
    return srcs


class _SourceAttention(torch.autograd.Function):
    """lp_fa4::fwd on float8 inputs whose gradients go to the bf16 sources (straight through)."""

    @staticmethod
    def forward(ctx, q_src, k_src, v_src, *inputs):
        from . import _ops

        out = _ops.fwd_impl(*inputs)
        _ops._setup_context(ctx, inputs, out)
        ctx.eager = True
        ctx.src_dtypes = tuple(None if s is None else s.dtype for s in (q_src, k_src, v_src))
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse, _dout32=None):
        grads, fp8, descales, cus = _dequantised_grads(ctx, dout, dlse)
        needs = ctx.needs_input_grad
        to_src = tuple(None if dt is None or not needs[i] else g.to(dt)
                       for i, (g, dt) in enumerate(zip(grads, ctx.src_dtypes)))  # fmt: skip
        return to_src + _input_grads(needs[3:], grads, fp8, descales, cus)


def attend_sources(srcs, *inputs):
    """``_ops.attention(*inputs)`` for float8 q, k, v with bf16 sources ``srcs`` (reshaped like the
    op's q, k, v): the float8 tensors with a source enter detached, their gradient goes to it."""
    qkv = tuple(t.detach() if s is not None else t for t, s in zip(inputs[:3], srcs))
    return _SourceAttention.apply(*srcs, *qkv, *inputs[3:])


# --- the explicit backward ------------------------------------------------------------------------


def fp8_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    *,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """bf16 (dq, dk, dv) of the dequantised inputs of an FP8 ``flash_attn_func`` (dense: q (B, Sq,
    H, D), lse (B, H, Sq)) or ``flash_attn_varlen_func`` (with ``cu_seqlens_q/k``: q (Tq, H, D), lse
    (H, Tq)) call, from its bf16 ``out`` and fp32 ``lse`` (``return_lse=True``) and bf16 ``dout``.
    Same options as the forward had (causal, softmax_scale, max_seqlen_q/k); shapes like q, k, v."""
    from . import _ops
    from ._checks import _check_fp8, _check_index, _check_qkv, _resolve_window, _scale

    if q.dtype != E4M3:
        raise ValueError(f"lp_fa4: fp8_attn_backward takes float8_e4m3fn q, k, v, got {q.dtype}")
    varlen = cu_seqlens_q is not None
    if varlen != (cu_seqlens_k is not None):
        raise ValueError("lp_fa4: fp8_attn_backward needs both cu_seqlens_q and cu_seqlens_k, or neither")
    _check_qkv(q, k, v, 3 if varlen else 4, 3 if varlen else 4)
    h, d = q.shape[-2], q.shape[-1]
    if varlen:
        cu_q = _check_index("cu_seqlens_q", cu_seqlens_q, None, q.device)
        cu_k = _check_index("cu_seqlens_k", cu_seqlens_k, None, q.device)
        n_b = cu_q.shape[0] - 1
        if cu_k.shape[0] != n_b + 1:
            raise ValueError("lp_fa4: cu_seqlens_q and cu_seqlens_k must have the same length")
        lens_q, lens_k = (cu_q[1:] - cu_q[:-1]), (cu_k[1:] - cu_k[:-1])
        max_q = int(lens_q.max()) if max_seqlen_q is None and n_b else (max_seqlen_q or 0)
        max_k = int(lens_k.max()) if max_seqlen_k is None and n_b else (max_seqlen_k or 0)
        q3, k3, v3, do3 = q, k, v, dout
        lse_shape = (h, q.shape[0])
    else:
        n_b, sq = q.shape[0], q.shape[1]
        sk = k.shape[1]
        cu_q = torch.arange(0, n_b + 1, dtype=torch.int32, device=q.device) * sq
        cu_k = torch.arange(0, n_b + 1, dtype=torch.int32, device=q.device) * sk
        max_q, max_k = sq, sk
        q3 = q.reshape(n_b * sq, h, d)
        k3, v3 = k.reshape(n_b * sk, *k.shape[2:]), v.reshape(n_b * sk, *v.shape[2:])
        do3 = dout.reshape(n_b * sq, h, v.shape[-1])
        lse_shape = (n_b, h, sq)
    if tuple(lse.shape) != lse_shape or lse.dtype != torch.float32:
        raise ValueError(f"lp_fa4: lse must be float32 {lse_shape}, got {lse.dtype} {tuple(lse.shape)}")
    want = (*q3.shape[:-1], v.shape[-1])
    for name, t in (("out", out), ("dout", dout)):
        if t.dtype != torch.bfloat16 or t.numel() != q3.shape[0] * h * v.shape[-1]:
            raise ValueError(f"lp_fa4: {name} must be bfloat16 like the forward's out {want}, got "
                             f"{t.dtype} {tuple(t.shape)}")  # fmt: skip
    wl, wr = _resolve_window(causal, (None, None))
    descale = _check_fp8(q, k, v, q_descale, k_descale, v_descale, n_b, paged=False, sink=None, softcap=0.0,
                         window=(wl, wr))  # fmt: skip
    pb = _ops._problem(max_q, max_k, _scale(softmax_scale, d), 0.0, wl, wr, False, False, BIG)
    from .gluon import bwd_dispatch

    lse_f = _ops._flat(lse, not varlen).contiguous()
    do3 = do3.contiguous()
    o3 = out.reshape(want)

    def run_bwd(qb, kb, vb):
        return bwd_dispatch.bwd(
            do3, qb, kb, vb, o3, lse_f, None, cu_q, cu_k, None, None, pb, bool(deterministic)
        )[:3]

    dq, dk, dv = dequantised_grads(q3, k3, v3, descale, cu_q, cu_k, run_bwd)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
