"""Lying offsets, seqused entries and page indices through every kernel path under compute-sanitizer
memcheck (``memcheck_case.py``): 0 errors, on the GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_kernel_tools.testing import assert_memcheck_clean

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("env", [{}, {"LP_FA4_BWD_CAUSAL_WALK": "1"}], ids=["default", "opt-in"])
def test_memcheck_clean(env):
    """The defaults, and the Gluon backward's opt-in causal walk."""
    script = Path(__file__).with_name("memcheck_case.py")
    assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran", env=env)
