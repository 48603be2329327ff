"""linear_layernorm / linear_rmsnorm / rmsnorm_linear: outputs, statistics and every gradient against
the fp32 reference, under the baseline-relative rule (tools/README.md)."""

from __future__ import annotations

import pytest
import torch
from _cases import DEVICE, Case, check, inputs, linear_norm_torch, ref_and_baseline, rmsnorm_linear_torch

from ads_norm_fusion import linear_layernorm, linear_layernorm_input_grad, linear_rmsnorm, rmsnorm_linear

BF16, FP16 = torch.bfloat16, torch.float16
# interpreter tiles are 32 wide: 80 and 1040 cross several column tiles with a masked tail, 16/32 fit one;
# the norm backward takes its register-row kernel up to N = 64 there, the two-phase fallback above
CPU_CASES = [
    Case(37, 48, 80),
    Case(1, 32, 32, FP16),
    Case(33, 384, 16, BF16, bias=False),
    Case(65, 64, 384, FP16, norm_bias=False),
    Case(17, 768, 48, BF16, affine=False, norm_bias=False),
    Case(9, 1040, 1040, BF16),
]
GPU_CASES = [
    Case(8192, 512, 512),
    Case(1, 512, 512),
    Case(4097, 384, 384, FP16),
    Case(1000, 768, 768),
    Case(777, 1040, 1040),
    Case(300, 256, 8192, BF16),
    Case(70, 64, 16400, FP16),  # wider than the register-row norm backward: its two-phase fallback
    Case(129, 4096, 2048, FP16, bias=False),
    Case(513, 1024, 256, BF16, affine=False, norm_bias=False),
]
CASES = [pytest.param(c, id=str(c)) for c in CPU_CASES] + [
    pytest.param(c, id=str(c), marks=pytest.mark.gpu) for c in GPU_CASES
]
GRAD_NAMES = ("x", "w", "bias", "gamma", "beta")


def _run_ours(kind, d, eps):
    t = {k: (None if v is None else v.detach().clone().requires_grad_()) for k, v in d.items() if k != "dy"}
    if kind == "ln":
        y, s1, s2 = linear_layernorm(t["x"], t["w"], t["bias"], t["gamma"], t["beta"], eps, return_stats=True)
        stats = (s1, s2)
    else:
        y, s2 = linear_rmsnorm(t["x"], t["w"], t["bias"], t["gamma"], eps, return_stats=True)
        stats = (s2,)
    leaves = [n for n in GRAD_NAMES if t.get(n) is not None]
    grads = dict(zip(leaves, torch.autograd.grad(y, [t[n] for n in leaves], d["dy"])))
    return y, stats, grads


