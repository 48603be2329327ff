"""Host launcher of the Triton backward (preprocess, dK/dV, dQ). No host sync here."""

from __future__ import annotations

import functools

import torch
import triton

from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.launch_cache import LaunchCache
from ads_kernel_tools.kernels.span_fill import zero_unwritten

from .. import config as cfg
from ..offsets import kernel_offsets
from ._bwd import dkdv_kernel, dq_kernel, preprocess_kernel, reduce_chunks_kernel
from ._bwd_resident import bq_resident_bwd_kernel
from .launch import LOG2E, Problem, _allocator, _pad, _tma_ok


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
    delta = preprocess(out, do, dlse)
    if to == 0 or h == 0:
        return dq.to(q.dtype), dk, dv, delta
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
    dkdv_kernel[(n_b * hkv, cdiv(pb.max_k, t1.block_n))](
        q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], hkv, g, pb.scale, *sa,
        DQ_ATOMIC=mode == "atomic", **flags, **t1.launch(),
    )  # fmt: skip
    if mode == "atomic":
        return dq.to(q.dtype), dk, dv, delta
    t2 = cfg.dq_tile(dpad)
    q_tiles = cdiv(pb.max_q, t2.block_m)
    n_chunks, b_chunk, store = 1, max(n_b, 1), 0
    if pb.broadcast_q:
        n_chunks, b_chunk = _batch_chunks(n_b, h * q_tiles, q.numel(), q.device)
        store = 0 if n_chunks == 1 else (2 if deterministic else 1)
    if store == 1:
        dq_buf = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    elif store == 2:
        dq_buf = torch.zeros((n_chunks, *q.shape), dtype=torch.float32, device=q.device)
    else:
        dq_buf = dq
    progs = h * n_chunks if pb.broadcast_q else n_b * h
    dq_kernel[(progs, q_tiles)](
        q, k, v, do, lse, delta, dq_buf, cu_q, cu_k, uq, uk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), q.numel(),
        q.shape[0], k.shape[0], to, pb.max_k, pb.caps()[0], n_b, h, g, pb.scale, b_chunk, *sa,
        DQ_STORE=store, **flags, **t2.launch(),
    )  # fmt: skip
    if store == 1:
        return dq_buf.to(q.dtype), dk, dv, delta
    if store == 2:
        n = q.numel()
        red = 256 if cfg.interpreter_active() else 1024
        reduce_chunks_kernel[(cdiv(n, red),)](dq_buf, dq, n, n_chunks, BLOCK=red)
    return dq, dk, dv, delta


def bwd_resident(do, q, k, v, lse, delta, cu_q, cu_k, used_k, pb: Problem, gluon: bool = False):
    """(dq, dk, dv) of a broadcast_q call by the query-resident kernel (``_bwd_resident``, or with
    ``gluon`` its Hopper counterpart ``lp_fa4.gluon.bwd_resident_sm90``, same buffers and offsets): q
    (TQ, H, D) holding the one query block at rows [cu_q[0], cu_q[1]), do (B·Lq, H, D), k/v (TK, H, D)
    (MHA), lse and delta (H, B·Lq) fp32. The caller checked ``gluon.bwd_dispatch.resident_why_not``
    (and ``resident_gluon_why_not`` for ``gluon``). No host sync."""
    tq, h, d = q.shape
    tk = k.shape[0]
    n_b = cu_k.shape[0] - 1
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    rows_cap = pb.caps()[0]
    if n_b <= 0 or h == 0 or tq == 0 or rows_cap <= 0 or pb.max_k <= 0 or tk == 0 or do.shape[0] == 0:
        return dq.to(q.dtype), dk.zero_(), dv.zero_()
    # the fill's spans must be the kernel's and lie inside k: both take these offsets, a dense
    # batch's own as built, any others clamped (the kernel clamps the query block's itself)
    cu_k = kernel_offsets(None, 0, cu_k, tk)[1]
    # the kernel stores every row of each sequence's computed keys; only the rest needs zeros
    zero_unwritten((dk, dv), cu_k, pb.max_k, lambda: _stored_keys(cu_q, cu_k, used_k, tq))
    # sequences longest first: program order is roughly the order the GPU starts them in
    order = torch.argsort(cu_k[1:] - cu_k[:-1], descending=True).to(torch.int32)
    if gluon:
        from ..gluon import bwd_resident_sm90

        bwd_resident_sm90.launch(do, q, k, v, lse, delta, dq, dk, dv, cu_q, cu_k, used_k, order, rows_cap,
                                 pb.max_k, pb.scale)  # fmt: skip
        return dq.to(q.dtype), dk, dv
    block_m = max(16, triton.next_power_of_2(min(tq, rows_cap)))
    block_n, warps, stages = cfg.resident_tile(block_m)
    bq_resident_bwd_kernel[(n_b, h)](
        q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, used_k if used_k is not None else cu_k, order,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), tq, tk, lse.shape[1], pb.max_k, min(rows_cap, block_m),
        pb.scale, pb.scale * LOG2E,
        D=d, BLOCK_D=_pad(d), BLOCK_M=block_m, BLOCK_N=block_n, HAS_USED_K=used_k is not None,
        NUM_STAGES=stages, num_warps=warps,
    )  # fmt: skip
    return dq.to(q.dtype), dk, dv


