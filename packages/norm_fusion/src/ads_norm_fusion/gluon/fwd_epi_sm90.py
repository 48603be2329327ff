"""``linear_layernorm`` / ``linear_rmsnorm`` forward for Hopper (sm_90) in Gluon with the
normalisation in a partition of its own, so that it runs under the next row block's GEMM.

The kernel of ``fwd_sm90`` (warp-specialised) normalises a row block in its MMA warpgroups, with the
tensor cores idle meanwhile, and holds up to 512 columns of z, which leaves its ring 32-deep K
steps. Here a program holds one column part of at most 256 columns of each 128-row block in one
shared-memory buffer, beside a ring of 64-deep K steps:

  - a one-warp TMA producer (``fwd_sm90._ws_loads``) feeds the A/B ring;
  - two MMA warpgroups (64 rows each) compute z = x·Wᵀ (+ bias) of the part, its per-row (mean,
    M2) or Σz², write z (LayerNorm: minus this part's mean) into the buffer once it is free,
    publish their partial statistics to the row block's global record, count themselves in its
    flag and go on to the next row block without waiting;
  - a 2-warp normalisation partition waits for a full buffer and, per 64-row half, for the flag to
    count every part (``SPLIT`` programs share each row block, neighbours in the grid), merges the
    parts by Chan's formula in one order (every program gets the same bits), normalises the buffer
    in place in 64 × 64 pieces, applies γ and β, sends it to y with TMA and frees the buffer.

The MMA warpgroups wait for the buffer only when a row block's normalisation outlasts the next row
block's GEMM, a small fraction of it (hence one buffer: a second would cost the ring a stage). A
training forward (``SAVE_Z``) also gets the pre-norm value the backward reads
(``config.save_prenorm``): z minus its row mean (LayerNorm, with a row offset of 0) or z itself
(RMSNorm), in the inputs' dtype, stored from the partition's registers (no shared memory is left for
a second TMA tile). A training forward saving x̂ itself takes ``fwd_sm90``. Needs
(``dispatch``): N/``SPLIT`` = 128 or 256, K a multiple of 8, 16-byte aligned row-major tensors; rows
past M: TMA loads zeros and drops their stores.
"""

from __future__ import annotations

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
    BLOCK_M,
    MAX_STAGES,
    SMEM_BYTES,
    _ab_smem,
    _acc_layout,
    _affine,
    _desc,
    _merge_parts,
    _merge_tile,
    _mma_tile,
    _program,
    _publish_part,
    _wait_parts,
    _ws_loads,
    grid_and_exchange,
)

PIECE = gl.constexpr(64)  # columns the normalisation partition handles at once (64 values per thread)
# warps of the normalisation partition: with 2 MMA warpgroups and the producer warp, 11 warps leave
# ptxas a kernel-wide budget (65536 / 352 threads) above the 154 registers a 64 x 256 wgmma needs;
# 13 warps (a 4-warp partition) cap it at 128 and the MMA code does not build
NORM_WARPS = gl.constexpr(2)
BLOCK_K_EPI = 64  # three 48 KB ring stages beside the 64 KB z buffer at 256 columns


