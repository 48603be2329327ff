"""GDPA's activation math for the sm_90 Gluon kernels: f(x) scaled, its deferred form, and (f, f').

The kernel-agnostic Gluon helpers (layouts, tile decoding, row stores, reductions, TMA staging) are
``ads_kernel_tools.kernels.gluon_hopper``; the hardware approximations ``kernels.hw_math``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ads_kernel_tools.kernels.hw_math import rcp_approx
from ads_kernel_tools.kernels.hw_math import tanh_approx as _tanh

from ..activations import GELU_B, GELU_BC, bf16x2_word
from ..triton._act import (
    A_FAST_GELU,
    A_FAST_SILU,
    A_GELU,
    A_GELU_APPROX,
    A_HARDSWISH,
    A_LEAKY_RELU,
    A_RELU,
    A_RELU_SQUARE,
    A_SILU,
    ERFC_T,
    gelu_cdf,
)


@gluon.jit
def _gelu_cdf_fast(x):
    """Φ(x) with the hardware reciprocal feeding the shared erfc fit."""
    return gelu_cdf(x, rcp_approx(gl.fma(gl.abs(x), ERFC_T, 1.0)))


@gluon.jit
def act_scaled(x, scale, ACT: gl.constexpr):
    """scale * act(x) in fp32; the scale rides inside the last multiply where it can."""
    if ACT == A_FAST_GELU:
        # tanh-GELU with the MUFU tanh: 0.5x(1+t), t = tanh(x(β + βc·x²)); h = 0.5·scale·x so the
        # result is one fma: h + h·t.
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        t = _tanh(u)
        h = x * (0.5 * scale)
        y = gl.fma(h, t, h)
    elif ACT == A_GELU_APPROX:
        # tanh-GELU through the sigmoid identity 0.5(1+tanh(u)) = σ(2u), so y = x·σ(2u).
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        e = gl.exp2(u * (-2.0 * 1.4426950408889634))
        y = (x * scale) / (1.0 + e)
    elif ACT == A_GELU:
        y = (x * scale) * _gelu_cdf_fast(x)
    elif ACT == A_RELU:
        y = gl.maximum(x, 0.0) * scale
    elif ACT == A_RELU_SQUARE:
        r = gl.maximum(x, 0.0)
        y = r * r * scale
    elif ACT == A_LEAKY_RELU:
        y = gl.where(x >= 0.0, x, x * 0.01) * scale
    elif ACT == A_SILU or ACT == A_FAST_SILU:
        # The compiler's division here, not ``rcp_approx``: the hardware reciprocal shortens the step
        # but measured slower in the forward on the H200 (BENCHMARKS.md, experiment log).
        e = gl.exp2(x * (-1.4426950408889634))
        y = (x * scale) / (1.0 + e)
    elif ACT == A_HARDSWISH:
        y = x * gl.minimum(gl.maximum(x + 3.0, 0.0), 6.0) * (scale / 6.0)
    else:
        y = x * scale
    return y


@gluon.jit
def act_deferred(x, ACT: gl.constexpr):
    """act(x) / DEFERRED_GAIN[ACT] in fp32, without the scale (the caller applies both to the sum)."""
    gl.static_assert(ACT == A_FAST_GELU, "no deferred form for this activation (DEFERRED_GAIN)")
    u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
    return gl.fma(x, _tanh(u), x)  # x(1 + t) = 2·gelu(x): one fma, no 0.5·scale·x


_FAST_GELU_DEFERRED_BF16X2: gl.constexpr = gl.constexpr(f"""{{
        .reg .b32 xx, a, u, t, c_b, c_bc;
        mov.b32 c_b, {bf16x2_word(GELU_B)};
        mov.b32 c_bc, {bf16x2_word(GELU_BC)};
        mul.rn.bf16x2 xx, $1, $1;
        fma.rn.bf16x2 a, xx, c_bc, c_b;
        mul.rn.bf16x2 u, $1, a;
        tanh.approx.bf16x2 t, u;
        fma.rn.bf16x2 $0, $1, t, $1;
        }}""")


@gluon.jit
def fast_gelu_deferred_bf16x2(x):
    """``act_deferred`` of fast_gelu, x(1 + tanh(x(β + βc·x²))), in packed bf16x2 arithmetic on a
    bf16 tensor (two scores per instruction, each operation rounded to bf16 as PyTorch's bf16 GDPA
    rounds it); returns bf16, the operand dtype of P·V."""
    return gl.inline_asm_elementwise(
        _FAST_GELU_DEFERRED_BF16X2,
        "=r,r",
        [x],
        dtype=gl.bfloat16,
        is_pure=True,
        pack=2,
    )


@gluon.jit
def act_and_grad_scaled(x, scale, ACT: gl.constexpr):
    """(scale·act(x), scale·act'(x)) in fp32 for the backward, sharing the transcendental between the
    two; the scale rides inside constants or the last multiply, saving the backward two multiplies
    per element of Sᵀ against scaling afterwards.

    Same formulas as the Triton kernels (``ads_gdpa.triton._act``); fast_gelu uses the MUFU tanh.
    """
    if ACT == A_FAST_GELU or ACT == A_GELU_APPROX:
        u = x * gl.fma(x * x, 0.035677408136300125, 0.7978845608028654)
        if ACT == A_FAST_GELU:
            t = _tanh(u)
        else:
            t = 2.0 * rcp_approx(1.0 + gl.exp2(u * (-2.0 * 1.4426950408889634))) - 1.0
        half_s = 0.5 * scale
        hs = x * half_s
        y = gl.fma(hs, t, hs)
        # d/dx 0.5x(1+t) = 0.5(1+t) + 0.5x(1-t²)·β(1+3c·x²)
        dt = gl.fma(x * x, 0.10703222440890289, 0.7978845608028654)
        g = gl.fma(t, half_s, half_s) + hs * (1.0 - t * t) * dt
    elif ACT == A_GELU:
        cdf = _gelu_cdf_fast(x)
        y = x * cdf * scale
        g = (cdf + x * gl.exp2(x * x * (-0.5 * 1.4426950408889634)) * 0.3989422804014327) * scale
    elif ACT == A_RELU:
        y = gl.maximum(x, 0.0) * scale
        g = gl.where(x >= 0.0, scale, 0.0)
    elif ACT == A_RELU_SQUARE:
        r = gl.maximum(x, 0.0)
        rs = r * scale
        y = r * rs
        g = 2.0 * rs
    elif ACT == A_LEAKY_RELU:
        y = gl.where(x >= 0.0, x, x * 0.01) * scale
        g = gl.where(x >= 0.0, scale, 0.01 * scale)
    elif ACT == A_SILU or ACT == A_FAST_SILU:
        s = rcp_approx(1.0 + gl.exp2(x * (-1.4426950408889634)))
        xs = x * scale
        y = xs * s
        g = s * gl.fma(xs, 1.0 - s, scale)
    elif ACT == A_HARDSWISH:
        y = x * gl.minimum(gl.maximum(x + 3.0, 0.0), 6.0) * (scale / 6.0)
        g = gl.where(x <= -3.0, 0.0, gl.where(x >= 3.0, scale, gl.fma(x, scale / 3.0, 0.5 * scale)))
    else:
        y = x * scale
        g = gl.zeros_like(x) + scale
    return y, g
