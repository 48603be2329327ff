"""``rmsnorm_linear``'s weight gradient straight from the raw input: dW = (dyᵀ · diag(rrms) · x)·diag(γ).

cuBLAS needs x̂·γ = x·rrms·γ as a tensor, one more write and read of an M×K activation. Here the rrms
scale is applied to each x tile in registers between its load and the wgmma, and γ to the finished
(N, K) tile, so the only M-sized traffic is one read of dy and one of x. The reduction runs over M,
so the grid splits M: program (split, tile) sums its split's rows of one (BLOCK_N, BLOCK_K) output tile
into ``PART[split]`` (fp32); the splits are added in a fixed order afterwards (deterministic). Tiles of
one split are adjacent program ids, so they stream the same rows of dy and x at about the same time
and the second reader finds them in L2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_dw_kernel(
    DY, X, RRMS, GAMMA, PART, M, N, K, rows_per_split, stride_dy, stride_x,
    HAS_GAMMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_n * tl.cdiv(K, BLOCK_K)
    split = pid // tiles
    tile = pid - split * tiles
    off_n = (tile % tiles_n) * BLOCK_N
    off_k = (tile // tiles_n) * BLOCK_K
    dy_desc = tl.make_tensor_descriptor(DY, [M, N], [stride_dy, 1], [BLOCK_M, BLOCK_N])
    x_desc = tl.make_tensor_descriptor(X, [M, K], [stride_x, 1], [BLOCK_M, BLOCK_K])
    start = split * rows_per_split
    stop = tl.minimum(start + rows_per_split, M)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m in tl.range(start, stop, BLOCK_M, num_stages=NUM_STAGES):
        rows = m + tl.arange(0, BLOCK_M)
        # splits are whole BLOCK_M steps, so only rows past M fall outside: zeros from the descriptor
        r = tl.load(RRMS + rows, mask=rows < M, other=0.0)
        dy = dy_desc.load([m, off_n])
        xs = (x_desc.load([m, off_k]).to(tl.float32) * r[:, None]).to(dy.dtype)
        acc = tl.dot(dy.T, xs, acc)
    cols = off_k + tl.arange(0, BLOCK_K)
    col_ok = cols < K
    if HAS_GAMMA:
        acc = acc * tl.load(GAMMA + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    n_idx = off_n + tl.arange(0, BLOCK_N)
    ptrs = PART + split.to(tl.int64) * N * K + n_idx[:, None] * K + cols[None, :]
    tl.store(ptrs, acc, mask=(n_idx < N)[:, None] & col_ok[None, :])
