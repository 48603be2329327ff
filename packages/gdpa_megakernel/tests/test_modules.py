"""GDPABlock: from_modules on an unfused stack (nn.LayerNorm → ads-gdpa → + q → nn.RMSNorm → +
residual) gives its outputs and gradients, parameters shared; constructor defaults; bad stacks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ads_gdpa import gdpa_varlen
from ads_gdpa_megakernel import GDPABlock
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

H, D, LENGTHS = 2, 16, [0, 1, 31, 33, 5]


def _stack(device, dtype):
    n = H * D
    ln = nn.LayerNorm(n, eps=1e-5, device=device, dtype=dtype)
    rms = nn.RMSNorm(n, eps=1e-5, device=device, dtype=dtype)
    with torch.no_grad():
        for p, seed in ((ln.weight, 1), (ln.bias, 2), (rms.weight, 3)):
            p.copy_(
                1 + 0.2 * randn(p.shape, seed=seed, device=device)
                if p is not ln.bias
                else 0.2 * randn(p.shape, seed=seed, device=device)
            )
    return ln, rms


def _unfused(ln, rms, q, k, v, cu, r, gdpa):
    t = q.shape[0]
    x = ln(q.reshape(t, H * D)) if ln is not None else q.reshape(t, H * D)
    a = gdpa(x.view(t, H, D), k, v, cu, cu, max(LENGTHS), max(LENGTHS), activation="silu", scale=0.25)
    return (rms(a.reshape(t, H * D) + x) + r.reshape(t, H * D)).view(t, H, D)


def _grads(fn, leaves, dout):
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, dout)


def test_from_modules_equals_unfused_stack(device):
    dt = torch.bfloat16
    ln, rms = _stack(device, dt)
    block = GDPABlock.from_modules(
        ln, rms, num_heads=H, head_dim=D, activation="silu", scale=0.25, q_residual=True
    )
    assert block.ln_weight is ln.weight and block.rms_weight is rms.weight  # shared parameters
    t = sum(LENGTHS)
    cu = lengths_to_offsets(LENGTHS, device=device)
    q = randn((t, H, D), dtype=dt, device=device, seed=4).requires_grad_()
    k = randn((t, 1, D), dtype=dt, device=device, seed=5, scale=0.5).requires_grad_()
    v = randn((t, 1, D), dtype=dt, device=device, seed=6).requires_grad_()
    r = randn((t, H, D), dtype=dt, device=device, seed=7).requires_grad_()
    dout = randn((t, H, D), dtype=dt, device=device, seed=8)
    params = [ln.weight, ln.bias, rms.weight]
    leaves = [q, k, v, r, *params]

    ours, g_ours = _grads(
        lambda q, k, v, r, *_: block(q, k, v, cu, cu, max(LENGTHS), max(LENGTHS), residual=r), leaves, dout
    )
    unf, g_unf = _grads(lambda q, k, v, r, *_: _unfused(ln, rms, q, k, v, cu, r, gdpa_varlen), leaves, dout)
    # the truth: the same modules in fp32 over the fp32 GDPA reference
    ln32, rms32 = (m.float() for m in _stack(device, torch.float32))
    with torch.no_grad():
        ln32.weight.copy_(ln.weight.float())
        ln32.bias.copy_(ln.bias.float())
        rms32.weight.copy_(rms.weight.float())
    leaves32 = [x.detach().float().requires_grad_() for x in (q, k, v, r)] + [
        ln32.weight,
        ln32.bias,
        rms32.weight,
    ]
    ref, g_ref = _grads(
        lambda q, k, v, r, *_: _unfused(ln32, rms32, q, k, v, cu, r, gdpa_ref), leaves32, dout.float()
    )
    # ours is at most twice as far from the truth as the unfused stack in bf16 (the baseline rule)
    assert_close_vs_baseline(ours, ref, unf, name="out")
    for name, go, gr, gu in zip(["q", "k", "v", "residual", "ln_w", "ln_b", "rms_w"], g_ours, g_ref, g_unf):
        assert go.dtype == gu.dtype
        assert_close_vs_baseline(go.float(), gr, gu.float(), name=f"d{name}")


def test_constructor_defaults(device):
    block = GDPABlock(H, D, activation="fast_gelu", device=device, dtype=torch.bfloat16)
    assert {n for n, _ in block.named_parameters()} == {"ln_weight", "ln_bias", "rms_weight"}
    t = 9
    cu = lengths_to_offsets([4, 5], device=device)
    q = randn((t, H, D), dtype=torch.bfloat16, device=device, seed=1)
    out = block(q, q, q, cu, cu, 5, 5)
    out.float().sum().backward()
    assert block.ln_weight.grad is not None and block.rms_weight.grad is not None
    assert "q_residual=True" in repr(block)


def test_from_modules_rejects_mismatched_stacks():
    n = H * D
    with pytest.raises(ValueError, match="one eps"):
        GDPABlock.from_modules(nn.LayerNorm(n, eps=1e-5), nn.RMSNorm(n, eps=1e-6), num_heads=H, head_dim=D,
                               activation="silu")  # fmt: skip
    with pytest.raises(ValueError, match="eps=None"):
        GDPABlock.from_modules(None, nn.RMSNorm(n), num_heads=H, head_dim=D, activation="silu")
    with pytest.raises(ValueError, match="H·D"):
        GDPABlock.from_modules(nn.LayerNorm(D), None, num_heads=H, head_dim=D, activation="silu")
    with pytest.raises(ValueError, match="nn.LayerNorm"):
        GDPABlock.from_modules(nn.Linear(n, n), None, num_heads=H, head_dim=D, activation="silu")
    with pytest.raises(ValueError, match="activation"):
        GDPABlock.from_modules(None, None, num_heads=H, head_dim=D, activation="softmax")
