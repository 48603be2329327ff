"""Pooling by multi-head attention (PMA, as in Kunlun, arXiv 2602.10016): learned queries attending
over each jagged sequence, on ``broadcast_q`` so the queries are stored and read once, not per
sequence."""

from __future__ import annotations

import torch
from torch import nn

from ads_kernel_tools import checks

from .interface import _P, _err, jagged_flash_attention


class PoolingByMultiheadAttention(nn.Module):
    """``num_queries`` learned queries per head pool every kv sequence into ``num_queries`` rows.

    Args:
        num_queries: Lq, the learned query rows.
        num_heads: H, query heads.
        head_dim: D (a multiple of 8 up to 256).
        num_kv_heads: Hkv of the keys/values (default H); H % Hkv == 0 (GQA/MQA).
        deterministic: bitwise repeatable backward.

    ``forward(key, value, key_offset, max_seq_len_kv)``: key/value (Tk, Hkv, D) bf16/fp16 with
    (B+1,) offsets; returns (B·Lq, H, D) in the key's dtype, rows b·Lq..(b+1)·Lq pooling sequence b
    (zeros for an empty one). Scale 1/sqrt(D). The query parameter (Lq, H, D) is kept in its own
    dtype (fp32 by default) and cast to the key's dtype per call; its gradient is summed over the B
    sequences.
    """

    def __init__(
        self,
        num_queries: int,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int | None = None,
        *,
        deterministic: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_queries, num_heads, head_dim, num_kv_heads = (
            checks.integer(name, x, prefix=_P + "PoolingByMultiheadAttention: ", minimum=1)
            for name, x in (
                ("num_queries", num_queries),
                ("num_heads", num_heads),
                ("head_dim", head_dim),
                ("num_kv_heads", num_kv_heads),
            )
        )
        if num_heads % num_kv_heads:
            raise _err(f"PoolingByMultiheadAttention: num_heads ({num_heads}) must be a multiple of "
                       f"num_kv_heads ({num_kv_heads})")  # fmt: skip
        self.num_queries, self.num_heads, self.head_dim = num_queries, num_heads, head_dim
        self.num_kv_heads = num_kv_heads
        self.deterministic = deterministic
        self.query = nn.Parameter(torch.empty(num_queries, num_heads, head_dim, device=device, dtype=dtype))
        # [0, Lq]: a buffer so that it follows the module across devices without a copy per call
        self.register_buffer(
            "query_offset", torch.tensor([0, num_queries], dtype=torch.int32, device=device), persistent=False
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # unit-variance scores at init for unit-variance keys: var(q·k / sqrt(D)) = σ² with σ = 1
        nn.init.normal_(self.query, std=1.0)

    def extra_repr(self) -> str:
        return (f"num_queries={self.num_queries}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"num_kv_heads={self.num_kv_heads}")  # fmt: skip

    def forward(
        self, key: torch.Tensor, value: torch.Tensor, key_offset: torch.Tensor, max_seq_len_kv: int
    ) -> torch.Tensor:
        if not isinstance(key, torch.Tensor) or key.dim() != 3:
            raise _err("PoolingByMultiheadAttention: key must be a 3-D tensor (tokens, kv heads, head_dim)")
        if key.shape[1] != self.num_kv_heads or key.shape[2] != self.head_dim:
            raise _err(
                f"PoolingByMultiheadAttention: key has shape {tuple(key.shape)}, expected "
                f"(tokens, {self.num_kv_heads}, {self.head_dim})"
            )
        q = self.query.to(key.dtype)
        return jagged_flash_attention(
            q,
            key,
            value,
            self.query_offset,
            key_offset,
            self.num_queries,
            max_seq_len_kv,
            broadcast_q=True,
            deterministic=self.deterministic,
        )
