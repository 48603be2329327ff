"""Shared test setup: markers, the `device` fixture and the interpreter's bf16 fixes come from the tools
plugin."""

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]
