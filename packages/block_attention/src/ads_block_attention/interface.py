"""Public API: validate and canonicalise inputs, size the block table, call the custom ops.

Validation only reads shapes, dtypes and devices, except the offsets checks that need values: those
run only when host offsets are at hand (``offsets_cpu``, or offsets that already live on the CPU), so
the GPU hot path never synchronises.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ads_kernel_tools import checks

from . import _ops
from .config import MAX_BLOCK_ELEMS, SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_DIMS
from .triton.launch import exact_num_blocks, max_blocks_bound

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT32_MAX = 2**31 - 1


def _check_offsets(
    offsets: Tensor, total: int, device: torch.device, offsets_cpu: Tensor | None
) -> Tensor | None:
    """Checks offsets' metadata; returns the host copy (CPU tensor) when one exists. Its values are
    checked inside the op (``_ops.check_offset_values``), which also holds under torch.compile."""
    if not isinstance(offsets, Tensor) or offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError("offsets must be a 1-D tensor of B+1 prefix sums")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"offsets must be int32 or int64, got {offsets.dtype}")
    if offsets.device != device:
        raise ValueError(f"offsets are on {offsets.device}, inputs on {device}")
    if total > _INT32_MAX:
        raise ValueError(f"T={total} tokens exceeds the int32 block table")
    host = offsets_cpu
    if host is None and offsets.device.type == "cpu":
        host = offsets  # already on the host: checking values costs no sync
    if host is None:
        return None
    if not isinstance(host, Tensor) or host.device.type != "cpu":
        raise ValueError("offsets_cpu must be a CPU tensor")
    if host.dim() != 1 or host.numel() != offsets.numel():
        raise ValueError(f"offsets_cpu has shape {tuple(host.shape)}, offsets {tuple(offsets.shape)}")
    return host


def _num_slots(host: Tensor | None, total: int, batch: int, block_size: int) -> int:
    # Exact block count from host offsets (eager only: traced code cannot read them); otherwise the
    # shape-only bound (unused slots are skipped).
    if host is not None and not torch.compiler.is_compiling():
        return exact_num_blocks(host, block_size)
    return max_blocks_bound(total, batch, block_size)


def _scale(scale: object, head_dim: int) -> float:
    """The softmax scale: finite (NaN or inf would make every row non-finite); None: 1/sqrt(D)."""
    scale = checks.real("scale", scale, allow_none=True)
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    block_size: int = 64,
    scale: float | None = None,
    offsets_cpu: Tensor | None = None,
) -> Tensor:
    """Block-diagonal attention on jagged sequences.

    Each sequence b (rows ``[offsets[b], offsets[b+1])``) is cut into ``block_size``-token blocks from
    its first token; query block j attends to key/value block j only (full softmax, no causal mask).

    Args:
        q: (T, H, D) queries; bf16, fp16 or fp32; D in {32, 64, 128, 256}.
        k, v: (T, H_kv, D) keys and values, H % H_kv == 0 (GQA/MQA: head h uses kv head h // (H/H_kv)).
        offsets: (B+1,) int32/int64 prefix sums on q's device; empty sequences are allowed.
        block_size: tokens per block, one of 16, 32, 64 (default), 128.
        scale: softmax scale, default 1/sqrt(D).
        offsets_cpu: optional host copy of offsets: enables value checks and an exact grid size.
    Returns:
        (T, H, D) output in q's dtype; autograd gives dq, dk, dv.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a (T, H, D) tensor, got {getattr(t, 'shape', type(t))}")
    if q.dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; use bfloat16, float16 or float32")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    total, heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != total or k.shape[2] != head_dim:
        raise ValueError(
            f"k and v must be (T, H_kv, D) = ({total}, H_kv, {head_dim}); got {k.shape}, {v.shape}"
        )
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads % heads_kv != 0:
        raise ValueError(f"H={heads} must be a multiple of H_kv={heads_kv}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} unsupported; supported: {SUPPORTED_HEAD_DIMS}")
    # an integer first: 64.0 == 64 would pass the membership test, then fail inside the op's int schema
    block_size = checks.integer("block_size", block_size)
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} unsupported; supported: {SUPPORTED_BLOCK_SIZES}")
    if block_size * head_dim > MAX_BLOCK_ELEMS:
        # the backward keeps block x D tiles of q, k, v, dO and dQ/dK/dV on chip: 288 KB at 128 x 256
        raise ValueError(
            f"block_size {block_size} with head dim {head_dim} needs more shared memory than an SM has; "
            f"use block_size <= {MAX_BLOCK_ELEMS // head_dim} at this head dim"
        )
    host = _check_offsets(offsets, total, q.device, offsets_cpu)
    scale = _scale(scale, head_dim)
    num_slots = _num_slots(host, total, offsets.numel() - 1, block_size)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, _table = _ops.fwd(q, k, v, offsets, num_slots, block_size, scale, host)
    return out


