"""Host-side launchers: block table, forward and backward grids (1-D: slots × kv heads)."""

from __future__ import annotations

import math

import torch
import triton.language as tl

from ads_kernel_tools.kernels.grid import cdiv

from ..config import bwd_config, fwd_config
from ._bwd import block_attn_bwd_kernel
from ._fwd import block_attn_fwd_kernel
from ._table import block_cum_kernel, block_table_kernel

_LOG2E = 1.4426950408889634
_TABLE_SLOTS = 1024  # slots per program of the table kernel
_CUM_CHUNK = 1024  # sequences per step of the single-program prefix scan


def _precision(dtype: torch.dtype) -> tl.constexpr:
    # fp32 inputs get true fp32 dots; tf32 would lose ~3 decimal digits against the reference
    return "ieee" if dtype == torch.float32 else "tf32"


def build_block_table(offsets: torch.Tensor, num_slots: int, block_size: int) -> torch.Tensor:
    """Per-slot ``(row_start, length)`` int32 table of shape (num_slots, 2), built on offsets' device.

    ``num_slots`` is an upper bound on the block count (``T // block + B`` needs no data); slots past the
    real count have length 0, so kernels sized by the bound skip them without a host sync.
    """
    # The table kernels index OFFSETS[i] with unit stride, so a strided view (offsets[::2], a column of
    # a 2-D tensor) would be read at the wrong addresses and silently give a wrong table.
    offsets = offsets.contiguous()
    batch = offsets.numel() - 1
    table = torch.empty((num_slots, 2), dtype=torch.int32, device=offsets.device)
    if num_slots == 0:
        return table
    cum = torch.empty((max(batch, 1),), dtype=torch.int32, device=offsets.device)
    if batch > 0:
        num_chunks = cdiv(batch, _CUM_CHUNK)
        block_cum_kernel[(1,)](offsets, cum, batch, BLOCK=block_size, CHUNK=_CUM_CHUNK, NUM_CHUNKS=num_chunks)
    steps = max(batch, 1).bit_length()
    grid = (cdiv(num_slots, _TABLE_SLOTS),)
    block_table_kernel[grid](
        offsets, cum, table, batch, num_slots, BLOCK=block_size, SLOTS=_TABLE_SLOTS, SEARCH_STEPS=steps
    )
    return table


def _sinu_args(sinu: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, int]:
    # Kernels without rotary never read SINU; any valid pointer will do.
    return (sinu, sinu.stride(0)) if sinu is not None else (like, 0)


def _meta(q, k, block_size, num_warps, rot_qk, rot_v) -> dict:
    """Constexprs and launch options shared by the forward and backward kernels."""
    heads, heads_kv = q.shape[1], k.shape[1]
    return dict(
        H_KV=heads_kv, G=heads // heads_kv, D=q.shape[2], BLOCK=block_size, ROT_QK=rot_qk, ROT_V=rot_v,
        PRECISION=_precision(q.dtype), num_warps=num_warps, num_stages=1,
    )  # fmt: skip


def launch_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    table: torch.Tensor,
    scale: float,
    block_size: int,
    sinu: torch.Tensor | None = None,
    rot_qk: bool = False,
    rot_v: bool = False,
) -> None:
    """out = softmax(q kᵀ·scale) v per block. q/out (T, H, D), k/v (T, H_kv, D); last dims unit-stride."""
    grid = (table.shape[0] * k.shape[1],)  # one program per (block slot, kv head)
    if grid[0] == 0:
        return
    sinu_t, stride_st = _sinu_args(sinu, q)
    args = (
        q, k, v, out, sinu_t, table,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), stride_st,
        scale * _LOG2E,
    )  # fmt: skip
    warps = fwd_config(q.shape[2], block_size).num_warps
    block_attn_fwd_kernel[grid](*args, **_meta(q, k, block_size, warps, rot_qk, rot_v))


def launch_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    table: torch.Tensor,
    scale: float,
    block_size: int,
    sinu: torch.Tensor | None = None,
    rot_qk: bool = False,
    rot_v: bool = False,
) -> None:
    """Writes dq (T, H, D) and dk/dv (T, H_kv, D), which may be strided views into one packed buffer."""
    grid = (table.shape[0] * k.shape[1],)
    if grid[0] == 0:
        return
    sinu_t, stride_st = _sinu_args(sinu, q)
    args = (
        q, k, v, dout, dq, dk, dv, sinu_t, table,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1),
        dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), stride_st,
        scale, scale * _LOG2E,
    )  # fmt: skip
    warps = bwd_config(q.shape[2], block_size).num_warps
    block_attn_bwd_kernel[grid](*args, **_meta(q, k, block_size, warps, rot_qk, rot_v))


def max_blocks_bound(total_tokens: int, batch: int, block_size: int) -> int:
    """Upper bound on Σ ceil(L_b / block) from shapes alone: each sequence adds at most one partial block."""
    return total_tokens // block_size + batch


def exact_num_blocks(offsets_host: torch.Tensor, block_size: int) -> int:
    """Σ ceil(L_b / block) from host offsets (no device work)."""
    lengths = (offsets_host[1:] - offsets_host[:-1]).tolist()
    return int(sum(math.ceil(max(n, 0) / block_size) for n in lengths))  # bad offsets: the op rejects them