@gluon.jit
def _mma_rows(args, WG: gl.constexpr, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr,
              SPLIT: gl.constexpr):  # fmt: skip
    """MMA warpgroup WG: rows [WG·64, WG·64 + 64) of every row block of this program: the part's
    z by wgmma from the ring, its statistics, z into the buffer once the normalisation freed it,
    the partial statistics out and counted; never waits for another program."""
    (a_smem, b_smem, z_smem, ready, empty, z_full, z_empty, bias_ptr, part_ptr, flag_ptr, M, K) = args
    dtype: gl.constexpr = z_smem.dtype
    BM: gl.constexpr = a_smem.shape[1]
    R: gl.constexpr = z_smem.shape[1]
    BN: gl.constexpr = z_smem.shape[2]
    acc_l: gl.constexpr = _acc_layout(BN, 4)
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * BN
    k_tiles = gl.cdiv(K, a_smem.shape[2])
    r_idx = gl.arange(0, R, row_l)
    cols = col0 + gl.arange(0, BN, col_l)
    zero_r = gl.zeros([R], gl.float32, row_l)
    s = 0
    ph = 0
    for i in range(my_blocks):
        rb = pid + i * nprog
        acc = gl.zeros([R, BN], gl.float32, acc_l)
        acc, s, ph = _mma_tile(a_smem, b_smem, ready, empty, s, ph, k_tiles, acc, WG, STAGES, True)
        # one tile per part: its statistics are the part's (LayerNorm: staged minus its own mean)
        mean, m2, _, staged = _merge_tile(acc, cols, bias_ptr, i * 0, zero_r, zero_r, zero_r, HAS_BIAS, RMS)
        mbarrier.wait(z_empty, (i & 1) ^ 1)  # the first use passes on the fresh barrier
        z_smem.index(WG).store(staged.to(dtype))
        fence_async_shared()
        rec = part_ptr + rb.to(gl.int64) * (2 * SPLIT * BM) + half * (2 * BM) + WG * R
        _publish_part(rec, r_idx, mean, m2, flag_ptr + rb * 2 + WG, BM, "release")
        mbarrier.arrive(z_full)


