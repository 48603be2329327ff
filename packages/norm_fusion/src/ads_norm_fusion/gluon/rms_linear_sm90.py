"""``rmsnorm_linear`` forward for Hopper (sm_90) in Gluon: y = rrms·(x·W_fᵀ) (+ bias), with
rrms = rsqrt(mean_K(x²) + eps) summed from the A tiles the GEMM already has in shared memory.

The norm is over the GEMM's reduction dim, so it is a per-row scale of a plain GEMM (γ is folded into
W_f by the caller). The Triton path computes rrms in a row pass over x before its GEMM (one more read
of x) or, in its single kernel, from A tiles loaded into the MMA warps' registers inside a software-
pipelined K loop. Here the GEMM is warp specialised as ``fwd_sm90``'s: a one-warp TMA producer
(``fwd_sm90._ws_loads``) feeds two MMA warpgroups (64 rows each of a 128-row block) through a ring of
A/B stages; each warpgroup, while its wgmma of a K step runs, reads its 64 rows of that step's A tile
back from shared memory and adds their squares to its rows' sums (shared-memory reads the tensor
cores are not waiting on), so x crosses global memory once.

``SPLIT`` programs share each row block, program h holding ``NT`` column tiles of ``BN`` columns
from column h·NT·BN; each program sums x² itself during its first column tile (no exchange between
programs: the sums are cheap, a wait would not be). The epilogue scales the fp32 accumulator,
adds the bias and sends the tile to y with one TMA store per warpgroup from a 64 × BN staging tile,
whose store is awaited only before the staging tile's next use. Tiles past N (where NT·SPLIT tiles
overrun N) load zeros and their stores are dropped by TMA; rows past M likewise. Needs
(``dispatch.rms_linear_why_not``): K and N multiples of 8, 16-byte aligned row-major tensors.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
)

from ads_kernel_tools.kernels.gluon_hopper import init_ring
from ads_kernel_tools.kernels.launch_cache import LaunchCache

from .fwd_sm90 import (
    _SMEM_SPARE,
    BLOCK_K,
    BLOCK_M,
    MAX_STAGES,
    SMEM_BYTES,
    _ab_smem,
    _acc_layout,
    _desc,
    _mma_steps,
    _program,
    _ws_loads,
    grid_and_exchange,
)


@gluon.constexpr_function
def _sq_layout(bk):
    """Registers of an A tile read back for Σx²: 16-byte runs of a row per thread (one swizzle
    chunk), ``bk``/8 lanes across a K step, four warps down the rows."""
    return gl.BlockedLayout([1, 8], [32 * 8 // bk, bk // 8], [4, 1], [1, 0])


@gluon.jit
def _scaled_store(acc, rrms, y_tile, out_desc, bias_ptr, off_m, off_n, N, HAS_BIAS: gl.constexpr):
    """y = acc·rrms (+ bias) of the tile at (off_m, off_n) to y by one TMA store from ``y_tile``,
    once the staging tile's previous store has read it (awaited here, not after the store)."""
    col_l: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
    y = acc * gl.expand_dims(rrms, 1)
    if HAS_BIAS:
        cols = off_n + gl.arange(0, acc.shape[1], col_l)
        y = y + gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32), 0)
    tma.store_wait(0)
    gl.thread_barrier()
    y_tile.store(y.to(y_tile.dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(out_desc, [off_m, off_n], y_tile)


@gluon.jit
def _scaled_rows(args, WG: gl.constexpr, HAS_BIAS: gl.constexpr, NT: gl.constexpr, STAGES: gl.constexpr,
                 SPLIT: gl.constexpr):  # fmt: skip
    """MMA warpgroup WG: rows [WG·64, WG·64 + 64) of every row block of this program, each of its
    column tiles computed, scaled by the rows' rrms, biased and stored; rrms written by part 0."""
    (a_smem, b_smem, y_smem, ready, empty, out_desc, bias_ptr, rrms_ptr, M, N, K, eps) = args
    BM: gl.constexpr = a_smem.shape[1]
    BK: gl.constexpr = a_smem.shape[2]
    R: gl.constexpr = y_smem.shape[1]
    BN: gl.constexpr = y_smem.shape[2]
    acc_l: gl.constexpr = _acc_layout(BN, 4)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    sq_l: gl.constexpr = _sq_layout(BK)
    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * (NT * BN)
    k_tiles = gl.cdiv(K, BK)
    inv_k = 1.0 / K.to(gl.float32)
    y_tile = y_smem.index(WG)
    s = 0
    ph = 0
    for i in range(my_blocks):
        off_m = (pid + i * nprog) * BM + WG * R
        sq = gl.zeros([R], gl.float32, gl.SliceLayout(1, sq_l))
        rrms = gl.zeros([R], gl.float32, row_l)
        for j in range(NT):
            acc = gl.zeros([R, BN], gl.float32, acc_l)
            acc, s, ph, sq = _mma_steps(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, sq, j == 0, WG,
                                        STAGES, True, True)  # fmt: skip
            if j == 0:
                rrms = gl.convert_layout(gl.rsqrt(sq * inv_k + eps), row_l)
                rows = off_m + gl.arange(0, R, row_l)
                gl.store(rrms_ptr + rows, rrms, mask=(rows < M) & (half == 0))
            _scaled_store(acc, rrms, y_tile, out_desc, bias_ptr, off_m, col0 + j * BN, N, HAS_BIAS)
    tma.store_wait(0)


@gluon.jit
def rms_linear_fwd_kernel(
    a_desc, b_desc, out_desc, bias_ptr, rrms_ptr, M, N, K, eps, HAS_BIAS: gl.constexpr, NT: gl.constexpr,
    STAGES: gl.constexpr, SPLIT: gl.constexpr, MMA_REGS: gl.constexpr = 232, LOAD_REGS: gl.constexpr = 24,
):  # fmt: skip
    """y (M, N) = rrms·(a·bᵀ) (+ bias), rrms (M,) fp32 = rsqrt(mean_K(a²) + eps), for a (M, K) and b
    (N, K). Launched with 4 warps (the first MMA warpgroup); ``a_desc`` has 128-row boxes,
    ``b_desc`` and ``out_desc`` (64-row boxes) ``BN`` columns. The grid is a multiple of ``SPLIT``."""
    dtype: gl.constexpr = a_desc.dtype
    BN: gl.constexpr = b_desc.block_type.shape[0]
    R: gl.constexpr = out_desc.block_type.shape[0]
    a_smem, b_smem = _ab_smem(a_desc, b_desc, STAGES)
    y_smem = gl.allocate_shared_memory(dtype, [2, R, BN], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_ring(ready, empty, STAGES, 2)
    fence_async_shared()

    args = (a_smem, b_smem, y_smem, ready, empty, out_desc, bias_ptr, rrms_ptr, M, N, K, eps)
    largs = (a_desc, b_desc, a_smem, b_smem, ready, empty, M, K, NT, STAGES, SPLIT)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize(
        [
            (_scaled_rows, (args, WG0, HAS_BIAS, NT, STAGES, SPLIT)),
            (_scaled_rows, (args, WG1, HAS_BIAS, NT, STAGES, SPLIT)),
            (_ws_loads, largs),
        ],
        [4, 1],
        [MMA_REGS, LOAD_REGS],
    )


def block_n(n: int) -> int:
    """Column tile width: 256 (128 × 256 tiles, cuBLAS's bytes per FLOP) unless N is at most 128."""
    return 128 if n <= 128 else 256


def stages_for(bn: int) -> int:
    """TMA ring depth beside the two 64 × ``bn`` staging tiles."""
    per_stage = (2 * BLOCK_M + bn) * BLOCK_K * 2
    return min(MAX_STAGES, (SMEM_BYTES - 2 * BLOCK_M * bn * 2 - _SMEM_SPARE) // per_stage)


def split_for(n: int, bn: int, nt: int, num_sms: int) -> int:
    """Programs per row block: the column tiles shared ``nt`` to a program, at most the SMs."""
    tiles = -(-n // bn)
    return min(-(-tiles // nt), num_sms)


def forward(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, rrms: torch.Tensor, *,
            bias: torch.Tensor | None, eps: float, num_sms: int, nt: int = 1) -> None:  # fmt: skip
    """out (M, N) = rrms·(x @ wᵀ) (+ bias) and rrms (M,) fp32; x (M, K), w (N, K) with γ folded in.
    ``nt``: column tiles per program (``config.rms_gluon_nt``); the caller checked
    ``dispatch.rms_linear_why_not``."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0:
        return
    bn = block_n(n)
    split = split_for(n, bn, nt, num_sms)
    tiles = -(-n // bn)
    nt = -(-tiles // split)  # the tiles a program walks, after split_for's cap at the SMs
    bm = 2 * BLOCK_M
    programs, _, _ = grid_and_exchange(m, bm, split, num_sms, x.device, flags_per_block=0)
    _LAUNCH.launch((programs,), (
        _desc(x, bm, BLOCK_K), _desc(w, bn, BLOCK_K), _desc(out, BLOCK_M, bn),
        bias if bias is not None else rrms, rrms, m, n, k, float(eps),
    ), dict(
        HAS_BIAS=bias is not None, NT=nt, STAGES=stages_for(bn), SPLIT=split, num_warps=4,
    ))  # fmt: skip


# relaunched without Triton's per-call argument binding (host time of calls of ~0.2 ms)
_LAUNCH = LaunchCache(rms_linear_fwd_kernel)
