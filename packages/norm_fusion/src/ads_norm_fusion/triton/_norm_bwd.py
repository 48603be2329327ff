"""Row-wise LayerNorm / RMSNorm backward without a GEMM: dy, x̂ and the row statistic in, dz out.

Memory-bound, so it is built for occupancy rather than tiles: each program holds a few whole rows
(``BLOCK_M`` × ``BLOCK_N``, BLOCK_N ≥ N) at a time, reads dy and x̂ exactly once and writes dz once,
and walks ``ROWS_PER_PROG`` rows, summing the column partials of dγ = Σ dy·x̂, dβ = Σ dy and the GEMM
bias gradient Σ dz in registers. Each program stores its partials once, into row ``pid`` of a
(3, programs, N) buffer. With ``SUMS`` the kernel also adds them up: the last program of each group
of ``GROUP`` programs to finish (an atomic counter per group) sums the group's rows into its first
row, and the last group to finish sums those into the outputs, each in a fixed order, so the result
does not depend on which program finishes last (deterministic) and no further launch is needed.
The counters are left at zero for the next launch. Without ``SUMS`` the caller adds the partials.
``XHAT_RAW``: XHAT holds the forward's staged pre-norm value, x̂ = (XHAT - XOFF)·rstat (RMSNorm:
XHAT·rrms), in fp32. ``STORE_XG``: x̂·γ is written too (``rmsnorm_linear``'s weight-gradient operand).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gpu_fence(FENCE: tl.constexpr):
    """``fence.acq_rel.gpu`` in every thread, so that its stores are visible GPU-wide before the
    counter's atomic (and the partials it then reads are not older than the counter). The interpreter
    (``FENCE`` off) runs programs one after another and needs none."""
    if FENCE:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [tl.full((1,), 0, tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def _sum_rows(
    PART, first, step, count, cols, col_ok, part_plane, N, DO0: tl.constexpr, DO1: tl.constexpr,
    DO2: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Σ over the ``count`` partial rows first, first + step, ... of each plane asked for, fp32, in
    row order (a fixed tree per ``BLOCK_P`` rows); L1 is bypassed, the rows come from other SMs."""
    s0 = tl.zeros((BLOCK_N,), tl.float32)
    s1 = tl.zeros((BLOCK_N,), tl.float32)
    s2 = tl.zeros((BLOCK_N,), tl.float32)
    for p0 in range(0, count, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        mask = (p < count)[:, None] & col_ok[None, :]
        ptrs = PART + (first + p.to(tl.int64) * step)[:, None] * N + cols[None, :]
        if DO0:
            s0 += tl.sum(tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
        if DO1:
            s1 += tl.sum(tl.load(ptrs + part_plane, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
        if DO2:
            s2 += tl.sum(tl.load(ptrs + 2 * part_plane, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
    return s0, s1, s2


@triton.jit
def _store_planes(
    row, s0, s1, s2, col_ok, part_plane, DO0: tl.constexpr, DO1: tl.constexpr, DO2: tl.constexpr
):
    if DO0:
        tl.store(row, s0, mask=col_ok)
    if DO1:
        tl.store(row + part_plane, s1, mask=col_ok)
    if DO2:
        tl.store(row + 2 * part_plane, s2, mask=col_ok)


@triton.jit
def _store_sums(
    OUT0, OUT1, OUT2, s0, s1, s2, cols, col_ok, DO0: tl.constexpr, DO1: tl.constexpr, DO2: tl.constexpr
):  # fmt: skip
    """The totals, each rounded once to its output's dtype."""
    if DO0:
        tl.store(OUT0 + cols, s0.to(OUT0.dtype.element_ty), mask=col_ok)
    if DO1:
        tl.store(OUT1 + cols, s1.to(OUT1.dtype.element_ty), mask=col_ok)
    if DO2:
        tl.store(OUT2 + cols, s2.to(OUT2.dtype.element_ty), mask=col_ok)


@triton.jit
def norm_bwd_kernel(
    DY, XHAT, RSTAT, GAMMA, DZ, PART, M, N, stride_dy, stride_x, stride_dz, part_plane,
    RMS: tl.constexpr, HAS_GAMMA: tl.constexpr, WEIGHT_GRADS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS_PER_PROG: tl.constexpr, ACC_2D: tl.constexpr = False,
    XOFF=None, XHAT_RAW: tl.constexpr = False, OUT0=None, OUT1=None, OUT2=None, COUNT=None,
    SUMS: tl.constexpr = False, GROUP: tl.constexpr = 32, BLOCK_P: tl.constexpr = 1,
    FENCE: tl.constexpr = False, XG=None, stride_xg=0, STORE_XG: tl.constexpr = False,
):  # fmt: skip
    """Planes of PART: 0 Σ dy·x̂ (``WEIGHT_GRADS``), 1 Σ dy (``WEIGHT_GRADS``, LayerNorm), 2 Σ dz
    (``BIAS_GRAD``); with ``SUMS`` their totals go to OUT0 / OUT1 / OUT2 in those tensors' dtype and
    COUNT holds 1 + cdiv(programs, GROUP) int32 zeros (left zero)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_GAMMA:
        gamma = tl.load(GAMMA + cols, mask=col_ok, other=0.0).to(tl.float32)
    else:
        gamma = tl.full((BLOCK_N,), 1.0, tl.float32)
    nf = N.to(tl.float32)
    sum_gx = tl.zeros((BLOCK_N,), tl.float32)
    sum_g = tl.zeros((BLOCK_N,), tl.float32)
    sum_dz = tl.zeros((BLOCK_N,), tl.float32)
    # ACC_2D: column partials kept per tile row and reduced across rows once after the loop, so the
    # loop has no cross-warp reduction along the rows (a sweep option, more registers)
    acc_gx = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_dz = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    row0 = pid.to(tl.int64) * ROWS_PER_PROG
    for r in range(0, ROWS_PER_PROG, BLOCK_M):
        rows = row0 + r + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mask = row_ok[:, None] & col_ok[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        xh = tl.load(XHAT + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstat = tl.load(RSTAT + rows, mask=row_ok, other=0.0)
        if XHAT_RAW:
            if RMS:
                xh = xh * rstat[:, None]
            else:
                xh = (xh - tl.load(XOFF + rows, mask=row_ok, other=0.0)[:, None]) * rstat[:, None]
        if STORE_XG:
            xg_ptrs = XG + rows[:, None] * stride_xg + cols[None, :]
            tl.store(xg_ptrs, (xh * gamma[None, :]).to(XG.dtype.element_ty), mask=mask)
        gh = dy * gamma[None, :]
        mean_gx = tl.sum(gh * xh, axis=1) / nf
        if RMS:
            dz = (gh - xh * mean_gx[:, None]) * rstat[:, None]
        else:
            mean_g = tl.sum(gh, axis=1) / nf
            dz = (gh - mean_g[:, None] - xh * mean_gx[:, None]) * rstat[:, None]
        tl.store(DZ + rows[:, None] * stride_dz + cols[None, :], dz.to(DZ.dtype.element_ty), mask=mask)
        if ACC_2D:
            if WEIGHT_GRADS:
                acc_gx += dy * xh
                acc_g += dy
            if BIAS_GRAD:
                acc_dz += dz
        else:
            if WEIGHT_GRADS:
                sum_gx += tl.sum(dy * xh, axis=0)
                sum_g += tl.sum(dy, axis=0)
            if BIAS_GRAD:
                sum_dz += tl.sum(dz, axis=0)
    if ACC_2D:
        sum_gx = tl.sum(acc_gx, axis=0)
        sum_g = tl.sum(acc_g, axis=0)
        sum_dz = tl.sum(acc_dz, axis=0)
    DO0: tl.constexpr = WEIGHT_GRADS
    DO1: tl.constexpr = WEIGHT_GRADS and not RMS
    DO2: tl.constexpr = BIAS_GRAD
    _store_planes(
        PART + pid.to(tl.int64) * N + cols, sum_gx, sum_g, sum_dz, col_ok, part_plane, DO0, DO1, DO2
    )
    if SUMS:
        programs = tl.num_programs(0)
        group = pid // GROUP
        first = group * GROUP
        in_group = tl.minimum(programs - first, GROUP)
        _gpu_fence(FENCE)
        tl.debug_barrier()
        if tl.atomic_add(COUNT + 1 + group, 1, sem="acq_rel", scope="gpu") == in_group - 1:
            # every partial row of the group is stored: sum them into the group's first row
            _gpu_fence(FENCE)
            s0, s1, s2 = _sum_rows(
                PART, first, 1, in_group, cols, col_ok, part_plane, N, DO0, DO1, DO2, BLOCK_P, BLOCK_N
            )  # fmt: skip
            _store_planes(PART + first.to(tl.int64) * N + cols, s0, s1, s2, col_ok, part_plane, DO0, DO1, DO2)
            tl.atomic_xchg(COUNT + 1 + group, 0)
            _gpu_fence(FENCE)
            tl.debug_barrier()
            groups = tl.cdiv(programs, GROUP)
            if tl.atomic_add(COUNT, 1, sem="acq_rel", scope="gpu") == groups - 1:
                _gpu_fence(FENCE)
                s0, s1, s2 = _sum_rows(
                    PART, 0, GROUP, groups, cols, col_ok, part_plane, N, DO0, DO1, DO2, BLOCK_P, BLOCK_N
                )  # fmt: skip
                _store_sums(OUT0, OUT1, OUT2, s0, s1, s2, cols, col_ok, DO0, DO1, DO2)
                tl.atomic_xchg(COUNT, 0)


@triton.jit
def part_sums_kernel(
    PART, OUT0, OUT1, OUT2, P, N, part_plane,
    DO0: tl.constexpr, DO1: tl.constexpr, DO2: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """OUTi[n] = Σ_p PART[i, p, n] for the planes asked for, in one launch instead of a reduction and a
    cast per plane: fp32 sums over the P rows in a fixed order (deterministic), rounded once to OUTi's
    dtype. One program per ``BLOCK_N`` columns."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    s0, s1, s2 = _sum_rows(PART, 0, 1, P, cols, col_ok, part_plane, N, DO0, DO1, DO2, BLOCK_P, BLOCK_N)
    _store_sums(OUT0, OUT1, OUT2, s0, s1, s2, cols, col_ok, DO0, DO1, DO2)
