"""The Gluon sm_90 forward of linear_layernorm / linear_rmsnorm (``gluon.fwd_sm90``): which calls its
predicate admits (CPU), outputs, statistics and gradients through the ops against the fp32 references
(GPU, ``ADS_NORM_FUSION_GLUON=on``), and that it writes every output element and nothing outside."""

from __future__ import annotations

import os

import pytest
import torch
from _cases import DEVICE, Case, check, inputs, linear_norm_torch, ref_and_baseline

from ads_kernel_tools.testing import poisoned_empty, randn
from ads_norm_fusion import linear_layernorm, linear_rmsnorm
from ads_norm_fusion.gluon import dispatch

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture
def gluon_on(monkeypatch):
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "on")


@pytest.fixture(params=["split1", "split2", "split1-ws", "split2-ws", "split2-epi"])
def gluon_split(request, monkeypatch):
    """Both layouts of the Gluon forward: 64-row blocks in one program, or 128-row blocks shared by
    two programs (N a multiple of 128; other N fall back to one program); each with the
    single-partition kernel and with the warp-specialised one (``-ws``); and the normalisation-
    partition kernel (``-epi``: calls without x̂ whose N it cuts into 128- or 256-column parts,
    the others the warp-specialised kernel)."""
    split, _, kernel = request.param.partition("-")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "on")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_SPLIT", split[-1])
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_WS", "1" if kernel else "0")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_EPI", "1" if kernel == "epi" else "0")


def _mats(m, k, n, dtype=BF16, device="cpu"):
    x = torch.zeros(m, k, dtype=dtype, device=device)
    w = torch.zeros(n, k, dtype=dtype, device=device)
    return x, w, torch.empty(m, n, dtype=dtype, device=device)


def test_split_knob(monkeypatch) -> None:
    from ads_norm_fusion import config

    monkeypatch.delenv("ADS_NORM_FUSION_GLUON_SPLIT", raising=False)
    assert (config.gluon_split(1024), config.gluon_split(384), config.gluon_split(192)) == (2, 2, 1)
    # above 1024 columns: the fewest programs of at most 512 columns, each a multiple of 128
    wide = {1152: 3, 1280: 5, 1536: 3, 2048: 4, 4096: 8, 6144: 12, 8192: 16, 1088: 1, 2176: 1, 8320: 1}
    assert {n: config.gluon_split(n) for n in wide} == wide
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_SPLIT", "1")
    assert config.gluon_split(1024) == 1 and config.gluon_split(4096) == 1
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_SPLIT", "3")
    with pytest.raises(ValueError, match="ADS_NORM_FUSION_GLUON_SPLIT"):
        config.gluon_split(1024)


def test_epi_knob_and_split(monkeypatch) -> None:
    """``ADS_NORM_FUSION_GLUON_EPI`` (1 default / 0) and the normalisation-partition kernel's parts:
    256 columns where they divide N, else 128, at most 32 programs; 0 where neither fits."""
    from ads_norm_fusion import config

    _check_switch(monkeypatch, "ADS_NORM_FUSION_GLUON_EPI", config.gluon_epi, bad="on")
    parts = {128: 1, 256: 1, 384: 3, 1024: 4, 1152: 9, 4096: 16, 8192: 32, 192: 0, 64: 0, 8448: 0}
    assert {n: config.gluon_epi_split(n) for n in parts} == parts


def test_ws_knob(monkeypatch) -> None:
    from ads_norm_fusion import config

    _check_switch(monkeypatch, "ADS_NORM_FUSION_GLUON_WS", config.gluon_ws, bad="yes")


def test_launch_cache_knob(monkeypatch) -> None:
    """One switch for every relaunch: the tools' ``ADS_LAUNCH_CACHE``, which this package's launches
    follow (they pass no ``cached=`` of their own)."""
    from ads_kernel_tools.kernels import launch_cache

    _check_switch(monkeypatch, "ADS_LAUNCH_CACHE", launch_cache.enabled, bad="true")


