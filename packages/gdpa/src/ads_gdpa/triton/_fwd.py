"""@triton.jit GDPA forward: O = scale * (act(Q Kᵀ) ⊙ M) V, one (query tile, head) per loop step.

Padding needs no mask: out-of-range Q/K/V rows load as zeros, S = 0 there and every activation has
act(0) = 0, so P = 0. Only band masks (window / causal / local) are applied explicitly.

FP8 (e4m3 Q, K, V; bf16 out): P must be rounded to e4m3 before P·V, and e4m3 holds only about
2^-9..448 (normal from 2^-6). act(S) is unbounded (raw, relu_square, gelu grow with S) and ``scale``
is often 1/max_seq_len, so neither P = scale·act(S) nor act(S) itself fits that range in general.
The kernel therefore keeps ``scale`` out of P (applied to the fp32 output, like the bf16 deferred
scale) and scales each row by its running maximum m = max |act(S)| over the keys seen so far, as
online softmax does with its running max: P_q = e4m3(act(S)·448/m), the accumulator is multiplied by
m_old/m_new whenever a row's maximum grows, and the output by m/448·scale·v_descale at the end. So
every row's largest P is exactly 448 and every value within 2^15 of it keeps e4m3's relative
precision (2^-4), whatever the score magnitudes, activation or scale. Rows whose maximum is 0 have
all P = 0 and get output 0 (the scale factor is taken as 1 there, no division by zero).
Why not the alternatives: a per-tile power-of-two scale needs each tile's P·V summed into the
accumulator through its own multiply (a second D-wide fp32 tile per step on Hopper, where the GEMM
accumulates in place), which costs more than the in-place rescale here, and its scales are up to 2x
coarser; a static bound either saturates large scores or flushes small ones, since act(S)'s range is
data-dependent, and counting the saturation only reports the error instead of avoiding it.
"""

import triton
import triton.language as tl

from ._act import act_fwd, act_fwd_dyn
from ._common import add_encodings, band, band_mask, load_rows, row_desc, seq_bounds, tile_count


@triton.jit
def _tile_coords(TILE_MAP, t, n_tiles, n_m_tiles, H, HAS_TILE_MAP: tl.constexpr):
    """(batch, head, m-tile) of linear tile t: from the host tile map or m-fastest decoding."""
    if HAS_TILE_MAP:
        b = tl.load(TILE_MAP + t)
        h = tl.load(TILE_MAP + n_tiles + t)
        m = tl.load(TILE_MAP + 2 * n_tiles + t)
    else:
        m = t % n_m_tiles
        bh = t // n_m_tiles
        h = bh % H
        b = bh // H
    return b, h, m


