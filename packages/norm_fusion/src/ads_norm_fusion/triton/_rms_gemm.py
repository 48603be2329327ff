"""``rmsnorm_linear`` kernels: ``RMSNorm(x)·Wᵀ = diag(rrms)·(x·(W·γ)ᵀ)`` (spec B5).

The norm is over the GEMM's reduction dim K, so it is a per-row scale of a plain GEMM:
- ``row_stat_kernel`` makes the per-row scalars in one cheap pass over a row-major matrix:
  mode 0 (forward) ``rrms = rsqrt(mean_K(x²) + eps)`` from x (M×K);
  mode 1 (backward) ``coef = rrms²·Σ_n dy·(y − b) / K`` from dy and the saved output y (M×N), the
  ``mean_K(ĝ·x̂)`` of the RMSNorm backward without a row reduction over K (BENCHMARKS.md).
- ``scaled_gemm_kernel`` is a persistent, TMA-fed, output-tiled GEMM (tiles visited in groups of
  ``GROUP_M`` row blocks so that neighbouring programs share B tiles in L2) whose epilogue applies
  the per-row scalars: forward ``y = rrms·acc (+ bias)`` (acc = x·W_fᵀ, γ already folded into W_f);
  backward ``dx = rrms·γ·acc − x·coef`` (acc = dy·W) with ``Σ_rows acc·x·rrms`` per row block, the
  deterministic partials of dγ. No program needs another's result and no Σx² is recomputed per
  column tile. When one tile spans the row (K <= 256) the backward forms coef in its epilogue.
``rms_gemm_kernel`` is the earlier single-kernel forward (0.1.0): a non-persistent output-tiled GEMM
that accumulates Σx² in fp32 from the A tiles it loads, in every column tile. It stays the forward
for K < 1024, where the row pass + persistent GEMM measured slower on the H200 (BENCHMARKS.md).
Row and pointer offsets are int64: M·N passes 2^31 at the benchmark's largest shapes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_stat_kernel(
    A, B, BIAS, R, OUT, M, N, stride_a, stride_b, inv_n, eps, MODE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        a = tl.load(A + rows64[:, None] * stride_a + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if MODE == 0:
            acc += a * a
        else:
            b = tl.load(B + rows64[:, None] * stride_b + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                b -= tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            acc += a * b
    total = tl.sum(acc, axis=1) * inv_n
    if MODE == 0:
        out = tl.rsqrt(total + eps)
    else:
        r = tl.load(R + rows, mask=row_ok, other=0.0)
        out = total * r * r
    tl.store(OUT + rows, out, mask=row_ok)


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_rows
    pid_n = (tile % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def scaled_gemm_kernel(
    A, B, ALPHA, GAMMA, BIAS, AUX, COEF, OUT, PART, M, N, K, stride_a, stride_b, stride_aux, stride_out,
    B_TRANS: tl.constexpr, HAS_GAMMA: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_AUX: tl.constexpr,
    PART_GRADS: tl.constexpr, TMA_STORE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGS: tl.constexpr, FLATTEN: tl.constexpr,
    ROW_COEF: tl.constexpr = False, AUX_DESC: tl.constexpr = False,
):  # fmt: skip
    """OUT (M, N) = ALPHA[m]·(A·B)[m, n]·GAMMA[n] (+ BIAS[n]) (− AUX[m, n]·COEF[m]).

    A (M, K); B (N, K) when ``B_TRANS`` (nn.Linear's weight) else (K, N). ``PART_GRADS`` (needs
    ``HAS_AUX``): PART[pid_m, n] = Σ_rows (A·B)·AUX·ALPHA over the tile's rows, one row per row block.
    ``TMA_STORE`` (no AUX, no PART): the output tile leaves through a TMA store (clipped at the edges).
    ``ROW_COEF`` (needs ``HAS_AUX`` and ``BLOCK_N >= N``: one tile holds whole rows): COEF is not read
    but formed from the tile, ``ALPHA²·Σ_n y·AUX / N`` with y = ALPHA·(A·B)·GAMMA; for the RMSNorm
    backward (A = dy, B = W, AUX = x, ALPHA = rrms) this is the coefficient that ``row_stat_kernel``
    mode 1 makes from the saved output, here without that pass over dy and y. ``AUX_DESC`` (needs
    ``HAS_AUX``): AUX read and OUT written through tensor descriptors (TMA), bounds in the descriptor.
    """
    start = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    a_desc = tl.make_tensor_descriptor(A, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
    if B_TRANS:
        b_desc = tl.make_tensor_descriptor(B, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B, [K, N], [stride_b, 1], [BLOCK_K, BLOCK_N])
    if TMA_STORE:
        out_desc = tl.make_tensor_descriptor(OUT, [M, N], [stride_out, 1], [BLOCK_M, BLOCK_N // 2])
    if AUX_DESC:
        aux_desc = tl.make_tensor_descriptor(AUX, [M, N], [stride_aux, 1], [BLOCK_M, BLOCK_N])
        dx_desc = tl.make_tensor_descriptor(OUT, [M, N], [stride_out, 1], [BLOCK_M, BLOCK_N])
    for tile in tl.range(start, num_m * num_n, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            if B_TRANS:
                acc = tl.dot(a, b_desc.load([off_n, ki * BLOCK_K]).T, acc)
            else:
                acc = tl.dot(a, b_desc.load([ki * BLOCK_K, off_n]), acc)
        # epilogue (coordinates recomputed so the pipeliner need not keep them live across the K loop)
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        alpha = tl.load(ALPHA + rows, mask=row_ok, other=0.0)
        y = acc * alpha[:, None]
        if HAS_GAMMA:
            y = y * tl.load(GAMMA + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if TMA_STORE:
            halves = tl.permute(tl.reshape(y, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            y0, y1 = tl.split(halves)
            out_desc.store([off_m, off_n], y0.to(OUT.dtype.element_ty))
            out_desc.store([off_m, off_n + BLOCK_N // 2], y1.to(OUT.dtype.element_ty))
        else:
            rows64 = rows.to(tl.int64)
            mask = row_ok[:, None] & col_ok[None, :]
            if HAS_AUX:
                if AUX_DESC:  # rows and columns past the edge read as 0
                    aux = aux_desc.load([off_m, off_n])
                else:
                    aux = tl.load(AUX + rows64[:, None] * stride_aux + cols[None, :], mask=mask, other=0.0)
                aux = aux.to(tl.float32)
                if ROW_COEF:  # masked columns: aux is 0 there
                    coef = tl.sum(y * aux, axis=1) * (alpha * alpha) / N.to(tl.float32)
                else:
                    coef = tl.load(COEF + rows, mask=row_ok, other=0.0)
                y -= aux * coef[:, None]
                if PART_GRADS:
                    part = tl.sum(acc * aux * alpha[:, None], axis=0)
                    tl.store(PART + pid_m.to(tl.int64) * N + cols, part, mask=col_ok)
            if AUX_DESC:
                dx_desc.store([off_m, off_n], y.to(OUT.dtype.element_ty))
            else:
                ptrs = OUT + rows64[:, None] * stride_out + cols[None, :]
                tl.store(ptrs, y.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rms_gemm_kernel(
    A, B, BIAS, OUT, RRMS, M, N, K, eps, stride_a, stride_b, stride_out, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    a_desc = tl.make_tensor_descriptor(A, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(B, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = a_desc.load([off_m, k])
        af = a.to(tl.float32)
        sumsq += tl.sum(af * af, axis=1)
        acc = tl.dot(a, b_desc.load([off_n, k]).T, acc)
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    rrms = tl.rsqrt(sumsq / K.to(tl.float32) + eps)
    y = acc * rrms[:, None]
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ptrs = OUT + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(ptrs, y.to(OUT.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if pid_n == 0:
        tl.store(RRMS + rows, rrms, mask=row_ok)
