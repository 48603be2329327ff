"""Test setup: the shared plugin (markers gpu/sm90/slow, fixture ``device``, interpreter fixes) and
the ``cute_sass`` fixture of the CuTe DSL kernels' SASS tests.

Autotuning compiles every config of the search space for every new shape key; across the suite's
~150 shapes that is many minutes of compilation on a GPU. Tests check numerics, so they pin the
measured-best config (``ADS_GDPA_DISABLE_AUTOTUNE=1``) unless the caller sets the variable;
``test_gpu.py::test_autotuned_configs`` turns tuning back on for one shape. The CuTe DSL kernels'
disk cache is off (``ADS_GDPA_CUTE_CACHE=0``) unless the caller sets it.
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("ADS_GDPA_DISABLE_AUTOTUNE", "1")
# Offline builds read the PTX/SASS the DSL dumps while compiling, which a kernel loaded from the disk
# cache never does; tests of the cache turn it on in their own processes.
os.environ.setdefault("ADS_GDPA_CUTE_CACHE", "0")

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]


@pytest.fixture
def cute_sass():
    """``tests/cute_sass.py`` (offline SASS of a build), or a skip where nvdisasm is missing."""
    sys.path.insert(0, str(Path(__file__).parent))
    import cute_sass

    try:
        cute_sass.nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return cute_sass
