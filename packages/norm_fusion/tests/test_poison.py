"""Launchers write every element of their outputs and nothing outside (NaN-poisoned buffers with
guard rows), for the single-tile and the two-phase paths, forward and backward."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE

from ads_kernel_tools.testing import poisoned_empty, randn
from ads_norm_fusion.triton.launch import launch_rms_gemm, launch_rownorm, launch_scaled_gemm, rms_gemm_blocks


def _guarded(m, n, dtype):
    """A NaN buffer with 3 guard rows on each side; returns (full, the (m, n) view in the middle)."""
    full = poisoned_empty((m + 6, n), dtype=dtype, device=DEVICE)
    return full, full[3 : 3 + m]


def _assert_written(full, m, name):
    inner, guard = full[3 : 3 + m], torch.cat([full[:3], full[3 + m :]])
    assert not inner.isnan().any(), f"{name}: {int(inner.isnan().sum())} elements not written"
    assert guard.isnan().all(), f"{name}: wrote outside its rows"


# 161 rows: five row blocks of 32 and a partial one, several per persistent program under the
# interpreter; 17000: 133 row blocks of 128 on the H200's 132 programs, the last one partial
@pytest.mark.parametrize(
    "m,k,n",
    [
        (33, 32, 32),
        (37, 48, 80),
        (1, 16, 112),
        (161, 16, 80),
        pytest.param(17000, 64, 528, marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("mode", ["ln_fwd", "rms_fwd"])
def test_forward_writes_all(m, k, n, mode) -> None:
    dt = torch.bfloat16
    x, w = randn((m, k), dtype=dt, device=DEVICE), randn((n, k), dtype=dt, device=DEVICE, seed=1)
    gamma, beta = randn((n,), dtype=dt, device=DEVICE, seed=2), randn((n,), dtype=dt, device=DEVICE, seed=3)
    yf, y = _guarded(m, n, dt)
    xf, xh = _guarded(m, n, dt)
    s1f = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    s2f = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    launch_rownorm(
        mode, x, y, s2f[3 : 3 + m], b=w, gamma=gamma, beta=beta if mode == "ln_fwd" else None,
        xhat=xh, stat1=s1f[3 : 3 + m], eps=1e-5,
    )  # fmt: skip
    _assert_written(yf, m, "y")
    _assert_written(xf, m, "xhat")
    _assert_written(s2f[:, None], m, "rstat")
    if mode == "ln_fwd":
        _assert_written(s1f[:, None], m, "mean")


@pytest.mark.parametrize("m,k,n", [(33, 32, 32), (37, 48, 80)])
@pytest.mark.parametrize("gemm", [False, True])
def test_backward_writes_all(m, k, n, gemm) -> None:
    dt = torch.float16
    xhat = randn((m, n), dtype=dt, device=DEVICE)
    rstat = torch.rand(m, device=DEVICE) + 0.5
    a = randn((m, k if gemm else n), dtype=dt, device=DEVICE, seed=1)
    b = randn((k, n), dtype=dt, device=DEVICE, seed=2) if gemm else None
    df, dz = _guarded(m, n, dt)
    launch_rownorm("ln_bwd", a, dz, rstat, b=b, b_trans=False, aux=xhat)
    _assert_written(df, m, "dz")


@pytest.mark.parametrize("forward", ["rowpass", "fused"])
def test_rms_gemm_writes_all(forward, monkeypatch) -> None:
    """Both rmsnorm_linear forwards (row pass + persistent GEMM with TMA stores; Σx² in the K loop)."""
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_FWD", forward)
    m, k, n = 37, 48, 80
    dt = torch.bfloat16
    x, w = randn((m, k), dtype=dt, device=DEVICE), randn((n, k), dtype=dt, device=DEVICE, seed=1)
    yf, y = _guarded(m, n, dt)
    rf = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    launch_rms_gemm(x, w, y, rf[3 : 3 + m], eps=1e-6)
    _assert_written(yf, m, "y")
    _assert_written(rf[:, None], m, "rrms")


@pytest.mark.parametrize("m,k,n", [(37, 48, 80), (1, 16, 112)])
def test_rms_gemm_dx_writes_all(m, k, n) -> None:
    """The rmsnorm_linear dx GEMM (x tile and dγ partials in the epilogue) writes all of dx and every
    partial-sum row, nothing outside."""
    dt = torch.bfloat16
    dy, w = randn((m, n), dtype=dt, device=DEVICE), randn((n, k), dtype=dt, device=DEVICE, seed=1)
    x, gamma = randn((m, k), dtype=dt, device=DEVICE, seed=2), randn((k,), dtype=dt, device=DEVICE, seed=3)
    r, coef = torch.rand(m, device=DEVICE) + 0.5, torch.randn(m, device=DEVICE)
    dxf, dx = _guarded(m, k, dt)
    blocks = rms_gemm_blocks(m, k, n, backward=True)
    pf, part = _guarded(blocks, k, torch.float32)
    launch_scaled_gemm(dy, w, dx, r, b_trans=False, gamma=gamma, aux=x, coef=coef, part=part)
    _assert_written(dxf, m, "dx")
    _assert_written(pf, blocks, "dgamma partials")
    acc = dy.float() @ w.float()
    want = acc * r[:, None] * gamma.float()[None, :] - x.float() * coef[:, None]
    torch.testing.assert_close(dx.float(), want, atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(part.sum(0), (acc * x.float() * r[:, None]).sum(0), atol=1e-2, rtol=1e-3)
    # a partial-sum buffer short of the tiles' row blocks is refused, not written past its end
    with pytest.raises(ValueError, match="part must be"):
        short = part[: blocks - 1]
        launch_scaled_gemm(dy, w, dx, r, b_trans=False, gamma=gamma, aux=x, coef=coef, part=short)


@pytest.mark.parametrize("n", [80, 32])  # several column tiles; one (the interpreter's tiles are 32 wide)
def test_gemm_mode_is_the_plain_gemm(n) -> None:
    """Mode "gemm" (the benchmark's GEMM-alone reference of our kernel) writes x·wᵀ, every element,
    also where the row is one tile (that path once took the one-tile backward and wrote nothing)."""
    m, k = 37, 48
    x = randn((m, k), dtype=torch.float16, device=DEVICE)
    w = randn((n, k), dtype=torch.float16, device=DEVICE, seed=1)
    yf, y = _guarded(m, n, torch.float16)
    launch_rownorm("gemm", x, y, torch.empty(m, device=DEVICE), b=w)
    _assert_written(yf, m, "y")
    torch.testing.assert_close(y.float(), x.float() @ w.float().t(), atol=2e-2, rtol=2e-3)
