"""broadcast_q (PMA) backward for Hopper (sm_90) in Gluon with the query block resident: the Gluon
counterpart of ``lp_fa4.triton._bwd_resident`` for query blocks of 65-128 rows at D = 128.

Why a second resident kernel: at Lq = 128 the Triton one runs its five GEMMs through ``tl.dot`` with
the dQ accumulator, the step's fp32 tiles and the K/V ring competing for registers (its best tile
stayed below the Gluon backward on repeated queries), while the repeated run pays, per 128 keys,
K/V loads not overlapped with compute, a dK/dV epilogue after only two 64-row query steps and a dQ
reduction into B·Lq fp32 rows that the repeat's backward then sums over the batch.

One persistent program walks (sequence, head) items, longest sequences first. Partitions:
  - a 1-warp TMA producer: per item the 128-row Q block and the sequence's dO rows (one buffer each,
    released by both consumers at the item's end) and the sequence's K/V tiles of 64 keys through a
    ring of ``STAGES`` slots that runs on across items (an item's first tiles load before its Q/dO,
    while the consumers finish the previous item);
  - two 4-warp consumer warpgroups, warpgroup w owning query rows [64w, 64w + 64). Per key tile:

        S = Q Kᵀ, dP = dO Vᵀ (wgmma, both in flight)          [64 q, 64 keys] each
        P = exp2(S·scale·log2e - LSE·log2e), dS = P∘(dP - delta) (keys past the sequence masked)
        dQ += dS K (dS from registers; the accumulator stays in registers across the item and the
        program's following items of the same head)
        P, dS rows written to shared [128 q, 64 keys] buffers; once both halves are in:
        dV[:, w half] = Pᵀ dO[:, w half], dK[:, w half] = dSᵀ Q[:, w half] (both over the 128 rows)

    and the tile's dK/dV columns are stored; when the program's next item has another head (or it has
    none) dQ·scale is added (fp32 atomics) into the batch's one dQ, so dQ needs no sum over the batch
    afterwards.

Semantics are ``_bwd_resident``'s (``lp_fa4.triton._common.seq_extent`` with broadcast_q): the query
block is rows [cu_q[0], cu_q[1]) of q (clamped), the first ``rows`` (max_seqlen_q cap) computed; its
output rows for sequence b start at b·Lq; keys [k0, k0 + k_len), k_len capped at max_seqlen_k and
seqused_k. Query rows past ``rows`` or without keys carry LSE +inf (P = 0), and their Q and dO rows
are zeroed in shared memory, so another sequence's non-finite dO cannot reach this one's dK/dV; rows
past the tensors arrive as TMA zeros and other sequences' keys are masked, so nothing outside the
tensors is read or written. MHA only: a program's dK/dV rows are complete.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ads_kernel_tools.capability import num_sms
from ads_kernel_tools.kernels.gluon_hopper import (
    acc_layout,
    coalesced_rows_layout,
    init_ring,
    rows_desc,
    store_rows,
)
from ads_kernel_tools.kernels.launch_cache import LaunchCache

BLOCK_Q = 128  # query rows held: 64 per consumer warpgroup
BLOCK_N = 64  # keys per step
HEAD_DIM = 128  # the one head dim built (shared memory: Q, dO 64 KB, K/V ring 96 KB, P/dS 32 KB)
STAGES = 3
LOG2E = 1.4426950408889634
CONSUMER_REGS = 240
PRODUCER_REGS = 24


@gluon.jit
def _item(t, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, H, TQ, TK, max_k, rows_cap,
          HAS_USED_K: gl.constexpr):  # fmt: skip
    """Item t -> (head, q0, rows, o0, k0, k_len): sequence ``order[t // H]`` (longest first), head
    t % H; the bounds of ``seq_extent`` under broadcast_q, offsets clamped into the tensors."""
    b = gl.load(order_ptr + t // H)
    h = t % H
    q0 = gl.minimum(gl.maximum(gl.load(cu_q_ptr), 0), TQ)
    q1 = gl.minimum(gl.maximum(gl.load(cu_q_ptr + 1), q0), TQ)
    slot_q = q1 - q0
    rows = gl.minimum(slot_q, rows_cap)
    o0 = slot_q.to(gl.int64) * b
    k0 = gl.minimum(gl.maximum(gl.load(cu_k_ptr + b), 0), TK)
    k1 = gl.minimum(gl.maximum(gl.load(cu_k_ptr + b + 1), k0), TK)
    k_len = gl.minimum(k1 - k0, max_k)
    if HAS_USED_K:
        k_len = gl.minimum(gl.maximum(gl.load(used_k_ptr + b), 0), k_len)
    return h, q0, rows, o0, k0, k_len


@gluon.jit
def _load_kv(it, n, k0, h, k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, D: gl.constexpr,
             BN: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Key tile n of the item into ring slot it % STAGES once both consumers freed it."""
    s = it % STAGES
    mbarrier.wait(kv_empty.index(s), ((it // STAGES) & 1) ^ 1)
    ready = kv_ready.index(s)
    mbarrier.expect(ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k0 + n * BN, h * D], ready, k_smem.index(s))
    tma.async_copy_global_to_shared(v_desc, [k0 + n * BN, h * D], ready, v_smem.index(s))


@gluon.jit
def _producer(args, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, HAS_USED_K: gl.constexpr):
    """TMA loads per item: its first key tiles (as many as the ring holds: their slots free up while
    the consumers finish the previous item), then Q and dO once both consumers released the previous
    item's, then the rest of its key tiles (``it`` counts tiles across items, as the consumers do)."""
    (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_ready, qd_empty, kv_ready,
     kv_empty, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, n_items, H, TQ, TK, max_k,
     rows_cap) = args  # fmt: skip
    it = 0
    ic = 0
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        h, q0, rows, o0, k0, k_len = _item(t, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, H, TQ, TK, max_k,
                                           rows_cap, HAS_USED_K)  # fmt: skip
        if (k_len > 0) & (rows > 0):
            n_tiles = gl.cdiv(k_len, BN)
            early = gl.minimum(n_tiles, STAGES)
            for n in range(0, early):
                _load_kv(it, n, k0, h, k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, D, BN, STAGES)
                it += 1
            mbarrier.wait(qd_empty, (ic & 1) ^ 1)
            mbarrier.expect(qd_ready, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q0, h * D], qd_ready, q_smem)
            tma.async_copy_global_to_shared(do_desc, [o0.to(gl.int32), h * D], qd_ready, do_smem)
            ic += 1
            for n in range(early, n_tiles):
                _load_kv(it, n, k0, h, k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, D, BN, STAGES)
                it += 1


@gluon.jit
def _zero_rows_from(buf, first, ROWS: gl.constexpr, D: gl.constexpr):
    """Zero rows [first, ROWS) of the shared [ROWS, D] tile ``buf``."""
    layout: gl.constexpr = coalesced_rows_layout(D, 4)
    r = gl.expand_dims(gl.arange(0, ROWS, gl.SliceLayout(1, layout)), 1)
    x = buf.load(layout)
    buf.store(gl.where(r < first, x, gl.zeros_like(x)))


@gluon.jit
def _consumer(args, WG: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              HAS_USED_K: gl.constexpr):  # fmt: skip
    """Consumer warpgroup WG: query rows [WG·64, WG·64 + 64) of every item, dK/dV columns
    [WG·D/2, WG·D/2 + D/2) of every key tile."""
    (q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, qd_ready, qd_empty, kv_ready, kv_empty, pds_full,
     pds_free, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, TO, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr,
     n_items, H, TQ, TK, max_k, rows_cap, scale, qk_scale2) = args  # fmt: skip
    ROWS: gl.constexpr = 64
    DH: gl.constexpr = D // 2
    s_layout: gl.constexpr = acc_layout(BN)
    q_layout: gl.constexpr = acc_layout(D)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=q_layout, k_width=2)
    r_idx = gl.arange(0, ROWS, gl.SliceLayout(1, s_layout)) + WG * ROWS
    cols2 = gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, s_layout)), 0)
    s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
    h_zero = gl.zeros([BN, DH], gl.float32, acc_layout(DH))
    q_rows = q_smem.slice(WG * ROWS, ROWS, dim=0)
    do_rows = do_smem.slice(WG * ROWS, ROWS, dim=0)
    q_cols = q_smem.slice(WG * DH, DH, dim=1)
    do_cols = do_smem.slice(WG * DH, DH, dim=1)
    p_half = p_smem.slice(WG * ROWS, ROWS, dim=0)
    ds_half = ds_smem.slice(WG * ROWS, ROWS, dim=0)
    dq_r = gl.expand_dims(gl.arange(0, ROWS, gl.SliceLayout(1, q_layout)) + WG * ROWS, 1)
    dq_c = gl.expand_dims(gl.arange(0, D, gl.SliceLayout(0, q_layout)), 0)

    it = 0
    ic = 0
    step = gl.num_programs(0)
    dq = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, q_layout))
    dq_held = 0  # 1 once an item with keys added into dq since the last flush
    for t in range(gl.program_id(0), n_items, step):
        h, q0, rows, o0, k0, k_len = _item(t, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, H, TQ, TK, max_k,
                                           rows_cap, HAS_USED_K)  # fmt: skip
        if (k_len > 0) & (rows > 0):
            # this warpgroup's rows' LSE·log2e (+inf where not computed or without mass: P = 0) and delta
            ok = r_idx < rows
            stat = h.to(gl.int64) * TO + o0 + r_idx
            lse = gl.load(lse_ptr + stat, mask=ok, other=float("inf"))
            lse2 = gl.expand_dims(gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634), 1)
            delta = gl.expand_dims(gl.load(delta_ptr + stat, mask=ok, other=0.0), 1)
            mbarrier.wait(qd_ready, ic & 1)
            if rows < (WG + 1) * ROWS:
                # The 128-row boxes reach past the block: into the next sequence's dO rows and into
                # q rows past the max_seqlen_q cap. P and dS are 0 there, but as raw GEMM operands
                # (dV = Pᵀ dO, dK = dSᵀ Q, S = Q Kᵀ) a non-finite value would give 0·inf = NaN in
                # this sequence's dK/dV. The other warpgroup reads these rows only after pds_full.
                _zero_rows_from(q_rows, rows - WG * ROWS, ROWS, D)
                _zero_rows_from(do_rows, rows - WG * ROWS, ROWS, D)
                fence_async_shared()
                gl.thread_barrier()
            for n in range(0, gl.cdiv(k_len, BN)):
                s = it % STAGES
                mbarrier.wait(kv_ready.index(s), (it // STAGES) & 1)
                k_s = k_smem.index(s)
                sc = warpgroup_mma(q_rows, k_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                dp = warpgroup_mma(do_rows, v_smem.index(s).permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)  # fmt: skip
                # S retires first (groups complete in order); dP keeps running under exp2
                sc = warpgroup_mma_wait(1, deps=(sc,))
                p = gl.exp2(sc * qk_scale2 - lse2)
                dp = warpgroup_mma_wait(0, deps=(dp,))
                ds = p * (dp - delta)
                kv_valid = k_len - n * BN
                if kv_valid < BN:
                    # keys past the sequence: TMA brought the next sequence's rows or zeros
                    keep = cols2 < kv_valid
                    p = gl.where(keep, p, 0.0)
                    ds = gl.where(keep, ds, 0.0)
                ds16 = ds.to(q_smem.dtype)
                # both warpgroups' P and dS rows meet in shared memory for dV and dK over all 128 rows
                mbarrier.wait(pds_free, (it & 1) ^ 1)
                p_half.store(p.to(q_smem.dtype))
                ds_half.store(ds16)
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(pds_full, count=1)
                dq = warpgroup_mma(gl.convert_layout(ds16, ds_layout), k_s, dq, is_async=True)
                mbarrier.wait(pds_full, it & 1)
                dv = warpgroup_mma(p_smem.permute((1, 0)), do_cols, h_zero, use_acc=False, is_async=True)
                dk = warpgroup_mma(ds_smem.permute((1, 0)), q_cols, h_zero, use_acc=False, is_async=True)
                dq, dv, dk = warpgroup_mma_wait(0, deps=(dq, dv, dk))
                dq = warpgroup_mma_init(dq)
                mbarrier.arrive(kv_empty.index(s), count=1)
                mbarrier.arrive(pds_free, count=1)
                row0 = k0 + n * BN
                col0 = h * D + WG * DH
                store_rows(dk_ptr, dk * scale, row0, kv_valid, None, col0, H * D, BN, DH, 4)
                store_rows(dv_ptr, dv, row0, kv_valid, None, col0, H * D, BN, DH, 4)
                it += 1
            # every read of this item's Q and dO has retired (each step waits for all its wgmma)
            mbarrier.arrive(qd_empty, count=1)
            ic += 1
            dq_held = 1
        # Every item of a head adds into the same dQ rows (the one query block), so the sum runs on
        # in registers while the program's next item has this head (always, when the grid is a
        # multiple of H): one atomic flush per head change instead of one per item, none after items
        # without keys.
        if (dq_held != 0) & (((t + step) >= n_items) | ((t + step) % H != h)):
            dq_sum = warpgroup_mma_wait(0, deps=(dq,))
            offs = (q0 + dq_r).to(gl.int64) * (H * D) + h * D + dq_c
            gl.atomic_add(dq_ptr + offs, dq_sum * scale, mask=(dq_r < rows) & (dq_c < D), sem="relaxed")
            dq = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, q_layout))
            dq_held = 0


@gluon.jit
def bq_resident_bwd_ws(
    q_desc, do_desc, k_desc, v_desc, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, TO,
    order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, n_items, H, TQ, TK, max_k, rows_cap, scale, qk_scale2,
    D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, HAS_USED_K: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    BQ: gl.constexpr = q_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(dtype, [BQ, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [BQ, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BQ, BN], dtype)
    p_smem = gl.allocate_shared_memory(dtype, [BQ, BN], pds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BQ, BN], pds_layout)
    qd_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qd_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pds_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(qd_ready, count=1)
    mbarrier.init(qd_empty, count=2)
    init_ring(kv_ready, kv_empty, STAGES, 2)
    mbarrier.init(pds_full, count=2)
    mbarrier.init(pds_free, count=2)

    cargs = (q_smem, do_smem, k_smem, v_smem, p_smem, ds_smem, qd_ready, qd_empty, kv_ready, kv_empty,
             pds_full, pds_free, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, TO, order_ptr, cu_q_ptr,
             cu_k_ptr, used_k_ptr, n_items, H, TQ, TK, max_k, rows_cap, scale, qk_scale2)  # fmt: skip
    pargs = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_ready, qd_empty, kv_ready,
             kv_empty, order_ptr, cu_q_ptr, cu_k_ptr, used_k_ptr, n_items, H, TQ, TK, max_k,
             rows_cap)  # fmt: skip
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize(
        [
            (_consumer, (cargs, WG0, D, BN, STAGES, HAS_USED_K)),
            (_consumer, (cargs, WG1, D, BN, STAGES, HAS_USED_K)),
            (_producer, (pargs, D, BN, STAGES, HAS_USED_K)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def launch(do, q, k, v, lse, delta, dq, dk, dv, cu_q, cu_k, used_k, order, rows_cap: int, max_k: int,
           scale: float) -> None:  # fmt: skip
    """Run the kernel into ``dq`` (fp32, zeroed, like q), ``dk``/``dv`` (rows of keys outside every
    computed span already zero): ``launch_bwd.bwd_resident``'s buffers and offsets (cu_k clamped,
    ``order`` the sequences longest first), ``bwd_dispatch.resident_gluon_why_not`` checked. No host sync."""
    tq, h, d = q.shape
    n_items = order.shape[0] * h
    gdt = _GL[q.dtype]
    q_desc, do_desc = rows_desc(q, BLOCK_Q, gdt), rows_desc(do, BLOCK_Q, gdt)
    k_desc, v_desc = rows_desc(k, BLOCK_N, gdt), rows_desc(v, BLOCK_N, gdt)
    grid = (max(1, min(n_items, num_sms(q.device))),)
    _RESIDENT.launch(grid, (
        q_desc, do_desc, k_desc, v_desc, dq, dk, dv, lse, delta, lse.shape[1],
        order, cu_q, cu_k, used_k if used_k is not None else cu_k, n_items, h, tq, k.shape[0], max_k,
        min(rows_cap, BLOCK_Q), float(scale), float(scale) * LOG2E,
    ), dict(
        D=d, BN=BLOCK_N, STAGES=STAGES, HAS_USED_K=used_k is not None, CONSUMER_REGS=CONSUMER_REGS,
        PRODUCER_REGS=PRODUCER_REGS, num_warps=4,
    ))  # fmt: skip


# relaunched without Triton's per-call argument binding (host time of small calls)
_RESIDENT = LaunchCache(bq_resident_bwd_ws)
