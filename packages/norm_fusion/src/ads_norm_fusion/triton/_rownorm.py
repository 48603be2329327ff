"""GEMM with a row norm (or its backward) over the GEMM's output width in the epilogue.

One program owns ``BLOCK_M`` whole rows. It walks the ``BLOCK_N``-wide column tiles once (phase 1):
GEMM tile, per-row partial statistics merged into running ones, tile staged in ``OUT``. Once the
row statistics are final it walks them again (phase 2): reads its own staged tiles back (still in L2),
normalises and overwrites them. When the row fits one tile (``SINGLE``) the accumulator is normalised
in registers and nothing is staged. No program waits for another, so any grid is deadlock-free.
``rownorm_persistent_kernel`` is the same forward (modes 0, 1, 4) on a persistent grid, the default
for rows wider than one tile up to ``config.PERSISTENT_MAX_N``; ``rownorm_kernel`` serves the rest.

Modes (``MODE``):
  0 LayerNorm forward: z = A·B (+ bias); mean/rstd over N (Chan's merge of per-tile mean and M2);
    y = (z - mean)·rstd·γ + β. Tiles are staged shifted by the first tile's mean, so the staged
    rounding is relative to the row's spread, not its offset.
  1 RMSNorm forward: y = z·rsqrt(mean(z²) + eps)·γ.
  2 LayerNorm backward: g = A·B (or A itself without a GEMM); ĝ = g·γ;
    dz = rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)).
  3 RMSNorm backward: dz = rrms·(ĝ - x̂·mean(ĝ·x̂)); x̂ = AUX·rrms when ``AUX_RAW`` (AUX is the raw input).
  Modes 2 and 3 with ``AUX_RAW``: x̂ = (AUX - XOFF)·rstat, XOFF the per-row offset (LayerNorm only).
  Modes 2 and 3 with ``SAVE_XHAT``: XHAT gets x̂·γ (what ``rmsnorm_linear``'s dW multiplies by dy).
  4 plain GEMM (no norm; the benchmark's measure of this kernel's GEMM alone).
Backward modes can write deterministic per-row-block partial sums: ``PART[0] = Σ_rows g·x̂`` (dγ),
``PART[1] = Σ_rows g`` (dβ), ``PART[2] = Σ_rows dz`` (the GEMM bias gradient), each (row blocks, N).
Row and pointer offsets are int64: M·N passes 2^31 at the benchmark's largest shapes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gemm_tile(
    a_desc, b_desc, off_m, off_n, K, B_TRANS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = a_desc.load([off_m, k])
        if B_TRANS:
            acc = tl.dot(a, b_desc.load([off_n, k]).T, acc)
        else:
            acc = tl.dot(a, b_desc.load([k, off_n]), acc)
    return acc


@triton.jit
def _load_f32(ptr, rows64, cols, stride, mask):
    return tl.load(ptr + rows64[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _vec_f32(ptr, cols, col_ok, HAS: tl.constexpr, default: tl.constexpr):
    if HAS:
        return tl.load(ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    else:
        return tl.full(cols.shape, default, tl.float32)


@triton.jit
def _tile_value(
    A, a_desc, b_desc, BIAS, off_m, off_n, rows64, cols, col_ok, mask, K, stride_a, MODE: tl.constexpr,
    HAS_GEMM: tl.constexpr, B_TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """The fp32 tile the norm acts on: z = A·B + bias (forward), g = A·B or A (backward)."""
    if HAS_GEMM:
        v = _gemm_tile(a_desc, b_desc, off_m, off_n, K, B_TRANS, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
    else:
        v = _load_f32(A, rows64, cols, stride_a, mask)
    if MODE < 2 and HAS_BIAS:
        v += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return v


@triton.jit
def _update(
    v, mask, cols, col_ok, rows64, off_n, is_first, count, mean, acc1, acc2, shift, rstat, N, GAMMA, AUX,
    PART_ROW, part_plane, stride_aux, MODE: tl.constexpr, HAS_GAMMA: tl.constexpr, AUX_RAW: tl.constexpr,
    WEIGHT_GRADS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Merges one tile into the running row statistics; returns them and the tile to stage."""
    if MODE == 4:
        staged = v
    elif MODE == 0:
        n_j = tl.minimum(N - off_n, BLOCK_N).to(tl.float32)
        mean_j = tl.sum(tl.where(mask, v, 0.0), axis=1) / n_j
        d = tl.where(mask, v - mean_j[:, None], 0.0)
        m2_j = tl.sum(d * d, axis=1)
        total = count + n_j
        delta = mean_j - mean
        mean += delta * (n_j / total)
        acc1 += m2_j + delta * delta * (count * n_j / total)
        count = total
        shift = tl.where(is_first, mean_j, shift)
        staged = v - shift[:, None]
    elif MODE == 1:
        acc1 += tl.sum(v * v, axis=1)
        staged = v
    else:
        gamma = _vec_f32(GAMMA, cols, col_ok, HAS_GAMMA, 1.0)
        xh = _load_f32(AUX, rows64, cols, stride_aux, mask)
        if AUX_RAW:
            xh = (xh - mean[:, None]) * rstat[:, None]
        staged = v * gamma[None, :]
        if MODE == 2:
            acc1 += tl.sum(staged, axis=1)
        acc2 += tl.sum(staged * xh, axis=1)
        if WEIGHT_GRADS:
            tl.store(PART_ROW + cols, tl.sum(v * xh, axis=0), mask=col_ok)
            if MODE == 2:
                tl.store(PART_ROW + part_plane + cols, tl.sum(v, axis=0), mask=col_ok)
    return count, mean, acc1, acc2, shift, staged


