"""from_modules: same outputs, gradients and state dict as the nn.Linear + nn.LayerNorm / nn.RMSNorm pair."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from _cases import DEVICE
from torch import nn

from ads_kernel_tools.tolerance import assert_close_vs_baseline
from ads_norm_fusion import FusedLinearLayerNorm, FusedLinearRMSNorm, RMSNormLinear


def _pair(kind: str, k: int, n: int, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(k, n, device=DEVICE, dtype=dtype)
    if kind == "ln":
        norm = nn.LayerNorm(n, device=DEVICE, dtype=dtype)
    else:
        norm = nn.RMSNorm(k if kind == "rms_linear" else n, eps=1e-6, device=DEVICE, dtype=dtype)
    with torch.no_grad():  # non-trivial affine parameters
        norm.weight.normal_(1.0, 0.3)
        if getattr(norm, "bias", None) is not None:
            norm.bias.normal_(0.0, 0.3)
    if kind == "rms_linear":
        return nn.Sequential(OrderedDict(norm=norm, linear=linear)), RMSNormLinear.from_modules(norm, linear)
    fused_cls = FusedLinearLayerNorm if kind == "ln" else FusedLinearRMSNorm
    return nn.Sequential(OrderedDict(linear=linear, norm=norm)), fused_cls.from_modules(linear, norm)


@pytest.mark.parametrize("kind", ["ln", "rms", "rms_linear"])
def test_from_modules(kind: str) -> None:
    dtype, k, n = torch.bfloat16, 48, 80
    ref_mod, fused = _pair(kind, k, n, dtype)
    assert fused.state_dict().keys() == ref_mod.state_dict().keys()
    assert all(torch.equal(fused.state_dict()[key], v) for key, v in ref_mod.state_dict().items())
    x = torch.randn(3, 7, k, device=DEVICE, dtype=dtype)
    dy = torch.randn(3, 7, n, device=DEVICE, dtype=dtype)
    # the unfused module in fp32 is the reference; in bf16 the baseline
    ref32 = {name: p.detach().float().requires_grad_() for name, p in ref_mod.named_parameters()}
    x32 = x.float().requires_grad_()
    y32 = torch.func.functional_call(ref_mod.float(), ref32, (x32,))
    g32 = torch.autograd.grad(y32, [x32, *ref32.values()], dy.float())
    ref_mod.to(dtype)
    xb = x.clone().requires_grad_()
    yb = ref_mod(xb)
    gb = torch.autograd.grad(yb, [xb, *ref_mod.parameters()], dy)
    xf = x.clone().requires_grad_()
    yf = fused(xf)
    gf = torch.autograd.grad(yf, [xf, *(dict(fused.named_parameters())[k] for k in ref32)], dy)
    assert_close_vs_baseline(yf, y32, yb, name="y")
    for name, a, r, b in zip(["x", *ref32], gf, g32, gb):
        assert_close_vs_baseline(a, r, b, name=f"d{name}")
    # a fresh fused module loads the unfused state dict
    fresh = type(fused).from_modules(*[copy.deepcopy(m) for m in ref_mod])
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(ref_mod.state_dict())
    assert torch.equal(fresh(x), fused(x))


def test_constructors() -> None:
    a = FusedLinearLayerNorm(32, 48, device=DEVICE, dtype=torch.bfloat16)
    b = FusedLinearRMSNorm(32, 48, bias=False, device=DEVICE, dtype=torch.float16)
    c = RMSNormLinear(32, 48, device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(5, 32, device=DEVICE)
    assert (
        a(x.bfloat16()).shape == (5, 48) and b(x.half()).shape == (5, 48) and c(x.bfloat16()).shape == (5, 48)
    )
    assert set(a.state_dict()) == {"linear.weight", "linear.bias", "norm.weight", "norm.bias"}
    with pytest.raises(ValueError, match=r"norm size 32 != linear.out_features 16"):
        FusedLinearLayerNorm.from_modules(nn.Linear(4, 16), nn.LayerNorm(32))
    with pytest.raises(ValueError, match=r"norm size 16 != linear.in_features 4"):
        RMSNormLinear.from_modules(nn.RMSNorm(16), nn.Linear(4, 16))
    with pytest.raises(ValueError, match="takes an nn.RMSNorm and an nn.Linear"):
        RMSNormLinear.from_modules(nn.Linear(16, 16), nn.RMSNorm(16))  # wrong order
    with pytest.raises(ValueError, match="takes an nn.Linear and an nn.RMSNorm"):
        FusedLinearRMSNorm.from_modules(nn.Linear(16, 16), nn.LayerNorm(16))
    # registered in the order they run: the state dict's key order
    pair = RMSNormLinear.from_modules(nn.RMSNorm(16), nn.Linear(16, 8))
    assert list(pair.state_dict()) == ["norm.weight", "linear.weight", "linear.bias"]
    pair = FusedLinearRMSNorm.from_modules(nn.Linear(16, 8), nn.RMSNorm(8))
    assert list(pair.state_dict()) == ["linear.weight", "linear.bias", "norm.weight"]