def _check_switch(monkeypatch, name: str, read, *, bad: str) -> None:
    """A 0/1 switch on by default: unset -> True, ``0`` -> False, anything else a ValueError naming it."""
    monkeypatch.delenv(name, raising=False)
    assert read() is True
    monkeypatch.setenv(name, "0")
    assert read() is False
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=name):
        read()


def test_ws_launch_arguments(monkeypatch) -> None:
    """The launcher's choices per kernel (no GPU: the kernels are replaced by recorders): the
    warp-specialised kernel runs 4 warps with 64-row output boxes and two flags per row block."""
    pytest.importorskip("triton.experimental.gluon")
    from ads_norm_fusion.gluon import fwd_sm90 as g

    seen = {}

    class Recorder:  # a LaunchCache's surface
        def __init__(self, name):
            self.name = name

        def launch(self, grid, args, kw, *, cached=None):
            seen[self.name] = (grid, args, dict(kw))

    monkeypatch.setattr(g, "_LAUNCH", Recorder("single"))
    monkeypatch.setattr(g, "_LAUNCH_WS", Recorder("ws"))
    m, k, n = 1000, 64, 1024
    x, w, out = _mats(m, k, n)
    stat = torch.empty(m)
    for ws in (False, True):
        g.forward(x, w, out, stat, stat1=stat, eps=1e-5, rms=False, num_sms=132, split=2, ws=ws)
    (grid1, args1, kw1), (grid2, args2, kw2) = seen["single"], seen["ws"]
    assert grid1 == grid2 == (16,)  # 8 row blocks of 128, two programs each
    assert (kw1["num_warps"], kw2["num_warps"]) == (8, 4)
    kw1.pop("num_warps"), kw2.pop("num_warps")
    assert kw1 == kw2
    assert args1[2].block_shape == [128, 256] and args2[2].block_shape == [64, 256]
    assert args1[0].block_shape == args2[0].block_shape == [128, 32]
    assert args1[10].numel() == 8 and args2[10].numel() == 16  # flags

    # N = 4096 over eight programs per row block: 16 row-block groups of 8 fill 128 of the 132 SMs
    seen.clear()
    x, w, out = _mats(m, k, 4096)
    for ws in (False, True):
        g.forward(x, w, out, stat, stat1=stat, eps=1e-5, rms=False, num_sms=132, split=8, ws=ws)
    (grid1, args1, kw1), (grid2, args2, kw2) = seen["single"], seen["ws"]
    assert grid1 == grid2 == (64,)  # 8 row blocks of 128 (M = 1000), eight programs each
    assert (kw1["num_warps"], kw2["num_warps"], kw2["NT"], kw2["SPLIT"]) == (8, 4, 2, 8)
    assert args1[2].block_shape == [128, 256] and args2[2].block_shape == [64, 256]
    assert args2[9].numel() == 8 * 2 * 8 * 128  # per row block: (mean, M2) of 128 rows for 8 parts
    g.forward(x, w, out, stat, stat1=stat, eps=1e-5, rms=False, num_sms=132, split=8, ws=True)
    g.forward(torch.zeros(20000, k, dtype=BF16), w, torch.empty(20000, 4096, dtype=BF16), torch.empty(20000),
              stat1=torch.empty(20000), eps=1e-5, rms=False, num_sms=132, split=8, ws=True)  # fmt: skip
    assert seen["ws"][0] == (128,)