def _checked_against_reference(case: Case, kind: str):
    """Runs our op on fresh inputs and checks y and every gradient against the fp32 reference;
    returns (case as run, inputs, eps, row statistics, gradients)."""
    if kind == "rms":
        case = Case(case.m, case.k, case.n, case.dtype, case.bias, case.affine, norm_bias=False)
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    y, stats, grads = _run_ours(kind, d, eps)
    (ref, gref), (base, gbase) = ref_and_baseline(
        lambda t, dt: linear_norm_torch(kind, t, dt, eps), d, GRAD_NAMES, case.dtype, grads=True
    )
    check(y, ref, base, "y")
    assert set(grads) == set(gref)
    for name, g in grads.items():
        check(g, gref[name], gbase[name], f"d{name}")
    return case, d, eps, stats, grads


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_linear_norm(case: Case, kind: str) -> None:
    case, d, eps, stats, grads = _checked_against_reference(case, kind)
    # statistics: fp32, per row, against the fp32 reference of z
    z = torch.nn.functional.linear(
        d["x"].float(), d["w"].float(), None if d["bias"] is None else d["bias"].float()
    )
    if kind == "ln":
        mean, rstd = stats
        var = (z - z.mean(-1, keepdim=True)).square().mean(-1)
        torch.testing.assert_close(mean, z.mean(-1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(rstd, torch.rsqrt(var + eps), atol=1e-4, rtol=1e-3)
    else:
        torch.testing.assert_close(stats[0], torch.rsqrt(z.square().mean(-1) + eps), atol=1e-4, rtol=1e-3)
    assert all(s.dtype == torch.float32 and s.shape == (case.m,) for s in stats)


# Case(37, 32, 48) and Case(999, 80, 96): the one-tile norm backward of the input mode over several
# row blocks (on the GPU in a 128-wide tile, wider than the row)
RMS_LINEAR_CPU = [
    Case(37, 48, 80),
    Case(1, 32, 16, FP16, bias=False),
    Case(37, 32, 48),
    Case(33, 1040, 48, BF16, affine=False),
]
RMS_LINEAR_GPU = [Case(65536, k, n) for k in (256, 1024) for n in (256, 1024)] + [
    Case(1000, 1040, 768, FP16),
    Case(999, 80, 96),
    Case(1, 384, 384),
]
RMS_LINEAR_CASES = [pytest.param(c, id=str(c)) for c in RMS_LINEAR_CPU] + [
    pytest.param(c, id=str(c), marks=pytest.mark.gpu) for c in RMS_LINEAR_GPU
]


# both forwards and both backwards, whatever the defaults pick at a shape
_FWD, _BWD, _DW = "ADS_NORM_FUSION_RMS_FWD", "ADS_NORM_FUSION_RMS_BWD", "ADS_NORM_FUSION_RMS_DW"
_TRITON_FWD = {"ADS_NORM_FUSION_RMS_GLUON": "0"}
RMS_PATHS = {
    "fused-input": _TRITON_FWD | {_FWD: "fused", _BWD: "input"},
    # dW from the split-M kernel on raw x (no x̂·γ tensor)
    "fused-input-dwkernel": _TRITON_FWD | {_FWD: "fused", _BWD: "input", _DW: "kernel"},
    # pointer tiles in the dx GEMM's epilogue (K <= 256: what a misaligned x takes)
    "rowpass-output": _TRITON_FWD | {_FWD: "rowpass", _BWD: "output", "ADS_NORM_FUSION_RMS_AUX_DESC": "0"},
    # K <= 256: the dx GEMM forms the row coefficient from its whole-row tile, x and dx through
    # descriptors; dW from raw x
    "fused-output-dwkernel": _TRITON_FWD | {_FWD: "fused", _BWD: "output", _DW: "kernel"},
    "rowpass-cublas": _TRITON_FWD | {_FWD: "rowpass", _BWD: "cublas"},
    # the Gluon forward (gluon.rms_linear_sm90) where the device has it, else the defaults
    "gluon-cublas": {"ADS_NORM_FUSION_RMS_GLUON": "on", _BWD: "cublas"},
    # the rule: dx by the whole-row output GEMM with dW from raw x at K <= 256, cuBLAS paths above
    "gluon-auto": {"ADS_NORM_FUSION_RMS_GLUON": "on", _BWD: "auto", _DW: "auto"},
}


@pytest.mark.parametrize("path", list(RMS_PATHS))
@pytest.mark.parametrize("case", RMS_LINEAR_CASES)
def test_rmsnorm_linear(case: Case, path: str, monkeypatch) -> None:
    for knob, value in RMS_PATHS[path].items():
        monkeypatch.setenv(knob, value)
    eps = 1e-6
    d = inputs(case, norm_over="k")
    t = {k: (None if v is None else v.detach().clone().requires_grad_()) for k, v in d.items() if k != "dy"}
    y = rmsnorm_linear(t["x"], t["gamma"], t["w"], t["bias"], eps)
    names = [n for n in ("x", "gamma", "w", "bias") if t[n] is not None]
    grads = dict(zip(names, torch.autograd.grad(y, [t[n] for n in names], d["dy"])))
    (ref, gref), (base, gbase) = ref_and_baseline(
        lambda tt, dt: rmsnorm_linear_torch(tt, dt, eps), d, names, case.dtype, grads=True
    )
    check(y, ref, base, "y")
    for name, g in grads.items():
        check(g, gref[name], gbase[name], f"d{name}")


# forward only, both forward kernels: several row blocks per persistent program (the interpreter runs
# three programs of 32 rows; the H200 132 of 128), the last row block partial
FWD_PATH_CPU = [Case(161, 48, 80), Case(129, 32, 96, FP16, bias=False, norm_bias=False)]
FWD_PATH_GPU = [Case(40000, 128, 1024), Case(17000, 256, 2064, FP16, affine=False, norm_bias=False)]
FWD_PATH_CASES = [pytest.param(c, id=str(c)) for c in FWD_PATH_CPU] + [
    pytest.param(c, id=str(c), marks=pytest.mark.gpu) for c in FWD_PATH_GPU
]


@pytest.mark.parametrize("persistent", ["1", "0"])
@pytest.mark.parametrize("case", FWD_PATH_CASES)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_linear_norm_forward_paths(kind: str, case: Case, persistent: str, monkeypatch) -> None:
    monkeypatch.setenv("ADS_NORM_FUSION_PERSISTENT", persistent)
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    with torch.no_grad():
        if kind == "ln":
            y, *stats = linear_layernorm(
                d["x"], d["w"], d["bias"], d["gamma"], d["beta"], eps, return_stats=True
            )
        else:
            y, *stats = linear_rmsnorm(d["x"], d["w"], d["bias"], d["gamma"], eps, return_stats=True)
    (ref, _), (base, _) = ref_and_baseline(
        lambda t, dt: linear_norm_torch(kind, t, dt, eps), d, (), case.dtype, grads=False
    )
    check(y, ref, base, "y")
    z = torch.nn.functional.linear(
        d["x"].float(), d["w"].float(), None if d["bias"] is None else d["bias"].float()
    )
    if kind == "ln":
        var = (z - z.mean(-1, keepdim=True)).square().mean(-1)
        torch.testing.assert_close(stats[0], z.mean(-1), atol=1e-4, rtol=1e-4)
        want = torch.rsqrt(var + eps)
    else:
        want = torch.rsqrt(z.square().mean(-1) + eps)
    torch.testing.assert_close(stats[-1], want, atol=1e-4, rtol=1e-3)


def test_leading_dims_and_empty() -> None:
    d = inputs(Case(6, 32, 48))
    x3 = d["x"].reshape(2, 3, 32)
    y, mean, rstd = linear_layernorm(x3, d["w"], d["bias"], d["gamma"], d["beta"], return_stats=True)
    y2 = linear_layernorm(d["x"], d["w"], d["bias"], d["gamma"], d["beta"])
    assert y.shape == (2, 3, 48) and mean.shape == (2, 3) and rstd.shape == (2, 3)
    assert torch.equal(y.reshape(6, 48), y2)
    assert torch.equal(rmsnorm_linear(x3, None, d["w"]).reshape(6, 48), rmsnorm_linear(d["x"], None, d["w"]))
    empty = torch.empty((0, 32), dtype=torch.bfloat16, device=DEVICE)
    assert linear_rmsnorm(empty, d["w"]).shape == (0, 48)
    assert rmsnorm_linear(empty, None, d["w"]).shape == (0, 48)


def test_weight_grads_are_deterministic() -> None:
    d = inputs(Case(70, 32, 48))
    first = _run_ours("ln", d, 1e-5)[2]
    second = _run_ours("ln", d, 1e-5)[2]
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("acc2d", ["0", "1"])
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_norm_backward_tile_knobs(kind: str, acc2d: str, monkeypatch) -> None:
    """The norm-backward sweep knobs (config.norm_bwd_config): 2-row tiles, 6 rows per program (the
    last program partial at M = 37), 2 warps, 2 stages, with and without the per-row-of-tile
    weight-gradient accumulators, still give every checked gradient."""
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_BLOCK_M", "2")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_ROWS", "6")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_WARPS", "2")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_STAGES", "2")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_ACC2D", acc2d)
    case = Case(37, 48, 48 if DEVICE == "cpu" else 1024, norm_bias=kind == "ln")
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    y, _, grads = _run_ours(kind, d, eps)
    (ref, gref), (base, gbase) = ref_and_baseline(
        lambda t, dt: linear_norm_torch(kind, t, dt, eps), d, GRAD_NAMES, case.dtype, grads=True
    )
    check(y, ref, base, "y")
    assert set(grads) == set(gref)
    for name, g in grads.items():
        check(g, gref[name], gbase[name], f"d{name}")


