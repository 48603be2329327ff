"""GDPA forward for Hopper (sm_90) in the CuTe DSL: O = scale·act(Q Kᵀ)·V over jagged batches.

Per 128-row query tile of one head, one CTA of three warpgroups:

* warp 0 (producer): the Q tile, then K and V of every 128-key step through two rings of
  shared-memory stages (TMA, mbarrier pipelines);
* warpgroups 1 and 2 (consumers), 64 query rows each, per key step j: S_j = Q K_jᵀ and
  O += P_{j-1} V_{j-1} issued together, S_j waited for alone, then act(S_j) in S's fp32 registers,
  converted into the register A operand P_j. FA3 runs that activation while P_{j-1}·V_{j-1} is in
  flight; as written, ptxas waits for P·V first (here, in the Gluon forward and in FA4's sm_90
  forward, BENCHMARKS.md). The ``OVERLAP`` build keeps FA3's order in SASS (``GdpaFwdSm90``) and
  measured slower than the default, which leaves the wait where ptxas puts it. With ``PINGPONG``
  the two warpgroups also take turns issuing their GEMMs (named barriers), so one warpgroup's activation
  runs under the other's GEMMs. Each warpgroup's 64 x D output box leaves through shared memory,
  by a TMA store when all its rows are inside the sequence.

Persistent CTAs walk the device-built query-tile list heaviest-first (``kernels.tile_list``), as the
Gluon forward does. Rows of a sequence at or beyond min(Lq_b, max_seqlen_q) are written as zeros; no
row outside [cu_seqlens_q[b], cu_seqlens_q[b+1]) is written. Keys past a sequence's end are masked
to a score of 0 before the activation (act(0) = 0 for every activation here).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.nvgpu.warp import StMatrix8x8x16bOp
from cutlass.memory import SmemAllocator

from ads_kernel_tools.capability import num_sms as sm_count
from ads_kernel_tools.kernels.tile_list import schedule

from .. import config as cfg
from ..activations import DEFERRED_GAIN
from . import kernel_cache
from ._act import act_and_grad
from ._sm90 import (
    DTYPES,
    as_operand_a,
    decode_q_tile,
    env_stream,
    fake_rows,
    fake_vec,
    gemm,
    row_major_smem,
    rows,
    stage_tile,
    store_rows_staged,
    swap01,
    tma_ring,
    tma_tiles,
    vec,
    zero_outside,
)

BLOCK_M = 128  # query rows per tile: 64 per consumer warpgroup
BLOCK_N = 128  # keys per step

# named barriers (0 is the CTA-wide one)
_BAR_TURN = 1  # + warpgroup: this warpgroup's turn to issue its GEMMs
_BAR_EPI = 3  # + warpgroup: its output box is staged (or free again), among its own 128 threads
ROWS = BLOCK_M // 2  # query rows per consumer warpgroup


class GdpaFwdSm90:
    """One compiled configuration: dtype, head dim, activation, whether the scale is deferred and
    whether dead halves are skipped (compile-time constants).

    ``deferred`` (bf16 with an activation of ``DEFERRED_GAIN``): P = act(S) / gain without the scale,
    and the output tile takes scale·gain, one multiply per score less; fp16 keeps the scale on every
    score, since P without it could overflow fp16. ``skip_dead`` (``config.skip_dead_halves``, as
    the Gluon forward): a warpgroup whose 64 rows of a tile all lie at or past min(Lq, max_seqlen_q)
    takes its turns and releases its stages without GEMMs or activation (its rows are zeros).

    Class attributes are build switches: ``REGS`` the (producer, consumer) register split or None;
    ``PINGPONG`` the warpgroups' turns for issuing GEMMs; ``KV_STAGES`` the K and V ring depth (None: 2
    at D=128, 4 at D=64, within 227 KB of shared memory with two Q buffers and the output tile);
    ``Q_STAGES`` Q buffers, so one tile's Q loads while the previous tile finishes; ``OVERLAP`` (off by
    default: measured slower, as the same order was in the Gluon forward, BENCHMARKS.md) the activation
    of step j under the warpgroup's own P_{j-1}·V (offline SASS: all 64 of the step's ``MUFU.TANH``
    between the two waits, against 2 without it). ptxas hoists the wait for P·V above the activation
    when the two share a basic block, so the activation sits in a branch that always runs; and since
    ptxas sees P dead once its wgmma is issued, a use of P after the wait that never runs (``_hold``)
    keeps the activation's temporaries out of P's registers, without which ptxas copies S's registers
    aside instead (64 moves a step). ``EPI_TMA``: a warpgroup whose 64 rows all lie inside the sequence
    sends its output box by one TMA store from shared memory, which runs while the warpgroup starts its
    next tile (the Gluon forward's default epilogue); other boxes, and every box without the switch,
    leave as 16-byte row stores.
    """

    REGS: tuple[int, int] | None = (24, 240)
    PINGPONG = True
    KV_STAGES: int | None = None
    Q_STAGES = 2
    OVERLAP = False
    EPI_TMA = True

    def __init__(self, dtype, head_dim: int, act: int, deferred: bool, skip_dead: bool = False):
        self.dtype = dtype
        self.d = head_dim
        self.act = act
        if deferred and act not in DEFERRED_GAIN:
            raise ValueError(f"activation {act} has no deferred form (activations.DEFERRED_GAIN)")
        self.deferred = deferred
        self.skip_dead = skip_dead
        self.bm, self.bn = BLOCK_M, BLOCK_N
        self.kv_stages = self.KV_STAGES or (2 if head_dim == 128 else 4)
        self.buffer_align = 1024

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (Tq, H*D)
        mK: cute.Tensor,  # (Tk, Hkv*D)
        mV: cute.Tensor,
        mO: cute.Tensor,  # (Tq, H*D)
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mTiles: cute.Tensor,
        mCount: cute.Tensor,
        max_seqlen_q: Int32,
        m_tiles: Int32,
        heads: Int32,
        group: Int32,
        scale: Float32,
        n_ctas: Int32,
        stream,
    ):
        bm, bn, d = self.bm, self.bn, self.d
        K_MAJOR, MN_MAJOR = OperandMajorMode.K, OperandMajorMode.MN
        # One copy of a tiled MMA per place that issues it (and one for the output stores' partition):
        # ``gemm``'s ``set`` rebinds the copy inside the branch or loop that calls it, where a later
        # use outside that region cannot see it.
        # S = Q Kᵀ: M = 128 query rows over the two warpgroups, N = the step's keys, both K-major
        mma_qk0, mma_qk = (
            sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, K_MAJOR, K_MAJOR, Float32, (2, 1, 1), (64, bn)
            )
            for _ in range(2)
        )  # fmt: skip
        # O += P V: P from registers, V read N(=D)-major as stored
        mma_pv, mma_pv_last = (
            sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, K_MAJOR, MN_MAJOR, Float32, (2, 1, 1), (64, d),
                warpgroup.OperandSource.RMEM,
            )
            for _ in range(2)
        )  # fmt: skip
        # one warpgroup's 64 x D output box: partitions its fragment (the same registers in either
        # warpgroup) for the stores
        mma_epi = sm90_utils.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            K_MAJOR,
            MN_MAJOR,
            Float32,
            (1, 1, 1),
            (ROWS, d),
            warpgroup.OperandSource.RMEM,
        )

        sQ_layout = row_major_smem(self.dtype, bm, d, self.Q_STAGES)
        sK_layout = row_major_smem(self.dtype, bn, d, self.kv_stages)
        sO_layout = row_major_smem(self.dtype, ROWS, d, 2)  # a box per consumer warpgroup
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (bm, d))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(g2s, mV, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_o, tO = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, cute.slice_(sO_layout, (None, None, 0)), (ROWS, d)
        )
        q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
        kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))

        Align, MemRange = cute.struct.Align, cute.struct.MemRange
        align = self.buffer_align

        @cute.struct
        class Storage:
            bar_q: MemRange[cutlass.Int64, self.Q_STAGES * 2]
            bar_k: MemRange[cutlass.Int64, self.kv_stages * 2]
            bar_v: MemRange[cutlass.Int64, self.kv_stages * 2]
            sQ: Align[MemRange[self.dtype, cute.cosize(sQ_layout)], align]
            sK: Align[MemRange[self.dtype, cute.cosize(sK_layout)], align]
            sV: Align[MemRange[self.dtype, cute.cosize(sK_layout)], align]
            sO: Align[MemRange[self.dtype, cute.cosize(sO_layout)], align]

        mmas = (mma_qk0, mma_qk, mma_pv, mma_pv_last, mma_epi)
        self.kernel(
            tma_q, tQ, tma_k, tK, tma_v, tV, tma_o, tO, mO, mCuQ, mCuK, mTiles, mCount, max_seqlen_q, m_tiles,
            heads, group, scale, mmas, sQ_layout, sK_layout, sO_layout, q_bytes, kv_bytes, Storage,
        ).launch(grid=[n_ctas, 1, 1], block=[384, 1, 1], stream=stream, min_blocks_per_mp=1)  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        tQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        tK: cute.Tensor,
        tma_v: cute.CopyAtom,
        tV: cute.Tensor,
        tma_o: cute.CopyAtom,
        tO: cute.Tensor,
        mO: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mTiles: cute.Tensor,
        mCount: cute.Tensor,
        max_seqlen_q: Int32,
        m_tiles: Int32,
        heads: Int32,
        group: Int32,
        scale: Float32,
        mmas: tuple,  # (first S, S, P·V, last P·V, output partition)
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        q_bytes: cutlass.Constexpr[int],
        kv_bytes: cutlass.Constexpr[int],
        Storage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)

        smem = SmemAllocator()
        st = smem.allocate(Storage)
        pipe_q = tma_ring(st.bar_q, self.Q_STAGES, q_bytes, last=False)
        pipe_k = tma_ring(st.bar_k, self.kv_stages, kv_bytes, last=False)
        pipe_v = tma_ring(st.bar_v, self.kv_stages, kv_bytes, last=True)

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sO = st.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        count = mCount[0]
        n_ctas = cute.arch.grid_dim()[0]
        block = cute.arch.block_idx()[0]

        if warp_idx < 4:
            if const_expr(self.REGS is not None):
                cute.arch.setmaxregister_decrease(self.REGS[0])
            if warp_idx == 0:
                self._load(
                    tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, mCuQ, mCuK, mTiles,
                    count, block, n_ctas, max_seqlen_q, m_tiles, heads, group,
                )  # fmt: skip
        else:
            if const_expr(self.REGS is not None):
                cute.arch.setmaxregister_increase(self.REGS[1])
            self._consume(
                tidx - 128, mmas, tma_o, tO, sQ, sK, sV, sO, pipe_q, pipe_k, pipe_v, mO, mCuQ, mCuK,
                mTiles, count, block, n_ctas, max_seqlen_q, m_tiles, heads, group, scale,
            )  # fmt: skip

    @cute.jit
    def _load(
        self, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, mCuQ, mCuK, mTiles, count,
        block, n_ctas, max_seqlen_q, m_tiles, heads, group,
    ):  # fmt: skip
        bm, bn, d = self.bm, self.bn, self.d
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.Q_STAGES)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        t = block
        while t < count:
            h, m, q0, lq, lq_eff, k0, lk = decode_q_tile(mTiles, mCuQ, mCuK, t, heads, m_tiles, max_seqlen_q)
            n_k = (lk + bn - 1) // bn
            # a tile without keys is all zeros: the consumers skip it without Q (``_consume``)
            if m * bm < lq and n_k > 0:
                hk = h // group
                gQ = cute.local_tile(cute.domain_offset((q0, 0), tQ), (bm, d), (None, h))
                tQs, tQg = tma_tiles(tma_q, sQ, gQ)
                pipe_q.producer_acquire(q_state)
                bar = pipe_q.producer_get_barrier(q_state)
                cute.copy(tma_q, tQg[None, m], tQs[None, q_state.index], tma_bar_ptr=bar)
                q_state.advance()
                gK = cute.local_tile(cute.domain_offset((k0, 0), tK), (bn, d), (None, hk))
                gV = cute.local_tile(cute.domain_offset((k0, 0), tV), (bn, d), (None, hk))
                tKs, tKg = tma_tiles(tma_k, sK, gK)
                tVs, tVg = tma_tiles(tma_v, sV, gV)
                for j in cutlass.range(n_k, unroll=1):
                    pipe_k.producer_acquire(k_state)
                    bar = pipe_k.producer_get_barrier(k_state)
                    cute.copy(tma_k, tKg[None, j], tKs[None, k_state.index], tma_bar_ptr=bar)
                    k_state.advance()
                    pipe_v.producer_acquire(v_state)
                    bar = pipe_v.producer_get_barrier(v_state)
                    cute.copy(tma_v, tVg[None, j], tVs[None, v_state.index], tma_bar_ptr=bar)
                    v_state.advance()
            t += n_ctas

    @cute.jit
    def _turn_take(self, wg):
        """Wait for this warpgroup's turn to issue GEMMs (``PINGPONG``)."""
        if const_expr(self.PINGPONG):
            cute.arch.barrier(barrier_id=_BAR_TURN + wg, number_of_threads=256)

    @cute.jit
    def _turn_pass(self, wg):
        """Hand the turn to the other warpgroup (``PINGPONG``)."""
        if const_expr(self.PINGPONG):
            cute.arch.barrier_arrive(barrier_id=_BAR_TURN + 1 - wg, number_of_threads=256)

    @cute.jit
    def _activate(self, acc_s, tScS, keys_left, scale):
        """P's values in S's registers: keys at or past ``keys_left`` (the sequence's end, relative to
        this step) masked to a score of 0, then act(S) with the scale, or act(S) / gain when the
        scale is deferred to the output tile."""
        if keys_left < self.bn:
            zero_outside(tScS, self.bm, keys_left, acc_s)
        if const_expr(self.deferred):
            s = 1.0 / DEFERRED_GAIN[self.act]
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                acc_s[i], _ = act_and_grad(acc_s[i], s, self.act)
        else:
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                acc_s[i], _ = act_and_grad(acc_s[i], scale, self.act)

    @cute.jit
    def _hold(self, rP, mO, max_seqlen_q):
        """A use of P's registers here that never runs (``OVERLAP``): the compiler cannot know that
        max_seqlen_q is positive (a tile count, for one, it can bound from the loop around)."""
        if max_seqlen_q < 0:
            g = cute.make_tensor(mO.iterator, cute.make_layout(cute.size(rP)))
            for i in cutlass.range_constexpr(cute.size(rP)):
                g[i] = rP[i]

    @cute.jit
    def _consume(
        self, tidx, mmas, tma_o, tO, sQ, sK, sV, sO, pipe_q, pipe_k, pipe_v, mO, mCuQ, mCuK, mTiles,
        count, block, n_ctas, max_seqlen_q, m_tiles, heads, group, scale,
    ):  # fmt: skip
        bm, bn, d = self.bm, self.bn, self.d
        mma_qk0, mma_qk, mma_pv, mma_pv_last, mma_epi = mmas
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_first = cute.make_layout(2, stride=128)(wg)  # first thread of this warpgroup
        thr_qk = mma_qk.get_slice(tidx)
        wg_qk = mma_qk.get_slice(wg_first)
        thr_pv = mma_pv.get_slice(tidx)
        wg_pv = mma_pv.get_slice(wg_first)

        # operand fragments (shared-memory descriptors), stages last
        tSrQ = mma_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = mma_qk.make_fragment_B(wg_qk.partition_B(sK))
        tOrV = mma_pv.make_fragment_B(wg_pv.partition_B(swap01(sV)))  # Vᵀ: (D, keys)
        acc_s_shape = thr_qk.partition_shape_C((bm, bn))
        acc_o_shape = thr_pv.partition_shape_C((bm, d))
        # (query row, key) of this thread's S elements and (query row, column) of its O elements
        tScS = thr_qk.partition_C(cute.make_identity_tensor((bm, bn)))
        wtid = tidx % 128  # this thread in its warpgroup
        tOcO = mma_epi.get_slice(wtid).partition_C(cute.make_identity_tensor((ROWS, d)))
        thr_epi = cute.make_tiled_copy_C(
            cute.make_copy_atom(StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), mma_epi
        ).get_slice(wtid)
        sO_w = sO[None, None, wg]
        store_warp = wtid < 32  # the warp that issues this warpgroup's TMA stores

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.Q_STAGES)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        # S of the step (P's values until converted) and P as the register operand of P·V; the
        # GEMMs' zero flag, not a fill, starts each S
        acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
        rP = cute.make_rmem_tensor(acc_s_shape, self.dtype)
        acc_o = cute.make_rmem_tensor(acc_o_shape, Float32)
        if const_expr(self.PINGPONG):
            if wg == 1:  # warpgroup 0 takes the first turn
                cute.arch.barrier_arrive(barrier_id=_BAR_TURN, number_of_threads=256)
        t = block
        while t < count:
            h, m, q0, lq, lq_eff, k0, lk = decode_q_tile(mTiles, mCuQ, mCuK, t, heads, m_tiles, max_seqlen_q)
            n_k = (lk + bn - 1) // bn
            if m * bm < lq:
                acc_o.fill(0.0)
                live_k = n_k  # the key steps this warpgroup computes; a dead half computes none
                if const_expr(self.skip_dead):
                    live_k = cutlass.select_(lq_eff > m * bm + wg * ROWS, n_k, 0)
                    if live_k < n_k:
                        # the live path's waits, turns and releases in the same order, without its
                        # GEMMs and activation, so the other warpgroup and the producer see the same
                        # sequence of events (this half's rows are zeros)
                        pipe_q.consumer_wait(q_state)
                        pipe_k.consumer_wait(k_state)
                        self._turn_take(wg)
                        self._turn_pass(wg)
                        pipe_k.consumer_release(k_state)
                        k_state.advance()
                        for _ in cutlass.range(1, n_k, unroll=1):
                            pipe_k.consumer_wait(k_state)
                            pipe_v.consumer_wait(v_state)
                            self._turn_take(wg)
                            self._turn_pass(wg)
                            pipe_k.consumer_release(k_state)
                            k_state.advance()
                            pipe_v.consumer_release(v_state)
                            v_state.advance()
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                        pipe_v.consumer_wait(v_state)
                        self._turn_take(wg)
                        self._turn_pass(wg)
                        pipe_v.consumer_release(v_state)
                        v_state.advance()
                if live_k > 0:
                    pipe_q.consumer_wait(q_state)
                    tQ_s = tSrQ[None, None, None, q_state.index]
                    # step 0: S_0 alone; its P·V goes out with S_1
                    pipe_k.consumer_wait(k_state)
                    self._turn_take(wg)
                    warpgroup.fence()
                    gemm(mma_qk0, acc_s, tQ_s, tSrK[None, None, None, k_state.index], zero=True)
                    warpgroup.commit_group()
                    self._turn_pass(wg)
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(k_state)
                    k_state.advance()
                    self._activate(acc_s, tScS, lk, scale)
                    rP.store(acc_s.load().to(self.dtype))
                    for j in cutlass.range(1, n_k, unroll=1):
                        pipe_k.consumer_wait(k_state)
                        pipe_v.consumer_wait(v_state)
                        self._turn_take(wg)
                        warpgroup.fence()
                        gemm(mma_qk, acc_s, tQ_s, tSrK[None, None, None, k_state.index], zero=True)
                        warpgroup.commit_group()
                        gemm(
                            mma_pv, acc_o, as_operand_a(rP), tOrV[None, None, None, v_state.index], zero=False
                        )
                        warpgroup.commit_group()
                        self._turn_pass(wg)
                        # S_j retires first (groups complete in order); P_{j-1}·V keeps running under
                        # the activation, which touches S's registers only
                        warpgroup.wait_group(1)
                        pipe_k.consumer_release(k_state)
                        k_state.advance()
                        if const_expr(self.OVERLAP):
                            # always true: the activation in a block of its own, which ptxas does not
                            # hoist the wait for P·V above (in one block with it, it does)
                            if max_seqlen_q > 0:
                                self._activate(acc_s, tScS, lk - j * bn, scale)
                        else:
                            self._activate(acc_s, tScS, lk - j * bn, scale)
                        warpgroup.wait_group(0)
                        if const_expr(self.OVERLAP):
                            self._hold(rP, mO, max_seqlen_q)
                        pipe_v.consumer_release(v_state)
                        v_state.advance()
                        rP.store(acc_s.load().to(self.dtype))
                    # every Q·Kᵀ of the tile has retired
                    pipe_q.consumer_release(q_state)
                    q_state.advance()
                    # the last P·V
                    pipe_v.consumer_wait(v_state)
                    self._turn_take(wg)
                    warpgroup.fence()
                    gemm(
                        mma_pv_last,
                        acc_o,
                        as_operand_a(rP),
                        tOrV[None, None, None, v_state.index],
                        zero=False,
                    )
                    warpgroup.commit_group()
                    self._turn_pass(wg)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(v_state)
                    v_state.advance()
                if const_expr(self.deferred):
                    for i in cutlass.range_constexpr(cute.size(acc_o)):
                        acc_o[i] = acc_o[i] * scale
                row0 = m * bm + wg * ROWS  # this warpgroup's first row in the sequence
                valid = lq_eff - row0  # rows from here to the sequence's end are written as zeros
                if valid < ROWS:
                    zero_outside(tOcO, valid, d, acc_o)
                self._store(tma_o, tO, mO, thr_epi, sO_w, wtid, wg, store_warp, acc_o, q0, row0, lq - row0, h)
            t += n_ctas
        if const_expr(self.EPI_TMA):
            if store_warp:  # shared memory must outlive the last store's read
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _store(self, tma_o, tO, mO, thr_epi, sO_w, wtid, wg, store_warp, acc_o, q0, row0, n_rows, h):
        """This warpgroup's output box (rows from ``row0`` of the sequence at ``q0``, head ``h``): its
        rows < ``n_rows`` written, by one TMA store when all 64 are (``EPI_TMA``), else by 16-byte
        row stores."""
        d = self.d
        if const_expr(self.EPI_TMA):
            # the box's previous TMA store has read it
            if store_warp:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=_BAR_EPI + wg, number_of_threads=128)
        if const_expr(self.EPI_TMA) and n_rows >= ROWS:
            stage_tile(thr_epi, sO_w, acc_o, self.dtype)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=_BAR_EPI + wg, number_of_threads=128)
            if store_warp:
                gO = cute.local_tile(cute.domain_offset((q0 + row0, 0), tO), (ROWS, d), (None, None))
                tS, tG = tma_tiles(tma_o, sO_w, gO[None, None, 0, h])
                cute.copy(tma_o, tS, tG)
                cute.arch.cp_async_bulk_commit_group()
        else:
            gOut = cute.local_tile(cute.domain_offset((q0 + row0, 0), mO), (ROWS, d), (0, h))
            store_rows_staged(thr_epi, sO_w, wtid, acc_o, gOut, n_rows, self.dtype, d)


