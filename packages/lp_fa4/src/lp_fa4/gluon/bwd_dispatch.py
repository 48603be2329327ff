"""Which backward kernel runs a call: the one place that decides, as ``dispatch`` does for the forward.

The Gluon Hopper backward (``bwd_sm90``) takes: bf16/fp16, head dims 64 and 128 (D == Dv),
MHA/GQA/MQA, no mask or a bottom-right causal mask, dense and varlen (dense arrives as varlen),
seqused_q/k, a gradient on the LSE (it only changes delta), a learnable sink (the kernel reads the
forward's LSE, which holds the sink; dsink is computed outside), and ``jagged_attention`` without a
broadcast_q (its max_seqlen_q row cap included), and local and top-left windows (unless
``LP_FA4_BWD_WINDOWS=0``); on an sm_90 GPU with
``LP_FA4_BACKEND=auto`` (the default). Everything else runs the portable Triton backward
(``lp_fa4.triton.launch.bwd``): ``deterministic=True`` (the Gluon kernel adds dQ by fp32 atomics,
so its bits depend on the order), softcap, broadcast_q, other head
dims, fp32, strided tensors, the interpreter; broadcast_q calls that ``lp_fa4.broadcast.plan``s
``resident`` run a query-resident kernel (``triton._bwd_resident``, or ``bwd_resident_sm90`` where
``resident_gluon_why_not`` allows): the interface plans
once per call and the op carries the plan here (``resident``), so an environment changed between
forward and backward cannot split one call over two plans. All compute delta with the same Triton
preprocess.
"""

from __future__ import annotations

import torch

from .. import config as cfg
from ..triton import launch
from ..triton.launch_bwd import preprocess
from .dispatch import _band, _packed, device_reason, score_reason, tile_reason

_DTYPES = (torch.bfloat16, torch.float16)


def why_not(do, q, k, v, pb: launch.Problem, deterministic: bool) -> str | None:
    """None when the Gluon backward takes the call, else the first reason it does not (options
    first, then tensors, then the device, so the reasons are testable on a CPU)."""
    if cfg.backend() != "auto":
        return "LP_FA4_BACKEND=triton"
    if deterministic:
        return "deterministic"
    if (reason := score_reason(pb, windows=cfg.bwd_windows())) is not None:
        return reason
    if q.dtype not in _DTYPES or any(t.dtype != q.dtype for t in (k, do)):
        return f"dtype {q.dtype}"
    if k.shape[-1] != q.shape[-1]:
        return f"head dims {q.shape[-1]}/{k.shape[-1]}"
    if (reason := tile_reason(q.dtype, q.shape[-1], v)) is not None:
        return reason
    if not all(_packed(t) for t in (q, k, v, do)) or do.shape != q.shape:
        return "strided or unaligned tensors"
    return device_reason(q)


def bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb: launch.Problem,
        deterministic: bool, resident: bool = False):  # fmt: skip
    """``lp_fa4.triton.launch.bwd``'s contract: (dq, dk, dv, delta); the Gluon kernel where
    ``why_not`` allows; the query-resident kernel where ``resident`` (the forward's plan, see
    ``lp_fa4.broadcast``) says so. Raises ValueError where ``resident`` names a call that kernel
    does not take (``resident_why_not``)."""
    if resident:
        if (reason := resident_why_not(q, k, v, used_q, pb, deterministic)) is not None:
            raise ValueError(f"lp_fa4: the resident backward does not take this call ({reason})")
        from ..triton.launch_bwd import bwd_resident

        delta = preprocess(out, do, dlse)
        gluon = resident_gluon_why_not(do, q, k, v, pb) is None
        dq, dk, dv = bwd_resident(do, q, k, v, lse, delta, cu_q, cu_k, used_k, pb, gluon=gluon)
        return dq, dk, dv, delta
    if why_not(do, q, k, v, pb, deterministic) is not None:
        return launch.bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb, deterministic)
    from . import bwd_sm90

    delta = preprocess(out, do, dlse)
    band = _band(pb)
    causal = band == "causal"
    window = (pb.win_left, pb.win_right) if band == "window" else None  # unless LP_FA4_BWD_WINDOWS=0
    dq, dk, dv = bwd_sm90.bwd(do, q, k, v, lse, delta, cu_q, cu_k, used_q, used_k, pb.max_q, pb.max_k,
                              pb.caps()[0], pb.scale, causal, window=window,
                              top_left=pb.top_left and window is not None)  # fmt: skip
    return dq, dk, dv, delta


def resident_why_not(q, k, v, used_q, pb: launch.Problem, deterministic: bool) -> str | None:
    """None when the query-resident backward takes the call, else why not: a broadcast_q call with
    none of the options the interface plans only without (softcap, seqused_q) and what
    ``lp_fa4.broadcast.resident_reason`` asks. The op is public, so its ``resident_bwd`` may be set
    by hand on any call; the kernel must not see one it was not built for (GQA would index K/V heads
    past their tensors)."""
    from .. import broadcast

    if not pb.broadcast_q:
        return "not broadcast_q"
    if pb.softcap > 0:
        return "softcap"
    if used_q is not None:
        return "seqused_q"
    return broadcast.resident_reason(q, k, v, (pb.win_left, pb.win_right), deterministic)


def resident_gluon_why_not(do, q, k, v, pb: launch.Problem) -> str | None:
    """None when a resident call (``resident_why_not`` checked) runs the Gluon resident backward
    (``bwd_resident_sm90``) rather than the Triton one, else why not: ``resident_gluon_shape_reason``
    on its computed query rows, the backend, TMA-packed tensors, the device."""
    if (
        reason := resident_gluon_shape_reason(q.shape[-1], q.shape[0], min(q.shape[0], pb.caps()[0]))
    ) is not None:
        return reason
    if cfg.backend() != "auto":
        return "LP_FA4_BACKEND=triton"
    if not all(_packed(t) for t in (q, k, v, do)):
        return "strided or unaligned tensors"
    return device_reason(q)


def resident_gluon_shape_reason(d: int, block: int, rows: int) -> str | None:
    """The part of ``resident_gluon_why_not`` that needs no tensor, so the broadcast_q plan asks it
    too (``broadcast._gluon_resident``): ``LP_FA4_RESIDENT_KERNEL``, under ``auto`` at least
    ``config.RESIDENT_GLUON_MIN_ROWS`` computed rows, the kernel's build (head dim D == Dv ==
    ``HEAD_DIM``, checked equal by ``resident_why_not``; a query block of ``block`` rows, ``rows``
    of them computed, within ``BLOCK_Q``)."""
    from .bwd_resident_sm90 import BLOCK_Q, HEAD_DIM

    mode = cfg.resident_kernel()
    if mode == "triton":
        return "LP_FA4_RESIDENT_KERNEL=triton"
    if mode == "auto" and rows < cfg.RESIDENT_GLUON_MIN_ROWS:
        return f"{rows} query rows (auto takes it from {cfg.RESIDENT_GLUON_MIN_ROWS})"
    if d != HEAD_DIM:
        return f"head dim {d} (built for {HEAD_DIM})"
    if max(block, rows) > BLOCK_Q:
        return f"query block over {BLOCK_Q} rows"
    return None
