"""GDPA backward for Hopper (sm_90) in Gluon: dK, dV and (atomically) dQ in one warp-specialised pass.

Per 128-row K/V tile of one kv head (spec §1.3, S recomputed; no softmax, so no preprocess pass):
a 1-warp producer loads K and V once and then streams 64-row Q and dO tiles of every query head of
the group through a ring of shared-memory stages (TMA, mbarriers). Two 4-warp consumer warpgroups
each own 64 of the kv rows and, per query tile,

    Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (wgmma, both in flight at once)
    Pᵀ = scale·act(Sᵀ), dSᵀ = scale·act'(Sᵀ)·dPᵀ (masked: rows/columns outside the sequences)
    dV += Pᵀ dO (Pᵀ from registers), dK += dSᵀ Q (dSᵀ from shared memory)
    dQ[:, half] = dS K[:, half] over all 128 kv rows, added into a zeroed fp32 buffer.

Both warpgroups write their 64-row halves of dSᵀ into one shared [128, 64] buffer (double-buffered,
guarded by mbarriers), so each dQ product spans the full 128 keys and each warpgroup adds only half
of the head dim: half the reduction traffic of two independent 64-row tiles, and a dQ accumulator of
D/2 columns keeps the consumers inside their register budget. The dQ partial goes to shared memory
and one bulk TMA reduction (``cp.reduce.async.bulk.tensor``) adds it to global memory; the
warpgroup only waits for that to have read shared memory when it stages the next partial. The
warpgroups meet once per step (at the dSᵀ exchange) and otherwise drift, so one's activation runs
under the other's tensor-core work.
Programs are persistent and walk the tile list heaviest-first (tiles facing the most query rows).
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

from ads_kernel_tools.kernels.gluon_hopper import (
    bwd_buffers,
    bwd_grad_step,
    red_add_v4,
    rows_desc,
    stage_for_tma,
    store_rows,
    tma_reduce_add,
)
from ads_kernel_tools.kernels.gluon_hopper import decode_tile as tile_coords

from ..bwd_plan import plan_kv_tiles
from ._act import act_and_grad_scaled

BLOCK_M = 64  # query rows per step
BLOCK_N = 128  # kv rows per tile: 64 per consumer warpgroup
STAGES = 2  # Q/dO ring depth (D=128: 64 KB ring + 64 KB K/V + 32 KB dSᵀ + 32 KB dQ staging)
# How dQ partials reach the fp32 accumulator (``gdpa_bwd_gluon(_dq_mode=...)``): bulk TMA reductions
# from shared memory (default; 445 TFLOP/s kernel-only at max len 2048 on the H200) or vector
# ``red.global.add.v4.f32`` from registers (386). "no-reduce" stages dQ in shared memory and stops
# there: a wrong dQ, for measuring what the reduction costs (479). Leaving out the dQ product as well
# measures nothing useful: ptxas then deletes the dQ wgmma.
DQ_MODES = {"tma": 2, "red": 1, "no-reduce": 3}


@gluon.jit
def _bwd_loader(
    q_desc,
    do_desc,
    k_desc,
    v_desc,
    q_smem,
    do_smem,
    k_smem,
    v_smem,
    qd_ready,
    qd_empty,
    kv_ready,
    kv_empty,
    tiles_ptr,
    cu_q_ptr,
    cu_k_ptr,
    max_seqlen_q,
    count_ptr,
    N_TILES,
    H_KV,
    G,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0  # position in the Q/dO ring, continued across tiles
    kc = 0  # K/V tiles loaded by this program
    for t in range(pid, gl.load(count_ptr), nprog):
        _b, hk, n_first, q0, _lq, lq_eff, k0, lk = tile_coords(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, H_KV, N_TILES, max_seqlen_q
        )
        n_m = gl.cdiv(lq_eff, BM)
        # kv tiles past max_seqlen_k's count (a sequence longer than max_seqlen_k) stride along
        for n in range(n_first, gl.cdiv(lk, BN), N_TILES):
            mbarrier.wait(kv_empty, (kc & 1) ^ 1)
            mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [k0 + n * BN, hk * D], kv_ready, k_smem)
            tma.async_copy_global_to_shared(v_desc, [k0 + n * BN, hk * D], kv_ready, v_smem)
            kc += 1
            for g in range(G):
                h = hk * G + g
                for m in range(n_m):
                    s = it % STAGES
                    mbarrier.wait(qd_empty.index(s), ((it // STAGES) & 1) ^ 1)
                    ready = qd_ready.index(s)
                    mbarrier.expect(ready, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(q_desc, [q0 + m * BM, h * D], ready, q_smem.index(s))
                    tma.async_copy_global_to_shared(do_desc, [q0 + m * BM, h * D], ready, do_smem.index(s))
                    it += 1


@gluon.jit
def _bwd_consumer(
    args,
    WG: gl.constexpr,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    ACT: gl.constexpr,
    DQ_MODE: gl.constexpr,
):
    (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
     ds_free, dq_ptr, dq_desc, dk_ptr, dv_ptr, tiles_ptr, cu_q_ptr, cu_k_ptr, max_seqlen_q, count_ptr,
     N_TILES, scale, H_KV, G) = args  # fmt: skip

    ROWS: gl.constexpr = BN // 2  # kv rows of this warpgroup
    DH: gl.constexpr = D // 2  # dQ columns of this warpgroup
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16]
    )
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    rows2 = gl.expand_dims(gl.arange(0, ROWS, gl.SliceLayout(1, s_layout)), 1)
    cols2 = gl.expand_dims(gl.arange(0, BM, gl.SliceLayout(0, s_layout)), 0)
    # dQ partials are added four fp32 columns per instruction: runs of 4 per thread, a warp per row pair
    RED_TPC: gl.constexpr = DH // 4
    red_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // RED_TPC, RED_TPC], [4, 1], [1, 0])
    red_rows2 = gl.expand_dims(gl.arange(0, BM, gl.SliceLayout(1, red_layout)), 1)
    red_cols2 = gl.expand_dims(gl.arange(0, DH, gl.SliceLayout(0, red_layout)), 0)
    s_zero = gl.zeros([ROWS, BM], gl.float32, s_layout)
    dq_zero = gl.zeros([BM, DH], gl.float32, dq_layout)
    k_half = k_smem.slice(WG * ROWS, ROWS, dim=0)
    v_half = v_smem.slice(WG * ROWS, ROWS, dim=0)
    k_cols = k_smem.slice(WG * DH, DH, dim=1)
    W = H_KV * G * D  # elements per token row of Q / dQ

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    kc = 0
    for t in range(pid, gl.load(count_ptr), nprog):
        _b, hk, n_first, q0, _lq, lq_eff, k0, lk = tile_coords(
            t, tiles_ptr, cu_q_ptr, cu_k_ptr, H_KV, N_TILES, max_seqlen_q
        )
        n_m = gl.cdiv(lq_eff, BM)
        for n in range(n_first, gl.cdiv(lk, BN), N_TILES):
            kv_valid = lk - n * BN - WG * ROWS  # rows of this half inside the sequence (may be <= 0)
            mbarrier.wait(kv_ready, kc & 1)
            dk = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, kv_layout))
            dv = warpgroup_mma_init(gl.zeros([ROWS, D], gl.float32, kv_layout))
            for g in range(G):
                h = hk * G + g
                for m in range(n_m):
                    s = it % STAGES
                    db = it % 2
                    dph = (it // 2) & 1
                    mbarrier.wait(qd_ready.index(s), (it // STAGES) & 1)
                    q_s = q_smem.index(s)
                    do_s = do_smem.index(s)
                    st = warpgroup_mma(k_half, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    dpt = warpgroup_mma(v_half, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    # Sᵀ retires first (groups complete in order); dPᵀ keeps running under act(Sᵀ)
                    st = warpgroup_mma_wait(1, deps=(st,))
                    pt, grad = act_and_grad_scaled(st, scale, ACT)
                    dpt = warpgroup_mma_wait(0, deps=(dpt,))
                    dst = grad * dpt
                    q_valid = lq_eff - m * BM
                    if (kv_valid < ROWS) | (q_valid < BM):
                        # TMA brought the neighbouring sequences' rows (or zeros): they must not count
                        keep = (rows2 < kv_valid) & (cols2 < q_valid)
                        pt = gl.where(keep, pt, 0.0)
                        dst = gl.where(keep, dst, 0.0)
                    # dSᵀ halves exchanged through shared memory; dV, dK accumulated; dQ over all 128 keys
                    dv, dk, dq = bwd_grad_step(pt, dst, dv, dk, q_s, do_s, k_cols, ds_smem, db, dph, ds_full,
                                               ds_free, qd_empty.index(s), dq_zero, WG, p_layout)  # fmt: skip
                    if DQ_MODE >= 2:
                        # Rows past the sequence carry exact zeros (dSᵀ is masked), so the whole box
                        # may be added, the neighbouring sequence's rows included.
                        dq_s = dq_smem.index(WG)
                        stage_for_tma(dq_s, dq)
                        if DQ_MODE == 2:
                            tma_reduce_add(dq_desc, [q0 + m * BM, h * D + WG * DH], dq_s)
                    elif DQ_MODE == 1:
                        dq_r = gl.convert_layout(dq, red_layout)
                        offs = (q0 + m * BM + red_rows2).to(gl.int64) * W + h * D + WG * DH + red_cols2
                        red_add_v4(dq_ptr + offs, dq_r, (red_rows2 < q_valid) & (red_cols2 < DH))
                    it += 1
            dk = warpgroup_mma_wait(0, deps=(dk,))
            dv = warpgroup_mma_wait(0, deps=(dv,))
            # every read of this K/V tile (the other half's dQ products included) has retired
            mbarrier.arrive(kv_empty, count=1)
            row0 = k0 + n * BN + WG * ROWS
            store_rows(dk_ptr, dk, row0, kv_valid, None, hk * D, H_KV * D, ROWS, D, 4)
            store_rows(dv_ptr, dv, row0, kv_valid, None, hk * D, H_KV * D, ROWS, D, 4)
            kc += 1
    if DQ_MODE >= 2:
        tma.store_wait(0)  # shared memory must outlive the last reduction's read


@gluon.jit
def _gdpa_bwd_ws(
    q_desc,
    do_desc,
    k_desc,
    v_desc,
    dq_ptr,
    dq_desc,
    dk_ptr,
    dv_ptr,
    tiles_ptr,
    cu_q_ptr,
    cu_k_ptr,
    max_seqlen_q,
    count_ptr,
    N_TILES,
    scale,
    H_KV,
    G,
    D: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    ACT: gl.constexpr,
    DQ_MODE: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    LOADER_REGS: gl.constexpr,
):
    (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
     ds_free) = bwd_buffers(q_desc, do_desc, k_desc, v_desc, dq_desc, STAGES)  # fmt: skip

    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    # The two consumer warpgroups differ only in WG (which 64 kv rows and which dQ columns they own):
    # one tuple carries their runtime arguments; constexprs travel separately (a tuple would drop them
    # to runtime values).
    consumer_args = (
        q_smem,
        do_smem,
        k_smem,
        v_smem,
        ds_smem,
        dq_smem,
        qd_ready,
        qd_empty,
        kv_ready,
        kv_empty,
        ds_full,
        ds_free,
        dq_ptr,
        dq_desc,
        dk_ptr,
        dv_ptr,
        tiles_ptr,
        cu_q_ptr,
        cu_k_ptr,
        max_seqlen_q,
        count_ptr,
        N_TILES,
        scale,
        H_KV,
        G,
    )
    gl.warp_specialize(
        [
            (_bwd_consumer, (consumer_args, WG0, D, BM, BN, STAGES, ACT, DQ_MODE)),
            (_bwd_consumer, (consumer_args, WG1, D, BM, BN, STAGES, ACT, DQ_MODE)),
            (
                _bwd_loader,
                (
                    q_desc,
                    do_desc,
                    k_desc,
                    v_desc,
                    q_smem,
                    do_smem,
                    k_smem,
                    v_smem,
                    qd_ready,
                    qd_empty,
                    kv_ready,
                    kv_empty,
                    tiles_ptr,
                    cu_q_ptr,
                    cu_k_ptr,
                    max_seqlen_q,
                    count_ptr,
                    N_TILES,
                    H_KV,
                    G,
                    D,
                    BM,
                    BN,
                    STAGES,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGS, LOADER_REGS],
    )


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def gdpa_bwd_gluon(
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
    *,
    _dq_mode: str = "tma",
) -> None:
    """Jagged GDPA backward. q, do (Tq, H, D); k, v (Tk, H_kv, D); dq_acc fp32 (Tq, H, D), zeroed,
    receives dQ by atomic reductions; dk, dv (Tk, H_kv, D) get every row inside a sequence (rows
    outside all sequences are not written). Query rows at or past min(Lq_b, max_seqlen_q) contribute
    nothing. ``_dq_mode`` picks how dQ is reduced (``DQ_MODES``)."""
    p = plan_kv_tiles(
        do, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dq_acc, dk, dv,
        block_n=BLOCK_N, dtypes=_GL_DTYPES,
    )  # fmt: skip
    if p is None:
        return
    gdt = _GL_DTYPES[q.dtype]
    BM, BN, D = BLOCK_M, BLOCK_N, p.head_dim
    q_desc, do_desc = rows_desc(p.q, BM, gdt), rows_desc(p.do, BM, gdt)
    k_desc, v_desc = rows_desc(p.k, BN, gdt), rows_desc(p.v, BN, gdt)
    dq_desc = rows_desc(dq_acc, BM, gl.float32, cols=D // 2)
    grid = (p.programs,)
    _gdpa_bwd_ws[grid](
        q_desc, do_desc, k_desc, v_desc, dq_acc, dq_desc, dk, dv, p.tiles, p.cu_q, p.cu_k, p.max_seqlen_q,
        p.count, p.n_kv_tiles, float(scale), p.kv_heads, p.group, D, BM, BN, STAGES, int(activation_id),
        DQ_MODES[_dq_mode],
        240, 24, num_warps=4,
    )  # fmt: skip
