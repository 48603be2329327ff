"""Test setup: the shared plugin (markers gpu/sm90/slow, fixture ``device``, interpreter fixes)."""

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]
