"""pytest plugin shared by every package: ``pytest_plugins = ["ads_kernel_tools.pytest_plugin"]``.

Markers: ``gpu`` (needs CUDA, skipped otherwise), ``sm90`` (needs compute capability 9.x),
``slow`` (runs only with ``--run-slow``). Under TRITON_INTERPRET=1 the interpreter's bf16 dot is fixed
before any test runs. ``--shard I/N`` keeps the I-th (0-based) of N contiguous slices of the collected
tests, so N processes can share a suite. GPU-machine runs are bound by kernel compilation on idle CPU
cores; neighbouring tests tend to share kernel specialisations, so contiguous slices (not every N-th
test) keep each specialisation's compile in one process.
"""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.capability import interpreter_active, sm_version
from ads_kernel_tools.testing import apply_interpreter_patches, device_for_tests


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--shard", default=None, metavar="I/N", help="run only the I-th of N contiguous slices")


def shard_of(spec: str) -> tuple[int, int]:
    """Parse ``"I/N"`` into (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard wants I/N (e.g. 0/4), got {spec!r}") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard {spec}: need 0 <= I < N")
    return i, n


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "sm90: needs compute capability 9.x (Hopper)")
    config.addinivalue_line("markers", "slow: long-running; enable with --run-slow")
    if interpreter_active():
        apply_interpreter_patches()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if spec:
        i, n = shard_of(spec)
        lo, hi = len(items) * i // n, len(items) * (i + 1) // n
        config.hook.pytest_deselected(items=items[:lo] + items[hi:])
        items[:] = items[lo:hi]
    has_cuda = torch.cuda.is_available()
    cc = sm_version() if has_cuda else None
    run_slow = config.getoption("--run-slow")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_sm90 = pytest.mark.skip(reason=f"needs sm_90, found {cc}")
    skip_slow = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "sm90" in item.keywords and (cc is None or cc[0] != 9):
            item.add_marker(skip_sm90)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)


@pytest.fixture
def device() -> str:
    """ "cuda" on a GPU machine, "cpu" otherwise (kernels then go through the interpreter)."""
    return device_for_tests()