@triton.jit
def _emit(
    w, mask, cols, col_ok, rows64, mean, shift, rstat, mean_g, mean_gx, GAMMA, BETA, AUX, OUT, XHAT,
    PART_ROW, part_plane, stride_aux, stride_out, MODE: tl.constexpr, HAS_GAMMA: tl.constexpr,
    HAS_BETA: tl.constexpr, SAVE_XHAT: tl.constexpr, AUX_RAW: tl.constexpr, BIAS_GRAD: tl.constexpr,
):  # fmt: skip
    """Normalises one staged tile (forward: y and optionally x̂; backward: dz) and stores it."""
    out_ptrs = OUT + rows64[:, None] * stride_out + cols[None, :]
    if MODE == 4:
        tl.store(out_ptrs, w.to(OUT.dtype.element_ty), mask=mask)
    elif MODE < 2:
        if MODE == 0:
            xh = (w + (shift - mean)[:, None]) * rstat[:, None]
        else:
            xh = w * rstat[:, None]
        if SAVE_XHAT:
            tl.store(
                XHAT + rows64[:, None] * stride_out + cols[None, :], xh.to(XHAT.dtype.element_ty), mask=mask
            )
        y = xh * _vec_f32(GAMMA, cols, col_ok, HAS_GAMMA, 1.0)[None, :]
        if HAS_BETA:
            y += _vec_f32(BETA, cols, col_ok, True, 0.0)[None, :]
        tl.store(out_ptrs, y.to(OUT.dtype.element_ty), mask=mask)
    else:
        xh = _load_f32(AUX, rows64, cols, stride_aux, mask)
        if AUX_RAW:
            xh = (xh - mean[:, None]) * rstat[:, None]
        if MODE == 2:
            dz = (w - mean_g[:, None] - xh * mean_gx[:, None]) * rstat[:, None]
        else:
            dz = (w - xh * mean_gx[:, None]) * rstat[:, None]
        tl.store(out_ptrs, dz.to(OUT.dtype.element_ty), mask=mask)
        if SAVE_XHAT:  # x̂·γ, the operand of rmsnorm_linear's dW: x is in registers here already
            xg = xh * _vec_f32(GAMMA, cols, col_ok, HAS_GAMMA, 1.0)[None, :]
            tl.store(
                XHAT + rows64[:, None] * stride_out + cols[None, :], xg.to(XHAT.dtype.element_ty), mask=mask
            )
        if BIAS_GRAD:
            tl.store(PART_ROW + 2 * part_plane + cols, tl.sum(dz, axis=0), mask=col_ok)