def test_norm_backward_tile_knobs_checked(monkeypatch) -> None:
    from ads_norm_fusion.config import norm_bwd_config

    monkeypatch.setenv("ADS_NORM_FUSION_BWD_BLOCK_M", "4")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_ROWS", "6")
    with pytest.raises(ValueError, match="power of two"):
        norm_bwd_config(64, 48, 1)
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_ROWS", "8")
    cfg = norm_bwd_config(64, 48, 1)
    assert (cfg.block_m, cfg.rows_per_prog, cfg.block_n) == (4, 8, 64)


def test_tile_choices_follow_every_knob(monkeypatch) -> None:
    """The memoised tile choices (config._per_knobs) are keyed by every knob each of them reads and by
    the interpreter switch: a knob set or changed after a call changes the next answer."""
    import inspect
    import re

    from ads_norm_fusion import config

    for choice in (config.rownorm_config, config.rms_gemm_config, config.rms_dw_config,
                   config.persistent_config, config.norm_bwd_config):  # fmt: skip
        source = inspect.getsource(choice.__wrapped__)
        assert set(re.findall(r"ADS_NORM_FUSION_[A-Z0-9_]+", source)) <= set(choice.knobs), choice
    before = config.rownorm_config(4096, 512, 512, 132)
    monkeypatch.setenv("ADS_NORM_FUSION_BLOCK_M", "16")
    assert config.rownorm_config(4096, 512, 512, 132).block_m == 16 != before.block_m
    monkeypatch.setenv("ADS_NORM_FUSION_BLOCK_M", "8")
    assert config.rownorm_config(4096, 512, 512, 132).block_m == 8
    monkeypatch.delenv("ADS_NORM_FUSION_BLOCK_M")
    assert config.rownorm_config(4096, 512, 512, 132) == before
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_STAGES", "2")
    assert config.rms_gemm_config(4096, 512, 512, backward=True).num_stages == (
        1 if config.interpreter_active() else 2
    )
    monkeypatch.setattr(config, "interpreter_active", lambda: False)
    assert config.rms_gemm_config(4096, 512, 512, backward=True).num_stages == 2
    assert config.persistent_config(4096, 512, 512, 132).tiles.block_n == 256