_SWITCHES = ("REGS", "PINGPONG", "KV_STAGES", "Q_STAGES", "OVERLAP", "EPI_TMA")


def _switches() -> tuple:
    return tuple(getattr(GdpaFwdSm90, name) for name in _SWITCHES)


def compiled(dtype: torch.dtype, head_dim: int, act: int, deferred: bool, skip_dead: bool = False):
    """The kernel for one configuration (``kernel_cache``: compiled once, then loaded; explicit key:
    dtype, D, activation, deferral, dead-half skip and the build switches' values, so a switch
    changed in the process builds anew)."""
    key = ("gdpa_fwd_sm90", str(dtype), head_dim, act, deferred, skip_dead, _switches())

    def build():
        cdt = DTYPES[dtype]
        scalars = [Int32(1)] * 4 + [Float32(1.0), Int32(1)]
        return (
            GdpaFwdSm90(cdt, head_dim, act, deferred, skip_dead), *[fake_rows(cdt) for _ in range(4)],
            *[fake_vec() for _ in range(4)], *scalars, env_stream(),
        )  # fmt: skip

    return kernel_cache.compiled(key, build)


def defers_scale(dtype: torch.dtype, activation_id: int) -> bool:
    """Whether a call's build leaves the scale (and the activation's gain) to the output tile: bf16,
    an activation with a deferred form, and ``config.defer_scale()`` (as the Gluon forward)."""
    return dtype == torch.bfloat16 and int(activation_id) in DEFERRED_GAIN and cfg.defer_scale()


