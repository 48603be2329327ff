"""Backward kernel: one program per (block slot, kv head), complete within its block (no atomics).

Recomputes S and P (no LSE), then per query head: dV += Pᵀ dO, dP = dO Vᵀ, Di = rowsum(P⊙dP),
dS = P⊙(dP − Di)·scale, dQ = dS K, dK += dSᵀ Q. dK/dV of the kv head accumulate over its G query heads
in registers. With ROT_QK/ROT_V the inputs are the unrotated projections: tiles are rotated after load
and the gradients get the transpose rotation before the store (the fused rotary backward epilogue).
"""

import triton
import triton.language as tl

from ._rotary import load_sin_cos, rotate
from ._table import table_slot


@triton.jit
def block_attn_bwd_kernel(
    Q,
    K,
    V,
    DO,
    DQ,
    DK,
    DV,
    SINU,
    TABLE,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dot,
    stride_doh,
    stride_dqt,
    stride_dqh,
    stride_dkt,
    stride_dkh,
    stride_dvt,
    stride_dvh,
    stride_st,
    sm_scale,
    qk_scale,  # scale and scale * log2(e)
    H_KV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    ROT_QK: tl.constexpr,
    ROT_V: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (block slot, kv head); empty slots (n = 0) do nothing."""
    hk, row0, n = table_slot(TABLE, H_KV)
    if n > 0:
        dtype = Q.dtype.element_ty
        offs_m = tl.arange(0, BLOCK)
        offs_d = tl.arange(0, D)
        mask_m = offs_m < n
        mask_2d = mask_m[:, None]
        rows = row0 + offs_m
        if ROT_QK or ROT_V:
            s_tab, c_tab = load_sin_cos(SINU, rows, mask_m, stride_st, D)
        k = tl.load(K + rows[:, None] * stride_kt + hk * stride_kh + offs_d[None, :], mask=mask_2d, other=0.0)
        v = tl.load(V + rows[:, None] * stride_vt + hk * stride_vh + offs_d[None, :], mask=mask_2d, other=0.0)
        if ROT_QK:
            k = rotate(k.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(dtype)
        if ROT_V:
            v = rotate(v.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(dtype)
        dk = tl.zeros((BLOCK, D), dtype=tl.float32)
        dv = tl.zeros((BLOCK, D), dtype=tl.float32)
        for g in tl.static_range(G):
            h = hk * G + g
            q = tl.load(
                Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=mask_2d, other=0.0
            )
            do = tl.load(
                DO + rows[:, None] * stride_dot + h * stride_doh + offs_d[None, :], mask=mask_2d, other=0.0
            )
            if ROT_QK:
                q = rotate(q.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(dtype)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
            s = tl.where(mask_m[None, :], s, -1.0e9)
            m = tl.max(s, axis=1)
            p = tl.math.exp2(s - m[:, None])
            p = p * (1.0 / tl.sum(p, axis=1))[:, None]
            p = tl.where(mask_2d, p, 0.0)  # padded query rows must not feed dK/dV
            dv += tl.dot(tl.trans(p.to(dtype)), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            di = tl.sum(p * dp, axis=1)  # = rowsum(dO ⊙ O), without having saved O
            ds = (p * (dp - di[:, None]) * sm_scale).to(dtype)
            dq = tl.dot(ds, k, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds), q, input_precision=PRECISION)
            if ROT_QK:
                dq = rotate(dq, s_tab, c_tab, BLOCK, D, True)
            tl.store(
                DQ + rows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :],
                dq.to(DQ.dtype.element_ty),
                mask=mask_2d,
            )
        if ROT_QK:
            dk = rotate(dk, s_tab, c_tab, BLOCK, D, True)
        if ROT_V:
            dv = rotate(dv, s_tab, c_tab, BLOCK, D, True)
        tl.store(
            DK + rows[:, None] * stride_dkt + hk * stride_dkh + offs_d[None, :],
            dk.to(DK.dtype.element_ty),
            mask=mask_2d,
        )
        tl.store(
            DV + rows[:, None] * stride_dvt + hk * stride_dvh + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=mask_2d,
        )