def test_norm_backward_gpu_defaults(monkeypatch) -> None:
    """The GPU tiles of the norm backward at the shapes they were timed at, and BLOCK_M alone giving
    back the previous tiles (the other defaults follow it)."""
    from ads_norm_fusion import config

    monkeypatch.setattr(config, "interpreter_active", lambda: False)

    def tiles(m, n):
        c = config.norm_bwd_config(m, n, 132)
        return c.block_m, c.block_n, c.rows_per_prog, c.num_warps, c.num_stages, c.acc_2d

    assert tiles(65536, 1024) == (4, 1024, 64, 4, 3, False)
    assert tiles(16384, 4096) == (4, 4096, 32, 8, 3, False)
    assert tiles(1, 16384) == (1, 16384, 8, 8, 3, False)
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_BLOCK_M", "8")
    assert tiles(65536, 1024) == (8, 1024, 64, 8, 3, False)
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_BLOCK_M", "2")
    assert tiles(16384, 4096) == (2, 4096, 16, 8, 3, False)


SUMS_CASES = [Case(37, 48, 48), Case(70, 32, 80, FP16), Case(33, 48, 32, bias=False)]  # 80: two-phase
SUMS_GPU = [Case(4097, 384, 1024), Case(1000, 768, 768, FP16)]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=str(c)) for c in SUMS_CASES]
    + [pytest.param(c, id=str(c), marks=pytest.mark.gpu) for c in SUMS_GPU],
)
@pytest.mark.parametrize("sums", ["torch", "kernel"])
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_norm_backward_sums_elsewhere(case: Case, kind: str, sums: str, monkeypatch) -> None:
    """ADS_NORM_FUSION_BWD_SUMS=torch / kernel: dγ, dβ and the bias gradient from the partials after
    the norm backward (torch reductions, or one more launch), checked against the fp32 reference, and
    bitwise repeatable. The default (in the norm-backward kernel) runs in every other test."""
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_SUMS", sums)
    if DEVICE == "cpu" and case.m > 100:
        pytest.skip("GPU shape")
    _, d, eps, _, grads = _checked_against_reference(case, kind)
    again = _run_ours(kind, d, eps)[2]
    assert all(torch.equal(grads[k], again[k]) for k in grads)


