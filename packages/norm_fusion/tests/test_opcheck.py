"""torch.library.opcheck on every custom op, and torch.compile(fullgraph=True) of the public API."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE, Case, inputs

from ads_norm_fusion import _ops, linear_layernorm, linear_rmsnorm, rmsnorm_linear


def _args():
    d = inputs(Case(20, 32, 48))
    x, w, b, g, be = d["x"], d["w"], d["bias"], d["gamma"], d["beta"]
    rstat = torch.rand(20, device=DEVICE) + 0.5
    gk = inputs(Case(20, 32, 48), norm_over="k")["gamma"]
    w_next_t = w.t().contiguous()  # (K=32, N=48) as a next layer's weight
    dy_next = torch.randn(20, 32, device=DEVICE, dtype=x.dtype)
    return {
        "linear_layernorm_fwd": (x, w, b, g, be, 1e-5, True, True),
        "linear_layernorm_fwd_xhat": (x, w, b, g, be, 1e-5, True, False),
        "linear_rmsnorm_fwd": (x, w, None, g, 1e-6, True, True),
        "norm_bwd": (d["dy"], d["dy"].clone(), rstat, None, g, False, False, True, True),
        "norm_bwd_raw": (d["dy"], d["dy"].clone(), rstat, rstat.clone(), g, False, True, True, True),
        "norm_bwd_xg": (d["dy"], d["dy"].clone(), rstat, None, g, True, True, True, False, True),
        "rmsnorm_linear_fwd": (x, gk, w, b, 1e-6),
        "gemm_norm_input_grad": (dy_next, w_next_t, d["dy"].clone(), rstat, g, False, False, True),
        "gemm_norm_input_grad_xg": (dy_next, w_next_t, d["dy"].clone(), rstat, g, True, True, True, True),
        "rms_dw": (d["dy"], x, rstat, gk),
        "row_col_scale": (x, rstat, gk),
        "rmsnorm_linear_dx": (d["dy"], w, x, d["dy"].clone(), rstat, gk, b, True),
        "rmsnorm_linear_dx_no_y": (d["dy"], w, x, None, rstat, gk, b, True),  # K = 32: whole-row tiles
    }


@pytest.mark.parametrize("op", list(_args()))
def test_opcheck(op: str) -> None:
    args = _args()[op]
    for suffix in ("_xhat", "_raw", "_xg", "_no_y"):  # the same op, other options
        op = op.removesuffix(suffix)
    grad_ops = ("linear_layernorm_fwd", "linear_rmsnorm_fwd", "rmsnorm_linear_fwd")
    if op in grad_ops:
        args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.dtype != torch.float32 else a
                     for a in args)  # fmt: skip
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    if op in grad_ops:
        tests = (*tests, "test_autograd_registration")
    torch.library.opcheck(getattr(_ops, op), args, test_utils=tests)


# On the CPU inductor's C++ codegen alone takes ~40 s here; aot_eager still traces the whole graph
# (fullgraph, fakes, autograd). The GPU run uses inductor.
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.gpu)])
def test_compile_fullgraph(backend: str) -> None:
    d = inputs(Case(20, 32, 48))
    gk = inputs(Case(20, 32, 48), norm_over="k")["gamma"]
    leaves = [t.clone().requires_grad_() for t in (d["x"], d["w"], d["bias"], d["gamma"], d["beta"], gk)]

    def f(x, w, b, g, be, gk):
        y1 = linear_layernorm(x, w, b, g, be)
        y2 = linear_rmsnorm(x, w, b, g)
        y3 = rmsnorm_linear(x, gk, w, b)
        return (y1.float() * y2.float() + y3.float()).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    out_c = compiled(*leaves)
    grads_c = torch.autograd.grad(out_c, leaves)
    out_e = f(*leaves)
    grads_e = torch.autograd.grad(out_e, leaves)
    # inductor may fuse the torch ops around ours without their bf16 roundings: 1-2 ulp apart
    tol = {} if backend == "aot_eager" else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out_c, out_e, **tol)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b, **tol)


def test_flop_formulas() -> None:
    """FlopCounterMode sees the GEMM work of each fused op (2·M·N·K)."""
    from torch.utils.flop_counter import FlopCounterMode

    d = inputs(Case(20, 32, 48))
    gk = inputs(Case(20, 32, 48), norm_over="k")["gamma"]
    for fn in (
        lambda: linear_layernorm(d["x"], d["w"], d["bias"], d["gamma"], d["beta"]),
        lambda: linear_rmsnorm(d["x"], d["w"]),
        lambda: rmsnorm_linear(d["x"], gk, d["w"]),
    ):
        with FlopCounterMode(display=False) as counter:
            fn()
        assert counter.get_total_flops() == 2 * 20 * 48 * 32
