"""broadcast_q (one query sequence attending to each of the B kv sequences: PMA) on the per-sequence
kernels.

The Gluon Hopper kernels take no broadcast_q: their query rows come from one TMA view per sequence.
Where they would run, the call repeats the queries once per kv sequence instead (B·Lq rows, the
output's own layout) and runs as ordinary jagged attention; autograd's backward of the repeat sums dQ
over the batch. The repeat costs one copy of B·Lq query rows (and the dQ sum), small against the
attention itself at PMA sizes. The Triton kernels read the one query block in place, so they keep
broadcast_q, as does ``deterministic=True`` (its Triton backward is the bitwise-repeatable one).
``LP_FA4_BROADCAST_Q`` (``config.broadcast_q``) overrides the choice.
"""

from __future__ import annotations

import torch

from ads_kernel_tools.capability import gluon_sm90_reason

from . import config as cfg
from .gluon.dispatch import batch_offsets, tile_reason

_INT32_MAX = 2**31 - 1


def repeats(q: torch.Tensor, v: torch.Tensor, n_b: int, deterministic: bool) -> bool:
    """True when a broadcast_q call should repeat its queries (see the module docstring): ``repeat``
    always (while the offsets fit int32), ``kernel`` never, ``auto`` where the Gluon kernels take
    the repeated call's dtype and head dims on this device (bf16/fp16: FP8 calls do not come here)
    and the call is not deterministic."""
    mode = cfg.broadcast_q()
    if mode == "kernel" or n_b * q.shape[0] > _INT32_MAX:
        return False
    if mode == "repeat":
        return True
    if deterministic or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if tile_reason(q.dtype, q.shape[-1], v) is not None:
        return False
    return _gluon_device(q.device)


@torch.compiler.assume_constant_result
def _gluon_device(device: torch.device) -> bool:
    """Whether the Gluon kernels run on this device with this configuration: a constant of the
    machine and the environment, so torch.compile evaluates it once instead of tracing it."""
    return cfg.backend() == "auto" and gluon_sm90_reason(device) is None


def repeat(q: torch.Tensor, n_b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q repeated n_b times along rows, its int32 device offsets b·Lq, their int64 CPU copy).
    Built from shapes only: no host sync; the device offsets are the cached dense ones
    (``gluon.dispatch.batch_offsets``) outside torch.compile."""
    lq = q.shape[0]
    host = torch.arange(n_b + 1, dtype=torch.int64) * lq
    return q.repeat(n_b, 1, 1), batch_offsets(n_b, lq, q.device), host
