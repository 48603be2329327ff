"""Benchmark rows, the printed table, Markdown tables, JSON and PNG output.

The row schema follows the one-long-table idea: every measurement is one row that names op,
provider, mode and shape, so results from several runs and GPUs can be concatenated and compared.
A benchmark puts the parameter its plot runs along (e.g. ``max_len``) and every other parameter that
tells shape families apart (head dim, kv heads) into ``Row.extra``.

``python -m ads_kernel_tools.bench JSON ...`` (``main`` below) re-renders saved results: ``--markdown`` prints
one table per op (the form BENCHMARKS.md opens with), ``--into FILE`` puts those tables between the
``<!-- bench-tables:begin -->`` / ``<!-- bench-tables:end -->`` markers of FILE, ``--plot PNG`` draws
the plot, and ``--combine`` prints the long table of several packages that ``ci/bench`` shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import importlib.metadata
import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

METRICS = {"tflops": "TFLOP/s", "gbps": "GB/s"}
MODE_ORDER = ("fwd", "bwd", "fwd+bwd")
BEGIN_MARK, END_MARK = "<!-- bench-tables:begin -->", "<!-- bench-tables:end -->"
# distributions of peers whose versions a result should carry (absent ones are left out)
_PEER_DISTS = ("flash-attn-4", "flash-attn", "nvidia-cutlass-dsl", "quack-kernels", "liger-kernel")


@dataclass
class Row:
    op: str
    provider: str
    mode: str  # "fwd", "bwd", "fwd+bwd"
    shape: str
    ms: float | None
    tflops: float | None = None
    gbps: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None  # filled by Report: metric / best peer's metric in the same group
    best_peer: str | None = None  # filled by Report: the fastest peer of the same group

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """A row from its JSON form; keys this version does not know are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _peer_versions() -> dict[str, str]:
    found = {}
    for dist in _PEER_DISTS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    """GPU, clocks, library versions and the git revision, recorded with every result."""
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["sm"] = f"{props.major}.{props.minor}"
        info["sms"] = props.multi_processor_count
        info["cudnn"] = torch.backends.cudnn.version()
        clocks = _run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem", "--format=csv,noheader,nounits"]
        )
        info["clocks_mhz"] = clocks.splitlines()[0] if clocks else None
    else:
        info["gpu"] = "cpu"
    info["peers"] = _peer_versions()
    # a copy of the tree without .git (the GPU runner's) gets the revision from the environment;
    # "-dirty" marks a tree whose files differ from that commit (a copied tree can carry a stale .git)
    here = Path(__file__).resolve().parent
    info["git_sha"] = (
        os.environ.get("ADS_GIT_SHA")
        or _run(["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=7"])
        or "unknown"
    )
    return info


def describe_environment(env: dict[str, Any]) -> str:
    """One line: date, GPU, clocks, versions, commit (what every results table must state)."""
    gpu = str(env.get("gpu"))
    if env.get("sm"):
        gpu += f" (sm_{str(env['sm']).replace('.', '')}, {env.get('sms')} SMs)"
    parts = [str(env.get("date")), gpu]
    if env.get("clocks_mhz"):
        parts.append(f"clocks (SM, max SM, mem) {env['clocks_mhz']} MHz")
    versions = [f"torch {env.get('torch')}", f"triton {env.get('triton')}"]
    if env.get("cuda"):
        versions.append(f"CUDA {env['cuda']}")
    if env.get("cudnn"):
        versions.append(f"cuDNN {env['cudnn']}")
    versions += [f"{k} {v}" for k, v in (env.get("peers") or {}).items()]
    parts.append(", ".join(versions))
    parts.append(f"commit {env.get('git_sha')}")
    if env.get("note"):
        parts.append(str(env["note"]))
    return " | ".join(parts)


def _ordered(items: Iterable[str], order: Sequence[str] = ()) -> list[str]:
    """Unique items, those named in ``order`` first (in that order), the rest as first seen."""
    seen = list(dict.fromkeys(items))
    first = [o for o in dict.fromkeys(order) if o in seen]
    return first + [s for s in seen if s not in first]


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _text_table(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in body]
    return [line.rstrip() for line in lines]


