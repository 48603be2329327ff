"""``out = x · r[row] · g[col]`` in one pass (fp32 math, one rounding): the normalised, weighted input
``rmsnorm_linear``'s weight gradient needs, without the fp32 temporaries eager PyTorch would make."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_col_scale_kernel(
    X, R, G, OUT, M, K, stride_x, stride_out,
    HAS_G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < K
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = x * tl.load(R + rows, mask=row_ok, other=0.0)[:, None]
    if HAS_G:
        y = y * tl.load(G + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + rows64[:, None] * stride_out + cols[None, :], y.to(OUT.dtype.element_ty), mask=mask)
