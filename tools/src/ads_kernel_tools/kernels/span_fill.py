"""Zeros for the rows a jagged kernel does not write, instead of a zero fill of the whole buffer.

An attention backward stores dK/dV for the keys each sequence uses, rows ``[cu[b], cu[b] + n_b)``
with ``n_b = min(len_b, max_len, used_b)``, and leaves every other row of the buffer as it found it:
keys past ``max_len`` or ``used_b``, and rows before the first or after the last span. Zero-filling
the whole buffer first writes it twice; at a million keys x 4 heads x 128 that is 1.2 GB per
buffer, a few percent of the backward. ``zero_outside_spans`` writes only the other rows.

With clamped offsets (``kernels.offsets.clamp_offsets``: non-decreasing, inside the buffer) every
row lies in ``[0, cu[0])``, in some ``[cu[b], cu[b + 1])`` or in ``[cu[B], rows)``, so zeroing
``[cu[b] + n_b, cu[b + 1])`` for every b and the two ends leaves no row unwritten. The launch goes on
the buffer's stream before the kernel that writes the spans, so the two never race.

Grid: one program per sequence plus one for the two ends, times a few chunks that stride each
range, so that a batch of one long sequence still zeroes its tail in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from .grid import cdiv
from .launch_cache import LaunchCache

__all__ = ["SPAN_FILL_MIN_BYTES", "zero_outside_spans", "zero_unwritten"]

_BLOCK = 4096  # elements per store step
# below this many bytes a buffer takes torch's fill: one launch either way, and torch's costs less
# host time than a Triton launch, which is what a small call is bound by
SPAN_FILL_MIN_BYTES = 16 << 20
_PROGRAMS = 528  # about four per SM of an H100/H200: enough to spread a lone sequence's tail


@triton.jit
def _zero_range(a, b, lo, hi, chunk, chunks, TWO: tl.constexpr, BLOCK: tl.constexpr):
    """Zeros elements [lo, hi) of a (and b), chunk ``chunk`` of ``chunks`` striding the range."""
    for off in range(lo + chunk * BLOCK, hi, chunks * BLOCK):
        idx = off + tl.arange(0, BLOCK)
        ok = idx < hi
        tl.store(a + idx, tl.zeros([BLOCK], a.dtype.element_ty), mask=ok)
        if TWO:
            tl.store(b + idx, tl.zeros([BLOCK], b.dtype.element_ty), mask=ok)


@triton.jit
def _zero_outside(a, b, cu, used, n_seq, rows, width, max_len, TWO: tl.constexpr, HAS_USED: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    s = tl.program_id(0)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    w = width.to(tl.int64)
    if s < n_seq:
        start = tl.load(cu + s).to(tl.int64)
        end = tl.load(cu + s + 1).to(tl.int64)
        n = tl.minimum(end - start, max_len)
        if HAS_USED:
            n = tl.minimum(n, tl.maximum(tl.load(used + s).to(tl.int64), 0))
        n = tl.maximum(n, 0)
        _zero_range(a, b, (start + n) * w, end * w, chunk, chunks, TWO, BLOCK)
    else:
        _zero_range(a, b, 0, tl.load(cu).to(tl.int64) * w, chunk, chunks, TWO, BLOCK)
        _zero_range(a, b, tl.load(cu + n_seq).to(tl.int64) * w, rows * w, chunk, chunks, TWO, BLOCK)


def zero_outside_spans(
    bufs: Sequence[torch.Tensor], cu: torch.Tensor, max_len: int, used: torch.Tensor | None = None
) -> None:
    """Zero, in place, every row of ``bufs`` outside the spans ``[cu[b], cu[b] + n_b)``, n_b =
    min(cu[b+1] - cu[b], max_len, max(used[b], 0)); the rows inside are not touched. No host sync.

    Args:
        bufs: one or two contiguous tensors of the same shape (rows, ...) and element size (e.g. dK
            and dV).
        cu: (B+1,) int32 offsets, already clamped into [0, rows] and non-decreasing
            (``kernels.offsets.clamp_offsets``).
        max_len: the longest span a sequence may have (e.g. max_seqlen_k).
        used: optional (B,) integer device tensor of per-sequence used lengths (seqused_k).
    """
    if not 1 <= len(bufs) <= 2:
        raise ValueError(f"zero_outside_spans takes one or two buffers, got {len(bufs)}")
    a = bufs[0]
    b = bufs[-1]
    if b.shape != a.shape or b.element_size() != a.element_size():
        raise ValueError(f"zero_outside_spans: buffers of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError("zero_outside_spans needs contiguous buffers")
    n_seq = cu.numel() - 1
    rows = a.shape[0]
    if a.numel() == 0:
        return
    if n_seq < 0:
        raise ValueError("zero_outside_spans: empty offsets")
    width = a.numel() // rows
    chunks = max(1, min(64, cdiv(_PROGRAMS, n_seq + 1)))
    _ZERO_OUTSIDE.launch(
        (n_seq + 1, chunks),
        (a, b, cu, used if used is not None else cu, n_seq, rows, width,
         int(max(0, min(max_len, 2**31 - 1)))),
        dict(TWO=len(bufs) == 2, HAS_USED=used is not None, BLOCK=_BLOCK),
    )  # fmt: skip


def zero_unwritten(
    bufs: Sequence[torch.Tensor],
    cu: torch.Tensor,
    max_len: int,
    used: torch.Tensor | Callable[[], torch.Tensor] | None = None,
) -> None:
    """Zero what a kernel that stores exactly the span rows (see ``zero_outside_spans``) leaves
    unwritten: ``zero_outside_spans`` for buffers of ``SPAN_FILL_MIN_BYTES`` or more, a plain fill of
    each buffer below that. Same arguments and preconditions as ``zero_outside_spans``; ``used`` may
    also be a function returning it, called only when the span fill runs (counts that cost device
    ops to form are then not formed for the plain fill)."""
    a = bufs[0]
    if a.numel() * a.element_size() >= SPAN_FILL_MIN_BYTES:
        zero_outside_spans(bufs, cu, max_len, used() if callable(used) else used)
        return
    for buf in bufs:
        buf.zero_()


_ZERO_OUTSIDE = LaunchCache(_zero_outside)
