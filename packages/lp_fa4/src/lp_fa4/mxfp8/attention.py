"""``mxfp8_flash_attn_varlen_forward`` / ``_backward``: the upstream MXFP8 attention API (spec §1.3).

Hopper has no block-scaled MMA. Until an MXFP8 kernel lands, both functions dequantise their
operands exactly (E4M3 · 2^e is exact in bf16) and run the BF16 engine of this package
(:func:`lp_fa4.flash_attn_varlen_func`): the results are correct, and the speed is the BF16 path's
plus the dequantisation, i.e. not yet faster than BF16.

What the dequantise path does with the upstream contract:

* Forward uses Q.hdim, K.hdim, V.seq, as upstream. Backward requires the orientations upstream reads
  (Q and K both, V hdim) so that calling code ports unchanged, but computes the gradients from
  Q.hdim, K.hdim, V.hdim alone: it recomputes the forward with autograd (the public BF16 API has no
  separate backward entry), so ``out`` and ``lse`` are checked for shape and dtype but not read, and
  ``dout`` enters in BF16 as given (upstream quantises it in its preprocess kernel).
* ``dq_accum_dtype`` (fp32 | fp16) and ``p_scale_mode`` (const_p | dynamic) choose precisions inside
  the MXFP8 kernel (dQ accumulator, how P/dS are requantised). The BF16 engine always accumulates dQ
  in fp32 and keeps P/dS in bf16, so both values are accepted and give the same, at least as
  accurate, result; other values raise ValueError.
* ``output_mxfp8_dkv=True`` quantises the BF16 dK/dV along the head dim (32-blocks, ``rceil``) to E4M3
  with plain uint8 E8M0 scales (Tk, H, 4), value = e4m3 · 2^(byte - 127).
* Only non-causal D=128 MHA exists in the API (as upstream): K and V must have Q's head count.
"""

from __future__ import annotations

import torch

from ads_kernel_tools import checks

from ..interface import flash_attn_varlen_func
from .quantize import (
    HEAD_DIM,
    Mxfp8VarlenMeta,
    Mxfp8VarlenTensor,
    dequantize_mxfp8_varlen,
    quantize_mxfp8_rows,
)

__all__ = ["mxfp8_flash_attn_varlen_backward", "mxfp8_flash_attn_varlen_forward"]

_P_SCALE_MODES = ("const_p", "dynamic")
_DQ_ACCUM_DTYPES = (torch.float32, torch.float16)
_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _check_meta(name: str, meta) -> None:
    if not isinstance(meta, Mxfp8VarlenMeta):
        raise TypeError(f"lp_fa4 mxfp8: {name} must be an Mxfp8VarlenMeta, got {type(meta).__name__}")


def _check_metas(q_meta, k_meta, broadcast_q) -> None:
    _check_meta("q_meta", q_meta)
    _check_meta("k_meta", k_meta)
    if not isinstance(broadcast_q, bool):
        raise ValueError(f"lp_fa4 mxfp8: broadcast_q must be a bool, got {broadcast_q!r}")
    want = 1 if broadcast_q else k_meta.batch_size
    if q_meta.batch_size != want:
        why = "broadcast_q needs one query sequence" if broadcast_q else "Q and K need the same batch"
        raise ValueError(
            f"lp_fa4 mxfp8: q_meta has {q_meta.batch_size} sequences, k_meta {k_meta.batch_size} ({why})"
        )
    if q_meta.device != k_meta.device:
        raise ValueError(f"lp_fa4 mxfp8: q_meta is on {q_meta.device}, k_meta on {k_meta.device}")


def _num_heads(q) -> int:
    if not isinstance(q, Mxfp8VarlenTensor):
        raise TypeError(f"lp_fa4 mxfp8: q must be an Mxfp8VarlenTensor, got {type(q).__name__}")
    if q.hdim is None:
        raise ValueError(
            "lp_fa4 mxfp8: q has no hdim orientation (quantise with orientations='hdim' or 'both')"
        )
    if q.hdim.ndim != 3:
        raise ValueError(f"lp_fa4 mxfp8: q.hdim must be (tokens, H, {HEAD_DIM}), got {tuple(q.hdim.shape)}")
    return q.hdim.shape[1]


