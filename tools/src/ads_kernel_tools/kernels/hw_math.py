"""Hardware approximations as @triton.jit helpers (Gluon kernels call them too).

Inline PTX does not run under the Triton interpreter: kernels that use these keep a constexpr
switch to plain math there (``ads_kernel_tools.capability.interpreter_active``).
"""

import triton
import triton.language as tl

__all__ = ["tanh_approx", "rcp_approx", "ex2_approx"]


@triton.jit
def tanh_approx(u):
    """tanh by ``tanh.approx.f32`` (one MUFU instruction, about 2^-11 relative error), sm_75+."""
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def rcp_approx(x):
    """1/x by ``rcp.approx.ftz.f32`` (about 1 ulp): two instructions where fp32 division adds a range
    check and two predicated rescales per element."""
    return tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def ex2_approx(x):
    """2^x by ``ex2.approx.ftz.f32`` (one MUFU instruction), as softmax kernels use for exp."""
    return tl.inline_asm_elementwise(
        "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
    )
