"""The CuTe DSL kernels' disk cache (``ads_gdpa.cute.kernel_cache``), offline (sm_90a, no GPU): a
second process loads what the first compiled instead of compiling; a damaged entry is compiled again
and replaced; a changed build switch is another entry; ``ADS_GDPA_CUTE_CACHE=0`` writes nothing.
Skips without the ``cute`` extra (the DSL and TVM-FFI)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cutlass.cute")
pytest.importorskip("tvm_ffi")

# Prints how the kernel was obtained: "compiled" when cute.compile ran in this process, else "loaded".
_GET = """
import torch
from ads_gdpa.cute import bwd_sm90, kernel_cache
compiles = []
real = kernel_cache.cute.compile
kernel_cache.cute.compile = lambda *a, **kw: compiles.append(1) or real(*a, **kw)
for key, value in {switches}.items():
    setattr(bwd_sm90.GdpaBwdSm90, key, value)
fn = bwd_sm90.compiled(torch.bfloat16, 64, 3)
assert callable(fn)
print("compiled" if compiles else "loaded")
"""


def _get(cache: Path, switches: dict | None = None, enabled: str = "1") -> str:
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", ADS_GDPA_CUTE_CACHE=enabled)
    env["ADS_GDPA_CUTE_CACHE_DIR"] = str(cache)
    script = textwrap.dedent(_GET.format(switches=switches or {}))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout.split()[-1]


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*.o") if not p.name.startswith("."))


def test_second_process_loads_instead_of_compiling(tmp_path: Path):
    assert _get(tmp_path) == "compiled"
    (entry,) = _entries(tmp_path)
    assert _get(tmp_path) == "loaded"
    entry.write_bytes(entry.read_bytes()[:100])  # a truncated entry: compiled again, replaced
    assert _get(tmp_path) == "compiled"
    assert _entries(tmp_path) == [entry] and entry.stat().st_size > 100
    assert _get(tmp_path) == "loaded"
    assert _get(tmp_path, {"DQ_MODE": "bulk"}) == "compiled"  # a switch is part of the key
    assert len(_entries(tmp_path)) == 2


def test_cache_off_writes_nothing(tmp_path: Path):
    assert _get(tmp_path, enabled="0") == "compiled"
    assert _get(tmp_path, enabled="0") == "compiled"
    assert _entries(tmp_path) == []


def test_a_failed_export_leaves_no_entry_and_the_kernel_works(tmp_path: Path):
    """A cache folder that cannot be written (here: a file where the folder should be) costs the
    next process a compile; this one still gets its kernel."""
    blocked = tmp_path / "cache"
    blocked.write_text("not a folder")
    assert _get(blocked) == "compiled"
    assert _get(blocked) == "compiled"
    assert blocked.read_text() == "not a folder"