def _check_operand(name: str, t, meta: Mxfp8VarlenMeta, heads: int, orientations: tuple[str, ...]) -> None:
    if not isinstance(t, Mxfp8VarlenTensor):
        raise TypeError(f"lp_fa4 mxfp8: {name} must be an Mxfp8VarlenTensor, got {type(t).__name__}")
    p = meta.padded_tokens
    for o in orientations:
        payload, scale = (t.hdim, t.hdim_scale) if o == "hdim" else (t.seq, t.seq_scale)
        if payload is None or scale is None:
            raise ValueError(
                f"lp_fa4 mxfp8: {name} has no {o} orientation (quantise it with orientations='both')"
            )
        if payload.dtype != torch.float8_e4m3fn:
            raise TypeError(f"lp_fa4 mxfp8: {name}.{o} must be float8_e4m3fn, got {payload.dtype}")
        if payload.ndim != 3 or payload.shape[2] != HEAD_DIM:
            raise ValueError(
                f"lp_fa4 mxfp8: {name}.{o} must be (tokens, H, {HEAD_DIM}) "
                f"(MXFP8 is head dim {HEAD_DIM} only), got {tuple(payload.shape)}"
            )
        if payload.shape[1] != heads:
            raise NotImplementedError(
                f"lp_fa4 mxfp8: {name}.{o} has {payload.shape[1]} heads, q {heads}: "
                "GQA/MQA is not supported (MHA only)"
            )
        if payload.shape[0] != meta.total_tokens:
            raise ValueError(
                f"lp_fa4 mxfp8: {name}.{o} has {payload.shape[0]} tokens, its meta {meta.total_tokens}"
            )
        if scale.dtype != torch.uint8 and (_E8M0 is None or scale.dtype != _E8M0):
            raise TypeError(f"lp_fa4 mxfp8: {name}.{o}_scale must hold E8M0 bytes (uint8), got {scale.dtype}")
        want = (heads * p // 4, 16) if o == "hdim" else (heads * 32, p // 8)
        if tuple(scale.shape) != want:
            raise ValueError(
                f"lp_fa4 mxfp8: {name}.{o}_scale must be {want} for {heads} heads and {p} padded tokens "
                f"(sequences padded to 128), got {tuple(scale.shape)}"
            )
        if not payload.is_contiguous() or not scale.is_contiguous():
            raise ValueError(f"lp_fa4 mxfp8: {name}.{o} and its scale must be contiguous")
        if payload.device != meta.device or scale.device != meta.device:
            raise ValueError(
                f"lp_fa4 mxfp8: {name}.{o} and its scale must be on the meta's device {meta.device}"
            )


def _check_scale(softmax_scale) -> float | None:
    return checks.real("softmax_scale", softmax_scale, prefix="lp_fa4 mxfp8: ", allow_none=True)


def _attend(qd, kd, vd, q_meta, k_meta, softmax_scale, broadcast_q, return_lse):
    return flash_attn_varlen_func(
        qd,
        kd,
        vd,
        q_meta.cu_seqlens,
        k_meta.cu_seqlens,
        q_meta.max_seqlen,
        k_meta.max_seqlen,
        softmax_scale=softmax_scale,
        causal=False,
        broadcast_q=broadcast_q,
        cpu_cu_seqlens_k=k_meta.cpu_cu_seqlens,
        return_lse=return_lse,
    )


def _out_rows(q_meta: Mxfp8VarlenMeta, k_meta: Mxfp8VarlenMeta, broadcast_q: bool) -> int:
    return q_meta.total_tokens * k_meta.batch_size if broadcast_q else q_meta.total_tokens


def mxfp8_flash_attn_varlen_forward(
    q: Mxfp8VarlenTensor,
    k: Mxfp8VarlenTensor,
    v: Mxfp8VarlenTensor,
    q_meta: Mxfp8VarlenMeta,
    k_meta: Mxfp8VarlenMeta,
    *,
    softmax_scale: float | None = None,
    broadcast_q: bool = False,
    return_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Non-causal D=128 MHA over prequantised MXFP8 operands (Q.hdim, K.hdim, V.seq).

    Returns BF16 out (Tq, H, 128) and fp32 lse (H, Tq) (None without ``return_lse``); with
    ``broadcast_q`` the one query sequence attends to each K/V sequence: (B·Lq, H, 128), (H, B·Lq).
    On Hopper this is the dequantise-then-BF16 path (module docstring): correct, not yet faster than BF16.
    """
    _check_metas(q_meta, k_meta, broadcast_q)
    softmax_scale = _check_scale(softmax_scale)
    heads = _num_heads(q)
    _check_operand("q", q, q_meta, heads, ("hdim",))
    _check_operand("k", k, k_meta, heads, ("hdim",))
    _check_operand("v", v, k_meta, heads, ("seq",))
    qd = dequantize_mxfp8_varlen(q, q_meta, "hdim")
    kd = dequantize_mxfp8_varlen(k, k_meta, "hdim")
    vd = dequantize_mxfp8_varlen(v, k_meta, "seq")
    with torch.no_grad():
        out, lse = _attend(qd, kd, vd, q_meta, k_meta, softmax_scale, broadcast_q, bool(return_lse))
    return out, lse


def mxfp8_flash_attn_varlen_backward(
    q: Mxfp8VarlenTensor,
    k: Mxfp8VarlenTensor,
    v: Mxfp8VarlenTensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    q_meta: Mxfp8VarlenMeta,
    k_meta: Mxfp8VarlenMeta,
    *,
    softmax_scale: float | None = None,
    broadcast_q: bool = False,
    dq_accum_dtype: torch.dtype = torch.float32,
    p_scale_mode: str = "const_p",
    output_mxfp8_dkv: bool = False,
):
    """Gradients of :func:`mxfp8_flash_attn_varlen_forward` for BF16 ``dout``.

    Needs Q and K in both orientations and V.hdim (the upstream contract). Returns BF16
    ``(dq, dk, dv)``, or with ``output_mxfp8_dkv`` ``(dq, dk, dv, sf_dk, sf_dv)``: dk/dv E4M3
    (Tk, H, 128), sf_dk/sf_dv uint8 E8M0 (Tk, H, 4), value = e4m3 · 2^(byte - 127). With
    ``broadcast_q`` dq is summed over the K/V batch. On Hopper this recomputes the forward on the
    dequantised operands through the BF16 engine (module docstring): correct, not yet faster than BF16.
    """
    _check_metas(q_meta, k_meta, broadcast_q)
    softmax_scale = _check_scale(softmax_scale)
    if dq_accum_dtype not in _DQ_ACCUM_DTYPES:
        raise ValueError(
            f"lp_fa4 mxfp8: dq_accum_dtype must be torch.float32 or torch.float16, got {dq_accum_dtype!r}"
        )
    if p_scale_mode not in _P_SCALE_MODES:
        raise ValueError(f"lp_fa4 mxfp8: p_scale_mode must be one of {_P_SCALE_MODES}, got {p_scale_mode!r}")
    if not isinstance(output_mxfp8_dkv, bool):
        raise ValueError(f"lp_fa4 mxfp8: output_mxfp8_dkv must be a bool, got {output_mxfp8_dkv!r}")
    heads = _num_heads(q)
    _check_operand("q", q, q_meta, heads, ("hdim", "seq"))
    _check_operand("k", k, k_meta, heads, ("hdim", "seq"))
    _check_operand("v", v, k_meta, heads, ("hdim",))
    rows = _out_rows(q_meta, k_meta, broadcast_q)
    for name, t in (("out", out), ("dout", dout)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"lp_fa4 mxfp8: {name} must be a bfloat16 tensor, got {got}")
        if tuple(t.shape) != (rows, heads, HEAD_DIM):
            raise ValueError(f"lp_fa4 mxfp8: {name} must be {(rows, heads, HEAD_DIM)}, got {tuple(t.shape)}")
        if t.device != q_meta.device:
            raise ValueError(f"lp_fa4 mxfp8: {name} is on {t.device}, the metas on {q_meta.device}")
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != (heads, rows):
        got = (lse.dtype, tuple(lse.shape)) if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"lp_fa4 mxfp8: lse must be float32 {(heads, rows)}, got {got}")
    qd = dequantize_mxfp8_varlen(q, q_meta, "hdim").requires_grad_()
    kd = dequantize_mxfp8_varlen(k, k_meta, "hdim").requires_grad_()
    vd = dequantize_mxfp8_varlen(v, k_meta, "hdim").requires_grad_()
    with torch.enable_grad():
        o, _ = _attend(qd, kd, vd, q_meta, k_meta, softmax_scale, broadcast_q, False)
        dq, dk, dv = torch.autograd.grad(o, (qd, kd, vd), dout)
    if not output_mxfp8_dkv:
        return dq, dk, dv
    dk8, sf_dk = quantize_mxfp8_rows(dk, "rceil")
    dv8, sf_dv = quantize_mxfp8_rows(dv, "rceil")
    return dq, dk8, dv8, sf_dk, sf_dv