def test_forward_picks_a_kernel_the_sms_can_hold(monkeypatch) -> None:
    """Which Gluon kernel ``dispatch.forward`` launches (kernels replaced by recorders, the device
    check passed): the normalisation partition without x̂ and for a training forward saving the
    pre-norm value (``raw``), the warp-specialised kernel with x̂, and neither (the Triton kernel)
    where the row block's programs outnumber the SMs: they wait for each other, so all must be
    resident (N = 8192: 32 or 16 programs on a 16-SM slice), or where a raw save meets N that the
    normalisation partition does not cut (N = 576) or ``ADS_NORM_FUSION_GLUON_EPI=0``."""
    pytest.importorskip("triton.experimental.gluon")
    from ads_norm_fusion.gluon import fwd_epi_sm90, fwd_sm90

    seen = []
    monkeypatch.setattr(dispatch, "why_not", lambda *a, **kw: None)

    def epi(*a, split, zsave, zoff, **kw):
        seen.append(("epi", split) if zsave is None else ("epi-z", split, zoff is not None))

    monkeypatch.setattr(fwd_epi_sm90, "forward", epi)
    monkeypatch.setattr(fwd_sm90, "forward", lambda *a, split, **kw: seen.append(("ws", split)))
    monkeypatch.delenv("ADS_NORM_FUSION_GLUON_EPI", raising=False)
    monkeypatch.delenv("ADS_NORM_FUSION_GLUON_SPLIT", raising=False)
    kw = dict(stat1=None, bias=None, gamma=None, beta=None, eps=1e-5)
    for sms, n, xhat, want in [(132, 1024, False, ("epi", 4)), (132, 1024, True, ("ws", 2)),
                               (132, 1024, "raw", ("epi-z", 4, True)), (132, 576, "raw", None),
                               (132, 8192, False, ("epi", 32)), (16, 8192, False, ("ws", 16)),
                               (8, 8192, False, None), (8, 8192, True, None), (8, 8192, "raw", None),
                               (132, 4096, "raw", ("epi-z", 16, True))]:  # fmt: skip
        monkeypatch.setattr(dispatch, "num_sms", lambda _d, s=sms: s)
        x, w, out = _mats(64, 64, n)
        xoff = torch.empty(64) if xhat == "raw" else None
        seen.clear()
        took = dispatch.forward(
            "ln_fwd", x, w, out, out, xhat=out if xhat else None, raw=xhat == "raw", xoff=xoff, **kw
        )
        assert took == (want is not None) and seen == ([want] if want else []), (sms, n, xhat, seen)
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_EPI", "0")
    x, w, out = _mats(64, 64, 1024)
    assert not dispatch.forward("rms_fwd", x, w, out, out, xhat=out, raw=True, **kw)
    assert seen == [("epi-z", 16, True)]


def test_switch_auto_by_size(monkeypatch) -> None:
    """Default ``auto``: calls of 2^25 outputs or more (the size alone, checked with ``gluon_forward``
    so that no large tensor is needed), ``on`` every call, ``0`` none."""
    from ads_norm_fusion import config

    monkeypatch.delenv("ADS_NORM_FUSION_GLUON", raising=False)
    assert dispatch.why_not(*_mats(64, 64, 128)) == "ADS_NORM_FUSION_GLUON=auto (M·N=8192)"
    assert config.gluon_forward(65536, 512) and not config.gluon_forward(8192, 512)
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "on")
    assert not dispatch.why_not(*_mats(64, 64, 128)).startswith("ADS_NORM_FUSION_GLUON")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "0")
    assert dispatch.why_not(*_mats(64, 64, 128)).startswith("ADS_NORM_FUSION_GLUON=0")
    assert not config.gluon_forward(65536, 1024)
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "maybe")
    with pytest.raises(ValueError, match="ADS_NORM_FUSION_GLUON"):
        dispatch.why_not(*_mats(64, 64, 128))


@pytest.mark.parametrize(
    "m,k,n,dtype,reason",
    [
        (64, 64, 1088, BF16, "N=1088"),
        (64, 64, 2176, BF16, "N=2176"),  # a multiple of 128, but no split into <= 16 parts of <= 512
        (64, 64, 8320, BF16, "N=8320"),
        (64, 64, 80, BF16, "N=80"),
        (64, 12, 128, BF16, "K=12"),
        (64, 64, 128, torch.float32, "dtype"),
    ],
)
def test_why_not_sizes_and_dtypes(gluon_on, m, k, n, dtype, reason) -> None:
    assert dispatch.why_not(*_mats(m, k, n, dtype)).startswith(reason)


