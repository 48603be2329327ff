"""The Gluon FP8 forward's consumer warpgroups at D=128 (``fwd_sm90.FP8_WARPGROUPS``): three 64-row
warpgroups per work item (the default, serial step order) or bf16's two. What the launcher asks for
(any machine), that each build fits sm_90 with its wgmma groups intact (offline compiler), and on
the H200 the accuracy gate of tests/test_fp8.py (out cosine >= 0.995 against fp32 attention of the
dequantised inputs, K with outlier channels), dense and ragged varlen."""

from __future__ import annotations

import pytest
import torch
from test_fp8 import (
    E4M3,
    _dense_case,
    _gate,
    _on_h200,
    check_ragged_varlen,
)

from ads_kernel_tools.compile_check import ptx_counts_batch
from ads_kernel_tools.testing import randn
from lp_fa4 import offsets

VARIANTS = {
    "wg3": dict(FP8_WARPGROUPS=3),
    "wg2": dict(FP8_WARPGROUPS=2),
}


def _use(monkeypatch, name):
    from lp_fa4.gluon import fwd_sm90

    for key, value in VARIANTS[name].items():
        monkeypatch.setattr(fwd_sm90, key, value)


def _launch(monkeypatch, device, fp8, b=2, s=256, h=4, d=128):
    """fwd_sm90.fwd's launch with the kernel replaced by a recorder: (grid, keyword args)."""
    from lp_fa4.gluon import fwd_sm90

    rec = {}

    class Launch:  # the kernel's launch cache
        def launch(self, grid, a, kw, cached=None):
            rec.update(grid=grid, a=a, kw=kw)

    monkeypatch.setattr(fwd_sm90, "_FWD", Launch())
    dt = E4M3 if fp8 else torch.bfloat16
    q, k, v = (randn((b * s, h, d), dtype=torch.bfloat16, device=device, seed=i).to(dt) for i in range(3))
    cu = offsets.dense_offsets(b, s, device)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
    lse = torch.empty(b, h, s, device=device)
    descale = tuple(torch.ones(b, h, device=device) for _ in range(3)) if fp8 else None
    fwd_sm90.fwd(q, k, v, cu, cu, None, None, s, s, d**-0.5, False, out, lse, True, descale=descale)
    return rec["a"], rec["kw"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_launch_asks_for_the_variant(monkeypatch, device, name):
    """FP8 at D=128 takes the variant's tile and flags; bf16 (which shares the kernel) does not."""
    _use(monkeypatch, name)
    cfg = VARIANTS[name]
    nwg = cfg.get("FP8_WARPGROUPS", 2)
    a, kw = _launch(monkeypatch, device, fp8=True)
    assert kw["BM"] == 64 * nwg and kw["SERIAL"] == (nwg == 3)
    assert kw["CONSUMER_REGS"] == (160 if nwg == 3 else 232)
    assert a[0].block_shape == [64 if nwg == 3 else 128, 128]  # Q boxes: one per warpgroup at 192 rows
    assert a[16] == -(-256 // kw["BM"])  # M_TILES
    _, kw16 = _launch(monkeypatch, device, fp8=False)
    assert (kw16["BM"], kw16["SERIAL"]) == (128, False)
    assert kw16["CONSUMER_REGS"] == 232


def test_bad_warpgroups(device):
    from lp_fa4.gluon import fwd_sm90

    q = torch.zeros(64, 2, 128, device=device).to(E4M3)
    one = torch.ones(1, 2, device=device)
    cu = offsets.dense_offsets(1, 64, device)
    with pytest.raises(ValueError, match="warpgroups"):
        fwd_sm90.fwd(q, q, q, cu, cu, None, None, 64, 64, 0.1, False, q.to(torch.bfloat16),
                     torch.empty(1, 2, 64, device=device), True, descale=(one, one, one),
                     warpgroups=4)  # fmt: skip


# --- the sm_90 builds (Triton's offline compiler, any machine) ------------------------------------

SMEM_LIMIT = 232448
# SASS of the whole kernel: the fp8 wgmma instructions and those that close a commit group. When
# ptxas cannot keep an accumulator untouched while its wgmma is in flight it serialises them all
# (each QGMMA then closes its own group); spills are counted over the whole kernel.
SASS = {
    "qgmma": [r"^\.text\.attn_fwd_ws:", r"(?!)", r"\bQGMMA\."],
    "qgmma_gsb0": [r"^\.text\.attn_fwd_ws:", r"(?!)", r"\bQGMMA\..*\bgsb0\b"],
    "spills": [r"^\.text\.attn_fwd_ws:", r"(?!)", r"\b(STL|LDL)\b"],
}


def _job(nwg: int, causal: bool = False, relabel: bool = False) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from lp_fa4.gluon import fwd_sm90 as g

    heads, d, bm = 4, 128, 64 * nwg

    def desc(rows, cols, t, gdt, width):
        host = torch.empty(256, width, dtype=t)
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gdt)
        return mangle_type(TensorDescriptor(host, [256, width], [width, 1], [rows, cols], layout))

    f8 = (E4M3, gl.float8e4nv, heads * d)
    types = {"q_desc": desc(bm if nwg == 2 else 64, d, *f8), "k_desc": desc(g.BLOCK_N, d, *f8),
             "v_desc": desc(d, g.BLOCK_N, E4M3, gl.float8e4nv, 256),
             "o_desc": desc(64, d, torch.bfloat16, gl.bfloat16, heads * d), "out_ptr": "*bf16",
             "lse_ptr": "*fp32", "qk_scale2": "fp32", **{n: "*fp32" for n in ("qd_ptr", "kd_ptr", "vd_ptr")},
             **{n: "*i32" for n in ("tiles_ptr", "count_ptr", "cu_q_ptr", "cu_k_ptr", "used_q_ptr",
                                    "used_k_ptr", "vcol_ptr")}}  # fmt: skip
    stages, qbuf = g.stages_for(d, True, nwg)
    consts = dict(D=d, BM=bm, BN=g.BLOCK_N, STAGES=stages, QBUF=qbuf, CAUSAL=causal, HAS_USED_Q=False,
                  HAS_USED_K=False, LSE_PER_SEQ=True, CONSUMER_REGS=g._regs(nwg), PRODUCER_REGS=24,
                  LPT=not causal, RELABEL=relabel, SERIAL=nwg == 3)  # fmt: skip
    return dict(module=g.__name__, kernel="attn_fwd_ws", types=types, constexprs=consts, gluon=True,
                sass_between=SASS)  # fmt: skip


BUILDS = {
    "wg3": dict(nwg=3),
    "wg3-causal-relabel": dict(nwg=3, causal=True, relabel=True),
}


@pytest.fixture(scope="module")
def builds():
    return dict(zip(BUILDS, ptx_counts_batch([_job(**kw) for kw in BUILDS.values()])))


@pytest.mark.parametrize("name", list(BUILDS))
def test_variant_builds_for_sm90(name, builds):
    """wgmma and TMA, no PTX-level spills, shared memory inside 227 KB (three warpgroups: 4 K/V
    stages, 2 x 3 Q boxes and 3 output tiles), every GEMM one commit group (4 QGMMA each). ptxas
    spills of the three-warpgroup builds (160 registers) stay in the per-item prologue and epilogue
    (offline, triton 3.6: none in the key loop)."""
    c = builds[name]
    assert "error" not in c, c.get("error")
    assert c["wgmma"] > 0 and c["tma"] > 0 and c["local_memory"] == 0, c
    assert 0 < c["shared_bytes"] <= SMEM_LIMIT, c["shared_bytes"]
    (qgmma,), (groups,), (spills,) = c["qgmma"], c["qgmma_gsb0"], c["spills"]
    assert qgmma >= 24 and 3 * groups < qgmma, f"{name}: {groups} of {qgmma} QGMMA close a group"
    assert spills <= 100, f"{name}: {spills} spill instructions"


# --- GPU: the accuracy gate for each variant ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_variant_dense(monkeypatch, name, causal):
    if not _on_h200():
        pytest.skip("needs an sm_90 GPU")
    _use(monkeypatch, name)
    out, lse, ref, ref_lse = _dense_case("cuda", 2, 2048, 8, 2, 128, causal, True, seed=3)
    _gate(out, ref, f"{name} D128 S2048 causal={causal} outliers")
    torch.testing.assert_close(lse, ref_lse.float(), atol=2e-2, rtol=1e-2)
    # a length that leaves part of the last 128- or 192-row tile empty
    out, lse, ref, ref_lse = _dense_case("cuda", 1, 1000, 4, 4, 128, causal, False, seed=4)
    _gate(out, ref, f"{name} D128 S1000 causal={causal}")
    torch.testing.assert_close(lse, ref_lse.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("v_copy", ["aligned", "relabel"])
def test_gpu_variant_varlen_ragged(monkeypatch, name, v_copy):
    if not _on_h200():
        pytest.skip("needs an sm_90 GPU")
    from lp_fa4.gluon import fwd_sm90

    _use(monkeypatch, name)
    monkeypatch.setattr(fwd_sm90, "FP8_V_COPY", v_copy)
    # 191-193: the three-warpgroup items' 192-row edge
    check_ragged_varlen([0, 1, 17, 127, 128, 129, 191, 192, 193, 1000, 300], f"{name} varlen v_copy={v_copy}")
