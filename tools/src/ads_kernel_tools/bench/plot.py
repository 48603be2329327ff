"""The PNG of a benchmark report, sized to be read at README width (about 1400 px).

A panel per shape family and mode: the family is the op plus every ``Row.extra`` entry other than
the x parameter (head dim, kv heads), so lines only join points that differ in x. Families are the
rows of the grid and modes (fwd, bwd) its columns; with one mode the panels wrap three to a row. A
family measured at a single x gets horizontal bars instead of a line of one point. Each provider
keeps its colour in every panel; ours is drawn heaviest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ads_kernel_tools.bench.report import METRICS, MODE_ORDER, _ordered

if TYPE_CHECKING:
    from ads_kernel_tools.bench.report import Report, Row

_PEER_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")
_OURS_COLOURS = ("#c0392b", "#e67e22", "#f1c40f", "#d35400")
_FONTS = {
    "font.size": 12,
    "axes.titlesize": 13,
    "axes.labelsize": 12,
    "legend.fontsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
}

Family = tuple[str, tuple[tuple[str, Any], ...]]


def _family(row: Row, x_key: str) -> Family:
    rest = tuple(
        (k, v) for k, v in sorted(row.extra.items()) if k != x_key and isinstance(v, (str, int, float, bool))
    )
    return row.op, rest


def _family_label(fam: Family) -> str:
    op, rest = fam
    return ", ".join([op] + [f"{k}={v}" for k, v in rest])


def _series(rows: list[Row], x_key: str, metric: str) -> dict[tuple[Family, str], dict[str, list]]:
    """(family, mode) -> provider -> [(x, value)], a repeated x of one provider split into "#2"."""
    panels: dict[tuple[Family, str], dict[str, list]] = {}
    for r in rows:
        v = getattr(r, metric)
        if v is None or x_key not in r.extra:
            continue
        series = panels.setdefault((_family(r, x_key), r.mode), {})
        label, n = r.provider, 1
        while any(x == r.extra[x_key] for x, _ in series.get(label, [])):
            n += 1
            label = f"{r.provider} #{n}"  # a parameter missing from extra: keep the points apart
        series.setdefault(label, []).append((r.extra[x_key], v))
    return panels


def _colours(providers: list[str], is_ours) -> dict[str, dict[str, Any]]:
    styles, n_ours, n_peer = {}, 0, 0
    for p in providers:
        if is_ours(p):
            main = n_ours == 0
            styles[p] = dict(
                color=_OURS_COLOURS[n_ours % len(_OURS_COLOURS)],
                lw=3.0 if main else 2.0,
                ls="-" if main else "--",
                marker="o",
                ms=8 if main else 6,
                zorder=3,
            )
            n_ours += 1
        else:
            styles[p] = dict(color=_PEER_COLOURS[n_peer % len(_PEER_COLOURS)], lw=1.8, marker="s", ms=5)
            n_peer += 1
    return styles


def _line_panel(ax, series: dict[str, list], styles, unit: str, x_label: str) -> None:
    xs = sorted({x for pts in series.values() for x, _ in pts})
    for prov, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=prov, **styles[prov])
    numeric = all(isinstance(x, (int, float)) and x > 0 for x in xs)
    if numeric and max(xs) / min(xs) >= 4:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    if numeric:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
    top = max(v for pts in series.values() for _, v in pts)
    ax.set_ylim(0, top * 1.12)
    ax.set_xlabel(x_label)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)


def _bar_panel(ax, groups: list[tuple[str, dict[str, list]]], styles, unit: str) -> None:
    """Bars of single-x families side by side: a group per family, a bar per provider. Colours
    name the providers (the figure's legend); names under the bars would not fit."""
    top = 0.0
    for g, (_, series) in enumerate(groups):
        provs = list(series)
        w = 0.8 / len(provs)
        for i, p in enumerate(provs):
            v = series[p][0][1]
            x = g + (i - (len(provs) - 1) / 2) * w
            ax.bar(x, v, width=w * 0.92, color=styles[p]["color"])
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=10 if len(provs) > 4 else 11)
            top = max(top, v)
    labels = [label for label, _ in groups]
    ax.set_xticks(range(len(groups)) if any(labels) else [])
    if any(labels):
        ax.set_xticklabels(labels)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3, axis="y")