@gluon.jit
def _row_stats(base, own, flag, nf, eps, row_l: gl.constexpr, BM: gl.constexpr, R: gl.constexpr,
               PART: gl.constexpr, RMS: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """Once ``flag`` counts all ``SPLIT`` parts: the merged (mean, rstd or rrms) of R rows from the
    row block's record (``base``: [part][mean, M2 or Σz²][BM rows], offset to these rows), in part
    order, and this program's part mean (``own``: the shift its z was staged with); read and merged
    one row per lane, then spread to ``row_l`` (where eight lanes share a row)."""
    _wait_parts(flag, gl.atomic_add(flag, 0, sem="acquire", scope="gpu"), SPLIT)
    one_l: gl.constexpr = gl.BlockedLayout([1], [32], [NORM_WARPS], [0])
    r_idx = gl.arange(0, R, one_l)
    mean, m2 = _merge_parts(base, r_idx, BM, PART, RMS, SPLIT)
    shift = mean
    if not RMS:
        shift = gl.load(base + own * (2 * BM) + r_idx, cache_modifier=".cg")
    rstat = gl.rsqrt(m2 / nf + eps)
    return gl.convert_layout(mean, row_l), gl.convert_layout(rstat, row_l), gl.convert_layout(shift, row_l)


@gluon.jit
def _norm_rows(args, RMS: gl.constexpr, HAS_GAMMA: gl.constexpr, HAS_BETA: gl.constexpr, SPLIT: gl.constexpr,
               SAVE_Z: gl.constexpr):  # fmt: skip
    """Normalisation partition (``NORM_WARPS`` warps): per row block of this program, once the
    buffer is full, per 64-row half: the merged statistics (written out by part 0), the half
    normalised in place in ``PIECE``-column pieces with γ and β, sent to y by one TMA store; the
    buffer is freed once both stores have read it."""
    (z_smem, z_full, z_empty, out_desc, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, part_ptr, flag_ptr, M, N,
     eps, zsave_ptr, zoff_ptr) = args  # fmt: skip
    dtype: gl.constexpr = z_smem.dtype
    R: gl.constexpr = z_smem.shape[1]
    BN: gl.constexpr = z_smem.shape[2]
    BM: gl.constexpr = 2 * R
    # 16-byte runs of a row per thread: one swizzle chunk of the 128-byte swizzled tile each
    piece_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NORM_WARPS, 1], [1, 0])
    row_l: gl.constexpr = gl.SliceLayout(1, piece_l)
    col_l: gl.constexpr = gl.SliceLayout(0, piece_l)
    pid, nprog, half, my_blocks = _program(M, BM, SPLIT)
    col0 = half * BN
    nf = N.to(gl.float32)
    for i in range(my_blocks):
        rb = pid + i * nprog
        mbarrier.wait(z_full, i & 1)
        for h in gl.static_range(2):
            base = part_ptr + rb.to(gl.int64) * (2 * SPLIT * BM) + h * R
            mean, rstat, shift = _row_stats(base, half, flag_ptr + rb * 2 + h, nf, eps, row_l, BM, R, BN, RMS,
                                            SPLIT)  # fmt: skip
            rows = rb * BM + h * R + gl.arange(0, R, row_l)
            row_ok = (rows < M) & (half == 0)  # one program of the row block writes the statistics
            if not RMS:
                gl.store(stat1_ptr + rows, mean, mask=row_ok)
                if SAVE_Z:
                    gl.store(zoff_ptr + rows, gl.zeros_like(mean), mask=row_ok)
            gl.store(stat2_ptr + rows, rstat, mask=row_ok)
            zrow = gl.expand_dims(zsave_ptr + rows.to(gl.int64) * N, 1)
            zmask = gl.expand_dims(rows < M, 1)
            back = gl.expand_dims(shift - mean, 1)
            scale = gl.expand_dims(rstat, 1)
            tile = z_smem.index(h)
            for c in gl.static_range(BN // PIECE):
                piece = tile.slice(c * PIECE, PIECE, dim=1)
                w = piece.load(piece_l).to(gl.float32)
                if not RMS:
                    w = w + back
                cols = col0 + c * PIECE + gl.arange(0, PIECE, col_l)
                if SAVE_Z:
                    gl.store(zrow + gl.expand_dims(cols, 0), w.to(dtype), mask=zmask)
                y = w * scale
                y = _affine(y, cols, gamma_ptr, beta_ptr, HAS_GAMMA, HAS_BETA)
                piece.store(y.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(out_desc, [rb * BM + h * R, col0], tile)
        tma.store_wait(0)
        gl.thread_barrier()
        mbarrier.arrive(z_empty)


@gluon.jit
def linear_norm_fwd_epi_kernel(
    a_desc, b_desc, out_desc, bias_ptr, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, part_ptr, flag_ptr,
    zsave_ptr, zoff_ptr, M, N, K, eps, RMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GAMMA: gl.constexpr,
    HAS_BETA: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, SAVE_Z: gl.constexpr,
    MMA_REGS: gl.constexpr = 184, NORM_REGS: gl.constexpr = 152,
    LOAD_REGS: gl.constexpr = 24,
):  # fmt: skip
    """y = norm(a·bᵀ + bias)·γ + β for a (M, K), b (N, K); stat1 = mean (LayerNorm), stat2 = rstd or
    rrms, fp32 per row; with ``SAVE_Z`` zsave (M, N) the pre-norm value (z - mean, or z for RMSNorm)
    and zoff (M,) fp32 zeros (LayerNorm). Launched with 4 warps (the first MMA warpgroup); ``a_desc``
    has 128-row boxes, ``b_desc`` and ``out_desc`` (64-row boxes) N/``SPLIT`` columns.
    ``part_ptr``: 2·SPLIT·128 fp32 per row block; ``flag_ptr``: 2 int32 per row block, zeroed by the
    caller. The grid is a multiple of ``SPLIT`` and at most one program per SM (the partners' waits
    end only if all are resident)."""
    dtype: gl.constexpr = a_desc.dtype
    BN: gl.constexpr = b_desc.block_type.shape[0]
    R: gl.constexpr = out_desc.block_type.shape[0]
    a_smem, b_smem = _ab_smem(a_desc, b_desc, STAGES)
    # one 64-row half of z per MMA warpgroup
    z_smem = gl.allocate_shared_memory(dtype, [2, R, BN], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    z_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    z_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    init_ring(ready, empty, STAGES, 2)
    mbarrier.init(z_full, count=2)  # both MMA warpgroups
    mbarrier.init(z_empty, count=1)
    fence_async_shared()

    margs = (a_smem, b_smem, z_smem, ready, empty, z_full, z_empty, bias_ptr, part_ptr, flag_ptr, M, K)
    nargs = (z_smem, z_full, z_empty, out_desc, gamma_ptr, beta_ptr, stat1_ptr, stat2_ptr, part_ptr, flag_ptr,
             M, N, eps, zsave_ptr, zoff_ptr)  # fmt: skip
    NT: gl.constexpr = 1
    largs = (a_desc, b_desc, a_smem, b_smem, ready, empty, M, K, NT, STAGES, SPLIT)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize(
        [
            (_mma_rows, (margs, WG0, RMS, HAS_BIAS, STAGES, SPLIT)),
            (_mma_rows, (margs, WG1, RMS, HAS_BIAS, STAGES, SPLIT)),
            (_norm_rows, (nargs, RMS, HAS_GAMMA, HAS_BETA, SPLIT, SAVE_Z)),
            (_ws_loads, largs),
        ],
        [4, NORM_WARPS, 1],
        [MMA_REGS, NORM_REGS, LOAD_REGS],
    )


def forward(x, w, out, stat2, *, stat1=None, bias=None, gamma=None, beta=None, eps: float, rms: bool,
            num_sms: int, split: int, zsave=None, zoff=None) -> None:  # fmt: skip
    """out (M, N) = norm(x @ wᵀ + bias)·γ + β, stat1 (mean, LayerNorm) and stat2 (rstd / rrms) (M,)
    fp32; x (M, K), w (N, K); zsave (M, N), given for a training forward, the pre-norm value the
    backward reads (x̂ = (zsave - zoff)·rstd, or zsave·rrms) and zoff (M,) fp32 its LayerNorm row
    offset. The caller checked ``dispatch.why_not`` and picked ``split`` (``config.gluon_epi_split``:
    N/split is 128 or 256, split <= the SMs)."""
    if zsave is not None and not rms and zoff is None:
        raise ValueError("a LayerNorm pre-norm value needs its row offsets (zoff)")
    m, k = x.shape
    n = w.shape[0]
    if m == 0:
        return
    bn = n // split
    bm, bk = 2 * BLOCK_M, BLOCK_K_EPI
    stages = stages_for_epi(bn)
    a_desc = _desc(x, bm, bk)
    b_desc = _desc(w, bn, bk)
    out_desc = _desc(out, BLOCK_M, bn)
    programs, part, flags = grid_and_exchange(m, bm, split, num_sms, x.device, flags_per_block=2)
    dummy = stat2
    args = (
        a_desc, b_desc, out_desc, bias if bias is not None else dummy, gamma if gamma is not None else dummy,
        beta if beta is not None else dummy, stat1 if stat1 is not None else stat2, stat2, part, flags,
        zsave if zsave is not None else out, zoff if zoff is not None else stat2, m, n, k, float(eps),
    )  # fmt: skip
    consts = dict(
        RMS=bool(rms), HAS_BIAS=bias is not None, HAS_GAMMA=gamma is not None, HAS_BETA=beta is not None,
        STAGES=stages, SPLIT=split, SAVE_Z=zsave is not None, num_warps=4,
    )  # fmt: skip
    _LAUNCH.launch((programs,), args, consts)


_LAUNCH = LaunchCache(linear_norm_fwd_epi_kernel)


def stages_for_epi(bn: int) -> int:
    """TMA ring depth (``BLOCK_K_EPI``-deep stages) next to the 128 × ``bn`` z buffer."""
    per_stage = (2 * BLOCK_M + bn) * BLOCK_K_EPI * 2
    return min(MAX_STAGES, (SMEM_BYTES - 2 * BLOCK_M * bn * 2 - _SMEM_SPARE) // per_stage)
