"""Gluon helpers shared by the sm_90 forward and backward: activations, row stores, SM count."""

from __future__ import annotations

import functools

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from ..triton._act import ERFC_T, gelu_cdf
from ..triton._act import tanh_approx as _tanh

_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


@functools.cache
def smem_layout(rows: int, cols: int, dtype) -> gl.NVMMASharedLayout:
    """Default swizzled shared-memory layout of a [rows, cols] tile of ``dtype``; cached because
    building it costs several microseconds of host time per launch."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


@gluon.jit
def tile_coords(i, tiles_ptr, cu_q_ptr, cu_k_ptr, HEADS, TILES, max_seqlen_q):
    """Decode entry i of a ``tile_list`` (``(b * HEADS + h) * TILES + tile``) -> (batch, head, tile,
    q start, Lq, Lq clamped to max_seqlen_q, k start, Lk)."""
    t = gl.load(tiles_ptr + i)
    per_b = HEADS * TILES
    b = t // per_b
    rem = t - b * per_b
    h = rem // TILES
    idx = rem - h * TILES
    q0 = gl.load(cu_q_ptr + b)
    lq = gl.load(cu_q_ptr + b + 1) - q0
    k0 = gl.load(cu_k_ptr + b)
    lk = gl.load(cu_k_ptr + b + 1) - k0
    return b, h, idx, q0, lq, gl.minimum(lq, max_seqlen_q), k0, lk


@gluon.jit
def _rcp(x):
    """1/x by the hardware reciprocal (``rcp.approx.ftz``, about 1 ulp): two instructions where the
    compiler's fp32 division adds a range check and two predicated rescales per element (the
    backward's silu step: 867 -> 739 SASS instructions, 406 -> 452 TFLOP/s on the H200)."""
    return gl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1
    )


@gluon.jit
def _gelu_cdf_fast(x):
    """Φ(x) with the hardware reciprocal feeding the shared erfc fit."""
    return gelu_cdf(x, _rcp(gl.fma(gl.abs(x), ERFC_T, 1.0)))


@gluon.jit
def act_scaled(x, scale, ACT: gl.constexpr):
    """scale * act(x) in fp32; the scale rides inside the last multiply where it can."""
    if ACT == 3:
        # tanh-GELU with the MUFU tanh: 0.5x(1+t), t = tanh(x(β + βc·x²)); h = 0.5·scale·x so the
        # result is one fma: h + h·t.
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        t = _tanh(u)
        h = x * (0.5 * scale)
        y = gl.fma(h, t, h)
    elif ACT == 2:
        # tanh-GELU through the sigmoid identity 0.5(1+tanh(u)) = σ(2u), so y = x·σ(2u).
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        e = gl.exp2(u * (-2.0 * 1.4426950408889634))
        y = (x * scale) / (1.0 + e)
    elif ACT == 1:
        y = (x * scale) * _gelu_cdf_fast(x)
    elif ACT == 5:
        y = gl.maximum(x, 0.0) * scale
    elif ACT == 10:
        r = gl.maximum(x, 0.0)
        y = r * r * scale
    elif ACT == 4:
        y = gl.where(x >= 0.0, x, x * 0.01) * scale
    elif ACT == 7 or ACT == 8:
        # The compiler's division here, not ``_rcp``: with the hardware reciprocal the forward step is
        # 192 instructions shorter and ran 5 % slower on the H200 (490 against 514-519 TFLOP/s).
        e = gl.exp2(x * (-1.4426950408889634))
        y = (x * scale) / (1.0 + e)
    elif ACT == 9:
        y = x * gl.minimum(gl.maximum(x + 3.0, 0.0), 6.0) * (scale / 6.0)
    else:
        y = x * scale
    return y


# act(x) = DEFERRED_GAIN[ACT] · act_deferred(x) for the activations that have a cheaper form without
# the scale: a forward that multiplies its output tile by scale · gain instead of every score by the
# scale saves one multiply per score. fast_gelu only: silu's form without the scale (x / (1 + e))
# measured 4 % slower on the H200 than with it (BENCHMARKS.md, eighth session).
DEFERRED_GAIN = {3: 0.5}


@gluon.jit
def act_deferred(x, ACT: gl.constexpr):
    """act(x) / DEFERRED_GAIN[ACT] in fp32, without the scale (the caller applies both to the sum)."""
    gl.static_assert(ACT == 3, "no deferred form for this activation (DEFERRED_GAIN)")
    u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
    return gl.fma(x, _tanh(u), x)  # x(1 + t) = 2·gelu(x): one fma, no 0.5·scale·x


@gluon.jit
def act_and_grad_scaled(x, scale, ACT: gl.constexpr):
    """(scale·act(x), scale·act'(x)) in fp32 for the backward, sharing the transcendental between the
    two; the scale rides inside constants or the last multiply, saving the backward two multiplies
    per element of Sᵀ against scaling afterwards.

    Same formulas as the Triton kernels (``ads_gdpa.triton._act``); fast_gelu uses the MUFU tanh.
    """
    if ACT == 3 or ACT == 2:
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        if ACT == 3:
            t = _tanh(u)
        else:
            t = 2.0 * _rcp(1.0 + gl.exp2(u * (-2.0 * 1.4426950408889634))) - 1.0
        half_s = 0.5 * scale
        hs = x * half_s
        y = gl.fma(hs, t, hs)
        # d/dx 0.5x(1+t) = 0.5(1+t) + 0.5x(1-t²)·β(1+3c·x²)
        dt = gl.fma(x * x, 0.10703222440890289, 0.7978845608028654)
        g = gl.fma(t, half_s, half_s) + hs * (1.0 - t * t) * dt
    elif ACT == 1:
        cdf = _gelu_cdf_fast(x)
        y = x * cdf * scale
        g = (cdf + x * gl.exp2(x * x * (-0.5 * 1.4426950408889634)) * 0.3989422804014327) * scale
    elif ACT == 5:
        y = gl.maximum(x, 0.0) * scale
        g = gl.where(x >= 0.0, scale, 0.0)
    elif ACT == 10:
        r = gl.maximum(x, 0.0)
        rs = r * scale
        y = r * rs
        g = 2.0 * rs
    elif ACT == 4:
        y = gl.where(x >= 0.0, x, x * 0.01) * scale
        g = gl.where(x >= 0.0, scale, 0.01 * scale)
    elif ACT == 7 or ACT == 8:
        s = _rcp(1.0 + gl.exp2(x * (-1.4426950408889634)))
        xs = x * scale
        y = xs * s
        g = s * gl.fma(xs, 1.0 - s, scale)
    elif ACT == 9:
        y = x * gl.minimum(gl.maximum(x + 3.0, 0.0), 6.0) * (scale / 6.0)
        g = gl.where(x <= -3.0, 0.0, gl.where(x >= 3.0, scale, gl.fma(x, scale / 3.0, 0.5 * scale)))
    else:
        y = x * scale
        g = gl.zeros_like(x) + scale
    return y, g


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
    """Store an fp32 [ROWS, D] tile: rows < n_valid get o, rows in [n_valid, n_rows) get zeros.

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
    in [n_valid, n_rows) get zeros, rows from n_rows on are not written."""
    st_layout: gl.constexpr = ov.type.layout
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
    cols = gl.arange(0, D, gl.SliceLayout(0, st_layout))
    r2 = gl.expand_dims(rows, 1)
    c2 = gl.expand_dims(cols, 0)
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
