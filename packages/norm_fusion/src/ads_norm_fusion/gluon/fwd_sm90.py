"""``linear_layernorm`` / ``linear_rmsnorm`` forward for Hopper (sm_90) in Gluon, the row block's GEMM
output kept in shared memory.

One persistent program per SM walks its 64-row blocks (row blocks p, p + programs, ...). For each
row block it computes the ``N / BN`` column tiles of z = x·Wᵀ (+ bias) with wgmma (one warpgroup,
64 × BN fp32 accumulator, A/B tiles through a ring of ``STAGES`` TMA buffers whose loads run ahead
across column tiles and row blocks), merges each tile's per-row (mean, M2) into running row
statistics with Chan's formula (RMSNorm: Σz²) and writes the tile, shifted by the first tile's mean
as ``triton._rownorm`` stages it, into a shared-memory buffer that holds the whole row block
(64 × N ≤ 64 × 1024 16-bit values = 128 KB). Once the row is complete each tile is read back,
normalised (and γ, β applied) in place and sent to the output with one TMA store: y crosses global
memory once, where the Triton kernels stage z through the output buffer and read it back.
x̂ (``SAVE_XHAT``, training forwards with an affine norm) goes out through one more 64 × BN buffer.

Off by default (``config.gluon_forward``): a 64-row block streams all of W through the SM, and its
64×128×64 K steps load 24 KB of tiles per MFLOP (43 FLOP/B, half the 85 of the 128×256 tiles of the
Triton kernel and cuBLAS), so the GEMM is the limit: on the H200 it took 422 µs at 65536×1024×1024
against the Triton kernel's 336 (BENCHMARKS.md).

Needs (``dispatch.why_not`` checks on the host): N a multiple of 64 up to 1024, K a multiple of 8
(TMA's 16-byte strides; the K tail of the last 64-wide step is zero-filled by TMA), 16-byte
aligned row-major tensors. Rows past M: TMA loads zeros and drops their stores.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ads_kernel_tools.kernels.gluon_hopper import acc_layout, smem_layout

BLOCK_M = 64  # rows per row block: one warpgroup's wgmma
BLOCK_K = 64
MAX_N = 1024  # the row block's z tiles fill 128 KB of shared memory at 16 bits
SMEM_BYTES = 232448  # sm_90's largest dynamic shared memory per block (227 KB)
_SMEM_SPARE = 2048  # mbarriers and alignment
MAX_STAGES = 4

_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def block_n(n: int) -> int:
    """Column tile width: 128 where it divides N (wgmma n128: 64 fp32 accumulator registers per
    thread), else 64."""
    return 128 if n % 128 == 0 else 64


def stages_for(n: int, bn: int, save_xhat: bool) -> int:
    """TMA ring depth that fits next to the row block's z tiles (and the x̂ staging tile)."""
    fixed = BLOCK_M * n * 2 + (BLOCK_M * bn * 2 if save_xhat else 0) + _SMEM_SPARE
    per_stage = (BLOCK_M + bn) * BLOCK_K * 2
    return min(MAX_STAGES, (SMEM_BYTES - fixed) // per_stage)


@gluon.jit
def _issue(p, total, per_rb, k_tiles, pid, nprog, a_desc, b_desc, a_smem, b_smem, ready,
           STAGES: gl.constexpr):  # fmt: skip
    """TMA loads of flat step p (row block, column tile, K step) of this program into stage
    p % STAGES; nothing past the last step."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    ok = p < total
    s = p % STAGES
    i = p // per_rb
    r = p - i * per_rb
    j = r // k_tiles
    kk = r - j * k_tiles
    off_m = (pid + i * nprog) * BM
    bar = ready.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], bar, a_smem.index(s), pred=ok)
    tma.async_copy_global_to_shared(b_desc, [j * BN, kk * BK], bar, b_smem.index(s), pred=ok)


@gluon.jit
def linear_norm_fwd_kernel(
    a_desc, b_desc, out_desc, xhat_desc, bias_ptr, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, M, N, K,
    eps, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GAMMA: gl.constexpr, HAS_BETA: gl.constexpr,
    SAVE_XHAT: gl.constexpr, NT: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """y = norm(a·bᵀ + bias)·γ + β for a (M, K), b (N, K); stat1 = mean (LayerNorm), stat2 = rstd or
    rrms, fp32 per row. ``NT`` = N / BN column tiles. The grid must not exceed the row blocks."""
    dtype: gl.constexpr = a_desc.dtype
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_l: gl.constexpr = acc_layout(BN)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)

    a_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], b_desc.layout)
    z_smem = gl.allocate_shared_memory(dtype, [NT, BM, BN], out_desc.layout)
    if SAVE_XHAT:
        xh_smem = gl.allocate_shared_memory(dtype, [BM, BN], xhat_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for si in gl.static_range(STAGES):
        mbarrier.init(ready.index(si), count=1)
    fence_async_shared()

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    my_blocks = gl.cdiv(gl.cdiv(M, BM) - pid, nprog)
    k_tiles = gl.cdiv(K, BK)
    per_rb = NT * k_tiles
    total = my_blocks * per_rb
    for p in gl.static_range(STAGES - 1):
        _issue(p, total, per_rb, k_tiles, pid, nprog, a_desc, b_desc, a_smem, b_smem, ready, STAGES)

    nf = N.to(gl.float32)
    inv_bn = 1.0 / BN
    c = 0  # flat step consumed next
    for i in range(my_blocks):
        off_m = (pid + i * nprog) * BM
        mean = gl.zeros([BM], gl.float32, row_l)  # LayerNorm: running mean
        m2 = gl.zeros([BM], gl.float32, row_l)  # LayerNorm: running M2; RMSNorm: Σz²
        shift = gl.zeros([BM], gl.float32, row_l)  # LayerNorm: the first tile's mean
        for j in range(NT):
            acc = gl.zeros([BM, BN], gl.float32, acc_l)
            for kk in range(k_tiles):
                s = c % STAGES
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                acc = warpgroup_mma(
                    a_smem.index(s), b_smem.index(s).permute((1, 0)), acc, use_acc=kk > 0, is_async=True
                )
                # the previous step's wgmma has retired: its stage takes the load STAGES - 1 steps ahead
                acc = warpgroup_mma_wait(1, deps=(acc,))
                _issue(c + STAGES - 1, total, per_rb, k_tiles, pid, nprog, a_desc, b_desc, a_smem, b_smem,
                       ready, STAGES)  # fmt: skip
                c += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            cols = j * BN + gl.arange(0, BN, col_l)
            v = acc
            if HAS_BIAS:
                v = v + gl.expand_dims(gl.load(bias_ptr + cols).to(gl.float32), 0)
            if RMS:
                m2 = m2 + gl.sum(v * v, axis=1)
                staged = v
            else:
                mean_j = gl.sum(v, axis=1) * inv_bn
                d = v - gl.expand_dims(mean_j, 1)
                m2_j = gl.sum(d * d, axis=1)
                count = (j * BN).to(gl.float32)
                tot = count + BN
                delta = mean_j - mean
                mean = mean + delta * (BN / tot)
                m2 = m2 + m2_j + delta * delta * (count * BN / tot)
                if j == 0:
                    shift = mean_j
                staged = v - gl.expand_dims(shift, 1)
            if j == 0:  # the previous row block's stores have read the z tiles
                tma.store_wait(0)
                gl.thread_barrier()
            z_smem.index(j).store(staged.to(dtype))

        rstat = gl.rsqrt(m2 / nf + eps)
        rows = off_m + gl.arange(0, BM, row_l)
        row_ok = rows < M
        if not RMS:
            gl.store(stat1_ptr + rows, mean, mask=row_ok)
        gl.store(stat2_ptr + rows, rstat, mask=row_ok)
        back = gl.expand_dims(shift - mean, 1)
        scale = gl.expand_dims(rstat, 1)
        for j in range(NT):
            cols = j * BN + gl.arange(0, BN, col_l)
            w = z_smem.index(j).load(acc_l).to(gl.float32)  # the values this thread stored
            if RMS:
                xh = w * scale
            else:
                xh = (w + back) * scale
            if SAVE_XHAT:
                tma.store_wait(1)  # the previous x̂ store has read the staging tile
                gl.thread_barrier()
                xh_smem.store(xh.to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(xhat_desc, [off_m, j * BN], xh_smem)
            y = xh
            if HAS_GAMMA:
                y = y * gl.expand_dims(gl.load(gamma_ptr + cols).to(gl.float32), 0)
            if HAS_BETA:
                y = y + gl.expand_dims(gl.load(beta_ptr + cols).to(gl.float32), 0)
            z_smem.index(j).store(y.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(out_desc, [off_m, j * BN], z_smem.index(j))
    tma.store_wait(0)
    for si in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(si))


def _desc(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    layout = smem_layout(rows, cols, _GL[t.dtype])
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [rows, cols], layout)


def forward(x, w, out, stat2, *, stat1=None, bias=None, gamma=None, beta=None, xhat=None, eps: float,
            rms: bool, num_sms: int) -> None:  # fmt: skip
    """out (M, N) = norm(x @ wᵀ + bias)·γ + β, stat1 (mean, LayerNorm) and stat2 (rstd / rrms) (M,)
    fp32, xhat (M, N) when given; x (M, K), w (N, K). The caller checked ``dispatch.why_not``."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0:
        return
    bn = block_n(n)
    stages = stages_for(n, bn, xhat is not None)
    a_desc = _desc(x, BLOCK_M, BLOCK_K)
    b_desc = _desc(w, bn, BLOCK_K)
    out_desc = _desc(out, BLOCK_M, bn)
    xhat_desc = _desc(xhat, BLOCK_M, bn) if xhat is not None else out_desc
    blocks = -(-m // BLOCK_M)
    dummy = stat2
    linear_norm_fwd_kernel[(max(1, min(blocks, num_sms)),)](
        a_desc, b_desc, out_desc, xhat_desc, bias if bias is not None else dummy,
        gamma if gamma is not None else dummy, beta if beta is not None else dummy,
        stat1 if stat1 is not None else stat2, stat2, m, n, k, float(eps),
        RMS=bool(rms), HAS_BIAS=bias is not None, HAS_GAMMA=gamma is not None, HAS_BETA=beta is not None,
        SAVE_XHAT=xhat is not None, NT=n // bn, STAGES=stages, num_warps=4,
    )  # fmt: skip
