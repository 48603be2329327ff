"""Kernel timing with warm-up, medians and rotating inputs.

L2 on an H200 is 50 MB: a benchmark that reuses one small input set measures cache bandwidth, not
HBM. Callers therefore build several input sets and ``fn(i)`` picks set ``i % n`` — the harness only
passes a growing counter. Each repetition is timed with its own pair of CUDA events and the median is
reported, which resists clock ramps and the occasional preemption better than a mean.
"""

from __future__ import annotations

import inspect
import itertools
import statistics
import time
from collections.abc import Callable

import torch


def _takes_index(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    # a lambda's default-bound loop variables (``lambda fn=fn: ...``) are not a counter slot
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in params.values()
    )


def _quantiles(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    n = len(samples)

    def q(p: float) -> float:
        return samples[min(n - 1, int(p * (n - 1) + 0.5))]

    return {"ms": statistics.median(samples), "p20": q(0.2), "p80": q(0.8), "n": n}


def time_fn(
    fn: Callable,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    use_cuda_graph: bool = False,
    max_reps: int = 1000,
) -> dict[str, float]:
    """Median time of one call of ``fn`` in milliseconds, with p20/p80 and the sample count.

    ``fn`` takes either nothing or an int (a counter for rotating input sets). With
    ``use_cuda_graph`` one call is captured once and replayed, which removes launch overhead for
    short kernels (inputs then cannot rotate). Without CUDA the wall clock is used, so the same
    code runs in the CPU demo.
    """
    indexed = fn if _takes_index(fn) else (lambda i: fn())
    counter = itertools.count()

    def call() -> None:
        # one counter across warm-up, estimate and measurement, so consecutive calls never reuse
        # the input set just touched (and still hot in L2)
        indexed(next(counter))

    if not torch.cuda.is_available():
        call()
        samples, start = [], time.perf_counter()
        while (time.perf_counter() - start) * 1e3 < rep_ms and len(samples) < max_reps:
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e3)
        return _quantiles(samples)

    if use_cuda_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()  # allocations and autotuning happen outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        call = graph.replay

    # estimate one call, then size warm-up and repetitions from it
    call()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(3):
        call()
    t1.record()
    torch.cuda.synchronize()
    est = max(t0.elapsed_time(t1) / 3, 1e-3)
    n_warm = max(1, int(warmup_ms / est))
    n_rep = max(5, min(max_reps, int(rep_ms / est)))
    for _ in range(n_warm):
        call()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return _quantiles([s.elapsed_time(e) for s, e in zip(starts, ends)])