# one program per row (interpreter) or per 8 rows (GPU): three groups of programs, the last partial,
# so the in-kernel sums take both levels; and the GPU's benchmark shape, where programs race
GROUPS_CASE = Case(70, 32, 48) if DEVICE == "cpu" else Case(70 * 8, 64, 1024)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_norm_backward_sums_in_kernel(kind: str, monkeypatch) -> None:
    """The weight and bias gradients summed inside the norm-backward kernel across several groups of
    programs: against the fp32 reference, bitwise repeatable, every counter back at zero."""
    from ads_norm_fusion.triton import launch

    monkeypatch.setenv("ADS_NORM_FUSION_BWD_BLOCK_M", "1" if DEVICE == "cpu" else "4")
    monkeypatch.setenv("ADS_NORM_FUSION_BWD_ROWS", "1" if DEVICE == "cpu" else "8")
    case = Case(GROUPS_CASE.m, GROUPS_CASE.k, GROUPS_CASE.n, norm_bias=kind == "ln")
    _, d, eps, _, grads = _checked_against_reference(case, kind)
    for _ in range(3):
        again = _run_ours(kind, d, eps)[2]
        assert all(torch.equal(grads[k], again[k]) for k in grads)
    if DEVICE != "cpu":
        torch.cuda.synchronize()
        assert all(int(buf.abs().sum()) == 0 for buf in launch._COUNTERS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_norm_backward_sums_in_kernel_large(kind: str) -> None:
    """At the benchmark's headline width (1024 programs in 32 groups), repeated backwards give the same
    bits and agree with the torch reductions of the same partials to fp32 rounding."""
    import os

    case = Case(65536, 128, 1024, norm_bias=kind == "ln")
    d = inputs(case)
    eps = 1e-5 if kind == "ln" else 1e-6
    first = _run_ours(kind, d, eps)[2]
    for _ in range(3):
        again = _run_ours(kind, d, eps)[2]
        assert all(torch.equal(first[k], again[k]) for k in first)
    os.environ["ADS_NORM_FUSION_BWD_SUMS"] = "torch"
    try:
        other = _run_ours(kind, d, eps)[2]
    finally:
        del os.environ["ADS_NORM_FUSION_BWD_SUMS"]
    for k in ("bias", "gamma", "beta"):
        if k in first:
            torch.testing.assert_close(first[k].float(), other[k].float(), atol=0.5, rtol=1e-2)
    torch.testing.assert_close(first["x"], other["x"], atol=0, rtol=0)


# what the training forward saves (config.save_prenorm): its staged pre-norm tiles or a separate x̂,
# through every forward kernel (persistent, per-row-block two-phase, single tile) and both backward
# kernels (register rows up to N = 64 on the interpreter, the two-phase fallback above)
SAVE_CPU = [Case(37, 48, 80), Case(70, 32, 96, FP16, norm_bias=False), Case(33, 48, 32), Case(9, 64, 48)]
SAVE_GPU = [Case(4097, 1024, 1024), Case(300, 256, 384, FP16), Case(70, 64, 16400, FP16), Case(257, 128, 256)]


@pytest.mark.parametrize("persistent", ["1", "0"])
@pytest.mark.parametrize("save", ["z", "xhat"])
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=str(c)) for c in SAVE_CPU]
    + [pytest.param(c, id=str(c), marks=pytest.mark.gpu) for c in SAVE_GPU],
)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_saved_for_backward(case: Case, kind: str, save: str, persistent: str, monkeypatch) -> None:
    monkeypatch.setenv("ADS_NORM_FUSION_SAVE", save)
    monkeypatch.setenv("ADS_NORM_FUSION_PERSISTENT", persistent)
    _checked_against_reference(case, kind)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_saved_prenorm_far_from_zero(kind: str, monkeypatch) -> None:
    """Rows whose mean is far from zero against their spread: the saved pre-norm tiles are shifted
    by the first column tile's mean, and the backward's x̂ must take the remaining offset."""
    monkeypatch.setenv("ADS_NORM_FUSION_SAVE", "z")
    case = Case(37, 48, 80) if DEVICE == "cpu" else Case(1000, 512, 1024)
    case = Case(case.m, case.k, case.n, norm_bias=kind == "ln")
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    d["bias"] = (d["bias"].float() + 6.0).to(case.dtype)
    y, _, grads = _run_ours(kind, d, eps)
    (ref, gref), (base, gbase) = ref_and_baseline(
        lambda t, dt: linear_norm_torch(kind, t, dt, eps), d, GRAD_NAMES, case.dtype, grads=True
    )
    check(y, ref, base, "y")
    for name, g in grads.items():
        check(g, gref[name], gbase[name], f"d{name}")


