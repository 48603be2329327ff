"""``python -m lp_fa4.benchmarks.pma``: the harness on a tiny case (the CPU interpreter, or a GPU)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ads_kernel_tools.capability import interpreter_active
from lp_fa4.benchmarks import pma


@pytest.fixture
def attn_device(device):
    """Kernel launches on CPU tensors need the Triton interpreter."""
    if device == "cpu" and not interpreter_active():
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1")
    return device


def test_pma_benchmark_tiny(attn_device, tmp_path, capsys):
    path = tmp_path / "pma.json"
    argv = ["--tiny", "--lq", "20", "3", "--rounds", "2", "--tiles", "default", "16,4,1", "--json", str(path)]
    assert pma.main(argv) == 0
    rec = json.loads(path.read_text())
    assert rec["argv"] == argv and "torch" in rec["environment"]
    got = {(r["lq"], r["pass_"], r["variant"]) for r in rec["rows"]}
    for lq in (3, 20):
        for want in (("fwd", "repeat"), ("fwd", "inplace"), ("bwd", "repeat"), ("bwd", "resident default"),
                     ("bwd", "resident 16,4,1")):  # fmt: skip
            assert (lq, *want) in got
    for r in rec["rows"]:
        assert len(r["tflops"]) == 2 and all(t > 0 for t in r["tflops"]) and r["median"] > 0
        if r["variant"].startswith("resident"):
            assert r["max_diff_to_first_tile"] < 0.05  # bf16 gradients of the same math
    assert "resident 16,4,1" in capsys.readouterr().out


def test_pma_benchmark_knobs_restored(attn_device, monkeypatch):
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "kernel")
    monkeypatch.delenv("LP_FA4_RESIDENT_TILE", raising=False)
    assert pma.main(["--tiny", "--lq", "3", "--rounds", "1"]) == 0
    assert os.environ["LP_FA4_BROADCAST_Q"] == "kernel" and "LP_FA4_RESIDENT_TILE" not in os.environ


def test_pma_benchmark_needs_a_device(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(pma, "interpreter_active", lambda: False)
    assert pma.main(["--tiny"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
