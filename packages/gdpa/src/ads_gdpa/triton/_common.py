"""@triton.jit helpers shared by the forward and backward kernels: sequence bounds and masks."""

import triton
import triton.language as tl


@triton.jit
def seq_bounds(CU_Q, CU_K, b, max_q, BROADCAST_Q: tl.constexpr, SPANS: tl.constexpr = False, n_b=0):
    """Row ranges of sequence ``b``.

    Returns (q_start, o_start, Lq, Lq_eff, k_start, Lk): Q rows [q_start, q_start+Lq), output rows
    [o_start, o_start+Lq), K/V rows [k_start, k_start+Lk). Lq_eff = min(Lq, max_q): query rows past
    it are written as zeros. With BROADCAST_Q all batches share the one Q sequence and the output of
    batch b starts at b * Lq. With SPANS, CU_Q is the (5, n_b) int32 table of ``problem.spans_table``
    (q start, q end, k start, k end, o start per sequence; CU_K unused): the upstream start/end
    offsets, ad_to_request_offset and output_offset. Offsets are widened to int64 so offset * stride
    cannot overflow.
    """
    if SPANS:
        q_start = tl.load(CU_Q + b).to(tl.int64)
        Lq = (tl.load(CU_Q + n_b + b) - q_start).to(tl.int32)
        k_start = tl.load(CU_Q + 2 * n_b + b).to(tl.int64)
        Lk = (tl.load(CU_Q + 3 * n_b + b) - k_start).to(tl.int32)
        o_start = tl.load(CU_Q + 4 * n_b + b).to(tl.int64)
    else:
        if BROADCAST_Q:
            q_start = tl.load(CU_Q).to(tl.int64)
            Lq = (tl.load(CU_Q + 1) - tl.load(CU_Q)).to(tl.int32)
            o_start = Lq.to(tl.int64) * b
        else:
            q_start = tl.load(CU_Q + b).to(tl.int64)
            Lq = (tl.load(CU_Q + b + 1) - q_start).to(tl.int32)
            o_start = q_start
        k_start = tl.load(CU_K + b).to(tl.int64)
        Lk = (tl.load(CU_K + b + 1) - k_start).to(tl.int32)
    Lq_eff = tl.minimum(Lq, max_q)
    return q_start, o_start, Lq, Lq_eff, k_start, Lk


@triton.jit
def band(Lq, Lk, win_left, win_right, BOTTOM_RIGHT: tl.constexpr):
    """Diagonal offset of the band mask: j allowed iff i + diag - left <= j <= i + diag + right.

    Top-left (upstream symmetric window) uses diag = 0; bottom-right (FlashAttention causal/local)
    aligns the last query with the last key, diag = Lk - Lq.
    """
    if BOTTOM_RIGHT:
        diag = Lk - Lq
    else:
        diag = Lk * 0
    return diag


@triton.jit
def band_mask(offs_m, offs_n, diag, win_left, win_right):
    """(BLOCK_M, BLOCK_N) bool: keys inside the band of each query row."""
    rel = offs_n[None, :] - offs_m[:, None] - diag
    return (rel >= -win_left) & (rel <= win_right)


@triton.jit
def load_rows(base, offs_r, n_rows, stride_r, offs_d, D: tl.constexpr):
    """(rows, cols) tile of ``base[offs_r, offs_d]``: rows >= n_rows and padded head-dim columns >= D
    read as zeros, which every activation maps to zero (act(0) = 0), so padding never contributes."""
    return tl.load(
        base + offs_r[:, None] * stride_r + offs_d[None, :],
        mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < D),
        other=0.0,
    )


@triton.jit
def row_desc(base, n_rows, stride_r, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """TMA descriptor over rows [0, n_rows) x cols [0, D) of ``base``: rows and padded columns outside
    load as zeros and are dropped on stores/reductions. n_rows is clamped to 1 (a descriptor dimension
    must be positive; an empty sequence never issues a load through it)."""
    return tl.make_tensor_descriptor(base, [tl.maximum(n_rows, 1), D], [stride_r, 1], [BLOCK_R, BLOCK_D])


@triton.jit
def tile_count(n_map_tiles, n_groups, tiles_per_group, HAS_TILE_MAP: tl.constexpr):
    """Tiles a grid-stride loop walks: the host tile map's length, or groups x tiles per group."""
    if HAS_TILE_MAP:
        n = n_map_tiles
    else:
        n = n_groups * tiles_per_group
    return n


@triton.jit
def _add_encoding(q, TBL, BKT, META, i: tl.constexpr, rows, row_ok, h, offs_d, D: tl.constexpr):
    """q + TBL[clamp(BKT[rows])] for one encoding; META (3, 5) int64 holds each table's bucket count,
    row stride and head stride (0 for a table shared by all heads). Bucket values are clamped into
    the table, so bad values give wrong rows, never a read outside it."""
    n_buckets = tl.load(META + i)
    s_row = tl.load(META + 5 + i)
    s_head = tl.load(META + 10 + i)
    bkt = tl.load(BKT + rows, mask=row_ok, other=0).to(tl.int64)
    bkt = tl.minimum(tl.maximum(bkt, 0), n_buckets - 1)
    ptrs = TBL + bkt[:, None] * s_row + h.to(tl.int64) * s_head + offs_d[None, :]
    e = tl.load(ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    return q + e.to(tl.float32)


@triton.jit
def add_encodings(
    q, E0, E1, E2, E3, E4, B0, B1, B2, B3, B4, META, q_start, offs_m, n_rows, h, offs_d,
    D: tl.constexpr, N_ENC: tl.constexpr,
):  # fmt: skip
    """The upstream learned encodings, fused into the Q load: q (BLOCK_M, BLOCK_D) of query rows
    q_start + offs_m, plus Σ_i E_i[B_i[row]] for the first N_ENC tables, summed in fp32 and rounded
    once to q's dtype (what the unfused ``(q + Σ table[bucket]).to(dtype)`` gives). Rows >= n_rows
    stay zero so padding still contributes nothing."""
    rows = q_start + offs_m
    row_ok = offs_m < n_rows
    acc = q.to(tl.float32)
    if N_ENC > 0:
        acc = _add_encoding(acc, E0, B0, META, 0, rows, row_ok, h, offs_d, D)
    if N_ENC > 1:
        acc = _add_encoding(acc, E1, B1, META, 1, rows, row_ok, h, offs_d, D)
    if N_ENC > 2:
        acc = _add_encoding(acc, E2, B2, META, 2, rows, row_ok, h, offs_d, D)
    if N_ENC > 3:
        acc = _add_encoding(acc, E3, B3, META, 3, rows, row_ok, h, offs_d, D)
    if N_ENC > 4:
        acc = _add_encoding(acc, E4, B4, META, 4, rows, row_ok, h, offs_d, D)
    return acc.to(q.dtype)
