"""Sequence offsets as the kernels take them: the cached offsets of dense batches, which kernels
trust as built (in range by construction), and every other offsets clamped into their tensors
(``kernel_offsets``). Shared by the Gluon forward and backward and the Triton query-resident
backward."""

from __future__ import annotations

import torch

from ads_kernel_tools.kernels.offsets import clamp_offsets
from ads_kernel_tools.kernels.tile_list import schedule

# (B, L, device) -> int32 offsets b·L of a dense batch; id -> (tensor, L) of the same tensors
_DENSE: dict[tuple[int, int, str], torch.Tensor] = {}
_DENSE_IDS: dict[int, tuple[torch.Tensor, int]] = {}
_DENSE_MAX = 64
# (id(cu_q), id(cu_k), schedule's arguments) -> (cu_q, cu_k, (entries, count)) of dense offsets
_SCHEDULES: dict[tuple, tuple] = {}


def dense_offsets(n_b: int, s: int, device) -> torch.Tensor:
    """int32 (B+1,) offsets b·s of a dense batch, cached per (B, s, device): a dense call builds
    none on the device. Kernels may trust these without clamping (``dense_length``). Callers must
    not write into them."""
    key = (n_b, s, str(device))
    t = _DENSE.get(key)
    if t is None:
        t = torch.arange(0, n_b + 1, dtype=torch.int32, device=device) * s
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            return t  # filled only when the graph replays: not for eager reuse
        if len(_DENSE) >= _DENSE_MAX:  # forget the oldest; it is then clamped like any offsets
            old = _DENSE.pop(next(iter(_DENSE)))
            _DENSE_IDS.pop(id(old), None)
        _DENSE[key] = t
        _DENSE_IDS[id(t)] = (t, s)
    return t


def batch_offsets(n_b: int, s: int, device) -> torch.Tensor:
    """(B+1,) offsets b·s of a batch of B equal-length sequences, for any caller: ``dense_offsets``'
    cached int32 tensor where it can be (trusted by the Gluon forward), a fresh one while
    torch.compile traces (a cached tensor would become a graph constant), int64 past int32."""
    if n_b * s >= 2**31:
        return torch.arange(0, n_b + 1, dtype=torch.int64, device=device) * s
    if torch.compiler.is_compiling():
        return torch.arange(0, n_b + 1, dtype=torch.int32, device=device) * s
    return dense_offsets(n_b, s, device)


def dense_length(cu: torch.Tensor | None, rows: int) -> int | None:
    """L when ``cu`` is one of ``dense_offsets``' tensors, unmodified, whose B·L equals ``rows`` (so
    every span lies inside a tensor of that many rows: no clamp needed), else None."""
    entry = _DENSE_IDS.get(id(cu)) if cu is not None else None
    if entry is None or entry[0] is not cu or (cu.shape[0] - 1) * entry[1] != rows:
        return None
    if not cu.is_inference() and cu._version != 0:  # inference tensors keep no version counter
        return None
    return entry[1]


def kernel_offsets(
    cu_q: torch.Tensor | None, tq: int, cu_k: torch.Tensor, tk: int
) -> tuple[torch.Tensor | None, torch.Tensor, int | None, int | None]:
    """(cu_q, cu_k, Lq, Lk) for a kernel that needs offsets inside their tensors (the Gluon
    forward and backward, the query-resident backward): the dense batches' own offsets
    (``dense_offsets``, in range by construction) as they are, with their length; any other offsets
    clamped into their tensors (``clamp_offsets``, one launch for both), with length None.
    ``cu_q`` None (a kernel that clamps its query offsets itself) gives None, Lq None."""
    lq, lk = dense_length(cu_q, tq), dense_length(cu_k, tk)
    clamp_q = cu_q is not None and lq is None
    if clamp_q and lk is None:
        cu_q, cu_k = clamp_offsets(cu_q, tq, cu_k, tk)
    elif clamp_q:
        cu_q = clamp_offsets(cu_q, tq)[0]
    elif lk is None:
        cu_k = clamp_offsets(cu_k, tk)[0]
    return cu_q, cu_k, lq, lk


def dense_schedule(
    cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, **kw
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ads_kernel_tools.kernels.tile_list.schedule(cu_q, cu_k, max_q, **kw)`` (no ``work``), built
    once per argument set when cu_q and cu_k are both ``dense_offsets``' tensors (checked by the
    caller through ``kernel_offsets``' lengths): their list depends on the shapes alone, so a dense
    call launches no list after its first. Callers must not write into the result."""
    key = (id(cu_q), id(cu_k), max_q, *sorted(kw.items()))
    entry = _SCHEDULES.get(key)
    if entry is not None and entry[0] is cu_q and entry[1] is cu_k:
        return entry[2]
    made = schedule(cu_q, cu_k, max_q, **kw)
    if cu_q.is_cuda and torch.cuda.is_current_stream_capturing():
        return made  # filled only when the graph replays: not for eager reuse
    while len(_SCHEDULES) >= _DENSE_MAX:
        _SCHEDULES.pop(next(iter(_SCHEDULES)))
    _SCHEDULES[key] = (cu_q, cu_k, made)
    return made
