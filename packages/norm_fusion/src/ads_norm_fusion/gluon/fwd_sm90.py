"""``linear_layernorm`` / ``linear_rmsnorm`` forward for Hopper (sm_90) in Gluon, the row block's GEMM
output kept in shared memory.

A persistent grid walks row blocks (row blocks p, p + programs, ...). For each row block a program
computes its column tiles of z = x·Wᵀ (+ bias) with wgmma (A/B tiles through a ring of ``STAGES``
TMA buffers whose loads run ahead across column tiles and row blocks), merges each tile's per-row
(mean, M2) into running row statistics with Chan's formula (RMSNorm: Σz²) and writes the tile,
shifted by the first tile's mean as ``triton._rownorm`` stages it, into shared memory that holds
all of its columns of the row block (≤ 128 KB of 16-bit values). Once the row is complete each tile
is read back, normalised (and γ, β applied) in place and sent to the output with one TMA store: y
crosses global memory once, where the Triton kernels stage z through the output buffer and read it
back. ``SPLIT`` (``config.gluon_split``):

- 1: 64-row blocks, one warpgroup, a program holds all N ≤ 1024 columns; x̂ (``SAVE_XHAT``) leaves
  through one more 64 × BN buffer. Its 64×128×64 K steps load 24 KB per MFLOP (43 FLOP/B), and with
  64-row blocks W streams through the SM once per row block (< 64 FLOP/B for any tile width): the
  GEMM is the limit (H200, 65536×1024×1024: 1.92× cuBLAS).
- 2 (default up to N = 1024) and more: 128-row blocks shared by ``SPLIT`` programs, each holding
  N/``SPLIT`` ≤ 512 columns in 128×256 tiles (two warpgroups, 85 FLOP/B as cuBLAS) and exchanging
  per-row partial statistics with its partners through global memory; x̂ leaves from the z tile
  before y overwrites it (1.56× cuBLAS at split 2). Wider rows (N up to 8192) take more programs
  per row block (``config.gluon_split``): each program's share of the work is then the same as at
  N = 1024, only the exchange counts more partners.

Two kernels with the same tiles, ring depth and results: ``linear_norm_fwd_kernel`` (one
partition: the warps that run the wgmma also issue the TMA loads, the flat step a load is for
decoded by division) and ``linear_norm_fwd_ws_kernel`` (``config.gluon_ws``: warp specialised, a
one-warp TMA producer feeding ``SPLIT`` MMA warpgroups of 64 rows each through a ready / empty
mbarrier ring, ring slot and phase carried from step to step; each warpgroup runs the statistics,
the partner exchange and the normalisation of its own rows, so no barrier spans two warpgroups).

On by default with the warp-specialised kernel (``config.gluon_forward``, ``config.gluon_ws``):
faster than the Triton forward on the H200 (BENCHMARKS.md).

Needs (``dispatch.why_not`` checks on the host): N a multiple of 64 up to 1024 at ``SPLIT`` 1,
N/``SPLIT`` a multiple of 128 up to 512 otherwise, K a multiple of 8 (TMA's 16-byte strides; the K tail
of the last step is zero-filled by TMA), 16-byte aligned row-major tensors. Rows past M: TMA loads zeros
and drops their stores.
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

from ads_kernel_tools.kernels.gluon_hopper import init_ring, smem_layout
from ads_kernel_tools.kernels.launch_cache import LaunchCache

BLOCK_M = 64  # rows per row block: one warpgroup's wgmma
BLOCK_K = 64
MAX_N = 1024  # split 1: a 64-row block's z tiles fill 128 KB of shared memory at 16 bits
MAX_PART = 512  # split > 1: the columns one program holds of a 128-row block (128 KB again)
SMEM_BYTES = 232448  # sm_90's largest dynamic shared memory per block (227 KB)
_SMEM_SPARE = 2048  # mbarriers and alignment
MAX_STAGES = 4

_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def block_n(n: int, split: int = 1) -> int:
    """Column tile width. split 1: 128 where it divides N (wgmma n128: 64 fp32 accumulator
    registers per thread), else 64. split > 1 (each program N/split columns of 128 rows): 256 where
    it divides N/split (128×256 tiles, 85 FLOP per loaded byte), else 128 or 64."""
    if split == 1:
        return 128 if n % 128 == 0 else 64
    part = n // split
    return 256 if part % 256 == 0 else (128 if part % 128 == 0 else 64)


def block_m(split: int) -> int:
    """Rows per row block: 64 (one warpgroup) at split 1, else 128 (two)."""
    return BLOCK_M * min(split, 2)


def block_k(n: int, bn: int, save_xhat: bool, split: int = 1) -> int:
    """64, or 32 where 64-deep stages would leave fewer than three in the ring."""
    return BLOCK_K if split == 1 or stages_for(n, bn, save_xhat, split, BLOCK_K) >= 3 else 32


def stages_for(n: int, bn: int, save_xhat: bool, split: int = 1, bk: int = BLOCK_K) -> int:
    """TMA ring depth that fits next to the row block's z tiles (and, split 1, the x̂ staging tile;
    split 2 sends x̂ from the z tiles themselves)."""
    bm = block_m(split)
    fixed = bm * (n // split) * 2 + (bm * bn * 2 if save_xhat and split == 1 else 0) + _SMEM_SPARE
    per_stage = (bm + bn) * bk * 2
    return min(MAX_STAGES, (SMEM_BYTES - fixed) // per_stage)


@gluon.constexpr_function
def _acc_layout(bn, warps):
    """wgmma accumulator layout of a (16·warps)-row tile ``bn`` columns wide, warpgroups stacked in M."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bn, 16])


