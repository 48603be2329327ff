"""Gluon (``triton.experimental.gluon``) building blocks for sm_90 kernels: shared-memory and
wgmma accumulator layouts, tile-list decoding, producer/consumer mbarrier rings, masked row stores,
vector fp32 reductions, bulk TMA reduce-add and staging for TMA. Kernel-agnostic: no activation,
mask or softmax logic here."""

from __future__ import annotations

import functools

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = [
    "smem_layout", "acc_layout", "split_entry", "decode_tile", "init_ring", "kv_ring_buffers", "fwd_rings",
    "store_rows",
    "coalesced_rows_layout", "masked_row_store", "red_add_v4", "tma_reduce_add", "stage_for_tma",
    "rows_desc", "bwd_grad_step", "bwd_buffers",
]  # fmt: skip


@functools.cache
def smem_layout(rows: int, cols: int, dtype) -> gl.NVMMASharedLayout:
    """Default swizzled shared-memory layout of a [rows, cols] tile of ``dtype``; cached because
    building it costs several microseconds of host time per launch."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


def rows_desc(x, rows: int, dtype, cols: int | None = None) -> TensorDescriptor:
    """TMA descriptor over a (T, heads, D) tensor seen as (T, heads·D), boxes of [rows, cols or D] in
    ``dtype``'s default swizzled layout. Each row's heads·D values must be contiguous; the rows
    themselves may lie any 16-byte multiple apart (the slices of a packed projection, such as
    ``qkv.unbind`` of a (T, 3, heads, D) tensor), since TMA takes the row stride as given and never
    reads between rows. Raises ValueError for other layouts. A tensor without rows gets a one-row
    zero dummy, which keeps the descriptor valid for a kernel that never loads from it."""
    t, heads, d = x.shape
    cols = cols or d
    if t == 0:
        x, t = x.new_zeros(1, heads, d), 1
    if x.stride(2) != 1 or (heads > 1 and x.stride(1) != d):
        raise ValueError(f"rows_desc: heads and D must be packed in each row, got strides {x.stride()}")
    row_stride = x.stride(0) if t > 1 else heads * d
    layout = smem_layout(rows, cols, dtype)
    return TensorDescriptor(x, [t, heads * d], [row_stride, 1], [rows, cols], layout)


@gluon.constexpr_function
def acc_layout(n):
    """wgmma accumulator layout of a 64-row warpgroup tile ``n`` columns wide (4 warps)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def split_entry(t, HEADS, TILES):
    """A ``tile_list`` entry ``(b * HEADS + h) * TILES + tile`` -> (b, h, tile)."""
    per_b = HEADS * TILES
    b = t // per_b
    rem = t - b * per_b
    h = rem // TILES
    return b, h, rem - h * TILES


@gluon.jit
def decode_tile(i, tiles_ptr, cu_q_ptr, cu_k_ptr, HEADS, TILES, max_seqlen_q):
    """Decode entry i of a ``tile_list`` (``(b * HEADS + h) * TILES + tile``) -> (batch, head, tile,
    q start, Lq, Lq clamped to max_seqlen_q, k start, Lk). The offsets must be clamped
    (``kernels.offsets.clamp_offsets``): then every span lies inside its tensor."""
    b, h, idx = split_entry(gl.load(tiles_ptr + i), HEADS, TILES)
    q0 = gl.load(cu_q_ptr + b)
    lq = gl.load(cu_q_ptr + b + 1) - q0
    k0 = gl.load(cu_k_ptr + b)
    lk = gl.load(cu_k_ptr + b + 1) - k0
    return b, h, idx, q0, lq, gl.minimum(lq, max_seqlen_q), k0, lk


@gluon.jit
def init_ring(ready, empty, N: gl.constexpr, CONSUMERS: gl.constexpr):
    """Initialise the N slots of a producer/consumer ring of shared-memory buffers: ``ready.index(i)``
    completes on the producer's one arrival (with its expected TMA bytes), ``empty.index(i)`` once
    each of the ``CONSUMERS`` consumer partitions has released the slot."""
    for i in gl.static_range(N):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)


@gluon.jit
def kv_ring_buffers(k_desc, v_desc, STAGES: gl.constexpr, V_KMAJOR: gl.constexpr):
    """The K and V tiles of a ``STAGES``-slot attention forward ring, boxes of BN keys by D
    (``k_desc``'s box); ``V_KMAJOR``: V held as (D, BN), the K-major operand fp8 wgmma reads.
    Returns (k_smem, v_smem)."""
    dtype: gl.constexpr = k_desc.dtype
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    if V_KMAJOR:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, D, BN], v_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    return k_smem, v_smem