class Report:
    """Collects rows, prints them as a table and writes JSON/PNG/Markdown.

    ``ours`` names our provider; each row's ratio is its metric divided by the best *peer* (any
    provider whose name does not start with ``ours``) in the same (op, mode, shape) group, so our
    row reads "× best peer" and the best peer's own row reads 1.00.
    """

    def __init__(
        self, title: str, *, ours: str = "ours", metric: str = "tflops", progress: bool = False
    ) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be 'tflops' or 'gbps', got {metric!r}")
        self.title, self.ours, self.metric = title, ours, metric
        self.rows: list[Row] = []
        self.progress = progress
        self.env: dict[str, Any] | None = None  # None: this process's environment()
        self.name: str | None = None  # the suite's short name in combined tables (a loaded file's stem)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, metric: str | None = None) -> Report:
        """A report from its JSON form (``to_dict``), keeping the environment it was measured in.

        Files written before the metric was saved get it from their rows: GB/s if any row has one.
        """
        rows = [Row.from_dict(r) for r in data.get("rows", [])]
        if metric is None:
            metric = data.get("metric") or ("gbps" if any(r.gbps is not None for r in rows) else "tflops")
        rep = cls(data.get("title", ""), ours=data.get("ours", "ours"), metric=metric)
        rep.rows = rows
        rep.env = data.get("environment", {})
        return rep

    @classmethod
    def load(cls, path: str | os.PathLike, *, metric: str | None = None) -> Report:
        """A saved report; its suite name is the file's stem (``bench-out/gdpa.json``: gdpa), or the
        package folder's for the copy a package commits (``packages/gdpa/docs/bench.json``: gdpa)."""
        path = Path(path)
        rep = cls.from_dict(json.loads(path.read_text()), metric=metric)
        committed = path.stem == "bench" and path.parent.name == "docs" and path.resolve().parent.parent.name
        rep.name = path.resolve().parent.parent.name if committed else path.stem
        return rep

    @property
    def environment(self) -> dict[str, Any]:
        return environment() if self.env is None else self.env

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        if self.progress:
            # one line per measurement as it lands, so a run cut short by a time limit keeps its numbers
            val = getattr(row, self.metric)
            shown = "-" if val is None else f"{val:.1f}"
            print(f"  . {row.op} {row.mode} {row.shape} {row.provider}: {shown} {self.metric}", flush=True)
        return row

    def is_ours(self, provider: str) -> bool:
        return provider.startswith(self.ours)

    def _fill_ratios(self) -> None:
        groups: dict[tuple[str, str, str], list[Row]] = {}
        for r in self.rows:
            groups.setdefault((r.op, r.mode, r.shape), []).append(r)
        for rows in groups.values():
            peers = [r for r in rows if not self.is_ours(r.provider) and getattr(r, self.metric)]
            best = max(peers, key=lambda r: getattr(r, self.metric)) if peers else None
            best_val = getattr(best, self.metric) if best else None
            for r in rows:
                v = getattr(r, self.metric)
                r.ratio = (v / best_val) if (best_val and v) else None
                r.best_peer = best.provider if best else None

    def table(self) -> str:
        self._fill_ratios()
        head = [
            "op",
            "mode",
            "shape",
            "provider",
            "ms",
            "TFLOP/s",
            "GB/s",
            "x best peer",
            "best peer",
            "note",
        ]
        body = [
            [
                r.op,
                r.mode,
                r.shape,
                r.provider,
                _fmt(r.ms, 3),
                _fmt(r.tflops, 1),
                _fmt(r.gbps),
                _fmt(r.ratio, 2),
                r.best_peer or "-",
                r.note,
            ]
            for r in self.rows
        ]
        lines = [f"# {self.title}", f"# {describe_environment(self.environment)}"]
        return "\n".join(lines + _text_table(head, body))

    def print_table(self) -> None:
        print(self.table(), flush=True)

    def markdown(self, *, providers: Sequence[str] | None = None, digits: int = 0) -> str:
        """One Markdown table per op: a row per shape, a column per provider, cells "fwd / bwd".

        The last column is ours (the provider named ``ours``) over the best peer of the same shape
        and mode. ``providers`` keeps only those columns (ours is always kept). Shape words shared
        by every row of an op go into its heading, the rest label the rows.
        """
        self._fill_ratios()
        unit = METRICS[self.metric]
        out = [f"*{self.title}*", "", f"Run: {describe_environment(self.environment)}"]
        for op in _ordered(r.op for r in self.rows):
            rows = [r for r in self.rows if r.op == op]
            modes = _ordered((r.mode for r in rows), MODE_ORDER)
            provs = _ordered((r.provider for r in rows), (self.ours,))
            if providers is not None:
                provs = [p for p in provs if p == self.ours or p in providers]
            shapes = _ordered(r.shape for r in rows)
            words = [s.split() for s in shapes]
            common = [w for w in words[0] if all(w in ws for ws in words[1:])] if len(shapes) > 1 else []
            cell = {(r.shape, r.provider, r.mode): r for r in rows}
            has_ours = any(p == self.ours for p in provs)
            head = ["shape", *provs] + ([f"{self.ours} / best peer"] if has_ours else [])
            title = f"**{op}**" + (f" ({' '.join(common)})" if common else "")
            out += ["", f"{title}: {unit}, {' / '.join(modes)}", ""]
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for s, ws in zip(shapes, words):
                label = " ".join(w for w in ws if w not in common) or s
                vals = []
                for p in provs:
                    nums = [
                        getattr(cell[(s, p, m)], self.metric) if (s, p, m) in cell else None for m in modes
                    ]
                    vals.append(" / ".join("—" if v is None else f"{v:.{digits}f}" for v in nums))
                if has_ours:
                    got = [cell.get((s, self.ours, m)) for m in modes]
                    vals.append(
                        " / ".join("—" if g is None or g.ratio is None else f"{g.ratio:.2f}" for g in got)
                    )
                out.append("| " + " | ".join([label, *vals]) + " |")
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict[str, Any]:
        self._fill_ratios()
        return {
            "title": self.title,
            "ours": self.ours,
            "metric": self.metric,
            "environment": self.environment,
            "rows": [asdict(r) for r in self.rows],
        }

    def write_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False))
        return path

    def plot_png(
        self,
        path: str | os.PathLike,
        x_key: str,
        metric: str | None = None,
        *,
        x_label: str | None = None,
    ) -> Path | None:
        """``metric`` against ``row.extra[x_key]``, one line per provider, a panel per shape family
        and mode (``bench.plot``). Returns None (and says so) when matplotlib is missing."""
        from ads_kernel_tools.bench.plot import plot_report

        return plot_report(self, path, x_key, metric or self.metric, x_label=x_label)


