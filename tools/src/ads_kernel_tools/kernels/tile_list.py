"""Device-built, workload-sorted tile lists for persistent kernels over jagged batches: only real
tiles, heaviest first, no host sync.

A persistent program that strides a virtual grid of (sequence, head, tile slot), with
ceil(max_len / block) slots per sequence, meets only the slot indices that its stride visits: slot 0
exists in every sequence, the last slot only in the longest, so the programs owning low slots carry
more work than the average and the grid waits for them. Listing only the real tiles, sorted by
descending work (longest-processing-time first), and striding over the list balances the programs
(the imbalance is worst at sparsity 0.5 and short maxima, see the package benchmarks).

Entry ``(b * heads + h) * slots + t``: sequence b (heaviest first), head h, tile t. The tiles of one
sequence and head stay adjacent, so their shared K/V stays in L2. The Gluon decoder of an entry is
``ads_kernel_tools.kernels.gluon_hopper.decode_tile``.

``schedule`` orders the sequences and lists their tiles in two launches: one program sorts up to
``SORT_MAX`` sequences by work (``tl.sort``) and counts their tiles, then one program per sequence
writes its entries; small lists (``FILL_MAX``) take one launch, the sorting program writing them
itself, because small batches wait on host launch time. Larger batches sort with ``torch.argsort``.
Work per sequence is Lq_eff·Lk for query tiles and Lq_eff for key tiles; a caller with a mask that
removes work (causal, windows) may pass its own per-sequence weights (``work``) instead.

Offsets must already be clamped to their tensors (``kernels.offsets.clamp_offsets``): lengths are
read from them and a negative length counts as empty.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch_cache import LaunchCache

_CHUNK = 1024  # sequences per step of the counting scan
_WIDTH = 64  # list entries written per step
SORT_MAX = 4096  # sequences one program sorts; beyond, torch.argsort
FILL_MAX = 2**18  # lanes x entries per sequence up to which that program also writes the list
_KEY_MAX = tl.constexpr(2**31 - 1)  # sort keys are clamped here (ties only reorder near-equal heavy work)


@triton.jit
def _tiles_of(cu_ptr, b, ok, slots, BLOCK: tl.constexpr):
    """Tiles of sequence b (vector or scalar): ceil(length / BLOCK), capped at ``slots``."""
    length = tl.load(cu_ptr + b + 1, mask=ok, other=0) - tl.load(cu_ptr + b, mask=ok, other=0)
    return tl.minimum(tl.cdiv(tl.maximum(length, 0), BLOCK), slots)


@triton.jit
def _tile_ends(order_ptr, cu_ptr, ends_ptr, n_seq, heads, slots, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """ends[r] = list entries of the first r + 1 sequences in ``order`` (one program: a chunked scan)."""
    carry = tl.zeros([], dtype=tl.int32)
    for c in range(0, n_seq, CHUNK):
        r = c + tl.arange(0, CHUNK)
        ok = r < n_seq
        b = tl.load(order_ptr + r, mask=ok, other=0)
        n = tl.where(ok, _tiles_of(cu_ptr, b, ok, slots, BLOCK) * heads, 0)
        tl.store(ends_ptr + r, tl.cumsum(n, 0) + carry, mask=ok)
        carry += tl.sum(n, 0)


@triton.jit
def _by_work(
    cu_q_ptr, cu_k_ptr, work_ptr, n_seq, max_q, slots,
    BLOCK: tl.constexpr, N: tl.constexpr, TILE_Q: tl.constexpr, HAS_WORK: tl.constexpr,
):  # fmt: skip
    """Lanes r < n_seq: (b = the r-th sequence by descending work, stable; its tile count; lane ok).
    HAS_WORK: the caller's int64 weights. Else TILE_Q (forward): work Lq_eff·Lk, tiles over queries;
    backward: a kv tile's work is Lq_eff (0 without keys), tiles over keys."""
    r = tl.arange(0, N)
    ok = r < n_seq
    if HAS_WORK:
        work = tl.maximum(tl.load(work_ptr + r, mask=ok, other=0).to(tl.int64), 0)
    else:
        lq = tl.load(cu_q_ptr + r + 1, mask=ok, other=0) - tl.load(cu_q_ptr + r, mask=ok, other=0)
        lk = tl.load(cu_k_ptr + r + 1, mask=ok, other=0) - tl.load(cu_k_ptr + r, mask=ok, other=0)
        lq_eff = tl.maximum(tl.minimum(lq, max_q), 0).to(tl.int64)
        if TILE_Q:
            work = lq_eff * tl.maximum(lk, 0)
        else:
            work = tl.where(lk > 0, lq_eff, 0)
    # descending by work, then ascending by index: the index rides in the low bits, reversed
    packed = (tl.minimum(work, _KEY_MAX) << 32) | (N - 1 - r).to(tl.int64)
    packed = tl.sort(tl.where(ok, packed, -1), descending=True)
    b = (N - 1 - (packed & 0xFFFFFFFF)).to(tl.int32)
    b = tl.where(ok, b, 0)
    cu_ptr = cu_q_ptr if TILE_Q else cu_k_ptr
    return b, _tiles_of(cu_ptr, b, ok, slots, BLOCK), ok


