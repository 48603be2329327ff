"""Odd shapes and partial tiles through every kernel path under compute-sanitizer
memcheck (``memcheck_case.py``): 0 errors, on the GPU only; the Gluon forward's cases with each of
its two kernels."""

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


@pytest.mark.parametrize("ws", ["0", "1"])
def test_memcheck_clean_gluon_forward(ws):
    script = Path(__file__).with_name("memcheck_case.py")
    env = {"ADS_NORM_FUSION_GLUON": "on", "ADS_NORM_FUSION_GLUON_WS": ws}
    assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran", env=env)
