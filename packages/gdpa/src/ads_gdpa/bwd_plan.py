"""The host side the Hopper backwards (Gluon and CuTe DSL) share: the call's contract checked, the
inputs made contiguous, and the device-built kv-tile list their persistent CTAs walk.

Both kernels take one 128-row K/V tile of one kv head per work item and stream every query step of
the GQA group past it, so the launch plan depends on the kv tile height alone; the kernel-specific
parts (TMA descriptors, compiled-function lookup) stay with each kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ads_kernel_tools.capability import num_sms as sm_count
from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.tile_list import schedule


@dataclass(frozen=True)
class KvTilePlan:
    """One backward launch: contiguous q, k, v, do; int32 offsets; the kv tile list (heaviest
    first, built on the device) and the persistent grid size."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_seqlen_q: int
    heads: int
    kv_heads: int
    head_dim: int
    n_kv_tiles: int
    tiles: torch.Tensor
    count: torch.Tensor
    programs: int

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads


def plan_kv_tiles(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dq_acc: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    *,
    block_n: int,
    dtypes,
) -> KvTilePlan | None:
    """The launch plan of a jagged backward with ``gdpa_bwd_gluon``'s contract, or None when there is
    nothing to launch (no sequence or no key row). ``dtypes``: the input dtypes the kernel takes.

    q, do (Tq, H, D); k, v (Tk, H_kv, D); dq_acc fp32 (Tq, H, D) contiguous; dk, dv contiguous.
    max_seqlen_q below 0 counts as 0: no query row contributes, dK/dV are still written (zeros)."""
    _, heads, head_dim = q.shape
    total_k, kv_heads, _ = k.shape
    batch = cu_seqlens_q.numel() - 1
    if batch <= 0 or total_k == 0:
        return None
    assert head_dim in (64, 128) and heads % kv_heads == 0 and q.dtype in dtypes and v.shape == k.shape
    assert dq_acc.dtype == torch.float32 and dq_acc.is_contiguous()
    assert dk.is_contiguous() and dv.is_contiguous()
    max_seqlen_q = max(int(max_seqlen_q), 0)
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    cu_q = cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = cu_seqlens_k.to(torch.int32).contiguous()
    # a kv tile's work is the query rows it faces; the list stays on the device (no host sync)
    n_kv_tiles = max(cdiv(max_seqlen_k, block_n), 1)
    tiles, count = schedule(
        cu_q, cu_k, max_seqlen_q, tile_q=False, block=block_n, slots=n_kv_tiles, heads=kv_heads
    )
    programs = min(batch * kv_heads * n_kv_tiles, sm_count(q.device))
    return KvTilePlan(
        q, k, v, do, cu_q, cu_k, max_seqlen_q, heads, kv_heads, head_dim, n_kv_tiles, tiles, count, programs
    )
