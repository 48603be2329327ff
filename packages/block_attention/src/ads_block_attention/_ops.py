"""torch.library custom ops (fake impls, autograd, FLOP formulas) around the Triton launchers.

``custom_op`` (not ``triton_op``) is deliberate: it also passes opcheck and torch.compile on CPU under
TRITON_INTERPRET, where ``triton_op`` would read data pointers of fake tensors.

Ops:
- ``fwd(q, k, v, offsets, num_slots, block_size, scale, offsets_host=None) -> (out, table)``
- ``bwd(dout, q, k, v, table, block_size, scale) -> (dq, dk, dv)``
- ``rotary_fwd(qkv, sinu, offsets, num_slots, num_heads, num_kv_heads, rotate_v, scale, offsets_host=None)
  -> (out, table)``
  on the packed unrotated projection qkv (T, (H + 2·H_kv)·D); rotary is applied to tiles after load.
- ``rotary_bwd(dout, qkv, sinu, table, num_heads, num_kv_heads, rotate_v, scale) -> dqkv`` (packed,
  transpose rotation fused into the epilogue).
The int32 table output is non-differentiable; it is saved so the backward need not rebuild it.
``offsets_host`` (a CPU copy of the offsets, optional) is checked inside the forward ops: there it is
real data even under torch.compile, where the Python wrapper only sees fake tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ads_kernel_tools.offsets import check_inputs_enabled, validate_offsets

from .triton.launch import build_block_table, launch_bwd, launch_fwd

_ROTARY_BLOCK = 64  # the fused projection path uses the upstream block size


def check_offset_values(offsets: Tensor, offsets_host: Tensor | None, total: int) -> None:
    """Offsets must run from 0 to T without decreasing: anything else would make the kernels read and
    write rows of other sequences. Checked on the host copy when there is one (no sync), on the
    device offsets under ``ADS_CHECK_INPUTS=1`` (one sync), by the validator every package shares."""
    values = offsets_host if offsets_host is not None else (offsets if check_inputs_enabled() else None)
    if values is not None:
        validate_offsets("offsets", values, total, cover=True, prefix="ads_block_attention: ")


def _split_qkv(qkv: Tensor, num_heads: int, num_kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Strided (T, heads, D) views of the [Q | K | V] column groups of a packed (T, (H + 2H_kv)·D) tensor."""
    total = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q = qkv[:, : num_heads * head_dim].view(total, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        total, num_kv_heads, head_dim
    )
    v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(total, num_kv_heads, head_dim)
    return q, k, v


# ---------------------------------------------------------------- plain block attention
@torch.library.custom_op("ads_block_attention::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    num_slots: int,
    block_size: int,
    scale: float,
    offsets_host: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    check_offset_values(offsets, offsets_host, q.shape[0])
    table = build_block_table(offsets, num_slots, block_size)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch_fwd(q, k, v, out, table, scale, block_size)
    return out, table


@fwd.register_fake
def _(q, k, v, offsets, num_slots, block_size, scale, offsets_host=None):
    return q.new_empty(q.shape), offsets.new_empty((num_slots, 2), dtype=torch.int32)


@torch.library.custom_op("ads_block_attention::bwd", mutates_args=())
def bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, table: Tensor, block_size: int, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    launch_bwd(dout, q, k, v, dq, dk, dv, table, scale, block_size)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, table, block_size, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup(ctx, inputs, output) -> None:
    q, k, v, _offsets, _num_slots, block_size, scale, _host = inputs
    ctx.save_for_backward(q, k, v, output[1])
    ctx.block_size, ctx.scale = block_size, scale


def _fwd_backward(ctx, dout: Tensor, _dtable):
    q, k, v, table = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, table, ctx.block_size, ctx.scale)
    return dq, dk, dv, None, None, None, None, None


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


