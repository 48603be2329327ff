"""broadcast_q (one query sequence attending to each of the B kv sequences: PMA) on the per-sequence
kernels.

The Gluon kv-tile backward takes no broadcast_q (its dQ rows are per sequence). A call runs one of
three ways (``plan``; ``LP_FA4_BROADCAST_Q``, ``config.broadcast_q``, overrides it):

- ``resident``: the op keeps broadcast_q. Its forward runs the Gluon kernel on B sequences of Lq
  output rows, all loading their query tiles from the one block (``fwd_sm90.fwd``'s ``q_block``;
  ``LP_FA4_BQ_FWD_BLOCK=0``: on the queries repeated once per kv sequence inside the op), but a
  query block of at most ``config.bq_small_fwd_rows()`` rows, 32 by default, runs the Triton
  kernel's in-place broadcast at a 64-row tile (``config.bq_fwd_tile``);
  its backward is a query-resident kernel (``triton._bwd_resident``: one program per (kv
  sequence, head) holds the query block and streams the keys; for blocks of 65-128 rows at D = 128
  the Gluon ``gluon.bwd_resident_sm90``), whose dQ is already summed over the batch; the op carries
  the plan to its backward (``lp_fa4::fwd``'s ``resident_bwd``).
- ``repeat``: the queries are repeated before the op (``gluon.dispatch.repeat_queries``), so forward
  and backward run as ordinary jagged attention on the Gluon kernels and autograd's backward of the
  repeat sums dQ over the batch.
- ``kernel``: the Triton kernels read the one query block in place, both ways; also what
  ``deterministic=True`` takes where ``resident`` would run (its Triton backward is the
  bitwise-repeatable one).
"""

from __future__ import annotations

import torch

from ads_kernel_tools.capability import gluon_sm90_reason

from . import config as cfg
from .gluon.dispatch import tile_reason
from .triton.launch import BIG

_INT32_MAX = 2**31 - 1


def resident_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: tuple[int, int],
                    deterministic: bool) -> str | None:  # fmt: skip
    """None when the query-resident backward takes a broadcast_q call of queries ``q`` (Lq, H, D)
    and keys ``k``/``v`` (·, Hkv, ·), else why not: it needs MHA (H == Hkv), Lq <= 128, D == Dv <=
    128, bf16/fp16, no window and a non-deterministic backward (dQ by atomics)."""
    if deterministic:
        return "deterministic"
    if window != (BIG, BIG):
        return "window"
    if q.shape[1] != k.shape[1]:
        return "GQA/MQA"
    if q.shape[0] > cfg.RESIDENT_LQ:
        return f"Lq {q.shape[0]} > {cfg.RESIDENT_LQ}"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}"
    if q.shape[-1] > 128 or v.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
        return f"head dims {q.shape[-1]}/{v.shape[-1]}"
    return None


def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_b: int, window: tuple[int, int],
         deterministic: bool) -> str:  # fmt: skip
    """ "resident", "repeat" or "kernel" for a broadcast_q call with none of the options that keep
    it off the Gluon kernels (see the module docstring). ``auto``: ``resident`` where its backward
    takes the call, the Gluon kernels run and Lq <= ``LP_FA4_RESIDENT_MAX_LQ`` or the Gluon
    resident backward would take the block (``_gluon_resident``); else ``repeat``
    where the Gluon kernels take the repeated call (bf16/fp16, D == Dv in {64, 128}, not
    deterministic); else ``kernel``."""
    mode = cfg.broadcast_q()
    if mode == "kernel" or n_b * q.shape[0] > _INT32_MAX:
        return "kernel"
    if mode == "repeat":
        return "repeat"
    resident = resident_reason(q, k, v, window, deterministic) is None
    if mode == "resident":
        return "resident" if resident else "kernel"
    if deterministic or tile_reason(q.dtype, q.shape[-1], v) is not None or not _gluon_device(q.device):
        return "kernel"
    if resident and (q.shape[0] <= cfg.resident_max_lq() or _gluon_resident(q)):
        return "resident"
    return "repeat"


def _gluon_resident(q: torch.Tensor) -> bool:
    """Whether a resident call's backward would run the Gluon resident kernel, by the knob and the
    block's shape (``bwd_dispatch.resident_gluon_shape_reason``): above Lq = 64 the Triton
    resident kernel is slower than the repeat, and the Gluon one about twice as fast as it
    (BENCHMARKS.md, "broadcast_q (PMA)")."""
    from .gluon.bwd_dispatch import resident_gluon_shape_reason

    return resident_gluon_shape_reason(q.shape[-1], q.shape[0], q.shape[0]) is None


@torch.compiler.assume_constant_result
def _gluon_device(device: torch.device) -> bool:
    """Whether the Gluon kernels run on this device with this configuration: a constant of the
    machine and the environment, so torch.compile evaluates it once instead of tracing it."""
    return cfg.backend() == "auto" and gluon_sm90_reason(device) is None
