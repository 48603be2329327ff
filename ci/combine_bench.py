#!/usr/bin/env python3
"""Print one table from the JSON files the package benchmarks wrote: our rows with their ratio to
the best peer, so the whole repository's standing reads at a glance."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    rows = []
    env = {}
    for p in paths:
        if not Path(p).exists():
            print(f"(missing: {p})")
            continue
        data = json.loads(Path(p).read_text())
        env = data.get("environment", env)
        for r in data.get("rows", []):
            if r.get("provider", "").startswith("ours"):
                rows.append((data.get("title", Path(p).stem), r))
    versions = f"torch {env.get('torch')} | triton {env.get('triton')}"
    print(f"# combined: {env.get('gpu')} | {versions} | {env.get('date')}")
    head = ("suite", "op", "mode", "shape", "ms", "TFLOP/s", "GB/s", "x best peer")
    table = [head]
    for title, r in rows:
        table.append(
            (
                title,
                r["op"],
                r["mode"],
                r["shape"],
                f"{r['ms']:.3f}" if r.get("ms") else "-",
                f"{r['tflops']:.1f}" if r.get("tflops") else "-",
                f"{r['gbps']:.0f}" if r.get("gbps") else "-",
                f"{r['ratio']:.2f}" if r.get("ratio") else "-",
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
