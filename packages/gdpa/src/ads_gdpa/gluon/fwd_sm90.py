"""GDPA forward for Hopper (sm_90) in Gluon.

O = scale * act(Q Kᵀ ⊙ M) V over jagged (varlen) batches, no softmax.

``_gdpa_fwd_ws`` is warp specialised and persistent. One 1-warp partition issues the TMA loads
  (the Q tile, then K and V into a ring of shared-memory stages guarded by mbarriers); two
  4-warp consumer partitions each own 64 rows of the 128-row Q tile and run
  S = Q Kᵀ (wgmma) -> mask -> activation -> P (bf16/fp16, kept in registers as the wgmma A operand)
  -> O += P V (wgmma). The two consumers drift against each other, so the activation of one
  overlaps the tensor-core work of the other. Programs walk a tile list ordered by decreasing
  work so the persistent grid ends balanced. (A non-specialised 8-warp variant was slower on the
  H200, BENCHMARKS.md, and was removed.)

FP8 (``FP8`` constexpr; e4m3 Q, K, V, bf16 out): both GEMMs are e4m3 wgmma. Their B operands must
  be K-major in shared memory, so V is read through a (H_kv·D, keys) copy; P stays in registers as
  the A operand. P follows the Triton forward's rule (``ads_gdpa.triton._fwd``): the scale stays out
  of P, each row is normalised by its running maximum m of |act(S)| (P = e4m3(act(S)·448/m), the
  accumulator times m_old/m_new when m grows), and the output tile takes m/448·scale·v_descale, so P
  uses e4m3's full range whatever the scores, activation and scale. The descale of S, q_descale·
  k_descale, is folded into the activation's constants or its output gain (``_fp8``).

Rows of a sequence at or beyond min(Lq_b, max_seqlen_q) are written as zeros; no row outside
[cu_seqlens_q[b], cu_seqlens_q[b+1]) is written.
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
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ads_kernel_tools.capability import num_sms as sm_count
from ads_kernel_tools.kernels.gluon_hopper import (
    coalesced_rows_layout,
    fwd_rings,
    kv_ring_buffers,
    masked_row_store,
    smem_layout,
    stage_for_tma,
    store_rows,
)
from ads_kernel_tools.kernels.gluon_hopper import decode_tile as tile_coords
from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.tile_list import schedule
from ads_kernel_tools.kernels.transpose import v_kmajor, v_kmajor_relabel

from .. import config as cfg
from ..activations import DEFERRED_GAIN, Activation
from ._act import act_deferred, act_scaled, fast_gelu_deferred_bf16x2
from ._fp8 import act_fp8, fp8_gain, row_scaled_p

# The activations with a kernel path here (``dispatch.SUPPORT`` routes calls by its own table,
# which tests/test_dispatch.py keeps within this one).
_A = Activation
SUPPORTED_ACTIVATIONS = frozenset(
    int(a)
    for a in (_A.RAW, _A.GELU, _A.GELU_APPROX, _A.FAST_GELU, _A.LEAKY_RELU, _A.RELU, _A.SILU, _A.FAST_SILU,
              _A.HARDSWISH, _A.RELU_SQUARE)
)  # fmt: skip

BLOCK_M = 128  # query rows per tile (two 64-row consumer warpgroups)
BLOCK_N = 128  # keys per step


# ----------------------------------------------------------------------------------------------
# Warp-specialised persistent kernel
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _ws_loader(
    q_desc,
    k_desc,
    v_desc,
    q_smem,
    k_smem,
    v_smem,
    q_ready,
    q_empty,
    k_ready,
    k_empty,
    v_ready,
    v_empty,
    tiles_ptr,
    cu_q_ptr,
    cu_k_ptr,
    max_seqlen_q,
    count_ptr,
    M_TILES,
    H,
    GROUP,
    vcol_ptr,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    QBUF: gl.constexpr,
    FP8: gl.constexpr,
):
    """TMA producer. FP8 reads V from its K-major copy, sequence b's keys from column vcol_ptr[b]."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0  # position in the K/V ring, continued across tiles
    tc = 0  # tiles handled by this program
    for t in range(pid, gl.load(count_ptr), nprog):
        b, h, m, q0, lq, lq_eff, k0, lk = tile_coords(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, H, M_TILES, max_seqlen_q
        )
        if m * BM < lq:
            hk = h // GROUP
            # Q buffer: free once both consumers finished their last Q·Kᵀ of the tile that used it.
            qb = tc % QBUF
            mbarrier.wait(q_empty.index(qb), ((tc // QBUF) & 1) ^ 1)
            mbarrier.expect(q_ready.index(qb), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q0 + m * BM, h * D], q_ready.index(qb), q_smem.index(qb))
            n_k = gl.cdiv(lk, BN)
            if FP8:
                v0 = gl.load(vcol_ptr + b)
            for j in range(n_k):
                s = it % STAGES
                ph = (it // STAGES) & 1
                mbarrier.wait(k_empty.index(s), ph ^ 1)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(
                    k_desc, [k0 + j * BN, hk * D], k_ready.index(s), k_smem.index(s)
                )
                mbarrier.wait(v_empty.index(s), ph ^ 1)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                if FP8:  # V K-major: (H_kv·D, keys)
                    v_at = [hk * D, v0 + j * BN]
                else:
                    v_at = [k0 + j * BN, hk * D]
                tma.async_copy_global_to_shared(v_desc, v_at, v_ready.index(s), v_smem.index(s))
                it += 1
            tc += 1


@gluon.jit
def _ws_mask_act(
    sacc,
    cols2,
    j,
    lk,
    scale,
    p_layout: gl.constexpr,
    in_dtype: gl.constexpr,
    BN: gl.constexpr,
    ACT: gl.constexpr,
    DEFER: gl.constexpr,
):
    # Keys past the sequence end belong to the next sequence (or are TMA zero fill): P must be 0
    # there. act(0) = 0 for every activation here, so masking S or P gives the same P.
    if (j + 1) * BN > lk:
        sacc = gl.where(cols2 < lk - j * BN, sacc, 0.0)
    if DEFER == 2:  # the deferred form in bf16x2 arithmetic (bf16 fast_gelu, ``config.packed_act``)
        p = fast_gelu_deferred_bf16x2(sacc.to(gl.bfloat16))
    elif DEFER:  # scale and gain applied to the output tile instead (``DEFERRED_GAIN``)
        p = act_deferred(sacc, ACT)
    else:
        p = act_scaled(sacc, scale, ACT)
    return gl.convert_layout(p.to(in_dtype), p_layout)


@gluon.jit
def _ws_mask_fp8(sacc, cols2, j, lk, d, BN: gl.constexpr, ACT: gl.constexpr):
    """FP8 step: keys past the sequence end masked as in ``_ws_mask_act``, then y = ``act_fp8``
    (unnormalised; ``row_scaled_p`` turns it into P)."""
    if (j + 1) * BN > lk:
        sacc = gl.where(cols2 < lk - j * BN, sacc, 0.0)
    return act_fp8(sacc, d, ACT)


@gluon.constexpr_function
def _k_width(dtype):
    """Elements per 32 bits of a wgmma register A operand."""
    return 32 // dtype.primitive_bitwidth


@gluon.jit
def _ws_store_tile(
    o, sink, row, n_rows, n_valid, col, ROWS: gl.constexpr, D: gl.constexpr, EPILOGUE: gl.constexpr
):
    """Write one warpgroup's [ROWS, D] fp32 output tile at token row ``row``, column ``col``: rows
    < n_valid get o, rows in [n_valid, n_rows) zeros, rows from n_rows on nothing (``EPILOGUES``).
    ``sink`` = (its shared staging buffer, the output descriptor, the output pointer, row stride)."""
    o_s, o_desc, out_ptr, W = sink
    if EPILOGUE == 2:
        # Through shared memory: a full tile leaves by one asynchronous TMA store, a partial one is
        # read back row-contiguous and stored under its row mask.
        stage_for_tma(o_s, o.to(o_desc.dtype))
        if n_valid >= ROWS:
            tma.async_copy_shared_to_global(o_desc, [row, col], o_s)
        else:
            ov = o_s.load(coalesced_rows_layout(D, 4))
            masked_row_store(out_ptr, ov, row, n_rows, n_valid, col, W, ROWS, D)
    else:
        store_rows(out_ptr, o, row, n_rows, n_valid, col, W, ROWS, D, 4, EPILOGUE == 1)


@gluon.constexpr_function
def _acc_layout(n, dtype=None):
    """wgmma accumulator layout of a 64-row warpgroup tile n columns wide, for operands of ``dtype``
    (the instruction's K is 32 bytes: 16 for 16-bit operands, 32 for fp8)."""
    k = 16 if dtype is None else 256 // dtype.primitive_bitwidth
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])


@gluon.jit
def _ws_consumer(
    args,
    WG: gl.constexpr,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    QBUF: gl.constexpr,
    ACT: gl.constexpr,
    SCHEDULE: gl.constexpr,
    EPILOGUE: gl.constexpr,
    SKIP_DEAD: gl.constexpr,
    DEFER: gl.constexpr,
    FP8: gl.constexpr,
    RELABEL: gl.constexpr,
):
    """One consumer warpgroup: 64 query rows of each tile, tile after tile (``SCHEDULES``)."""
    PINGPONG: gl.constexpr = SCHEDULE == 1
    (q_smem, o_smem, o_desc, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn,
     out_ptr, tiles_ptr, cu_q_ptr, cu_k_ptr, max_seqlen_q, count_ptr, M_TILES, scale, H, GROUP,
     qd_ptr, kd_ptr, vd_ptr) = args  # fmt: skip
    ROWS: gl.constexpr = BM // 2
    in_dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BN, in_dtype)
    o_layout: gl.constexpr = _acc_layout(D, in_dtype)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=_k_width(in_dtype))
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols2 = gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, s_layout)), 0)
    s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
    # Ping-pong: each consumer issues its wgmmas only on its turn and then hands the turn to the
    # other, so one warpgroup's activation runs while the other's GEMMs own the tensor cores.
    # WG0 starts (parity 1 passes on a fresh barrier); strict alternation follows.
    my_turn = turn.index(WG)
    other_turn = turn.index(1 - WG)
    turn_par = 1 - WG
    sink = (o_smem.index(WG), o_desc, out_ptr, H * D)

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    tc = 0
    nturn = 0
    for t in range(pid, gl.load(count_ptr), nprog):
        b, h, m, q0, lq, lq_eff, k0, lk = tile_coords(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, H, M_TILES, max_seqlen_q
        )
        if m * BM < lq:
            qb = tc % QBUF
            q_half = q_smem.index(qb).slice(WG * ROWS, ROWS, dim=0)
            mbarrier.wait(q_ready.index(qb), (tc // QBUF) & 1)
            n_k = gl.cdiv(lk, BN)
            acc = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, o_layout))
            m_row = gl.zeros([ROWS], gl.float32, row_layout)  # FP8: running max |y| per row
            if FP8:
                hk = h // GROUP
                d = gl.load(qd_ptr + h) * gl.load(kd_ptr + hk)
            if PINGPONG:
                if SKIP_DEAD & (n_k > 0) & (lq_eff <= m * BM + WG * ROWS):
                    # No row of this warpgroup's half needs a value (all past the sequence or
                    # max_seqlen_q; the store below writes the zeros): take the same turns and hand
                    # back the same stages as the other warpgroup, without the GEMMs and activations.
                    for j in range(n_k + 1):
                        if j < n_k:
                            mbarrier.wait(k_ready.index((it + j) % STAGES), ((it + j) // STAGES) & 1)
                        if j > 0:
                            mbarrier.wait(v_ready.index((it + j - 1) % STAGES), ((it + j - 1) // STAGES) & 1)
                        mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                        mbarrier.arrive(other_turn, count=1)
                        nturn += 1
                        mbarrier.arrive(k_empty.index((it + j) % STAGES), count=1, pred=j < n_k)
                        mbarrier.arrive(q_empty.index(qb), count=1, pred=j == n_k - 1)
                        mbarrier.arrive(v_empty.index((it + j - 1) % STAGES), count=1, pred=j > 0)
                    it += n_k
                elif n_k > 0:
                    # Step 0: S_0 only; its P·V goes out together with S_1.
                    s = it % STAGES
                    mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
                    mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                    sacc = warpgroup_mma(
                        q_half, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True
                    )
                    mbarrier.arrive(other_turn, count=1)
                    nturn += 1
                    sacc = warpgroup_mma_wait(0, deps=(sacc,))
                    mbarrier.arrive(k_empty.index(s), count=1)
                    mbarrier.arrive(q_empty.index(qb), count=1, pred=n_k == 1)
                    if FP8:
                        # Each step makes its P and issues that P·V with the next S: a P carried into
                        # the next step lives as separate bytes there (repacked before the GEMM, ~200
                        # instructions a step), and Triton 3.6 cannot make 8-bit registers a wgmma
                        # wait's dependency, so the step retires its P·V before P is rewritten (the
                        # 16-bit schedule's activation does not run under that GEMM either: ptxas
                        # waits for it, see ``gdpa_fwd_gluon``).
                        acc_t = warpgroup_mma_wait(0, deps=(acc,))
                        for j in range(n_k - 1):
                            y = _ws_mask_fp8(sacc, cols2, j, lk, d, BN, ACT)
                            p, m_row, alpha = row_scaled_p(y, m_row, p_layout, in_dtype, RELABEL)
                            # the sum so far into the units of the new row maximum
                            alpha = gl.expand_dims(gl.convert_layout(alpha, o_row_layout), 1)
                            acc = warpgroup_mma_init(acc_t * alpha)
                            sv = (it + j) % STAGES
                            sk = (it + j + 1) % STAGES
                            mbarrier.wait(k_ready.index(sk), ((it + j + 1) // STAGES) & 1)
                            mbarrier.wait(v_ready.index(sv), ((it + j) // STAGES) & 1)
                            mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                            sacc = warpgroup_mma(
                                q_half, k_smem.index(sk).permute((1, 0)), s_zero, use_acc=False, is_async=True
                            )
                            acc = warpgroup_mma(p, v_smem.index(sv).permute((1, 0)), acc, is_async=True)
                            mbarrier.arrive(other_turn, count=1)
                            nturn += 1
                            sacc = warpgroup_mma_wait(1, deps=(sacc,))
                            mbarrier.arrive(k_empty.index(sk), count=1)
                            # P_j·V retires inside its step: a wgmma still in flight across the loop's
                            # back edge makes ptxas serialise every wgmma of the kernel
                            acc_t = warpgroup_mma_wait(0, deps=(acc,))
                            mbarrier.arrive(v_empty.index(sv), count=1)
                        mbarrier.arrive(q_empty.index(qb), count=1, pred=n_k > 1)
                        # Last step: its P·V only.
                        y = _ws_mask_fp8(sacc, cols2, n_k - 1, lk, d, BN, ACT)
                        p, m_row, alpha = row_scaled_p(y, m_row, p_layout, in_dtype, RELABEL)
                        alpha = gl.expand_dims(gl.convert_layout(alpha, o_row_layout), 1)
                        acc = warpgroup_mma_init(acc_t * alpha)
                        sv = (it + n_k - 1) % STAGES
                        mbarrier.wait(v_ready.index(sv), ((it + n_k - 1) // STAGES) & 1)
                        mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                        acc = warpgroup_mma(p, v_smem.index(sv).permute((1, 0)), acc, is_async=True)
                        mbarrier.arrive(other_turn, count=1)
                        nturn += 1
                        acc = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(acc,)))
                        mbarrier.arrive(v_empty.index(sv), count=1)
                        it += n_k
                    else:
                        p = _ws_mask_act(sacc, cols2, 0, lk, scale, p_layout, in_dtype, BN, ACT, DEFER)
                        for j in range(1, n_k):
                            sp = it % STAGES  # stage of step j-1 (its V feeds this P·V)
                            php = (it // STAGES) & 1
                            it += 1
                            s = it % STAGES
                            ph = (it // STAGES) & 1
                            mbarrier.wait(k_ready.index(s), ph)
                            mbarrier.wait(v_ready.index(sp), php)
                            mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                            sacc = warpgroup_mma(
                                q_half, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True
                            )
                            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
                            mbarrier.arrive(other_turn, count=1)
                            nturn += 1
                            # S_j retires first (groups complete in order); P_{j-1}·V keeps running
                            # under this step's activation.
                            sacc = warpgroup_mma_wait(1, deps=(sacc,))
                            mbarrier.arrive(k_empty.index(s), count=1)
                            p_next = _ws_mask_act(
                                sacc, cols2, j, lk, scale, p_layout, in_dtype, BN, ACT, DEFER
                            )
                            acc_t, p = warpgroup_mma_wait(0, deps=(acc, p))
                            acc = warpgroup_mma_init(acc_t)
                            mbarrier.arrive(v_empty.index(sp), count=1)
                            p = p_next
                        # Every Q·Kᵀ of the tile has retired: Q's buffer goes back here, once per
                        # tile, not under a predicate in every step (each arrive costs the warpgroup
                        # a barrier).
                        mbarrier.arrive(q_empty.index(qb), count=1, pred=n_k > 1)
                        # Last P·V.
                        s = it % STAGES
                        mbarrier.wait(v_ready.index(s), (it // STAGES) & 1)
                        mbarrier.wait(my_turn, (nturn & 1) ^ turn_par)
                        acc = warpgroup_mma(p, v_smem.index(s), acc, is_async=True)
                        mbarrier.arrive(other_turn, count=1)
                        nturn += 1
                        acc = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(acc,)))
                        mbarrier.arrive(v_empty.index(s), count=1)
                        it += 1
                else:
                    mbarrier.arrive(q_empty.index(qb), count=1)
            else:
                for j in range(n_k):
                    s = it % STAGES
                    ph = (it // STAGES) & 1
                    mbarrier.wait(k_ready.index(s), ph)
                    sacc = warpgroup_mma(
                        q_half, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True
                    )
                    # Retires this S and the previous step's P·V (wgmma groups complete in order).
                    sacc = warpgroup_mma_wait(0, deps=(sacc,))
                    mbarrier.arrive(k_empty.index(s), count=1)
                    prev = (it + STAGES - 1) % STAGES
                    mbarrier.arrive(v_empty.index(prev), count=1, pred=j > 0)
                    mbarrier.arrive(q_empty.index(qb), count=1, pred=j == n_k - 1)
                    p = _ws_mask_act(sacc, cols2, j, lk, scale, p_layout, in_dtype, BN, ACT, DEFER)
                    mbarrier.wait(v_ready.index(s), ph)
                    acc = warpgroup_mma(p, v_smem.index(s), acc, is_async=True)
                    it += 1
                acc = warpgroup_mma_init(warpgroup_mma_wait(0, deps=(acc,)))
                last = (it + STAGES - 1) % STAGES
                mbarrier.arrive(v_empty.index(last), count=1, pred=n_k > 0)
                mbarrier.arrive(q_empty.index(qb), count=1, pred=n_k == 0)
            o = warpgroup_mma_wait(0, deps=(acc,))
            if FP8:
                # P was y·448/m per row: back to act(S)·scale·v_descale (m = 0 rows stay 0)
                f = fp8_gain(d, ACT) * scale * gl.load(vd_ptr + hk) * (1.0 / 448.0)
                o = o * gl.expand_dims(gl.convert_layout(m_row * f, o_row_layout), 1)
            elif DEFER:
                o = o * scale
            row0 = m * BM + WG * ROWS
            _ws_store_tile(o, sink, q0 + row0, lq - row0, lq_eff - row0, h * D, ROWS, D, EPILOGUE)
            tc += 1
    if EPILOGUE == 2:
        tma.store_wait(0)  # shared memory must outlive the last store's read


@gluon.jit
def _gdpa_fwd_ws(
    q_desc,
    k_desc,
    v_desc,
    out_ptr,
    o_desc,
    tiles_ptr,
    cu_q_ptr,
    cu_k_ptr,
    max_seqlen_q,
    count_ptr,
    M_TILES,
    scale,
    H,
    GROUP,
    qd_ptr,
    kd_ptr,
    vd_ptr,
    vcol_ptr,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    ACT: gl.constexpr,
    QBUF: gl.constexpr,
    SCHEDULE: gl.constexpr,
    EPILOGUE: gl.constexpr,
    SKIP_DEAD: gl.constexpr,
    DEFER: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    FP8: gl.constexpr = False,
    RELABEL: gl.constexpr = False,
):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [QBUF, BM, D], q_desc.layout)
    k_smem, v_smem = kv_ring_buffers(k_desc, v_desc, STAGES, FP8)  # FP8: V K-major, as fp8 wgmma reads it
    # released by each of the two consumer warpgroups
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = fwd_rings(QBUF, STAGES, 2)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if EPILOGUE == 2:  # one output tile per consumer warpgroup
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [2, BM // 2, D], o_desc.layout)
    else:  # unused; a minimal buffer keeps one consumer signature
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [2, 8, D], o_desc.layout)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)

    # The two consumer warpgroups differ only in WG (which 64-row half and which turn they own): one
    # tuple carries their runtime arguments; constexprs travel separately (a tuple would drop them to
    # runtime values).
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    consumer_args = (
        q_smem,
        o_smem,
        o_desc,
        k_smem,
        v_smem,
        q_ready,
        q_empty,
        k_ready,
        k_empty,
        v_ready,
        v_empty,
        turn,
        out_ptr,
        tiles_ptr,
        cu_q_ptr,
        cu_k_ptr,
        max_seqlen_q,
        count_ptr,
        M_TILES,
        scale,
        H,
        GROUP,
        qd_ptr,
        kd_ptr,
        vd_ptr,
    )
    gl.warp_specialize(
        [
            (
                _ws_consumer,
                (
                    consumer_args,
                    WG0,
                    D,
                    BM,
                    BN,
                    STAGES,
                    QBUF,
                    ACT,
                    SCHEDULE,
                    EPILOGUE,
                    SKIP_DEAD,
                    DEFER,
                    FP8,
                    RELABEL,
                ),
            ),
            (
                _ws_consumer,
                (
                    consumer_args,
                    WG1,
                    D,
                    BM,
                    BN,
                    STAGES,
                    QBUF,
                    ACT,
                    SCHEDULE,
                    EPILOGUE,
                    SKIP_DEAD,
                    DEFER,
                    FP8,
                    RELABEL,
                ),
            ),
            (
                _ws_loader,
                (
                    q_desc,
                    k_desc,
                    v_desc,
                    q_smem,
                    k_smem,
                    v_smem,
                    q_ready,
                    q_empty,
                    k_ready,
                    k_empty,
                    v_ready,
                    v_empty,
                    tiles_ptr,
                    cu_q_ptr,
                    cu_k_ptr,
                    max_seqlen_q,
                    count_ptr,
                    M_TILES,
                    H,
                    GROUP,
                    vcol_ptr,
                    D,
                    BM,
                    BN,
                    STAGES,
                    QBUF,
                    FP8,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGS, LOADER_REGS],
    )


@gluon.jit
def _zero_tail(out_ptr, cu_q_ptr, covered, W, num_warps: gl.constexpr):
    """Zero rows [covered, Lq_b) of sequence b: rows that no tile of the main grid reaches when a
    sequence is longer than the tiles launched for max_seqlen_q."""
    b = gl.program_id(0)
    q0 = gl.load(cu_q_ptr + b)
    lq = gl.load(cu_q_ptr + b + 1) - q0
    RB: gl.constexpr = 16
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    rows = gl.expand_dims(gl.arange(0, RB, gl.SliceLayout(1, layout)), 1)
    cols = gl.expand_dims(gl.arange(0, 256, gl.SliceLayout(0, layout)), 0)
    zero = gl.zeros([RB, 256], out_ptr.dtype.element_ty, layout)
    for r in range(covered, lq, RB):
        for c in range(0, W, 256):
            offs = (q0 + r + rows).to(gl.int64) * W + c + cols
            gl.store(out_ptr + offs, zero, mask=(r + rows < lq) & (c + cols < W))


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


EPILOGUES = {"scratch": 0, "direct": 1, "tma": 2}
# Consumer schedules (the ``variant`` argument): ping-pong (default) or free-running. A ping-pong
# streamed across tiles (a tile's S_0 in the turn of the previous tile's last P·V) was slower on the
# H200 (BENCHMARKS.md) and was removed. FP8 runs the ping-pong only.
SCHEDULES = {"ws_simple": 0, "ws": 1}


def _config(d: int, fp8: bool = False) -> tuple[int, int, int]:
    """(K/V stages, Q buffers, epilogue) per head dim and dtype within 227 KB of shared memory.

    Epilogue (``EPILOGUES``): 0 re-lays the output tile out through compiler scratch for coalesced
    stores, 1 stores straight from the accumulator layout, 2 stages it in its own shared buffer and
    sends full tiles by asynchronous TMA stores. Every default uses 2 (TMA stores) with a
    double-buffered Q, so one tile's Q loads while the previous tile finishes. The ring is as deep as
    the rest leaves room for at D=64; at D=128 in 16-bit two stages suffice, since a step's GEMMs and
    activation outlast a K/V load, and the space goes to Q and the output buffers. FP8 tiles take half
    the bytes and its steps are shorter, so it keeps a deeper ring. ADS_GDPA_GLUON_CFG=
    "stages,qbuf,epilogue" overrides (tuning).
    """
    tuned = cfg.gluon_cfg()
    if tuned is not None:
        return tuned
    if fp8:
        return (4, 2, 2) if d == 128 else (6, 2, 2)
    return (2, 2, 2) if d == 128 else (5, 2, 2)


def gdpa_fwd_gluon(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    activation_id: int,
    scale: float,
    out: torch.Tensor,
    *,
    variant: str | None = None,
    longest_q: int | None = None,
    skip_dead_halves: bool | None = None,
    descale: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    relabel: bool = True,
) -> None:
    """Jagged GDPA forward into ``out`` (total_q, H, D). See the module docstring for the contract.

    ``descale`` = (q_descale, k_descale, v_descale), fp32 (H,), (H_kv,), (H_kv,), positive, for
    float8_e4m3fn q, k, v (the user's values are q·q_descale[h] and so on); ``out`` is then bf16.
    The kernel reads V through a K-major copy (``ads_kernel_tools.kernels.transpose``) made here;
    ``relabel`` (FP8 only) renumbers P's columns so P reaches the second GEMM without moving values
    between threads, and the copy puts V's keys in the same order.

    ``variant`` (default ``config.gluon_variant()``; "ws" for FP8), see ``SCHEDULES``: "ws"
    (ping-pong consumers with S_{j+1} overlapping P_j·V) or "ws_simple" (free-running).
    ``longest_q``: the longest query sequence when the caller knows it (host offsets); the launch
    that zeroes rows past the tiles' reach is skipped when no sequence has such rows.
    ``skip_dead_halves`` (ping-pong only): a consumer warpgroup whose 64 rows of a tile lie past
    the sequence keeps its turns but skips its GEMMs and activation. Default: on for
    max_seqlen_q <= ``config.SKIP_DEAD_MAX_Q`` (``config.skip_dead_halves``).

    In this build ptxas waits for the previous step's P·V before the activation (SASS: none of the
    step's MUFU.TANH run under it). A build that forced them under it (P masked without a branch
    and a never-executed use of the packed P registers) was slower on the H200 (BENCHMARKS.md).
    """
    total_q, H, D = q.shape
    total_k, H_kv, _ = k.shape
    B = cu_seqlens_q.numel() - 1
    if B <= 0 or total_q == 0 or max_seqlen_q <= 0:
        return
    assert D in (64, 128) and H % H_kv == 0 and q.dtype in _GL_DTYPES
    assert k.dtype == q.dtype and v.dtype == q.dtype and v.shape == k.shape
    assert activation_id in SUPPORTED_ACTIVATIONS
    fp8 = q.dtype == torch.float8_e4m3fn
    if fp8 != (descale is not None):
        raise ValueError("descale (q, k, v) is required with float8_e4m3fn inputs and only with them")
    q = q.contiguous()
    k = k.contiguous()
    v = v.contiguous()
    assert out.is_contiguous() and out.shape == q.shape
    assert out.dtype == (torch.bfloat16 if fp8 else q.dtype)
    cu_q = cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = cu_seqlens_k.to(torch.int32).contiguous()
    # FP8 has the ping-pong schedule only: the tuning knob does not apply to it, an explicit request does
    variant = variant or ("ws" if fp8 else cfg.gluon_variant())
    if fp8 and variant != "ws":
        raise ValueError(f"FP8 runs the ping-pong schedule 'ws' only, not {variant!r}")
    gdt = _GL_DTYPES[q.dtype]
    BM, BN = BLOCK_M, BLOCK_N
    stages, qbuf, epilogue = _config(D, fp8)

    q_layout = smem_layout(BM, D, gdt)
    kv_layout = smem_layout(BN, D, gdt)
    q_desc = TensorDescriptor(q.view(total_q, H * D), [total_q, H * D], [H * D, 1], [BM, D], q_layout)
    o_layout = smem_layout(BM // 2, D, _GL_DTYPES[out.dtype])
    o_desc = TensorDescriptor(out.view(total_q, H * D), [total_q, H * D], [H * D, 1], [BM // 2, D], o_layout)
    if total_k > 0:
        k2, v2, tk = k.view(total_k, H_kv * D), v.view(total_k, H_kv * D), total_k
    else:  # every Lk is 0: a dummy one-row view keeps the descriptors valid; no step loads it
        k2 = v2 = torch.zeros(1, H_kv * D, dtype=q.dtype, device=q.device)
        tk = 1
    k_desc = TensorDescriptor(k2, [tk, H_kv * D], [H_kv * D, 1], [BN, D], kv_layout)
    vcol = cu_k
    if fp8:  # V K-major, (H_kv·D, keys padded to 16): fp8 wgmma reads B only that way
        if relabel:
            vt, vcol = v_kmajor_relabel(v2.view(tk, H_kv, D), cu_k if total_k > 0 else cu_k * 0)
        else:
            vt = v_kmajor(v2.view(tk, H_kv, D))
        vt_layout = smem_layout(D, BN, gdt)
        v_desc = TensorDescriptor(vt, list(vt.shape), [vt.shape[1], 1], [D, BN], vt_layout)
        qd, kd, vd = (t.to(device=q.device, dtype=torch.float32).contiguous() for t in descale)
        assert qd.shape == (H,) and kd.shape == (H_kv,) and vd.shape == (H_kv,)
    else:
        v_desc = TensorDescriptor(v2, [tk, H_kv * D], [H_kv * D, 1], [BN, D], kv_layout)
        qd = kd = vd = cu_q  # never read

    # Heaviest sequences first (work ~ Lq·Lk), so the persistent programs' strided walk over
    # the tile list ends with small tiles. Stays on the device: no host sync.
    m_tiles = cdiv(max_seqlen_q, BM)
    tiles, count = schedule(cu_q, cu_k, max_seqlen_q, tile_q=True, block=BM, slots=m_tiles, heads=H)
    grid = (min(B * H * m_tiles, sm_count(q.device)),)
    # bf16 P has fp32's exponent range, so P may leave out the scale (and a constant gain) and the
    # output tile take them; fp16 P could overflow without the scale, so it keeps the per-score
    # multiply. With a power-of-two scale both give the same bits.
    defer = q.dtype == torch.bfloat16 and int(activation_id) in DEFERRED_GAIN and cfg.defer_scale()
    if defer:
        scale = scale * DEFERRED_GAIN[int(activation_id)]
        if int(activation_id) == int(Activation.FAST_GELU) and cfg.packed_act():
            defer = 2
    args = (
        q_desc,
        k_desc,
        v_desc,
        out,
        o_desc,
        tiles,
        cu_q,
        cu_k,
        max_seqlen_q,
        count,
        m_tiles,
        float(scale),
        H,
        H // H_kv,
        qd,
        kd,
        vd,
        vcol,
        D,
        BM,
        BN,
    )
    if variant not in SCHEDULES:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(SCHEDULES)}")
    schedule_id = SCHEDULES[variant]
    if skip_dead_halves is None:
        skip_dead_halves = cfg.skip_dead_halves(max_seqlen_q)
    consts = (
        stages,
        int(activation_id),
        qbuf,
        schedule_id,
        epilogue,
        bool(skip_dead_halves),
        defer,
        232,
        24,
        fp8,
        fp8 and relabel,
    )
    _gdpa_fwd_ws[grid](*args, *consts, num_warps=4)
    zero_rows_past_tiles(out, cu_q, m_tiles * BM, longest_q)


def zero_rows_past_tiles(out: torch.Tensor, cu_q: torch.Tensor, covered: int, longest_q: int | None) -> None:
    """Zeros in the rows [covered, Lq_b) of each sequence of ``out`` (T, H, D): rows that a forward
    whose tiles reach ``covered`` rows per sequence (max_seqlen_q rounded up to its tile) leaves
    unwritten. Skipped when the caller knows the longest query sequence (``longest_q``) and no
    sequence has such rows. ``cu_q``: clamped int32 offsets."""
    if longest_q is None or longest_q > covered:
        _zero_tail[(cu_q.numel() - 1,)](out, cu_q, covered, out.shape[1] * out.shape[2], num_warps=4)
