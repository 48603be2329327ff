"""@triton.jit helpers shared by the forward and backward kernels: sequence bounds and masks."""

import triton
import triton.language as tl


@triton.jit
def seq_bounds(CU_Q, CU_K, b, max_q, BROADCAST_Q: tl.constexpr):
    """Row ranges of sequence ``b``.

    Returns (q_start, o_start, Lq, Lq_eff, k_start, Lk): Q rows [q_start, q_start+Lq), output rows
    [o_start, o_start+Lq), K/V rows [k_start, k_start+Lk). Lq_eff = min(Lq, max_q): query rows past
    it are written as zeros. With BROADCAST_Q all batches share the one Q sequence and the output of
    batch b starts at b * Lq. Offsets are widened to int64 so offset * stride cannot overflow.
    """
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
