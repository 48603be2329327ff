"""The CuTe DSL sm_90 GDPA backward (``ads_gdpa.cute.bwd_sm90``, opt-in: ADS_GDPA_BWD_BACKEND=cute).

On an sm_90 GPU: the Gluon backward's case matrix (``test_gluon_bwd``: ragged lengths with 0/1/tile±1,
GQA/MQA, D 64/128, bf16/fp16, scales, max_seqlen_q clamping, every activation the CuTe table lists)
against autograd through the fp32 reference, dK/dV poisoned with NaN; and the dispatch switch.
Without a GPU: the kernel builds offline for sm_90a and its PTX holds the instructions the design
needs. Everything skips when the DSL (the ``cute`` extra) is not installed.

On CPU too: the wrapper's runtime views match the compiled signature and accept inputs that require
grad; ``tests/cute_probe.py bisect`` checks the build switches one process each. The disk cache of
compiled kernels: ``test_cute_kernel_cache.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ads_gdpa import dispatch
from ads_gdpa.activations import Activation

pytest.importorskip("cutlass.cute")

from test_gluon_bwd import _cases, _check, dispatch_check

CUTE_ACTS = dispatch.SUPPORT[("cute", 9, "bwd")].activations
CASES = [c for c in _cases() if int(c.get("act", Activation.FAST_GELU)) in CUTE_ACTS]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cute_bwd(case):
    from ads_gdpa.cute.bwd_sm90 import gdpa_bwd_cute

    _check(**CASES[case], kernel=gdpa_bwd_cute)


@pytest.mark.gpu
@pytest.mark.sm90
def test_cute_bwd_runs_on_the_callers_stream():
    """TVM-FFI launches on the caller's current torch stream: on a side stream held busy by a sleep,
    the inputs and the NaN-poisoned dK/dV are written after the sleep, so a launch on any other stream
    would read them unwritten and leave NaN or wrong values."""
    import torch

    from ads_gdpa.cute.bwd_sm90 import gdpa_bwd_cute

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        _check([300, 129], [300, 65], kernel=gdpa_bwd_cute)


# the matrix's bf16 fast_gelu cases, those the packed build changes
PACKED_CASES = [
    c for c in CASES if int(c.get("act", Activation.FAST_GELU)) == Activation.FAST_GELU and "dtype" not in c
]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", range(len(PACKED_CASES)))
def test_cute_bwd_packed_act(monkeypatch, case):
    """``ACT_PACKED``: the same tolerance rule against the fp32 reference with act and act' in bf16x2
    arithmetic (ragged, GQA, D 64/128, the scales 1, 0.37 and 1/max_seqlen of the matrix)."""
    from ads_gdpa.cute import bwd_sm90

    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "ACT_PACKED", True)
    _check(**PACKED_CASES[case], kernel=bwd_sm90.gdpa_bwd_cute)


@pytest.mark.gpu
@pytest.mark.sm90
def test_dispatch_takes_cute_backward(monkeypatch):
    """Through the op and autograd, as users call it (its first GPU run caught the BufferError of
    saved inputs that require grad)."""
    from ads_gdpa.cute import bwd_sm90

    dispatch_check(monkeypatch, bwd_sm90, "gdpa_bwd_cute", "cute")


@pytest.mark.gpu
@pytest.mark.sm90
def test_auto_takes_cute_backward(monkeypatch):
    """Auto sends a D=128 backward with more than 256 keys per sequence to the CuTe kernel (300 here),
    through the op and autograd, within the tolerance rule."""
    from ads_gdpa.cute import bwd_sm90

    dispatch_check(monkeypatch, bwd_sm90, "gdpa_bwd_cute", "auto")


_BUILD = """
import sys, torch
from ads_gdpa.cute import bwd_sm90
for key, value in {switches}.items():
    setattr(bwd_sm90.GdpaBwdSm90, key, value)
for dtype, d, act in {configs}:
    bwd_sm90.compiled(getattr(torch, dtype), d, act)