@triton.jit
def _bwd_single(
    v, off_m, cols, col_ok, xoff, rstat, nf, GAMMA, AUX, OUT, XHAT, PART_ROW, part_plane, M, N, stride_aux,
    stride_out, MODE: tl.constexpr, HAS_GAMMA: tl.constexpr, AUX_RAW: tl.constexpr,
    WEIGHT_GRADS: tl.constexpr, BIAS_GRAD: tl.constexpr, SAVE_XHAT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Modes 2 and 3 when the row is one tile: what ``_update`` then ``_emit`` compute, with x̂ read
    once, each tile-sized value dead as soon as it is used, and x̂ in / dz and x̂·γ out through tensor
    descriptors (bounds in the descriptor: no per-element 64-bit addresses or masks in registers;
    the two-step form with pointer tiles spilled hundreds of registers at 128 x 256)."""
    aux_desc = tl.make_tensor_descriptor(AUX, [M, N], [stride_aux, 1], [BLOCK_M, BLOCK_N])
    out_desc = tl.make_tensor_descriptor(OUT, [M, N], [stride_out, 1], [BLOCK_M, BLOCK_N])
    gamma = _vec_f32(GAMMA, cols, col_ok, HAS_GAMMA, 1.0)
    xh = aux_desc.load([off_m, 0]).to(tl.float32)
    if AUX_RAW:
        xh = (xh - xoff[:, None]) * rstat[:, None]
    if WEIGHT_GRADS:  # rows past M: zeros from the descriptor and from the GEMM
        tl.store(PART_ROW + cols, tl.sum(v * xh, axis=0), mask=col_ok)
        if MODE == 2:
            tl.store(PART_ROW + part_plane + cols, tl.sum(v, axis=0), mask=col_ok)
    g = v * gamma[None, :]
    mean_gx = tl.sum(g * xh, axis=1) / nf
    if MODE == 2:
        dz = (g - (tl.sum(g, axis=1) / nf)[:, None] - xh * mean_gx[:, None]) * rstat[:, None]
    else:
        dz = (g - xh * mean_gx[:, None]) * rstat[:, None]
    out_desc.store([off_m, 0], dz.to(OUT.dtype.element_ty))
    if SAVE_XHAT:
        xg_desc = tl.make_tensor_descriptor(XHAT, [M, N], [stride_out, 1], [BLOCK_M, BLOCK_N])
        xg_desc.store([off_m, 0], (xh * gamma[None, :]).to(XHAT.dtype.element_ty))
    if BIAS_GRAD:
        tl.store(PART_ROW + 2 * part_plane + cols, tl.sum(dz, axis=0), mask=col_ok)


@triton.jit
def rownorm_kernel(
    A, B, BIAS, GAMMA, BETA, AUX, OUT, XHAT, STAT1, STAT2, PART, XOFF, M, N, K, eps, part_plane, stride_a,
    stride_b, stride_aux, stride_out, MODE: tl.constexpr, HAS_GEMM: tl.constexpr, B_TRANS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr, SAVE_XHAT: tl.constexpr,
    AUX_RAW: tl.constexpr, WEIGHT_GRADS: tl.constexpr, BIAS_GRAD: tl.constexpr, SINGLE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
    FLATTEN: tl.constexpr, STAGE_XHAT: tl.constexpr = False,
):  # fmt: skip
    """One program per row block (modes above); a one-tile backward runs ``_bwd_single``. Forward
    ``STAGE_XHAT``: the staged tiles go to XHAT and stay there (x̂ = (XHAT - XOFF)·rstat, XOFF =
    mean - shift per row; RMSNorm: XHAT·rrms), as in ``rownorm_persistent_kernel``. Backward
    ``AUX_RAW``: AUX is such a staged z (or, RMSNorm, the raw input), x̂ = (AUX - XOFF)·rstat; XOFF is
    read for LayerNorm only."""
    if STAGE_XHAT:
        stage = XHAT
    else:
        stage = OUT
    pid = tl.program_id(0)
    off_m = pid * BLOCK_M
    rows = off_m + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    a_desc = A
    b_desc = B
    if HAS_GEMM:
        a_desc = tl.make_tensor_descriptor(A, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
        if B_TRANS:  # B is (N, K): nn.Linear's weight
            b_desc = tl.make_tensor_descriptor(B, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
        else:  # B is (K, N)
            b_desc = tl.make_tensor_descriptor(B, [K, N], [stride_b, 1], [BLOCK_K, BLOCK_N])
    part_row = PART + pid.to(tl.int64) * N
    rstat = tl.zeros((BLOCK_M,), tl.float32)
    BACKWARD: tl.constexpr = MODE == 2 or MODE == 3  # not the plain-GEMM mode 4
    if BACKWARD:
        rstat = tl.load(STAT2 + rows, mask=row_ok, other=0.0)
    count = tl.sum(tl.zeros((1,), tl.float32), axis=0)
    mean = tl.zeros((BLOCK_M,), tl.float32)  # mode 0: running mean; mode 2 with AUX_RAW: AUX's offset
    if MODE == 2 and AUX_RAW:
        mean = tl.load(XOFF + rows, mask=row_ok, other=0.0)
    acc1 = tl.zeros((BLOCK_M,), tl.float32)  # mode 0: M2; mode 1: Σz²; mode 2: Σĝ
    acc2 = tl.zeros((BLOCK_M,), tl.float32)  # modes 2/3: Σĝ·x̂
    shift = tl.zeros((BLOCK_M,), tl.float32)
    nf = N.to(tl.float32)
    if SINGLE:
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        v = _tile_value(
            A, a_desc, b_desc, BIAS, off_m, 0, rows64, cols, col_ok, mask, K, stride_a, MODE, HAS_GEMM,
            B_TRANS, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES,
        )  # fmt: skip
    if SINGLE and BACKWARD:
        _bwd_single(
            v, off_m, cols, col_ok, mean, rstat, nf, GAMMA, AUX, OUT, XHAT, part_row, part_plane, M, N,
            stride_aux, stride_out, MODE, HAS_GAMMA, AUX_RAW, WEIGHT_GRADS, BIAS_GRAD, SAVE_XHAT, BLOCK_M,
            BLOCK_N,
        )  # fmt: skip
    elif SINGLE:
        count, mean, acc1, acc2, shift, w = _update(
            v, mask, cols, col_ok, rows64, 0, True, count, mean, acc1, acc2, shift, rstat, N, GAMMA, AUX,
            part_row, part_plane, stride_aux, MODE, HAS_GAMMA, AUX_RAW, WEIGHT_GRADS, BLOCK_N,
        )  # fmt: skip
        rstat = _finish_stats(acc1, mean, rstat, rows, row_ok, nf, eps, STAT1, STAT2, MODE)
        if STAGE_XHAT:
            _store_staged(XHAT, XOFF, w, mean, shift, rows, rows64, cols, row_ok, mask, stride_out, MODE)
        _emit(
            w, mask, cols, col_ok, rows64, mean, shift, rstat, acc1 / nf, acc2 / nf, GAMMA, BETA, AUX, OUT,
            XHAT, part_row, part_plane, stride_aux, stride_out, MODE, HAS_GAMMA, HAS_BETA, SAVE_XHAT,
            AUX_RAW, BIAS_GRAD,
        )  # fmt: skip
    else:
        # phase 1: statistics, tiles staged in OUT (except a backward without GEMM: dy is re-read)
        for j in tl.range(0, tl.cdiv(N, BLOCK_N), flatten=FLATTEN):
            off_n = j * BLOCK_N
            cols = off_n + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            v = _tile_value(
                A, a_desc, b_desc, BIAS, off_m, off_n, rows64, cols, col_ok, mask, K, stride_a, MODE,
                HAS_GEMM, B_TRANS, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES,
            )  # fmt: skip
            count, mean, acc1, acc2, shift, staged = _update(
                v, mask, cols, col_ok, rows64, off_n, j == 0, count, mean, acc1, acc2, shift, rstat, N,
                GAMMA, AUX, part_row, part_plane, stride_aux, MODE, HAS_GAMMA, AUX_RAW, WEIGHT_GRADS,
                BLOCK_N,
            )  # fmt: skip
            if MODE < 2 or HAS_GEMM:
                tl.store(
                    stage + rows64[:, None] * stride_out + cols[None, :],
                    staged.to(OUT.dtype.element_ty),
                    mask=mask,
                )
        rstat = _finish_stats(acc1, mean, rstat, rows, row_ok, nf, eps, STAT1, STAT2, MODE)
        if STAGE_XHAT and MODE == 0:
            tl.store(XOFF + rows, mean - shift, mask=row_ok)
        # phase 2 reads tiles that other threads of this program staged: make their stores visible
        if MODE != 4:  # the plain-GEMM reference mode stores in phase 1
            tl.debug_barrier()
            for j in range(tl.cdiv(N, BLOCK_N)):
                off_n = j * BLOCK_N
                cols = off_n + tl.arange(0, BLOCK_N)
                col_ok = cols < N
                mask = row_ok[:, None] & col_ok[None, :]
                if MODE < 2 or HAS_GEMM:
                    w = _load_f32(stage, rows64, cols, stride_out, mask)
                else:
                    w = (
                        _load_f32(A, rows64, cols, stride_a, mask)
                        * _vec_f32(GAMMA, cols, col_ok, HAS_GAMMA, 1.0)[None, :]
                    )
                _emit(
                    w, mask, cols, col_ok, rows64, mean, shift, rstat, acc1 / nf, acc2 / nf, GAMMA, BETA,
                    AUX, OUT, XHAT, part_row, part_plane, stride_aux, stride_out, MODE, HAS_GAMMA,
                    HAS_BETA, SAVE_XHAT, AUX_RAW, BIAS_GRAD,
                )  # fmt: skip


@triton.jit
def _store_staged(XHAT, XOFF, w, mean, shift, rows, rows64, cols, row_ok, mask, stride, MODE: tl.constexpr):
    """A single-tile training forward keeps its staged tile (and, LayerNorm, the row offset) as the
    saved pre-norm value, as the multi-tile forwards do by staging in XHAT."""
    tl.store(XHAT + rows64[:, None] * stride + cols[None, :], w.to(XHAT.dtype.element_ty), mask=mask)
    if MODE == 0:
        tl.store(XOFF + rows, mean - shift, mask=row_ok)


@triton.jit
def _finish_stats(acc1, mean, rstat, rows, row_ok, nf, eps, STAT1, STAT2, MODE: tl.constexpr):
    """Forward: rstd (LayerNorm, biased variance) or rrms from the merged sums, stored per row.
    Backward: the saved statistic, unchanged."""
    if MODE < 2:
        rstat = tl.rsqrt(acc1 / nf + eps)
        if MODE == 0:
            tl.store(STAT1 + rows, mean, mask=row_ok)
        tl.store(STAT2 + rows, rstat, mask=row_ok)
    return rstat


@triton.jit
def _cta_barrier(SYNC_ASM: tl.constexpr):
    """A CTA-wide barrier (``bar.sync 0``, which also orders the threads' earlier memory accesses
    before their later ones) that returns 0, to be added to the offsets of the loads it must precede.
    As inline assembly, unlike ``tl.debug_barrier``, it leaves the loop to Triton's software
    pipeliner. The interpreter (``SYNC_ASM`` off) runs programs sequentially and needs none."""
    if SYNC_ASM:
        dep = tl.inline_asm_elementwise(
            "bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [tl.full((1,), 0, tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip
    else:
        dep = tl.zeros((1,), tl.int32)
    return tl.sum(dep, axis=0).to(tl.int64)


@triton.jit
def rownorm_persistent_kernel(
    A, B, BIAS, GAMMA, BETA, OUT, XHAT, STAT1, STAT2, XOFF, M, N, K, eps, stride_a, stride_b, stride_out,
    MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr,
    SAVE_XHAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_PROGS: tl.constexpr, FLATTEN: tl.constexpr, SYNC_ASM: tl.constexpr, STAGE_XHAT: tl.constexpr = False,
):  # fmt: skip
    """Persistent forward (modes 0, 1 and the plain GEMM 4) for rows wider than one column tile.

    ``NUM_PROGS`` programs; program p owns row blocks p, p + NUM_PROGS, ... and walks its (row block,
    column tile) steps in one loop, so the TMA/wgmma pipeline runs on across column tiles and row
    blocks. Step (i, j): GEMM tile j of row block i, its statistics merged (Chan) and the tile staged
    in OUT (shifted, as in ``rownorm_kernel``); then tile j of the program's previous row block i - 1,
    whose statistics are final, is read back (L2: it was staged ``cdiv(N, BLOCK_N)`` steps ago) and
    normalised. The last row block is normalised after the loop. Each program reads back only what
    its own threads staged, so any grid is deadlock-free. Needs ``NUM_PROGS <= cdiv(M, BLOCK_M)``.
    ``STAGE_XHAT`` (a training forward): the tiles are staged in XHAT instead of OUT and stay there
    for the backward, with the per-row offset ``mean - shift`` in XOFF (LayerNorm), so that
    x̂ = (XHAT - XOFF)·rstd (RMSNorm: XHAT·rrms) costs no store beyond the no-grad forward's.
    """
    if STAGE_XHAT:
        stage = XHAT
    else:
        stage = OUT
    pid = tl.program_id(0)
    num_rb = tl.cdiv(M, BLOCK_M)
    nt = tl.cdiv(N, BLOCK_N)
    my_blocks = tl.cdiv(num_rb - pid, NUM_PROGS)
    k_tiles = tl.cdiv(K, BLOCK_K)
    a_desc = tl.make_tensor_descriptor(A, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(B, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
    nf = N.to(tl.float32)
    zero = tl.zeros((BLOCK_M,), tl.float32)
    mean = zero  # running mean (mode 0) of the current row block
    acc1 = zero  # running M2 (mode 0) or Σz² (mode 1)
    shift = zero  # mode 0: the first tile's mean, subtracted from the staged tiles
    p_mean = zero  # final statistics of the previous row block
    p_shift = zero
    p_rstat = zero
    for s in tl.range(0, my_blocks * nt, flatten=FLATTEN):
        i = s // nt
        off_m = (pid + i * NUM_PROGS) * BLOCK_M
        off_n = (s - i * nt) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            acc = tl.dot(a, b_desc.load([off_n, ki * BLOCK_K]).T, acc)
        # epilogue (coordinates recomputed so the pipeliner need not keep them live across the K loop)
        i = s // nt
        j = s - i * nt
        off_m = (pid + i * NUM_PROGS) * BLOCK_M
        off_n = j * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        rows64 = rows.to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]
        v = acc
        if HAS_BIAS:
            v += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if MODE == 4:
            tl.store(
                OUT + rows64[:, None] * stride_out + cols[None, :], v.to(OUT.dtype.element_ty), mask=mask
            )
        else:
            first = j == 0
            last = j == nt - 1
            if MODE == 0:
                n_j = tl.minimum(N - off_n, BLOCK_N).to(tl.float32)
                count = off_n.to(tl.float32)  # columns merged before this tile (all earlier tiles are full)
                mean_j = tl.sum(tl.where(mask, v, 0.0), axis=1) / n_j
                d = tl.where(mask, v - mean_j[:, None], 0.0)
                m2_j = tl.sum(d * d, axis=1)
                total = count + n_j
                mean = tl.where(first, 0.0, mean)
                delta = mean_j - mean
                mean += delta * (n_j / total)
                acc1 = tl.where(first, 0.0, acc1) + (m2_j + delta * delta * (count * n_j / total))
                shift = tl.where(first, mean_j, shift)
                staged = v - shift[:, None]
            else:
                acc1 = tl.where(first, 0.0, acc1) + tl.sum(v * v, axis=1)
                staged = v
            tl.store(
                stage + rows64[:, None] * stride_out + cols[None, :],
                staged.to(OUT.dtype.element_ty),
                mask=mask,
            )
            rstat = tl.rsqrt(acc1 / nf + eps)
            stat_ok = row_ok & last
            if MODE == 0:
                tl.store(STAT1 + rows, mean, mask=stat_ok)
                if STAGE_XHAT:
                    tl.store(XOFF + rows, mean - shift, mask=stat_ok)
            tl.store(STAT2 + rows, rstat, mask=stat_ok)
            # tile j of the previous row block (full rows: only the last row block can be partial)
            # its staged values were stored by other threads of this program: a CTA barrier first
            prev64 = rows64 - NUM_PROGS * BLOCK_M + _cta_barrier(SYNC_ASM)
            prev_mask = (i > 0) & col_ok[None, :] & (prev64 >= 0)[:, None]
            w = _load_f32(stage, prev64, cols, stride_out, prev_mask)
            _emit(
                w, prev_mask, cols, col_ok, prev64, p_mean, p_shift, p_rstat, p_rstat, p_rstat, GAMMA,
                BETA, OUT, OUT, XHAT, STAT2, 0, 0, stride_out, MODE, HAS_GAMMA, HAS_BETA, SAVE_XHAT,
                False, False,
            )  # fmt: skip
            p_mean = tl.where(last, mean, p_mean)
            p_shift = tl.where(last, shift, p_shift)
            p_rstat = tl.where(last, rstat, p_rstat)
    if MODE != 4:
        tl.debug_barrier()
        rows = (pid + (my_blocks - 1) * NUM_PROGS) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        rows64 = rows.to(tl.int64)
        for j in range(nt):
            cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            w = _load_f32(stage, rows64, cols, stride_out, mask)
            _emit(
                w, mask, cols, col_ok, rows64, p_mean, p_shift, p_rstat, p_rstat, p_rstat, GAMMA, BETA,
                OUT, OUT, XHAT, STAT2, 0, 0, stride_out, MODE, HAS_GAMMA, HAS_BETA, SAVE_XHAT, False,
                False,
            )  # fmt: skip
