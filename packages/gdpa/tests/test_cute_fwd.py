"""The CuTe DSL sm_90 GDPA forward (``ads_gdpa.cute.fwd_sm90``, opt-in: ADS_GDPA_BACKEND=cute).

On an sm_90 GPU: the Gluon forward's case matrix (``test_gluon_fwd``: ragged lengths with 0/1/tile±1,
empty K/V sequences, max_seqlen_q below some lengths, GQA/MQA, D 64/128, bf16/fp16, the scales 1,
0.5, 0.37 and 1/max_seqlen, every activation the CuTe table lists, NaN-poisoned outputs) against the
fp32 reference under the baseline-relative rule, each build switch, and the op through the dispatch.
Without a GPU: the kernel builds offline for sm_90a, and its step loop's SASS keeps the activation
under the warpgroup's own P·V. Everything skips when the DSL (the ``cute`` extra) is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ads_gdpa import dispatch
from ads_gdpa.activations import Activation

pytest.importorskip("cutlass.cute")

from test_gluon_fwd import RAGGED, RAGGED_K, _cases, _check, _make_case

CUTE_ACTS = dispatch.SUPPORT[("cute", 9, "fwd")].activations
CASES = [c for c in _cases(False) if int(c.get("act", Activation.FAST_GELU)) in CUTE_ACTS] + [
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, scale=1.0 / 2048),  # upstream's 1/max_seqlen
]
# build switches of ``GdpaFwdSm90`` other than the default, each on the quick cases
BUILDS = {
    "no-pingpong": {"PINGPONG": False},
    "overlap": {"OVERLAP": True},
    "noreg": {"REGS": None},
    "epi-rows": {"EPI_TMA": False},
}


def _kernel():
    from ads_gdpa.cute.fwd_sm90 import gdpa_fwd_cute

    return gdpa_fwd_cute


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cute_fwd(case):
    _check(None, **CASES[case], kernel=_kernel())


@pytest.mark.gpu
@pytest.mark.sm90
def test_cute_fwd_runs_on_the_callers_stream():
    """The launch is on the caller's current torch stream (TVM-FFI's environment stream): on a side
    stream held busy by a sleep, inputs and the poisoned output are written after the sleep."""
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        _check(None, [300, 129], [300, 65], kernel=_kernel())


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("case", range(len(_cases(True))))
def test_cute_fwd_builds(monkeypatch, build, case):
    from ads_gdpa.cute import fwd_sm90

    for name, value in BUILDS[build].items():
        monkeypatch.setattr(fwd_sm90.GdpaFwdSm90, name, value)
    _check(None, **_cases(True)[case], kernel=_kernel())


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("skip", ["1", "0"])
@pytest.mark.parametrize("case", range(len(_cases(True))))
def test_cute_fwd_dead_half_skip_forced(monkeypatch, skip, case):
    """Both builds on every quick case (the launcher picks one by max_seqlen_q, as for the Gluon
    forward): the skip on long maxima and its absence on short ones."""
    monkeypatch.setenv("ADS_GDPA_SKIP_DEAD", skip)
    _check(None, **_cases(True)[case], kernel=_kernel())


@pytest.mark.gpu
@pytest.mark.sm90
def test_dispatch_takes_cute_forward(monkeypatch):
    """ADS_GDPA_BACKEND=cute sends a covered forward through the CuTe kernel, via the op and
    autograd (the backward then runs wherever ADS_GDPA_BWD_BACKEND sends it), within the rule."""
    import torch

    from ads_gdpa import gdpa_varlen
    from ads_gdpa.cute import fwd_sm90
    from ads_kernel_tools.reference.gdpa import gdpa_ref
    from ads_kernel_tools.tolerance import assert_close_vs_baseline

    calls = []
    original = fwd_sm90.gdpa_fwd_cute
    monkeypatch.setattr(fwd_sm90, "gdpa_fwd_cute", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    q, k, v, cu_q, cu_k = _make_case(RAGGED, RAGGED_K, 4, 2, 128, torch.bfloat16, seed=5)
    args = (q, k, v, cu_q, cu_k, max(RAGGED), max(RAGGED_K))
    monkeypatch.setenv("ADS_GDPA_BACKEND", "cute")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = gdpa_varlen(*leaves, *args[3:], activation="fast_gelu")
    out.float().sum().backward()
    assert calls, "the CuTe forward was not called"
    ref = gdpa_ref(*args, activation="fast_gelu")
    base = gdpa_ref(*args, activation="fast_gelu", dtype=torch.bfloat16)
    assert_close_vs_baseline(out.detach(), ref, base, name="cute fwd via dispatch")
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


def test_dispatch_sends_fp8_and_erf_gelu_past_the_cute_forward(monkeypatch):
    """The CuTe forward's table has no FP8 and no erf-GELU: with ADS_GDPA_BACKEND=cute those calls go
    where auto sends them (Gluon on sm_90), covered ones to CuTe (CPU: the table, not the GPU)."""
    import torch

    from ads_gdpa.problem import MaskMode

    monkeypatch.setenv("ADS_GDPA_BACKEND", "cute")
    monkeypatch.setattr(dispatch, "_arch", lambda device: 9)
    monkeypatch.setattr(dispatch, "_gluon_importable", lambda: True)

    def call(act, dtype):
        return dispatch.Call(int(act), 128, 128, dtype, MaskMode.NONE, False, False, False, max_k=2048)

    dev = torch.device("cuda")
    assert dispatch.backend_for("fwd", dev, call(Activation.FAST_GELU, torch.bfloat16)) == "cute"
    assert dispatch.backend_for("fwd", dev, call(Activation.GELU, torch.bfloat16)) == "gluon"
    assert dispatch.backend_for("fwd", dev, call(Activation.FAST_GELU, torch.float8_e4m3fn)) == "gluon"
    monkeypatch.setenv("ADS_GDPA_BACKEND", "auto")
    assert dispatch.backend_for("fwd", dev, call(Activation.FAST_GELU, torch.bfloat16)) == "gluon"


_BUILD = """
import torch
from ads_gdpa.cute import fwd_sm90
for key, value in {switches}.items():
    setattr(fwd_sm90.GdpaFwdSm90, key, value)
