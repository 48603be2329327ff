"""@triton.jit GDPA backward (spec §1.3), S recomputed, no preprocess pass (there is no softmax).

``gdpa_bwd_dkdv_kernel``: one (kv tile, kv head, batch) per loop step; loops over the G query heads
of the group and the query tiles, keeping dK/dV in registers (GQA needs no atomics for them). With
DQ_ATOMIC it also adds dQ = dS K into a zeroed fp32 buffer. ``gdpa_bwd_dq_kernel`` is the
deterministic second pass: one (query tile, head) per step looping over kv tiles.

Everything is computed transposed in the dK/dV kernel (Sᵀ = K Qᵀ) so dV += Pᵀ dO and dK += dSᵀ Q
need no register transposes. Padded rows load as zeros, so dP = 0 there and dS = act'(S) dP = 0 even
where act'(0) != 0; band masks are applied to both P and dS explicitly.
"""

import triton
import triton.language as tl

from ._act import act_fwd_bwd, act_fwd_bwd_dyn
from ._common import add_encodings, band, band_mask, load_rows, row_desc, seq_bounds, tile_count
from ._fwd import _tile_coords


@triton.jit
def gdpa_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, DQ, CU_Q, CU_K, ACT_TBL, TILE_MAP,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
    max_q, max_k, B, H_KV, G, n_map_tiles, scale, win_left, win_right, TUNE_KEY,
    E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr, PER_HEAD: tl.constexpr,
    FAST: tl.constexpr, HAS_WINDOW: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    BROADCAST_Q: tl.constexpr, DQ_ATOMIC: tl.constexpr, HAS_TILE_MAP: tl.constexpr,
    USE_TMA: tl.constexpr = False, DQ_TMA: tl.constexpr = False,
    SPANS: tl.constexpr = False, N_ENC: tl.constexpr = 0, DKV_ATOMIC: tl.constexpr = False,
):  # fmt: skip
    """Q (Tq, H, D_QK), K/DK (Tk, H_KV, D_QK), V/DV (Tk, H_KV, D_V), DO (To, H, D_V),
    DQ fp32 (Tq, H, D_QK) zeroed when DQ_ATOMIC. Program p takes tiles p, p+P, ...
    USE_TMA (sm90+, aligned tensors): Q/dO tiles arrive by TMA, which Triton software-pipelines (the
    masked pointer loads are not: they go through registers each step). DQ_TMA (with USE_TMA): each
    dQ tile is added by one bulk TMA reduction (cp.reduce.async.bulk) instead of BLOCK_M x D scalar
    fp32 atomics. SPANS / N_ENC as in the forward (the encoded Q enters S and dK); DKV_ATOMIC: dK/dV
    are added to zeroed fp32 DK/DV, for sequences that share key rows (ad_to_request_offset,
    overlapping start/end spans).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dtype = Q.dtype.element_ty
    n_n_tiles = tl.maximum(tl.cdiv(max_k, BLOCK_N), 1)
    n_tiles = tile_count(n_map_tiles, B * H_KV, n_n_tiles, HAS_TILE_MAP)
    for t in range(pid, n_tiles, nprog):
        b, hk, n_first = _tile_coords(TILE_MAP, t, n_tiles, n_n_tiles, H_KV, HAS_TILE_MAP)
        q_start, o_start, Lq, Lq_eff, k_start, Lk = seq_bounds(CU_Q, CU_K, b, max_q, BROADCAST_Q, SPANS, B)
        diag = band(Lq, Lk, win_left, win_right, BOTTOM_RIGHT)
        k_base = K + k_start * stride_kt + hk.to(tl.int64) * stride_kh
        v_base = V + k_start * stride_vt + hk.to(tl.int64) * stride_vh
        # a tile index past max_seqlen_k tiles (Lk > max_seqlen_k) is still covered: stride over them
        for n in range(n_first, tl.cdiv(Lk, BLOCK_N), n_n_tiles):
            n0 = n * BLOCK_N
            offs_n = n0 + tl.arange(0, BLOCK_N)
            kv_rows = offs_n[:, None] < Lk
            k = load_rows(k_base, offs_n, Lk, stride_kt, offs_dq, D_QK)
            v = load_rows(v_base, offs_n, Lk, stride_vt, offs_dv, D_V)
            dk = tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
            lo = 0
            hi = Lq_eff
            if HAS_WINDOW:
                lo = tl.maximum(n0 - diag - win_right, 0)
                hi = tl.minimum(n0 + BLOCK_N - diag + win_left, Lq_eff)
            lo = (lo // BLOCK_M) * BLOCK_M  # keep query tiles aligned (fewer partial loads)
            for g in range(G):
                h = hk * G + g
                if PER_HEAD:
                    act_id = tl.load(ACT_TBL + h)
                q_base = Q + q_start * stride_qt + h.to(tl.int64) * stride_qh
                do_base = DO + o_start * stride_dot + h.to(tl.int64) * stride_doh
                dq_base = DQ + q_start * stride_dqt + h.to(tl.int64) * stride_dqh
                if USE_TMA:
                    q_desc = row_desc(q_base, Lq_eff, stride_qt, D_QK, BLOCK_M, BLOCK_DQK)
                    do_desc = row_desc(do_base, Lq_eff, stride_dot, D_V, BLOCK_M, BLOCK_DV)
                    if DQ_ATOMIC and DQ_TMA:
                        dq_desc = row_desc(dq_base, Lq_eff, stride_dqt, D_QK, BLOCK_M, BLOCK_DQK)
                for m0 in range(lo, hi, BLOCK_M):
                    offs_m = m0 + tl.arange(0, BLOCK_M)
                    q_rows = offs_m[:, None] < Lq_eff
                    if USE_TMA:
                        q = q_desc.load([m0, 0])
                        do = do_desc.load([m0, 0])
                    else:
                        q = load_rows(q_base, offs_m, Lq_eff, stride_qt, offs_dq, D_QK)
                        do = load_rows(do_base, offs_m, Lq_eff, stride_dot, offs_dv, D_V)
                    if N_ENC > 0:
                        q = add_encodings(
                            q, E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META, q_start, offs_m, Lq_eff, h,
                            offs_dq, D_QK, N_ENC,
                        )  # fmt: skip
                    s_t = tl.dot(k, tl.trans(q))  # (BLOCK_N, BLOCK_M)
                    if PER_HEAD:
                        p_t, g_t = act_fwd_bwd_dyn(s_t, act_id, FAST, dtype)
                    else:
                        p_t, g_t = act_fwd_bwd(s_t, ACT, FAST, dtype)
                    dp_t = tl.dot(v, tl.trans(do))
                    p_t = p_t * scale
                    ds_t = g_t * dp_t * scale
                    if HAS_WINDOW:
                        keep = tl.trans(band_mask(offs_m, offs_n, diag, win_left, win_right))
                        p_t = tl.where(keep, p_t, 0.0)
                        ds_t = tl.where(keep, ds_t, 0.0)
                    ds_lp = ds_t.to(dtype)
                    dv = tl.dot(p_t.to(dtype), do, dv)
                    dk = tl.dot(ds_lp, q, dk)
                    if DQ_ATOMIC:
                        dq = tl.dot(tl.trans(ds_lp), k)  # (BLOCK_M, BLOCK_DQK)
                        if USE_TMA and DQ_TMA:
                            dq_desc.atomic_add([m0, 0], dq)
                        else:
                            tl.atomic_add(
                                dq_base + offs_m[:, None] * stride_dqt + offs_dq[None, :],
                                dq,
                                mask=q_rows & (offs_dq[None, :] < D_QK),
                                sem="relaxed",
                            )
            dk_base = DK + k_start * stride_dkt + hk.to(tl.int64) * stride_dkh
            dv_base = DV + k_start * stride_dvt + hk.to(tl.int64) * stride_dvh
            if DKV_ATOMIC:
                tl.atomic_add(
                    dk_base + offs_n[:, None] * stride_dkt + offs_dq[None, :],
                    dk,
                    mask=kv_rows & (offs_dq[None, :] < D_QK),
                    sem="relaxed",
                )
                tl.atomic_add(
                    dv_base + offs_n[:, None] * stride_dvt + offs_dv[None, :],
                    dv,
                    mask=kv_rows & (offs_dv[None, :] < D_V),
                    sem="relaxed",
                )
            else:
                tl.store(
                    dk_base + offs_n[:, None] * stride_dkt + offs_dq[None, :],
                    dk.to(DK.dtype.element_ty),
                    mask=kv_rows & (offs_dq[None, :] < D_QK),
                )
                tl.store(
                    dv_base + offs_n[:, None] * stride_dvt + offs_dv[None, :],
                    dv.to(DV.dtype.element_ty),
                    mask=kv_rows & (offs_dv[None, :] < D_V),
                )


@triton.jit
def gdpa_bwd_dq_kernel(
    Q, K, V, DO, DQ, CU_Q, CU_K, ACT_TBL, TILE_MAP,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh,
    max_q, B, H, G, n_map_tiles, scale, win_left, win_right, TUNE_KEY,
    E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr, PER_HEAD: tl.constexpr,
    FAST: tl.constexpr, HAS_WINDOW: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    BROADCAST_Q: tl.constexpr, HAS_TILE_MAP: tl.constexpr, USE_TMA: tl.constexpr = False,
    SPANS: tl.constexpr = False, N_ENC: tl.constexpr = 0,
):  # fmt: skip
    """Deterministic dQ (Tq, H, D_QK) in Q's dtype. With BROADCAST_Q the tiles are (0, h, m) and each
    sums over all B kv sequences. Rows in [max_q, Lq) are written as zeros. USE_TMA: K/V tiles by
    TMA (software-pipelined, unlike the pointer loads).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dtype = Q.dtype.element_ty
    n_m_tiles = tl.maximum(tl.cdiv(max_q, BLOCK_M), 1)
    # BROADCAST_Q: one shared Q sequence, so only batch 0's tiles, each summing over all B inside
    n_tiles = tile_count(n_map_tiles, H if BROADCAST_Q else B * H, n_m_tiles, HAS_TILE_MAP)
    for t in range(pid, n_tiles, nprog):
        b, h, m = _tile_coords(TILE_MAP, t, n_tiles, n_m_tiles, H, HAS_TILE_MAP)
        hk = h // G
        q_start, o_start, Lq, Lq_eff, k_start, Lk = seq_bounds(CU_Q, CU_K, b, max_q, BROADCAST_Q, SPANS, B)
        m0 = m * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)
        dq_base = DQ + q_start * stride_dqt + h.to(tl.int64) * stride_dqh
        if m0 < Lq_eff:
            q_base = Q + q_start * stride_qt + h.to(tl.int64) * stride_qh
            q = load_rows(q_base, offs_m, Lq_eff, stride_qt, offs_dq, D_QK)
            if N_ENC > 0:  # S from the encoded q, as in the forward (upstream's dQ pass omits it)
                q = add_encodings(
                    q, E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META, q_start, offs_m, Lq_eff, h, offs_dq,
                    D_QK, N_ENC,
                )  # fmt: skip
            if PER_HEAD:
                act_id = tl.load(ACT_TBL + h)
            acc = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)
            b_lo = b
            b_hi = b + 1
            if BROADCAST_Q:
                b_lo = 0
                b_hi = B
            for bb in range(b_lo, b_hi):
                _qs, o_start, _lq, _lqe, k_start, Lk = seq_bounds(
                    CU_Q, CU_K, bb, max_q, BROADCAST_Q, SPANS, B
                )
                do_base = DO + o_start * stride_dot + h.to(tl.int64) * stride_doh
                do = load_rows(do_base, offs_m, Lq_eff, stride_dot, offs_dv, D_V)
                k_base = K + k_start * stride_kt + hk.to(tl.int64) * stride_kh
                v_base = V + k_start * stride_vt + hk.to(tl.int64) * stride_vh
                if USE_TMA:
                    k_desc = row_desc(k_base, Lk, stride_kt, D_QK, BLOCK_N, BLOCK_DQK)
                    v_desc = row_desc(v_base, Lk, stride_vt, D_V, BLOCK_N, BLOCK_DV)
                diag = band(Lq, Lk, win_left, win_right, BOTTOM_RIGHT)
                lo = 0
                hi = Lk
                if HAS_WINDOW:
                    lo = tl.maximum(m0 + diag - win_left, 0)
                    hi = tl.minimum(m0 + BLOCK_M + diag + win_right, Lk)
                for n0 in range(lo, hi, BLOCK_N):
                    offs_n = n0 + tl.arange(0, BLOCK_N)
                    if USE_TMA:
                        k = k_desc.load([n0, 0])
                        v = v_desc.load([n0, 0])
                    else:
                        k = load_rows(k_base, offs_n, Lk, stride_kt, offs_dq, D_QK)
                        v = load_rows(v_base, offs_n, Lk, stride_vt, offs_dv, D_V)
                    s = tl.dot(q, tl.trans(k))
                    if PER_HEAD:
                        _p, g = act_fwd_bwd_dyn(s, act_id, FAST, dtype)
                    else:
                        _p, g = act_fwd_bwd(s, ACT, FAST, dtype)
                    ds = g * tl.dot(do, tl.trans(v)) * scale
                    if HAS_WINDOW:
                        ds = tl.where(band_mask(offs_m, offs_n, diag, win_left, win_right), ds, 0.0)
                    acc = tl.dot(ds.to(dtype), k, acc)
            tl.store(
                dq_base + offs_m[:, None] * stride_dqt + offs_dq[None, :],
                acc.to(DQ.dtype.element_ty),
                mask=(offs_m[:, None] < Lq) & (offs_dq[None, :] < D_QK),
            )
        n_eff = tl.cdiv(Lq_eff, BLOCK_M)
        if m == tl.maximum(n_eff, 1) - 1:
            zeros = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=DQ.dtype.element_ty)
            for z0 in range(n_eff * BLOCK_M, Lq, BLOCK_M):
                offs_z = z0 + tl.arange(0, BLOCK_M)
                z_mask = (offs_z[:, None] < Lq) & (offs_dq[None, :] < D_QK)
                tl.store(dq_base + offs_z[:, None] * stride_dqt + offs_dq[None, :], zeros, mask=z_mask)
