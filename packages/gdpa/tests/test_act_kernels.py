"""The kernels' activation helpers, elementwise in fp32, against the reference f and f'.

Attention-level tests compare bf16 outputs under the 2x-baseline rule, which hides a derivative
that is off by about a percent; here every f and f' is checked on its own at fp32 precision,
including the kinks (0, ±3) where the spec fixes the one-sided value.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from ads_gdpa.triton._act import act_fwd, act_fwd_bwd, act_fwd_bwd_dyn
from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.reference.gdpa import ACTIVATIONS, activation_grad_ref, activation_ref


@triton.jit
def _act_kernel(
    X, Y, G, Y_ONLY, ACT_ID, n, ACT: tl.constexpr, FAST: tl.constexpr, LP: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    y, g = act_fwd_bwd(x, ACT, FAST, LP)
    tl.store(Y + offs, y, mask=mask)
    tl.store(G + offs, g, mask=mask)
    tl.store(Y_ONLY + offs, act_fwd(x, ACT, FAST, LP), mask=mask)
    yd, gd = act_fwd_bwd_dyn(x, tl.load(ACT_ID), FAST, LP)
    # the runtime-id path must agree bit for bit with the constexpr one
    tl.store(Y_ONLY + n + offs, tl.where((yd == y) & (gd == g), 1.0, 0.0), mask=mask)


def _grid(device: str) -> torch.Tensor:
    x = torch.linspace(-8.0, 8.0, 801, dtype=torch.float64)
    kinks = torch.tensor(
        [0.0, -0.0, 3.0, -3.0, 1e-6, -1e-6, 2.999, -2.999, 3.001, -3.001], dtype=torch.float64
    )
    return torch.cat([x, kinks]).to(device=device, dtype=torch.float32)


def _run(act: int, fast: bool, device: str, lp=tl.bfloat16):
    x = _grid(device)
    n = x.numel()
    y, g = torch.empty_like(x), torch.empty_like(x)
    y_only = torch.empty(2 * n, dtype=torch.float32, device=device)
    act_id = torch.tensor([act], dtype=torch.int32, device=device)
    _act_kernel[(triton.cdiv(n, 256),)](x, y, g, y_only, act_id, n, ACT=act, FAST=fast, LP=lp, BLOCK=256)
    return x, y, g, y_only[:n], y_only[n:]


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_and_derivative_fp32(name, device):
    act = ACTIVATIONS.index(name)
    x, y, g, y_only, same = _run(act, fast=False, device=device)
    xd = x.double().cpu()
    ref_y, ref_g = activation_ref(name, xd), activation_grad_ref(name, xd)
    # fast_gelu_bf16 rounds its input, tanh argument and tanh to bf16 on purpose (upstream behaviour)
    y_tol = dict(atol=2e-2, rtol=1e-2) if name == "fast_gelu_bf16" else dict(atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(y.double().cpu(), ref_y, **y_tol)
    torch.testing.assert_close(y_only.double().cpu(), ref_y, **y_tol)  # the forward-only helper
    torch.testing.assert_close(g.double().cpu(), ref_g, atol=2e-6, rtol=2e-6)
    assert bool(same.bool().all()), "runtime-id activation differs from the constexpr one"


def test_fast_gelu_bf16_in_fp16(device):
    """With fp16 inputs fast_gelu_bf16 rounds to fp16 (upstream rounds S to the inputs' type), so it
    is as close to the tanh GELU as fp16 rounding and the bf16 β (0.796875) allow, not bf16."""
    act = ACTIVATIONS.index("fast_gelu_bf16")
    x, y, _g, y_only, same = _run(act, fast=False, device=device, lp=tl.float16)
    ref_y = activation_ref("fast_gelu_bf16", x.double().cpu())
    torch.testing.assert_close(y.double().cpu(), ref_y, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(y_only.double().cpu(), ref_y, atol=2e-3, rtol=2e-3)
    assert bool(same.bool().all())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fast_gelu", "fast_gelu_bf16"])
def test_hardware_tanh_paths(name, device):
    """tanh.approx.f32 has about 2^-11 relative error: the fast paths stay within that."""
    if interpreter_active():
        pytest.skip("inline PTX does not run in the interpreter")
    x, y, g, _, _ = _run(ACTIVATIONS.index(name), fast=True, device=device)
    xd = x.double().cpu()
    y_tol = dict(atol=2e-2, rtol=1e-2) if name == "fast_gelu_bf16" else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(y.double().cpu(), activation_ref(name, xd), **y_tol)
    torch.testing.assert_close(g.double().cpu(), activation_grad_ref(name, xd), atol=4e-3, rtol=4e-3)


try:  # Gluon is optional (a Triton without it runs the portable kernels only)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from ads_gdpa.gluon._act import act_and_grad_scaled, act_scaled

    @gluon.jit
    def _gluon_act_kernel(X, Y, YG, G, n, scale, ACT: gl.constexpr, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout)
        mask = offs < n
        xv = gl.load(X + offs, mask=mask, other=0.0)
        gl.store(Y + offs, act_scaled(xv, scale, ACT), mask=mask)
        y, g = act_and_grad_scaled(xv, scale, ACT)
        gl.store(YG + offs, y, mask=mask)
        gl.store(G + offs, g, mask=mask)
except ImportError:
    _gluon_act_kernel = None


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name", [n for n in ACTIVATIONS if n not in ("fast_gelu_bf16", "fast_gelu_taylor_approx")]
)
def test_gluon_activation_helpers(name, device):
    """The Hopper kernels' own activation code (hardware reciprocal / tanh where it uses them)."""
    if interpreter_active() or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels need an sm_90 GPU")
    if _gluon_act_kernel is None:
        pytest.skip("this Triton has no Gluon")
    x = _grid(device)
    y, yg, g = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    act = ACTIVATIONS.index(name)
    _gluon_act_kernel[(triton.cdiv(x.numel(), 128),)](x, y, yg, g, x.numel(), 0.5, ACT=act, BLOCK=128)
    xd = x.double().cpu()
    ref_y, ref_g = activation_ref(name, xd), activation_grad_ref(name, xd)
    tol = dict(atol=2e-3, rtol=2e-3) if name == "fast_gelu" else dict(atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(y.double().cpu(), 0.5 * ref_y, **tol)
    torch.testing.assert_close(yg.double().cpu(), 0.5 * ref_y, **tol)
    g_tol = dict(atol=4e-3, rtol=4e-3) if name == "fast_gelu" else dict(atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(g.double().cpu(), 0.5 * ref_g, **g_tol)
