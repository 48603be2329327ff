"""Host-side tile maps: workload-sorted (batch, head, tile) lists from CPU offsets.

Tiles are sorted by descending work (keys a query tile visits, or queries a kv tile visits) so the
longest tiles start first (LPT). For a persistent grid of P programs that strides by P, the sorted
list is dealt zigzag: round r gives tile r*P+j to program j on even rounds and P-1-j on odd ones,
which balances the per-program totals (the program count comes from
``ads_kernel_tools.capability.num_sms``).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 32


def _cdiv(a: torch.Tensor, b: int) -> torch.Tensor:
    return (a + b - 1) // b


def tile_map(
    rows: list[int], work: list[int], heads: int, block: int, programs: int | None, device: torch.device
) -> torch.Tensor:
    """Build a (3, n_tiles) int32 map of (batch, head, tile index) on ``device``.

    Args:
        rows: per-sequence row count to tile (Lq clamped to max_seqlen_q, or Lk for the backward).
        work: per-sequence work of one tile (the other side's length).
        heads: heads tiled per sequence (H forward, H_kv backward).
        block: tile height.
        programs: persistent program count (zigzag deal) or None (plain descending order).
    """
    key = (tuple(rows), tuple(work), heads, block, programs, str(device))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    r = torch.tensor(rows, dtype=torch.int64)
    # a sequence with Lq > 0 but Lq_eff = 0 still needs one tile (it writes the zero rows)
    n = _cdiv(r, block).clamp_min(0)
    b_idx = torch.repeat_interleave(torch.arange(len(rows)), n)
    starts = torch.cumsum(n, 0) - n
    t_idx = torch.arange(int(n.sum())) - torch.repeat_interleave(starts, n)
    w = torch.repeat_interleave(torch.tensor(work, dtype=torch.int64), n)
    order = torch.argsort(w, descending=True, stable=True)
    b_idx, t_idx = b_idx[order], t_idx[order]
    nt = b_idx.numel()
    b_all = b_idx.repeat_interleave(heads)
    t_all = t_idx.repeat_interleave(heads)
    h_all = torch.arange(heads).repeat(nt)
    if programs is not None and programs > 0 and b_all.numel() > programs:
        perm = _zigzag(b_all.numel(), programs)
        b_all, h_all, t_all = b_all[perm], h_all[perm], t_all[perm]
    m = torch.stack([b_all, h_all, t_all]).to(torch.int32).contiguous().to(device, non_blocking=True)
    _CACHE[key] = m
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return m


def _zigzag(n: int, programs: int) -> torch.Tensor:
    """Permutation p so that slot r*P+j holds sorted tile r*P + (j or P-1-j on odd rounds)."""
    slot = torch.arange(n)
    r, j = slot // programs, slot % programs
    last_round_len = n - (n // programs) * programs
    width = torch.where(r == n // programs, torch.full_like(r, last_round_len), torch.full_like(r, programs))
    src_j = torch.where(r % 2 == 1, width - 1 - j, j)
    return r * programs + src_j
