"""@triton.jit helpers shared by the forward and backward kernels: sequence extents, scores, masks.

Every extent is clamped to the tensors it indexes, so no offset, seqused entry or page index can move a
load or store outside its tensor; row numbers are widened to int64 before they meet a stride.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def seq_extent(
    b, CU_Q, CU_K, USED_Q, USED_K, TQ, TK, K_CAP, ROWS_CAP,
    HAS_USED_Q: tl.constexpr, HAS_USED_K: tl.constexpr, BROADCAST_Q: tl.constexpr, PAGED: tl.constexpr,
):  # fmt: skip
    """Rows of sequence ``b``.

    Returns (q0, slot_q, q_len, rows, o0, k0, k_len): query rows [q0, q0 + slot_q) of q, of which the
    first q_len are the sequence (seqused_q) and the first ``rows`` (q_len capped at ROWS_CAP, the
    jagged max_seqlen_q) are computed; output rows start at o0 (b·Lq under broadcast_q); keys
    [k0, k0 + k_len), at most K_CAP of them (max_seqlen_k: forward and backward ignore the same
    keys of a sequence longer than that). Paged keys are numbered inside the sequence (k0 = 0; without
    seqused_k there are exactly K_CAP).
    """
    if BROADCAST_Q:
        q0 = tl.load(CU_Q).to(tl.int64)
        q1 = tl.load(CU_Q + 1).to(tl.int64)
    else:
        q0 = tl.load(CU_Q + b).to(tl.int64)
        q1 = tl.load(CU_Q + b + 1).to(tl.int64)
    q0 = tl.minimum(tl.maximum(q0, 0), TQ)
    q1 = tl.minimum(tl.maximum(q1, q0), TQ)
    slot_q = (q1 - q0).to(tl.int32)
    q_len = slot_q
    if HAS_USED_Q:
        q_len = tl.minimum(tl.maximum(tl.load(USED_Q + b), 0), slot_q)
    rows = tl.minimum(q_len, ROWS_CAP)
    if BROADCAST_Q:
        o0 = slot_q.to(tl.int64) * b
    else:
        o0 = q0
    if PAGED:
        k0 = q0 * 0
        k_len = K_CAP + 0 * slot_q
    else:
        k0 = tl.load(CU_K + b).to(tl.int64)
        k1 = tl.load(CU_K + b + 1).to(tl.int64)
        k0 = tl.minimum(tl.maximum(k0, 0), TK)
        k1 = tl.minimum(tl.maximum(k1, k0), TK)
        k_len = tl.minimum((k1 - k0).to(tl.int32), K_CAP)
    if HAS_USED_K:
        k_len = tl.minimum(tl.maximum(tl.load(USED_K + b), 0), k_len)
    return q0, slot_q, q_len, rows, o0, k0, k_len


@triton.jit
def diag_offset(q_len, k_len, TOP_LEFT: tl.constexpr):
    """Band diagonal: key j is allowed for query i iff i + off - left <= j <= i + off + right.
    Bottom-right (FlashAttention) aligns the last query with the last key; top-left (jagged FA)
    counts both from the sequence start."""
    if TOP_LEFT:
        off = q_len * 0
    else:
        off = k_len - q_len
    return off


@triton.jit
def key_rows(K_ROW, PT, b, offs_n, k0, k_len, spt_b, stride_kp, stride_kt, NUM_PAGES, MAX_PAGES,
             PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):  # fmt: skip
    """int64 element offsets of keys ``offs_n`` of sequence b (rows past k_len point at row 0 of the
    tensor and are masked by the caller). Paged: page_table[b, j // PAGE_SIZE], clamped to the
    table's width and to the pages that exist."""
    valid = offs_n < k_len
    if PAGED:
        slot = tl.minimum(offs_n // PAGE_SIZE, MAX_PAGES - 1)
        page = tl.load(PT + b.to(tl.int64) * spt_b + slot, mask=valid, other=0)
        page = tl.minimum(tl.maximum(page, 0), NUM_PAGES - 1).to(tl.int64)
        off = page * stride_kp + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kt
    else:
        off = (k0 + offs_n) * stride_kt
    return tl.where(valid, off, 0)


@triton.jit
def scores(qk, qk_scale2, cap_in, cap_out2, SOFTCAP: tl.constexpr):
    """Scores in log2 units from raw q·k: scale·log2e·qk, or softcap·log2e·tanh(qk·scale/softcap).
    Returns (s2, t) with t = tanh(...) for the backward's 1 - t² (0 without softcap)."""
    if SOFTCAP:
        x = qk * cap_in
        # tanh through exp2 (no inline PTX, so the interpreter runs it); saturates cleanly at ±1
        t = 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)
        s2 = t * cap_out2
    else:
        t = qk * 0.0
        s2 = qk * qk_scale2
    return s2, t


@triton.jit
def band_mask(offs_m, offs_n, k_len, off, win_left, win_right):
    """(BLOCK_M, BLOCK_N) bool: key exists and lies in the query row's band."""
    rel = offs_n[None, :] - offs_m[:, None] - off
    return (offs_n[None, :] < k_len) & (rel >= -win_left) & (rel <= win_right)


@triton.jit
def tile_is_full(start_m, start_n, k_len, off, win_left, win_right, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):  # fmt: skip
    """True when every (row, key) pair of the tile is inside the sequence and the band, so the
    elementwise mask can be skipped (most tiles of long sequences)."""
    inside = start_n + BLOCK_N <= k_len
    lo_ok = start_n >= start_m + BLOCK_M - 1 + off - win_left
    hi_ok = start_n + BLOCK_N - 1 <= start_m + off + win_right
    return inside & lo_ok & hi_ok


@triton.jit
def band_mask_t(offs_n, offs_m, k_len, off, win_left, win_right):
    """band_mask transposed: (BLOCK_N, BLOCK_M) bool for kernels that work on keys x queries."""
    rel = offs_n[:, None] - offs_m[None, :] - off
    return (offs_n[:, None] < k_len) & (rel >= -win_left) & (rel <= win_right)