def test_why_not_layouts(gluon_on) -> None:
    x, w, out = _mats(64, 64, 128)
    odd = torch.zeros(64, 68, dtype=BF16)[:, :64]  # 136-byte row stride
    assert dispatch.why_not(odd, w, out) == "strided or unaligned tensors"
    assert dispatch.why_not(x.t(), w, out) == "strided or unaligned tensors"
    flat = torch.zeros(64 * 64 + 4, dtype=BF16)
    assert dispatch.why_not(flat[4:].view(64, 64), w, out) == "strided or unaligned tensors"  # 8-byte base
    bad_xhat = torch.empty(64, 129, dtype=BF16)[:, :128]
    assert dispatch.why_not(x, w, out, xhat=bad_xhat) == "strided or unaligned tensors"
    vec = torch.zeros(256)[::2]
    assert dispatch.why_not(x, w, out, vectors=(None, vec)) == "strided bias or norm parameters"
    # everything else admitted: the device decides
    assert dispatch.why_not(x, w, out, vectors=(torch.zeros(128),)) in ("interpreter", "not an sm_90 GPU")


def test_why_not_accepts_k_tail(gluon_on) -> None:
    x, w, out = _mats(64, 40, 192)
    assert dispatch.why_not(x, w, out) in ("interpreter", "not an sm_90 GPU")


def test_why_not_wide_rows(gluon_on, monkeypatch) -> None:
    """N above 1024 goes to the Gluon forward in parts of at most 512 columns (split 2, the default);
    the one-program layout keeps its 1024-column limit."""
    monkeypatch.delenv("ADS_NORM_FUSION_GLUON_SPLIT", raising=False)
    for n in (1152, 4096, 8192):
        assert dispatch.why_not(*_mats(64, 64, n)) in ("interpreter", "not an sm_90 GPU")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_SPLIT", "1")
    assert dispatch.why_not(*_mats(64, 64, 4096)).startswith("N=4096")


# ------------------------------------------------------------------------------------------ GPU
# the spec's 8192x512x512, M = 1, partial row blocks, N = 384 / 768 / 1024 (128-wide tiles) and 64 /
# 192 (64-wide tiles), K tails (48, 1040: TMA zero-fills the last K step), several row blocks per
# program (40000 rows: 625 row blocks on 132 programs)
GPU_FWD = [
    Case(8192, 512, 512),
    Case(1, 512, 512, FP16),
    Case(4097, 384, 384, FP16),
    Case(1000, 768, 768),
    Case(777, 1040, 1024, BF16, bias=False),
    Case(40000, 128, 1024, FP16, norm_bias=False),
    Case(65, 48, 192, BF16, affine=False, norm_bias=False),
    Case(300, 256, 64, FP16),
]


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _stats_ref(d, kind, eps):
    z = torch.nn.functional.linear(
        d["x"].float(), d["w"].float(), None if d["bias"] is None else d["bias"].float()
    )
    if kind == "ln":
        var = (z - z.mean(-1, keepdim=True)).square().mean(-1)
        return z.mean(-1), torch.rsqrt(var + eps)
    return (torch.rsqrt(z.square().mean(-1) + eps),)


