"""The one dispatch: support tables as data, kernels looked up by architecture, no silent fallback."""

from __future__ import annotations

import pytest
import torch

from ads_gdpa import dispatch
from ads_gdpa.activations import Activation
from ads_gdpa.problem import MaskMode

CUDA = torch.device("cuda")


def _call(**kw) -> dispatch.Call:
    base = dict(act=int(Activation.FAST_GELU), d_qk=128, d_v=128, dtype=torch.bfloat16, mask=MaskMode.NONE,
                broadcast_q=False, per_head=False, deterministic=False)  # fmt: skip
    return dispatch.Call(**(base | kw))


@pytest.fixture
def hopper(monkeypatch):
    """Pretend to be an sm90 GPU with Gluon installed (the tables are data: no kernel runs)."""
    monkeypatch.setenv("ADS_SM_OVERRIDE", "9.0")
    monkeypatch.setattr(dispatch, "interpreter_active", lambda: False)
    monkeypatch.setattr(dispatch, "_gluon_importable", lambda: True)
    monkeypatch.delenv("ADS_GDPA_BACKEND", raising=False)
    monkeypatch.delenv("ADS_GDPA_BWD_BACKEND", raising=False)


def test_hopper_takes_gluon_where_the_table_covers_the_call(hopper):
    assert dispatch.backend_for("fwd", CUDA, _call()) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call(dtype=torch.float16, d_qk=64, d_v=64)) == "gluon"
    uncovered = [
        _call(mask=MaskMode.BOTTOM_RIGHT), _call(mask=MaskMode.TOP_LEFT), _call(broadcast_q=True),
        _call(per_head=True), _call(d_qk=96, d_v=96), _call(d_qk=192, d_v=128),
        _call(act=int(Activation.FAST_GELU_BF16)), _call(act=int(Activation.FAST_GELU_TAYLOR_APPROX)),
    ]  # fmt: skip
    for call in uncovered:
        assert dispatch.backend_for("fwd", CUDA, call) == "triton", call
    assert dispatch.backend_for("bwd", CUDA, _call(deterministic=True)) == "triton"


def test_fp8_forward_takes_gluon_for_its_tested_activations_only(hopper):
    fp8 = dict(dtype=torch.float8_e4m3fn)
    for act in (Activation.RAW, Activation.GELU, Activation.FAST_GELU, Activation.RELU, Activation.SILU,
                Activation.RELU_SQUARE):  # fmt: skip
        assert dispatch.backend_for("fwd", CUDA, _call(act=int(act), **fp8)) == "gluon", act
    for act in (Activation.GELU_APPROX, Activation.LEAKY_RELU, Activation.FAST_SILU, Activation.HARDSWISH):
        assert dispatch.backend_for("fwd", CUDA, _call(act=int(act), **fp8)) == "triton", act
    assert dispatch.backend_for("fwd", CUDA, _call(d_qk=96, d_v=96, **fp8)) == "triton"
    assert dispatch.backend_for("fwd", CUDA, _call(mask=MaskMode.TOP_LEFT, **fp8)) == "triton"
    assert dispatch.backend_for("bwd", CUDA, _call(**fp8)) == "triton"  # no FP8 backward row


def test_backend_switch_and_other_architectures(hopper, monkeypatch):
    monkeypatch.setenv("ADS_GDPA_BACKEND", "triton")
    assert dispatch.backend_for("fwd", CUDA, _call()) == "triton"
    assert dispatch.backend_for("bwd", CUDA, _call()) == "triton"
    monkeypatch.setenv("ADS_GDPA_BACKEND", "auto")
    monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", "triton")
    assert dispatch.backend_for("fwd", CUDA, _call()) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call()) == "triton"
    monkeypatch.setenv("ADS_GDPA_BACKEND", "fast")
    with pytest.raises(ValueError, match="ADS_GDPA_BACKEND"):
        dispatch.backend_for("fwd", CUDA, _call())
    monkeypatch.setenv("ADS_GDPA_BACKEND", "auto")
    for sm in ("8.0", "10.0", "12.0"):  # no fast-path kernel there yet: the portable Triton kernels
        monkeypatch.setenv("ADS_SM_OVERRIDE", sm)
        assert dispatch.backend_for("fwd", CUDA, _call()) == "triton"
    assert dispatch.backend_for("fwd", torch.device("cpu"), _call()) == "triton"


def test_every_table_row_names_an_existing_kernel():
    assert set(dispatch.SUPPORT) == set(dispatch.KERNELS)
    for (backend, arch, direction), (module, name) in dispatch.KERNELS.items():
        assert module == f"ads_gdpa.{backend}.{direction}_sm{arch}0" and name.startswith("gdpa_")


def test_a_failing_fast_path_is_an_error_not_a_fallback(hopper, monkeypatch):
    """No ``except`` around the fast path: its exception reaches the caller."""
    from ads_gdpa import gdpa_varlen

    def broken(*a, **kw):
        raise RuntimeError("fast path bug")

    monkeypatch.setattr(dispatch, "kernel", lambda backend, device, direction: broken)
    monkeypatch.setattr(dispatch, "backend_for", lambda direction, device, call: "gluon")
    q = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="fast path bug"):
        gdpa_varlen(q, q, q, cu, cu, 8, 8)


def test_negative_or_nonfinite_descales_raise():
    """The Hopper FP8 kernel folds q_descale·k_descale into the activation: descales must be >= 0."""
    from ads_gdpa import gdpa_varlen

    q = torch.zeros(8, 2, 32).to(torch.float8_e4m3fn)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    ones = torch.ones(2)
    for bad in (torch.tensor([1.0, -0.5]), torch.tensor([float("nan"), 1.0])):
        with pytest.raises(ValueError, match="k_descale must be finite and >= 0"):
            gdpa_varlen(q, q, q, cu, cu, 8, 8, q_descale=ones, k_descale=bad, v_descale=ones)


def test_gluon_tables_stay_within_the_kernels_own_list():
    pytest.importorskip("triton.experimental.gluon")
    from ads_gdpa.gluon import fwd_sm90

    for direction in ("fwd", "bwd"):
        row = dispatch.SUPPORT[("gluon", 9, direction)]
        assert row.activations <= fwd_sm90.SUPPORTED_ACTIVATIONS
        assert row.fp8_activations <= fwd_sm90.SUPPORTED_ACTIVATIONS
