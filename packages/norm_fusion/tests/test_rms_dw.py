"""``rmsnorm_linear``'s weight-gradient kernel (``triton._rms_dw``) on its own: dW = dyᵀ·diag(rrms)·x·diag(γ)
against fp64 math on the same inputs, at M around the kernel's row step and split boundaries."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE

from ads_kernel_tools.testing import randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from ads_norm_fusion import _ops
from ads_norm_fusion.triton.launch import launch_rms_dw, rms_dw_splits

CPU_M = [0, 1, 31, 33, 200]  # interpreter row step 32: empty, one row, step - 1, step + 1, several splits
GPU_M = [1, 63, 65, 4096 + 1, 524288 + 7]  # row step 64; the last takes about two programs per SM


def _inputs(m: int, k: int, n: int, gamma: bool, dtype=torch.bfloat16):
    dy = randn((m, n), dtype=dtype, device=DEVICE, seed=1)
    x = randn((m, k), dtype=dtype, device=DEVICE, seed=2) * 3.0
    rrms = (torch.rand(m, device=DEVICE) + 0.2) / 3.0  # about 1 / rms(x)
    g = (1 + 0.5 * randn((k,), seed=3)).to(dtype).to(DEVICE) if gamma else None
    return dy, x, rrms, g


def _expected(dy, x, rrms, g, dtype):
    """dW in ``dtype`` math (x̂·γ rounded, as cuBLAS on x̂·γ would see it) and in fp64."""
    out = []
    for dt in (torch.float64, dtype):
        xg = x.double() * rrms.double()[:, None] * (g.double() if g is not None else 1.0)
        out.append((dy.to(dt).t() @ xg.to(dt)).to(dt))
    return out


@pytest.mark.parametrize("gamma", [True, False])
@pytest.mark.parametrize(
    "m", [pytest.param(m, id=f"m{m}") for m in CPU_M]
    + [pytest.param(m, id=f"m{m}", marks=pytest.mark.gpu) for m in GPU_M],
)  # fmt: skip
def test_rms_dw(m: int, gamma: bool) -> None:
    k, n = (48, 48) if DEVICE == "cpu" else (384, 256)
    dy, x, rrms, g = _inputs(m, k, n, gamma)
    ref, base = _expected(dy, x, rrms, g, dy.dtype)
    dw = _ops.rms_dw(dy, x, rrms, g)
    assert dw.dtype == dy.dtype and dw.shape == (n, k)
    assert_close_vs_baseline(dw, ref, base, name="dW")


def test_rms_dw_writes_every_partial() -> None:
    """A NaN-poisoned partial buffer comes back finite: every (split, row, column) is written."""
    m, k, n = (200, 48, 48) if DEVICE == "cpu" else (100_000, 256, 256)
    dy, x, rrms, g = _inputs(m, k, n, True)
    splits = rms_dw_splits(m, n, k, x.device).splits
    assert splits > 1, "the case must cross split boundaries"
    part = torch.full((splits, n, k), float("nan"), device=DEVICE)
    launch_rms_dw(dy, x, rrms, g, part)
    assert torch.isfinite(part).all()
    ref, base = _expected(dy, x, rrms, g, dy.dtype)
    assert_close_vs_baseline(part.sum(0).to(dy.dtype), ref, base, name="dW")


def test_rms_dw_checks_its_buffer() -> None:
    dy, x, rrms, g = _inputs(40, 48, 80, True)
    with pytest.raises(ValueError, match="partial dW buffer"):
        launch_rms_dw(dy, x, rrms, g, torch.empty((1, 80, 47), device=DEVICE))