def gdpa_fwd_cute(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    activation_id: int,
    scale: float,
    out: torch.Tensor,
    *,
    longest_q: int | None = None,
) -> None:
    """Jagged GDPA forward into ``out`` (total_q, H, D), the contract of
    ``ads_gdpa.gluon.fwd_sm90.gdpa_fwd_gluon`` for 16-bit inputs: q (Tq, H, D), k, v (Tk, H_kv, D),
    clamped int32/int64 offsets. ``longest_q``: the longest query sequence when the caller knows it;
    the launch that zeroes rows past the tiles' reach is skipped when no sequence has such rows."""
    from ..gluon.fwd_sm90 import zero_rows_past_tiles

    total_q, heads, d = q.shape
    total_k, kv_heads, _ = k.shape
    batch = cu_seqlens_q.numel() - 1
    if batch <= 0 or total_q == 0 or max_seqlen_q <= 0:
        return
    assert d in (64, 128) and heads % kv_heads == 0 and q.dtype in DTYPES
    assert k.dtype == q.dtype and v.dtype == q.dtype and v.shape == k.shape
    assert out.is_contiguous() and out.shape == q.shape and out.dtype == q.dtype
    q, k, v = (x.contiguous() for x in (q, k, v))
    cu_q = cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = cu_seqlens_k.to(torch.int32).contiguous()
    m_tiles = (max_seqlen_q + BLOCK_M - 1) // BLOCK_M
    # heaviest sequences first (work ~ Lq·Lk); stays on the device: no host sync
    tiles, count = schedule(cu_q, cu_k, max_seqlen_q, tile_q=True, block=BLOCK_M, slots=m_tiles, heads=heads)
    programs = min(batch * heads * m_tiles, sm_count(q.device))
    deferred = defers_scale(q.dtype, activation_id)
    if deferred:
        scale = scale * DEFERRED_GAIN[int(activation_id)]
    fn = compiled(q.dtype, d, int(activation_id), deferred, cfg.skip_dead_halves(max_seqlen_q))
    fn(
        rows(q), rows(k), rows(v), rows(out), *(vec(x) for x in (cu_q, cu_k, tiles, count)),
        max_seqlen_q, m_tiles, heads, heads // kv_heads, float(scale), programs,
    )  # fmt: skip
    zero_rows_past_tiles(out, cu_q, m_tiles * BLOCK_M, longest_q)
