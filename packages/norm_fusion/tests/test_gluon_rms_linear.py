"""The Gluon sm_90 ``rmsnorm_linear`` forward (``gluon.rms_linear_sm90``): which calls its predicate
admits and its knobs (CPU); output and rrms against the fp32 reference through the op, at every
column-tile walk (GPU, ``ADS_NORM_FUSION_RMS_GLUON=on``); that it writes every output element and
nothing outside. Training steps through it: ``test_linear_norm.test_rmsnorm_linear`` (path
``gluon-cublas``)."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE, Case, check, inputs, ref_and_baseline, rmsnorm_linear_torch

from ads_kernel_tools.testing import poisoned_empty, randn
from ads_norm_fusion import config, rmsnorm_linear
from ads_norm_fusion.gluon import dispatch

BF16, FP16 = torch.bfloat16, torch.float16


def _mats(m, k, n, dtype=BF16):
    return torch.zeros(m, k, dtype=dtype), torch.zeros(n, k, dtype=dtype), torch.empty(m, n, dtype=dtype)


def test_knobs(monkeypatch) -> None:
    monkeypatch.delenv("ADS_NORM_FUSION_RMS_GLUON", raising=False)
    monkeypatch.delenv("ADS_NORM_FUSION_RMS_GLUON_NT", raising=False)
    big = config.GLUON_MIN_ELEMENTS
    assert config.rms_gluon(big // 1024, 1024) and not config.rms_gluon(big // 1024 - 1, 1024)
    assert config.rms_gluon_nt() == 1
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "on")
    assert config.rms_gluon(1, 16)
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "0")
    assert not config.rms_gluon(big, big)
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "yes")
    with pytest.raises(ValueError, match="ADS_NORM_FUSION_RMS_GLUON"):
        config.rms_gluon(1, 16)
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON_NT", "4")
    assert config.rms_gluon_nt() == 4
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON_NT", "3")
    with pytest.raises(ValueError, match="ADS_NORM_FUSION_RMS_GLUON_NT"):
        config.rms_gluon_nt()


@pytest.mark.parametrize(
    "m,k,n,dtype,reason",
    [
        (64, 64, 100, BF16, "N=100"),
        (64, 12, 128, BF16, "K=12"),
        (64, 64, 128, torch.float32, "dtype"),
    ],
)
def test_why_not_sizes_and_dtypes(monkeypatch, m, k, n, dtype, reason) -> None:
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "on")
    x, w, out = _mats(m, k, n, dtype)
    assert reason in dispatch.rms_linear_why_not(x, w, out)


def test_why_not_switch_and_layouts(monkeypatch) -> None:
    x, w, out = _mats(64, 64, 128)
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "0")
    assert "ADS_NORM_FUSION_RMS_GLUON" in dispatch.rms_linear_why_not(x, w, out)
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "on")
    assert "strided" in dispatch.rms_linear_why_not(x.t().contiguous().t(), w, out)
    assert "strided" in dispatch.rms_linear_why_not(torch.zeros(64, 72, dtype=BF16)[:, 4:68], w, out)
    bias = torch.zeros(256, dtype=BF16)[::2]
    assert "strided bias" in dispatch.rms_linear_why_not(x, w, out, bias=bias)
    # K and N multiples of 8 (not of 64): every other reason passes, the device decides
    x, w, out = _mats(3, 40, 1032)
    reason = dispatch.rms_linear_why_not(x, w, out)
    assert reason is None or not any(s in reason for s in ("N=", "dtype", "strided"))


def test_split_and_walk() -> None:
    pytest.importorskip("triton.experimental.gluon")
    from ads_norm_fusion.gluon import rms_linear_sm90 as r

    assert r.block_n(64) == 128 and r.block_n(1024) == 256
    assert r.split_for(1024, 256, 1, 132) == 4 and r.split_for(1024, 256, 4, 132) == 1
    assert r.split_for(1040, 256, 2, 132) == 3  # five tiles, the last 16 columns wide
    assert r.split_for(256 * 200, 256, 1, 132) == 132
    assert r.stages_for(256) == 3


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(params=["1", "2", "4"])
def gluon_nt(request, monkeypatch):
    """Each column-tile walk: every program one tile of a row block, or 2 / 4 tiles, x² summed in
    the first."""
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON", "on")
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_GLUON_NT", request.param)


GPU_CASES = [
    Case(1, 64, 128),
    Case(129, 1024, 1024, FP16),
    Case(4097, 384, 768, bias=False),
    Case(777, 1040, 1040),  # K tail of the last 64-deep step, a 16-column last tile
    Case(8513, 96, 384, FP16, affine=False),
    Case(3001, 256, 4096),
    Case(300, 2048, 144, bias=False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_gluon_rmsnorm_linear(gluon_nt, case: Case, scale: float) -> None:
    """Output and rrms of a no-grad call against the fp32 reference; ``scale``: x far from unit
    magnitude, as activations reach the norm (the output does not depend on it)."""
    eps = 1e-6
    d = inputs(case, norm_over="k")
    d["x"] = (d["x"].float() * scale).to(case.dtype)
    wf = d["w"] if d["gamma"] is None else d["w"] * d["gamma"][None, :]
    if _sm90():
        assert dispatch.rms_linear_why_not(d["x"], wf, torch.empty(case.m, case.n, dtype=case.dtype,
                                                                   device=DEVICE)) is None  # fmt: skip
    from ads_norm_fusion import _ops

    with torch.no_grad():
        y, rrms = _ops.rmsnorm_linear_fwd(d["x"], d["gamma"], d["w"], d["bias"], eps)
        y_api = rmsnorm_linear(d["x"], d["gamma"], d["w"], d["bias"], eps)
    (ref, _), (base, _) = ref_and_baseline(
        lambda tt, dt: rmsnorm_linear_torch(tt, dt, eps), d, (), case.dtype, grads=False
    )
    check(y, ref, base, "y")
    assert torch.equal(y_api, y)
    want = torch.rsqrt(d["x"].float().square().mean(-1) + eps)
    torch.testing.assert_close(rrms, want, atol=0, rtol=2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(1, 64, 128), (8513, 96, 384), (3001, 1040, 1040), (700, 64, 4096)])
@pytest.mark.parametrize("nt", [1, 4])
def test_gluon_rmsnorm_linear_writes_all(m, k, n, nt) -> None:
    """Every element of y and rrms written, nothing in the poisoned rows around them."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    from ads_norm_fusion.gluon import rms_linear_sm90

    x, w = randn((m, k), dtype=BF16, device=DEVICE), randn((n, k), dtype=BF16, device=DEVICE, seed=1)
    bias = randn((n,), dtype=BF16, device=DEVICE, seed=2)
    yf = poisoned_empty((m + 6, n), dtype=BF16, device=DEVICE)
    rf = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    rms_linear_sm90.forward(x, w, yf[3 : 3 + m], rf[3 : 3 + m], bias=bias, eps=1e-6, num_sms=sms, nt=nt)
    for full, name in ((yf, "y"), (rf[:, None], "rrms")):
        inner, guard = full[3 : 3 + m], torch.cat([full[:3], full[3 + m :]])
        assert not inner.isnan().any(), f"{name}: {int(inner.isnan().sum())} elements not written"
        assert guard.isnan().all(), f"{name}: wrote outside its rows"
