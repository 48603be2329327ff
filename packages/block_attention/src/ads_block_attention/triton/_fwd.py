"""Forward kernel: one program per (block slot, kv head); each handles the G query heads of that kv head.

Per query head h: S = Q Kᵀ·scale (fp32), invalid key columns set to -1e9 (finite, so no NaN can
appear), P = exp2(S·log2e - max) / rowsum, O = P V with P cast to the input dtype. No LSE is saved:
the backward recomputes P. Loading K and V once for G query heads is what makes GQA cheaper.
"""

import triton
import triton.language as tl

from ._rotary import load_sin_cos, rotate
from ._table import table_slot


@triton.jit
def block_attn_fwd_kernel(
    Q,
    K,
    V,
    OUT,
    SINU,
    TABLE,  # Q (T, H, D), K/V (T, H_KV, D), O (T, H, D), SINU (T, D), TABLE (slots, 2)
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_st,
    qk_scale,  # scale * log2(e): the softmax runs in base 2
    H_KV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    ROT_QK: tl.constexpr,
    ROT_V: tl.constexpr,
    PRECISION: tl.constexpr,
):
    hk, row0, n = table_slot(TABLE, H_KV)
    if n > 0:
        offs_m = tl.arange(0, BLOCK)
        offs_d = tl.arange(0, D)
        mask_m = offs_m < n  # rows past the block end belong to the next block or sequence
        rows = row0 + offs_m
        if ROT_QK or ROT_V:
            s_tab, c_tab = load_sin_cos(SINU, rows, mask_m, stride_st, D)
        k = tl.load(
            K + rows[:, None] * stride_kt + hk * stride_kh + offs_d[None, :], mask=mask_m[:, None], other=0.0
        )
        v = tl.load(
            V + rows[:, None] * stride_vt + hk * stride_vh + offs_d[None, :], mask=mask_m[:, None], other=0.0
        )
        if ROT_QK:
            k = rotate(k.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(K.dtype.element_ty)
        if ROT_V:
            v = rotate(v.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(V.dtype.element_ty)
        kt = tl.trans(k)
        for g in tl.static_range(G):
            h = hk * G + g
            q = tl.load(
                Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mask_m[:, None],
                other=0.0,
            )
            if ROT_QK:
                q = rotate(q.to(tl.float32), s_tab, c_tab, BLOCK, D, False).to(Q.dtype.element_ty)
            s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
            s = tl.where(mask_m[None, :], s, -1.0e9)
            m = tl.max(s, axis=1)
            p = tl.math.exp2(s - m[:, None])
            inv_l = 1.0 / tl.sum(p, axis=1)
            o = tl.dot(p.to(V.dtype.element_ty), v, input_precision=PRECISION) * inv_l[:, None]
            tl.store(
                OUT + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
                o.to(OUT.dtype.element_ty),
                mask=mask_m[:, None],
            )