def test_save_knob() -> None:
    from ads_norm_fusion import config

    assert config.save_prenorm()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADS_NORM_FUSION_SAVE", "xhat")
        assert not config.save_prenorm()
        mp.setenv("ADS_NORM_FUSION_SAVE", "y")
        with pytest.raises(ValueError, match="ADS_NORM_FUSION_SAVE"):
            config.save_prenorm()
        mp.delenv("ADS_NORM_FUSION_SAVE")
        mp.setenv("ADS_NORM_FUSION_GLUON", "auto")
        assert config.save_prenorm()  # the Gluon default does not change what training saves


def test_backward_form_knobs(monkeypatch) -> None:
    """The rmsnorm_linear backward knobs: defaults, other values, a clear error for a typo."""
    from ads_norm_fusion import config

    assert config.rms_weight_grad() == "cublas" and config.rms_backward_mode() == "cublas"
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_DW", "kernel")
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_BWD", "auto")
    assert config.rms_weight_grad() == "kernel" and config.rms_backward_mode() == "auto"
    for knob, call in (("ADS_NORM_FUSION_RMS_DW", config.rms_weight_grad),
                       ("ADS_NORM_FUSION_RMS_BWD", config.rms_backward_mode)):  # fmt: skip
        monkeypatch.setenv(knob, "tma")
        with pytest.raises(ValueError, match=knob):
            call()


@pytest.mark.parametrize("path", list(RMS_PATHS))
def test_rmsnorm_linear_op_strided_input(path: str, monkeypatch) -> None:
    """The custom op called with a column-major x and with a row-strided one (a column slice of a
    wider tensor) gives the output and gradients of its contiguous copy on every backward path."""
    from ads_norm_fusion import _ops

    for knob, value in RMS_PATHS[path].items():
        monkeypatch.setenv(knob, value)
    d = inputs(Case(20, 32, 48), norm_over="k")

    def run(x):
        x = x.detach().requires_grad_()
        g, w = d["gamma"].clone().requires_grad_(), d["w"].clone().requires_grad_()
        y, _ = _ops.rmsnorm_linear_fwd(x, g, w, None, 1e-6)
        return (y, *torch.autograd.grad(y, (x, g, w), d["dy"]))

    want = run(d["x"])
    column_major = d["x"].t().contiguous().t()
    row_strided = torch.cat([d["x"], d["x"]], dim=1)[:, :32]
    assert column_major.stride() == (1, 20) and row_strided.stride() == (64, 1)
    for x in (column_major, row_strided):
        for a, b in zip(run(x), want, strict=True):
            assert torch.equal(a, b)


def _strided(v: torch.Tensor) -> torch.Tensor:
    """v's values in a stride-2 view (every other element of a wider buffer)."""
    wide = torch.zeros(v.shape[0], 2, dtype=v.dtype, device=v.device)
    wide[:, 1] = v
    return wide[:, 1]


