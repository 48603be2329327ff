"""The CPU demo every package's benchmark offers (``python -m <package>.bench --demo``).

Without a GPU there is no speed to measure, but a newcomer should still see each op run and agree
with its reference. Each case is run once (through Triton's interpreter when there is no GPU) and
judged by the tolerance rule; the demo fails loudly if any case disagrees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.testing import apply_interpreter_patches
from ads_kernel_tools.tolerance import assert_close_vs_baseline, max_abs_error


@dataclass
class DemoCase:
    """``run()`` returns (out, ref, baseline): the op's output, the fp32 reference, and the same
    computation in the input precision."""

    name: str
    run: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def run_demo(title: str, cases: Sequence[DemoCase]) -> int:
    """Runs every case, prints one line each, returns 0 if all agree with their reference, else 1."""
    if interpreter_active():
        apply_interpreter_patches()
    where = (
        "Triton interpreter (CPU)" if interpreter_active() else "GPU" if torch.cuda.is_available() else "CPU"
    )
    print(f"{title}: one small case per op on the {where}, checked against the fp32 reference")
    failed = 0
    for case in cases:
        t0 = time.perf_counter()
        try:
            out, ref, baseline = case.run()
            assert_close_vs_baseline(out, ref, baseline, name=case.name)
            verdict = "ok"
        except AssertionError as e:
            failed += 1
            verdict = f"MISMATCH\n{e}"
            out = ref = baseline = None
        secs = time.perf_counter() - t0
        if out is not None:
            print(
                f"  {case.name:<44} max err {max_abs_error(out, ref):.2e} "
                f"(PyTorch at input precision: {max_abs_error(baseline, ref):.2e})  {secs:5.1f}s  {verdict}"
            )
        else:
            print(f"  {case.name:<44} {verdict}")
    print(f"{title}: {len(cases) - failed}/{len(cases)} ops agree with the reference")
    return 1 if failed else 0
