"""GDPA's activations and their derivatives for the CuTe DSL kernels, on fp32 scalars.

Same formulas and constants as the Triton and Gluon kernels (``ads_gdpa.triton._act``,
``ads_gdpa.gluon._act``): fast_gelu takes the MUFU ``tanh.approx.f32``; the scale rides inside the
last multiply of f and f'. The activation id is a compile-time constant; the ids written here are
``ads_gdpa.dispatch``'s CuTe support table.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..activations import Activation

A = Activation
LOG2E = 1.4426950408889634
GELU_B = 0.7978845608028654  # sqrt(2/pi)
GELU_BC = 0.035677408136300125  # sqrt(2/pi) * 0.044715
GELU_DBC = 0.10703222440890289  # 3 * sqrt(2/pi) * 0.044715


@dsl_user_op
def tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(x).ir_value(loc=loc, ip=ip)],
            "tanh.approx.f32 $0, $1;",
            "=f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def _sigmoid(x: Float32) -> Float32:
    return cute.arch.rcp_approx(1.0 + cute.math.exp2(x * (-LOG2E), fastmath=True))


@cute.jit
def act_and_grad(x: Float32, scale: Float32, act: cutlass.Constexpr[int]):
    """(scale·act(x), scale·act'(x)) in fp32."""
    y = x * scale
    g = scale
    if cutlass.const_expr(act == A.FAST_GELU or act == A.GELU_APPROX):
        u = x * (x * x * GELU_BC + GELU_B)
        t = Float32(0.0)
        if cutlass.const_expr(act == A.FAST_GELU):
            t = tanh_approx(u)
        else:
            t = 2.0 * _sigmoid(2.0 * u) - 1.0
        half_s = 0.5 * scale
        hs = x * half_s
        y = hs * t + hs
        # d/dx 0.5x(1+t) = 0.5(1+t) + 0.5x(1-t^2)·β(1+3c·x²)
        g = (t * half_s + half_s) + hs * (1.0 - t * t) * (x * x * GELU_DBC + GELU_B)
    elif cutlass.const_expr(act == A.RELU):
        pos = x >= 0.0
        y = cutlass.select_(pos, x * scale, Float32(0.0))
        g = cutlass.select_(pos, scale, Float32(0.0))
    elif cutlass.const_expr(act == A.RELU_SQUARE):
        r = cute.arch.fmax(x, Float32(0.0))
        rs = r * scale
        y = r * rs
        g = 2.0 * rs
    elif cutlass.const_expr(act == A.LEAKY_RELU):
        pos = x >= 0.0
        y = cutlass.select_(pos, x, x * 0.01) * scale
        g = cutlass.select_(pos, scale, scale * 0.01)
    elif cutlass.const_expr(act == A.SILU or act == A.FAST_SILU):
        s = _sigmoid(x)
        xs = x * scale
        y = xs * s
        g = s * (xs * (1.0 - s) + scale)
    elif cutlass.const_expr(act == A.HARDSWISH):
        c = cute.arch.fmax(cute.arch.fmin(x + 3.0, Float32(6.0)), Float32(0.0))
        y = x * c * (scale / 6.0)
        mid = x * (scale / 3.0) + 0.5 * scale
        g = cutlass.select_(x <= -3.0, Float32(0.0), cutlass.select_(x >= 3.0, scale, mid))
    return Float32(y), Float32(g)
