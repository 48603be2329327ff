"""The CuTe DSL backward in the dispatch (no GPU and no DSL needed: the tables are data)."""

from __future__ import annotations

import pytest
import torch
from test_dispatch import CUDA, _call, hopper  # noqa: F401  (hopper: the fixture)

from ads_gdpa import dispatch
from ads_gdpa.activations import Activation


@pytest.fixture
def cute_installed(monkeypatch):
    monkeypatch.setattr(dispatch, "cute_importable", lambda: True)


def test_auto_takes_cute_backward_where_it_measured_faster(hopper, cute_installed, monkeypatch):  # noqa: F811
    """D=128 with more than 256 keys per sequence: CuTe; at 256 keys (a tie), D=64 (not timed), a
    call outside its table or ADS_GDPA_BWD_BACKEND=gluon: where it went before."""
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=257)) == "cute"
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048)) == "cute"
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=256)) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048, d_qk=64, d_v=64)) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048, act=int(Activation.GELU))) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048, deterministic=True)) == "triton"
    assert dispatch.backend_for("fwd", CUDA, _call(max_k=2048)) == "gluon"
    monkeypatch.setattr(dispatch, "cute_importable", lambda: False)
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048)) == "gluon"
    monkeypatch.setattr(dispatch, "cute_importable", lambda: True)
    monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", "gluon")
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=2048)) == "gluon"


def test_cute_backward_when_asked_and_covered(hopper, cute_installed, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", "cute")
    assert dispatch.backend_for("bwd", CUDA, _call(max_k=16)) == "cute"
    assert dispatch.backend_for("bwd", CUDA, _call()) == "cute"
    assert dispatch.backend_for("bwd", CUDA, _call(dtype=torch.float16, d_qk=64, d_v=64)) == "cute"
    assert dispatch.backend_for("fwd", CUDA, _call()) == "gluon"  # a backward switch only
    # outside its table: where auto would go (erf-GELU has a Gluon backward, per-head lists do not)
    assert dispatch.backend_for("bwd", CUDA, _call(act=int(Activation.GELU))) == "gluon"
    assert dispatch.backend_for("bwd", CUDA, _call(per_head=True)) == "triton"
    assert dispatch.backend_for("bwd", CUDA, _call(deterministic=True)) == "triton"
    monkeypatch.setenv("ADS_GDPA_BACKEND", "triton")  # forces Triton everywhere, as before
    assert dispatch.backend_for("bwd", CUDA, _call()) == "triton"


def test_cute_backward_needs_the_dsl_and_sm90(hopper, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", "cute")
    monkeypatch.setattr(dispatch, "cute_importable", lambda: False)
    assert dispatch.backend_for("bwd", CUDA, _call()) == "gluon"
    monkeypatch.setattr(dispatch, "cute_importable", lambda: True)
    monkeypatch.setenv("ADS_SM_OVERRIDE", "10.0")
    assert dispatch.backend_for("bwd", CUDA, _call()) == "triton"
    assert dispatch.backend_for("bwd", torch.device("cpu"), _call()) == "triton"
