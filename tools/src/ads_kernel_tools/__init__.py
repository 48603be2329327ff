"""Shared helpers for the ads kernel packages: references, tolerances, test data, capability checks
and the benchmark harness. Submodules are imported lazily so that `import ads_kernel_tools` stays
cheap and never needs a GPU."""

from ads_kernel_tools.__about__ import __version__

__all__ = ["__version__"]
