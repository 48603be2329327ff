"""Device-side block table: which rows each 64-token block slot covers (no host sync).

Two tiny kernels replace upstream's binary-search walker: ``block_cum_kernel`` turns offsets into the
inclusive prefix sum of per-sequence block counts, ``block_table_kernel`` maps every slot of a
statically sized table (an upper bound on the block count) to ``(row_start, length)``; slots past the
real block count get length 0, and empty sequences own no slot.
"""

import triton
import triton.language as tl


@triton.jit
def block_cum_kernel(OFFSETS, CUM, B, BLOCK: tl.constexpr, CHUNK: tl.constexpr, NUM_CHUNKS: tl.constexpr):
    """CUM[b] = sum_{i<=b} ceil(L_i / BLOCK) for b in [0, B); one program scans B in chunks.

    Loop bounds are constexpr: the 3.6 interpreter cannot iterate over a runtime scalar argument.
    """
    carry = tl.sum(tl.zeros((CHUNK,), dtype=tl.int32), axis=0)  # int32 scalar, loop-carried
    for chunk in tl.static_range(NUM_CHUNKS):
        idx = chunk * CHUNK + tl.arange(0, CHUNK)
        m = idx < B
        lo = tl.load(OFFSETS + idx, mask=m, other=0).to(tl.int32)
        hi = tl.load(OFFSETS + idx + 1, mask=m, other=0).to(tl.int32)
        nblk = (hi - lo + BLOCK - 1) // BLOCK
        incl = tl.cumsum(nblk, axis=0) + carry
        tl.store(CUM + idx, incl, mask=m)
        carry += tl.sum(nblk, axis=0)


@triton.jit
def block_table_kernel(
    OFFSETS, CUM, TABLE, B, num_slots, BLOCK: tl.constexpr, SLOTS: tl.constexpr, SEARCH_STEPS: tl.constexpr
):
    """TABLE[i] = (row_start, length) of block slot i; sequence found by a vectorised binary search.

    Slot i belongs to the first sequence b with CUM[b] > i (empty sequences have CUM[b] == CUM[b-1]
    and are skipped by construction). Slots with i >= CUM[B-1] are unused: length 0.
    """
    slot = tl.program_id(0) * SLOTS + tl.arange(0, SLOTS)
    in_range = slot < num_slots
    lo = tl.zeros((SLOTS,), dtype=tl.int32)
    hi = tl.zeros((SLOTS,), dtype=tl.int32) + B
    for _ in tl.static_range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        c = tl.load(CUM + mid, mask=active, other=0)
        right = c <= slot
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    seq = lo
    valid = in_range & (seq < B)
    seq_c = tl.where(valid, seq, 0)
    first = tl.where(seq_c > 0, tl.load(CUM + seq_c - 1, mask=valid & (seq_c > 0), other=0), 0)
    start = tl.load(OFFSETS + seq_c, mask=valid, other=0).to(tl.int32)
    end = tl.load(OFFSETS + seq_c + 1, mask=valid, other=0).to(tl.int32)
    row = start + (slot - first) * BLOCK
    length = tl.minimum(end - row, BLOCK)
    length = tl.where(valid, length, 0)
    row = tl.where(valid, row, 0)
    tl.store(TABLE + 2 * slot, row, mask=in_range)
    tl.store(TABLE + 2 * slot + 1, length, mask=in_range)


@triton.jit
def table_slot(TABLE, H_KV: tl.constexpr):
    """This program's (kv head, first row, rows) from the block table: one program per (block slot,
    kv head), heads varying fastest so neighbouring programs read neighbouring bytes of a row. The
    head and row are int64: head * head-stride passes 2^31 for head-major layouts (a (H, T, D) tensor
    viewed as (T, H, D)), row * row-stride for long batches. Empty slots have 0 rows."""
    pid = tl.program_id(0)
    hk = (pid % H_KV).to(tl.int64)
    slot = pid // H_KV
    row0 = tl.load(TABLE + 2 * slot).to(tl.int64)
    n = tl.load(TABLE + 2 * slot + 1)
    return hk, row0, n