def _assert_gluon_path(d, y_like, xhat=False) -> None:
    """The case must really take the Gluon kernel, or the test checks the Triton one."""
    if DEVICE != "cpu" and _sm90():
        xh = torch.empty_like(y_like) if xhat else None
        assert (
            dispatch.why_not(d["x"], d["w"], y_like, xhat=xh, vectors=(d["bias"], d["gamma"], d["beta"]))
            is None
        )


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FWD, ids=str)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gluon_forward(gluon_split, kind: str, case: Case) -> None:
    if kind == "rms":
        case = Case(case.m, case.k, case.n, case.dtype, case.bias, case.affine, norm_bias=False)
    eps = 1e-5 if kind == "ln" else 1e-6
    stats = _forward_checked(inputs(case), case, kind, eps)
    assert all(s.dtype == torch.float32 and s.shape == (case.m,) for s in stats)


def _forward_checked(d, case: Case, kind: str, eps: float):
    """The no-grad forward of ``d`` through the Gluon kernel against the references (output and
    statistics); returns the statistics."""
    _assert_gluon_path(d, torch.empty(case.m, case.n, dtype=case.dtype, device=DEVICE))
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
    want = _stats_ref(d, kind, eps)
    if kind == "ln":
        torch.testing.assert_close(stats[0], want[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(stats[-1], want[-1], atol=1e-4, rtol=1e-3)
    return stats


GRAD_NAMES = ("x", "w", "bias", "gamma", "beta")


# N above 1024: 3 (1536), 4 (2048), 8 (4096) and 16 (8192) programs per row block, partial row blocks,
# a K tail, M = 1, and more row blocks than the grid's 16 groups of 8 (40000 rows: 313 row blocks)
GPU_FWD_WIDE = [
    Case(1000, 256, 4096),
    Case(4097, 512, 1536, FP16),
    Case(300, 1040, 2048, BF16, bias=False),
    Case(1, 64, 4096, FP16),
    Case(129, 64, 8192, BF16, norm_bias=False),
    Case(40000, 64, 4096, BF16, affine=False, norm_bias=False),
]


@pytest.fixture(params=["wide", "wide-ws", "wide-epi"])
def gluon_wide(request, monkeypatch):
    """The shared-row-block layout (the default split) with each kernel."""
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "on")
    monkeypatch.delenv("ADS_NORM_FUSION_GLUON_SPLIT", raising=False)
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_WS", "0" if request.param == "wide" else "1")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_EPI", "1" if request.param.endswith("epi") else "0")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FWD_WIDE, ids=str)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gluon_forward_wide(gluon_wide, kind: str, case: Case) -> None:
    if kind == "rms":
        case = Case(case.m, case.k, case.n, case.dtype, case.bias, case.affine, norm_bias=False)
    eps = 1e-5 if kind == "ln" else 1e-6
    _forward_checked(inputs(case), case, kind, eps)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [Case(4097, 384, 768), Case(129, 1024, 1024, FP16)], ids=str)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gluon_forward_training(gluon_split, kind: str, case: Case, monkeypatch) -> None:
    """With grad enabled and an affine norm the forward also writes what the backward reads: the
    normalisation partition (``-epi``) the pre-norm value (the default ``config.save_prenorm``),
    the other kernels x̂ (``ADS_NORM_FUSION_SAVE=xhat``; with the default they leave training to
    the Triton kernels). Checks that the Gluon kernel really ran."""
    epi = os.environ["ADS_NORM_FUSION_GLUON_EPI"] == "1"
    if not epi:
        monkeypatch.setenv("ADS_NORM_FUSION_SAVE", "xhat")
    _training_checked(case, kind, monkeypatch, want="epi-z" if epi else "sm90")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case", [Case(4097, 384, 4096), Case(1, 64, 1536, FP16), Case(300, 1040, 2048, norm_bias=False)], ids=str
)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gluon_forward_training_wide(gluon_wide, kind: str, case: Case, monkeypatch) -> None:
    """Training forwards above N = 1024: with ``-epi`` the normalisation-partition kernel saves the
    pre-norm value (the default ``config.save_prenorm``) and must really be the kernel that ran."""
    epi = os.environ["ADS_NORM_FUSION_GLUON_EPI"] == "1"
    _training_checked(case, kind, monkeypatch, want="epi-z" if epi else None)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("n", [1024, 4096])
