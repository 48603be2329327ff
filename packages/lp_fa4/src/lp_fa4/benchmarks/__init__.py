"""Stand-alone benchmarks with upstream lp_fa4's command lines (``python -m lp_fa4.benchmarks.mxfp8``)."""
