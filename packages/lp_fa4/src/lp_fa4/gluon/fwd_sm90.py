"""Softmax attention forward for Hopper (sm_90) in Gluon: persistent and warp specialised.

Partitions of each persistent program (one per SM at most):
  - a 1-warp TMA producer: the 128-row Q tile of each work item (double-buffered), then K and V
    tiles of 128 keys into a ring of shared-memory stages, each guarded by a ready / empty mbarrier
    pair;
  - two 4-warp consumer warpgroups, each owning 64 of the 128 query rows: S = Q Kᵀ by wgmma, the
    online softmax in log2 units (scale·log2e folded into one FMA before exp2), P (16-bit, kept in
    registers as the A operand) and O += P V by wgmma. Within a warpgroup the next step's Q Kᵀ and
    this step's P V are in flight together while the softmax of the next step runs (FA3's
    intra-warpgroup overlap, ``OVERLAP``); the two warpgroups drift, so one's softmax also runs
    under the other's GEMMs.
Work items come from ``ads_kernel_tools.kernels.tile_list.schedule`` (only real tiles, heaviest
sequence first); under ``CAUSAL`` a sequence's query tiles are walked from the last (the one with
the most keys) to the first, so each program's list also runs longest first. Dense causal batches up
to ``config.fwd_lpt_max_s()`` (8192: the walk measured faster than the tile list at 2048 and 4096,
and with balanced groups at 8192 too, on the H200, BENCHMARKS.md) take no list: their tiles are
walked in groups of (batch, head) pairs whose K/V fit in L2 and whose work spreads evenly over the
programs (``lpt_group``), heaviest rank first across the group (``fwd``'s ``lpt``). Dense
non-causal batches (all tiles equal) take no list either: the same walk with one pair per group is
the list's order. The offsets of dense batches (``offsets.dense_offsets``) are in range by
construction and skip the clamp launch; a dense call then launches only the attention kernel (FP8:
and V's copy).

Semantics (the Triton forward's, ``lp_fa4.triton._fwd``, for the subset admitted by
``dispatch.supported``): query rows [0, rows) of sequence b are computed, with rows = min(Lq_b,
seqused_q[b], max_seqlen_q); rows [rows, slot) of its slot get O = 0, LSE = -inf; keys are the first
min(Lk_b, seqused_k[b], max_seqlen_k). Causal masks are bottom-right aligned (query i sees key j iff
j <= i + Lk - Lq, with Lq the used query length). A row with no key gets 0 / -inf.
A learnable sink (``HAS_SINK``: one logit per query head, natural units, not scaled) joins each
row's denominator only, in the epilogue: a row with no key then gets 0 / the sink's logit (FA4's
values). ``OUT32``: the output also goes, unrounded, into an fp32 copy (stored straight from
registers); the op asks for it when a sink needs its gradient (``lp_fa4._ops``).
Keys of a K/V tile past the sequence get P = 0 (their scores are -inf): they are another sequence's
rows, or TMA zero fill past the tensor.

FP8 (``FP8``; float8_e4m3fn Q, K, V, bf16 out), the Triton forward's rule (``lp_fa4.triton._fwd``):
both GEMMs are e4m3 wgmma (K step 32 bytes), q_descale·k_descale of the (sequence, kv head) folded
into the score scale, P = exp2(s - m + 8) ∈ [0, 256] rounded to e4m3 as the register A operand of
P·V, O = acc / l · v_descale. fp8 wgmma reads B only K-major, so V comes from a (Hkv·D, keys) copy
(``ads_kernel_tools.kernels.transpose``) as [D, BN] tiles, each sequence from a 32-aligned column
(``FP8_V_COPY``). A step issues the next Q·Kᵀ with its own P·V and retires that P·V inside the step
(8-bit registers cannot be a wgmma wait's dependency in Triton 3.6: the build fails, so P may not be
carried into the next step's softmax); the overlap is between the two warpgroups. (ptxas waits for
the P·V before the softmax in the 16-bit build too: its SASS has no exp2 between the two waits.)

FP8 at D=128 (``FP8_WARPGROUPS = 3``, the default; 2 keeps bf16's two): three consumer warpgroups
on 192-row work items (Q as three 64-row TMA boxes, 160 registers per consumer thread), which only
fit with the serial step order ``SERIAL`` (P·V retires before the next Q·Kᵀ is issued), so that a
third softmax runs under the other two warpgroups' GEMMs.
"""

from __future__ import annotations

import functools

import numpy as np
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

from ads_kernel_tools.capability import num_sms
from ads_kernel_tools.kernels.gluon_hopper import (
    fwd_rings,
    kv_ring_buffers,
    rows_desc,
    smem_layout,
    split_entry,
    stage_for_tma,
    store_rows,
)
from ads_kernel_tools.kernels.grid import cdiv
from ads_kernel_tools.kernels.launch_cache import LaunchCache
from ads_kernel_tools.kernels.tile_list import schedule
from ads_kernel_tools.kernels.transpose import v_kmajor_relabel

from .. import config
from ..offsets import dense_offsets, kernel_offsets

BLOCK_M = 128  # query rows per work item: two 64-row consumer warpgroups
BLOCK_N = 128  # keys per step
ROWS = BLOCK_M // 2
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
P_SHIFT = gl.constexpr(8.0)  # FP8: P scaled by 2^8 before its e4m3 rounding (module docstring)