def test_gluon_forward_training_mean_far_from_zero(kind: str, n: int, monkeypatch) -> None:
    """Training forwards through the normalisation partition on rows whose mean (64) is far from
    their spread: the saved pre-norm value is centred in fp32 before its rounding, so x̂ and every
    gradient keep the reference's accuracy."""
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON", "on")
    monkeypatch.setenv("ADS_NORM_FUSION_GLUON_EPI", "1")
    _training_checked(Case(1000, 512, n), kind, monkeypatch, want="epi-z", offset=64.0)


def _training_checked(case: Case, kind: str, monkeypatch, want: str | None, offset: float = 0.0) -> None:
    """Output and every gradient of a training forward of ``case`` against the references, and
    which Gluon kernel ran (``want``: "epi-z" the normalisation partition saving the pre-norm
    value, "sm90" ``fwd_sm90``, None neither); ``offset`` is added to the GEMM bias."""
    from ads_norm_fusion.gluon import fwd_epi_sm90, fwd_sm90

    ran = []
    for mod, name in ((fwd_epi_sm90, "epi"), (fwd_sm90, "sm90")):

        def spy(*a, _real=mod.forward, _name=name, **kw):
            ran.append(_name + ("-z" if kw.get("zsave") is not None else ""))
            return _real(*a, **kw)

        monkeypatch.setattr(mod, "forward", spy)
    if kind == "rms":
        case = Case(case.m, case.k, case.n, case.dtype, case.bias, case.affine, norm_bias=False)
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    if offset:
        d["bias"] = (d["bias"].float() + offset).to(case.dtype)
    t = {k: (None if v is None else v.detach().clone().requires_grad_()) for k, v in d.items() if k != "dy"}
    if kind == "ln":
        y = linear_layernorm(t["x"], t["w"], t["bias"], t["gamma"], t["beta"], eps)
    else:
        y = linear_rmsnorm(t["x"], t["w"], t["bias"], t["gamma"], eps)
    leaves = [n for n in GRAD_NAMES if t.get(n) is not None]
    grads = dict(zip(leaves, torch.autograd.grad(y, [t[n] for n in leaves], d["dy"])))
    (ref, gref), (base, gbase) = ref_and_baseline(
        lambda tt, dt: linear_norm_torch(kind, tt, dt, eps), d, GRAD_NAMES, case.dtype, grads=True
    )
    check(y, ref, base, "y")
    for name, g in grads.items():
        check(g, gref[name], gbase[name], f"d{name}")
    assert ran == ([want] if want else []), ran


def _guarded(m, n, dtype):
    full = poisoned_empty((m + 6, n), dtype=dtype, device=DEVICE)
    return full, full[3 : 3 + m]


