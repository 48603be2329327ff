"""@triton.jit activation helpers: f(x) and f'(x) for every ``Activation`` id (spec §1.4).

``ACT`` is a constexpr so each kernel specialises to one activation; ``act_dyn`` dispatches on a
runtime id (per-head activation lists) by unrolling over the ids. ``FAST`` turns on PTX
``tanh.approx``; it must be off under TRITON_INTERPRET (the interpreter cannot run inline asm).
``LP`` is the 16-bit type fast_gelu_bf16 rounds to: the inputs' type for fp16 inputs, bf16
otherwise (upstream rounds S to the inputs' type before its 16-bit tanh).
"""

import triton
import triton.language as tl

from ads_kernel_tools.kernels.hw_math import tanh_approx

from ..activations import Activation

BETA = tl.constexpr(0.7978845608)  # sqrt(2/pi)
BETA_BF16 = tl.constexpr(0.796875)  # BETA rounded to bf16, as the upstream fast_gelu_bf16 kernel uses
GELU_C = tl.constexpr(0.044715)
GELU_DC = tl.constexpr(0.1070322243)  # 3 * GELU_C * BETA
INV_SQRT_2PI = tl.constexpr(0.3989422804)
LOG2E = 1.4426950408889634
# Φ(x) = ½·erfc(−x/√2) through the Chebyshev fit of erfc in Numerical Recipes (Press et al., 2nd ed.,
# §6.2, ``erfcc``): erfc(z) = t·exp(−z² + Σ c_i tⁱ), t = 1/(1 + z/2), fractional error below 1.2e-7
# for every z ≥ 0, so the tail (x ≪ 0) keeps its relative accuracy. The coefficients below are the
# fit's, times log2(e) for exp2, with the ½ folded into the constant term.
_ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
             1.48851587, -0.82215223, 0.17087277)  # fmt: skip
ERFC_E = [tl.constexpr(c * LOG2E - (1.0 if i == 0 else 0.0)) for i, c in enumerate(_ERFC_FIT)]
ERFC_E0, ERFC_E1, ERFC_E2, ERFC_E3, ERFC_E4, ERFC_E5, ERFC_E6, ERFC_E7, ERFC_E8, ERFC_E9 = ERFC_E
ERFC_T = tl.constexpr(0.5 * 0.7071067811865476)  # t = 1 / (1 + ERFC_T·|x|)
NEG_HALF_LOG2E = tl.constexpr(-0.5 * LOG2E)
TAYLOR_C2 = tl.constexpr(0.3989422804)
TAYLOR_C4 = tl.constexpr(-0.0664903801)
TAYLOR_C6 = tl.constexpr(0.0099735570)
# The activation ids as constexprs, from the one enum (``ads_gdpa.activations.Activation``): kernels
# compare ``ACT == A_FAST_GELU``, never a literal id.
A_RAW = tl.constexpr(int(Activation.RAW))
A_GELU = tl.constexpr(int(Activation.GELU))
A_GELU_APPROX = tl.constexpr(int(Activation.GELU_APPROX))
A_FAST_GELU = tl.constexpr(int(Activation.FAST_GELU))
A_LEAKY_RELU = tl.constexpr(int(Activation.LEAKY_RELU))
A_RELU = tl.constexpr(int(Activation.RELU))
A_FAST_GELU_BF16 = tl.constexpr(int(Activation.FAST_GELU_BF16))
A_SILU = tl.constexpr(int(Activation.SILU))
A_FAST_SILU = tl.constexpr(int(Activation.FAST_SILU))
A_HARDSWISH = tl.constexpr(int(Activation.HARDSWISH))
A_RELU_SQUARE = tl.constexpr(int(Activation.RELU_SQUARE))
A_FAST_GELU_TAYLOR_APPROX = tl.constexpr(int(Activation.FAST_GELU_TAYLOR_APPROX))
N_ACT = tl.constexpr(len(Activation))


@triton.jit
def _tanh(u, FAST: tl.constexpr):
    if FAST:
        t = tanh_approx(u)
    else:
        # 2*sigmoid(2u) - 1, as the upstream portable path; exact enough in fp32
        t = 2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0
    return t


@triton.jit
def gelu_cdf(x, t):
    """Φ(x), the standard normal CDF, given t = 1 / (1 + ERFC_T·|x|); the caller takes that
    reciprocal (exactly here, with the hardware ``rcp.approx`` in the Gluon kernels, which call this
    too). No branch and two transcendental instructions (reciprocal, exp2), where libdevice's
    ``erff`` costs the Hopper forward a third of its speed."""
    e = ERFC_E0 + t * (ERFC_E1 + t * (ERFC_E2 + t * (ERFC_E3 + t * (ERFC_E4 + t * (
        ERFC_E5 + t * (ERFC_E6 + t * (ERFC_E7 + t * (ERFC_E8 + t * ERFC_E9))))))))  # fmt: skip
    q = t * tl.exp2(x * x * NEG_HALF_LOG2E + e)  # ½·erfc(|x|/√2) = Φ(−|x|)
    return tl.where(x >= 0, 1.0 - q, q)


