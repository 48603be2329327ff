"""Offsets the kernels can trust: every span clamped into its tensor, on the device, in one launch.

A jagged kernel reads sequence b's rows ``[cu[b], cu[b+1])``. Offsets that are negative, decreasing
or past the tensor's rows would send its loads and stores outside the tensor. ``clamp_offsets``
rewrites them as int32 ``min(max(running max of cu, 0), rows)``: for valid offsets (non-decreasing,
inside [0, rows]) that is the identity, for any other values every span lies inside the tensor and
has a non-negative length. The wrong numbers bad offsets then give are the caller's to prevent
(``ads_kernel_tools.offsets.validate_offsets`` on host data, ``ADS_CHECK_INPUTS=1`` for device data);
the guarantee here is memory safety. int64 offsets are clamped before the narrowing to int32, so a
value past 2^31 cannot wrap into range.

One program walks the offsets in chunks with a carried running maximum; both offset tensors of an
attention call (queries and keys) go through the same launch.

``zero_outside``: the same launch can also zero the rows of an output that no sequence owns, those
before the first clamped offset and from the last one on. A jagged forward writes only its
sequences' rows, so without this a caller passing offsets that do not span the tensor would get
``torch.empty``'s leftovers there; a separate fill would cost a launch on every call, while here the
extra programs find nothing to write when the offsets span the rows (the usual call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch_cache import LaunchCache
from .span_fill import _zero_range

__all__ = ["clamp_offsets"]

_CHUNK = 1024
_ZERO_PROGRAMS = 32  # beside the clamp: enough to zero a long unowned tail in parallel
_ZERO_BLOCK = 4096  # elements per store step


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _clamp_one(src, dst, n, rows, CHUNK: tl.constexpr):
    carry = tl.zeros([], dtype=tl.int64)
    for c in range(0, n, CHUNK):
        r = c + tl.arange(0, CHUNK)
        ok = r < n
        x = tl.load(src + r, mask=ok, other=0).to(tl.int64)
        x = tl.minimum(tl.maximum(x, 0), rows)
        x = tl.maximum(tl.associative_scan(x, 0, _max_combine), carry)
        tl.store(dst + r, x.to(tl.int32), mask=ok)
        carry = tl.max(tl.where(ok, x, 0), 0)


@triton.jit
def _zero_unowned(src, n, rows, buf, width, total, part, parts, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Rows of buf (rows x width = total elements) outside [first, last) of the clamped offsets:
    first is the clamped src[0], last the largest clamped value (the running maximum's end)."""
    first = tl.minimum(tl.maximum(tl.load(src).to(tl.int64), 0), rows)
    last = first
    for c in range(0, n, CHUNK):
        r = c + tl.arange(0, CHUNK)
        x = tl.load(src + r, mask=r < n, other=0).to(tl.int64)
        last = tl.maximum(last, tl.max(tl.minimum(tl.maximum(x, 0), rows), 0))
    _zero_range(buf, buf, 0, first * width, part, parts, False, BLOCK)
    _zero_range(buf, buf, last * width, total, part, parts, False, BLOCK)


@triton.jit
def _clamp_offsets(
    src_a, dst_a, n_a, rows_a, src_b, dst_b, n_b, rows_b, buf, width, total, CHUNK: tl.constexpr,
    TWO: tl.constexpr, ZERO: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if pid == 0:
        _clamp_one(src_a, dst_a, n_a, rows_a, CHUNK)
        if TWO:
            _clamp_one(src_b, dst_b, n_b, rows_b, CHUNK)
    elif ZERO:
        _zero_unowned(src_a, n_a, rows_a, buf, width, total, pid - 1, tl.num_programs(0) - 1, CHUNK, BLOCK)


def clamp_offsets(
    cu_a: torch.Tensor,
    rows_a: int,
    cu_b: torch.Tensor | None = None,
    rows_b: int = 0,
    *,
    zero_outside: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Clamped int32 copies of one or two offset tensors (see the module docstring), no host sync.

    Args:
        cu_a: (B+1,) int32/int64 offsets into a tensor of ``rows_a`` rows.
        cu_b: optional second offsets (e.g. the keys'), into ``rows_b`` rows; the same tensor object
            as ``cu_a`` with the same rows gives the same result object twice.
        zero_outside: optional contiguous tensor of ``rows_a`` rows (e.g. the output of a jagged
            forward): its rows before the first and from the last clamped ``cu_a`` offset on are
            zeroed in the same launch; rows inside are not touched, so the order against the kernel
            that writes them does not matter.

    Returns:
        ``(a, b)``: new contiguous int32 tensors on the offsets' device (``b`` None without ``cu_b``).
    """
    same = cu_b is cu_a and rows_b == rows_a
    two = cu_b is not None and not same
    if rows_a >= 2**31 or (two and rows_b >= 2**31):
        raise ValueError(f"tensors of {max(rows_a, rows_b)} rows exceed the int32 offsets of the kernels")
    dst_a = torch.empty(cu_a.shape, dtype=torch.int32, device=cu_a.device)
    dst_b = torch.empty(cu_b.shape, dtype=torch.int32, device=cu_b.device) if two else dst_a
    src_b = cu_b if two else cu_a
    if zero_outside is not None and (zero_outside.shape[0] != rows_a or not zero_outside.is_contiguous()):
        shape = tuple(zero_outside.shape)
        raise ValueError(f"clamp_offsets: zero_outside must be contiguous with {rows_a} rows, got {shape}")
    zero = zero_outside is not None and zero_outside.numel() > 0 and cu_a.numel() > 0
    width = zero_outside.numel() // rows_a if zero else 0
    _CLAMP.launch(
        (1 + (_ZERO_PROGRAMS if zero else 0),),
        (cu_a.contiguous(), dst_a, cu_a.numel(), rows_a, src_b.contiguous(), dst_b, src_b.numel(),
         rows_b if two else rows_a, zero_outside if zero else dst_a, width, width * rows_a),
        dict(CHUNK=_CHUNK, TWO=two, ZERO=zero, BLOCK=_ZERO_BLOCK),
    )  # fmt: skip
    if cu_b is None:
        return dst_a, None
    return dst_a, dst_b


_CLAMP = LaunchCache(_clamp_offsets)
