"""The command line every package benchmark shares (``python -m <package>.bench``).

``ci/bench`` relies on these flags: ``--quick`` (a subset for ci/gpu), ``--json`` and ``--plot``
(where to write results) and ``--demo`` (the checked CPU run). Packages add their own flags to the
returned parser and can hand the finished report to ``save``; ``main`` is the whole entry point
(flags, the demo, the no-GPU message) around a package's measuring function, and ``finish`` the
end of one (table, peer notes, the package's targets, files).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Mapping

import torch

from ads_kernel_tools.bench.peers import notes as peer_notes
from ads_kernel_tools.bench.report import Report


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--quick", action="store_true", help="a subset that runs in a minute or two on one GPU")
    ap.add_argument("--json", help="write the rows and the environment as JSON to this path")
    ap.add_argument("--plot", help="write a PNG plot to this path (needs matplotlib)")
    ap.add_argument("--demo", action="store_true", help="run each op once on a small case, checked")
    return ap


def gpu_present(prog: str) -> bool:
    """True with a CUDA GPU; otherwise says plainly that there is nothing to measure."""
    if torch.cuda.is_available():
        return True
    print(f"{prog} measures speed and needs a CUDA GPU; none found. `{prog} --demo` runs a checked CPU demo.")
    return False


def save(report: Report, args: argparse.Namespace, *, x_key: str, x_label: str | None = None) -> None:
    """Writes what ``--json`` and ``--plot`` asked for; ``x_key`` is the ``Row.extra`` entry the plot
    runs along (e.g. ``max_len``). The JSON re-renders later with ``python -m ads_kernel_tools.bench``."""
    if args.json:
        report.write_json(args.json)
        print(f"wrote {args.json} (tables: python -m ads_kernel_tools.bench {args.json} --markdown)")
    if args.plot and report.plot_png(args.plot, x_key, x_label=x_label) is not None:
        print(f"wrote {args.plot}")


def finish(
    report: Report,
    args: argparse.Namespace,
    *,
    x_key: str,
    x_label: str | None = None,
    summary: Callable[[Report], None] | None = None,
) -> int:
    """The end of a package's ``measure``: the table, a ``note:`` line per peer that did not run
    (and why), ``summary(report)`` (the package's targets, if any), then ``save``. Returns 0, the
    status ``measure`` returns."""
    report.print_table()
    for name, why in peer_notes().items():
        print(f"note: {name}: {why}")
    if summary is not None:
        summary(report)
    save(report, args, x_key=x_key, x_label=x_label)
    return 0


def main(
    prog: str,
    description: str,
    measure: Callable[[argparse.Namespace], int | None],
    *,
    demo: Callable[[], int],
    flags: Mapping[str, str] = {},
    argv: list[str] | None = None,
) -> int:
    """A package benchmark's ``main``: the shared flags plus ``flags`` (on/off switches, name ->
    help), then ``demo()`` for ``--demo``, a plain message without a GPU, else ``measure(args)``.
    Returns the exit status (``measure`` returning None counts as 0)."""
    ap = parser(prog, description)
    for flag, help_text in flags.items():
        ap.add_argument(flag, action="store_true", help=help_text)
    args = ap.parse_args(argv)
    if args.demo:
        return demo()
    if not gpu_present(prog):
        return 0
    return measure(args) or 0


@contextlib.contextmanager
def env(**values: str):
    """Environment switches for one provider's rows (a backend or tuning knob), restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