@triton.jit
def _sort_and_count(
    cu_q_ptr, cu_k_ptr, work_ptr, order_ptr, ends_ptr, n_seq, max_q, heads, slots,
    BLOCK: tl.constexpr, N: tl.constexpr, TILE_Q: tl.constexpr, HAS_WORK: tl.constexpr,
):  # fmt: skip
    """One program: order = sequences by descending work (``_by_work``), ends = running entry counts."""
    b, tiles, ok = _by_work(cu_q_ptr, cu_k_ptr, work_ptr, n_seq, max_q, slots, BLOCK, N, TILE_Q, HAS_WORK)
    n = tl.where(ok, tiles * heads, 0)
    r = tl.arange(0, N)
    tl.store(order_ptr + r, b, mask=ok)
    tl.store(ends_ptr + r, tl.cumsum(n, 0), mask=ok)


@triton.jit
def _sort_and_fill(
    cu_q_ptr, cu_k_ptr, work_ptr, list_ptr, count_ptr, n_seq, max_q, heads, slots,
    BLOCK: tl.constexpr, N: tl.constexpr, TILE_Q: tl.constexpr, HAS_WORK: tl.constexpr,
):  # fmt: skip
    """``_sort_and_count`` and ``_tile_fill`` in one program, for small lists: each sorted sequence
    writes its e-th entry in step e (heads · slots steps over N lanes). One launch fewer on the
    host, which is what small batches wait for."""
    b, tiles, ok = _by_work(cu_q_ptr, cu_k_ptr, work_ptr, n_seq, max_q, slots, BLOCK, N, TILE_Q, HAS_WORK)
    n = tl.where(ok, tiles * heads, 0)
    start = tl.cumsum(n, 0) - n
    per_tile = tl.maximum(tiles, 1)  # a sequence without tiles writes nothing (n = 0)
    for e in range(0, heads * slots):
        h = e // per_tile
        tl.store(list_ptr + start + e, (b * heads + h) * slots + e - h * tiles, mask=e < n)
    tl.store(count_ptr, tl.sum(n, 0))


@triton.jit
def _tile_fill(order_ptr, cu_ptr, ends_ptr, list_ptr, heads, slots, BLOCK: tl.constexpr, WIDTH: tl.constexpr):
    """Program r writes the entries of the r-th sequence in ``order``: heads-major, then tiles."""
    r = tl.program_id(0)
    b = tl.load(order_ptr + r)
    tiles = _tiles_of(cu_ptr, b, True, slots, BLOCK)
    count = tiles * heads
    start = tl.load(ends_ptr + r) - count
    for e0 in range(0, count, WIDTH):
        e = e0 + tl.arange(0, WIDTH)
        h = e // tiles
        tl.store(list_ptr + start + e, (b * heads + h) * slots + e - h * tiles, mask=e < count)


