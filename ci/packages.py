#!/usr/bin/env python3
"""Which packages the repository holds, and which of them a change touches.

Used by the ci/ scripts so that every script understands the same names: a package may be named by
its folder (``gdpa``), its distribution (``ads-gdpa``) or its import name (``ads_gdpa``); the shared
package is ``tools`` / ``ads-kernel-tools``.

  packages.py resolve [NAME ...]   one line per package: folder, dist, import (all when no NAME)
  packages.py changed BASE         packages a diff against BASE affects, plus a CI matrix (JSON)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a change under any of these can break every package
SHARED_PREFIXES = ("tools/", "ci/", ".ci/", "pyproject.toml", ".pre-commit-config.yaml")
DOC_ONLY = re.compile(r"(^|/)(README|CHANGELOG|BENCHMARKS|CODEOWNERS|LICENSE)[^/]*$|\.md$")
GPU_RUNNERS = ("h100", "b200")


@dataclass(frozen=True)
class Package:
    folder: str  # relative to the repository root
    dist: str
    module: str

    @property
    def short(self) -> str:
        return Path(self.folder).name


def _dist_name(pyproject: Path) -> str:
    match = re.search(r'^name\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
    if not match:
        raise SystemExit(f"ci: no [project] name in {pyproject.relative_to(ROOT)}")
    return match.group(1)


def _module(folder: Path) -> str | None:
    mods = [p.name for p in (folder / "src").iterdir() if (p / "__init__.py").exists()]
    if len(mods) != 1:
        print(
            f"ci: skipping {folder.relative_to(ROOT)}: expected one import package in src/, found {mods}",
            file=sys.stderr,
        )
        return None
    return mods[0]


def all_packages() -> list[Package]:
    folders = [ROOT / "tools"] + sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
    out = []
    for f in folders:
        if (f / "pyproject.toml").exists() and (f / "src").is_dir() and (module := _module(f)):
            out.append(Package(str(f.relative_to(ROOT)), _dist_name(f / "pyproject.toml"), module))
    return out


def resolve(names: list[str]) -> list[Package]:
    pkgs = all_packages()
    if not names:
        return pkgs
    index: dict[str, Package] = {}
    for p in pkgs:
        for key in (p.folder, p.short, p.dist, p.module):
            index[key.rstrip("/")] = p
    out, unknown = [], []
    for n in names:
        p = index.get(n.rstrip("/"))
        if p is None:
            unknown.append(n)
        elif p not in out:
            out.append(p)
    if unknown:
        known = ", ".join(p.short for p in pkgs)
        print(f"usage: unknown package {', '.join(map(repr, unknown))}; known: {known}", file=sys.stderr)
        raise SystemExit(2)
    return out


def changed(base: str) -> dict:
    try:
        diff = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--name-only", f"{base}...HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except subprocess.CalledProcessError as e:
        print(f"usage: cannot diff against {base!r}: {e.stderr.strip()}", file=sys.stderr)
        raise SystemExit(2) from None
    pkgs = all_packages()
    if any(f.startswith(SHARED_PREFIXES) for f in diff):
        hit = pkgs
    else:
        hit = [p for p in pkgs if any(f.startswith(p.folder + "/") and not DOC_ONLY.search(f) for f in diff)]
    return {
        "base": base,
        "files": len(diff),
        "packages": [p.short for p in hit],
        "lint_only": bool(diff) and not hit,
        "matrix": {
            "cpu": [{"package": p.short, "command": f"ci/test {p.short}"} for p in hit],
            "gpu": [
                {"package": p.short, "runner": r, "command": f"ci/test {p.short} && ci/bench {p.short}"}
                for p in hit
                if p.short != "tools"
                for r in GPU_RUNNERS
            ],
        },
    }


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("resolve", "changed"):
        print("usage: packages.py resolve [NAME ...] | packages.py changed BASE", file=sys.stderr)
        return 2
    if argv[0] == "resolve":
        for p in resolve(argv[1:]):
            print(f"{p.folder}\t{p.dist}\t{p.module}")
        return 0
    if len(argv) != 2:
        print("usage: packages.py changed BASE   (e.g. origin/main)", file=sys.stderr)
        return 2
    print(json.dumps(changed(argv[1]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
