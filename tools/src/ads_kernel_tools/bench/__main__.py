"""``python -m ads_kernel_tools.bench JSON ... [--markdown] [--into FILE] [--plot PNG] [--combine]``."""

import sys

from ads_kernel_tools.bench.report import main

sys.exit(main())