def _assert_written(full, m, name):
    inner, guard = full[3 : 3 + m], torch.cat([full[:3], full[3 + m :]])
    assert not inner.isnan().any(), f"{name}: {int(inner.isnan().sum())} elements not written"
    assert guard.isnan().all(), f"{name}: wrote outside its rows"


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(1, 64, 128), (8513, 96, 384), (1, 64, 2048), (3001, 96, 4096)])
@pytest.mark.parametrize("mode", ["ln_fwd", "rms_fwd"])
@pytest.mark.parametrize("save_xhat", [True, False, "raw"])
def test_gluon_forward_writes_all(gluon_split, m, k, n, mode, save_xhat) -> None:
    if n > 1024 and os.environ["ADS_NORM_FUSION_GLUON_SPLIT"] == "1":
        pytest.skip("N > 1024 needs the shared row blocks")
    raw = save_xhat == "raw"
    if raw and os.environ["ADS_NORM_FUSION_GLUON_EPI"] != "1":
        pytest.skip("only the normalisation partition saves the pre-norm value")
    from ads_norm_fusion.triton.launch import launch_rownorm

    dt = BF16
    x, w = randn((m, k), dtype=dt, device=DEVICE), randn((n, k), dtype=dt, device=DEVICE, seed=1)
    gamma, beta = randn((n,), dtype=dt, device=DEVICE, seed=2), randn((n,), dtype=dt, device=DEVICE, seed=3)
    yf, y = _guarded(m, n, dt)
    xf, xh = _guarded(m, n, dt) if save_xhat else (None, None)
    s1f = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    s2f = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    of = poisoned_empty((m + 6,), dtype=torch.float32, device=DEVICE)
    xoff = of[3 : 3 + m] if raw and mode == "ln_fwd" else None
    assert dispatch.why_not(x, w, y, xhat=xh, vectors=(gamma, beta)) is None
    launch_rownorm(
        mode, x, y, s2f[3 : 3 + m], b=w, gamma=gamma, beta=beta if mode == "ln_fwd" else None,
        xhat=xh, stat1=s1f[3 : 3 + m], eps=1e-5, aux_raw=raw, xoff=xoff,
    )  # fmt: skip
    _assert_written(yf, m, "y")
    if save_xhat:
        _assert_written(xf, m, "xhat")
    if xoff is not None:
        _assert_written(of[:, None], m, "xoff")
        if n % 128 == 0:  # the normalisation partition's pre-norm value is centred: no offset
            assert (xoff == 0).all()
    _assert_written(s2f[:, None], m, "rstat")
    if mode == "ln_fwd":
        _assert_written(s1f[:, None], m, "mean")


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [6.0, 64.0])
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("n", [1024, 4096])
def test_gluon_forward_mean_far_from_zero(gluon_split, kind: str, offset: float, n: int) -> None:
    """Rows whose mean is far from zero against their spread: the kernel merges column tiles by
    Chan's formula around the first tile's mean; a one-pass E[z²] - E[z]² would lose the variance.
    N = 4096: eight programs' parts merged the same way."""
    if n > 1024 and os.environ["ADS_NORM_FUSION_GLUON_SPLIT"] == "1":
        pytest.skip("N > 1024 needs the shared row blocks")
    case = Case(1000, 512, n, norm_bias=kind == "ln")
    eps = 1e-5 if kind == "ln" else 1e-6
    d = inputs(case)
    d["bias"] = (d["bias"].float() + offset).to(case.dtype)
    _forward_checked(d, case, kind, eps)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_launch_cache_relaunch_matches(gluon_split, kind: str, monkeypatch) -> None:
    """A relaunch from the tools' launch cache gives the bits of Triton's own launch, and a call that
    Triton specialises otherwise (M = 1, a constant to Triton) gets its own kernel. The cache starts
    empty here: other tests' launches would otherwise count."""
    from ads_norm_fusion.gluon import fwd_epi_sm90

    if os.environ["ADS_NORM_FUSION_GLUON_EPI"] != "1":
        pytest.skip("the launch cache serves the normalisation-partition kernel")
    monkeypatch.setattr(fwd_epi_sm90._LAUNCH, "_kernels", {})
    outs = {}
    for cached in ("0", "1", "1"):
        monkeypatch.setenv("ADS_LAUNCH_CACHE", cached)
        for m, k in ((300, 64), (300, 48), (1, 64)):
            x = randn((m, k), dtype=BF16, device=DEVICE)
            w = randn((512, k), dtype=BF16, device=DEVICE, seed=1)
            g = randn((512,), dtype=BF16, device=DEVICE, seed=2)
            with torch.no_grad():
                y = linear_rmsnorm(x, w, None, g) if kind == "rms" else linear_layernorm(x, w, None, g, g)
            outs.setdefault((m, k), []).append(y)
    for (m, k), ys in outs.items():
        assert all(torch.equal(ys[0], y) for y in ys[1:]), (m, k)
    assert len(fwd_epi_sm90._LAUNCH._kernels) >= 2
