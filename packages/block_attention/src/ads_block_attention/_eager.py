"""Eager PyTorch baselines for the benchmark: padded block attention and interleaved rotary in bf16.

These are the "unfused eager" providers: what a user writes without this package. They are not
references (those live in ads_kernel_tools.reference and compute in fp32).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padded_block_index(table: Tensor, block_size: int = 64) -> tuple[Tensor, Tensor]:
    """From the (slots, 2) block table: (blocks, block) row indices (clamped) and their validity mask."""
    used = table[table[:, 1] > 0]
    pos = torch.arange(block_size, device=table.device)
    valid = pos[None, :] < used[:, 1:2]
    rows = torch.where(valid, used[:, 0:1] + pos[None, :], used[:, 0:1]).long()
    return rows, valid


def eager_block_attention(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, valid: Tensor, scale: float
) -> Tensor:
    """Gather to padded (blocks, H, block, D), masked softmax in fp32, PV in the input dtype, scatter back."""
    group = q.shape[1] // k.shape[1]

    def pad(t: Tensor) -> Tensor:
        return t[rows].transpose(1, 2)  # (blocks, heads, block, D)

    qp, kp, vp = pad(q), pad(k), pad(v)
    if group > 1:
        kp, vp = kp.repeat_interleave(group, dim=1), vp.repeat_interleave(group, dim=1)
    s = (qp @ kp.transpose(-1, -2)).float() * scale
    s = s.masked_fill(~valid[:, None, None, :], -1.0e9)
    o = (s.softmax(-1).to(q.dtype) @ vp).transpose(1, 2)  # (blocks, block, H, D)
    out = torch.empty_like(q)
    return out.index_put((rows[valid],), o[valid])


def rotary_eager(x: Tensor, sinu: Tensor) -> Tensor:
    """Interleaved rotary of x (T, heads, D) by sinu (T, D) = [sin | cos], in x's dtype."""
    half = x.shape[-1] // 2
    s, c = sinu[:, None, :half], sinu[:, None, half:]
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack((xe * c - xo * s, xo * c + xe * s), dim=-1).flatten(-2)


def eager_pipeline(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    sinu: Tensor,
    rows: Tensor,
    valid: Tensor,
    heads: int,
    heads_kv: int,
    scale: float,
    rotate_v: bool = True,
) -> Tensor:
    """Unfused projection + rotary + padded block attention, all eager PyTorch."""
    qkv = torch.addmm(bias, x, w) if bias is not None else x @ w
    dim = w.shape[1] // (heads + 2 * heads_kv)
    q, k, v = qkv.split([heads * dim, heads_kv * dim, heads_kv * dim], dim=1)
    q, k, v = (t.unflatten(1, (-1, dim)) for t in (q, k, v))
    q, k = rotary_eager(q, sinu), rotary_eager(k, sinu)
    if rotate_v:
        v = rotary_eager(v, sinu)
    return eager_block_attention(q, k, v, rows, valid, scale)
