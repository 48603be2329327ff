"""Test setup: the shared plugin (markers gpu/sm90/slow, fixture ``device``, interpreter fixes).

ads-gdpa's kernels run inside every call: pin their measured-best configs (no autotuning) unless the
caller sets the variable, as ads-gdpa's own suite does. Under the interpreter the row kernels take
small tiles (8 tokens of 32 features) and 4 backward programs, so the few dozen tokens of a test
case span several row blocks, a partial last block and programs that stride over blocks.
"""

import os

os.environ.setdefault("ADS_GDPA_DISABLE_AUTOTUNE", "1")
if os.environ.get("TRITON_INTERPRET", "0") == "1":
    os.environ.setdefault("ADS_GDPA_MK_TILE_ELEMS", "256")

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]
