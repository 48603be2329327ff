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

from ..activations import GELU_B, GELU_BC, GELU_DBC, Activation, bf16x2_word

A = Activation
LOG2E = 1.4426950408889634


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


# fast_gelu's constants as bf16x2 words (both halves the same), for the packed path below
_BF16X2 = {
    name: bf16x2_word(x)
    for name, x in (("b", GELU_B), ("bc", GELU_BC), ("dbc", GELU_DBC), ("half", 0.5), ("one", 1.0))
}


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None) -> cutlass.Int32:
    """Two fp32 values rounded to bf16, ``lo`` in the low half (the order of a fragment's pair)."""
    return cutlass.Int32(
        llvm.inline_asm(
            T.i32(),
            [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
            "cvt.rn.bf16x2.f32 $0, $1, $2;",
            "=r,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def fast_gelu_and_grad_bf16x2(s_lo: Float32, s_hi: Float32, *, loc=None, ip=None):
    """(act, act') of fast_gelu for two scores in packed bf16x2 arithmetic, unscaled: two bf16x2
    words, ``s_lo``'s results in the low halves. Each operation rounds to bf16, as PyTorch's bf16
    GDPA does; the caller applies the scale in fp32 where the products are accumulated."""
    k = _BF16X2
    body = f"""{{
        .reg .b32 x, xx, a, u, t, nt, hs, v, w, n, c_b, c_bc, c_dbc, c_half, c_one;
        mov.b32 c_b, {k["b"]};
        mov.b32 c_bc, {k["bc"]};
        mov.b32 c_dbc, {k["dbc"]};
        mov.b32 c_half, {k["half"]};
        mov.b32 c_one, {k["one"]};
        cvt.rn.bf16x2.f32 x, $2, $3;
        mul.rn.bf16x2 xx, x, x;
        fma.rn.bf16x2 a, xx, c_bc, c_b;
        mul.rn.bf16x2 u, x, a;
        tanh.approx.bf16x2 t, u;
        mul.rn.bf16x2 hs, x, c_half;
        fma.rn.bf16x2 $0, hs, t, hs;
        fma.rn.bf16x2 $1, t, c_half, c_half;
        xor.b32 nt, t, 0x80008000;
        fma.rn.bf16x2 w, t, nt, c_one;
        fma.rn.bf16x2 v, xx, c_dbc, c_b;
        mul.rn.bf16x2 n, hs, w;
        fma.rn.bf16x2 $1, n, v, $1;
    }}"""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32(), T.i32()]),
        [Float32(s_hi).ir_value(loc=loc, ip=ip), Float32(s_lo).ir_value(loc=loc, ip=ip)],
        body,
        "=&r,=&r,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return (
        cutlass.Int32(llvm.extractvalue(T.i32(), res, [0], loc=loc, ip=ip)),
        cutlass.Int32(llvm.extractvalue(T.i32(), res, [1], loc=loc, ip=ip)),
    )


@dsl_user_op
def mul_bf16x2(g: cutlass.Int32, lo: Float32, hi: Float32, *, loc=None, ip=None) -> cutlass.Int32:
    """The bf16x2 word ``g`` times the pair (lo, hi) rounded to bf16x2, in bf16x2 arithmetic."""
    return cutlass.Int32(
        llvm.inline_asm(
            T.i32(),
            [
                cutlass.Int32(g).ir_value(loc=loc, ip=ip),
                Float32(hi).ir_value(loc=loc, ip=ip),
                Float32(lo).ir_value(loc=loc, ip=ip),
            ],
            "{\n .reg .b32 d;\n cvt.rn.bf16x2.f32 d, $2, $3;\n mul.rn.bf16x2 $0, $1, d;\n}",
            "=r,r,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )
