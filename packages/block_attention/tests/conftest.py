"""Shared test setup: markers, the `device` fixture and interpreter patches come from the tools plugin."""

import os

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]

if os.environ.get("TRITON_INTERPRET") == "1":
    from _interp_rounding import apply as _apply_bf16_rne

    _apply_bf16_rne()
