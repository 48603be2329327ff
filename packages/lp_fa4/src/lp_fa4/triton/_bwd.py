"""Backward kernels: preprocess (delta = rowsum(dO∘O) - dLSE), dK/dV per kv tile (optionally dQ by
fp32 atomics), and a deterministic dQ pass per query tile.

P is recomputed from the forward's LSE: P = exp2(s2 - LSE·log2e). Rows outside the computed rows carry
LSE +inf here so that their P is exactly 0 whatever the scores are.
"""

import triton
import triton.language as tl

from ._common import band_mask, band_mask_t, diag_offset, scores, seq_extent, tile_is_full


@triton.jit
def preprocess_kernel(OUT, DO, DLSE, DELTA, stride_ot, stride_oh, stride_dot, stride_doh, TO, H,
                      D_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                      HAS_DLSE: tl.constexpr):  # fmt: skip
    """DELTA (H, TO) fp32 = rowsum(dO∘O) - dLSE (dLSE (H, TO), when the LSE had a gradient)."""
    h = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_DV)
    ok = rows < TO
    m2 = ok[:, None] & (offs_d[None, :] < D_V)
    o = tl.load(OUT + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], mask=m2, other=0.0)
    do = tl.load(DO + rows[:, None] * stride_dot + h * stride_doh + offs_d[None, :], mask=m2, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + h * TO + rows, mask=ok, other=0.0)
    tl.store(DELTA + h * TO + rows, delta, mask=ok)


@triton.jit
def _p_ds(q, kt, vt, do, lse2, delta, start_m, start_n, k_len, off, win_left, win_right, qk_scale2,
          cap_in, cap_out2, SOFTCAP: tl.constexpr, MASK: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr):  # fmt: skip
    """(P, dS) of one (BLOCK_M, BLOCK_N) tile; dS is the gradient w.r.t. the raw q·k without the
    softmax scale (applied once to dK and dQ): P∘(dP - delta), times 1 - tanh² under softcap.
    MASK=False: the caller knows the tile is full (no mask code)."""
    s2, t = scores(tl.dot(q, kt), qk_scale2, cap_in, cap_out2, SOFTCAP)
    if MASK:
        if not tile_is_full(start_m, start_n, k_len, off, win_left, win_right, BLOCK_M, BLOCK_N):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            s2 = tl.where(band_mask(offs_m, offs_n, k_len, off, win_left, win_right), s2, float("-inf"))
    p = tl.exp2(s2 - lse2[:, None])
    dp = tl.dot(do, vt)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return p, ds


@triton.jit
def _row_stats(LSE, DELTA, h, o0, offs_m, rows, TO):
    """LSE·log2e (+inf on rows not computed or with no mass, so P = 0 there) and delta of the rows."""
    o_rows = o0 + offs_m.to(tl.int64)
    ok = (offs_m < rows) & (o_rows < TO)
    lse = tl.load(LSE + h * TO + o_rows, mask=ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(DELTA + h * TO + o_rows, mask=ok, other=0.0)
    return lse2, delta, ok


@triton.jit
def _pt_dst(k, v, qt, do, lse2, delta, start_m, start_n, k_len, off, win_left, win_right, qk_scale2,
            cap_in, cap_out2, SOFTCAP: tl.constexpr, MASK: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):  # fmt: skip
    """(Pᵀ, dSᵀ) of one tile in keys x queries orientation (BLOCK_N, BLOCK_M), so that both feed the
    dV and dK GEMMs as the left operand straight from registers (no transpose of P or dS)."""
    s2, t = scores(tl.dot(k, qt), qk_scale2, cap_in, cap_out2, SOFTCAP)
    if MASK:
        if not tile_is_full(start_m, start_n, k_len, off, win_left, win_right, BLOCK_M, BLOCK_N):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            offs_n = start_n + tl.arange(0, BLOCK_N)
            s2 = tl.where(band_mask_t(offs_n, offs_m, k_len, off, win_left, win_right), s2, float("-inf"))
    pt = tl.exp2(s2 - lse2[None, :])
    dpt = tl.dot(v, tl.trans(do))
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - t * t)
    return pt, dst


