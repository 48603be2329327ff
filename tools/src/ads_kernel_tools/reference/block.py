"""Reference fixed-block (block-diagonal) attention, interleaved rotary and the fused QKV projection.

Spec: block_attention_and_norm_fusion.md part A. Each sequence is cut into ``block_size``-token blocks
from its own first token; query block j attends (full softmax, no causal mask) to key block j only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from ads_kernel_tools.reference._jagged import offsets_list

__all__ = [
    "block_attention_ref",
    "block_diagonal_mask",
    "qkv_proj_rotary_block_attention_ref",
    "rotary_interleaved_ref",
]


def _compute_dtype(dtype: torch.dtype) -> tuple[bool, torch.dtype]:
    low = dtype in (torch.bfloat16, torch.float16)
    return low, torch.float32 if low else dtype


def block_diagonal_mask(
    offsets: torch.Tensor | Sequence[int], *, block_size: int = 64, device: torch.device | str | None = None
) -> torch.Tensor:
    """Dense boolean (T, T) mask: token a may attend to token b iff both lie in the same block."""
    off = offsets_list(offsets)
    block_id = torch.empty(off[-1], dtype=torch.long, device=device)
    next_id = 0
    for start, end in itertools.pairwise(off):
        n = end - start
        block_id[start:end] = next_id + torch.arange(n, device=device) // block_size
        next_id += -(-n // block_size)
    return block_id[:, None] == block_id[None, :]


def _to_blocks(t: torch.Tensor, heads: int, block_size: int) -> torch.Tensor:
    """(n, h, d) -> (nblk, heads, block_size, d): kv heads expanded (GQA), zero-padded to whole blocks."""
    n = t.shape[0]
    nblk = -(-n // block_size)
    t = t.repeat_interleave(heads // t.shape[1], dim=1)
    t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, nblk * block_size - n))
    return t.view(nblk, block_size, heads, -1).transpose(1, 2)


def block_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor | Sequence[int],
    *,
    block_size: int = 64,
    scale: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Block-diagonal softmax attention: q (T, H, D), k/v (T, H_kv, D) -> out (T, H, D) in ``dtype``.

    ``scale`` defaults to 1/sqrt(D). GQA: head h uses kv head h // (H // H_kv). Empty sequences are
    allowed. bf16/fp16 ``dtype`` gives the kernel-like baseline: inputs rounded, fp32 scores and softmax,
    normalised P rounded to ``dtype`` before PV (fp32 accumulation), output rounded.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads != 0 or v.shape[1] != kv_heads:
        raise ValueError(f"bad head counts: q {heads}, k {kv_heads}, v {v.shape[1]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    low, compute = _compute_dtype(dtype)
    qc, kc, vc = ((t.to(dtype).to(compute) if low else t.to(compute)) for t in (q, k, v))

    out = torch.zeros(q.shape[0], heads, v.shape[-1], dtype=dtype, device=q.device)
    off = offsets_list(offsets)
    for start, end in itertools.pairwise(off):
        n = end - start
        if n <= 0:
            continue
        nblk = -(-n // block_size)
        qb, kb, vb = (_to_blocks(t[start:end], heads, block_size) for t in (qc, kc, vc))
        s = (qb @ kb.transpose(-1, -2)) * scale
        key_valid = (torch.arange(nblk * block_size, device=q.device) < n).view(nblk, 1, 1, block_size)
        # Every valid query row has at least its own key, so -inf cannot produce an all-masked row.
        p = torch.softmax(s.masked_fill(~key_valid, -math.inf), dim=-1)
        if low:
            p = p.to(dtype).to(compute)
        ob = (p @ vb).transpose(1, 2).reshape(nblk * block_size, heads, -1)[:n]
        out[start:end] = ob.to(dtype)
    return out


def rotary_interleaved_ref(x: torch.Tensor, sinu_pos: torch.Tensor) -> torch.Tensor:
    """GPT-J style ("rotate every two") rotary: x (T, H, D), sinu_pos (T, D) shared by all heads.

    ``sinu_pos[:, :D/2]`` holds sin_i and ``sinu_pos[:, D/2:]`` holds cos_i for pair i = (2i, 2i+1):
    ``y[2i] = x[2i] c - x[2i+1] s``, ``y[2i+1] = x[2i+1] c + x[2i] s``. Computed and returned in fp32
    (fp64 if either input is fp64). ``sinu_pos`` need not be real sines/cosines.
    """
    d = x.shape[-1]
    if d % 2 or sinu_pos.shape != (x.shape[0], d):
        raise ValueError(
            f"need even D and sinu_pos (T, D); got x {tuple(x.shape)}, sinu_pos {tuple(sinu_pos.shape)}"
        )
    compute = torch.float64 if torch.float64 in (x.dtype, sinu_pos.dtype) else torch.float32
    x = x.to(compute)
    sin = sinu_pos[:, None, : d // 2].to(compute)
    cos = sinu_pos[:, None, d // 2 :].to(compute)
    even, odd = x[..., 0::2], x[..., 1::2]
    y_even = even * cos - odd * sin
    y_odd = odd * cos + even * sin
    return torch.stack((y_even, y_odd), dim=-1).flatten(-2)


def qkv_proj_rotary_block_attention_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    sinu_pos: torch.Tensor,
    offsets: torch.Tensor | Sequence[int],
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    bias: torch.Tensor | None = None,
    rotate_v: bool = True,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``qkv = x @ w (+ bias)``, interleaved rotary on q, k (and v), then 64-token block attention.

    x (T, hidden), w (hidden, (H + 2 H_kv) D) with columns [Q | K | V], each head-major; D is inferred
    from w. Returns (T, num_heads, D) in ``dtype``; differentiable w.r.t. x, w and bias. bf16/fp16
    ``dtype``: the projection (fp32 accumulation) and the rotary outputs are rounded to ``dtype`` as an
    eager low-precision pipeline would, then the block-attention baseline runs.
    """
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    width = num_heads + 2 * kv_heads
    if w.shape[1] % width:
        raise ValueError(f"w has {w.shape[1]} columns, not a multiple of {width} heads")
    d = w.shape[1] // width
    low, compute = _compute_dtype(dtype)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).to(compute) if low else t.to(compute)

    qkv = cast(x) @ cast(w)
    if bias is not None:
        qkv = qkv + cast(bias)
    qkv = cast(qkv)
    tokens = x.shape[0]
    q = qkv[:, : num_heads * d].view(tokens, num_heads, d)
    k = qkv[:, num_heads * d : (num_heads + kv_heads) * d].view(tokens, kv_heads, d)
    v = qkv[:, (num_heads + kv_heads) * d :].view(tokens, kv_heads, d)
    sinu = cast(sinu_pos)
    q, k = cast(rotary_interleaved_ref(q, sinu)), cast(rotary_interleaved_ref(k, sinu))
    if rotate_v:
        v = cast(rotary_interleaved_ref(v, sinu))
    return block_attention_ref(q, k, v, offsets, dtype=dtype)