"""
_TENSOR_REDUCE = "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"
_TENSOR_REDUCE_3D = "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add"  # column-block dQ box


_ROW_REDUCE = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"


@pytest.mark.parametrize(
    "configs, switches, reduce",
    [
        ([("bfloat16", 128, 3)], {}, _TENSOR_REDUCE_3D),
        ([("float16", 64, 3), ("bfloat16", 128, 10)], {}, _TENSOR_REDUCE_3D),
        ([("bfloat16", 128, 3)], {"DS_KMAJOR": True, "DQ_MODE": "bulk"}, _ROW_REDUCE),
        ([("bfloat16", 128, 3), ("float16", 64, 10)], {"DQ_COL8": False}, _TENSOR_REDUCE),
        ([("bfloat16", 128, 3), ("float16", 128, 3)], {"ACT_PACKED": True}, _TENSOR_REDUCE_3D),
    ],
    ids=["bf16-d128", "more", "fa4like", "rowdq", "packed"],
)
def test_cute_backward_builds_for_sm90(tmp_path: Path, configs, switches, reduce):
    """Offline sm_90a build (no GPU needed): wgmma for the five GEMMs, TMA loads, dSᵀ by stmatrix,
    the dQ reduction the build asks for and, for fast_gelu, the hardware tanh."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    script = textwrap.dedent(_BUILD.format(configs=configs, switches=switches))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    ptx = [p.read_text() for p in tmp_path.glob("*.ptx")]
    assert len(ptx) >= 1
    for text in ptx:
        assert text.count("wgmma.mma_async") >= 5 * 4, "fewer wgmma than five GEMMs need"
        assert reduce in text
        assert "cp.async.bulk.tensor.2d.shared::cta.global" in text
    if any(act == 3 for _, _, act in configs):
        assert any("tanh.approx.f32" in t for t in ptx)
    if switches.get("ACT_PACKED"):  # bf16 fast_gelu packed; fp16 keeps the fp32 path
        assert sum("tanh.approx.bf16x2" in t for t in ptx) == 1, "one packed build of two"
    assert all("stmatrix.sync.aligned" in t for t in ptx)


def test_cute_step_loop_sass(cute_sass):
    """The query-step loop's SASS (offline sm_90a build, nvdisasm): every GEMM of the step inside it,
    no local memory (dSᵀ by stmatrix; one 4-byte store per value pair spilled 21 STL/LDL per step
    there), and dQ issued before dK after the dSᵀ barrier, so the dQ staging runs under dK."""
    (loop,) = cute_sass.step_loops(cute_sass.parse(cute_sass.build_sass({})))
    f = cute_sass.figures(loop)
    assert f["wgmma"] == 32 and f["tanh"] == 32, f
    assert f["local"] == 0, f
    assert re.search(r"G4 B G8 G4 W1", f["order"]), f["order"]


