"""Benchmark harness: timing, FLOP/byte counters, report tables/JSON/plots and peer providers."""

from ads_kernel_tools.bench import cli, flops, peers
from ads_kernel_tools.bench.demo import DemoCase, run_demo
from ads_kernel_tools.bench.report import Report, Row, environment
from ads_kernel_tools.bench.timing import time_fn

__all__ = ["cli", "DemoCase", "Report", "Row", "environment", "flops", "peers", "run_demo", "time_fn"]