@gluon.jit
def fwd_rings(QBUF: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The mbarriers of an attention forward's producer/consumer rings, allocated and initialised
    (``init_ring``, released by each of ``CONSUMERS`` warpgroups): ``QBUF`` Q slots and ``STAGES``
    K and V slots. Returns (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)."""
    q_ready = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_ring(q_ready, q_empty, QBUF, CONSUMERS)
    init_ring(k_ready, k_empty, STAGES, CONSUMERS)
    init_ring(v_ready, v_empty, STAGES, CONSUMERS)
    return q_ready, q_empty, k_ready, k_empty, v_ready, v_empty


@gluon.jit
def store_rows(
    out_ptr,
    o,
    row0,
    n_rows,
    n_valid,
    col0,
    stride_row,
    ROWS: gl.constexpr,
    D: gl.constexpr,
    NUM_WARPS: gl.constexpr,
    DIRECT: gl.constexpr = False,
):
    """Store an fp32 [ROWS, D] tile: rows < n_valid get o, rows in [n_valid, n_rows) get zeros;
    ``n_valid=None`` when every stored row is valid (no zero-fill select is built).

    DIRECT stores straight from the accumulator layout (4-byte pieces, no shared-memory scratch,
    which leaves room for a deeper K/V ring); otherwise the tile is re-laid out through shared
    memory for 16-byte coalesced stores.
    """
    if DIRECT:
        ov = o.to(out_ptr.dtype.element_ty)
    else:
        ov = gl.convert_layout(o.to(out_ptr.dtype.element_ty), coalesced_rows_layout(D, NUM_WARPS))
    masked_row_store(out_ptr, ov, row0, n_rows, n_valid, col0, stride_row, ROWS, D)


@gluon.constexpr_function
def coalesced_rows_layout(D, NUM_WARPS):
    """Register layout of a [rows, D] 16-bit tile for 16-byte row-contiguous global stores."""
    VEC = 8
    TPC = D // VEC if D // VEC < 32 else 32
    return gl.BlockedLayout([1, VEC], [32 // TPC, TPC], [NUM_WARPS, 1], [1, 0])


@gluon.jit
def masked_row_store(
    out_ptr, ov, row0, n_rows, n_valid, col0, stride_row, ROWS: gl.constexpr, D: gl.constexpr
):
    """Store ``ov`` ([ROWS, D], any layout, already in the output dtype): rows < n_valid get ov, rows
    in [n_valid, n_rows) get zeros, rows from n_rows on are not written. ``n_valid=None``: no zero
    fill (a select on every element the compiler keeps even when n_valid is n_rows)."""
    st_layout: gl.constexpr = ov.type.layout
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
    cols = gl.arange(0, D, gl.SliceLayout(0, st_layout))
    r2 = gl.expand_dims(rows, 1)
    c2 = gl.expand_dims(cols, 0)
    if n_valid is not None:
        ov = gl.where(r2 < n_valid, ov, gl.zeros_like(ov))
    offs = (row0 + r2).to(gl.int64) * stride_row + col0 + c2
    gl.store(out_ptr + offs, ov, mask=(r2 < n_rows) & (c2 < D))


@gluon.jit
def red_add_v4(ptrs, vals, mask):
    """Atomically add fp32 ``vals`` at ``ptrs`` where ``mask``, four consecutive elements per
    ``red.global.add.v4.f32`` (sm_90): the layout must give each thread runs of 4 contiguous columns.
    The scalar reductions ``gl.atomic_add`` emits cost the backward 40 % of its time on the H200."""
    gl.inline_asm_elementwise(
        """{
        .reg .pred p;
        setp.ne.b32 p, $8, 0;
        @p red.global.add.v4.f32 [$4], {$12, $13, $14, $15};
        mov.b32 $0, 0;
        mov.b32 $1, 0;
        mov.b32 $2, 0;
        mov.b32 $3, 0;
        }""",
        "=r,=r,=r,=r,l,l,l,l,r,r,r,r,f,f,f,f",
        [ptrs.to(gl.int64), mask.to(gl.int32), vals],
        dtype=gl.int32,
        is_pure=False,
        pack=4,
    )


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile ``src`` into the global box of ``tensor_desc`` at ``coord`` with one
    bulk ``cp.reduce.async.bulk.tensor`` (element-wise atomic; rows outside the tensor are dropped).
    Asynchronous: ``tma.store_wait`` before ``src`` is written again. Triton 3.6's Gluon has the
    operation in its IR builder but no Python wrapper for it, hence this one."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


@gluon.jit
def stage_for_tma(smem, values):
    """Write a warpgroup's ``values`` into ``smem`` for a TMA store or reduction to send: first wait
    until the previous bulk operation from this warpgroup has read ``smem`` (only the issuing thread
    holds it, hence the barrier after), then store and make the tile visible to the TMA unit."""
    tma.store_wait(0)
    gl.thread_barrier()
    smem.store(values)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _share_ds_half(
    pt, dst, q_s, ds_smem, db, dph, ds_full, ds_free, WG: gl.constexpr, P_LAYOUT: gl.constexpr
):
    """The dSᵀ exchange's first half in ``bwd_grad_step``: once both warpgroups freed buffer ``db``,
    write this warpgroup's dSᵀ half into it and announce it; returns (that half in shared memory, Pᵀ
    as the dV GEMM's register operand)."""
    R: gl.constexpr = pt.shape[0]
    mbarrier.wait(ds_free.index(db), dph ^ 1)
    ds_half = ds_smem.index(db).slice(WG * R, R, dim=0)
    ds_half.store(dst.to(q_s.dtype))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ds_full.index(db), count=1)
    p_op = gl.convert_layout(pt.to(q_s.dtype), P_LAYOUT)
    return ds_half, p_op


