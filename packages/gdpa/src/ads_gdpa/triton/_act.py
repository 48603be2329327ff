"""@triton.jit activation helpers: f(x) and f'(x) for every ``Activation`` id (spec §1.4).

``ACT`` is a constexpr so each kernel specialises to one activation; ``act_dyn`` dispatches on a
runtime id (per-head activation lists) by unrolling over the ids. ``FAST`` turns on PTX
``tanh.approx``; it must be off under TRITON_INTERPRET (the interpreter cannot run inline asm).
"""

import triton
import triton.language as tl

BETA = tl.constexpr(0.7978845608)  # sqrt(2/pi)
BETA_BF16 = tl.constexpr(0.796875)  # BETA rounded to bf16, as the upstream fast_gelu_bf16 kernel uses
GELU_C = tl.constexpr(0.044715)
GELU_DC = tl.constexpr(0.1070322243)  # 3 * GELU_C * BETA
INV_SQRT2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804)
TAYLOR_C2 = tl.constexpr(0.3989422804)
TAYLOR_C4 = tl.constexpr(-0.0664903801)
TAYLOR_C6 = tl.constexpr(0.0099735570)
N_ACT = tl.constexpr(12)


@triton.jit
def _tanh_approx(u):
    """Hardware tanh (MUFU, ~2^-11 relative error), sm75+."""
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _tanh(u, FAST: tl.constexpr):
    if FAST:
        t = _tanh_approx(u)
    else:
        # 2*sigmoid(2u) - 1, as the upstream portable path; exact enough in fp32
        t = 2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0
    return t


@triton.jit
def act_fwd(x, ACT: tl.constexpr, FAST: tl.constexpr):
    """f(x) in fp32 for a constexpr activation id."""
    if ACT == 0:
        y = x
    elif ACT == 1:
        y = 0.5 * x * (1.0 + tl.math.erf(x * INV_SQRT2))
    elif ACT == 2:
        y = 0.5 * x * (1.0 + _tanh(BETA * x * (1.0 + GELU_C * x * x), False))
    elif ACT == 3:
        y = 0.5 * x * (1.0 + _tanh(BETA * x * (1.0 + GELU_C * x * x), FAST))
    elif ACT == 4:
        y = tl.where(x >= 0, x, 0.01 * x)
    elif ACT == 5:
        y = tl.maximum(x, 0.0)
    elif ACT == 6:
        # bf16 inputs and bf16 tanh as upstream: round x, the tanh argument and tanh itself to bf16
        xb = x.to(tl.bfloat16).to(tl.float32)
        u = (xb * BETA_BF16 * (1.0 + xb * xb * GELU_C)).to(tl.bfloat16).to(tl.float32)
        t = _tanh(u, FAST).to(tl.bfloat16).to(tl.float32)
        y = 0.5 * xb * (1.0 + t)
    elif ACT == 7:
        y = x / (1.0 + tl.exp(-x))
    elif ACT == 8:
        y = tl.fdiv(x, 1.0 + tl.exp(-x), ieee_rounding=False)
    elif ACT == 9:
        y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)
    elif ACT == 10:
        r = tl.maximum(x, 0.0)
        y = r * r
    else:
        # the real erf-GELU Maclaurin polynomial (opt-in; accurate for |x| <~ 1.5)
        x2 = x * x
        y = 0.5 * x + x2 * (TAYLOR_C2 + x2 * (TAYLOR_C4 + x2 * TAYLOR_C6))
    return y


@triton.jit
def act_fwd_bwd(x, ACT: tl.constexpr, FAST: tl.constexpr):
    """(f(x), f'(x)) in fp32; shares the transcendental between the two."""
    if ACT == 0:
        y = x
        g = tl.full(x.shape, 1.0, tl.float32)
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(x * INV_SQRT2))
        y = x * cdf
        g = cdf + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI
    elif ACT == 2 or ACT == 3 or ACT == 6:
        # fast_gelu_bf16's gradient is the fp32 tanh-GELU gradient (spec §1.4)
        t = _tanh(BETA * x * (1.0 + GELU_C * x * x), FAST and ACT != 2)
        y = 0.5 * x * (1.0 + t)
        g = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (BETA + GELU_DC * x * x)
        if ACT == 6:
            y = act_fwd(x, 6, FAST)
    elif ACT == 4:
        y = tl.where(x >= 0, x, 0.01 * x)
        g = tl.where(x >= 0, 1.0, 0.01)
    elif ACT == 5:
        y = tl.maximum(x, 0.0)
        g = tl.where(x >= 0, 1.0, 0.0)
    elif ACT == 7 or ACT == 8:
        s = 1.0 / (1.0 + tl.exp(-x))
        y = x * s
        g = s * (1.0 + x * (1.0 - s))
    elif ACT == 9:
        y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) * (1.0 / 6.0)
        g = tl.where(x <= -3.0, 0.0, tl.where(x >= 3.0, 1.0, x * (1.0 / 3.0) + 0.5))
    elif ACT == 10:
        r = tl.maximum(x, 0.0)
        y = r * r
        g = 2.0 * r
    else:
        x2 = x * x
        y = 0.5 * x + x2 * (TAYLOR_C2 + x2 * (TAYLOR_C4 + x2 * TAYLOR_C6))
        g = 0.5 + x * (2.0 * TAYLOR_C2 + x2 * (4.0 * TAYLOR_C4 + x2 * (6.0 * TAYLOR_C6)))
    return y, g


@triton.jit
def act_fwd_dyn(x, act_id, FAST: tl.constexpr):
    """f(x) for a runtime id (per-head lists); the id is uniform per program, so no divergence."""
    y = x
    for a in tl.static_range(N_ACT):
        if act_id == a:
            y = act_fwd(x, a, FAST)
    return y


@triton.jit
def act_fwd_bwd_dyn(x, act_id, FAST: tl.constexpr):
    """(f(x), f'(x)) for a runtime id."""
    y = x
    g = tl.full(x.shape, 1.0, tl.float32)
    for a in tl.static_range(N_ACT):
        if act_id == a:
            y, g = act_fwd_bwd(x, a, FAST)
    return y, g
