"""Forward kernel: one program per (sequence, head, BLOCK_M query rows); online softmax in exp2.

FP8 (``FP8``; float8_e4m3fn Q, K, V, bf16 out): S = Q·Kᵀ from e4m3 operands, its descale
q_descale·k_descale of the (sequence, kv head) folded into the score scale. P·V needs P in e4m3
too: P = exp2(s - m + P_SHIFT) ∈ [0, 2^P_SHIFT] (FA3's fixed shift of 8, i.e. P·256): the scale
costs nothing (it rides in exp2's argument), is exact (a power of two), cancels in O = acc / l (l
sums the same shifted P) and keeps P's largest values at 256, clear of e4m3's max 448, while P down
to 2^-17 of the row maximum stays representable (e4m3 subnormals reach 2^-9). V is read through a
K-major (H_kv·D_V, keys) copy (``ads_kernel_tools.kernels.transpose.v_kmajor``), as Hopper's fp8
wgmma takes its B operand; the output is multiplied by v_descale.
"""

import triton
import triton.language as tl

from ._common import band_mask, diag_offset, key_rows, scores, seq_extent

P_SHIFT = tl.constexpr(8.0)  # FP8: P scaled by 2^8 = 256 before its e4m3 rounding (module docstring)


@triton.jit
def _step(
    acc, l_i, m_i, q, start_n, offs_m, offs_d, offs_dv, K, V, PT, b, hk, k0, k_len,
    spt_b, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    NUM_PAGES, MAX_PAGES, off, win_left, win_right, qk_scale2, cap_in, cap_out2, k_desc, v_desc,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, SOFTCAP: tl.constexpr, USE_TMA: tl.constexpr, MASKED: tl.constexpr,
    FP8: tl.constexpr = False,
):  # fmt: skip
    """One key tile of the online softmax (scores in log2 units, the scale folded into exp2's
    argument). MASKED applies the band / sequence-end mask; unmasked tiles skip it entirely.
    FP8: V is the K-major copy (row hk·D_V + d, column k0 + key; stride_vt its row stride), and P is
    shifted by P_SHIFT and rounded to e4m3."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_ok = offs_n < k_len
    if USE_TMA:
        kt = tl.trans(k_desc.load([start_n, 0]))
    else:
        koff = key_rows(K, PT, b, offs_n, k0, k_len, spt_b, stride_kp, stride_kt, NUM_PAGES, MAX_PAGES,
                        PAGED, PAGE_SIZE)  # fmt: skip
        kt = tl.load(K + koff[None, :] + hk * stride_kh + offs_d[:, None],
                     mask=k_ok[None, :] & (offs_d[:, None] < D_QK), other=0.0)  # fmt: skip
    s2, _t = scores(tl.dot(q, kt), qk_scale2, cap_in, cap_out2, SOFTCAP)
    if MASKED:
        s2 = tl.where(band_mask(offs_m, offs_n, k_len, off, win_left, win_right), s2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        # a row that has seen no key yet keeps max -inf: shift by 0 so exp2 gives 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s2, 1))  # finite: every row has BLOCK_N valid keys here
        m_use = m_new
    if FP8:
        p = tl.exp2(s2 - (m_use - P_SHIFT)[:, None])
    else:
        p = tl.exp2(s2 - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP8:
        vt_rows = (hk * D_V + offs_dv).to(tl.int64) * stride_vt
        v = tl.load(V + vt_rows[None, :] + (k0 + offs_n)[:, None],
                    mask=k_ok[:, None] & (offs_dv[None, :] < D_V), other=0.0)  # fmt: skip
    elif USE_TMA:
        v = v_desc.load([start_n, 0])
    else:
        voff = key_rows(V, PT, b, offs_n, k0, k_len, spt_b, stride_vp, stride_vt, NUM_PAGES, MAX_PAGES,
                        PAGED, PAGE_SIZE)  # fmt: skip
        v = tl.load(V + voff[:, None] + hk * stride_vh + offs_dv[None, :],
                    mask=k_ok[:, None] & (offs_dv[None, :] < D_V), other=0.0)  # fmt: skip
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def fwd_kernel(
    Q, K, V, OUT, LSE, CU_Q, CU_K, USED_Q, USED_K, PT, SINK,
    stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_lb, stride_lh, spt_b,
    TQ, TK, TO, NUM_PAGES, MAX_PAGES, K_CAP, ROWS_CAP, H, G,
    qk_scale2, cap_in, cap_out2, win_left, win_right, QD, KD, VD,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HAS_USED_Q: tl.constexpr, HAS_USED_K: tl.constexpr, PAGED: tl.constexpr, HAS_SINK: tl.constexpr,
    SOFTCAP: tl.constexpr, TOP_LEFT: tl.constexpr, BROADCAST_Q: tl.constexpr, LSE_PER_SEQ: tl.constexpr,
    USE_TMA: tl.constexpr = False,
):  # fmt: skip
    """O (TO, H, D_V) and LSE: rows [rows, slot_q) of each sequence get 0 / -inf; rows past slot_q
    belong to the next sequence and are not touched. LSE_PER_SEQ: LSE row r of sequence b lives at
    b·stride_lb + h·stride_lh + r (dense (B, H, S)); else at h·stride_lh + o0 + r (varlen (H, TO))."""
    FP8: tl.constexpr = Q.dtype.element_ty == tl.float8e4nv  # e4m3 q, k, v (module docstring)
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    start_m = tl.program_id(1) * BLOCK_M
    q0, slot_q, q_len, rows, o0, k0, k_len = seq_extent(
        b, CU_Q, CU_K, USED_Q, USED_K, TQ, TK, K_CAP, ROWS_CAP, HAS_USED_Q, HAS_USED_K, BROADCAST_Q, PAGED
    )
    if start_m >= slot_q:
        return
    hk = (h // G).to(tl.int64)
    if FP8:  # descales (B, H // G): the scores' into the score scale, V's into the output
        d_at = b.to(tl.int64) * (H // G) + hk
        qk_scale2 = qk_scale2 * tl.load(QD + d_at) * tl.load(KD + d_at)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < rows
    q_ptrs = Q + (q0 + offs_m.to(tl.int64))[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D_QK), other=0.0)

    off = diag_offset(q_len, k_len, TOP_LEFT)
    last_m = tl.minimum(start_m + BLOCK_M, rows) - 1
    lo = tl.maximum(start_m + off - win_left, 0)
    hi = tl.minimum(last_m + off + win_right + 1, k_len)
    hi = tl.where(start_m < rows, hi, 0)  # a tile past the computed rows only writes zeros
    lo = (lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if USE_TMA:
        # per-sequence descriptors: rows past k_len and columns past D read as zeros, so the
        # descriptor itself keeps every load inside the sequence (not paged: PAGED is False here)
        n_rows = tl.maximum(k_len, 1)
        k_base = K + k0 * stride_kt + hk * stride_kh
        v_base = V + k0 * stride_vt + hk * stride_vh
        k_desc = tl.make_tensor_descriptor(k_base, [n_rows, D_QK], [stride_kt, 1], [BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(v_base, [n_rows, D_V], [stride_vt, 1], [BLOCK_N, BLOCK_DV])
    else:
        k_desc = K
        v_desc = V
    # Key tiles [lo, a) and [b, hi) may need the elementwise mask (window's left edge, causal
    # diagonal, sequence end); [a, b) are whole tiles inside the band: no mask, no per-step test.
    a = tl.maximum(start_m + BLOCK_M - 1 + off - win_left, lo)
    a = tl.minimum(lo + tl.cdiv(a - lo, BLOCK_N) * BLOCK_N, tl.maximum(hi, lo))
    e = tl.minimum(k_len, start_m + off + win_right + 1)
    b_end = tl.minimum(a + (tl.maximum(e - a, 0) // BLOCK_N) * BLOCK_N, tl.maximum(hi, a))
    for start_n in range(lo, a, BLOCK_N):
        acc, l_i, m_i = _step(acc, l_i, m_i, q, start_n, offs_m, offs_d, offs_dv, K, V, PT, b, hk, k0, k_len,
                              spt_b, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                              NUM_PAGES, MAX_PAGES, off, win_left, win_right, qk_scale2, cap_in, cap_out2,
                              k_desc, v_desc, D_QK, D_V, BLOCK_N, PAGED, PAGE_SIZE, SOFTCAP, USE_TMA,
                              True, FP8)  # fmt: skip
    for start_n in range(a, b_end, BLOCK_N):
        acc, l_i, m_i = _step(acc, l_i, m_i, q, start_n, offs_m, offs_d, offs_dv, K, V, PT, b, hk, k0, k_len,
                              spt_b, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                              NUM_PAGES, MAX_PAGES, off, win_left, win_right, qk_scale2, cap_in, cap_out2,
                              k_desc, v_desc, D_QK, D_V, BLOCK_N, PAGED, PAGE_SIZE, SOFTCAP, USE_TMA,
                              False, FP8)  # fmt: skip
    for start_n in range(b_end, hi, BLOCK_N):
        acc, l_i, m_i = _step(acc, l_i, m_i, q, start_n, offs_m, offs_d, offs_dv, K, V, PT, b, hk, k0, k_len,
                              spt_b, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
                              NUM_PAGES, MAX_PAGES, off, win_left, win_right, qk_scale2, cap_in, cap_out2,
                              k_desc, v_desc, D_QK, D_V, BLOCK_N, PAGED, PAGE_SIZE, SOFTCAP, USE_TMA,
                              True, FP8)  # fmt: skip

    if HAS_SINK:
        # the sink is a logit in natural units (not scaled by softmax_scale): denominator only
        sink2 = tl.load(SINK + h).to(tl.float32) * 1.4426950408889634
        m_f = tl.maximum(m_i, sink2)
        alpha = tl.exp2(m_i - m_f)
        l_i = l_i * alpha + tl.exp2(sink2 - m_f)
        acc = acc * alpha[:, None]
        m_i = m_f
    has = (l_i > 0) & row_ok
    l_safe = tl.where(has, l_i, 1.0)
    out = tl.where(has[:, None], acc / l_safe[:, None], 0.0)
    if FP8:  # l summed P·2^P_SHIFT
        out = out * tl.load(VD + d_at)
        lse = tl.where(has, (m_i + tl.log2(l_safe) - P_SHIFT) * 0.6931471805599453, float("-inf"))
    else:
        lse = tl.where(has, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    in_slot = offs_m < slot_q
    o_rows = o0 + offs_m.to(tl.int64)
    o_ok = in_slot & (o_rows < TO)
    o_ptrs = OUT + o_rows[:, None] * stride_ot + h * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=o_ok[:, None] & (offs_dv[None, :] < D_V))
    if LSE_PER_SEQ:
        l_ptrs = LSE + b.to(tl.int64) * stride_lb + h * stride_lh + offs_m.to(tl.int64)
    else:
        l_ptrs = LSE + h * stride_lh + o_rows
    tl.store(l_ptrs, lse, mask=o_ok)