def qkv_proj_rotary_block_attention(
    x: Tensor,
    w: Tensor,
    sinu_pos: Tensor,
    offsets: Tensor,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    bias: Tensor | None = None,
    rotate_v: bool = True,
    offsets_cpu: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Projection, interleaved rotary and 64-token block attention; gradients reach x, w and bias.

    ``qkv = x @ w (+ bias)`` with columns [Q | K | V], head-major, then q, k (and v if ``rotate_v``) are
    rotated pairwise by ``sinu_pos`` inside the attention kernel, whose backward applies the transpose
    rotation in its epilogue and writes one packed dQKV; dx, dw, dbias follow from two GEMMs and a sum.

    Args:
        x: (T, hidden). w: (hidden, (H + 2·H_kv)·D). bias: optional ((H + 2·H_kv)·D,).
        sinu_pos: (T, D) per-token table, cols [0, D/2) sin_i and [D/2, D) cos_i; gets no gradient.
        offsets, offsets_cpu: as in :func:`block_attention`.
        num_heads: H. num_kv_heads: H_kv (default H). scale: default 1/sqrt(D).
    Returns:
        (T, H, D) in x's dtype.
    """
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x (T, hidden) and w (hidden, N) do not match: {tuple(x.shape)}, {tuple(w.shape)}")
    if x.dtype not in _DTYPES or w.dtype != x.dtype or sinu_pos.dtype != x.dtype:
        raise ValueError(
            f"x, w, sinu_pos need one dtype among {_DTYPES}: {x.dtype}, {w.dtype}, {sinu_pos.dtype}"
        )
    if w.device != x.device or sinu_pos.device != x.device:
        raise ValueError("x, w and sinu_pos must be on one device")
    num_heads = checks.integer("num_heads", num_heads)
    num_kv_heads = checks.integer("num_kv_heads", num_kv_heads)
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}")
    groups = num_heads + 2 * num_kv_heads
    if w.shape[1] % groups != 0:
        raise ValueError(f"w has {w.shape[1]} columns, not a multiple of H + 2·H_kv = {groups}")
    head_dim = w.shape[1] // groups
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} unsupported; supported: {SUPPORTED_HEAD_DIMS}")
    total = x.shape[0]
    if sinu_pos.shape != (total, head_dim):
        raise ValueError(f"sinu_pos must be (T, D) = ({total}, {head_dim}), got {tuple(sinu_pos.shape)}")
    if bias is not None and (bias.shape != (w.shape[1],) or bias.dtype != x.dtype or bias.device != x.device):
        raise ValueError(f"bias must be ({w.shape[1]},) of x's dtype and device")
    host = _check_offsets(offsets, total, x.device, offsets_cpu)
    scale = _scale(scale, head_dim)
    num_slots = _num_slots(host, total, offsets.numel() - 1, 64)
    qkv = torch.addmm(bias, x, w) if bias is not None else x @ w
    sinu = _last_dim_contiguous(sinu_pos)
    out, _table = _ops.rotary_fwd(
        qkv, sinu, offsets, num_slots, num_heads, num_kv_heads, rotate_v, scale, host
    )
    return out