def test_cute_runtime_views_match_the_compiled_signature():
    """What the wrapper hands a compiled kernel (TVM-FFI checks each against its fake argument at
    the call): a (T, H*D) view of the same memory, detached (inside autograd's backward the saved
    inputs still require grad, and DLPack refuses to export those); one zero row for an empty tensor
    (a TMA descriptor needs a row); int32 offsets without a copy when they are int32 already."""
    import torch

    from ads_gdpa.cute import _sm90

    x = torch.zeros(300, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    r = _sm90.rows(x)
    assert r.shape == (300, 256) and r.data_ptr() == x.data_ptr() and not r.requires_grad
    assert _sm90.rows(torch.zeros(0, 4, 64, dtype=torch.float32)).shape == (1, 256)
    cu = torch.arange(5, dtype=torch.int32)
    assert _sm90.vec(cu) is cu
    assert _sm90.vec(torch.arange(5)).dtype == torch.int32


def test_cute_dkdv_store_sass(cute_sass):
    """The dK/dV epilogue (offline sm_90a build): 16 ``stmatrix`` into shared memory, 16 16-byte
    shared loads and 16 16-byte global stores per thread and tile, under one bound check per row
    chunk; no 4-byte or 2-byte global stores (a 2-byte store under its own branch per element cost
    about 1,500 instructions per warp and tile)."""
    ins = cute_sass.parse(cute_sass.build_sass({}))
    ops = [re.sub(r"^@!?U?P\w+\s+", "", i).split()[0] for _, i in ins]
    assert sorted({op for op in ops if op.startswith("STG")}) == ["STG.E.128"], ops
    assert ops.count("STG.E.128") == 16 and ops.count("LDS.128") == 16
    assert ops.count("STSM.16.M88.4") == 4 + 16  # dSᵀ in the step loop, then the epilogue's


def test_cute_dq_col8_staging_sass(cute_sass):
    """``DQ_COL8`` (offline sm_90a build): the sixteen 8-byte dQ staging stores of a step sit 256
    bytes apart for a row's neighbour eight rows down (the row-major box: 2,048), so the eight rows
    one store instruction covers are contiguous, and the step loop keeps the default's figures."""
    (loop,) = cute_sass.step_loops(cute_sass.parse(cute_sass.build_sass({"DQ_COL8": True})))
    offsets = [int(m.group(1), 16) for _, i in loop if (m := re.match(r"STS\.64 \[R\d+\+0x([0-9a-f]+)\]", i))]
    assert len(offsets) == 16, offsets
    assert offsets[1] - offsets[0] == 256 and offsets[2] - offsets[0] == 2048, offsets
    f = cute_sass.figures(loop)
    assert f["wgmma"] == 32 and f["local"] == 0, f


def test_cute_packed_act_sass(cute_sass):
    """``ACT_PACKED`` (offline sm_90a build, bf16 fast_gelu): the full tile's step loses about a sixth
    of its instructions (623 -> 527 when written), act and act' in bf16x2 (``HFMA2.BF16``), no fp32
    FFMA left in the loop, no local memory, the same GEMMs and waits in the same order."""
    (default,) = cute_sass.step_loops(cute_sass.parse(cute_sass.build_sass({})))
    (packed,) = cute_sass.step_loops(cute_sass.parse(cute_sass.build_sass({"ACT_PACKED": True})))
    f, g = cute_sass.figures(default), cute_sass.figures(packed)
    assert g["full_tile"] <= f["full_tile"] - 80, (f["full_tile"], g["full_tile"])
    ops = [re.sub(r"^@!?U?P\w+\s+", "", i).split()[0] for _, i in packed]
    assert ops.count("HFMA2.BF16_V2") >= 80 and "FFMA" not in ops, ops
    assert g["local"] == 0 and g["wgmma"] == f["wgmma"] and g["order"] == f["order"], (f, g)


def test_cute_col8_refuses_row_reductions(monkeypatch):
    """Column-block-major staging cannot feed the row-wise bulk reductions of ``DQ_MODE="bulk"``:
    refused when the kernel is built."""
    import torch

    from ads_gdpa.cute import _sm90, bwd_sm90

    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "DQ_COL8", True)
    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "DQ_MODE", "bulk")
    with pytest.raises(ValueError, match="DQ_COL8"):
        bwd_sm90.GdpaBwdSm90(_sm90.DTYPES[torch.bfloat16], 128, 3, bwd_sm90.use_dq_col8())


@pytest.mark.parametrize(
    "switch, mode, keys, expected",
    [(None, "tma", 257, True), (None, "tma", 256, False), (None, "tma", None, True),
     (None, "bulk", 2048, False), (False, "tma", 2048, False), (True, "tma", 16, True)],
)  # fmt: skip
def test_dq_staging_by_key_length(monkeypatch, switch, mode, keys, expected):
    """Column-block-major dQ staging for calls with more than 256 keys per sequence, row-major at
    256 or fewer (where it measured slower) and for row-wise bulk reductions; the switch overrides."""
    from ads_gdpa.cute import bwd_sm90

    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "DQ_COL8", switch)
    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "DQ_MODE", mode)
    assert bwd_sm90.use_dq_col8(keys) is expected


def test_compile_key_names_every_build_switch():
    """Every build switch of the kernel class (its upper-case attributes) is in the compile key, so a
    switch added later cannot hand back a kernel built with another value."""
    from ads_gdpa.cute import bwd_sm90

    switches = {name for name in vars(bwd_sm90.GdpaBwdSm90) if name.isupper()}
    assert switches == set(bwd_sm90._SWITCHES), switches ^ set(bwd_sm90._SWITCHES)


def test_compile_cache_keys_on_the_build_switches(monkeypatch):
    """A switch changed in the process builds anew instead of returning the kernel built before."""
    import torch

    from ads_gdpa.cute import bwd_sm90, kernel_cache

    builds = []
    monkeypatch.setenv("ADS_GDPA_CUTE_CACHE", "0")
    monkeypatch.setattr(kernel_cache, "_IN_MEMORY", {})
    monkeypatch.setattr(
        kernel_cache.cute, "compile", lambda kernel, *a, **kw: builds.append(type(kernel).DQ_MODE) or object()
    )
    first = bwd_sm90.compiled(torch.bfloat16, 128, 3)
    assert bwd_sm90.compiled(torch.bfloat16, 128, 3) is first
    monkeypatch.setattr(bwd_sm90.GdpaBwdSm90, "DQ_MODE", "bulk")
    assert bwd_sm90.compiled(torch.bfloat16, 128, 3) is not first
    assert builds == ["tma", "bulk"]
