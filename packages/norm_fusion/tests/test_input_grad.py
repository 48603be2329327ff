"""linear_layernorm_input_grad / linear_rmsnorm_input_grad (spec B2/B4) against the tools references."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE, check

from ads_kernel_tools.reference.norm import gemm_layer_norm_input_grad_ref, gemm_rms_norm_input_grad_ref
from ads_kernel_tools.testing import randn
from ads_norm_fusion import linear_layernorm_input_grad, linear_rmsnorm_input_grad

# (37, 48, 32) and (1001, 96, 80): the one-tile backward over several row blocks (on the GPU in a
# 128-wide tile, wider than the row: the descriptors' bounds)
CPU_SHAPES = [(37, 48, 80), (1, 32, 16), (37, 48, 32), (20, 64, 1040)]
GPU_SHAPES = [(8192, 512, 512), (1001, 768, 384), (1001, 96, 80), (513, 1040, 1040), (64, 256, 8192)]
SHAPES = [pytest.param(*s, id="x".join(map(str, s))) for s in CPU_SHAPES] + [
    pytest.param(*s, id="x".join(map(str, s)), marks=pytest.mark.gpu) for s in GPU_SHAPES
]


def _data(m, k, n, dtype, rms):
    """A real forward's x̂ and statistic (from z ~ N(mu, sigma) rows), dy scaled like the spec (×0.01)."""
    z = randn((m, n), seed=1) * 2 + 0.5
    if rms:
        rstat = torch.rsqrt(z.square().mean(-1) + 1e-6)
        xhat = z * rstat[:, None]
    else:
        var = (z - z.mean(-1, keepdim=True)).square().mean(-1)
        rstat = torch.rsqrt(var + 1e-5)
        xhat = (z - z.mean(-1, keepdim=True)) * rstat[:, None]
    dy = randn((m, k), dtype=dtype, device=DEVICE, seed=2, scale=0.01)
    w_next_t = randn((k, n), dtype=dtype, device=DEVICE, seed=3, scale=k**-0.5)
    return dy, w_next_t, xhat.to(dtype).to(DEVICE), rstat.to(DEVICE)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype,weighted", [(torch.bfloat16, True), (torch.float16, False)])
def test_layernorm_input_grad(m, k, n, dtype, weighted) -> None:
    dy, w2, xhat, rstd = _data(m, k, n, dtype, rms=False)
    gamma = (1 + 0.5 * randn((n,), seed=4)).to(dtype).to(DEVICE) if weighted else None
    out = linear_layernorm_input_grad(dy, w2, xhat, rstd, gamma, weight_grads=True)
    ref = gemm_layer_norm_input_grad_ref(dy, w2, xhat, rstd, gamma, weight_grads=True)
    # baseline: g rounded to the input precision (what an unfused dy @ W2 would hand the norm backward)
    g = (dy @ w2).float()
    eye = torch.eye(n, dtype=dtype, device=DEVICE)
    base = gemm_layer_norm_input_grad_ref(g.to(dtype), eye, xhat, rstd, gamma, weight_grads=True, dtype=dtype)
    for name, o, r, b in zip(("dz", "dweight", "dbias"), out, ref, base):
        check(o, r, b, name)
    dz_only = linear_layernorm_input_grad(dy, w2, xhat, rstd, gamma)
    assert torch.equal(dz_only, out[0])


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_input_grad(m, k, n, dtype) -> None:
    if DEVICE == "cpu" and dtype == torch.float16 and n > 100:
        pytest.skip("CPU time: fp16 on the small shapes only")
    dy, w2, xhat, rrms = _data(m, k, n, dtype, rms=True)
    out = linear_rmsnorm_input_grad(dy, w2, xhat, rrms)
    ref = gemm_rms_norm_input_grad_ref(dy, w2, xhat, rrms)
    g = (dy @ w2).to(dtype)
    base = gemm_rms_norm_input_grad_ref(g, torch.eye(n, dtype=dtype, device=DEVICE), xhat, rrms, dtype=dtype)
    check(out, ref, base, "dz")


def test_weight_grads_deterministic() -> None:
    dy, w2, xhat, rstd = _data(100, 64, 96, torch.bfloat16, rms=False)
    gamma = torch.ones(96, dtype=torch.bfloat16, device=DEVICE)
    a = linear_layernorm_input_grad(dy, w2, xhat, rstd, gamma, weight_grads=True)
    b = linear_layernorm_input_grad(dy, w2, xhat, rstd, gamma, weight_grads=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
