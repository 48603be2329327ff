"""Host launcher of the Triton backward (preprocess, dK/dV, dQ). No host sync here."""

from __future__ import annotations

import torch
import triton

from .. import config as cfg
from ._bwd import dkdv_kernel, dq_kernel, preprocess_kernel
from .launch import Problem, _allocator, _pad, _tma_ok


def bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb: Problem, deterministic: bool):
    """(dq, dk, dv) like (q, k, v) and delta (H, TO) fp32. lse/dlse are (H, TO) here."""
    n_b = cu_k.shape[0] - 1
    h, hkv, d, dv_dim = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    g = h // hkv
    to = out.shape[0]
    # rows outside every sequence (offsets need not span the tensors) keep zero gradients
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    mode = cfg.dq_mode(deterministic)
    dq = torch.zeros(q.shape, dtype=torch.float32 if mode == "atomic" else q.dtype, device=q.device)
    delta = torch.empty((h, to), dtype=torch.float32, device=q.device)
    if to == 0 or h == 0:
        return dq.to(q.dtype), dk, dv, delta.zero_()
    pre_m = 16 if cfg.interpreter_active() else 64
    preprocess_kernel[(triton.cdiv(to, pre_m), h)](
        out, do, dlse if dlse is not None else delta, delta, out.stride(0), out.stride(1),
        do.stride(0), do.stride(1), to, h, D_V=dv_dim, BLOCK_DV=_pad(dv_dim), BLOCK_M=pre_m,
        HAS_DLSE=dlse is not None,
    )  # fmt: skip
    if n_b <= 0 or pb.max_q <= 0 or pb.max_k <= 0 or q.shape[0] == 0 or k.shape[0] == 0:
        return dq.to(q.dtype), dk, dv, delta
    dummy = cu_q
    uq = used_q if used_q is not None else dummy
    uk = used_k if used_k is not None else dummy
    sa = pb.score_args()
    flags = dict(
        D_QK=d, D_V=dv_dim, BLOCK_D=_pad(d), BLOCK_DV=_pad(dv_dim), HAS_USED_Q=used_q is not None,
        HAS_USED_K=used_k is not None, SOFTCAP=pb.softcap > 0, TOP_LEFT=pb.top_left,
        BROADCAST_Q=pb.broadcast_q,
    )  # fmt: skip
    dpad = max(_pad(d), _pad(dv_dim))
    use_tma = _tma_ok(q, k, v, do)
    _allocator(use_tma)
    flags["USE_TMA"] = use_tma
    t1 = cfg.dkdv_tile(dpad)
    dkdv_kernel[(n_b * hkv, triton.cdiv(pb.max_k, t1.block_n))](
        q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], hkv, g, pb.scale, *sa,
        DQ_ATOMIC=mode == "atomic", **flags, **t1.launch(),
    )  # fmt: skip
    if mode == "atomic":
        return dq.to(q.dtype), dk, dv, delta
    t2 = cfg.dq_tile(dpad)
    progs = h if pb.broadcast_q else n_b * h
    dq_kernel[(progs, triton.cdiv(pb.max_q, t2.block_m))](
        q, k, v, do, lse, delta, dq, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
        q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], n_b, h, g, pb.scale, *sa, **flags, **t2.launch(),
    )  # fmt: skip
    return dq, dk, dv, delta
