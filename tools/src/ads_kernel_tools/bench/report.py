"""Benchmark rows, the printed table, JSON and PNG output.

The row schema follows the one-long-table idea: every measurement is one row that names op,
provider, mode and shape, so results from several runs and GPUs can be concatenated and compared.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


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


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


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
        clocks = _run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem", "--format=csv,noheader,nounits"]
        )
        info["clocks_mhz"] = clocks.splitlines()[0] if clocks else None
    else:
        info["gpu"] = "cpu"
    # a copy of the tree without .git (the GPU runner's) gets the revision from the environment;
    # "-dirty" marks a tree whose files differ from that commit (a copied tree can carry a stale .git)
    here = Path(__file__).resolve().parent
    info["git_sha"] = (
        os.environ.get("ADS_GIT_SHA")
        or _run(["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=7"])
        or "unknown"
    )
    return info


class Report:
    """Collects rows, prints them as a table and writes JSON/PNG.

    ``ours`` names our provider; each row's ratio is its metric divided by the best *peer* (any
    other provider) in the same (op, mode, shape) group, so our row reads "× best peer".
    """

    def __init__(
        self, title: str, *, ours: str = "ours", metric: str = "tflops", progress: bool = False
    ) -> None:
        if metric not in ("tflops", "gbps"):
            raise ValueError(f"metric must be 'tflops' or 'gbps', got {metric!r}")
        self.title, self.ours, self.metric = title, ours, metric
        self.rows: list[Row] = []
        self.progress = progress

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        if self.progress:
            # one line per measurement as it lands, so a run cut short by a time limit keeps its numbers
            val = getattr(row, self.metric)
            shown = "-" if val is None else f"{val:.1f}"
            print(f"  . {row.op} {row.mode} {row.shape} {row.provider}: {shown} {self.metric}", flush=True)
        return row

    def _fill_ratios(self) -> None:
        groups: dict[tuple[str, str, str], list[Row]] = {}
        for r in self.rows:
            groups.setdefault((r.op, r.mode, r.shape), []).append(r)
        for rows in groups.values():
            peer_vals = [
                getattr(r, self.metric)
                for r in rows
                if not r.provider.startswith(self.ours) and getattr(r, self.metric)
            ]
            best = max(peer_vals) if peer_vals else None
            for r in rows:
                v = getattr(r, self.metric)
                r.ratio = (v / best) if (best and v) else None

    def table(self) -> str:
        self._fill_ratios()
        head = ["op", "mode", "shape", "provider", "ms", "TFLOP/s", "GB/s", "x best peer", "note"]
        body = []
        for r in self.rows:
            body.append(
                [
                    r.op,
                    r.mode,
                    r.shape,
                    r.provider,
                    "-" if r.ms is None else f"{r.ms:.3f}",
                    "-" if r.tflops is None else f"{r.tflops:.1f}",
                    "-" if r.gbps is None else f"{r.gbps:.0f}",
                    "-" if r.ratio is None else f"{r.ratio:.2f}",
                    r.note,
                ]
            )
        widths = (
            [max(len(str(x)) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
        )
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        env = environment()
        lines = [
            f"# {self.title}",
            f"# {env.get('gpu')} | torch {env.get('torch')} | triton {env.get('triton')} | "
            f"{env.get('date')} | git {env.get('git_sha')}",
            fmt.format(*head),
            fmt.format(*("-" * w for w in widths)),
        ]
        lines += [fmt.format(*row) for row in body]
        return "\n".join(lines)

    def print_table(self) -> None:
        print(self.table(), flush=True)

    def to_dict(self) -> dict[str, Any]:
        self._fill_ratios()
        return {"title": self.title, "environment": environment(), "rows": [asdict(r) for r in self.rows]}

    def write_json(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def plot_png(self, path: str | os.PathLike, x_key: str, metric: str | None = None) -> Path | None:
        """One panel per (op, mode): ``metric`` per provider against ``row.extra[x_key]``.

        Returns None (and says so) when matplotlib is missing: plots are a convenience.
        """
        metric = metric or self.metric
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("note: matplotlib not installed, no plot written")
            return None
        panels: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
        for r in self.rows:
            v = getattr(r, metric)
            if v is None or x_key not in r.extra:
                continue
            panels.setdefault((r.op, r.mode), {}).setdefault(r.provider, []).append((r.extra[x_key], v))
        if not panels:
            return None
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
        for ax, ((op, mode), series) in zip(axes[0], sorted(panels.items())):
            for provider, pts in sorted(series.items()):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=provider)
            ax.set_title(f"{op} {mode}")
            ax.set_xlabel(x_key)
            ax.set_ylabel("TFLOP/s" if metric == "tflops" else "GB/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{self.title} ({environment().get('gpu')})")
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