@gluon.jit
def _item(t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H, M_TILES, max_q, max_k, HG, BH,
          win_left, win_right, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
          HAS_USED_Q: gl.constexpr, HAS_USED_K: gl.constexpr, LPT: gl.constexpr, WINDOW: gl.constexpr,
          TOP_LEFT: gl.constexpr):  # fmt: skip
    """Work item t of the tile list -> (b, h, m, q0, slot, rows, k0, k_len, off, j0, n_k): query
    tile m of (sequence b, head h); slot query rows from q0, the first ``rows`` computed; k_len keys
    from k0; off the band's diagonal (k_len - used Lq bottom-right, 0 under TOP_LEFT); n_k key tiles
    to visit from tile j0 (0 unless WINDOW: row i sees keys [i + off - win_left, i + off + win_right]).

    LPT (dense batches, every slot M_TILES tiles): no list; item t lies in a group of HG
    consecutive (b, h) pairs (their K/V fit in L2 together), rank idx in the group's heaviest-first
    order, the group's pairs interleaved within a rank."""
    if LPT:
        per_group = HG * M_TILES
        g = t // per_group
        r = t - g * per_group
        gh = gl.minimum(HG, BH - g * HG)
        idx = r // gh
        bh = g * HG + r - idx * gh
        b = bh // H
        h = bh - b * H
    else:
        b, h, idx = split_entry(gl.load(tiles_ptr + t), H, M_TILES)
    q0 = gl.load(cu_q_ptr + b)
    slot = gl.load(cu_q_ptr + b + 1) - q0
    k0 = gl.load(cu_k_ptr + b)
    k_len = gl.minimum(gl.load(cu_k_ptr + b + 1) - k0, max_k)
    q_len = slot
    if HAS_USED_Q:
        q_len = gl.minimum(gl.maximum(gl.load(used_q_ptr + b), 0), slot)
    if HAS_USED_K:
        k_len = gl.minimum(gl.maximum(gl.load(used_k_ptr + b), 0), k_len)
    k_len = gl.maximum(k_len, 0)
    rows = gl.minimum(q_len, max_q)
    if CAUSAL:
        # the list holds min(cdiv(slot, BM), M_TILES) tiles of the sequence: walk them last first
        n_m = gl.minimum(gl.cdiv(slot, BM), M_TILES)
        m = n_m - 1 - idx
    else:
        m = idx
    if TOP_LEFT:
        off = k_len * 0
    else:
        off = k_len - q_len
    j0 = k_len * 0
    last = gl.minimum(m * BM + BM, rows) - 1  # the tile's last computed row
    if CAUSAL:
        hi = gl.minimum(gl.maximum(last + off + 1, 0), k_len)
    elif WINDOW:
        hi = gl.minimum(gl.maximum(last + off + win_right + 1, 0), k_len)
        j0 = gl.minimum(gl.maximum(m * BM + off - win_left, 0), k_len) // BN
    else:
        hi = k_len
    hi = gl.where(m * BM < rows, hi, 0)  # a tile past the computed rows only writes zeros
    n_k = gl.maximum(gl.cdiv(hi, BN) - j0, 0)
    return b, h, m, q0, slot, rows, k0, k_len, off, j0, n_k


