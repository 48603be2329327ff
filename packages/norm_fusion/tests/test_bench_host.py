"""``python -m ads_norm_fusion.bench_host`` runs on a CPU (interpreter, kernels stubbed), with and
without ``--gluon`` (the Gluon forward's host path), and prints a line per op and path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

_OPS = ("linear_layernorm", "linear_rmsnorm", "rmsnorm_linear")


@pytest.mark.parametrize("gluon", [False, True], ids=["triton", "gluon"])
def test_bench_host_runs(gluon: bool) -> None:
    if gluon:
        pytest.importorskip("triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # the Gluon forward needs N a multiple of 128; the Triton path's backward stays on its stubbed kernel
    # only up to the interpreter's 64-wide norm backward
    args = ["-n", "3", "--shape", "128", "64", "256", "--bwd-shape", "64", "64", "128" if gluon else "64"]
    done = subprocess.run(
        [sys.executable, "-m", "ads_norm_fusion.bench_host", *args, *(["--gluon"] if gluon else [])],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.split(" ", 1)[0] in _OPS]
    assert len(lines) == (4 if gluon else 6), done.stdout


def test_bench_host_help() -> None:
    """``--help`` prints (a bare % in a help string made argparse raise)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-m", "ads_norm_fusion.bench_host", "--help"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "--gluon" in done.stdout, done.stderr[-2000:]


def test_rms_forward_path_names_the_kernel(monkeypatch) -> None:
    """The bench's line for each rmsnorm_linear shape names the forward its rows time: the Triton
    kernels with the Gluon kernel's refusal (here, on a CPU, M·N under the switch's bound or the
    device), or the Gluon kernel where the dispatch takes the call."""
    from ads_norm_fusion import bench
    from ads_norm_fusion.gluon import dispatch

    x = torch.randn(64, 32, dtype=torch.bfloat16)
    w = torch.randn(16, 32, dtype=torch.bfloat16)
    assert bench.rms_forward_path(x, w).startswith("on the Triton kernels (")
    monkeypatch.setattr(dispatch, "rms_linear_why_not", lambda *a, **kw: None)
    assert bench.rms_forward_path(x, w) == "on the Gluon kernel"


def test_bench_host_launchers_mode() -> None:
    """``--launchers``: every launcher's Python with the compiled launches stubbed, beside torch's step."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    args = ["-n", "3", "--bwd-shape", "16", "16", "16", "--launchers"]
    done = subprocess.run([sys.executable, "-m", "ads_norm_fusion.bench_host", *args], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines() if line.split(" ", 1)[0] in _OPS]
    assert len(lines) == 3 and all(ln[1] == "ours" and ln[3] == "torch" for ln in lines), done.stdout