def _stored_keys(cu_q, cu_k, used_k, tq: int) -> torch.Tensor:
    """(B,) keys per sequence whose dK/dV rows the resident kernels store: ``used_k`` (or the span
    lengths), but none when the query block clamps to no rows (offsets past q or decreasing): the
    kernels then skip every item, so the fill must cover the whole spans. A few small device ops on
    the B counts, no sync; only for the span fill (a whole-buffer fill needs no counts)."""
    q0 = cu_q[0].clamp(0, tq)
    q1 = torch.maximum(cu_q[1].clamp(max=tq), q0)
    keys = used_k if used_k is not None else cu_k[1:] - cu_k[:-1]
    return torch.where(q1 > q0, keys, torch.zeros_like(keys))


def preprocess(out, do, dlse):
    """delta (H, TO) fp32 = rowsum(dO∘O) - dLSE (dLSE (H, TO) or None): the backward's row term, for
    every backward kernel (the Triton one here and ``lp_fa4.gluon.bwd_sm90``)."""
    to, h, dv_dim = out.shape
    delta = torch.empty((h, to), dtype=torch.float32, device=out.device)
    if to == 0 or h == 0:
        return delta.zero_()
    pre_m = 16 if cfg.interpreter_active() else 64
    _PREPROCESS.launch(
        (cdiv(to, pre_m), h),
        (out, do, dlse if dlse is not None else delta, delta, out.stride(0), out.stride(1),
         do.stride(0), do.stride(1), to, h),
        dict(D_V=dv_dim, BLOCK_DV=_pad(dv_dim), BLOCK_M=pre_m, HAS_DLSE=dlse is not None),
    )  # fmt: skip
    return delta


# every backward runs it: relaunched without Triton's per-call argument binding
_PREPROCESS = LaunchCache(preprocess_kernel)


def _batch_chunks(n_b: int, base_progs: int, q_elems: int, device) -> tuple[int, int]:
    """(chunks, sequences per chunk) for the broadcast_q dQ pass: enough programs for about two waves
    of the GPU (``base_progs`` = heads x query tiles per chunk), the fp32 partials capped at 256 MiB.
    The split depends only on shapes, so the deterministic sum is the same every call."""
    if n_b <= 1:
        return 1, max(n_b, 1)
    if cfg.interpreter_active():
        want = cdiv(n_b, 2)  # two sequences a chunk: small tests cross several chunks
    else:
        want = cdiv(2 * _sm_count(device), max(base_progs, 1))
    want = min(want, max(1, (256 << 20) // max(4 * q_elems, 1)))
    b_chunk = cdiv(n_b, max(1, min(want, n_b)))
    return cdiv(n_b, b_chunk), b_chunk


@functools.cache
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 8
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())