@gluon.jit
def _producer(args, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              QBUF: gl.constexpr, CAUSAL: gl.constexpr, HAS_USED_Q: gl.constexpr,
              HAS_USED_K: gl.constexpr, LPT: gl.constexpr, FP8: gl.constexpr, WINDOW: gl.constexpr,
              TOP_LEFT: gl.constexpr):  # fmt: skip
    """TMA loads: per work item its Q tile, then its K/V tiles into the ring (position ``it``
    continues across items, as the consumers count it). FP8 reads V from its K-major copy
    (Hkv·D, keys), sequence b's keys from column vcol_ptr[b]."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H, GROUP, M_TILES, max_q,
     max_k, HG, BH, N_ITEMS, vcol_ptr, win_left, win_right, q_from_cu) = args  # fmt: skip
    it = 0
    ti = 0
    n_items = N_ITEMS if LPT else gl.load(count_ptr)
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, h, m, q0, slot, rows, k0, k_len, off, j0, n_k = _item(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H, M_TILES, max_q, max_k, HG, BH,
            win_left, win_right, BM, BN, CAUSAL, HAS_USED_Q, HAS_USED_K, LPT, WINDOW, TOP_LEFT,
        )  # fmt: skip
        qb = ti % QBUF
        mbarrier.wait(q_empty.index(qb), ((ti // QBUF) & 1) ^ 1)
        QBOX: gl.constexpr = q_desc.block_type.shape[0]
        mbarrier.expect(q_ready.index(qb), (BM // QBOX) * q_desc.block_type.nbytes)
        q_row = q0 * q_from_cu + m * BM  # q_from_cu 0: every sequence reads the one block (fwd's q_block)
        if QBOX == BM:
            tma.async_copy_global_to_shared(q_desc, [q_row, h * D], q_ready.index(qb), q_smem.index(qb))
        else:  # a tile of three 64-row warpgroups is no power of two: one box per warpgroup
            for w in gl.static_range(BM // QBOX):
                tma.async_copy_global_to_shared(q_desc, [q_row + w * QBOX, h * D], q_ready.index(qb),
                                                q_smem.index(qb * (BM // QBOX) + w))  # fmt: skip
        hk = h // GROUP
        if FP8:
            v0 = gl.load(vcol_ptr + b)
        for jj in range(n_k):
            j = j0 + jj
            s = it % STAGES
            ph = ((it // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(s), ph)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [k0 + j * BN, hk * D], k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), ph)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            if FP8:
                v_at = [hk * D, v0 + j * BN]
            else:
                v_at = [k0 + j * BN, hk * D]
            tma.async_copy_global_to_shared(v_desc, v_at, v_ready.index(s), v_smem.index(s))
            it += 1
        ti += 1


@gluon.jit
def _softmax_step(sacc, m_i, l_i, j, n_full, k_len, rows2, cols2, off, qk_scale2, band, BN: gl.constexpr,
                  CAUSAL: gl.constexpr, FP8: gl.constexpr, WINDOW: gl.constexpr):  # fmt: skip
    """Online softmax of one 64 x BN score tile (raw Q·Kᵀ) of the item's key tile j: masks tiles
    from n_full on (sequence end, causal diagonal), or under WINDOW the tiles the band's edges or
    the sequence end cross (``band`` = (first key tile j0, first and last row of this
    warpgroup, win_left, win_right)). Returns (P fp32, alpha = the rescale of the running sums, m,
    l) with m the running row maximum in log2 units. A row with no key so far keeps m = -inf and shifts by 0.
    FP8: P (and so l) carries the factor 2^P_SHIFT (module docstring)."""
    # a masked tile's keys, per row, as the tile's columns [lo, hi): the bounds are formed per row,
    # so each score pays one subtraction, one unsigned compare and the select
    if WINDOW:
        j0, r_first, r_last, win_left, win_right = band
        ks = (j0 + j) * BN
        if (ks + BN > k_len) | (ks < r_last + off - win_left) | (ks + BN - 1 > r_first + off + win_right):
            lo = gl.maximum(rows2 + (off - win_left - ks), 0)
            hi = gl.minimum(rows2 + (off + win_right + 1 - ks), k_len - ks)
            ok = (cols2 - lo).to(gl.uint32, bitcast=True) < gl.maximum(hi - lo, 0).to(gl.uint32, bitcast=True)
            sacc = gl.where(ok, sacc, float("-inf"))
    elif j >= n_full:
        if CAUSAL:
            ok = cols2 < gl.minimum(rows2 + (off + 1 - j * BN), k_len - j * BN)
        else:
            ok = cols2 < k_len - j * BN
        sacc = gl.where(ok, sacc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sacc, 1) * qk_scale2)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    if FP8:
        p = gl.exp2(sacc * qk_scale2 - gl.expand_dims(m_use - P_SHIFT, 1))
    else:
        p = gl.exp2(sacc * qk_scale2 - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.constexpr_function
def _k_width(dtype):
    return 32 // dtype.primitive_bitwidth


@gluon.jit
def _fp8_operand(p, p_layout: gl.constexpr, RELABEL: gl.constexpr):
    """P (fp32, accumulator layout) as the e4m3 register A operand of P·V. RELABEL renumbers P's
    columns within each 32-key group (``ads_kernel_tools.kernels.transpose.KEY_ORDER``) so that each
    thread already holds the values the operand wants from it and the layout change moves nothing;
    V's K-major copy then holds its keys in the same order (``v_kmajor_relabel``)."""
    if RELABEL:
        R: gl.constexpr = p.shape[0]
        N: gl.constexpr = p.shape[1]
        # column 32a + 16h + 8g + 2t + i -> position 32a + 16h + 4t + 2g + i (swap the g and t fields)
        p = gl.reshape(gl.permute(gl.reshape(p, [R, N // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5)), [R, N])
        p = gl.convert_layout(p, p_layout, assert_trivial=True).to(gl.float8e4nv)
    else:
        p = gl.convert_layout(p.to(gl.float8e4nv), p_layout)
    return p


@gluon.jit
def _take_turn(turn, WG: gl.constexpr, nturn, PINGPONG: gl.constexpr):
    """PINGPONG: wait until the other consumer warpgroup has issued its GEMMs of the turn before
    (warpgroup 0 goes first: parity 1 of a fresh barrier passes), so the two alternate on the tensor
    cores and one's softmax runs under the other's GEMMs (FA3's inter-warpgroup ping-pong)."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (nturn & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, nturn, PINGPONG: gl.constexpr):
    """PINGPONG: this warpgroup's GEMMs of the turn are issued: the other's turn."""
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)
    return nturn + 1


@gluon.constexpr_function
def _acc_layout(n, dtype):
    """``acc_layout`` for operands of ``dtype``: the instruction's K is 32 bytes (16 for 16-bit
    operands, 32 for fp8)."""
    k = 256 // dtype.primitive_bitwidth
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])


@gluon.jit
def _consumer(args, WG: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr, QBUF: gl.constexpr, CAUSAL: gl.constexpr, HAS_USED_Q: gl.constexpr,
              HAS_USED_K: gl.constexpr, LSE_PER_SEQ: gl.constexpr, LPT: gl.constexpr,
              FP8: gl.constexpr, RELABEL: gl.constexpr, WINDOW: gl.constexpr,
              TOP_LEFT: gl.constexpr, PINGPONG: gl.constexpr, SERIAL: gl.constexpr,
              HAS_SINK: gl.constexpr, OUT32: gl.constexpr):  # fmt: skip
    """Consumer warpgroup WG: rows [WG·64, WG·64 + 64) of every work item of this program."""
    (q_smem, k_smem, v_smem, o_smem, o_desc, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
     out_ptr, lse_ptr, stride_lb, stride_lh, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr,
     used_k_ptr, H, M_TILES, max_q, max_k, qk_scale2, HG, BH, N_ITEMS, qd_ptr, kd_ptr, vd_ptr,
     GROUP, win_left, win_right, turn, sink_ptr, out32_ptr) = args  # fmt: skip
    R: gl.constexpr = o_smem.shape[1]  # 64 rows per warpgroup
    dtype: gl.constexpr = q_smem.dtype
    o_dtype: gl.constexpr = o_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BN, dtype)
    o_layout: gl.constexpr = _acc_layout(D, dtype)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=_k_width(dtype))
    row_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_l: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols2 = gl.expand_dims(gl.arange(0, BN, gl.SliceLayout(0, s_layout)), 0)
    r_idx = gl.arange(0, R, row_l)
    s_zero = gl.zeros([R, BN], gl.float32, s_layout)
    o_s = o_smem.index(WG)
    it = 0
    ti = 0
    nturn = 0  # PINGPONG: turns taken so far (both warpgroups take the same number per item)
    n_items = N_ITEMS if LPT else gl.load(count_ptr)
    for t in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, h, m, q0, slot, rows, k0, k_len, off, j0, n_k = _item(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H, M_TILES, max_q, max_k, HG, BH,
            win_left, win_right, BM, BN, CAUSAL, HAS_USED_Q, HAS_USED_K, LPT, WINDOW, TOP_LEFT,
        )  # fmt: skip
        r0 = m * BM + WG * R  # first row of this warpgroup inside the sequence
        rows2 = gl.expand_dims(r0 + r_idx, 1)
        band = (j0, r0, r0 + R - 1, win_left, win_right)
        # leading key tiles that need no mask: inside the sequence and (causal) left of the
        # diagonal for every row of this warpgroup
        n_full = k_len // BN
        if CAUSAL:
            n_full = gl.minimum(n_full, gl.maximum(r0 + off + 1, 0) // BN)
        qb = ti % QBUF
        if q_smem.shape[1] == BM:
            q_half = q_smem.index(qb).slice(WG * R, R, dim=0)
        else:  # one buffer per warpgroup (``attn_fwd_ws``)
            q_half = q_smem.index(qb * (BM // R) + WG)
        mbarrier.wait(q_ready.index(qb), (ti // QBUF) & 1)
        m_i = gl.full([R], float("-inf"), gl.float32, row_l)
        l_i = gl.zeros([R], gl.float32, row_l)
        acc = gl.zeros([R, D], gl.float32, o_layout)
        if FP8:
            # the (sequence, kv head)'s descales: Q·Kᵀ's into the score scale, V's into the output
            d_at = b.to(gl.int64) * (H // GROUP) + h // GROUP
            s_scale2 = qk_scale2 * gl.load(qd_ptr + d_at) * gl.load(kd_ptr + d_at)
        else:
            s_scale2 = qk_scale2
        if FP8:
            if n_k > 0:
                s = it % STAGES
                mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
                _take_turn(turn, WG, nturn, PINGPONG)
                sacc = warpgroup_mma(
                    q_half, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True
                )
                nturn = _pass_turn(turn, WG, nturn, PINGPONG)
                sacc = warpgroup_mma_wait(0, deps=(sacc,))
                mbarrier.arrive(k_empty.index(s), count=1)
                for j in range(n_k - 1):
                    # P_j from S_j, then S_{j+1} and P_j·V_j issued together; P_j·V_j retires in the step
                    p, alpha, m_i, l_i = _softmax_step(sacc, m_i, l_i, j, n_full, k_len, rows2, cols2, off,
                                                       s_scale2, band, BN, CAUSAL, FP8, WINDOW)  # fmt: skip
                    p = _fp8_operand(p, p_layout, RELABEL)
                    accw = warpgroup_mma_init(acc * gl.expand_dims(gl.convert_layout(alpha, orow_l), 1))
                    sv = (it + j) % STAGES
                    sk = (it + j + 1) % STAGES
                    if SERIAL:  # P_j·V_j retires before S_{j+1} is issued: fewer live registers
                        mbarrier.wait(v_ready.index(sv), ((it + j) // STAGES) & 1)
                        accw = warpgroup_mma(p, v_smem.index(sv).permute((1, 0)), accw, is_async=True)
                        acc = warpgroup_mma_wait(0, deps=(accw,))
                        mbarrier.arrive(v_empty.index(sv), count=1)
                        mbarrier.wait(k_ready.index(sk), ((it + j + 1) // STAGES) & 1)
                        sacc = warpgroup_mma(q_half, k_smem.index(sk).permute((1, 0)), s_zero, use_acc=False,
                                             is_async=True)  # fmt: skip
                        sacc = warpgroup_mma_wait(0, deps=(sacc,))
                        mbarrier.arrive(k_empty.index(sk), count=1)
                    else:
                        mbarrier.wait(k_ready.index(sk), ((it + j + 1) // STAGES) & 1)
                        mbarrier.wait(v_ready.index(sv), ((it + j) // STAGES) & 1)
                        _take_turn(turn, WG, nturn, PINGPONG)
                        sacc = warpgroup_mma(q_half, k_smem.index(sk).permute((1, 0)), s_zero, use_acc=False,
                                             is_async=True)  # fmt: skip
                        accw = warpgroup_mma(p, v_smem.index(sv).permute((1, 0)), accw, is_async=True)
                        nturn = _pass_turn(turn, WG, nturn, PINGPONG)
                        sacc = warpgroup_mma_wait(1, deps=(sacc,))
                        mbarrier.arrive(k_empty.index(sk), count=1)
                        acc = warpgroup_mma_wait(0, deps=(accw,))
                        mbarrier.arrive(v_empty.index(sv), count=1)
                p, alpha, m_i, l_i = _softmax_step(sacc, m_i, l_i, n_k - 1, n_full, k_len, rows2, cols2, off,
                                                   s_scale2, band, BN, CAUSAL, FP8, WINDOW)  # fmt: skip
                p = _fp8_operand(p, p_layout, RELABEL)
                accw = warpgroup_mma_init(acc * gl.expand_dims(gl.convert_layout(alpha, orow_l), 1))
                sv = (it + n_k - 1) % STAGES
                mbarrier.wait(v_ready.index(sv), ((it + n_k - 1) // STAGES) & 1)
                _take_turn(turn, WG, nturn, PINGPONG)
                accw = warpgroup_mma(p, v_smem.index(sv).permute((1, 0)), accw, is_async=True)
                nturn = _pass_turn(turn, WG, nturn, PINGPONG)
                acc = warpgroup_mma_wait(0, deps=(accw,))
                mbarrier.arrive(v_empty.index(sv), count=1)
                it += n_k
        elif n_k > 0:
            accw = warpgroup_mma_init(acc)
            # step 0: S_0 alone
            s = it % STAGES
            mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
            _take_turn(turn, WG, nturn, PINGPONG)
            sacc = warpgroup_mma(
                q_half, k_smem.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True
            )
            nturn = _pass_turn(turn, WG, nturn, PINGPONG)
            sacc = warpgroup_mma_wait(0, deps=(sacc,))
            mbarrier.arrive(k_empty.index(s), count=1)
            p, alpha, m_i, l_i = _softmax_step(sacc, m_i, l_i, 0, n_full, k_len, rows2, cols2, off, s_scale2,
                                               band, BN, CAUSAL, False, WINDOW)  # fmt: skip
            p = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, n_k):
                sv = (it + j - 1) % STAGES  # the previous step's stage: its V meets this P
                sk = (it + j) % STAGES
                mbarrier.wait(k_ready.index(sk), ((it + j) // STAGES) & 1)
                mbarrier.wait(v_ready.index(sv), ((it + j - 1) // STAGES) & 1)
                _take_turn(turn, WG, nturn, PINGPONG)
                sacc = warpgroup_mma(q_half, k_smem.index(sk).permute((1, 0)), s_zero, use_acc=False,
                                     is_async=True)  # fmt: skip
                accw = warpgroup_mma(p, v_smem.index(sv), accw, is_async=True)
                nturn = _pass_turn(turn, WG, nturn, PINGPONG)
                # S_j retires first (groups complete in order); P_{j-1}·V runs under this softmax
                sacc = warpgroup_mma_wait(1, deps=(sacc,))
                mbarrier.arrive(k_empty.index(sk), count=1)
                p_next, alpha, m_i, l_i = _softmax_step(sacc, m_i, l_i, j, n_full, k_len, rows2, cols2, off,
                                                        s_scale2, band, BN, CAUSAL, False,
                                                        WINDOW)  # fmt: skip
                acc_t, p = warpgroup_mma_wait(0, deps=(accw, p))
                mbarrier.arrive(v_empty.index(sv), count=1)
                accw = warpgroup_mma_init(acc_t * gl.expand_dims(gl.convert_layout(alpha, orow_l), 1))
                p = gl.convert_layout(p_next.to(dtype), p_layout)
            sv = (it + n_k - 1) % STAGES
            mbarrier.wait(v_ready.index(sv), ((it + n_k - 1) // STAGES) & 1)
            _take_turn(turn, WG, nturn, PINGPONG)
            accw = warpgroup_mma(p, v_smem.index(sv), accw, is_async=True)
            nturn = _pass_turn(turn, WG, nturn, PINGPONG)
            acc = warpgroup_mma_wait(0, deps=(accw,))
            mbarrier.arrive(v_empty.index(sv), count=1)
            it += n_k
        mbarrier.arrive(q_empty.index(qb), count=1)  # every Q·Kᵀ of the item has retired
        ti += 1

        if HAS_SINK:
            o, lse = _sink_epilogue(acc, m_i, l_i, gl.load(sink_ptr + h).to(gl.float32) * 1.4426950408889634,
                                    orow_l)  # fmt: skip
        else:
            # O = acc / l, LSE = (m + log2 l)·ln2; rows without a key give 0 / -inf
            has = l_i > 0.0
            l_o = gl.convert_layout(gl.where(has, l_i, 1.0), orow_l)
            if FP8:
                l_o = l_o / gl.load(vd_ptr + d_at)
                m_i = m_i - P_SHIFT  # l summed P·2^P_SHIFT
            o = acc / gl.expand_dims(l_o, 1)
            o = gl.where(gl.expand_dims(gl.convert_layout(has, orow_l), 1), o, 0.0)
            lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        n_valid = rows - r0
        n_rows = slot - r0
        if OUT32:
            store_rows(out32_ptr, o, q0 + r0, n_rows, n_valid, h * D, H * D, R, D, 4, True)
        if (n_valid >= R) & (n_rows >= R):
            stage_for_tma(o_s, o.to(o_dtype))
            tma.async_copy_shared_to_global(o_desc, [q0 + r0, h * D], o_s)
        else:
            store_rows(out_ptr, o, q0 + r0, n_rows, n_valid, h * D, H * D, R, D, 4, True)
        if LSE_PER_SEQ:
            lse_base = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + r0
        else:
            lse_base = h.to(gl.int64) * stride_lh + q0 + r0
        lse = gl.where(r_idx < n_valid, lse, float("-inf"))
        gl.store(lse_ptr + lse_base + r_idx, lse, mask=r_idx < n_rows)
    tma.store_wait(0)  # shared memory must outlive the last store's read


@gluon.jit
def _sink_epilogue(acc, m_i, l_i, sink2, orow_l: gl.constexpr):
    """(O, LSE) of a warpgroup's rows with the sink's logit ``sink2`` (log2 units) in each
    denominator: l' = l·2^(m - m') + 2^(sink2 - m') over m' = max(m, sink2), O = acc·2^(m - m') / l',
    LSE = (m' + log2 l')·ln2. A row without a key (m = -inf, l = 0, acc = 0) gets O = 0 and LSE =
    the sink's logit."""
    m_f = gl.maximum(m_i, sink2)
    w = gl.exp2(m_i - m_f)
    l_f = l_i * w + gl.exp2(sink2 - m_f)
    o = acc * gl.expand_dims(gl.convert_layout(w / l_f, orow_l), 1)
    return o, (m_f + gl.log2(l_f)) * 0.6931471805599453


@gluon.jit
def attn_fwd_ws(
    q_desc, k_desc, v_desc, o_desc, out_ptr, lse_ptr, stride_lb, stride_lh,
    tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr,
    H, GROUP, M_TILES, max_q, max_k, qk_scale2, HG, BH, N_ITEMS, qd_ptr, kd_ptr, vd_ptr, vcol_ptr,
    win_left, win_right, sink_ptr, out32_ptr, q_from_cu,
    D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, QBUF: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_USED_Q: gl.constexpr, HAS_USED_K: gl.constexpr, LSE_PER_SEQ: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, LPT: gl.constexpr = False,
    RELABEL: gl.constexpr = False, WINDOW: gl.constexpr = False, TOP_LEFT: gl.constexpr = False,
    PINGPONG: gl.constexpr = False, SERIAL: gl.constexpr = False, HAS_SINK: gl.constexpr = False,
    OUT32: gl.constexpr = False,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    FP8: gl.constexpr = dtype.primitive_bitwidth == 8  # e4m3 q, k, v (module docstring)
    NWG: gl.constexpr = BM // 64  # consumer warpgroups, 64 query rows each
    QBOX: gl.constexpr = q_desc.block_type.shape[0]
    if QBOX == BM:
        q_smem = gl.allocate_shared_memory(dtype, [QBUF, BM, D], q_desc.layout)
    else:  # BM = 192 is no power of two: a 64-row buffer per warpgroup and Q buffer
        q_smem = gl.allocate_shared_memory(dtype, [QBUF * NWG, QBOX, D], q_desc.layout)
    k_smem, v_smem = kv_ring_buffers(k_desc, v_desc, STAGES, FP8)  # FP8: V K-major, as fp8 wgmma reads it
    o_smem = gl.allocate_shared_memory(o_desc.dtype, [NWG, 64, D], o_desc.layout)
    # released by each of the consumer warpgroups
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = fwd_rings(QBUF, STAGES, NWG)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)

    cargs = (q_smem, k_smem, v_smem, o_smem, o_desc, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
             out_ptr, lse_ptr, stride_lb, stride_lh, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr,
             used_k_ptr, H, M_TILES, max_q, max_k, qk_scale2, HG, BH, N_ITEMS, qd_ptr, kd_ptr, vd_ptr,
             GROUP, win_left, win_right, turn, sink_ptr, out32_ptr)  # fmt: skip
    pargs = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
             v_empty, tiles_ptr, count_ptr, cu_q_ptr, cu_k_ptr, used_q_ptr, used_k_ptr, H, GROUP, M_TILES,
             max_q, max_k, HG, BH, N_ITEMS, vcol_ptr, win_left, win_right, q_from_cu)  # fmt: skip
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    WG2: gl.constexpr = 2
    if NWG == 3:
        gl.static_assert(not PINGPONG, "PINGPONG takes two consumer warpgroups")
        gl.warp_specialize(
            [(_consumer, (cargs, WG0, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LSE_PER_SEQ,
                          LPT, FP8, RELABEL, WINDOW, TOP_LEFT, PINGPONG, SERIAL, HAS_SINK, OUT32)),
             (_consumer, (cargs, WG1, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LSE_PER_SEQ,
                          LPT, FP8, RELABEL, WINDOW, TOP_LEFT, PINGPONG, SERIAL, HAS_SINK, OUT32)),
             (_consumer, (cargs, WG2, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LSE_PER_SEQ,
                          LPT, FP8, RELABEL, WINDOW, TOP_LEFT, PINGPONG, SERIAL, HAS_SINK, OUT32)),
             (_producer, (pargs, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LPT, FP8, WINDOW,
                          TOP_LEFT))],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [(_consumer, (cargs, WG0, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LSE_PER_SEQ,
                          LPT, FP8, RELABEL, WINDOW, TOP_LEFT, PINGPONG, SERIAL, HAS_SINK, OUT32)),
             (_consumer, (cargs, WG1, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LSE_PER_SEQ,
                          LPT, FP8, RELABEL, WINDOW, TOP_LEFT, PINGPONG, SERIAL, HAS_SINK, OUT32)),
             (_producer, (pargs, D, BM, BN, STAGES, QBUF, CAUSAL, HAS_USED_Q, HAS_USED_K, LPT, FP8, WINDOW,
                          TOP_LEFT))],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------

_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


def stages_for(d: int, fp8: bool = False, warpgroups: int = 2) -> tuple[int, int]:
    """(K/V stages, Q buffers) inside 227 KB of shared memory with the 64-row output buffers (one per
    consumer warpgroup): D=128: 2 x 64 KB of K/V + 2 x 32 KB of Q + 32 KB of output = 224 KB; D=64
    goes deeper. FP8 tiles take half the bytes: D=128 4 x 32 KB of K/V + 2 x 16 KB of Q + 32 KB of
    bf16 output; with three warpgroups 4 x 32 KB + 2 x 24 KB + 48 KB = 224 KB."""
    if fp8:
        return (4, 2) if d == 128 else (6 if warpgroups == 2 else 4, 2)
    return (2, 2) if d == 128 else (4, 2)


# FP8: how V's K-major copy is laid out (``fwd``'s ``v_copy``): "aligned" (each sequence from a
# 32-aligned column, keys in order) or "relabel" (aligned, keys in KEY_ORDER groups). Aligned starts
# are needed: TMA boxes of the e4m3 copy starting at unaligned columns (sequence b from column cu_k[b],
# lengths 100, 200, 300) stopped the H200 with an illegal instruction. In-order keys measured faster
# than relabelled ones (787 against 739 TFLOP/s at B=4 S=4096 H=16 D=128, BENCHMARKS.md).
FP8_V_COPY = "aligned"
# The consumer warpgroups take turns issuing their GEMMs (``_take_turn``). Off: slower than free-running
# consumers on the H200 for bf16 and FP8 at S = 8192 (BENCHMARKS.md, Experiments).
PINGPONG = False
# FP8 at D=128: consumer warpgroups per work item (64 query rows each). Three (192-row items) keep the
# tensor cores fed while the others run their softmax (3-4 % faster non-causal on the H200, level
# causal: BENCHMARKS.md); their registers (160 each, ``_regs``) only fit when a step retires its P·V
# before issuing the next Q·Kᵀ (``SERIAL``).
FP8_WARPGROUPS = 3
L2_GROUP_BYTES = 24 << 20  # K/V bytes of the (b, h) pairs one LPT group keeps in L2 (H200: 50 MB)


def _regs(warpgroups: int) -> int:
    """Registers per consumer thread (setmaxnreg) beside the producer's warpgroup at 24: the 64K
    register file split over the consumer warpgroups, in steps of 8."""
    return 232 if warpgroups == 2 else 160


@functools.lru_cache(maxsize=256)
def lpt_group(pairs: int, m_tiles: int, programs: int, cap: int, sq: int, sk: int, bm: int = BLOCK_M) -> int:
    """How many (b, h) pairs one LPT group holds (at most ``cap``, the L2 budget), chosen so that the
    persistent programs, which take items t, t + programs, ... of the walk, get the most even work:
    causal q tile m of a dense batch (Lq = sq, Lk = sk, bottom-right) costs its kv tiles plus one
    (its Q load and epilogue). The L2-sized group alone can leave one program ~18 % more work than
    the mean (e.g. 24 pairs of 16 tiles on 132 programs); a smaller group evens it out. Host-only
    (numpy), cached per shape; a few milliseconds for the first call of a typical shape."""
    m = np.arange(m_tiles, dtype=np.int64)
    last = np.minimum(m * bm + bm, sq) - 1 + (sk - sq)
    kv_tiles = np.minimum((np.maximum(last + 1, 0) + BLOCK_N - 1) // BLOCK_N, -(-sk // BLOCK_N))
    weight = (kv_tiles + 1)[::-1].astype(np.float64)  # rank idx = tile m_tiles - 1 - idx
    t = np.arange(pairs * m_tiles, dtype=np.int64)
    slot = t % programs
    best, best_hg = None, cap
    if t.size <= 1 << 17:
        candidates = {*range(1, min(cap, 64) + 1), cap}
    else:  # a large batch: a few group sizes keep the first call of a shape short
        candidates = {max(1, cap >> i) for i in range(7)}
    for hg in sorted(candidates, reverse=True):
        g, r = np.divmod(t, hg * m_tiles)
        gh = np.minimum(pairs - g * hg, hg)
        worst = float(np.bincount(slot, weights=weight[r // gh], minlength=programs).max())
        if best is None or worst < best * 0.995:  # ties keep the larger group (fewer group turns)
            best, best_hg = worst, hg
    return best_hg


def fwd(q, k, v, cu_q, cu_k, used_q, used_k, max_q: int, max_k: int, scale: float, causal: bool, out, lse,
        lse_dense: bool, lpt: bool | None = None, descale=None, v_copy: str | None = None,
        window: tuple[int, int] | None = None, top_left: bool = False,
        pingpong: bool | None = None, warpgroups: int | None = None,
        serial: bool | None = None, sink: torch.Tensor | None = None,
        out32: torch.Tensor | None = None, q_block: bool = False) -> None:  # fmt: skip
    """Fill out (TQ, H, D) and lse ((B, H, S) when ``lse_dense``, else (H, TQ)); the caller checked
    ``dispatch.why_not``. No host sync. ``sink``: (H,) learnable sink logits (16-bit inputs);
    ``out32``: an fp32 tensor like out that also gets the output, unrounded (``OUT32``).

    ``q_block`` (broadcast_q without repeating the queries): q (Lq, H, D) is one query block that
    every sequence reads from its row 0, while cu_q (``batch_offsets(B, Lq)``) places sequence b's
    output rows (out (B·Lq, H, D)); rows of a tile past the block arrive as TMA zeros and are not
    computed (Lq <= max_q's slot).

    ``lpt`` (default: dense q, causal and S <= ``config.fwd_lpt_max_s()``): walk the dense batch's
    tiles in head groups whose K/V fit in L2 (sized by ``lpt_group``), heaviest tiles first in each
    group, instead of the sequence-major tile list. A dense batch (``lse_dense``) has equal slots,
    so the order needs no list. Left to the default, a dense q and K (``dense_offsets``) without
    causal mask, window or seqused, whose tiles all weigh the same, walk in the tile list's own
    order (groups of one (b, h) pair) without building it: the list's sort and fill launch goes.

    ``descale``: (q, k, v) contiguous fp32 (B, Hkv) for float8_e4m3fn q, k, v (out bf16); V is then
    read through a K-major copy made here, laid out as ``v_copy`` says (default ``FP8_V_COPY``):
    "relabel" puts its keys in ``KEY_ORDER`` groups so P reaches P·V without moving values between
    threads (``_fp8_operand``).

    ``pingpong`` (default ``PINGPONG``): the consumer warpgroups alternate their GEMM issues.

    ``warpgroups`` (FP8 at D=128; default ``FP8_WARPGROUPS``): 2 or 3 consumer warpgroups per work
    item of 64 query rows each; three take the serial step order (``_consumer``'s ``SERIAL``), two
    overlap a step's P·V with the next Q·Kᵀ unless ``serial``.

    ``window`` (win_left, win_right), sides resolved as ``lp_fa4.triton.launch.Problem``'s (BIG =
    unbounded): query row i sees keys [i + off - win_left, i + off + win_right], off = Lk - Lq
    (bottom-right) or 0 (``top_left``); with ``causal`` False. None: no band beyond ``causal``."""
    tq_in, h, d = q.shape
    tq = out.shape[0] if q_block else tq_in  # rows the offsets index: the output's under q_block
    if window is not None and causal:
        raise ValueError("fwd_sm90.fwd: pass causal as window (BIG, 0), not both")
    tk, hkv, _ = k.shape
    n_b = cu_q.shape[0] - 1
    if n_b <= 0 or h == 0 or max_q <= 0 or tq == 0 or tq_in == 0:
        return
    cu_q, cu_k, _, lk_dense = kernel_offsets(cu_q, tq, cu_k, tk)
    gdt = _GL[q.dtype]
    fp8 = descale is not None
    nwg = 2
    if fp8 and d == 128:
        nwg = FP8_WARPGROUPS if warpgroups is None else warpgroups
        if nwg not in (2, 3):
            raise ValueError(f"fwd_sm90.fwd: warpgroups must be 2 or 3, got {nwg!r}")
    BM, BN = 64 * nwg, BLOCK_N
    stages, qbuf = stages_for(d, fp8, nwg)
    q_box = BM if nwg == 2 else 64  # a TMA box is a power of two: 192-row items load three boxes
    # q, k and v may be row-strided slices of a packed projection (``dispatch._packed``)
    q_desc = rows_desc(q, q_box, gdt)
    o_desc = rows_desc(out, 64, _GL[out.dtype])
    k_desc = rows_desc(k, BN, gdt)  # no keys at all: a one-row dummy that no step loads
    if fp8:  # V K-major (Hkv·D, keys padded to 16): fp8 wgmma reads B only that way
        v_copy = FP8_V_COPY if v_copy is None else v_copy
        if v_copy not in ("aligned", "relabel"):
            raise ValueError(f"v_copy must be 'aligned' or 'relabel', got {v_copy!r}")
        relabel = v_copy == "relabel"
        # sequence b's keys from column vcol[b] (32-aligned) of the copy
        v3 = v if tk > 0 else v.new_zeros(1, hkv, d)
        if lk_dense is not None and tk > 0:  # dense: the columns b·L32 from shapes, no zero fill
            l32, n_kv = cdiv(lk_dense, 32) * 32, cu_k.shape[0] - 1
            starts = cu_k if l32 == lk_dense else dense_offsets(n_kv, l32, q.device)
            vt, vcol = v_kmajor_relabel(v3, cu_k, relabel=relabel, max_len=lk_dense, starts=starts,
                                        width=n_kv * l32)  # fmt: skip
        else:
            cu_v = cu_k if tk > 0 else cu_k * 0
            vt, vcol = v_kmajor_relabel(v3, cu_v, relabel=relabel, max_len=max_k)
        v_desc = TensorDescriptor(vt, list(vt.shape), [vt.shape[1], 1], [d, BN], smem_layout(d, BN, gdt))
        qd, kd, vd = descale
    else:
        v_desc = rows_desc(v, BN, gdt)
        qd = kd = vd = vcol = cu_q  # not read
        relabel = False
    m_tiles = cdiv(max_q, BM)
    even = False  # dense non-causal: the tile list's own order (one (b, h) pair after the other), no list
    if lpt is None:
        even = lse_dense and not causal and window is None and lk_dense is not None and used_q is None
        even = even and used_k is None
        lpt = (lse_dense and causal and tq // n_b <= config.fwd_lpt_max_s()) or even
    lpt = lpt and lse_dense
    if lpt:
        m_tiles = min(m_tiles, cdiv(tq // n_b, BM))  # every slot has these tiles
        tiles = count = cu_q  # not read
        kv_bytes = 2 * (tk // n_b) * d * q.element_size() * hkv // h  # per (b, h) pair
        hg = 1 if even else max(1, min(n_b * h, L2_GROUP_BYTES // max(kv_bytes, 1)))
        if not even and causal and config.fwd_lpt_balance():
            programs = min(n_b * h * m_tiles, num_sms(q.device))
            hg = lpt_group(n_b * h, m_tiles, programs, hg, tq // n_b, tk // n_b, BM)
    else:
        tiles, count = schedule(cu_q, cu_k, max_q, tile_q=True, block=BM, slots=m_tiles, heads=h)
        hg = 1
    n_items = n_b * h * m_tiles
    grid = (max(1, min(n_items, num_sms(q.device))),)
    if lse_dense:
        stride_lb, stride_lh = lse.stride(0), lse.stride(1)
    else:
        stride_lb, stride_lh = 0, lse.stride(0)
    _FWD.launch(grid, (
        q_desc, k_desc, v_desc, o_desc, out, lse, stride_lb, stride_lh, tiles, count, cu_q, cu_k,
        used_q if used_q is not None else cu_q, used_k if used_k is not None else cu_q,
        h, h // hkv, m_tiles, max_q, max_k, float(scale) * LOG2E, hg, n_b * h, n_items, qd, kd, vd, vcol,
        *(window if window is not None else (0, 0)), sink if sink is not None else cu_q,
        out32 if out32 is not None else lse, 0 if q_block else 1,
    ), dict(
        D=d, BM=BM, BN=BN, STAGES=stages, QBUF=qbuf, CAUSAL=bool(causal), HAS_USED_Q=used_q is not None,
        HAS_USED_K=used_k is not None, LSE_PER_SEQ=bool(lse_dense), CONSUMER_REGS=_regs(nwg),
        PRODUCER_REGS=24, LPT=bool(lpt), RELABEL=bool(relabel), WINDOW=window is not None,
        TOP_LEFT=bool(top_left), PINGPONG=PINGPONG if pingpong is None else bool(pingpong),
        SERIAL=fp8 and (nwg == 3 if serial is None else bool(serial)),
        HAS_SINK=sink is not None, OUT32=out32 is not None,
        num_warps=4,
    ))  # fmt: skip


# relaunched without Triton's per-call argument binding (host time of small calls)
_FWD = LaunchCache(attn_fwd_ws)
