"""``RMSNorm(x)·Wᵀ`` as a plain output-tiled GEMM with a per-row scale in the epilogue (spec B5).

The norm is over the GEMM's reduction dim K, so no program needs another's result: each streams all
of K for its rows and accumulates Σx² in fp32 from the A tiles it already loads for the MMA. The
norm's weight is folded into W by the caller. Tiles are visited in groups of ``GROUP_M`` row blocks so
that neighbouring programs share W tiles in L2.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
