"""Host launchers: tiles, grids and strides for the Triton kernels. No host sync here."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from .. import config as cfg

BIG = 1 << 30  # an unbounded window side; band arithmetic on it stays inside int32
LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Problem:
    """Everything a launch needs besides tensors (window sides already resolved, BIG = unbounded)."""

    max_q: int  # the longest query slot: grid bound of the query tiles
    max_k: int  # the longest key sequence: grid bound of the backward's key tiles
    scale: float
    softcap: float
    win_left: int
    win_right: int
    top_left: bool
    broadcast_q: bool
    rows_cap: int  # BIG, or the jagged max_seqlen_q past which query rows are zeros

    def caps(self) -> tuple[int, int]:
        """(rows, keys) of a sequence the kernels compute: at most max_q query rows (and the jagged
        cap) and max_k keys, so that forward and backward agree on a sequence longer than its bound."""
        return min(self.rows_cap, self.max_q), self.max_k

    def score_args(self) -> tuple[float, float, float, int, int]:
        cap = self.softcap
        cap_in = self.scale / cap if cap > 0 else 0.0
        return self.scale * LOG2E, cap_in, cap * LOG2E, self.win_left, self.win_right


def _tma_ok(*tensors: torch.Tensor, paged: bool = False) -> bool:
    """Per-sequence TMA descriptors over rows of ``tensors``: opted in, not paged, on sm90+ (or the
    interpreter, which runs descriptors in software), rows and head offsets 16-byte aligned."""
    if not cfg.use_tma() or paged:
        return False
    if not cfg.interpreter_active():
        if tensors[0].device.type != "cuda" or torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
            return False
    for t in tensors:
        e = t.element_size()
        if t.data_ptr() % 16 or (t.stride(0) * e) % 16 or (t.stride(1) * e) % 16 or (t.shape[-1] * e) % 16:
            return False
    return True


def _scratch(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _allocator(use_tma: bool) -> None:
    """Device-side descriptors need scratch from a Triton allocator. It lives in a ContextVar, so it
    is set per launch (autograd runs the backward on another thread than the forward)."""
    if use_tma and not cfg.interpreter_active():
        triton.set_allocator(_scratch)


def _pad(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


from .launch_bwd import bwd  # noqa: E402
from .launch_fwd import fwd  # noqa: E402

__all__ = ["BIG", "Problem", "bwd", "fwd"]