# ---------------------------------------------------------------- projection + rotary path
@torch.library.custom_op("ads_block_attention::rotary_fwd", mutates_args=())
def rotary_fwd(
    qkv: Tensor,
    sinu: Tensor,
    offsets: Tensor,
    num_slots: int,
    num_heads: int,
    num_kv_heads: int,
    rotate_v: bool,
    scale: float,
    offsets_host: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    check_offset_values(offsets, offsets_host, qkv.shape[0])
    q, k, v = _split_qkv(qkv, num_heads, num_kv_heads)
    table = build_block_table(offsets, num_slots, _ROTARY_BLOCK)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch_fwd(q, k, v, out, table, scale, _ROTARY_BLOCK, sinu=sinu, rot_qk=True, rot_v=rotate_v)
    return out, table


@rotary_fwd.register_fake
def _(qkv, sinu, offsets, num_slots, num_heads, num_kv_heads, rotate_v, scale, offsets_host=None):
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    out = qkv.new_empty((qkv.shape[0], num_heads, head_dim))
    return out, offsets.new_empty((num_slots, 2), dtype=torch.int32)


@torch.library.custom_op("ads_block_attention::rotary_bwd", mutates_args=())
def rotary_bwd(
    dout: Tensor,
    qkv: Tensor,
    sinu: Tensor,
    table: Tensor,
    num_heads: int,
    num_kv_heads: int,
    rotate_v: bool,
    scale: float,
) -> Tensor:
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    q, k, v = _split_qkv(qkv, num_heads, num_kv_heads)
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    dq, dk, dv = _split_qkv(dqkv, num_heads, num_kv_heads)
    launch_bwd(dout, q, k, v, dq, dk, dv, table, scale, _ROTARY_BLOCK, sinu=sinu, rot_qk=True, rot_v=rotate_v)
    return dqkv


@rotary_bwd.register_fake
def _(dout, qkv, sinu, table, num_heads, num_kv_heads, rotate_v, scale):
    return qkv.new_empty(qkv.shape)


def _rotary_setup(ctx, inputs, output) -> None:
    qkv, sinu, _offsets, _num_slots, num_heads, num_kv_heads, rotate_v, scale, _host = inputs
    ctx.save_for_backward(qkv, sinu, output[1])
    ctx.args = (num_heads, num_kv_heads, rotate_v, scale)


def _rotary_backward(ctx, dout: Tensor, _dtable):
    qkv, sinu, table = ctx.saved_tensors
    dqkv = rotary_bwd(dout, qkv, sinu, table, *ctx.args)
    return dqkv, None, None, None, None, None, None, None, None


rotary_fwd.register_autograd(_rotary_backward, setup_context=_rotary_setup)


# ---------------------------------------------------------------- FLOP formulas (spec A6)
# SDPA count with key length = block size per query row: fwd 4·H·D·block·T, bwd 2.5× that.
@register_flop_formula(torch.ops.ads_block_attention.fwd)
def _fwd_flops(q_shape, k_shape, v_shape, offsets_shape, num_slots, block_size, scale, *a, **kw) -> int:
    total, heads, head_dim = q_shape
    return 4 * heads * head_dim * block_size * total


@register_flop_formula(torch.ops.ads_block_attention.bwd)
def _bwd_flops(dout_shape, q_shape, k_shape, v_shape, table_shape, block_size, scale, *a, **kw) -> int:
    total, heads, head_dim = q_shape
    return 10 * heads * head_dim * block_size * total


@register_flop_formula(torch.ops.ads_block_attention.rotary_fwd)
def _rotary_fwd_flops(
    qkv_shape, sinu_shape, offsets_shape, num_slots, num_heads, num_kv_heads, *a, **kw
) -> int:
    head_dim = qkv_shape[1] // (num_heads + 2 * num_kv_heads)
    return 4 * num_heads * head_dim * _ROTARY_BLOCK * qkv_shape[0]


@register_flop_formula(torch.ops.ads_block_attention.rotary_bwd)
def _rotary_bwd_flops(
    dout_shape, qkv_shape, sinu_shape, table_shape, num_heads, num_kv_heads, *a, **kw
) -> int:
    head_dim = qkv_shape[1] // (num_heads + 2 * num_kv_heads)
    return 10 * num_heads * head_dim * _ROTARY_BLOCK * qkv_shape[0]