@pytest.mark.parametrize("op", ["ln", "rms", "rms_linear", "ln_input_grad"])
def test_strided_vectors_give_their_contiguous_result(op: str) -> None:
    """Bias and norm parameters passed as strided views (a column of a matrix, ``p[::2]``) give the
    output and gradients of their contiguous copies: the kernels index vectors by position, so the
    interface hands them contiguous ones (strided vectors were read as the wrong elements)."""
    d = inputs(Case(20, 32, 48), norm_over="k" if op in ("rms_linear", "ln_input_grad") else "n")
    vec_names = {"ln": ("bias", "gamma", "beta"), "rms": ("bias", "gamma"), "rms_linear": ("gamma", "bias"),
                 "ln_input_grad": ("gamma",)}[op]  # fmt: skip
    if op == "ln_input_grad":
        # dy (20, 48) of a next layer whose weight is d["w"] (48, 32); x̂ and γ over its 32 inputs
        rstd = torch.rand(20, device=d["x"].device) + 0.5
        args = (d["dy"], d["w"], d["x"], rstd)
        plain = linear_layernorm_input_grad(*args, d["gamma"], weight_grads=True)
        strided = linear_layernorm_input_grad(*args, _strided(d["gamma"]), weight_grads=True)
        for a, b in zip(strided, plain, strict=True):
            assert torch.equal(a, b)
        return

    def run(vectors):
        leaves = [d["x"].clone().requires_grad_(), d["w"].clone().requires_grad_()]
        vecs = [v.detach().requires_grad_() for v in vectors]
        x, w = leaves
        named = dict(zip(vec_names, vecs))
        if op == "ln":
            y = linear_layernorm(x, w, named["bias"], named["gamma"], named["beta"])
        elif op == "rms":
            y = linear_rmsnorm(x, w, named["bias"], named["gamma"])
        else:
            y = rmsnorm_linear(x, named["gamma"], w, named["bias"])
        return (y, *torch.autograd.grad(y, leaves + vecs, d["dy"]))

    want = run([d[n] for n in vec_names])
    got = run([_strided(d[n]) for n in vec_names])
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("k, keeps_y", [(32, False), (272, True)])
def test_output_backward_keeps_y_only_where_it_reads_it(k: int, keeps_y: bool, monkeypatch) -> None:
    """The `output` backward reads the saved output y only above ``ROW_COEF_MAX_N`` (its row pass);
    at K <= 256 the whole-row dx GEMM forms that sum itself, so the forward does not keep y (M x N of
    activation memory per layer)."""
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_BWD", "output")
    d = inputs(Case(20, k, 48), norm_over="k")
    x, g, w = (d[n].clone().requires_grad_() for n in ("x", "gamma", "w"))
    y = rmsnorm_linear(x, g, w, None)
    saved_y = y.grad_fn.saved_tensors[4]
    assert (saved_y is not None) == keeps_y
    dx, dg, dw = torch.autograd.grad(y, (x, g, w), d["dy"])
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_BWD", "cublas")
    want = torch.autograd.grad(rmsnorm_linear(x, g, w, None), (x, g, w), d["dy"])
    for got, ref in zip((dx, dg, dw), want, strict=True):
        torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("k, whole_row", [(32, True), (256, True), (272, False)])
def test_rms_backward_auto_routes_by_width(k: int, whole_row: bool, monkeypatch) -> None:
    """``ADS_NORM_FUSION_RMS_BWD=auto`` sends K <= 256 to the whole-row dx GEMM with the raw-x dW
    kernel, and wider rows to cuBLAS + the row-wise norm backward (what the calls, not the values,
    show: both routes give the same gradients)."""
    from ads_norm_fusion import _ops

    monkeypatch.setenv("ADS_NORM_FUSION_RMS_BWD", "auto")
    monkeypatch.setenv("ADS_NORM_FUSION_RMS_DW", "auto")
    seen = []

    def spy(name, launch):
        def launch_and_record(*args, **kwargs):
            seen.append((name, kwargs))
            return launch(*args, **kwargs)

        return launch_and_record

    for name in ("launch_scaled_gemm", "launch_rms_dw", "launch_norm_bwd"):
        monkeypatch.setattr(_ops, name, spy(name, getattr(_ops, name)))
    d = inputs(Case(6, k, 32), norm_over="k")
    x, g, w = (d[n].clone().requires_grad_() for n in ("x", "gamma", "w"))
    torch.autograd.grad(rmsnorm_linear(x, g, w), (x, g, w), d["dy"])
    names = [n for n, _ in seen]
    if whole_row:
        assert names.count("launch_scaled_gemm") == 1 and "launch_rms_dw" in names, names
        assert "launch_norm_bwd" not in names and all(
            kw.get("row_coef") for n, kw in seen if n == "launch_scaled_gemm"
        )
    else:
        assert names == ["launch_norm_bwd"], names
