"""Gluon (triton.experimental.gluon) GDPA kernels for Hopper: ``fwd_sm90`` and ``bwd_sm90``.

Importing this package never fails on a machine without a GPU or without Gluon: the kernel module
is loaded lazily and ``supports`` answers False whenever the fast path cannot run. Whether it is used
at all is the dispatcher's choice (``ADS_GDPA_BACKEND``, see ``ads_gdpa.config``).
"""

from __future__ import annotations

import os

__all__ = ["supports", "supports_backward", "available", "try_backward"]

# Activation ids (spec §1.4) that the kernel implements and that passed the GPU tests.
_IMPLEMENTED = frozenset({0, 1, 2, 3, 4, 5, 7, 8, 9, 10})

_AVAILABLE: bool | None = None


def available() -> bool:
    """True when Gluon imports and a compute-capability 9.x CUDA device is present."""
    global _AVAILABLE
    if _AVAILABLE is None:
        ok = False
        try:
            import torch

            if (
                torch.cuda.is_available()
                and os.environ.get("TRITON_INTERPRET", "0") != "1"
                and torch.cuda.get_device_capability()[0] == 9
            ):
                from . import fwd_sm90  # noqa: F401  (import errors mean no Gluon path)

                ok = True
        except Exception:
            ok = False
        _AVAILABLE = ok
    return _AVAILABLE


def supports(q, k, v, *, activation_id: int, window: bool, broadcast_q: bool, fp8: bool) -> bool:
    """Whether ``fwd_sm90.gdpa_fwd_gluon`` should run this forward call."""
    if activation_id not in _IMPLEMENTED or window or broadcast_q or fp8:
        return False
    try:
        import torch

        if not (q.is_cuda and k.is_cuda and v.is_cuda):
            return False
        if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
            return False
        if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
            return False
        d = q.shape[2]
        if d not in (64, 128) or k.shape[2] != d or q.shape[1] % k.shape[1] != 0:
            return False
    except Exception:
        return False
    return available()


def supports_backward(do, q, k, v, *, activation_id: int) -> bool:
    """Whether ``bwd_sm90.gdpa_bwd_gluon`` can run this backward; the caller has ruled out windows,
    broadcast_q, per-head activations and the deterministic mode. Cheap: ask before allocating."""
    if not supports(q, k, v, activation_id=activation_id, window=False, broadcast_q=False, fp8=False):
        return False
    return do.shape == q.shape and do.dtype == q.dtype


def try_backward(
    do, q, k, v, cu_q, cu_k, max_q: int, max_k: int, act: int, scale: float, dq_acc, dk, dv
) -> bool:
    """Run ``bwd_sm90.gdpa_bwd_gluon`` into the given buffers when it supports the call (see
    ``supports_backward``); False otherwise."""
    if not supports_backward(do, q, k, v, activation_id=act) or dq_acc.shape != q.shape:
        return False
    from . import bwd_sm90

    bwd_sm90.gdpa_bwd_gluon(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq_acc, dk, dv)
    return True