@gluon.jit
def _issue(p, total, per_rb, k_tiles, pid, nprog, col0, a_desc, b_desc, a_smem, b_smem, ready,
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
    tma.async_copy_global_to_shared(b_desc, [col0 + j * BN, kk * BK], bar, b_smem.index(s), pred=ok)


@gluon.jit
def _ab_smem(a_desc, b_desc, STAGES: gl.constexpr):
    """The ``STAGES``-slot ring of A tiles (``a_desc``'s box) and B tiles (``b_desc``'s box) every
    forward kernel's GEMM reads. Returns (a_smem, b_smem)."""
    dtype: gl.constexpr = a_desc.dtype
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], b_desc.layout)
    return a_smem, b_smem


@gluon.jit
def _program(M, BM: gl.constexpr, SPLIT: gl.constexpr):
    """This program's place in the persistent grid: (first row block, row-block stride, which part
    of the columns it holds (0 to ``SPLIT`` - 1), how many row blocks it walks). The ``SPLIT``
    programs of a row block are neighbours in the grid."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    half = 0
    if SPLIT > 1:
        half = pid % SPLIT
        pid = pid // SPLIT
        nprog = nprog // SPLIT
    return pid, nprog, half, gl.cdiv(gl.cdiv(M, BM) - pid, nprog)


@gluon.jit
def _merge_tile(acc, cols, bias_ptr, j, mean, m2, shift, HAS_BIAS: gl.constexpr, RMS: gl.constexpr):
    """Column tile j of z (the fp32 accumulator; the bias at ``cols`` added here) merged into the
    running row statistics: LayerNorm (mean, M2) by Chan's formula, the first tile's mean kept as
    ``shift``; RMSNorm Σz² in ``m2``. Returns (mean, m2, shift, the tile as staged: LayerNorm
    shifted)."""
    BN: gl.constexpr = acc.shape[1]
    v = acc
    if HAS_BIAS:
        v = v + gl.expand_dims(gl.load(bias_ptr + cols).to(gl.float32), 0)
    if RMS:
        m2 = m2 + gl.sum(v * v, axis=1)
        staged = v
    else:
        mean_j = gl.sum(v, axis=1) * (1.0 / BN)
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
    return mean, m2, shift, staged


@gluon.jit
def _merge_partner(base, flag, half, mean, m2, BLOCK: gl.constexpr, PART_COLS: gl.constexpr,
                   RMS: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """``SPLIT`` > 1: publish this program's partial statistics of its rows over its ``PART_COLS``
    columns (``base``: the row block's [part][mean, M2 or Σz²][BLOCK rows] fp32 record, offset to
    these rows), count itself in ``flag`` and wait for its ``SPLIT`` - 1 partners, then merge the
    parts in the same order (Chan's formula, equal counts), so every program gets the same bits."""
    row_l: gl.constexpr = mean.type.layout
    r_idx = gl.arange(0, mean.shape[0], row_l)
    seen = _publish_part(base + half * (2 * BLOCK), r_idx, mean, m2, flag, BLOCK, "acq_rel")
    _wait_parts(flag, seen, SPLIT)
    return _merge_parts(base, r_idx, BLOCK, PART_COLS, RMS, SPLIT)


@gluon.jit
def _publish_part(rec, r_idx, mean, m2, flag, BLOCK: gl.constexpr, SEM: gl.constexpr):
    """This program's partial statistics of rows ``r_idx`` into its part of the row block's record
    (``rec``: [mean, M2 or Σz²][BLOCK rows]), then one count in ``flag`` (``SEM``: release, or
    acq_rel for a caller that waits next); returns the count after it."""
    gl.store(rec + r_idx, mean)
    gl.store(rec + BLOCK + r_idx, m2)
    # every lane's record stores precede the count
    gl.thread_barrier()
    return gl.atomic_add(flag, 1, sem=SEM, scope="gpu") + 1


@gluon.jit
def _wait_parts(flag, seen, SPLIT: gl.constexpr):
    """Spin until ``flag`` counts all ``SPLIT`` parts (``seen``: the count last read); the acquiring
    lane's view then reaches every lane of the partition before their loads."""
    while seen < SPLIT:
        seen = gl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _merge_parts(base, r_idx, BLOCK: gl.constexpr, PART_COLS: gl.constexpr, RMS: gl.constexpr,
                 SPLIT: gl.constexpr):  # fmt: skip
    """The rows ``r_idx``' (mean, M2) (RMSNorm: Σz²) over a row block's ``SPLIT`` parts of
    ``PART_COLS`` columns each, from its record (``base``: [part][mean, M2 or Σz²][BLOCK rows]):
    Chan's formula, parts in order, so every reader gets the same bits."""
    mean = gl.load(base + r_idx, cache_modifier=".cg")
    m2 = gl.load(base + BLOCK + r_idx, cache_modifier=".cg")
    for p in gl.static_range(1, SPLIT):
        mean_b = gl.load(base + p * (2 * BLOCK) + r_idx, cache_modifier=".cg")
        m2_b = gl.load(base + p * (2 * BLOCK) + BLOCK + r_idx, cache_modifier=".cg")
        if RMS:
            m2 = m2 + m2_b
        else:
            # parts 0..p-1 (p·PART_COLS values) merged with part p (PART_COLS values)
            delta = mean_b - mean
            mean = mean + delta * (1.0 / (p + 1))
            m2 = m2 + m2_b + delta * delta * (PART_COLS * p / (p + 1))
    return mean, m2


@gluon.jit
def _affine(xh, cols, gamma_ptr, beta_ptr, HAS_GAMMA: gl.constexpr, HAS_BETA: gl.constexpr):
    """x̂·γ + β at columns ``cols`` (γ, β read in their dtype, applied in fp32)."""
    y = xh
    if HAS_GAMMA:
        y = y * gl.expand_dims(gl.load(gamma_ptr + cols).to(gl.float32), 0)
    if HAS_BETA:
        y = y + gl.expand_dims(gl.load(beta_ptr + cols).to(gl.float32), 0)
    return y


@gluon.jit
def _finish_rows(z_smem, z0, xh_smem, out_desc, xhat_desc, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, mean,
                 m2, shift, off_m, col0, half, M, nf, eps, acc_l: gl.constexpr, NT: gl.constexpr,
                 RMS: gl.constexpr, HAS_GAMMA: gl.constexpr, HAS_BETA: gl.constexpr,
                 SAVE_XHAT: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """The complete rows [off_m, off_m + rows of a z tile): statistics out, then z tiles z0 + j
    (j < NT, columns col0 + j·BN) read back, normalised, γ and β applied in place and sent to y by
    TMA; x̂ through ``xh_smem`` (``SPLIT`` 1) or from the z tile before y overwrites it (2)."""
    dtype: gl.constexpr = z_smem.dtype
    BM: gl.constexpr = z_smem.shape[1]
    BN: gl.constexpr = z_smem.shape[2]
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    rstat = gl.rsqrt(m2 / nf + eps)
    rows = off_m + gl.arange(0, BM, row_l)
    row_ok = rows < M
    if SPLIT > 1:
        row_ok = row_ok & (half == 0)  # one program of the row block writes the statistics
    if not RMS:
        gl.store(stat1_ptr + rows, mean, mask=row_ok)
    gl.store(stat2_ptr + rows, rstat, mask=row_ok)
    back = gl.expand_dims(shift - mean, 1)
    scale = gl.expand_dims(rstat, 1)
    for j in range(NT):
        cols = col0 + j * BN + gl.arange(0, BN, col_l)
        z_tile = z_smem.index(z0 + j)
        w = z_tile.load(acc_l).to(gl.float32)  # the values this thread stored
        if RMS:
            xh = w * scale
        else:
            xh = (w + back) * scale
        if SAVE_XHAT and SPLIT == 1:
            tma.store_wait(1)  # the previous x̂ store has read the staging tile
            gl.thread_barrier()
            xh_smem.store(xh.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(xhat_desc, [off_m, j * BN], xh_smem)
        if SAVE_XHAT and SPLIT > 1:  # no room for a staging tile: x̂ leaves from the z tile first
            z_tile.store(xh.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(xhat_desc, [off_m, col0 + j * BN], z_tile)
            tma.store_wait(0)
            gl.thread_barrier()
        y = _affine(xh, cols, gamma_ptr, beta_ptr, HAS_GAMMA, HAS_BETA)
        z_tile.store(y.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(out_desc, [off_m, col0 + j * BN], z_tile)


@gluon.jit
def linear_norm_fwd_kernel(
    a_desc, b_desc, out_desc, xhat_desc, bias_ptr, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, part_ptr,
    flag_ptr, M, N, K, eps, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GAMMA: gl.constexpr,
    HAS_BETA: gl.constexpr, SAVE_XHAT: gl.constexpr, NT: gl.constexpr, STAGES: gl.constexpr,
    SPLIT: gl.constexpr = 1,
):  # fmt: skip
    """y = norm(a·bᵀ + bias)·γ + β for a (M, K), b (N, K); stat1 = mean (LayerNorm), stat2 = rstd or
    rrms, fp32 per row. ``NT`` column tiles per program. The grid must not exceed the row blocks
    (times ``SPLIT``). One partition: the warps that run the wgmma also issue the TMA loads.

    ``SPLIT`` S > 1: programs S·q to S·q + S - 1 share each of their row blocks (128 rows), program
    S·q + h computing and holding columns [h·N/S, (h + 1)·N/S); each writes its rows' partial (mean,
    M2) or Σz² to ``part_ptr`` (2·S·BM fp32 per row block), counts itself in ``flag_ptr[row block]``
    (int32, zeroed by the caller) and waits for its partners, then all merge the S parts in the same
    order (the same bits). The partners are programs of the persistent grid, at one program per SM
    all resident together, so the wait ends."""
    dtype: gl.constexpr = a_desc.dtype
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_l: gl.constexpr = _acc_layout(BN, BM // 16)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)

    a_smem, b_smem = _ab_smem(a_desc, b_desc, STAGES)
    z_smem = gl.allocate_shared_memory(dtype, [NT, BM, BN], out_desc.layout)
    if SAVE_XHAT and SPLIT == 1:
        xh_smem = gl.allocate_shared_memory(dtype, [BM, BN], xhat_desc.layout)
    else:
        xh_smem = z_smem  # not used
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for si in gl.static_range(STAGES):
        mbarrier.init(ready.index(si), count=1)
    fence_async_shared()

    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * (NT * BN)
    k_tiles = gl.cdiv(K, BK)
    per_rb = NT * k_tiles
    total = my_blocks * per_rb
    for p in gl.static_range(STAGES - 1):
        _issue(p, total, per_rb, k_tiles, pid, nprog, col0, a_desc, b_desc, a_smem, b_smem, ready, STAGES)

    nf = N.to(gl.float32)
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
                _issue(c + STAGES - 1, total, per_rb, k_tiles, pid, nprog, col0, a_desc, b_desc, a_smem,
                       b_smem, ready, STAGES)  # fmt: skip
                c += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            cols = col0 + j * BN + gl.arange(0, BN, col_l)
            mean, m2, shift, staged = _merge_tile(acc, cols, bias_ptr, j, mean, m2, shift, HAS_BIAS, RMS)
            if j == 0:  # the previous row block's stores have read the z tiles
                tma.store_wait(0)
                gl.thread_barrier()
            z_smem.index(j).store(staged.to(dtype))

        if SPLIT > 1:  # merge with the partners' parts, all in the same order
            rb = pid + i * nprog
            base = part_ptr + rb.to(gl.int64) * (2 * SPLIT * BM)
            mean, m2 = _merge_partner(base, flag_ptr + rb, half, mean, m2, BM, NT * BN, RMS, SPLIT)
        _finish_rows(z_smem, 0, xh_smem, out_desc, xhat_desc, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, mean,
                     m2, shift, off_m, col0, half, M, nf, eps, acc_l, NT, RMS, HAS_GAMMA, HAS_BETA,
                     SAVE_XHAT, SPLIT)  # fmt: skip
    tma.store_wait(0)
    for si in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(si))


# ----------------------------------------------------------------------------------------------
# Warp-specialised variant: a one-warp TMA producer feeding one (SPLIT 1) or two MMA warpgroups of
# 64 rows each
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _advance(s, ph, STAGES: gl.constexpr):
    """The next ring slot and its phase, carried from step to step (no division by STAGES)."""
    s += 1
    if s == STAGES:
        s = 0
        ph ^= 1
    return s, ph


@gluon.jit
def _prev_slot(s, STAGES: gl.constexpr):
    """The ring slot before ``s``."""
    p = s + (STAGES - 1)
    if p >= STAGES:
        p -= STAGES
    return p


@gluon.jit
def _ws_loads(a_desc, b_desc, a_smem, b_smem, ready, empty, M, K, NT: gl.constexpr, STAGES: gl.constexpr,
              SPLIT: gl.constexpr):  # fmt: skip
    """Producer partition (one warp): the A (all rows of the row block) and B tiles of every
    (row block, column tile, K step) of this program, in the order the warpgroups consume them,
    each into the next ring slot once every warpgroup has released it."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * (NT * BN)
    k_tiles = gl.cdiv(K, BK)
    s = 0
    ph = 0
    for i in range(my_blocks):
        off_m = (pid + i * nprog) * BM
        for j in range(NT):
            for kk in range(k_tiles):
                mbarrier.wait(empty.index(s), ph ^ 1)  # the first round passes on the fresh barrier
                bar = ready.index(s)
                mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], bar, a_smem.index(s))
                tma.async_copy_global_to_shared(b_desc, [col0 + j * BN, kk * BK], bar, b_smem.index(s))
                s, ph = _advance(s, ph, STAGES)


@gluon.jit
def _mma_tile(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, WG: gl.constexpr, STAGES: gl.constexpr,
              SLICE: gl.constexpr):  # fmt: skip
    """One tile of warpgroup WG's z over the K steps from the ring (slot ``s``, phase ``ph``): one
    wgmma group in flight behind the newest, a slot released once its wgmma has retired; ``SLICE``:
    the A tile holds two warpgroups' rows, this one takes its 64. Returns (acc, s, ph) for the
    next tile."""
    acc, s, ph, _ = _mma_steps(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, 0.0, False, WG, STAGES,
                               SLICE, False)  # fmt: skip
    return acc, s, ph


@gluon.jit
def _mma_steps(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, sq, SQ, WG: gl.constexpr,
               STAGES: gl.constexpr, SLICE: gl.constexpr, SUM_SQ: gl.constexpr):  # fmt: skip
    """``_mma_tile``'s K loop; with ``SUM_SQ``, where ``SQ`` holds at run time, the A rows' Σx² is
    also added to ``sq`` (rows in ``sq``'s layout's parent) from each A tile while its wgmma runs
    (``rms_linear_sm90``: rrms without a pass over x). Returns (acc, s, ph, sq)."""
    R: gl.constexpr = acc.shape[0]
    for kk in range(k_tiles):
        mbarrier.wait(ready.index(s), ph)
        a_tile = a_smem.index(s)
        if SLICE:
            a_tile = a_tile.slice(WG * R, R, dim=0)
        acc = warpgroup_mma(a_tile, b_smem.index(s).permute((1, 0)), acc, use_acc=kk > 0, is_async=True)
        if SUM_SQ:
            if SQ:
                a = a_tile.load(sq.type.layout.parent).to(gl.float32)
                sq = sq + gl.sum(a * a, axis=1)
        acc = warpgroup_mma_wait(1, deps=(acc,))
        # the previous step's wgmma has retired: release its slot (computed from s, not carried: a
        # name assigned a loop-carried value is not carried itself by Triton's frontend)
        mbarrier.arrive(empty.index(_prev_slot(s, STAGES)), pred=kk > 0)
        s, ph = _advance(s, ph, STAGES)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(empty.index(_prev_slot(s, STAGES)))  # the tile's last step
    return acc, s, ph, sq


@gluon.jit
def _ws_rows(args, WG: gl.constexpr, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GAMMA: gl.constexpr,
             HAS_BETA: gl.constexpr, SAVE_XHAT: gl.constexpr, NT: gl.constexpr, STAGES: gl.constexpr,
             SPLIT: gl.constexpr):  # fmt: skip
    """MMA warpgroup WG: rows [WG·64, WG·64 + 64) of each of this program's row blocks: their column
    tiles of z by wgmma from the ring (one group in flight behind the newest; a slot is released
    once its wgmma has retired), the statistics, the z tiles WG·NT + j, then the partner merge
    (``SPLIT`` > 1, per warpgroup) and the normalised rows out. Works on its own rows only, so its
    barriers span its own four warps."""
    (a_smem, b_smem, z_smem, xh_smem, ready, empty, out_desc, xhat_desc, bias_ptr, gamma_ptr, beta_ptr,
     stat1_ptr, stat2_ptr, part_ptr, flag_ptr, M, N, K, eps) = args  # fmt: skip
    dtype: gl.constexpr = z_smem.dtype
    BM: gl.constexpr = a_smem.shape[1]  # the row block
    BK: gl.constexpr = a_smem.shape[2]
    R: gl.constexpr = z_smem.shape[1]  # this warpgroup's rows of it
    BN: gl.constexpr = z_smem.shape[2]
    acc_l: gl.constexpr = _acc_layout(BN, 4)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * (NT * BN)
    k_tiles = gl.cdiv(K, BK)
    nf = N.to(gl.float32)
    s = 0
    ph = 0
    for i in range(my_blocks):
        rb = pid + i * nprog
        off_m = rb * BM + WG * R
        mean = gl.zeros([R], gl.float32, row_l)
        m2 = gl.zeros([R], gl.float32, row_l)
        shift = gl.zeros([R], gl.float32, row_l)
        for j in range(NT):
            acc = gl.zeros([R, BN], gl.float32, acc_l)
            acc, s, ph = _mma_tile(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, WG, STAGES, SPLIT > 1)
            cols = col0 + j * BN + gl.arange(0, BN, col_l)
            mean, m2, shift, staged = _merge_tile(acc, cols, bias_ptr, j, mean, m2, shift, HAS_BIAS, RMS)
            if j == 0:  # the previous row block's stores have read the z tiles
                tma.store_wait(0)
                gl.thread_barrier()
            z_smem.index(WG * NT + j).store(staged.to(dtype))
        if SPLIT > 1:
            base = part_ptr + rb.to(gl.int64) * (2 * SPLIT * BM) + WG * R
            mean, m2 = _merge_partner(base, flag_ptr + rb * 2 + WG, half, mean, m2, BM, NT * BN, RMS, SPLIT)
        _finish_rows(z_smem, WG * NT, xh_smem, out_desc, xhat_desc, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr,
                     mean, m2, shift, off_m, col0, half, M, nf, eps, acc_l, NT, RMS, HAS_GAMMA, HAS_BETA,
                     SAVE_XHAT, SPLIT)  # fmt: skip
    tma.store_wait(0)  # shared memory must outlive the last store's read


@gluon.jit
def linear_norm_fwd_ws_kernel(
    a_desc, b_desc, out_desc, xhat_desc, bias_ptr, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, part_ptr,
    flag_ptr, M, N, K, eps, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GAMMA: gl.constexpr,
    HAS_BETA: gl.constexpr, SAVE_XHAT: gl.constexpr, NT: gl.constexpr, STAGES: gl.constexpr,
    SPLIT: gl.constexpr = 1, MMA_REGS: gl.constexpr = 232, LOAD_REGS: gl.constexpr = 24,
):  # fmt: skip
    """``linear_norm_fwd_kernel``'s computation, warp specialised (launched with 4 warps): a 1-warp
    TMA producer partition (``_ws_loads``) fills a ring of ``STAGES`` A/B slots, each with a ready
    and an empty mbarrier (released by each MMA warpgroup), and one (``SPLIT`` 1) or two MMA
    warpgroups (``_ws_rows``: the default partition and, ``SPLIT`` > 1, a 4-warp worker) each own 64
    rows of every row block: wgmma, statistics, z tiles, normalisation and stores. ``out_desc`` and
    ``xhat_desc`` have 64-row boxes. ``SPLIT`` > 1: the partner exchange runs per warpgroup, with one
    flag per (row block, warpgroup) in ``flag_ptr`` (2 int32 per row block, zeroed by the caller)
    and the record layout of ``linear_norm_fwd_kernel``."""
    dtype: gl.constexpr = a_desc.dtype
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    R: gl.constexpr = out_desc.block_type.shape[0]
    a_smem, b_smem = _ab_smem(a_desc, b_desc, STAGES)
    WGS: gl.constexpr = BM // R  # MMA warpgroups
    z_smem = gl.allocate_shared_memory(dtype, [WGS * NT, R, BN], out_desc.layout)
    if SAVE_XHAT and SPLIT == 1:
        xh_smem = gl.allocate_shared_memory(dtype, [R, BN], xhat_desc.layout)
    else:
        xh_smem = z_smem  # not used
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_ring(ready, empty, STAGES, WGS)
    fence_async_shared()

    args = (a_smem, b_smem, z_smem, xh_smem, ready, empty, out_desc, xhat_desc, bias_ptr, gamma_ptr, beta_ptr,
            stat1_ptr, stat2_ptr, part_ptr, flag_ptr, M, N, K, eps)  # fmt: skip
    largs = (a_desc, b_desc, a_smem, b_smem, ready, empty, M, K, NT, STAGES, SPLIT)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    if WGS == 2:
        gl.warp_specialize(
            [
                (_ws_rows, (args, WG0, RMS, HAS_BIAS, HAS_GAMMA, HAS_BETA, SAVE_XHAT, NT, STAGES, SPLIT)),
                (_ws_rows, (args, WG1, RMS, HAS_BIAS, HAS_GAMMA, HAS_BETA, SAVE_XHAT, NT, STAGES, SPLIT)),
                (_ws_loads, largs),
            ],
            [4, 1],
            [MMA_REGS, LOAD_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_ws_rows, (args, WG0, RMS, HAS_BIAS, HAS_GAMMA, HAS_BETA, SAVE_XHAT, NT, STAGES, SPLIT)),
                (_ws_loads, largs),
            ],
            [1],
            [LOAD_REGS],
        )


def _desc(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    layout = smem_layout(rows, cols, _GL[t.dtype])
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [rows, cols], layout)


def grid_and_exchange(m: int, bm: int, split: int, num_sms: int, device, *, flags_per_block: int):
    """The persistent grid (``split`` programs per group of a row block, at most one program per SM:
    the partners wait for each other) and the row-statistics exchange it needs: the record (2·split
    fp32 per row, uninitialised: every part writes its own) and ``flags_per_block`` zeroed flags per
    row block; (programs, None, None) without flags (no exchange)."""
    blocks = -(-m // bm)
    programs = max(1, min(blocks, num_sms // split)) * split
    if flags_per_block == 0:
        return programs, None, None
    part = torch.empty(blocks * 2 * split * bm, dtype=torch.float32, device=device)
    flags = torch.zeros(blocks * flags_per_block, dtype=torch.int32, device=device)
    return programs, part, flags


def forward(x, w, out, stat2, *, stat1=None, bias=None, gamma=None, beta=None, xhat=None, eps: float,
            rms: bool, num_sms: int, split: int = 1, ws: bool = False) -> None:  # fmt: skip
    """out (M, N) = norm(x @ wᵀ + bias)·γ + β, stat1 (mean, LayerNorm) and stat2 (rstd / rrms) (M,)
    fp32, xhat (M, N) when given; x (M, K), w (N, K). ``ws``: the warp-specialised kernel
    (``linear_norm_fwd_ws_kernel``), same tiles, ring depth and results. The caller checked
    ``dispatch.why_not`` and picked ``split`` (``config.gluon_split``: N/split a multiple of 128 up
    to ``MAX_PART`` where split > 1; split <= the SMs)."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0:
        return
    save = xhat is not None
    bm, bn = block_m(split), block_n(n, split)
    bk = block_k(n, bn, save, split)
    stages = stages_for(n, bn, save, split, bk)
    out_rows = BLOCK_M if ws else bm  # the warp-specialised kernel stores per 64-row warpgroup
    a_desc = _desc(x, bm, bk)
    b_desc = _desc(w, bn, bk)
    out_desc = _desc(out, out_rows, bn)
    xhat_desc = _desc(xhat, out_rows, bn) if save else out_desc
    dummy = stat2
    per_block = 0 if split == 1 else 2 if ws else 1  # flags per row block: one per warpgroup under ws
    programs, part, flags = grid_and_exchange(m, bm, split, num_sms, x.device, flags_per_block=per_block)
    if split == 1:
        part, flags = dummy, dummy
    cache = _LAUNCH_WS if ws else _LAUNCH
    cache.launch((programs,), (
        a_desc, b_desc, out_desc, xhat_desc, bias if bias is not None else dummy,
        gamma if gamma is not None else dummy, beta if beta is not None else dummy,
        stat1 if stat1 is not None else stat2, stat2, part, flags, m, n, k, float(eps),
    ), dict(
        RMS=bool(rms), HAS_BIAS=bias is not None, HAS_GAMMA=gamma is not None, HAS_BETA=beta is not None,
        SAVE_XHAT=save, NT=n // split // bn, STAGES=stages, SPLIT=split, num_warps=4 if ws else bm // 16,
    ))  # fmt: skip


# relaunched without Triton's per-call argument binding (host time of calls of ~0.2 ms)
_LAUNCH = LaunchCache(linear_norm_fwd_kernel)
_LAUNCH_WS = LaunchCache(linear_norm_fwd_ws_kernel)
