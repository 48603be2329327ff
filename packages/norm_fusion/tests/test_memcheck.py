"""Odd shapes and partial tiles through every kernel path under compute-sanitizer
memcheck (``memcheck_case.py``): 0 errors, on the GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from ads_kernel_tools.testing import assert_memcheck_clean

pytestmark = pytest.mark.gpu


def test_memcheck_clean():
    script = Path(__file__).with_name("memcheck_case.py")
    assert_memcheck_clean(script, done_marker="memcheck cases: all paths ran")
