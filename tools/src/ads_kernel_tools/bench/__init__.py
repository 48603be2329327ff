"""Benchmark harness: timing, FLOP/byte counters, report tables/JSON/plots and peer providers."""

from ads_kernel_tools.bench import flops, peers
from ads_kernel_tools.bench.report import Report, Row, environment
from ads_kernel_tools.bench.timing import time_fn

__all__ = ["Report", "Row", "environment", "flops", "peers", "time_fn"]
