"""Test setup: the shared plugin (markers gpu/sm90/slow, fixture ``device``, interpreter fixes).

ads-gdpa's kernels run inside every call: pin their measured-best configs (no autotuning) unless the
caller sets the variable, as ads-gdpa's own suite does.
"""

import os

os.environ.setdefault("ADS_GDPA_DISABLE_AUTOTUNE", "1")

pytest_plugins = ["ads_kernel_tools.pytest_plugin"]