def _suptitle(report: Report) -> str:
    env = report.environment
    info = " · ".join(
        str(x)
        for x in (
            env.get("gpu"),
            env.get("date"),
            f"torch {env.get('torch')}",
            f"triton {env.get('triton')}",
            f"commit {env.get('git_sha')}",
        )
    )
    return f"{report.title}\n{info}"


def _layout(panels, x_key: str):
    """Rows of (title, kind, data) cells, None for an empty cell, and the column count.

    A row per family measured at several x (line panels); single-x families of one op share a row
    of grouped bars."""
    families = _ordered(f for f, _ in panels)
    modes = _ordered((m for _, m in panels), MODE_ORDER)
    xs = {k: {x for pts in s.values() for x, _ in pts} for k, s in panels.items()}
    single = {f for f in families if all(len(xs[k]) == 1 for k in panels if k[0] == f)}
    row_keys = _ordered(("bars", f[0]) if f in single else ("line", f) for f in families)
    cells = []
    for kind, key in row_keys:
        for m in modes:
            if kind == "line":
                cells.append(
                    (f"{_family_label(key)} · {m}", "line", panels[(key, m)]) if (key, m) in panels else None
                )
                continue
            fams = [f for f in families if f in single and f[0] == key and (f, m) in panels]
            if not fams:
                cells.append(None)
                continue
            at = sorted({str(x) for f in fams for x in xs[(f, m)]})
            groups = [(", ".join(f"{k}={v}" for k, v in f[1]), panels[(f, m)]) for f in fams]
            cells.append((f"{key} · {m} ({x_key} = {', '.join(at)})", "bars", groups))
    ncols = min(len(modes), 3) if len(modes) > 1 else min(len(cells), 3)
    if len(modes) > 1 and len(modes) <= 3:
        rows = [cells[i : i + len(modes)] for i in range(0, len(cells), len(modes))]
    else:
        cells = [c for c in cells if c is not None]
        rows = [cells[i : i + ncols] for i in range(0, len(cells), ncols)]
    return [r + [None] * (ncols - len(r)) for r in rows], ncols


def plot_report(
    report: Report, path: str | os.PathLike, x_key: str, metric: str, *, x_label: str | None = None
) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib not installed, no plot written")
        return None
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    panels = _series(report.rows, x_key, metric)
    if not panels:
        print(f"note: no row has extra[{x_key!r}] and a {metric} value, no plot written")
        return None
    grid, ncols = _layout(panels, x_key)
    ours_first = [r.provider for r in report.rows if report.is_ours(r.provider)]
    providers = _ordered((p for s in panels.values() for p in s), ours_first)
    styles = _colours(providers, lambda p: report.is_ours(p.split(" #")[0]))
    unit = METRICS[metric]
    nrows = len(grid)
    width = {1: 8.0, 2: 14.0}.get(ncols, 15.0)
    head, row_h = 1.5, 3.4
    height = head + row_h * nrows
    with plt.rc_context(_FONTS):
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
        for r, line in enumerate(grid):
            for c, cell in enumerate(line):
                ax = axes[r][c]
                if cell is None:
                    ax.axis("off")
                    continue
                title, kind, data = cell
                if kind == "bars":
                    _bar_panel(ax, data, styles, unit)
                else:
                    _line_panel(ax, data, styles, unit, x_label or x_key)
                ax.set_title(title)
        handles = [
            plt.Line2D([], [], label=p, **{k: v for k, v in styles[p].items() if k != "zorder"})
            for p in providers
        ]
        fig.suptitle(_suptitle(report), fontsize=14, y=1 - 0.12 / height)
        fig.legend(
            handles=handles,
            loc="upper center",
            ncol=min(len(handles), 4),
            bbox_to_anchor=(0.5, 1 - 0.78 / height),
            frameon=False,
        )
        fig.subplots_adjust(
            top=1 - (head + 0.2) / height,
            bottom=0.75 / height,
            left=0.07,
            right=0.98,
            hspace=0.62,
            wspace=0.28,
        )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path
