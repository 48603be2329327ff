"""Row-wise LayerNorm / RMSNorm backward without a GEMM: dy, x̂ and the row statistic in, dz out.

Memory-bound, so it is built for occupancy rather than tiles: each program holds a few whole rows
(``BLOCK_M`` × ``BLOCK_N``, BLOCK_N ≥ N) at a time, reads dy and x̂ exactly once and writes dz once,
and walks ``ROWS_PER_PROG`` rows, summing the column partials of dγ = Σ dy·x̂, dβ = Σ dy and the GEMM
bias gradient Σ dz in registers. Each program stores its partials once, into row ``pid`` of a
(3, programs, N) buffer that the caller adds in a fixed order (deterministic). ``XHAT_RAW``: XHAT
holds the forward's staged pre-norm value, x̂ = (XHAT - XOFF)·rstat (RMSNorm: XHAT·rrms), in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def norm_bwd_kernel(
    DY, XHAT, RSTAT, GAMMA, DZ, PART, M, N, stride_dy, stride_x, stride_dz, part_plane,
    RMS: tl.constexpr, HAS_GAMMA: tl.constexpr, WEIGHT_GRADS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS_PER_PROG: tl.constexpr, ACC_2D: tl.constexpr = False,
    XOFF=None, XHAT_RAW: tl.constexpr = False,
):  # fmt: skip
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
    part_row = PART + pid.to(tl.int64) * N + cols
    if WEIGHT_GRADS:
        tl.store(part_row, sum_gx, mask=col_ok)
        tl.store(part_row + part_plane, sum_g, mask=col_ok)
    if BIAS_GRAD:
        tl.store(part_row + 2 * part_plane, sum_dz, mask=col_ok)


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
    s0 = tl.zeros((BLOCK_N,), tl.float32)
    s1 = tl.zeros((BLOCK_N,), tl.float32)
    s2 = tl.zeros((BLOCK_N,), tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_ok[None, :]
        ptrs = PART + rows.to(tl.int64)[:, None] * N + cols[None, :]
        if DO0:
            s0 += tl.sum(tl.load(ptrs, mask=mask, other=0.0), axis=0)
        if DO1:
            s1 += tl.sum(tl.load(ptrs + part_plane, mask=mask, other=0.0), axis=0)
        if DO2:
            s2 += tl.sum(tl.load(ptrs + 2 * part_plane, mask=mask, other=0.0), axis=0)
    if DO0:
        tl.store(OUT0 + cols, s0.to(OUT0.dtype.element_ty), mask=col_ok)
    if DO1:
        tl.store(OUT1 + cols, s1.to(OUT1.dtype.element_ty), mask=col_ok)
    if DO2:
        tl.store(OUT2 + cols, s2.to(OUT2.dtype.element_ty), mask=col_ok)