def combined_table(reports: Sequence[Report]) -> str:
    """The long table of several packages' results: every row (ours, our variants, the peers)
    with its provider and its ratio to the best peer of the same case and mode."""
    head = ["suite", "op", "mode", "shape", "provider", "ms", "TFLOP/s", "GB/s", "x best peer", "best peer"]
    body, envs = [], []
    for rep in reports:
        rep._fill_ratios()
        envs.append(f"# {rep.title}: {describe_environment(rep.environment)}")
        for r in rep.rows:
            mark = "*" if rep.is_ours(r.provider) else " "
            body.append(
                [
                    rep.name or rep.title.split(":")[0],
                    r.op,
                    r.mode,
                    r.shape,
                    f"{mark}{r.provider}",
                    _fmt(r.ms, 3),
                    _fmt(r.tflops, 1),
                    _fmt(r.gbps),
                    _fmt(r.ratio, 2),
                    r.best_peer or "-",
                ]
            )
    legend = "# x best peer = this row's rate / the fastest peer's at the same case and mode; * = ours"
    return "\n".join([*envs, legend, *_text_table(head, body)])


def replace_between_markers(text: str, tables: str) -> str:
    """``text`` with the part between the bench-table markers replaced by ``tables``."""
    if BEGIN_MARK not in text or END_MARK not in text:
        raise ValueError(f"no {BEGIN_MARK} ... {END_MARK} section to fill")
    start = text.index(BEGIN_MARK) + len(BEGIN_MARK)
    end = text.index(END_MARK, start)
    return text[:start] + "\n" + tables.strip() + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ads_kernel_tools.bench",
        description="Re-render saved benchmark JSON: Markdown tables, a plot, or the combined table.",
    )
    ap.add_argument("json", nargs="+", help="result files written by --json of a package benchmark")
    ap.add_argument("--markdown", action="store_true", help="print one Markdown table per op")
    ap.add_argument("--into", metavar="FILE", help="write the Markdown tables between FILE's bench markers")
    ap.add_argument("--plot", metavar="PNG", help="draw the first file's plot to this path")
    ap.add_argument("--x", default="max_len", help="the Row.extra key the plot runs along (max_len)")
    ap.add_argument("--x-label", help="x axis label (default: the key)")
    ap.add_argument("--providers", help="comma-separated columns to keep in the Markdown tables")
    ap.add_argument("--combine", action="store_true", help="print the long table of every file")
    ap.add_argument("--metric", choices=sorted(METRICS), help="override the saved metric")
    args = ap.parse_args(argv)
    reports, missing = [], []
    for p in args.json:
        if Path(p).exists():
            reports.append(Report.load(p, metric=args.metric))
        else:
            missing.append(p)
    for p in missing:
        print(f"(missing: {p})")
    if not reports:
        return 1
    providers = args.providers.split(",") if args.providers else None
    if args.combine:
        print(combined_table(reports))
    if args.markdown or args.into:
        tables = "\n".join(rep.markdown(providers=providers) for rep in reports)
        if args.markdown:
            print(tables)
        if args.into:
            target = Path(args.into)
            target.write_text(replace_between_markers(target.read_text(), tables))
    if args.plot and reports[0].plot_png(args.plot, args.x, x_label=args.x_label) is None:
        return 1
    return 0
