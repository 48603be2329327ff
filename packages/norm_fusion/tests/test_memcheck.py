"""Odd shapes and partial tiles through every kernel path under compute-sanitizer
memcheck (``memcheck_case.py``): 0 errors, on the GPU only; the Gluon forward's cases with each of
its three kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_kernel_tools.testing import assert_memcheck_clean

pytestmark = pytest.mark.gpu


def test_memcheck_clean():
    """The Triton kernels' cases (the Gluon forward switched off)."""
    script = Path(__file__).with_name("memcheck_case.py")
    env = {"ADS_NORM_FUSION_GLUON": "0"}
    assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran", env=env)


@pytest.mark.parametrize("ws,epi", [("0", "0"), ("1", "0"), ("1", "1")], ids=["single", "ws", "epi"])
def test_memcheck_clean_gluon_forward(ws, epi):
    """Each Gluon kernel: single-partition, warp-specialised, and the normalisation partition
    (``ADS_NORM_FUSION_GLUON_EPI=1``: inference calls, and training calls saving the pre-norm value
    where N is a multiple of 128)."""
    script = Path(__file__).with_name("memcheck_case.py")
    env = {"ADS_NORM_FUSION_GLUON": "on", "ADS_NORM_FUSION_GLUON_WS": ws, "ADS_NORM_FUSION_GLUON_EPI": epi}
    assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran", env=env)


def test_memcheck_clean_gluon_rms_linear():
    """The Gluon ``rmsnorm_linear`` forward at one and at two column tiles per program."""
    script = Path(__file__).with_name("memcheck_case.py")
    for nt in ("1", "2"):
        env = {"ADS_NORM_FUSION_RMS_GLUON": "on", "ADS_NORM_FUSION_RMS_GLUON_NT": nt}
        assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran", env=env)
