"""GDPA backward for Hopper (sm_90) in the CuTe DSL: dK, dV in registers, dQ by bulk TMA reductions.

Per 128-row K/V tile of one kv head (spec §1.3; S recomputed, no softmax so no preprocess pass),
one CTA of three warpgroups:

* warp 0 (producer): K and V once per tile, then 64-row Q and dO tiles of every query head of the
  GQA group through a ring of shared-memory stages (TMA, mbarrier pipelines);
* warp 1 (dQ writer): for each query step, waits until a consumer warpgroup has staged its dQ
  partial in shared memory and adds it to the fp32 dQ accumulator with one bulk tensor reduction
  (``cp.reduce.async.bulk.tensor``); the consumers only wait for the reduction to have read the
  buffer when they stage the next partial;
* warpgroups 1 and 2 (consumers), 64 kv rows each, per query step:
  Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (wgmma, both in flight), Pᵀ = scale·act(Sᵀ), dSᵀ = scale·act'(Sᵀ)·dPᵀ
  (zeroed outside the sequences), dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ, dSᵀ from registers, dSᵀ
  written to shared memory so that dQ[:, half] = dS K spans all 128 keys, each warpgroup computing
  half of the head dim.

Persistent CTAs walk the device-built tile list heaviest-first (``ads_gdpa.bwd_plan``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.nvgpu.warp import StMatrix8x8x16bOp
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.memory import SmemAllocator

from ..activations import Activation
from ..bwd_plan import plan_kv_tiles
from . import kernel_cache
from ._act import act_and_grad, fast_gelu_and_grad_bf16x2, mul_bf16x2
from ._sm90 import (
    DTYPES,
    as_operand_a,
    env_stream,
    fake_rows,
    fake_vec,
    gemm,
    hint,
    row_major_smem,
    rows,
    store_rows_staged,
    swap01,
    tma_ring,
    tma_tiles,
    vec,
    zero_outside,
)

BLOCK_M = 64  # query rows per step
BLOCK_N = 128  # kv rows per tile: 64 per consumer warpgroup
STAGES = 2  # Q/dO ring depth
# dQ staged column-block-major only for calls with more keys than this: at 256 keys per sequence
# under up to 2,048 queries it ran slower than the row-major box (BENCHMARKS.md). A measurement of
# its own, not ``dispatch.PREFER``'s rule for taking this kernel at all, though both sit at 256 keys
# today: below this line the row-major box matters only where a call asks for CuTe explicitly.
COL8_MIN_KEYS = 257

# named barriers (0 is the CTA-wide one)
_BAR_DS = 1  # both consumers wrote their dSᵀ halves
_BAR_DQ_FULL = 2  # + warpgroup: its dQ partial is staged
_BAR_DQ_EMPTY = 4  # + warpgroup: its staging buffer was read by the previous reduction


@dsl_user_op
def _bulk_add_f32(gmem: cute.Pointer, smem: cute.Pointer, nbytes: int, *, loc=None, ip=None) -> None:
    """One contiguous fp32 run of shared memory added to global memory by the bulk-copy unit (no
    tensor map; the issuing thread's bulk group tracks it)."""
    llvm.inline_asm(
        None,
        [gmem.llvm_ptr, smem.toint(loc=loc, ip=ip).ir_value(), Int32(nbytes).ir_value(loc=loc, ip=ip)],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class GdpaBwdSm90:
    """One compiled configuration: dtype, head dim, activation (compile-time constants).

    Class attributes are build switches for bisecting on the GPU: ``REGS`` the (producer, consumer)
    register split or None for none; ``DQ_MODE`` "tma" (bulk tensor reductions by the dQ warp),
    "bulk" (the dQ warp's lanes add the staged rows one plain bulk reduction each, no tensor map),
    "atomic" (fp32 reductions from the consumers' registers) or "none" (dQ left out: wrong dQ, for
    measuring); ``L2_HINT`` None (the DSL's default cache-policy operand, 0) or a policy word for
    every TMA instruction (CUTLASS's EVICT_NORMAL is 0x1000000000000000); ``DS_KMAJOR`` stores dS
    key-major so the dQ GEMM reads its A operand K-major (two-byte stores) instead of transposed;
    ``DQ_COL8`` None (by key length, ``use_dq_col8``), True or False: stage dQ column-block-major
    (``_sdq_layouts``), since the row-major box's 256-byte rows put the eight rows of one
    accumulator store in the same banks (8-way conflicts); ``ACT_PACKED`` computes fast_gelu's act and
    act' for bf16 inputs in packed bf16x2 arithmetic (``_act.fast_gelu_and_grad_bf16x2``: half the
    FP32 instructions and MUFU operations of the step's elementwise phase, each operation rounded to
    bf16 as PyTorch's bf16 GDPA rounds it), the scale then applied to the fp32 accumulators.

    dSᵀ goes to shared memory by ``stmatrix`` (four per thread and step): one 4-byte store per
    value pair kept 16 swizzled addresses live across the step and spilled them inside the loop.
    Both warpgroups meet at one barrier after writing their dSᵀ halves, then issue dQ and dK (dK
    from registers), so the dQ staging runs under dK. dK and dV leave through a warp-private block
    of shared memory (``stmatrix`` in, 16-byte row chunks out, one bound check per chunk): per
    element stores from registers cost about 1,500 instructions per warp and tile, two query
    steps' worth, and 4-byte pair stores still queued on the load/store unit. Builds that read dSᵀ from
    shared memory for dK, packed Pᵀ before the dPᵀ wait, split the dSᵀ exchange per warpgroup, ran
    a third Q/dO stage, stepped 80 query rows (FA3/FA4's sm90 step at D=128, dQ computed
    transposed) or issued the dQ reductions from the consumer warpgroups were timed against this
    one and lost (BENCHMARKS.md).
    """

    REGS: tuple[int, int] | None = (24, 240)
    DQ_MODE = "tma"
    L2_HINT: int | None = None
    DS_KMAJOR = False
    DQ_COL8: bool | None = None
    ACT_PACKED = False

    def __init__(self, dtype, head_dim: int, act: int, dq_col8: bool = True):
        self.dtype = dtype
        self.d = head_dim
        self.dh = head_dim // 2
        self.act = act
        self.bm, self.bn, self.stages = BLOCK_M, BLOCK_N, STAGES
        self.dq_col8 = dq_col8
        # other dtypes and activations keep the fp32 path whatever the switch says
        self.packed_act = self.ACT_PACKED and dtype is cutlass.BFloat16 and act == int(Activation.FAST_GELU)
        if dq_col8 and self.DQ_MODE == "bulk":
            raise ValueError(
                "DQ_COL8 stages dQ column-block-major, which row-wise bulk reductions cannot read"
            )
        self.buffer_align = 1024

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (Tq, H*D)
        mK: cute.Tensor,  # (Tk, Hkv*D)
        mV: cute.Tensor,
        mdO: cute.Tensor,  # (Tq, H*D)
        mdQ: cute.Tensor,  # fp32 (Tq, H*D), zeroed
        mdK: cute.Tensor,  # (Tk, Hkv*D)
        mdV: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mTiles: cute.Tensor,
        mCount: cute.Tensor,
        max_seqlen_q: Int32,
        n_slots: Int32,
        h_kv: Int32,
        group: Int32,
        scale: Float32,
        n_ctas: Int32,
        stream,
    ):
        bm, bn, d, dh = self.bm, self.bn, self.d, self.dh
        K_MAJOR = OperandMajorMode.K
        RMEM = warpgroup.OperandSource.RMEM
        MN_MAJOR = OperandMajorMode.MN
        # Sᵀ = K Qᵀ, dPᵀ = V dOᵀ: M = 128 kv rows over the two warpgroups, N = the step's query rows
        mma_sdp = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_MAJOR, K_MAJOR, Float32, (2, 1, 1), (64, bm)
        )
        # dV += Pᵀ dO, dK += dSᵀ Q: A from registers, B = dO / Q read N(=D)-major. A second copy
        # partitions the dK/dV stores: the main loop's ``set`` calls rebind the first one inside it.
        mma_dkv, mma_epi = (
            sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, K_MAJOR, MN_MAJOR, Float32, (2, 1, 1), (64, d), RMEM
            )
            for _ in range(2)
        )  # fmt: skip
        # dQ = dS K: M = the step's query rows, N = D split over the warpgroups, K = 128 kv rows; K is
        # read N-major, dS M-major as stored (dSᵀ, query-contiguous) or K-major with DS_KMAJOR
        ds_major = K_MAJOR if self.DS_KMAJOR else MN_MAJOR
        mma_dq = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, ds_major, MN_MAJOR, Float32, (1, 2, 1), (64, dh)
        )

        sQ_layout = row_major_smem(self.dtype, bm, d, self.stages)
        sK_layout = row_major_smem(self.dtype, bn, d, None)
        # dSᵀ (kv, q) double-buffered; DS_KMAJOR stores dS (q, kv) instead
        sdS_layout = row_major_smem(self.dtype, *((bm, bn) if self.DS_KMAJOR else (bn, bm)), 2)
        sdQ_layout, sdQ_box = self._sdq_layouts()

        tma_q, tQ = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mQ, cute.slice_(sQ_layout, (None, None, 0)), (bm, d)
        )
        tma_do, tdO = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mdO, cute.slice_(sQ_layout, (None, None, 0)), (bm, d)
        )
        tma_k, tK = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK, sK_layout, (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mV, sK_layout, (bn, d))
        tma_dq, tdQ = cpasync.make_tiled_tma_atom(
            cpasync.CopyReduceBulkTensorTileS2GOp(),
            self._dq_gmem(mdQ),
            sdQ_box,
            cute.product_each(sdQ_box.shape),
        )

        qdo_bytes = 2 * cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0)))
        kv_bytes = 2 * cute.size_in_bytes(self.dtype, sK_layout)

        Align, MemRange = cute.struct.Align, cute.struct.MemRange
        align = self.buffer_align

        @cute.struct
        class Storage:
            bar_qdo: MemRange[cutlass.Int64, self.stages * 2]
            bar_kv: MemRange[cutlass.Int64, 2]
            sQ: Align[MemRange[self.dtype, cute.cosize(sQ_layout)], align]
            sdO: Align[MemRange[self.dtype, cute.cosize(sQ_layout)], align]
            sK: Align[MemRange[self.dtype, cute.cosize(sK_layout)], align]
            sV: Align[MemRange[self.dtype, cute.cosize(sK_layout)], align]
            sdS: Align[MemRange[self.dtype, cute.cosize(sdS_layout)], align]
            sdQ: Align[MemRange[Float32, cute.cosize(sdQ_layout)], align]
            sE: Align[MemRange[self.dtype, bn * d], align]  # dK/dV on their way out, 16 rows per warp

        self.kernel(
            tma_q, tQ, tma_do, tdO, tma_k, tK, tma_v, tV, tma_dq, tdQ, mdQ, mdK, mdV, mCuQ, mCuK, mTiles,
            mCount, max_seqlen_q, n_slots, h_kv, group, scale, mma_sdp, mma_dkv, mma_dq, mma_epi,
            sQ_layout, sK_layout, sdS_layout, qdo_bytes, kv_bytes, Storage,
        ).launch(grid=[n_ctas, 1, 1], block=[384, 1, 1], stream=stream, min_blocks_per_mp=1)  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        tQ: cute.Tensor,
        tma_do: cute.CopyAtom,
        tdO: cute.Tensor,
        tma_k: cute.CopyAtom,
        tK: cute.Tensor,
        tma_v: cute.CopyAtom,
        tV: cute.Tensor,
        tma_dq: cute.CopyAtom,
        tdQ: cute.Tensor,
        mdQ: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        mTiles: cute.Tensor,
        mCount: cute.Tensor,
        max_seqlen_q: Int32,
        n_slots: Int32,
        h_kv: Int32,
        group: Int32,
        scale: Float32,
        mma_sdp: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        mma_epi: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        qdo_bytes: cutlass.Constexpr[int],
        kv_bytes: cutlass.Constexpr[int],
        Storage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == 0:
            for atom in (tma_q, tma_do, tma_k, tma_v, tma_dq):
                cpasync.prefetch_descriptor(atom)

        smem = SmemAllocator()
        st = smem.allocate(Storage)
        pipe_qdo = tma_ring(st.bar_qdo, self.stages, qdo_bytes, last=False)
        pipe_kv = tma_ring(st.bar_kv, 1, kv_bytes, last=True)

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = st.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sdS = st.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sdSt = swap01(sdS) if const_expr(self.DS_KMAJOR) else sdS  # (kv, q) either way
        sdQ = st.sdQ.get_tensor(self._sdq_layouts()[0])
        sE_layout = row_major_smem(self.dtype, self.bn, self.d, None)
        sE = st.sE.get_tensor(sE_layout.outer, swizzle=sE_layout.inner)
        count = mCount[0]
        n_ctas = cute.arch.grid_dim()[0]
        block = cute.arch.block_idx()[0]

        if warp_idx < 4:
            if const_expr(self.REGS is not None):
                cute.arch.setmaxregister_decrease(self.REGS[0])
            if warp_idx == 0:
                self._load(
                    tma_q, tQ, tma_do, tdO, tma_k, tK, tma_v, tV, sQ, sdO, sK, sV, pipe_qdo, pipe_kv,
                    mCuQ, mCuK, mTiles, count, block, n_ctas, max_seqlen_q, n_slots, h_kv, group,
                )  # fmt: skip
            if warp_idx == 1 and const_expr(self.DQ_MODE in ("tma", "bulk")):
                self._dq_writer(
                    tma_dq,
                    tdQ,
                    mdQ,
                    sdQ,
                    mCuQ,
                    mCuK,
                    mTiles,
                    count,
                    block,
                    n_ctas,
                    max_seqlen_q,
                    n_slots,
                    h_kv,
                    group,
                )
        else:
            if const_expr(self.REGS is not None):
                cute.arch.setmaxregister_increase(self.REGS[1])
            self._consume(
                tidx - 128, mma_sdp, mma_dkv, mma_dq, mma_epi, sQ, sdO, sK, sV, sdSt, sdQ, pipe_qdo,
                pipe_kv, mdK, mdV, mdQ, mCuQ, mCuK, mTiles, count, block, n_ctas, max_seqlen_q, n_slots, h_kv,
                group, scale, sE,
            )  # fmt: skip

    @cute.jit
    def _tile(self, mTiles, mCuQ, mCuK, t, n_slots, h_kv, max_seqlen_q):
        """Entry t of the tile list -> (kv head, first kv tile, q start, Lq clamped, k start, Lk)."""
        e = mTiles[t]
        slot = e % n_slots
        bh = e // n_slots
        hk = bh % h_kv
        b = bh // h_kv
        q0 = mCuQ[b]
        lq = mCuQ[b + 1] - q0
        k0 = mCuK[b]
        lk = mCuK[b + 1] - k0
        lq_eff = cutlass.max(cutlass.min(lq, max_seqlen_q), 0)
        return hk, slot, q0, lq_eff, k0, lk

    @cute.jit
    def _load(
        self, tma_q, tQ, tma_do, tdO, tma_k, tK, tma_v, tV, sQ, sdO, sK, sV, pipe_qdo, pipe_kv, mCuQ, mCuK,
        mTiles, count, block, n_ctas, max_seqlen_q, n_slots, h_kv, group,
    ):  # fmt: skip
        bm, bn, d = self.bm, self.bn, self.d
        qdo_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        t = block
        while t < count:
            hk, slot, q0, lq_eff, k0, lk = self._tile(mTiles, mCuQ, mCuK, t, n_slots, h_kv, max_seqlen_q)
            n_m = (lq_eff + bm - 1) // bm
            gK = cute.local_tile(cute.domain_offset((k0, 0), tK), (bn, d), (None, hk))
            gV = cute.local_tile(cute.domain_offset((k0, 0), tV), (bn, d), (None, hk))
            tKs, tKg = tma_tiles(tma_k, sK, gK)
            tVs, tVg = tma_tiles(tma_v, sV, gV)
            n = slot
            while n * bn < lk:
                pipe_kv.producer_acquire(kv_state)
                bar = pipe_kv.producer_get_barrier(kv_state)
                cute.copy(tma_k, tKg[None, n], tKs, tma_bar_ptr=bar, **hint(self.L2_HINT))
                cute.copy(tma_v, tVg[None, n], tVs, tma_bar_ptr=bar, **hint(self.L2_HINT))
                kv_state.advance()
                for g in cutlass.range(group, unroll=1):
                    h = hk * group + g
                    gQ = cute.local_tile(cute.domain_offset((q0, 0), tQ), (bm, d), (None, h))
                    gdO = cute.local_tile(cute.domain_offset((q0, 0), tdO), (bm, d), (None, h))
                    tQs, tQg = tma_tiles(tma_q, sQ, gQ)
                    tdOs, tdOg = tma_tiles(tma_do, sdO, gdO)
                    for m in cutlass.range(n_m, unroll=1):
                        pipe_qdo.producer_acquire(qdo_state)
                        bar_q = pipe_qdo.producer_get_barrier(qdo_state)
                        cute.copy(
                            tma_q,
                            tQg[None, m],
                            tQs[None, qdo_state.index],
                            tma_bar_ptr=bar_q,
                            **hint(self.L2_HINT),
                        )
                        cute.copy(
                            tma_do,
                            tdOg[None, m],
                            tdOs[None, qdo_state.index],
                            tma_bar_ptr=bar_q,
                            **hint(self.L2_HINT),
                        )
                        qdo_state.advance()
                n += n_slots
            t += n_ctas

    @cute.jit
    def _dq_writer(
        self,
        tma_dq,
        tdQ,
        mdQ,
        sdQ,
        mCuQ,
        mCuK,
        mTiles,
        count,
        block,
        n_ctas,
        max_seqlen_q,
        n_slots,
        h_kv,
        group,
    ):
        bm, bn, dh = self.bm, self.bn, self.dh
        lane = cute.arch.lane_idx()
        total_q, W = mdQ.shape
        sdQ_boxes = self._dq_boxes(sdQ)
        t = block
        while t < count:
            hk, slot, q0, lq_eff, k0, lk = self._tile(mTiles, mCuQ, mCuK, t, n_slots, h_kv, max_seqlen_q)
            n_m = (lq_eff + bm - 1) // bm
            n = slot
            while n * bn < lk:
                for g in cutlass.range(group, unroll=1):
                    h = hk * group + g
                    for m in cutlass.range(n_m, unroll=1):
                        for w in cutlass.range_constexpr(2):
                            # the buffer of warpgroup w is free once the older of the two reductions in
                            # flight has read it
                            cute.arch.cp_async_bulk_wait_group(1 - w, read=True)
                            cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
                        for w in cutlass.range_constexpr(2):
                            cute.arch.barrier(barrier_id=_BAR_DQ_FULL + w, number_of_threads=160)
                            if const_expr(self.DQ_MODE == "tma"):
                                self._reduce_dq(tma_dq, tdQ, sdQ_boxes, q0, m, h, w)
                            else:
                                for rr in cutlass.range_constexpr((bm + 31) // 32):
                                    r = lane + 32 * rr
                                    row = q0 + m * bm + r
                                    if r < bm and row < total_q:  # no tensor map clips these rows
                                        off = row.to(cutlass.Int64) * W + (h * 2 + w) * dh
                                        _bulk_add_f32(
                                            mdQ.iterator + off, sdQ_boxes[r, None, w].iterator, dh * 4
                                        )
                            cute.arch.cp_async_bulk_commit_group()
                n += n_slots
            t += n_ctas
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _consume(
        self, tidx, mma_sdp, mma_dkv, mma_dq, mma_epi, sQ, sdO, sK, sV, sdSt, sdQ, pipe_qdo, pipe_kv,
        mdK, mdV, mdQ, mCuQ, mCuK, mTiles, count, block, n_ctas, max_seqlen_q, n_slots, h_kv, group, scale,
        sE,
    ):  # fmt: skip
        bm, bn, d = self.bm, self.bn, self.d
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_first = cute.make_layout(2, stride=128)(wg)  # first thread of this warpgroup
        thr_sdp = mma_sdp.get_slice(tidx)
        wg_sdp = mma_sdp.get_slice(wg_first)
        wg_dkv = mma_dkv.get_slice(wg_first)
        thr_dkv = mma_dkv.get_slice(tidx)
        wg_dq = mma_dq.get_slice(wg_first)
        thr_dq = mma_dq.get_slice(tidx)

        # operand fragments (shared-memory descriptors)
        tSrK = mma_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = mma_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tSrV = mma_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tSrdO = mma_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tVrdOt = mma_dkv.make_fragment_B(wg_dkv.partition_B(swap01(sdO)))
        tKrQt = mma_dkv.make_fragment_B(wg_dkv.partition_B(swap01(sQ)))
        # dS (q, kv) and Kᵀ (d, kv) views of shared memory, the dQ GEMM's operands
        tQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(swap01(sdSt)))
        tQrKt = mma_dq.make_fragment_B(wg_dq.partition_B(swap01(sK)))

        acc_s_shape = thr_sdp.partition_shape_C((bn, bm))
        acc_kv_shape = thr_dkv.partition_shape_C((bn, d))
        acc_dq_shape = thr_dq.partition_shape_C((bm, d))
        acc_dk = cute.make_rmem_tensor(acc_kv_shape, Float32)
        acc_dv = cute.make_rmem_tensor(acc_kv_shape, Float32)
        # coordinates (kv row, query row) of this thread's Sᵀ elements, for the sequence mask
        tScS = thr_sdp.partition_C(cute.make_identity_tensor((bn, bm)))
        # where this thread's dSᵀ values go, by stmatrix
        stsm = cute.make_copy_atom(StMatrix8x8x16bOp(transpose=self.DS_KMAJOR, num_matrices=4), self.dtype)
        thr_stsm = cute.make_tiled_copy_C(stsm, mma_sdp).get_slice(tidx)
        tRsdS = thr_stsm.partition_D(sdSt)
        tQsdQ = thr_dq.partition_C(sdQ)
        cDQ = thr_dq.partition_C(cute.make_identity_tensor((bm, d)))
        W = mdQ.shape[1]  # elements per token row of dQ
        # where this thread's dK/dV values go on their way out, by stmatrix
        thr_epi = cute.make_tiled_copy_C(
            cute.make_copy_atom(StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), mma_epi
        ).get_slice(tidx)

        qdo_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        it = Int32(0)  # query steps of this CTA (the dSᵀ double buffer)
        t = block
        while t < count:
            hk, slot, q0, lq_eff, k0, lk = self._tile(mTiles, mCuQ, mCuK, t, n_slots, h_kv, max_seqlen_q)
            n_m = (lq_eff + bm - 1) // bm
            n = slot
            while n * bn < lk:
                kv_valid = lk - n * bn
                acc_dk.fill(0.0)
                acc_dv.fill(0.0)
                pipe_kv.consumer_wait(kv_state)
                for g in cutlass.range(group, unroll=1):
                    for m in cutlass.range(n_m, unroll=1):
                        q_valid = lq_eff - m * bm
                        s = qdo_state.index
                        pipe_qdo.consumer_wait(qdo_state)
                        acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
                        acc_dp = cute.make_rmem_tensor(acc_s_shape, Float32)
                        warpgroup.fence()
                        gemm(mma_sdp, acc_s, tSrK, tSrQ[None, None, None, s], zero=True)
                        warpgroup.commit_group()
                        gemm(mma_sdp, acc_dp, tSrV, tSrdO[None, None, None, s], zero=True)
                        warpgroup.commit_group()
                        warpgroup.wait_group(1)
                        partial = kv_valid < bn or q_valid < bm
                        # Pᵀ and dSᵀ as register A operands (in the input dtype)
                        rP = cute.make_rmem_tensor(acc_s_shape, self.dtype)
                        rdS = cute.make_rmem_tensor(acc_s_shape, self.dtype)
                        if const_expr(self.packed_act):
                            self._act_packed(tScS, acc_s, acc_dp, rP, rdS, partial, kv_valid, q_valid)
                        else:
                            p = cute.make_rmem_tensor(acc_s_shape, Float32)
                            for i in cutlass.range_constexpr(cute.size(acc_s)):
                                y, gr = act_and_grad(acc_s[i], scale, self.act)
                                p[i] = y
                                acc_s[i] = gr
                            warpgroup.wait_group(0)
                            for i in cutlass.range_constexpr(cute.size(acc_s)):
                                acc_dp[i] = acc_s[i] * acc_dp[i]
                            if partial:
                                # TMA brought the neighbouring sequences' rows (or zeros): they must not
                                # count
                                zero_outside(tScS, kv_valid, q_valid, (p, acc_dp))
                            rP.store(p.load().to(self.dtype))
                            rdS.store(acc_dp.load().to(self.dtype))
                        buf = it % 2
                        cute.copy(thr_stsm, thr_stsm.retile(rdS), tRsdS[None, None, None, buf])
                        cute.arch.fence_view_async_shared()
                        warpgroup.fence()
                        gemm(mma_dkv, acc_dv, as_operand_a(rP), tVrdOt[None, None, None, s], zero=False)
                        warpgroup.commit_group()
                        cute.arch.barrier(barrier_id=_BAR_DS, number_of_threads=256)
                        acc_dq = cute.make_rmem_tensor(acc_dq_shape, Float32)
                        warpgroup.fence()
                        gemm(mma_dq, acc_dq, tQrdS[None, None, None, buf], tQrKt, zero=True)
                        warpgroup.commit_group()
                        gemm(mma_dkv, acc_dk, as_operand_a(rdS), tKrQt[None, None, None, s], zero=False)
                        warpgroup.commit_group()
                        warpgroup.wait_group(1)  # dV and dQ retired
                        if const_expr(self.packed_act):
                            for i in cutlass.range_constexpr(cute.size(acc_dq)):
                                acc_dq[i] = acc_dq[i] * scale
                        if const_expr(self.DQ_MODE in ("tma", "bulk")):
                            cute.arch.barrier(barrier_id=_BAR_DQ_EMPTY + wg, number_of_threads=160)
                            cute.autovec_copy(acc_dq, tQsdQ)
                            cute.arch.fence_view_async_shared()
                            cute.arch.barrier_arrive(barrier_id=_BAR_DQ_FULL + wg, number_of_threads=160)
                        elif const_expr(self.DQ_MODE == "atomic"):
                            row0 = q0 + m * bm
                            col0 = (hk * group + g) * d
                            for i in cutlass.range_constexpr(cute.size(acc_dq)):
                                r, c = cDQ[i]
                                if r < q_valid:
                                    off = (row0 + r).to(cutlass.Int64) * W + col0 + c
                                    cute.arch.red(
                                        mdQ.iterator + off,
                                        acc_dq[i],
                                        op="add",
                                        dtype=Float32,
                                        sem="relaxed",
                                        scope="gpu",
                                    )
                        warpgroup.wait_group(0)
                        pipe_qdo.consumer_release(qdo_state)
                        qdo_state.advance()
                        it += 1
                pipe_kv.consumer_release(kv_state)
                kv_state.advance()
                if const_expr(self.packed_act):
                    for i in cutlass.range_constexpr(cute.size(acc_dk)):
                        acc_dk[i] = acc_dk[i] * scale
                        acc_dv[i] = acc_dv[i] * scale
                for acc, mOut in ((acc_dk, mdK), (acc_dv, mdV)):
                    gOut = cute.local_tile(cute.domain_offset((k0 + n * bn, 0), mOut), (bn, d), (0, hk))
                    store_rows_staged(thr_epi, sE, tidx, acc, gOut, kv_valid, self.dtype, d)
                n += n_slots
            t += n_ctas

    @cute.jit
    def _dq_boxes(self, sdQ: cute.Tensor) -> cute.Tensor:
        """The dQ staging tile as its two (rows, D/2) boxes, one per consumer warpgroup: (r, c, w)."""
        bm, dh = self.bm, self.dh
        if const_expr(self.dq_col8):
            box = cute.make_layout((bm, (8, dh // 8), 2), stride=(8, (1, bm * 8), bm * dh))
        else:
            box = cute.make_layout((bm, dh, 2), stride=(dh, 1, bm * dh))
        return cute.make_tensor(sdQ.iterator, box)

    @cute.jit
    def _reduce_dq(self, tma_dq, tdQ, sdQ_boxes, q0, m, h, w):
        """Add warpgroup w's staged dQ box (query step m, head h, D half w) to the fp32 accumulator
        with one bulk tensor reduction (the calling thread's bulk group tracks it)."""
        if const_expr(self.dq_col8):
            bm, dh = self.bm, self.dh
            box = (bm, 8, dh // 8)
            gdQ = cute.local_tile(cute.domain_offset((q0, 0, 0), tdQ), box, (None, None, None))
            sbox = cute.make_tensor(sdQ_boxes[None, None, w].iterator, self._sdq_layouts()[1])
            tS, tG = cpasync.tma_partition(
                tma_dq, 0, cute.make_layout(1), cute.group_modes(sbox, 0, 3),
                cute.group_modes(gdQ[None, None, None, m, 0, h * 2 + w], 0, 3),
            )  # fmt: skip
        else:
            gdQ = cute.local_tile(cute.domain_offset((q0, 0), tdQ), (self.bm, self.dh), (None, None))
            tS, tG = tma_tiles(tma_dq, sdQ_boxes[None, None, w], gdQ[None, None, m, h * 2 + w])
        cute.copy(tma_dq, tS, tG, **hint(self.L2_HINT))

    def _dq_gmem(self, mdQ: cute.Tensor) -> cute.Tensor:
        """The dQ accumulator as the reduction's tensor map sees it: (Tq, H*D) rows, or with
        ``DQ_COL8`` (Tq, 8, H*D/8), so that one 3-D box covers a warpgroup's column-block-major
        staging."""
        if const_expr(self.dq_col8):
            rows, width = mdQ.shape
            return cute.make_tensor(
                mdQ.iterator, cute.make_layout((rows, 8, width // 8), stride=(mdQ.layout.stride[0], 1, 8))
            )
        return mdQ

    def _sdq_layouts(self):
        """(the dQ staging tile (rows, D), one warpgroup's reduction box (rows, D/2)), fp32. By
        default row-major per box: a warpgroup's column half is one box of D/2-float rows. With
        ``DQ_COL8`` column-block-major: 8-float column blocks of all rows one after another, so the
        eight rows of one accumulator store are 256 contiguous bytes (two wavefronts) instead of
        sharing banks 256 bytes apart; the reduction's tensor map reads that box as a 3-D one."""
        bm, dh = self.bm, self.dh
        if const_expr(self.dq_col8):
            return (
                cute.make_layout((bm, (8, self.d // 8)), stride=(8, (1, bm * 8))),
                cute.make_layout((bm, 8, dh // 8), stride=(8, 1, bm * 8)),
            )
        return cute.make_layout((bm, (dh, 2)), stride=(dh, (1, bm * dh))), cute.make_layout(
            (bm, dh), stride=(dh, 1)
        )

    @cute.jit
    def _act_packed(self, tScS, acc_s, acc_dp, rP, rdS, partial, kv_valid, q_valid):
        """``ACT_PACKED``: unscaled Pᵀ = act(Sᵀ) and dSᵀ = act'(Sᵀ)·dPᵀ in bf16x2 arithmetic, one
        fragment pair (adjacent columns) per word. A masked score is set to 0 (act(0) = 0 for
        fast_gelu) and its dPᵀ to 0, so both products vanish there."""
        if partial:
            zero_outside(tScS, kv_valid, q_valid, acc_s)
        wP = cute.recast_tensor(rP, Int32)
        wG = cute.make_rmem_tensor(cute.size(wP), Int32)
        for j in cutlass.range_constexpr(cute.size(wP)):
            wP[j], wG[j] = fast_gelu_and_grad_bf16x2(acc_s[2 * j], acc_s[2 * j + 1])
        warpgroup.wait_group(0)
        if partial:
            zero_outside(tScS, kv_valid, q_valid, acc_dp)
        wdS = cute.recast_tensor(rdS, Int32)
        for j in cutlass.range_constexpr(cute.size(wdS)):
            wdS[j] = mul_bf16x2(wG[j], acc_dp[2 * j], acc_dp[2 * j + 1])


_SWITCHES = ("REGS", "DQ_MODE", "L2_HINT", "DS_KMAJOR", "DQ_COL8", "ACT_PACKED")


def _switches() -> tuple:
    return tuple(getattr(GdpaBwdSm90, name) for name in _SWITCHES)


def use_dq_col8(max_seqlen_k: int | None = None) -> bool:
    """Whether a call stages dQ column-block-major: the ``DQ_COL8`` switch where set, else when it
    has more than ``COL8_MIN_KEYS - 1`` keys per sequence (None: as many as that) and the dQ mode is
    a tensor-map one."""
    if GdpaBwdSm90.DQ_COL8 is not None:
        return GdpaBwdSm90.DQ_COL8
    many_keys = max_seqlen_k is None or max_seqlen_k >= COL8_MIN_KEYS
    return many_keys and GdpaBwdSm90.DQ_MODE != "bulk"


def compiled(dtype: torch.dtype, head_dim: int, act: int, dq_col8: bool | None = None):
    """The kernel for one configuration (``kernel_cache``: compiled once, then loaded; explicit key:
    dtype, D, activation, dQ staging (None: ``use_dq_col8()``) and the build switches' values, so a
    switch changed in the process builds anew)."""
    dq_col8 = use_dq_col8() if dq_col8 is None else dq_col8
    key = ("gdpa_bwd_sm90", str(dtype), head_dim, act, dq_col8, _switches())

    def build():
        cdt = DTYPES[dtype]
        ins = [fake_rows(cdt) for _ in range(4)]
        outs = [fake_rows(Float32), fake_rows(cdt), fake_rows(cdt)]
        scalars = [Int32(1)] * 4 + [Float32(1.0), Int32(1)]
        return (
            GdpaBwdSm90(cdt, head_dim, act, dq_col8), *ins, *outs, *[fake_vec() for _ in range(4)],
            *scalars, env_stream(),
        )  # fmt: skip

    return kernel_cache.compiled(key, build)


def gdpa_bwd_cute(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    activation_id: int,
    scale: float,
    dq_acc: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
) -> None:
    """Jagged GDPA backward, the contract of ``ads_gdpa.gluon.bwd_sm90.gdpa_bwd_gluon``: q, do (Tq, H, D);
    k, v (Tk, H_kv, D); dq_acc fp32 (Tq, H, D), zeroed, receives dQ by bulk reductions; dk, dv get every
    row inside a sequence. Query rows at or past min(Lq_b, max_seqlen_q) contribute nothing."""
    p = plan_kv_tiles(
        do, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dq_acc, dk, dv,
        block_n=BLOCK_N, dtypes=DTYPES,
    )  # fmt: skip
    if p is None:
        return
    fn = compiled(q.dtype, p.head_dim, int(activation_id), use_dq_col8(max_seqlen_k))
    fn(
        rows(p.q), rows(p.k), rows(p.v), rows(p.do), rows(dq_acc), rows(dk), rows(dv),
        *(vec(x) for x in (p.cu_q, p.cu_k, p.tiles, p.count)),
        p.max_seqlen_q, p.n_kv_tiles, p.kv_heads, p.group, float(scale), p.programs,
    )  # fmt: skip