@triton.jit
def gdpa_fwd_kernel(
    Q, K, V, O, CU_Q, CU_K, ACT_TBL, Q_DESCALE, K_DESCALE, V_DESCALE, TILE_MAP,  # noqa: E741
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_vd, stride_ot, stride_oh,
    max_q, B, H, G, n_map_tiles, scale, win_left, win_right, TUNE_KEY,
    E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACT: tl.constexpr, PER_HEAD: tl.constexpr,
    FAST: tl.constexpr, HAS_WINDOW: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    BROADCAST_Q: tl.constexpr, FP8: tl.constexpr, USE_TMA: tl.constexpr, HAS_TILE_MAP: tl.constexpr,
    SPANS: tl.constexpr = False, N_ENC: tl.constexpr = 0,
):  # fmt: skip
    """Q (Tq, H, D_QK), K (Tk, H/G, D_QK), V (Tk, H/G, D_V) or a (H/G, D_V, Tk) transposed copy
    (FP8), O (To, H, D_V). TILE_MAP (3, n_map_tiles) int32 (batch, head, m) or unused.
    Grid: any number of programs; program p takes tiles p, p+P, ...
    SPANS: CU_Q is the spans table (``seq_bounds``). N_ENC: encodings E_i[B_i[row]] added to each Q
    tile as it is loaded (``add_encodings``; unused slots take any tensor).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    p_dtype = V.dtype.element_ty
    # tile counts depend on the autotuned BLOCK_M, so they are derived here, not on the host
    n_m_tiles = tl.maximum(tl.cdiv(max_q, BLOCK_M), 1)
    n_tiles = tile_count(n_map_tiles, B * H, n_m_tiles, HAS_TILE_MAP)
    for t in range(pid, n_tiles, nprog):
        b, h, m = _tile_coords(TILE_MAP, t, n_tiles, n_m_tiles, H, HAS_TILE_MAP)
        hk = h // G
        q_start, o_start, Lq, Lq_eff, k_start, Lk = seq_bounds(CU_Q, CU_K, b, max_q, BROADCAST_Q, SPANS, B)
        m0 = m * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)
        o_base = O + o_start * stride_ot + h.to(tl.int64) * stride_oh
        if m0 < Lq_eff:
            diag = band(Lq, Lk, win_left, win_right, BOTTOM_RIGHT)
            lo = 0
            hi = Lk
            if HAS_WINDOW:
                lo = tl.maximum(m0 + diag - win_left, 0)
                hi = tl.minimum(m0 + BLOCK_M + diag + win_right, Lk)
            q_base = Q + q_start * stride_qt + h.to(tl.int64) * stride_qh
            k_base = K + k_start * stride_kt + hk.to(tl.int64) * stride_kh
            v_base = V + k_start * stride_vt + hk.to(tl.int64) * stride_vh
            if USE_TMA:
                q_desc = row_desc(q_base, Lq_eff, stride_qt, D_QK, BLOCK_M, BLOCK_DQK)
                k_desc = row_desc(k_base, Lk, stride_kt, D_QK, BLOCK_N, BLOCK_DQK)
                v_desc = row_desc(v_base, Lk, stride_vt, D_V, BLOCK_N, BLOCK_DV)
                q = q_desc.load([m0, 0])
            else:
                q = load_rows(q_base, offs_m, Lq_eff, stride_qt, offs_dq, D_QK)
            if N_ENC > 0:
                q = add_encodings(
                    q, E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, ENC_META, q_start, offs_m, Lq_eff, h, offs_dq,
                    D_QK, N_ENC,
                )  # fmt: skip
            s_scale = 1.0
            if FP8:
                s_scale = tl.load(Q_DESCALE + h) * tl.load(K_DESCALE + hk)
            if PER_HEAD:
                act_id = tl.load(ACT_TBL + h)
            acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
            row_max = tl.zeros([BLOCK_M], dtype=tl.float32)  # FP8: running max |act(S)| per row
            for n0 in range(lo, hi, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                if USE_TMA:
                    k = k_desc.load([n0, 0])
                    v = v_desc.load([n0, 0])
                else:
                    k = load_rows(k_base, offs_n, Lk, stride_kt, offs_dq, D_QK)
                    v_mask = (offs_n[:, None] < Lk) & (offs_dv[None, :] < D_V)
                    v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_dv[None, :] * stride_vd
                    v = tl.load(v_ptrs, mask=v_mask, other=0.0)
                s = tl.dot(q, tl.trans(k))
                if FP8:
                    s = s * s_scale
                if PER_HEAD:
                    p = act_fwd_dyn(s, act_id, FAST, O.dtype.element_ty)
                else:
                    p = act_fwd(s, ACT, FAST, O.dtype.element_ty)
                if not FP8:
                    p = p * scale
                if HAS_WINDOW:
                    p = tl.where(band_mask(offs_m, offs_n, diag, win_left, win_right), p, 0.0)
                if FP8:
                    # acc holds P·V in units of 448/row_max: move it to the new maximum's units
                    m_new = tl.maximum(row_max, tl.max(tl.abs(p), axis=1))
                    m_safe = tl.where(m_new > 0.0, m_new, 1.0)
                    acc = acc * (row_max / m_safe)[:, None]
                    p = p * (448.0 / m_safe)[:, None]
                    row_max = m_new
                acc = tl.dot(p.to(p_dtype), v, acc)
            if FP8:
                acc = acc * (row_max * (scale / 448.0) * tl.load(V_DESCALE + hk))[:, None]
            o_mask = (offs_m[:, None] < Lq) & (offs_dv[None, :] < D_V)
            o_ptrs = o_base + offs_m[:, None] * stride_ot + offs_dv[None, :]
            tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=o_mask)
        # Rows in [max_q, Lq) are outside every computed tile: the last tile of the sequence zeroes them.
        n_eff = tl.cdiv(Lq_eff, BLOCK_M)
        if m == tl.maximum(n_eff, 1) - 1:
            zeros = tl.zeros([BLOCK_M, BLOCK_DV], dtype=O.dtype.element_ty)
            for z0 in range(n_eff * BLOCK_M, Lq, BLOCK_M):
                offs_z = z0 + tl.arange(0, BLOCK_M)
                z_mask = (offs_z[:, None] < Lq) & (offs_dv[None, :] < D_V)
                tl.store(o_base + offs_z[:, None] * stride_ot + offs_dv[None, :], zeros, mask=z_mask)
