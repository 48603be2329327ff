"""K-major copies of an attention V for FP8 kernels on Hopper: its fp8 wgmma reads the B operand
only K-major, and for P·V the reduction runs over keys, so V (Tk, H_kv, D) is copied to
(H_kv·D, keys) by one tiled Triton transpose (torch's permute-copy of fp8 is ~35x slower).

Rows of the copy are 16-byte aligned (TMA's stride rule): the key count is padded to a multiple of
16 with zeros (padded keys meet P = 0, and 0·NaN would not be 0).

``relabel``: a kernel can hand P from its accumulator layout to the second GEMM's register operand
without moving values between threads when P's columns are renumbered within each 32-key group
(``KEY_ORDER``); V's keys must then follow the same order, group by group from each sequence's first
key, so each sequence starts at a column that is a multiple of 32 (``kv_cols`` gives the starts; the
gaps are zeros). Used by ads-gdpa's and lp-fa4's FP8 forwards.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import cdiv


def _key_order() -> list[int]:
    """KEY_ORDER[pos] = the key (within a 32-key group) at position pos of the relabelled P: the
    fp8 wgmma A operand holds, per thread t of a quad, positions 4t..4t+3 and 16+4t..16+4t+3, where
    the accumulator holds columns 2t, 2t+1, 8+2t, 9+2t and 16 more, so pos 16h + 4t + 2g + i takes
    column 16h + 8g + 2t + i."""
    order = []
    for pos in range(32):
        h, t, g, i = pos >> 4, (pos >> 2) & 3, (pos >> 1) & 1, pos & 1
        order.append(16 * h + 8 * g + 2 * t + i)
    return order


KEY_ORDER = _key_order()


@triton.jit
def _transpose_kernel(src, dst, rows, cols, rows_pad, BR: tl.constexpr, BC: tl.constexpr):
    r0 = tl.program_id(0) * BR
    c0 = tl.program_id(1) * BC
    r = r0 + tl.arange(0, BR)
    c = c0 + tl.arange(0, BC)
    tile = tl.load(
        src + r[:, None].to(tl.int64) * cols + c[None, :],
        mask=(r[:, None] < rows) & (c[None, :] < cols),
        other=0,
    )
    # rows in [rows, rows_pad) are written as zeros (the load's fill)
    tl.store(
        dst + c[None, :].to(tl.int64) * rows_pad + r[:, None],
        tile,
        mask=(r[:, None] < rows_pad) & (c[None, :] < cols),
    )


@triton.jit
def _relabel_kernel(
    src, dst, cu_k, kv_cols, cols, width, BR: tl.constexpr, BC: tl.constexpr, RELABEL: tl.constexpr = True
):
    """Sequence b, columns [c0, c0 + BC) of V: its keys from kv_cols[b], in KEY_ORDER groups
    (RELABEL) or in their order."""
    b = tl.program_id(0)
    c0 = tl.program_id(1) * BC
    k0 = tl.load(cu_k + b)
    lk = tl.load(cu_k + b + 1) - k0
    d0 = tl.load(kv_cols + b)
    c = c0 + tl.arange(0, BC)
    n_pad = tl.cdiv(lk, 32) * 32
    # programs along the grid's third axis share a sequence's key blocks
    for r0 in range(tl.program_id(2) * BR, n_pad, BR * tl.num_programs(2)):
        pos = r0 + tl.arange(0, BR)
        p = pos & 31
        if RELABEL:
            key = (pos - p) + (p & 16) + ((p & 2) << 2) + ((p >> 2) & 3) * 2 + (p & 1)
        else:
            key = pos
        tile = tl.load(
            src + (k0 + key[:, None]).to(tl.int64) * cols + c[None, :],
            mask=(key[:, None] < lk) & (c[None, :] < cols),
            other=0,
        )
        tl.store(
            dst + c[None, :].to(tl.int64) * width + (d0 + pos[:, None]),
            tile,
            mask=(pos[:, None] < n_pad) & (c[None, :] < cols),
        )


def v_kmajor(v: torch.Tensor) -> torch.Tensor:
    """(Tk, H_kv, D) fp8 V -> (H_kv·D, Tk_pad) contiguous, same dtype, keys in their order."""
    tk = v.shape[0]
    cols = v.shape[1] * v.shape[2]
    tk_pad = max(cdiv(tk, 16) * 16, 16)
    src = v.reshape(tk, cols).view(torch.uint8)
    dst = torch.empty(cols, tk_pad, dtype=torch.uint8, device=v.device)
    BR, BC = 64, 64
    grid = (cdiv(tk_pad, BR), cdiv(cols, BC))
    _transpose_kernel[grid](src, dst, tk, cols, tk_pad, BR=BR, BC=BC)
    return dst.view(v.dtype)


def kv_cols(cu_k: torch.Tensor) -> torch.Tensor:
    """(B+1,) int32 column starts of each sequence in the relabelled copy: lengths rounded up to 32."""
    lens = cu_k[1:] - cu_k[:-1]
    starts = torch.zeros_like(cu_k)
    starts[1:] = torch.cumsum((lens + 31) // 32 * 32, 0)
    return starts


def v_kmajor_relabel(
    v: torch.Tensor,
    cu_k: torch.Tensor,
    relabel: bool = True,
    max_len: int | None = None,
    *,
    starts: torch.Tensor | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Tk, H_kv, D) fp8 V -> ((H_kv·D, width) copy with each sequence's keys in KEY_ORDER groups from
    a 32-aligned column, (B+1,) int32 those columns). No host sync: width is the bound
    Tk + 32·B rounded to 16, and the columns past the last sequence are zeroed. ``relabel=False``
    keeps each sequence's keys in their order (only the 32-aligned starts). ``max_len`` (a bound on
    the longest sequence, known on the host) spreads each sequence's keys over more programs, for
    batches of few long sequences; without it one program walks each (sequence, column block).

    ``starts`` / ``width`` (opt-in, both or neither): the caller's ``kv_cols(cu_k)`` as an int32
    device tensor and its last entry, known on the host (a dense batch of length L has starts
    b·ceil(L/32)·32 from shapes alone). Then no columns lie past the last sequence and the copy
    costs one launch (no column scan, no zero fill); the kernel writes where ``starts`` says, so
    they must be exact and ``width`` a multiple of 16."""
    tk = v.shape[0]
    cols = v.shape[1] * v.shape[2]
    n_seq = cu_k.numel() - 1
    cu = cu_k.to(torch.int32)
    if (starts is None) != (width is None):
        raise ValueError("v_kmajor_relabel: pass starts and width together")
    if starts is None:
        width = max(cdiv(tk + 32 * n_seq, 16) * 16, 16)
        starts = kv_cols(cu)
        dst = torch.empty(cols, width, dtype=torch.uint8, device=v.device)
        dst[:, tk:].zero_()  # covers every column past the last sequence (its start is >= Tk)
    else:
        if width % 16 or width <= 0 or starts.dtype != torch.int32 or starts.numel() != n_seq + 1:
            got = f"{starts.dtype} {tuple(starts.shape)}, {width}"
            raise ValueError(f"v_kmajor_relabel: starts must be int32 ({n_seq + 1},) and width a "
                             f"positive multiple of 16, got {got}")  # fmt: skip
        dst = torch.empty(cols, width, dtype=torch.uint8, device=v.device)
    if n_seq > 0 and tk > 0:
        BR, BC = 64, 64
        src = v.reshape(tk, cols).view(torch.uint8)
        split = 1 if max_len is None else max(1, min(cdiv(max_len, BR), 1024))
        grid = (n_seq, cdiv(cols, BC), split)
        _relabel_kernel[grid](src, dst, cu, starts, cols, width, BR=BR, BC=BC, RELABEL=relabel)
    return dst.view(v.dtype), starts
