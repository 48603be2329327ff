"""Tests of the norm references against torch.nn.functional and autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ads_kernel_tools.reference.norm import (
    gemm_layer_norm_input_grad_ref,
    gemm_layer_norm_ref,
    gemm_rms_norm_input_grad_ref,
    gemm_rms_norm_ref,
    layer_norm_ref,
    rms_norm_gemm_ref,
    rms_norm_ref,
)

F64 = torch.float64


def _rand(*shape, seed, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_matches_torch(affine):
    x = 3 + 2 * _rand(4, 5, 96, seed=0)
    w, b = (_rand(96, seed=1), _rand(96, seed=2)) if affine else (None, None)
    y, mean, rstd = layer_norm_ref(x, w, b, 1e-5, return_stats=True, dtype=F64)
    torch.testing.assert_close(y, F.layer_norm(x, (96,), w, b, 1e-5))
    torch.testing.assert_close(mean, x.mean(-1))
    torch.testing.assert_close(rstd, 1 / torch.sqrt(x.var(-1, unbiased=False) + 1e-5))
    assert layer_norm_ref(x.float(), eps=1e-5).dtype == torch.float32


@pytest.mark.parametrize("affine", [False, True])
def test_rms_norm_matches_torch(affine):
    x = _rand(6, 128, seed=3)
    w = _rand(128, seed=4) if affine else None
    y, rrms = rms_norm_ref(x, w, 1e-6, return_stats=True, dtype=F64)
    torch.testing.assert_close(y, F.rms_norm(x, (128,), w, 1e-6))
    torch.testing.assert_close(rrms, torch.rsqrt(x.square().mean(-1) + 1e-6))


def test_low_precision_output_rounded_once():
    x = _rand(8, 64, seed=5, dtype=torch.float32).to(torch.bfloat16)
    y = layer_norm_ref(x, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, F.layer_norm(x.float(), (64,)).to(torch.bfloat16), rtol=0, atol=0)


def test_gemm_layer_norm_matches_torch_and_grads():
    x, w = _rand(16, 32, seed=6).requires_grad_(True), _rand(32, 64, seed=7).requires_grad_(True)
    g, b = _rand(64, seed=8), _rand(64, seed=9)
    y, mean, rstd = gemm_layer_norm_ref(x, w, g, b, 1e-5, return_stats=True, dtype=F64)
    ref = F.layer_norm(x @ w, (64,), g, b, 1e-5)
    torch.testing.assert_close(y, ref)
    assert mean.shape == rstd.shape == (16,)
    dy = _rand(16, 64, seed=10)
    for a, c in zip(torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(ref, (x, w), dy), strict=True):
        torch.testing.assert_close(a, c)


def test_gemm_rms_norm_matches_torch():
    x, w = _rand(16, 32, seed=11), _rand(32, 48, seed=12)
    y, rrms = gemm_rms_norm_ref(x, w, return_stats=True, dtype=F64)
    torch.testing.assert_close(y, F.rms_norm(x @ w, (48,), None, 1e-5))
    assert rrms.shape == (16,)
    gamma = _rand(48, seed=13)
    torch.testing.assert_close(
        gemm_rms_norm_ref(x, w, gamma, dtype=F64), F.rms_norm(x @ w, (48,), gamma, 1e-5)
    )
    # bf16 baseline: inputs rounded, fp32 accumulator and statistics, output rounded once
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    base = gemm_rms_norm_ref(xb, wb, dtype=torch.bfloat16)
    expected = F.rms_norm(xb.float() @ wb.float(), (48,), None, 1e-5).to(torch.bfloat16)
    torch.testing.assert_close(base, expected, rtol=0, atol=1e-2)


def test_rms_norm_gemm_matches_unfused():
    x, w, gamma = _rand(8, 64, seed=14), _rand(64, 16, seed=15), _rand(64, seed=16)
    out = rms_norm_gemm_ref(x, w, gamma, dtype=F64)
    torch.testing.assert_close(out, F.rms_norm(x, (64,), gamma, 1e-6) @ w)


def test_layer_norm_input_grad_matches_autograd():
    # forward chain: z -> LN (affine) -> y -> y @ W2; the fused kernel returns dz from dy
    m, n, k = 8, 32, 24
    z = _rand(m, n, seed=17).requires_grad_(True)
    gamma, beta = _rand(n, seed=18).requires_grad_(True), _rand(n, seed=19).requires_grad_(True)
    w2 = _rand(n, k, seed=20)  # y @ w2 ; the kernel takes w2_t = w2ᵀ (K, N)
    dy = _rand(m, k, seed=21)
    y, _, rstd = layer_norm_ref(z, gamma, beta, 1e-5, return_stats=True, dtype=F64)
    dz_ref, dg_ref, db_ref = torch.autograd.grad(y @ w2, (z, gamma, beta), dy)
    x_hat = layer_norm_ref(z.detach(), eps=1e-5, dtype=F64)
    dz, dg, db = gemm_layer_norm_input_grad_ref(
        dy, w2.T, x_hat, rstd.detach(), gamma.detach(), weight_grads=True, dtype=F64
    )
    torch.testing.assert_close(dz, dz_ref)
    torch.testing.assert_close(dg, dg_ref)
    torch.testing.assert_close(db, db_ref)
    # without weights the formula is the plain LN backward
    y0 = layer_norm_ref(z, eps=1e-5, dtype=F64)
    (dz0,) = torch.autograd.grad(y0 @ w2, z, dy)
    torch.testing.assert_close(gemm_layer_norm_input_grad_ref(dy, w2.T, x_hat, rstd.detach(), dtype=F64), dz0)


def test_rms_norm_input_grad_matches_autograd():
    m, n, k = 8, 32, 24
    h = _rand(m, n, seed=22).requires_grad_(True)
    w2, dy = _rand(n, k, seed=23), _rand(m, k, seed=24)
    y, rrms = rms_norm_ref(h, eps=1e-5, return_stats=True, dtype=F64)
    (dh_ref,) = torch.autograd.grad(y @ w2, h, dy)
    dh = gemm_rms_norm_input_grad_ref(dy, w2.T, y.detach(), rrms.detach(), dtype=F64)
    torch.testing.assert_close(dh, dh_ref)