def schedule(
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    *,
    tile_q: bool,
    block: int,
    slots: int,
    heads: int,
    work: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Heaviest-first tile list of a jagged batch (see the module docstring), no host sync.

    Args:
        cu_q, cu_k: (B + 1,) int32 device offsets.
        max_q: queries past it do no work (max_seqlen_q).
        tile_q: True for the forward (work Lq_eff·Lk, tiles over queries), False for the backward
            (work Lq_eff for sequences with keys, tiles over keys).
        block, slots, heads: as in ``tile_list``.
        work: optional (B,) integer device tensor of per-sequence weights to sort by instead (e.g.
            the valid query-key pairs of a causal or windowed mask); negative weights count as 0.

    Returns:
        ``(entries, count)`` as ``tile_list``.
    """
    n_seq = cu_q.numel() - 1
    if n_seq * heads * slots >= 2**31:
        raise ValueError(
            f"{n_seq} sequences x {heads} heads x {slots} tiles exceed the int32 tile ids of "
            "the persistent kernels"
        )
    if n_seq > SORT_MAX:
        lens_q, lens_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
        lq_eff = torch.clamp(lens_q, max=max_q).to(torch.int64)
        if work is None:
            work = lq_eff * lens_k.to(torch.int64) if tile_q else lq_eff * (lens_k > 0)
        order = torch.argsort(work, descending=True, stable=True).to(torch.int32)
        return tile_list(order, cu_q if tile_q else cu_k, block, slots, heads)
    device = cu_q.device
    order = torch.empty(max(n_seq, 1), dtype=torch.int32, device=device)
    ends = torch.zeros(max(n_seq, 1), dtype=torch.int32, device=device)
    entries = torch.empty(max(n_seq * heads * slots, 1), dtype=torch.int32, device=device)
    if n_seq == 0:
        return entries, ends
    n = max(triton.next_power_of_2(n_seq), 16)  # small batches (B = 1) still sort a full vector
    work_arg = work if work is not None else cu_q  # an unused pointer slot still needs a tensor
    if n * heads * slots <= FILL_MAX:
        count = torch.empty(1, dtype=torch.int32, device=device)
        _SORT_AND_FILL.launch(
            (1,), (cu_q, cu_k, work_arg, entries, count, n_seq, max_q, heads, slots),
            dict(BLOCK=block, N=n, TILE_Q=tile_q, HAS_WORK=work is not None, num_warps=4 if n <= 1024 else 8),
        )  # fmt: skip
        return entries, count
    _SORT_AND_COUNT.launch(
        (1,), (cu_q, cu_k, work_arg, order, ends, n_seq, max_q, heads, slots),
        dict(BLOCK=block, N=n, TILE_Q=tile_q, HAS_WORK=work is not None, num_warps=4 if n <= 1024 else 8),
    )  # fmt: skip
    cu_rows = cu_q if tile_q else cu_k
    fill = dict(BLOCK=block, WIDTH=_WIDTH)
    _TILE_FILL.launch((n_seq,), (order, cu_rows, ends, entries, heads, slots), fill)
    return entries, ends[n_seq - 1 :]


def tile_list(
    order: torch.Tensor, cu_seqlens: torch.Tensor, block: int, slots: int, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real tiles of a jagged batch, for a persistent kernel to stride over.

    Args:
        order: (B,) int32 sequence indices, the order to list them in (heaviest first).
        cu_seqlens: (B + 1,) int32 offsets of the tiled side (queries forward, keys backward).
        block: rows per tile.
        slots: tile cap per sequence and head (ceil(max_len / block)); rows past it are the
            kernel's business (the forward zeroes them, the backward strides over them).
        heads: heads per sequence.

    Returns:
        ``(entries, count)``: entries (B * heads * slots,) int32, only the first ``count`` written,
        each ``(b * heads + h) * slots + t``; count a (1,) int32 device tensor (no host sync).
    """
    n_seq = order.numel()
    ends = torch.empty(max(n_seq, 1), dtype=torch.int32, device=order.device)
    entries = torch.empty(max(n_seq * heads * slots, 1), dtype=torch.int32, device=order.device)
    if n_seq == 0:
        ends.zero_()
        return entries, ends
    _TILE_ENDS.launch((1,), (order, cu_seqlens, ends, n_seq, heads, slots), dict(BLOCK=block, CHUNK=_CHUNK))
    fill = dict(BLOCK=block, WIDTH=_WIDTH)
    _TILE_FILL.launch((n_seq,), (order, cu_seqlens, ends, entries, heads, slots), fill)
    return entries, ends[n_seq - 1 :]


# compiled kernels relaunched without Triton's argument binding: schedule() runs on every call
_SORT_AND_FILL = LaunchCache(_sort_and_fill)
_SORT_AND_COUNT = LaunchCache(_sort_and_count)
_TILE_FILL = LaunchCache(_tile_fill)
_TILE_ENDS = LaunchCache(_tile_ends)