@gluon.jit
def bwd_grad_step(
    pt,
    dst,
    dv,
    dk,
    q_s,
    do_s,
    k_cols,
    ds_smem,
    db,
    dph,
    ds_full,
    ds_free,
    qd_empty,
    dq_zero,
    WG: gl.constexpr,
    P_LAYOUT: gl.constexpr,
):
    """The GEMM half of one step of an attention backward whose two consumer warpgroups each own
    half of a kv tile's rows (warpgroup ``WG``: rows [WG·R, WG·R + R) of a 2R-row tile), given this
    warpgroup's ``pt`` (Pᵀ-like, [R, M], fp32) and ``dst`` (dSᵀ-like) for one M-row query tile.

    Writes this half of dSᵀ into the shared [2R, M] buffer ``ds_smem.index(db)`` (after both
    warpgroups freed it: ``ds_free``, phase ``dph``) and announces it (``ds_full``); accumulates
    dV += Pᵀ dO (Pᵀ from registers, ``P_LAYOUT``) and dK += dSᵀ Q (dSᵀ from shared memory); once both
    halves are in, dQ = dS K[:, cols] over all 2R keys (``k_cols``: this warpgroup's column slice of
    K, ``dq_zero`` its zero accumulator); then waits for the three GEMMs, releases the Q/dO stage
    (``qd_empty``) and the dSᵀ buffer. Returns (dv, dk, dq): dv, dk ready for the next step's
    asynchronous accumulation, dq the fp32 partial for the caller to reduce."""
    ds_half, p_op = _share_ds_half(pt, dst, q_s, ds_smem, db, dph, ds_full, ds_free, WG, P_LAYOUT)
    dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
    dk = warpgroup_mma(ds_half, q_s, dk, is_async=True)
    mbarrier.wait(ds_full.index(db), dph)
    dq = warpgroup_mma(ds_smem.index(db).permute((1, 0)), k_cols, dq_zero, use_acc=False, is_async=True)
    dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
    dv = warpgroup_mma_init(dv)
    dk = warpgroup_mma_init(dk)
    mbarrier.arrive(qd_empty, count=1)
    mbarrier.arrive(ds_free.index(db), count=1)
    return dv, dk, dq


@gluon.jit
def bwd_buffers(q_desc, do_desc, k_desc, v_desc, dq_desc, STAGES: gl.constexpr):
    """Shared memory and mbarriers of a two-consumer-warpgroup attention backward over one kv tile
    of BN rows (``k_desc``'s box) and query tiles of BM rows (``q_desc``'s box), D wide: a ring of
    ``STAGES`` Q/dO tiles, one K and one V tile, two [BN, BM] dSᵀ buffers, one fp32 dQ staging tile
    per warpgroup (``dq_desc``'s box). Barriers initialised: the Q/dO ring (``init_ring``, two
    consumers), K/V ready (one producer) / empty (two warpgroups), and each dSᵀ buffer's full / free
    (two arrivals). Returns (q, do, k, v, ds, dq, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
    ds_free)."""
    dtype: gl.constexpr = q_desc.dtype
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, D], v_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)
    qd_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qd_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_ring(qd_ready, qd_empty, STAGES, 2)
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=2)
    return (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty,
            ds_full, ds_free)  # fmt: skip