for dtype, d, act, *skip in {configs}:
    dt = getattr(torch, dtype)
    fwd_sm90.compiled(dt, d, act, fwd_sm90.defers_scale(dt, act), *skip)
"""


def _build(tmp_path: Path, configs, switches=None, keep="ptx") -> list[Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP=keep, CUTE_DSL_DUMP_DIR=str(tmp_path))
    script = textwrap.dedent(_BUILD.format(configs=configs, switches=switches or {}))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return sorted(tmp_path.glob(f"*.{keep}"))


def test_cute_forward_builds_for_sm90(tmp_path: Path):
    """Offline sm_90a builds (no GPU needed) of bf16 and fp16, D 64 and 128, fast_gelu (deferred
    scale in bf16) and relu (with the dead-half skip): wgmma for both GEMMs, TMA loads, the output
    through ``stmatrix`` and then a TMA store (full boxes) or 16-byte row stores, the hardware tanh
    for fast_gelu (spills: the SASS test below)."""
    # one dump folder per build: the DSL names its files by the kernel's signature, not its constants
    configs = [("bfloat16", 128, 3), ("float16", 64, 3), ("bfloat16", 64, 5, True)]  # last: dead-half skip
    ptx = [p.read_text() for i, c in enumerate(configs) for p in _build(tmp_path / str(i), [c])]
    assert len(ptx) == 3
    for text in ptx:
        assert text.count("wgmma.mma_async") >= 2 * 4, "fewer wgmma than two GEMMs need"
        assert "cp.async.bulk.tensor.2d.shared::cta.global" in text
        assert "stmatrix.sync.aligned" in text
        assert "cp.async.bulk.tensor.2d.global.shared::cta" in text, "no TMA store of full output boxes"
        assert "st.global.v4" in text, "no row stores for partial boxes"
    assert sum("tanh.approx.f32" in t for t in ptx) == 2


def _step_loop(cute_sass, tmp_path: Path, switches: dict):
    (cubin,) = _build(tmp_path, [("bfloat16", 128, 3)], switches, keep="cubin")
    text = subprocess.run(
        [cute_sass.nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True
    )
    (loop,) = cute_sass.step_loops(cute_sass.parse(text.stdout))
    return cute_sass.figures(loop)


def test_cute_forward_step_runs_the_activation_under_pv(cute_sass, tmp_path: Path):
    """The key step's SASS (offline sm_90a build, bf16 D=128 fast_gelu) of the ``OVERLAP`` build: both
    GEMMs issued in one turn (16 wgmma), then the wait for S alone, all 64 ``MUFU.TANH`` of the
    activation before the wait for P·V, no local memory. In the default build (no ``OVERLAP``,
    measured faster) ptxas hoists that wait above the activation, as in the Gluon forward; pinned
    too, so that a compiler that stops doing so shows up here."""
    f = _step_loop(cute_sass, tmp_path / "overlap", {"OVERLAP": True})
    assert f["wgmma"] == 16 and f["tanh"] == 64 and f["local"] == 0, f
    assert f["order"] == "B G8 G8 A W1 W0", f["order"]
    assert f["tanh_under_gemm"] == 64, f
    plain = _step_loop(cute_sass, tmp_path / "default", {})
    assert plain["tanh_under_gemm"] < 16 and plain["local"] == 0, plain


def test_compile_key_names_every_build_switch():
    """Every build switch of the kernel class (its upper-case attributes) is in the compile key, so a
    switch changed later cannot hand back a kernel built with another value."""
    from ads_gdpa.cute import fwd_sm90

    switches = {name for name in vars(fwd_sm90.GdpaFwdSm90) if name.isupper()}
    assert switches == set(fwd_sm90._SWITCHES), switches ^ set(fwd_sm90._SWITCHES)


def test_scale_deferred_for_bf16_fast_gelu_only(monkeypatch):
    """bf16 fast_gelu leaves scale·½ to the output tile (fp16 could overflow without the scale on
    each score; other activations have no deferred form); ADS_GDPA_DEFER_SCALE=0 turns it off."""
    import torch

    from ads_gdpa.cute.fwd_sm90 import defers_scale

    assert defers_scale(torch.bfloat16, int(Activation.FAST_GELU))
    assert not defers_scale(torch.float16, int(Activation.FAST_GELU))
    assert not defers_scale(torch.bfloat16, int(Activation.SILU))
    monkeypatch.setenv("ADS_GDPA_DEFER_SCALE", "0")
    assert not defers_scale(torch.bfloat16, int(Activation.FAST_GELU))


def test_deferred_build_needs_a_deferred_form():
    """A build asked to defer the scale for an activation without a deferred form is refused."""
    import cutlass

    from ads_gdpa.cute.fwd_sm90 import GdpaFwdSm90

    with pytest.raises(ValueError, match="no deferred form"):
        GdpaFwdSm90(cutlass.BFloat16, 128, int(Activation.SILU), True)
    assert GdpaFwdSm90(cutlass.BFloat16, 128, int(Activation.FAST_GELU), True).deferred
