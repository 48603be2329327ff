"""What the sm_90 CuTe DSL kernels of ads-gdpa share: shared-memory layouts and views, wgmma helpers,
the TMA rings, the tile-list decoder, the sequence mask, the staged row store, and the host side's
runtime tensors.

Device helpers are ``cute.jit`` functions called from the kernels; the runtime-tensor helpers build
what a compiled kernel's ``_fake_rows`` / ``_fake_vec`` arguments expect at call time.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream
from cutlass.tensor_utils import LayoutEnum

DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}


def swap01(t: cute.Tensor) -> cute.Tensor:
    """The same shared-memory tile with its first two modes swapped (the operand of a transposed use)."""
    modes = [1, 0, *range(2, cute.rank(t))]
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def acc_as_operand_a(layout: cute.Layout) -> cute.Layout:
    """An fp32 wgmma accumulator layout ((2, 2, V), M, N) read as the register A operand of the next
    GEMM, whose K is this accumulator's column dimension: ((2, 2, 2), M, (V/2, N)). A k16 block of
    the operand is two adjacent 8-column blocks of the accumulator, so no value moves between
    threads (bf16/fp16 pairs line up with the operand's k pairs)."""
    (pair, rows, blocks), m, n = layout.shape
    (s_pair, s_rows, s_blocks), s_m, s_n = layout.stride
    return cute.make_layout(
        ((pair, rows, 2), m, (blocks // 2, n)), stride=((s_pair, s_rows, s_blocks), s_m, (2 * s_blocks, s_n))
    )


@cute.jit
def as_operand_a(r: cute.Tensor) -> cute.Tensor:
    """A register tile in an accumulator's layout, viewed as the A operand of the next GEMM."""
    return cute.make_tensor(r.iterator, acc_as_operand_a(r.layout))


def tma_tiles(atom, smem: cute.Tensor, gmem: cute.Tensor):
    """(shared, global) views of a TMA copy between a shared-memory tile (stages after its two modes)
    and the tiles of a global tensor (tile indices after its two modes)."""
    return cpasync.tma_partition(
        atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(gmem, 0, 2)
    )


def row_major_smem(dtype, rows: int, cols: int, stages: int | None):
    """A swizzled (rows, cols[, stages]) shared-memory layout whose rows are contiguous (wgmma's K-major
    operand when the columns are the reduction)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype
    )
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    return cute.tile_to_shape(atom, shape, order=(0, 1) if stages is None else (0, 1, 2))


@cute.jit
def gemm(tiled_mma, acc, tA, tB, zero: cutlass.Constexpr[bool]):
    """acc (+)= A·B over every k block of the operands, as wgmma instructions (the caller fences and
    commits)."""
    for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        tiled_mma.set(warpgroup.Field.ACCUMULATE, not zero or k != 0)
        cute.gemm(tiled_mma, acc, tA[None, None, k], tB[None, None, k], acc)


@cute.jit
def zero_outside(coords: cute.Tensor, rows_valid, cols_valid, xs):
    """Zero the elements of the fragments ``xs`` (one or a tuple) whose (row, column) in ``coords``
    lies outside [0, rows_valid) x [0, cols_valid)."""
    xs = xs if isinstance(xs, tuple) else (xs,)
    for i in cutlass.range_constexpr(cute.size(coords)):
        r, c = coords[i]
        keep = r < rows_valid and c < cols_valid
        for x in xs:
            x[i] = cutlass.select_(keep, x[i], Float32(0.0))


@cute.jit
def stage_tile(thr_stsm, smem: cute.Tensor, acc, dtype):
    """An accumulator fragment in ``dtype`` into its shared-memory tile by ``stmatrix``."""
    r_out = cute.make_rmem_tensor(acc.shape, dtype)
    r_out.store(acc.load().to(dtype))
    cute.copy(thr_stsm, thr_stsm.retile(r_out), thr_stsm.partition_D(smem))


@cute.jit
def store_rows_staged(thr_stsm, smem: cute.Tensor, tidx, acc, gOut: cute.Tensor, n_rows, dtype, d: int):
    """The rows < ``n_rows`` of an accumulator tile in ``dtype`` to ``gOut`` (its global tile), through
    shared memory, 16 bytes per global store (a quarter of the global store instructions of 4-byte
    column-pair stores from registers, which queue on the load/store unit). Warp ``tidx // 32`` owns
    rows 16·(tidx // 32) onward of the tile (the wgmma accumulator's rows): it writes them by
    ``stmatrix`` and reads them back as 16-byte row chunks, so only the warp itself synchronises."""
    stage_tile(thr_stsm, smem, acc, dtype)
    cute.arch.sync_warp()
    chunks = d // 8  # 16-byte chunks per row
    rows_per_pass = 32 // chunks
    lane = tidx % 32
    first = (tidx // 32) * 16 + lane // chunks  # this warp's 16 rows of the tile
    col = (lane % chunks) * 8
    for i in cutlass.range_constexpr(16 // rows_per_pass):
        r = first + rows_per_pass * i
        v = cute.local_tile(smem, (1, 8), (r, col // 8)).load()
        if r < n_rows:
            cute.local_tile(gOut, (1, 8), (r, col // 8)).store(v)
    cute.arch.sync_warp()  # the next tile's stmatrix overwrites these rows


@cute.jit
def decode_q_tile(mTiles, mCuQ, mCuK, t, heads, m_tiles, max_seqlen_q):
    """Entry t of a query-tile list (``(b * heads + h) * m_tiles + m``, ``kernels.tile_list``) ->
    (head, tile, q start, Lq, Lq clamped to max_seqlen_q, k start, Lk)."""
    e = mTiles[t]
    per_b = heads * m_tiles
    b = e // per_b
    rem = e - b * per_b
    h = rem // m_tiles
    m = rem - h * m_tiles
    q0 = mCuQ[b]
    lq = mCuQ[b + 1] - q0
    k0 = mCuK[b]
    lk = mCuK[b + 1] - k0
    return h, m, q0, lq, cutlass.max(cutlass.min(lq, max_seqlen_q), 0), k0, lk


def tma_ring(barriers, stages: int, tx_bytes: int, *, last: bool):
    """A ring of shared-memory stages filled by TMA from the producer warp (one thread arrives with
    the bytes to expect) and released by the 8 warps of the two consumer warpgroups. ``last``: the
    kernel's last ring created, whose creation fences the barriers' initialisation and syncs the CTA
    (the earlier ones defer that to it)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers.data_ptr(),
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8),
        tx_count=tx_bytes,
        defer_sync=not last,
    )


def hint(policy: int | None) -> dict:
    """The cache-policy keyword of a TMA copy: none (the DSL's default) or a policy word."""
    return {} if policy is None else {"cache_policy": cutlass.Int64(policy)}


# ------------------------------------------------------------------------------------------------
# Host side: the runtime tensors of a compiled kernel
# ------------------------------------------------------------------------------------------------


def fake_rows(dtype):
    """A (T, W) row-major tensor of dynamic extents, W a multiple of 64 and 16-byte aligned rows."""
    return make_fake_compact_tensor(
        dtype, (cute.sym_int(), cute.sym_int(divisibility=64)), stride_order=(1, 0), assumed_align=16
    )


def fake_vec():
    return make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)


def env_stream():
    """The stream argument of a compiled kernel: the caller's current torch stream, which TVM-FFI
    passes at each call."""
    return make_fake_stream(use_tvm_ffi_env_stream=True)


# At a call TVM-FFI checks each torch tensor against its fake argument (dtype, rank, the divisible
# width, 16-byte alignment) and raises on a mismatch, so the views below must match ``fake_rows`` /
# ``fake_vec`` exactly.
def rows(x: torch.Tensor) -> torch.Tensor:
    """(T, H, D) -> the (T, H*D) view a ``fake_rows`` argument takes. Detached: inside autograd's
    backward the saved inputs still require grad, and DLPack refuses to export those."""
    x = x.detach()
    t, h, d = x.shape
    if t == 0:  # TMA descriptors need a row; the kernel never reads or writes it
        return x.new_zeros(1, h * d)
    return x.view(t, h * d)


def vec(x: torch.Tensor) -> torch.Tensor:
    """An int32 vector for a ``fake_vec`` argument (no copy when it is one already)."""
    return x.to(torch.int32).contiguous()