@triton.jit
def _dkdv_range(
    dk, dv, k, v, Q, DO, LSE, DELTA, DQ, q_desc, do_desc, h, q0, o0, rows, lo, hi, start_n, k_len, off,
    stride_qt, stride_qh, stride_dot, stride_doh, stride_dqt, stride_dqh, TO, sm_scale,
    qk_scale2, cap_in, cap_out2, win_left, win_right,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr, DQ_ATOMIC: tl.constexpr,
    USE_TMA: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """dK, dV of one kv tile over the query tiles [lo, hi) of head h (MASK=False: every tile full)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_rows = q0 + offs_m.to(tl.int64)
        lse2, delta, ok = _row_stats(LSE, DELTA, h, o0, offs_m, rows, TO)
        if USE_TMA:
            qt = tl.trans(q_desc.load([start_m, 0]))
            do = do_desc.load([start_m, 0])
        else:
            qt = tl.load(Q + q_rows[None, :] * stride_qt + h * stride_qh + offs_d[:, None],
                         mask=ok[None, :] & (offs_d[:, None] < D_QK), other=0.0)  # fmt: skip
            o_rows = o0 + offs_m.to(tl.int64)
            do = tl.load(DO + o_rows[:, None] * stride_dot + h * stride_doh + offs_dv[None, :],
                         mask=ok[:, None] & (offs_dv[None, :] < D_V), other=0.0)  # fmt: skip
        pt, dst = _pt_dst(k, v, qt, do, lse2, delta, start_m, start_n, k_len, off, win_left, win_right,
                          qk_scale2, cap_in, cap_out2, SOFTCAP, MASK, BLOCK_M, BLOCK_N)  # fmt: skip
        dv += tl.dot(pt.to(do.dtype), do)
        dsl = dst.to(qt.dtype)
        dk += tl.dot(dsl, tl.trans(qt))
        if DQ_ATOMIC:
            dq = tl.dot(tl.trans(dsl), k) * sm_scale
            dq_ptrs = DQ + q_rows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=ok[:, None] & (offs_d[None, :] < D_QK))
    return dk, dv


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DK, DV, CU_Q, CU_K, USED_Q, USED_K,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    TQ, TK, TO, K_CAP, ROWS_CAP, H_KV, G, sm_scale,
    qk_scale2, cap_in, cap_out2, win_left, win_right,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_USED_Q: tl.constexpr, HAS_USED_K: tl.constexpr, SOFTCAP: tl.constexpr, TOP_LEFT: tl.constexpr,
    BROADCAST_Q: tl.constexpr, DQ_ATOMIC: tl.constexpr, USE_TMA: tl.constexpr = False,
):  # fmt: skip
    """One program per (sequence, kv head, BLOCK_N keys): dK, dV summed over the G query heads of the
    group on chip (no atomics, so bitwise repeatable); keys past k_len get zeros. The tile works in
    keys x queries orientation (Pᵀ = exp2(K·Qᵀ - LSE)); when every query tile of the program is
    inside the sequence and the band (no window, full key tile: the common case) the loop carries no
    mask code at all."""
    pid = tl.program_id(0)
    b = pid // H_KV
    hk = pid % H_KV
    start_n = tl.program_id(1) * BLOCK_N
    q0, slot_q, q_len, rows, o0, k0, k_len = seq_extent(
        b, CU_Q, CU_K, USED_Q, USED_K, TQ, TK, K_CAP, ROWS_CAP, HAS_USED_Q, HAS_USED_K, BROADCAST_Q, False
    )
    if start_n >= k_len:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_ok = offs_n < k_len
    k_rows = k0 + offs_n.to(tl.int64)
    k = tl.load(K + k_rows[:, None] * stride_kt + hk * stride_kh + offs_d[None, :],
                mask=k_ok[:, None] & (offs_d[None, :] < D_QK), other=0.0)  # fmt: skip
    v = tl.load(V + k_rows[:, None] * stride_vt + hk * stride_vh + offs_dv[None, :],
                mask=k_ok[:, None] & (offs_dv[None, :] < D_V), other=0.0)  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    off = diag_offset(q_len, k_len, TOP_LEFT)
    last_n = tl.minimum(start_n + BLOCK_N, k_len) - 1
    lo = tl.maximum(start_n - off - win_right, 0)
    hi = tl.minimum(last_n - off + win_left + 1, rows)
    lo = (lo // BLOCK_M) * BLOCK_M
    # the full tiles of a kv tile form one interval of query tiles: first and last full => all full
    last_m = lo + ((tl.maximum(hi - lo, 1) - 1) // BLOCK_M) * BLOCK_M
    all_full = tile_is_full(lo, start_n, k_len, off, win_left, win_right, BLOCK_M, BLOCK_N) & tile_is_full(
        last_m, start_n, k_len, off, win_left, win_right, BLOCK_M, BLOCK_N
    )
    if not USE_TMA:
        q_desc = 0  # unused placeholders (the descriptors are made per head below)
        do_desc = 0
    for g in range(0, G):
        h = hk * G + g
        if USE_TMA:
            # descriptors over the sequence's computed rows: rows past them read as zeros
            n_q = tl.maximum(rows, 1)
            q_base = Q + q0 * stride_qt + h * stride_qh
            do_base = DO + o0 * stride_dot + h * stride_doh
            q_desc = tl.make_tensor_descriptor(q_base, [n_q, D_QK], [stride_qt, 1], [BLOCK_M, BLOCK_D])
            do_desc = tl.make_tensor_descriptor(do_base, [n_q, D_V], [stride_dot, 1], [BLOCK_M, BLOCK_DV])
        if all_full:
            dk, dv = _dkdv_range(
                dk, dv, k, v, Q, DO, LSE, DELTA, DQ, q_desc, do_desc, h, q0, o0, rows, lo, hi, start_n, k_len,
                off, stride_qt, stride_qh, stride_dot, stride_doh, stride_dqt, stride_dqh, TO, sm_scale,
                qk_scale2, cap_in, cap_out2, win_left, win_right, D_QK, D_V, BLOCK_D, BLOCK_DV, BLOCK_M,
                BLOCK_N, SOFTCAP, DQ_ATOMIC, USE_TMA, False,
            )  # fmt: skip
        else:
            dk, dv = _dkdv_range(
                dk, dv, k, v, Q, DO, LSE, DELTA, DQ, q_desc, do_desc, h, q0, o0, rows, lo, hi, start_n, k_len,
                off, stride_qt, stride_qh, stride_dot, stride_doh, stride_dqt, stride_dqh, TO, sm_scale,
                qk_scale2, cap_in, cap_out2, win_left, win_right, D_QK, D_V, BLOCK_D, BLOCK_DV, BLOCK_M,
                BLOCK_N, SOFTCAP, DQ_ATOMIC, USE_TMA, True,
            )  # fmt: skip
    dk_ptrs = DK + k_rows[:, None] * stride_dkt + hk * stride_dkh + offs_d[None, :]
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=k_ok[:, None] & (offs_d[None, :] < D_QK))
    dv_ptrs = DV + k_rows[:, None] * stride_dvt + hk * stride_dvh + offs_dv[None, :]
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=k_ok[:, None] & (offs_dv[None, :] < D_V))


@triton.jit
def _dq_range(
    dq, q, do, K, V, k_desc, v_desc, hk, k0, k_len, lse2, delta, start_m, lo, hi, off,
    stride_kt, stride_kh, stride_vt, stride_vh, qk_scale2, cap_in, cap_out2, win_left, win_right,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr, USE_TMA: tl.constexpr,
    MASK: tl.constexpr,
):  # fmt: skip
    """dQ of one query tile over the key tiles [lo, hi) (MASK=False: every tile full, no mask code)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        if USE_TMA:
            kt = tl.trans(k_desc.load([start_n, 0]))
            vt = tl.trans(v_desc.load([start_n, 0]))
        else:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k_ok = offs_n < k_len
            k_rows = k0 + offs_n.to(tl.int64)
            kt = tl.load(K + k_rows[None, :] * stride_kt + hk * stride_kh + offs_d[:, None],
                         mask=k_ok[None, :] & (offs_d[:, None] < D_QK), other=0.0)  # fmt: skip
            vt = tl.load(V + k_rows[None, :] * stride_vt + hk * stride_vh + offs_dv[:, None],
                         mask=k_ok[None, :] & (offs_dv[:, None] < D_V), other=0.0)  # fmt: skip
        p, ds = _p_ds(q, kt, vt, do, lse2, delta, start_m, start_n, k_len, off, win_left, win_right,
                      qk_scale2, cap_in, cap_out2, SOFTCAP, MASK, BLOCK_M, BLOCK_N)  # fmt: skip
        dq += tl.dot(ds.to(q.dtype), tl.trans(kt))
    return dq


@triton.jit
def dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, USED_Q, USED_K,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_dqc,
    TQ, TK, TO, K_CAP, ROWS_CAP, B, H, G, sm_scale, B_CHUNK,
    qk_scale2, cap_in, cap_out2, win_left, win_right,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_USED_Q: tl.constexpr, HAS_USED_K: tl.constexpr, SOFTCAP: tl.constexpr, TOP_LEFT: tl.constexpr,
    BROADCAST_Q: tl.constexpr, USE_TMA: tl.constexpr = False, DQ_STORE: tl.constexpr = 0,
):  # fmt: skip
    """dQ: one program per (sequence, head, BLOCK_M queries) walks its keys (bitwise repeatable).
    Under broadcast_q one program per (batch chunk, head, BLOCK_M) sums the B_CHUNK kv sequences of
    its chunk in a fixed order; DQ_STORE says where the sum goes: 0 stored (cast) into DQ (one chunk),
    1 fp32 atomics into DQ (not repeatable), 2 the chunk's fp32 partial at DQ + chunk·stride_dqc,
    summed over the chunks in a fixed order by reduce_chunks_kernel (repeatable)."""
    pid = tl.program_id(0)
    chunk = 0
    if BROADCAST_Q:
        h = pid % H
        chunk = pid // H
        b_first = chunk * B_CHUNK
        b_end = tl.minimum(b_first + B_CHUNK, B)
    else:
        h = pid % H
        b_first = pid // H
        b_end = b_first + 1
    hk = (h // G).to(tl.int64)
    start_m = tl.program_id(1) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    q0, slot_q, q_len, rows, o0, k0, k_len = seq_extent(
        b_first,
        CU_Q,
        CU_K,
        USED_Q,
        USED_K,
        TQ,
        TK,
        K_CAP,
        ROWS_CAP,
        HAS_USED_Q,
        HAS_USED_K,
        BROADCAST_Q,
        False,
    )
    q_rows = q0 + offs_m.to(tl.int64)
    q_ok = offs_m < rows
    q = tl.load(Q + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=q_ok[:, None] & (offs_d[None, :] < D_QK), other=0.0)  # fmt: skip
    for b in range(b_first, b_end):
        q0, slot_q, q_len, rows, o0, k0, k_len = seq_extent(
            b, CU_Q, CU_K, USED_Q, USED_K, TQ, TK, K_CAP, ROWS_CAP, HAS_USED_Q, HAS_USED_K, BROADCAST_Q, False
        )
        lse2, delta, ok = _row_stats(LSE, DELTA, h, o0, offs_m, rows, TO)
        o_rows = o0 + offs_m.to(tl.int64)
        do = tl.load(DO + o_rows[:, None] * stride_dot + h * stride_doh + offs_dv[None, :],
                     mask=ok[:, None] & (offs_dv[None, :] < D_V), other=0.0)  # fmt: skip
        off = diag_offset(q_len, k_len, TOP_LEFT)
        last_m = tl.minimum(start_m + BLOCK_M, rows) - 1
        lo = tl.maximum(start_m + off - win_left, 0)
        hi = tl.minimum(last_m + off + win_right + 1, k_len)
        hi = tl.where(start_m < rows, hi, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        if USE_TMA:
            n_k = tl.maximum(k_len, 1)
            k_base = K + k0 * stride_kt + hk * stride_kh
            v_base = V + k0 * stride_vt + hk * stride_vh
            k_desc = tl.make_tensor_descriptor(k_base, [n_k, D_QK], [stride_kt, 1], [BLOCK_N, BLOCK_D])
            v_desc = tl.make_tensor_descriptor(v_base, [n_k, D_V], [stride_vt, 1], [BLOCK_N, BLOCK_DV])
        else:
            k_desc = 0  # unused placeholders
            v_desc = 0
        # the full key tiles form one interval [a, b) of the grid lo + i·BLOCK_N: in the sequence
        # (start_n + BLOCK_N <= k_len) and inside the band for every row of the query tile
        lower = start_m + BLOCK_M - 1 + off - win_left
        upper = tl.minimum(k_len - BLOCK_N, start_m + off + win_right - BLOCK_N + 1)
        a = tl.minimum(
            lo + ((tl.maximum(lower - lo, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, tl.maximum(hi, lo)
        )
        b_full = tl.where(upper >= a, a + ((upper - a) // BLOCK_N + 1) * BLOCK_N, a)
        b_full = tl.maximum(tl.minimum(b_full, hi), a)
        dq = _dq_range(dq, q, do, K, V, k_desc, v_desc, hk, k0, k_len, lse2, delta, start_m, lo, a, off,
                       stride_kt, stride_kh, stride_vt, stride_vh, qk_scale2, cap_in, cap_out2, win_left,
                       win_right, D_QK, D_V, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, SOFTCAP, USE_TMA,
                       True)  # fmt: skip
        dq = _dq_range(dq, q, do, K, V, k_desc, v_desc, hk, k0, k_len, lse2, delta, start_m, a, b_full, off,
                       stride_kt, stride_kh, stride_vt, stride_vh, qk_scale2, cap_in, cap_out2, win_left,
                       win_right, D_QK, D_V, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, SOFTCAP, USE_TMA,
                       False)  # fmt: skip
        dq = _dq_range(dq, q, do, K, V, k_desc, v_desc, hk, k0, k_len, lse2, delta, start_m, b_full, hi, off,
                       stride_kt, stride_kh, stride_vt, stride_vh, qk_scale2, cap_in, cap_out2, win_left,
                       win_right, D_QK, D_V, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, SOFTCAP, USE_TMA,
                       True)  # fmt: skip
    q_in = offs_m < slot_q  # rows of the slot that were not computed get zeros
    dq_mask = q_in[:, None] & (offs_d[None, :] < D_QK)
    dq_ptrs = DQ + q_rows[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :]
    if DQ_STORE == 1:
        tl.atomic_add(dq_ptrs, dq * sm_scale, mask=dq_mask)
    elif DQ_STORE == 2:
        tl.store(dq_ptrs + chunk.to(tl.int64) * stride_dqc, dq * sm_scale, mask=dq_mask)
    else:
        tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=dq_mask)


@triton.jit
def reduce_chunks_kernel(PART, OUT, N, N_CHUNKS, BLOCK: tl.constexpr):
    """OUT[i] = sum over c of PART[c·N + i] (fp32, chunks in order 0, 1, ...), cast to OUT's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros([BLOCK], tl.float32)
    ptrs = PART + offs
    for _c in range(0, N_CHUNKS):
        acc += tl.load(ptrs, mask=ok, other=0.0)
        ptrs += N
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=ok)
