"""Softmax attention backward for Hopper (sm_90) in Gluon: dK, dV and (by bulk reductions) dQ in one
warp-specialised pass per 128-key tile: persistent (one program per SM walking every num_SMs-th work
item), or under a window one program per work item (``config.bwd_grid``: started in list order,
a band's neighbouring kv tiles stay in step and share their query tiles in L2).

Partitions of each program, as ads-gdpa's backward:
  - a 1-warp TMA producer: the K and V tile of the work item once, then the 64-row Q and dO tiles
    of every query head of the kv head's group through a ring of shared-memory stages (ready /
    empty mbarrier pairs);
  - two 4-warp consumer warpgroups, each owning 64 of the 128 keys. Per query tile:

        Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, both in flight at once)
        Pᵀ = exp2(Sᵀ·scale·log2e - LSE·log2e), dSᵀ = Pᵀ∘(dPᵀ - delta) (masked on edge tiles only)
        dV += Pᵀ dO (Pᵀ from registers), dK += dSᵀ Q (dSᵀ from shared memory)
        dQ[:, half] = scale · dS K[:, half] over all 128 keys, added into a zeroed fp32 buffer.

    Both warpgroups write their halves of dSᵀ into one shared [128, 64] buffer (double-buffered),
    so each dQ product spans the 128 keys and each warpgroup reduces D/2 columns of dQ: one bulk
    TMA reduce-add (``cp.reduce.async.bulk.tensor``) per warpgroup and step.
delta = rowsum(dO∘O) - dLSE comes from the Triton preprocess kernel (``lp_fa4.triton._bwd``); LSE
and delta are read per query tile from global memory (256 bytes each, L2 resident) by the producer
into a shared-memory slot of the stage, and by the consumers from there right before use: held in
registers across the wgmma issue instead, the two 16-register column vectors made the step loop
spill at D=128 (1.25-2.1x slower on the H200, BENCHMARKS.md).

Semantics (the Triton backward's, ``lp_fa4.triton._bwd``, for the subset ``bwd_dispatch.why_not``
admits): query rows [0, rows) of sequence b count, rows = min(Lq_b, seqused_q[b], row cap); keys
[0, k_len), k_len = min(Lk_b, seqused_k[b], max_seqlen_k). Causal is bottom-right: query i sees
key j iff j <= i + k_len - q_len (q_len the used length); a kv tile skips the query tiles wholly
above the diagonal and masks only the tiles it crosses. Keys past k_len keep dK = dV = 0
(``zero_outside_spans`` zeroes them before the kernel), query rows outside [0, rows) get dQ = 0
(their P is 0: LSE read as +inf).
Work items are (sequence, kv head, kv tile) from ``ads_kernel_tools.kernels.tile_list.schedule``,
heaviest sequence first; under causal an item is a pair of kv tiles, j and T-1-j, of equal total
work (``_kv_tiles``). A window's kv tiles walk their query tiles in phase with each other
(``_q_tile_at``), so that the kv tiles running side by side meet each query tile at the same step;
causal pairs can do the same (``LP_FA4_BWD_CAUSAL_WALK``, opt-in).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ads_kernel_tools.capability import num_sms
from ads_kernel_tools.kernels.gluon_hopper import (
    acc_layout,
    bwd_buffers,
    bwd_grad_step,
    rows_desc,
    split_entry,
    stage_for_tma,
    store_rows,
    tma_reduce_add,
)
from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.launch_cache import LaunchCache
from ads_kernel_tools.kernels.span_fill import zero_unwritten
from ads_kernel_tools.kernels.tile_list import schedule

from .. import config
from ..offsets import dense_schedule, kernel_offsets
from .band import in_band

BLOCK_M = 64  # query rows per step
BLOCK_N = 128  # keys per work item: 64 per consumer warpgroup
STAGES = 2  # Q/dO ring depth (D=128: 64 KB ring + 64 KB K/V + 32 KB dSᵀ + 32 KB dQ staging)
LOG2E = 1.4426950408889634
CONSUMER_REGS = 240
PRODUCER_REGS = 24


@gluon.jit
def _kv_item(t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H_KV, N_TILES, rows_cap, max_k,
             HAS_USED_Q: gl.constexpr, HAS_USED_K: gl.constexpr, TOP_LEFT: gl.constexpr):  # fmt: skip
    """Entry t of the tile list -> (kv head, first kv tile, q start, computed rows, diagonal offset,
    k start, k_len). The diagonal: k_len - used Lq (bottom-right), 0 under TOP_LEFT."""
    b, hk, n_first = split_entry(gl.load(tiles_ptr + t), H_KV, N_TILES)
    q0 = gl.load(cu_q_ptr + b)
    q_len = gl.load(cu_q_ptr + b + 1) - q0
    k0 = gl.load(cu_k_ptr + b)
    k_len = gl.minimum(gl.load(cu_k_ptr + b + 1) - k0, max_k)
    if HAS_USED_Q:
        q_len = gl.minimum(gl.maximum(gl.load(used_q_ptr + b), 0), q_len)
    if HAS_USED_K:
        k_len = gl.minimum(gl.maximum(gl.load(used_k_ptr + b), 0), k_len)
    k_len = gl.maximum(k_len, 0)
    rows = gl.minimum(q_len, rows_cap)
    if TOP_LEFT:
        off = k_len * 0
    else:
        off = k_len - q_len
    return hk, n_first, q0, rows, off, k0, k_len


@gluon.jit
def _kv_tiles(j, k_len, N_TILES, BN: gl.constexpr, PAIRS: gl.constexpr):
    """range(start, stop, step) of the kv tiles of list slot j. PAIRS (causal): slot j holds tiles j
    and T-1-j of the sequence's T, so that every slot of a dense batch does the same work (the
    heavy tile first): lockstep programs keep the few heads they touch in L2. Else tile j (and,
    for a sequence longer than the slots, every N_TILES-th after it)."""
    t = gl.cdiv(k_len, BN)
    if PAIRS:
        return j, t - j, gl.maximum(t - 1 - 2 * j, 1)
    else:
        return j, t, N_TILES


@gluon.jit
def _q_tiles(n, rows, off, band, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
             WINDOW: gl.constexpr):  # fmt: skip
    """Query tiles [lo, hi) that kv tile n meets: under CAUSAL, from the first tile holding a row
    i with i + off >= n·BN (the tile's first key); under WINDOW (``band`` = (win_left, win_right):
    row i sees keys [i + off - win_left, i + off + win_right]) the rows whose band reaches the tile's
    keys [n·BN, n·BN + BN)."""
    lo = n * 0
    hi = gl.cdiv(rows, BM)
    if CAUSAL:
        lo = gl.maximum(n * BN - off, 0) // BM
    elif WINDOW:
        win_left, win_right = band
        lo = gl.maximum(n * BN - off - win_right, 0) // BM
        hi = gl.minimum(hi, gl.cdiv(gl.maximum(n * BN + BN - off + win_left, 0), BM))
    return lo, hi


@gluon.jit
def _q_tile_at(i, lo, hi, down, WALK: gl.constexpr):
    """The query tile a kv tile visits at position i of its walk over [lo, hi), chosen so that the kv
    tiles running side by side (adjacent in the tile list) meet the same query tile at the same
    step: they then read its Q/dO and add into its dQ rows while those lines are in L2, as the kv
    tiles of an unmasked sequence do by walking 0, 1, ... in lockstep.
      WALK 0: in order (i).
      WALK 1 (a band): rotated so that step j meets the tile congruent to j mod (hi - lo); every
        interior kv tile of a band meets the same number of query tiles.
      WALK 2 (causal pairs, ``_kv_tiles``): the slot's first kv tile from hi - 1 down, its second
        up from lo (``down`` from ``_walk_down``). Every range ends at the last query tile, so at
        step s all first tiles meet tile hi - 1 - s; slot j's second tile starts at
        lo2 = (T - 1 - j)·BN / BM after hi - j·BN / BM steps, so (MHA, q_len = k_len) at step s it
        meets (T - 1)·BN / BM + s - hi, the same tile for every slot."""
    m = i
    if WALK == 1:
        cnt = hi - lo
        m = lo + (i - lo + cnt - lo % cnt) % cnt
    elif WALK == 2:
        m = gl.abs(down - i)
    return m


@gluon.jit
def _walk_down(first, lo, hi, WALK: gl.constexpr):
    """WALK 2: what ``_q_tile_at`` takes as ``down``: lo + hi - 1 on the pair's first kv tile (the
    walk |lo + hi - 1 - i| goes down), 0 on the second (|0 - i| = i goes up); 0 otherwise."""
    down = lo * 0
    if WALK == 2:
        down = gl.where(first, lo + hi - 1, 0)
    return down


@gluon.jit
def _producer(args, band, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, HAS_USED_Q: gl.constexpr, HAS_USED_K: gl.constexpr,
              WINDOW: gl.constexpr, TOP_LEFT: gl.constexpr, WALK: gl.constexpr):  # fmt: skip
    """TMA loads: per kv tile its K and V, then Q/dO tiles into the ring (``it`` continues across
    items, as the consumers count it), and each tile's LSE·log2e and delta into the stage's
    ``stat_smem`` slot, by plain loads and stores before the stage's arrival (which releases them to
    the consumers' wait)."""
    (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_ready, qd_empty, kv_ready,
     kv_empty, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, N_TILES, rows_cap,
     max_k, H_KV, G, lse_ptr, delta_ptr, TO, stat_smem) = args  # fmt: skip
    stat_l: gl.constexpr = gl.BlockedLayout([BM // 32], [32], [1], [0])
    r_idx = gl.arange(0, BM, stat_l)
    it = 0
    kc = 0
    for t in range(gl.program_id(0), gl.load(count_ptr), gl.num_programs(0)):
        hk, n_first, q0, rows, off, k0, k_len = _kv_item(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H_KV, N_TILES, rows_cap, max_k,
            HAS_USED_Q, HAS_USED_K, TOP_LEFT,
        )  # fmt: skip
        start, stop, step = _kv_tiles(n_first, k_len, N_TILES, BN, CAUSAL)
        for n in range(start, stop, step):
            lo, hi = _q_tiles(n, rows, off, band, BM, BN, CAUSAL, WINDOW)
            mbarrier.wait(kv_empty, (kc & 1) ^ 1)
            mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [k0 + n * BN, hk * D], kv_ready, k_smem)
            tma.async_copy_global_to_shared(v_desc, [k0 + n * BN, hk * D], kv_ready, v_smem)
            kc += 1
            down = _walk_down(n == start, lo, hi, WALK)
            for g in range(G):
                col = (hk * G + g) * D
                for i in range(lo, hi):
                    m = _q_tile_at(i, lo, hi, down, WALK)
                    s = it % STAGES
                    mbarrier.wait(qd_empty.index(s), ((it // STAGES) & 1) ^ 1)
                    base = (hk * G + g).to(gl.int64) * TO + q0
                    lse2, delta = _row_stats(lse_ptr + base, delta_ptr + base, m * BM + r_idx, rows)
                    stat_smem.index(2 * s).store(lse2)
                    stat_smem.index(2 * s + 1).store(delta)
                    # every lane's stores precede the one elected arrival that releases them
                    gl.thread_barrier()
                    ready = qd_ready.index(s)
                    mbarrier.expect(ready, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(q_desc, [q0 + m * BM, col], ready, q_smem.index(s))
                    tma.async_copy_global_to_shared(do_desc, [q0 + m * BM, col], ready, do_smem.index(s))
                    it += 1


@gluon.jit
def _row_stats(lse_row, delta_row, cq, rows):
    """LSE·log2e (+inf on rows not computed or without keys, so that P = 0 there) and delta of the
    query rows ``cq`` of one tile."""
    ok = cq < rows
    lse = gl.load(lse_row + cq, mask=ok, other=float("inf"))
    lse2 = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    return lse2, gl.load(delta_row + cq, mask=ok, other=0.0)


@gluon.jit
def _consumer(args, band, WG: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_USED_Q: gl.constexpr,
              HAS_USED_K: gl.constexpr, WINDOW: gl.constexpr, TOP_LEFT: gl.constexpr,
              WALK: gl.constexpr):  # fmt: skip
    """Consumer warpgroup WG: keys [WG·64, WG·64 + 64) of every kv tile, dQ columns [WG·D/2, +D/2).
    LSE·log2e and delta of a query tile (16 registers each in the Sᵀ column layout) are read from the
    stage's ``stat_smem`` slot right before use (``_probs``), not held across the wgmma issue."""
    (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
     ds_free, dq_desc, dk_ptr, dv_ptr, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr,
     N_TILES, rows_cap, max_k, H_KV, G, scale, qk_scale2, stat_smem) = args  # fmt: skip
    ROWS: gl.constexpr = BN // 2
    DH: gl.constexpr = D // 2
    kv_layout: gl.constexpr = acc_layout(D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    s_layout: gl.constexpr = acc_layout(BM)
    # the Sᵀ tile's key rows and query columns, zero accumulators, this warpgroup's halves of K and V,
    # its column slice of K for dQ and its dQ staging buffer
    rows2 = gl.expand_dims(gl.arange(0, ROWS, gl.SliceLayout(1, s_layout)), 1)
    cols2 = gl.expand_dims(gl.arange(0, BM, gl.SliceLayout(0, s_layout)), 0)
    s_zero = gl.zeros([ROWS, BM], gl.float32, s_layout)
    dq_zero = gl.zeros([BM, DH], gl.float32, acc_layout(DH))
    k_half = k_smem.slice(WG * ROWS, ROWS, dim=0)
    v_half = v_smem.slice(WG * ROWS, ROWS, dim=0)
    k_cols = k_smem.slice(WG * DH, DH, dim=1)
    dq_s = dq_smem.index(WG)

    it = 0
    kc = 0
    for t in range(gl.program_id(0), gl.load(count_ptr), gl.num_programs(0)):
        hk, n_first, q0, rows, off, k0, k_len = _kv_item(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H_KV, N_TILES, rows_cap, max_k,
            HAS_USED_Q, HAS_USED_K, TOP_LEFT,
        )  # fmt: skip
        start, stop, step = _kv_tiles(n_first, k_len, N_TILES, BN, CAUSAL)
        for n in range(start, stop, step):
            lo, hi = _q_tiles(n, rows, off, band, BM, BN, CAUSAL, WINDOW)
            kv_first = n * BN + WG * ROWS  # first key of this warpgroup inside the sequence
            kv_valid = k_len - kv_first  # keys of this half inside the sequence (may be <= 0)
            mbarrier.wait(kv_ready, kc & 1)
            dk = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, kv_layout))
            dv = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, kv_layout))
            down = _walk_down(n == start, lo, hi, WALK)
            for g in range(G):
                h = hk * G + g
                for i in range(lo, hi):
                    m = _q_tile_at(i, lo, hi, down, WALK)
                    s = it % STAGES
                    db = it % 2
                    dph = (it // 2) & 1
                    mbarrier.wait(qd_ready.index(s), (it // STAGES) & 1)
                    q_s = q_smem.index(s)
                    do_s = do_smem.index(s)
                    st = warpgroup_mma(k_half, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    dpt = warpgroup_mma(v_half, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    pt, dst = _probs(st, dpt, stat_smem, s, m, rows, off, kv_first, kv_valid, qk_scale2,
                                     rows2, cols2, band, BM, ROWS, CAUSAL, WINDOW)  # fmt: skip
                    # dSᵀ halves exchanged through shared memory; dV, dK accumulated; dQ over all 128 keys
                    dv, dk, dq = bwd_grad_step(pt, dst, dv, dk, q_s, do_s, k_cols, ds_smem, db, dph, ds_full,
                                               ds_free, qd_empty.index(s), dq_zero, WG, p_layout)  # fmt: skip
                    # rows past the sequence carry exact zeros (dSᵀ is masked): the whole box may be
                    # added, a neighbouring sequence's rows included
                    stage_for_tma(dq_s, dq * scale)
                    tma_reduce_add(dq_desc, [q0 + m * BM, h * D + WG * DH], dq_s)
                    it += 1
            dk = warpgroup_mma_wait(0, deps=(dk,))
            dv = warpgroup_mma_wait(0, deps=(dv,))
            # every read of this K/V tile (the other half's dQ products included) has retired
            mbarrier.arrive(kv_empty, count=1)
            # this warpgroup's ROWS rows of dK and dV; rows past kv_valid not written
            dk = dk * scale
            row0 = k0 + kv_first
            store_rows(dk_ptr, dk, row0, kv_valid, None, hk * D, H_KV * D, ROWS, D, 4)
            store_rows(dv_ptr, dv, row0, kv_valid, None, hk * D, H_KV * D, ROWS, D, 4)
            kc += 1
    tma.store_wait(0)  # shared memory must outlive the last reduction's read


@gluon.jit
def _probs(st, dpt, stat_smem, s, m, rows, off, kv_first, kv_valid, qk_scale2, rows2, cols2, band,
           BM: gl.constexpr, ROWS: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):  # fmt: skip
    """Pᵀ and dSᵀ of query tile m from the in-flight Sᵀ and dPᵀ (issued in that order, nothing
    after them): exp2 under dPᵀ, then the product; masked on edge tiles only. LSE·log2e and delta
    come from stage s's ``stat_smem`` slot."""
    col_l: gl.constexpr = gl.SliceLayout(0, st.type.tensor_type.layout)
    # Sᵀ retires first (groups complete in order); dPᵀ keeps running under exp2
    st = warpgroup_mma_wait(1, deps=(st,))
    lse2 = stat_smem.index(2 * s).load(col_l)
    pt = gl.exp2(st * qk_scale2 - gl.expand_dims(lse2, 0))
    dpt = warpgroup_mma_wait(0, deps=(dpt,))
    delta = stat_smem.index(2 * s + 1).load(col_l)
    dst = pt * (dpt - gl.expand_dims(delta, 0))
    q_valid = rows - m * BM
    edge = (kv_valid < ROWS) | (q_valid < BM)
    if CAUSAL:
        edge = edge | (kv_first + ROWS - 1 > m * BM + off)
    if WINDOW:
        win_left, win_right = band
        edge = (
            edge
            | (kv_first < m * BM + BM - 1 + off - win_left)
            | (kv_first + ROWS - 1 > m * BM + off + win_right)
        )
    if edge:
        # keys past the sequence (TMA brought a neighbour's rows or zeros), query rows past it, and
        # keys right of the causal diagonal or outside the window's band
        keep = (rows2 < kv_valid) & (cols2 < q_valid)
        if CAUSAL:
            keep = keep & (rows2 + kv_first <= cols2 + m * BM + off)
        if WINDOW:
            keep = keep & in_band(rows2 + ((kv_first - m * BM - off + win_left) - cols2), win_left, win_right)
        pt = gl.where(keep, pt, 0.0)
        dst = gl.where(keep, dst, 0.0)
    return pt, dst


@gluon.jit
def attn_bwd_ws(
    q_desc, do_desc, k_desc, v_desc, dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, TO,
    tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr,
    N_TILES, rows_cap, max_k, H_KV, G, scale, qk_scale2, win_left, win_right,
    D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    HAS_USED_Q: gl.constexpr, HAS_USED_K: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, WINDOW: gl.constexpr = False, TOP_LEFT: gl.constexpr = False,
    WALK: gl.constexpr = 0,
):  # fmt: skip
    (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
     ds_free) = bwd_buffers(q_desc, do_desc, k_desc, v_desc, dq_desc, STAGES)  # fmt: skip
    # per stage: LSE·log2e, delta of its 64 query rows (1 KB at 2 stages)
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    stat_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BM], stat_layout)

    cargs = (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty,
             ds_full, ds_free, dq_desc, dk_ptr, dv_ptr, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr,
             used_q_ptr, used_k_ptr, N_TILES, rows_cap, max_k, H_KV, G, scale, qk_scale2,
             stat_smem)  # fmt: skip
    pargs = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qd_ready, qd_empty, kv_ready,
             kv_empty, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, N_TILES, rows_cap,
             max_k, H_KV, G, lse_ptr, delta_ptr, TO, stat_smem)  # fmt: skip
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    band = (win_left, win_right)
    gl.warp_specialize(
        [
            (_consumer, (cargs, band, WG0, D, BM, BN, STAGES, CAUSAL, HAS_USED_Q, HAS_USED_K, WINDOW,
                         TOP_LEFT, WALK)),
            (_consumer, (cargs, band, WG1, D, BM, BN, STAGES, CAUSAL, HAS_USED_Q, HAS_USED_K, WINDOW,
                         TOP_LEFT, WALK)),
            (_producer, (pargs, band, D, BM, BN, STAGES, CAUSAL, HAS_USED_Q, HAS_USED_K, WINDOW, TOP_LEFT,
                         WALK)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def bwd(do, q, k, v, lse, delta, cu_q, cu_k, used_q, used_k, max_q: int, max_k: int, rows_cap: int,
        scale: float, causal: bool, window: tuple[int, int] | None = None,
        top_left: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) like (q, k, v). q, do (TQ, H, D); k, v (TK, Hkv, D); lse and delta (H, TQ) fp32
    (natural-log LSE of the forward; delta = rowsum(dO∘O) - dLSE). Query rows past
    min(seqused_q, rows_cap, max_q) and keys past min(seqused_k, max_k) contribute nothing; their
    gradients are 0. ``window`` (win_left, win_right), resolved as ``lp_fa4.triton.launch.Problem``'s
    sides (BIG = unbounded), with ``causal`` False: query row i sees keys [i + off - win_left, i +
    off + win_right], off = Lk - Lq, or 0 under ``top_left``. The caller checked
    ``bwd_dispatch.why_not``. No host sync."""
    if window is not None and causal:
        raise ValueError("bwd_sm90.bwd: pass causal as window (BIG, 0), not both")
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    n_b = cu_q.shape[0] - 1
    rows_cap = min(int(rows_cap), int(max_q))
    if n_b <= 0 or h == 0 or rows_cap <= 0 or max_k <= 0 or tq == 0 or tk == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    cu_q, cu_k, lq_dense, lk_dense = kernel_offsets(cu_q, tq, cu_k, tk)
    # the kernel stores the rows of every sequence's used keys (zeros where no query sees them):
    # only the other rows need zeros, none when all keys of a dense K count; small buffers take a
    # plain fill, cheaper than one more launch
    # row-major like the kernel's stores, whatever the layout of k and v (``dispatch._packed``)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    every_key = lk_dense is not None and used_k is None and max_k >= lk_dense
    if not every_key:
        zero_unwritten((dk, dv), cu_k, max_k, used_k)
    dq_acc = torch.zeros((tq, h, d), dtype=torch.float32, device=q.device)
    gdt = _GL[q.dtype]
    BM, BN = BLOCK_M, BLOCK_N
    q_desc, do_desc = rows_desc(q, BM, gdt), rows_desc(do, BM, gdt)
    k_desc, v_desc = rows_desc(k, BN, gdt), rows_desc(v, BN, gdt)
    dq_desc = rows_desc(dq_acc, BM, gl.float32, cols=d // 2)
    slot_keys = 2 * BN if causal else BN  # causal: a slot pairs kv tiles j and T-1-j (``_kv_tiles``)
    n_tiles = cdiv(max_k, slot_keys)
    # a dense batch's list depends on its shapes alone (the list reads no seqused): built once
    build = dense_schedule if lq_dense is not None and lk_dense is not None else schedule
    tiles, count = build(cu_q, cu_k, rows_cap, tile_q=False, block=slot_keys, slots=n_tiles, heads=hkv)
    walk = config.bwd_walk(window is not None, bool(causal))
    # the list's length at most (programs past its count exit at once): a sequence of L keys has
    # cdiv(L, slot_keys) items per kv head, so all have at most cdiv(tk, slot_keys) + n_b; a grid
    # short of the count is still right (each program strides the list), only slower
    n_items = min(n_b * n_tiles, cdiv(tk, slot_keys) + n_b) * hkv
    if config.bwd_grid(window is not None) == "persistent":
        n_items = min(n_items, num_sms(q.device))
    grid = (max(1, n_items),)
    _BWD.launch(grid, (
        q_desc, do_desc, k_desc, v_desc, dq_desc, dk, dv, lse, delta, lse.shape[1], tiles, count, cu_q, cu_k,
        used_q if used_q is not None else cu_q, used_k if used_k is not None else cu_q,
        n_tiles, rows_cap, max_k, hkv, h // hkv, float(scale), float(scale) * LOG2E,
        *(window if window is not None else (0, 0)),
    ), dict(
        D=d, BM=BM, BN=BN, STAGES=STAGES, CAUSAL=bool(causal), HAS_USED_Q=used_q is not None,
        HAS_USED_K=used_k is not None, CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
        WINDOW=window is not None, TOP_LEFT=bool(top_left), WALK=walk,
        num_warps=4,
    ))  # fmt: skip
    return dq_acc.to(q.dtype), dk, dv


# relaunched without Triton's per-call argument binding (host time of small calls)
_BWD = LaunchCache(attn_bwd_ws)
