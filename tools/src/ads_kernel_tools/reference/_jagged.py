"""Row ranges of jagged batches, shared by the references."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def offsets_list(cu: torch.Tensor | Sequence[int]) -> list[int]:
    """(B+1,) offsets as Python ints (a reference may read them: it is not a hot path)."""
    return [int(x) for x in (cu.tolist() if isinstance(cu, torch.Tensor) else cu)]


@dataclass(frozen=True)
class JaggedRanges:
    q: list[tuple[int, int]]  # query rows [start, end) of each sequence
    k: list[tuple[int, int]]  # key rows
    out_starts: list[int]  # first output row of each sequence
    total_out: int  # output rows


def sequence_ranges(
    cu_q: torch.Tensor | Sequence[int], cu_k: torch.Tensor | Sequence[int], q_rows: int, broadcast_q: bool
) -> JaggedRanges:
    """Per-sequence query, key and output rows. ``broadcast_q``: the one query sequence in ``cu_q``
    (two entries) is shared by every key sequence, and sequence b's output starts at b·Lq."""
    q_off, k_off = offsets_list(cu_q), offsets_list(cu_k)
    k_ranges = list(itertools.pairwise(k_off))
    batch = len(k_ranges)
    if broadcast_q:
        if len(q_off) != 2:
            raise ValueError("broadcast_q needs cu_seqlens_q with exactly 2 entries")
        shared = q_off[1] - q_off[0]
        return JaggedRanges([(q_off[0], q_off[1])] * batch, k_ranges, [b * shared for b in range(batch)],
                            batch * shared)  # fmt: skip
    if len(q_off) != len(k_off):
        raise ValueError(f"cu_seqlens_q has {len(q_off)} entries, cu_seqlens_k has {len(k_off)}")
    return JaggedRanges(list(itertools.pairwise(q_off)), k_ranges, q_off[:-1], q_rows)


def with_graph(out: torch.Tensor, *inputs: torch.Tensor | None) -> torch.Tensor:
    """``out`` joined to the autograd graph of ``inputs`` when no sequence wrote into it (all empty,
    or no rows): a reference filled by slice assignment otherwise returns a tensor without a graph,
    and a gradient check of an empty batch cannot run. Adds the sum of an empty slice of each input:
    exactly 0, whatever the inputs hold, with zero gradients."""
    if out.requires_grad or not torch.is_grad_enabled():
        return out
    live = [t for t in inputs if t is not None and t.requires_grad]
    return out + sum(t[:0].sum() for t in live) if live else out
