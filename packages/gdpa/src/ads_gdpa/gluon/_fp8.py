"""FP8 (e4m3) pieces of the sm_90 Gluon forward: the activation with the score descale folded in.

The scores come from e4m3 operands, so the true S is d·x with d = q_descale·k_descale (> 0, one per
head) and x the fp32 wgmma result. ``act_fp8`` returns y with act(d·x) = ``fp8_gain``(d)·y, folding
d into constants (fast_gelu) or into the gain (raw, leaky_relu, relu and relu_square are positively
homogeneous), so those activations pay no multiply per score for the descale. The overall scale of
y is free: the kernel normalises P by each row's maximum |y| before rounding it to e4m3.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..activations import Activation
from ._act import _tanh, act_scaled

_RAW = gl.constexpr(int(Activation.RAW))
_FAST_GELU = gl.constexpr(int(Activation.FAST_GELU))
_LEAKY_RELU = gl.constexpr(int(Activation.LEAKY_RELU))
_RELU = gl.constexpr(int(Activation.RELU))
_RELU_SQUARE = gl.constexpr(int(Activation.RELU_SQUARE))


@gluon.jit
def act_fp8(x, d, ACT: gl.constexpr):
    """y with act(d·x) = fp8_gain(d, ACT)·y, in fp32; d > 0."""
    if ACT == _FAST_GELU:
        # 2·gelu(d·x)/d = x(1 + tanh(d·x(β + βc·d²x²))): d rides in the two constants
        c0 = 0.7978845608028654 * d
        c1 = 0.035677408136300125 * d * d * d
        y = gl.fma(x, _tanh(x * gl.fma(x * x, c1, c0)), x)
    elif ACT == _RAW or ACT == _LEAKY_RELU or ACT == _RELU or ACT == _RELU_SQUARE:
        y = act_scaled(x, 1.0, ACT)
    else:
        y = act_scaled(x * d, 1.0, ACT)
    return y


@gluon.jit
def fp8_gain(d, ACT: gl.constexpr):
    """The factor that turns ``act_fp8``'s y back into act(d·x)."""
    if ACT == _FAST_GELU:
        g = 0.5 * d
    elif ACT == _RAW or ACT == _LEAKY_RELU or ACT == _RELU:
        g = d
    elif ACT == _RELU_SQUARE:
        g = d * d
    else:
        g = d * 0.0 + 1.0
    return g


@gluon.jit
def row_scaled_p(y, m, p_layout: gl.constexpr, p_dtype: gl.constexpr, RELABEL: gl.constexpr):
    """P for one step of the running-max rule (``fwd_sm90`` module docstring): with m the rows'
    maximum |y| so far, returns (P = e4m3(y·448/m_new), m_new, m/m_new), m_new including this
    tile. Rows whose maximum is still 0 get P = 0 and ratio 0 (no division by zero).

    RELABEL: P's columns are renumbered (``KEY_ORDER``) so that each thread's accumulator values
    already sit where the fp8 wgmma's register A operand wants them, and the layout change costs
    nothing; V must hold its keys in the same order (``v_kmajor(..., relabel=True)``)."""
    m_new = gl.maximum(m, gl.max(gl.abs(y), axis=1))
    inv = 1.0 / gl.where(m_new > 0.0, m_new, 1.0)
    p = y * gl.expand_dims(inv * 448.0, 1)
    if RELABEL:
        R: gl.constexpr = p.shape[0]
        N: gl.constexpr = p.shape[1]
        # column 32a + 16h + 8g + 2t + i -> position 32a + 16h + 4t + 2g + i (swap the g and t fields)
        p = gl.reshape(gl.permute(gl.reshape(p, [R, N // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5)), [R, N])
        p = _e4m3x4(gl.convert_layout(p, p_layout, assert_trivial=True))
    else:
        p = gl.convert_layout(p.to(p_dtype), p_layout)
    return p, m_new, m * inv


@gluon.jit
def _e4m3x4(x):
    """fp32 -> e4m3 (round to nearest, saturating), four values into one register: in the wgmma
    operand layout those are the four that the instruction reads from it, so no byte is moved after
    the conversion (the compiler's own cast unpacks and repacks every byte)."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
        cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
        mov.b32 $0, {lo, hi};
        }""",
        "=r,f,f,f,f",
        [x],
        dtype=gl.float8e4nv,
        is_pure=True,
        pack=4,
    )