@triton.jit
def _round16(x, LP: tl.constexpr):
    """x rounded to fp16 if ``LP`` is fp16, else to bf16, back in fp32."""
    if LP == tl.float16:
        r = x.to(tl.float16).to(tl.float32)
    else:
        r = x.to(tl.bfloat16).to(tl.float32)
    return r


@triton.jit
def act_fwd(x, ACT: tl.constexpr, FAST: tl.constexpr, LP: tl.constexpr):
    """f(x) in fp32 for a constexpr activation id."""
    if ACT == A_RAW:
        y = x
    elif ACT == A_GELU:
        y = x * gelu_cdf(x, 1.0 / (1.0 + ERFC_T * tl.abs(x)))
    elif ACT == A_GELU_APPROX:
        y = 0.5 * x * (1.0 + _tanh(BETA * x * (1.0 + GELU_C * x * x), False))
    elif ACT == A_FAST_GELU:
        y = 0.5 * x * (1.0 + _tanh(BETA * x * (1.0 + GELU_C * x * x), FAST))
    elif ACT == A_LEAKY_RELU:
        y = tl.where(x >= 0, x, 0.01 * x)
    elif ACT == A_RELU:
        y = tl.maximum(x, 0.0)
    elif ACT == A_FAST_GELU_BF16:
        # 16-bit inputs and tanh as upstream: round x, the tanh argument and tanh itself to LP
        xb = _round16(x, LP)
        u = _round16(xb * BETA_BF16 * (1.0 + xb * xb * GELU_C), LP)
        t = _round16(_tanh(u, FAST), LP)
        y = 0.5 * xb * (1.0 + t)
    elif ACT == A_SILU:
        y = x / (1.0 + tl.exp(-x))
    elif ACT == A_FAST_SILU:
        y = tl.fdiv(x, 1.0 + tl.exp(-x), ieee_rounding=False)
    elif ACT == A_HARDSWISH:
        y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)
    elif ACT == A_RELU_SQUARE:
        r = tl.maximum(x, 0.0)
        y = r * r
    else:
        # the real erf-GELU Maclaurin polynomial (opt-in; accurate for |x| <~ 1.5)
        x2 = x * x
        y = 0.5 * x + x2 * (TAYLOR_C2 + x2 * (TAYLOR_C4 + x2 * TAYLOR_C6))
    return y


@triton.jit
def act_fwd_bwd(x, ACT: tl.constexpr, FAST: tl.constexpr, LP: tl.constexpr):
    """(f(x), f'(x)) in fp32; shares the transcendental between the two."""
    if ACT == A_RAW:
        y = x
        g = tl.full(x.shape, 1.0, tl.float32)
    elif ACT == A_GELU:
        cdf = gelu_cdf(x, 1.0 / (1.0 + ERFC_T * tl.abs(x)))
        y = x * cdf
        g = cdf + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    elif ACT == A_GELU_APPROX or ACT == A_FAST_GELU or ACT == A_FAST_GELU_BF16:
        # fast_gelu_bf16's gradient is the fp32 tanh-GELU gradient (spec §1.4)
        t = _tanh(BETA * x * (1.0 + GELU_C * x * x), FAST and ACT != 2)
        y = 0.5 * x * (1.0 + t)
        g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (BETA + GELU_DC * x * x)
        if ACT == A_FAST_GELU_BF16:
            y = act_fwd(x, A_FAST_GELU_BF16, FAST, LP)
    elif ACT == A_LEAKY_RELU:
        y = tl.where(x >= 0, x, 0.01 * x)
        g = tl.where(x >= 0, 1.0, 0.01)
    elif ACT == A_RELU:
        y = tl.maximum(x, 0.0)
        g = tl.where(x >= 0, 1.0, 0.0)
    elif ACT == A_SILU or ACT == A_FAST_SILU:
        s = 1.0 / (1.0 + tl.exp(-x))
        y = x * s
        g = s * (1.0 + x * (1.0 - s))
    elif ACT == A_HARDSWISH:
        y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)
        g = tl.where(x <= -3.0, 0.0, tl.where(x >= 3.0, 1.0, x * (1.0 / 3.0) + 0.5))
    elif ACT == A_RELU_SQUARE:
        r = tl.maximum(x, 0.0)
        y = r * r
        g = 2.0 * r
    else:
        x2 = x * x
        y = 0.5 * x + x2 * (TAYLOR_C2 + x2 * (TAYLOR_C4 + x2 * TAYLOR_C6))
        g = 0.5 + x * (2.0 * TAYLOR_C2 + x2 * (4.0 * TAYLOR_C4 + x2 * (6.0 * TAYLOR_C6)))
    return y, g


@triton.jit
def act_fwd_dyn(x, act_id, FAST: tl.constexpr, LP: tl.constexpr):
    """f(x) for a runtime id (per-head lists); the id is uniform per program, so no divergence."""
    y = x
    for a in tl.static_range(N_ACT):
        if act_id == a:
            y = act_fwd(x, a, FAST, LP)
    return y


@triton.jit
def act_fwd_bwd_dyn(x, act_id, FAST: tl.constexpr, LP: tl.constexpr):
    """(f(x), f'(x)) for a runtime id."""
    y = x
    g = tl.full(x.shape, 1.0, tl.float32)
    for a in tl.static_range(N_ACT):
        if act_id == a:
            y, g = act_fwd_bwd(x, a, FAST, LP)
    return y, g
