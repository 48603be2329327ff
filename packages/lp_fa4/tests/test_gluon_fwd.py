"""The Gluon Hopper forward (lp_fa4.gluon): which calls it takes (the dispatch predicate, on any
machine), that it compiles for sm_90 with wgmma, TMA and no spills (on a CPU, offline compiler), and
on an H200 that it matches the fp32 tools reference under the baseline-relative rule: ragged lengths
0, 1, tile-1, tile+1, long; causal (bottom-right, also Lq > Lk); local windows (bottom-right) and
jagged_attention's top-left windows; GQA; D 64/128; bf16/fp16; LSE in both layouts; seqused_q/k;
poisoned outputs."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import WINDOWED, Case, compare_lse, count_calls, jagged_case, run_case

from ads_kernel_tools.compile_check import ptx_counts_batch
from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from lp_fa4 import flash_attn_varlen_func
from lp_fa4.gluon import dispatch
from lp_fa4.triton.launch import BIG, Problem

SMEM_LIMIT = 232448  # 227 KB, the most one sm_90 block may ask for


def _pb(**kw) -> Problem:
    base = dict(max_q=64, max_k=64, scale=0.125, softcap=0.0, win_left=BIG, win_right=BIG, top_left=False,
                broadcast_q=False, rows_cap=BIG)  # fmt: skip
    return Problem(**(base | kw))


def _tensors(device, d=128, dv=None, dtype=torch.bfloat16, heads=4, kv_heads=2):
    q = torch.zeros(64, heads, d, dtype=dtype, device=device)
    k = torch.zeros(64, kv_heads, d, dtype=dtype, device=device)
    v = torch.zeros(64, kv_heads, dv or d, dtype=dtype, device=device)
    return q, k, v, torch.empty(64, heads, dv or d, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(pb=dict(softcap=5.0)), "softcap"),
        (dict(pb=dict(broadcast_q=True)), "jagged broadcast_q"),
        (dict(pb=dict(rows_cap=32)), "row cap"),
        (dict(pb=dict(win_left=16), t=dict(dtype=torch.float8_e4m3fn)), "FP8 with a window"),
        (dict(pb=dict(scale=-1.0)), "softmax_scale"),
        (dict(page_table=True), "paged"),
        (dict(sink=True, t=dict(dtype=torch.float8_e4m3fn)), "FP8 with a learnable sink"),
        (dict(out16=True), "out torch.float16 for"),  # out in another dtype than the kernel writes
        (dict(t=dict(d=96)), "head dims"),
        (dict(t=dict(d=256)), "head dims"),
        (dict(t=dict(d=128, dv=64)), "head dims"),
        (dict(t=dict(dtype=torch.float32)), "dtype"),
        (dict(strided=True), "strided"),
    ],
    ids=lambda x: str(x),
)
def test_predicate_sends_the_rest_to_triton(change, reason, device):
    """Every option outside the Gluon kernel's scope falls back to Triton, on any machine."""
    q, k, v, out = _tensors(device, **change.get("t", {}))
    if change.get("strided"):
        q = torch.zeros(64, 8, 128, dtype=q.dtype, device=device)[:, ::2]
    pt = torch.zeros(1, 1, dtype=torch.int32, device=device) if change.get("page_table") else None
    sink = torch.zeros(4, dtype=torch.bfloat16, device=device) if change.get("sink") else None
    if change.get("out16"):
        out = torch.empty(out.shape, dtype=torch.float16, device=device)
    got = dispatch.why_not(q, k, v, pt, sink, _pb(**change.get("pb", {})), out)
    assert got is not None and reason in got, got


def _projection_slices(device, dtype=torch.bfloat16, heads=4, kv_heads=2, d=128, row_pad=0):
    """q, k, v split off the heads of one (64, H + 2·Hkv, D) projection (``row_pad`` more elements
    per row); out (64, H, D)."""
    width = (heads + 2 * kv_heads) * d
    qkv = torch.zeros(64, width + row_pad, dtype=dtype, device=device)[:, :width].view(64, -1, d)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    return q, k, v, torch.empty(64, heads, d, dtype=dtype, device=device)


def test_predicate_takes_slices_of_a_packed_projection(device):
    """Row-strided q, k, v (each row's heads·D contiguous, rows 16-byte multiples apart) reach the
    device check, as contiguous ones do; rows an odd 8 bytes apart, or heads not packed, do not."""
    q, k, v, out = _projection_slices(device)
    assert not q.is_contiguous() and q.stride(0) == 8 * 128
    assert dispatch.why_not(q, k, v, None, None, _pb(), out) == dispatch.why_not(
        q.contiguous(), k.contiguous(), v.contiguous(), None, None, _pb(), out
    )
    assert dispatch.why_not(q, k, v, None, None, _pb(), out) in (None, "interpreter", "not an sm_90 GPU")
    q, k, v, out = _projection_slices(device, row_pad=4)  # rows 2056 bytes apart
    assert dispatch.why_not(q, k, v, None, None, _pb(), out) == "strided or unaligned tensors"
    q, k, v, out = _projection_slices(device)
    assert dispatch.why_not(q[:, ::2], k, v, None, None, _pb(), out[:, ::2]) == "strided or unaligned tensors"


@pytest.mark.parametrize("mask", ["none", "causal", "jagged", "local", "left", "jagged-window"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16), (128, torch.float8_e4m3fn)])
def test_predicate_takes_supported_calls_on_sm90_only(mask, d, dtype, device, monkeypatch):
    """A supported call goes to Gluon exactly on an sm_90 GPU outside the interpreter (jagged calls
    and windows of either alignment included); LP_FA4_BACKEND=triton always keeps Triton."""
    if dtype == torch.float8_e4m3fn and mask in ("local", "left", "jagged-window"):
        pytest.skip("FP8 takes no window (the predicate's rejection is tested above)")
    q, k, v, out = _tensors(device, d=d, dtype=dtype)
    if dtype == torch.float8_e4m3fn:
        out = torch.empty(out.shape, dtype=torch.bfloat16, device=device)
    left, right = {"causal": (BIG, 0), "local": (16, 16), "left": (16, BIG), "jagged-window": (8, 8)}.get(
        mask, (BIG, BIG)
    )
    pb = _pb(win_left=left, win_right=right, top_left=mask.startswith("jagged"))
    got = dispatch.why_not(q, k, v, None, None, pb, out)
    on_h = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    if on_h and not dispatch.cfg.interpreter_active():
        assert got is None
    else:
        assert got in ("interpreter", "not an sm_90 GPU"), got
    if dtype != torch.float8_e4m3fn:  # a learnable sink
        sink = torch.zeros(q.shape[1], dtype=torch.float32, device=device)
        assert dispatch.why_not(q, k, v, None, sink, pb, out) == got
    monkeypatch.setenv("LP_FA4_BACKEND", "triton")
    assert dispatch.why_not(q, k, v, None, None, pb, out) == "LP_FA4_BACKEND=triton"
    monkeypatch.setenv("LP_FA4_BACKEND", "cuda")
    with pytest.raises(ValueError, match="LP_FA4_BACKEND"):
        dispatch.why_not(q, k, v, None, None, pb, out)


# ---------------------------------------------------------------------------------------------
# sm_90 build, checked on any machine (Triton's offline compiler)
# ---------------------------------------------------------------------------------------------


def _job(
    d: int,
    causal: bool = False,
    used: bool = False,
    dense: bool = False,
    fp16: bool = False,
    lpt: bool = False,
    window: bool = False,
    top_left: bool = False,
    sink: bool = False,
    out32: bool = False,
) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from lp_fa4.gluon import fwd_sm90 as g

    heads = 4
    t, gdt, name = (torch.float16, gl.float16, "fp16") if fp16 else (torch.bfloat16, gl.bfloat16, "bf16")

    def desc(rows):
        host = torch.empty(256, heads * d, dtype=t)
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
        return mangle_type(TensorDescriptor(host, [256, heads * d], [heads * d, 1], [rows, d], layout))

    types = {"q_desc": desc(g.BLOCK_M), "k_desc": desc(g.BLOCK_N), "v_desc": desc(g.BLOCK_N),
             "o_desc": desc(g.BLOCK_M // 2), "out_ptr": f"*{name}", "lse_ptr": "*fp32", "qk_scale2": "fp32",
             **{n: "*i32" for n in ("tiles_ptr", "count_ptr", "cu_q_ptr", "cu_k_ptr", "used_q_ptr",
                                    "used_k_ptr")}}  # fmt: skip
    types["sink_ptr"] = f"*{name}" if sink else "*i32"  # not read without a sink
    types["out32_ptr"] = "*fp32"
    stages, qbuf = g.stages_for(d)
    consts = dict(D=d, BM=g.BLOCK_M, BN=g.BLOCK_N, STAGES=stages, QBUF=qbuf, CAUSAL=causal, HAS_USED_Q=used,
                  HAS_USED_K=used, LSE_PER_SEQ=dense, CONSUMER_REGS=232, PRODUCER_REGS=24,
                  LPT=lpt, WINDOW=window, TOP_LEFT=top_left, HAS_SINK=sink, OUT32=out32)  # fmt: skip
    return dict(module=g.__name__, kernel="attn_fwd_ws", types=types, constexprs=consts, gluon=True)


JOBS = {
    "d128": dict(d=128),
    "d128-causal": dict(d=128, causal=True),
    "d64": dict(d=64),
    "d64-causal-seqused-dense-fp16": dict(d=64, causal=True, used=True, dense=True, fp16=True),
    "d128-seqused-fp16": dict(d=128, used=True, fp16=True),
    "d128-causal-dense-lpt": dict(d=128, causal=True, dense=True, lpt=True),
    "d128-dense-lpt": dict(d=128, dense=True, lpt=True),  # dense non-causal: the list's order, no list
    "d128-window": dict(d=128, window=True),
    "d64-window-top-left-seqused-fp16": dict(d=64, window=True, top_left=True, used=True, fp16=True),
    # a learnable sink, with the fp32 copy of out the op asks for when the sink needs its gradient
    "d128-sink-out32": dict(d=128, sink=True, out32=True),
    "d64-causal-sink-fp16": dict(d=64, causal=True, sink=True, fp16=True),
}


@pytest.fixture(scope="module")
def counts():
    return dict(zip(JOBS, ptx_counts_batch([_job(**kw) for kw in JOBS.values()])))


@pytest.mark.parametrize("name", list(JOBS))
def test_compiles_for_sm90(name, counts):
    c = counts[name]
    assert "error" not in c, c.get("error")
    assert c["wgmma"] > 0 and c["tma"] > 0, c
    assert c["local_memory"] == 0, f"{name}: {c['local_memory']} local-memory accesses (spills)"
    assert 0 < c["shared_bytes"] <= SMEM_LIMIT, c["shared_bytes"]


# ---------------------------------------------------------------------------------------------
# GPU: against the fp32 reference, through the public API, asserting that Gluon ran
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gluon_calls(monkeypatch):
    """Counts the calls that reach the Gluon launcher."""
    from lp_fa4.gluon import fwd_sm90

    return count_calls(monkeypatch, fwd_sm90, "fwd")


T = 128  # the kernel's tile (rows and keys)
VARLEN = [
    Case(lq=(0, 1, T - 1, T, T + 1, 1000), lk=(5, 1, T - 1, T + 1, T, 1000), heads=4, kv_heads=4, d=128),
    Case(lq=(1, T + 1, 0, 777), lk=(T + 1, 0, 9, 2049), heads=8, kv_heads=2, d=128, causal=True),
    Case(lq=(300, 5, 2 * T + 1), lk=(17, 300, 2 * T - 1), heads=4, kv_heads=1, d=64, causal=True),
    Case(lq=(T - 1, 2049, 3), heads=6, kv_heads=3, d=64, dtype=torch.float16),
    Case(lq=(1500, T + 1), lk=(1000, T + 2), heads=4, kv_heads=2, d=128, causal=True, dtype=torch.float16),
    Case(lq=(513, 64), heads=2, kv_heads=2, d=128, causal=True, scale=0.3),
]
DENSE = [
    Case(lq=(1024,) * 2, lk=(1024,) * 2, heads=4, kv_heads=4, d=128, dense=True),
    Case(lq=(333,) * 3, lk=(1000,) * 3, heads=4, kv_heads=2, d=64, dense=True, causal=True),
    Case(lq=(2048,) * 2, lk=(2048,) * 2, heads=8, kv_heads=8, d=128, dense=True, causal=True),
]


# q, k, v as slices of one packed projection: ragged self attention, GQA, causal dense, fp16 D=64
PACKED = [
    Case(lq=(0, 1, T - 1, T + 1, 1000), heads=4, kv_heads=2, d=128, packed=True),
    Case(lq=(1024,) * 2, heads=4, kv_heads=4, d=128, dense=True, causal=True, packed=True),
    Case(lq=(T + 1, 300), heads=2, kv_heads=1, d=64, causal=True, dtype=torch.float16, packed=True),
]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", VARLEN + DENSE + WINDOWED + PACKED, ids=lambda c: c.id)
def test_forward_matches_reference(case, device, gluon_calls):
    run_case(Case(**{**case.__dict__, "grad": False}), device)
    assert gluon_calls, "the Gluon forward did not run"


# a learnable sink in the epilogue: ragged lengths (empty kv sequences: 0 and LSE = the sink's
# logit), causal with Lq > Lk, GQA, D 64/128, fp16, dense; with its gradient the forward writes fp32
SINK = [
    Case(lq=(0, 1, T - 1, T + 1, 1000), lk=(5, 0, T - 1, T, 1000), heads=4, kv_heads=2, d=128, sink=True),
    Case(lq=(1, T + 1, 300), lk=(T + 1, 0, 129), heads=4, kv_heads=1, d=64, causal=True, sink=True,
         dtype=torch.float16),
    Case(lq=(1024,) * 2, lk=(1024,) * 2, heads=4, kv_heads=4, d=128, dense=True, causal=True, sink=True),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", SINK, ids=lambda c: c.id)
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_sink_through_gluon(case, grad, device, gluon_calls):
    """Outputs, LSE and (with ``grad``: the fp32 copy of out kept for the backward) every gradient,
    the sink's included, against the reference under the rule, with the Gluon forward running."""
    run_case(Case(**{**case.__dict__, "grad": grad}), device)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", [VARLEN[1], DENSE[1], WINDOWED[0]], ids=lambda c: c.id)
def test_backward_from_gluon_forward(case, device, gluon_calls):
    """The (Triton) backward fed by this forward's output and LSE, dLSE included."""
    run_case(case, device)
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
def test_seqused_and_poisoned_outputs(causal, device):
    """seqused_q/k, and every row of each slot written (out and lse prefilled with NaN): rows past
    seqused_q 0 / -inf, rows without keys 0 / -inf, the rest the reference."""
    from lp_fa4.gluon import fwd_sm90

    lq, lk, uq, uk = (200, 5, 130, 0), (300, 140, 0, 7), [131, 5, 129, 0], [300, 3, 0, 7]
    h, hkv, d = 4, 2, 128
    q = randn((sum(lq), h, d), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((sum(lk), hkv, d), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((sum(lk), hkv, d), dtype=torch.bfloat16, device=device, seed=3)
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)
    used_q = torch.tensor(uq, dtype=torch.int32, device=device)
    used_k = torch.tensor(uk, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((h, sum(lq)), float("nan"), device=device)
    fwd_sm90.fwd(q, k, v, cu_q, cu_k, used_q, used_k, max(lq), max(lk), d**-0.5, causal, out, lse, False)
    assert not out.isnan().any() and not lse.isnan().any()
    hq, hk = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lq)):
        a, c = uq[b], uk[b]
        rows = slice(hq[b], hq[b] + a)
        qs, ks, vs = q[rows], k[hk[b] : hk[b] + c], v[hk[b] : hk[b] + c]
        if a:
            ref, rlse = softmax_attention_varlen_ref(qs.float(), ks.float(), vs.float(), [0, a], [0, c],
                                                     causal=causal)  # fmt: skip
            base, _ = softmax_attention_varlen_ref(
                qs, ks, vs, [0, a], [0, c], causal=causal, dtype=torch.bfloat16
            )
            assert_close_vs_baseline(out[rows], ref, base, name=f"out[{b}]")
            compare_lse(lse[:, rows], rlse, f"lse[{b}]")
        dead = slice(hq[b] + a, hq[b + 1])
        assert (out[dead] == 0).all() and torch.isneginf(lse[:, dead]).all()


@pytest.mark.gpu
@pytest.mark.sm90
def test_long_jagged_batch_and_backend_switch(device, monkeypatch):
    """A benchmark-like jagged batch (many sequences, persistent schedule) agrees with the
    reference, and LP_FA4_BACKEND=triton gives the same answer within the same rule."""
    torch.manual_seed(0)
    lens = torch.randint(1, 1025, (96,)).tolist()
    h, d = 4, 128
    q = randn((sum(lens), h, d), dtype=torch.bfloat16, device=device, seed=4)
    k = randn((sum(lens), h, d), dtype=torch.bfloat16, device=device, seed=5)
    v = randn((sum(lens), h, d), dtype=torch.bfloat16, device=device, seed=6)
    cu = lengths_to_offsets(lens, device=device)
    out, lse = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    ref, rlse = softmax_attention_varlen_ref(q.float(), k.float(), v.float(), cu, cu, causal=True)
    base, _ = softmax_attention_varlen_ref(q, k, v, cu, cu, causal=True, dtype=torch.bfloat16)
    assert_close_vs_baseline(out, ref, base, name="out")
    compare_lse(lse, rlse, "lse")
    monkeypatch.setenv("LP_FA4_BACKEND", "triton")
    out_t, lse_t = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    assert_close_vs_baseline(out_t, ref, base, name="out[triton]")
    compare_lse(lse_t, rlse, "lse[triton]")


@pytest.mark.gpu
@pytest.mark.sm90
def test_jagged_attention_through_gluon(device, monkeypatch):
    """jagged_attention without a window runs the Gluon kernel: cross attention (Lq != Lk), an empty
    kv sequence (0 / -inf), query rows past max_seqlen_q zeros, GQA; against the reference and the
    Triton path under the same rule."""
    from lp_fa4 import jagged_attention

    lq, lk, max_q = [130, 0, 7, 300, 64], [200, 5, 0, 129, 1], 256
    h, hkv, d = 4, 2, 128
    q = randn((sum(lq), h, d), dtype=torch.bfloat16, device=device, seed=21)
    k = randn((sum(lk), hkv, d), dtype=torch.bfloat16, device=device, seed=22)
    v = randn((sum(lk), hkv, d), dtype=torch.bfloat16, device=device, seed=23)
    cu_q, cu_k = lengths_to_offsets(lq, device=device), lengths_to_offsets(lk, device=device)
    pb = Problem(max_q, max(lk), d**-0.5, 0.0, BIG, BIG, True, False, max_q)
    assert dispatch.why_not(q, k, v, None, None, pb, q) is None
    capped = [min(n, max_q) for n in lq]
    hq = lengths_to_offsets(lq).tolist()
    keep = torch.cat([torch.arange(hq[b], hq[b] + capped[b]) for b in range(len(lq))]).to(device)
    cu_c = lengths_to_offsets(capped, device=device)
    ref, rlse = softmax_attention_varlen_ref(q[keep].float(), k.float(), v.float(), cu_c, cu_k)
    base, _ = softmax_attention_varlen_ref(q[keep], k, v, cu_c, cu_k, dtype=torch.bfloat16)
    for backend in ("auto", "triton"):
        monkeypatch.setenv("LP_FA4_BACKEND", backend)
        out, lse = jagged_attention(q, k, v, cu_q, cu_k, max_q, max(lk))
        assert_close_vs_baseline(out[keep], ref, base, name=f"out[{backend}]")
        compare_lse(lse[:, keep], rlse, f"lse[{backend}]")
        dead = torch.ones(q.shape[0], dtype=torch.bool, device=device)
        dead[keep] = False
        assert (out[dead] == 0).all() and torch.isneginf(lse[:, dead]).all()


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("causal", [True, False])
def test_dense_lpt_order_gives_the_same_bits(causal, device):
    """The dense head-grouped heaviest-first walk (``lpt``) and the tile list compute every tile
    the same way: identical outputs and LSE, bit for bit (5 (b, h) pairs per L2 group: 12 = 5 + 5 + 2)."""
    from lp_fa4.gluon import fwd_sm90

    b, s, h, hkv, d = 3, 700, 4, 2, 128
    q = randn((b * s, h, d), dtype=torch.bfloat16, device=device, seed=7)
    k = randn((b * s, hkv, d), dtype=torch.bfloat16, device=device, seed=8)
    v = randn((b * s, hkv, d), dtype=torch.bfloat16, device=device, seed=9)
    cu = lengths_to_offsets([s] * b, device=device)
    res = []
    for lpt in (False, True):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, s), float("nan"), device=device)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fwd_sm90, "L2_GROUP_BYTES", 5 * 2 * s * d * 2 * hkv // h)
            fwd_sm90.fwd(q, k, v, cu, cu, None, None, s, s, d**-0.5, causal, out, lse, True, lpt=lpt)
        res.append((out, lse))
    assert not res[1][0].isnan().any() and not res[1][1].isnan().any()
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("window", [0, 5, 32, 256])
def test_jagged_top_left_windows_through_gluon(window, device, gluon_calls):
    """jagged_attention's symmetric top-left band |i - j| <= W runs the Gluon forward: cross attention
    with Lq != Lk (bands past a short kv sequence), an empty kv sequence, rows past max_seqlen_q
    zeros, GQA; forward and the gradients the backward computes from its output and LSE."""
    T = 128
    jagged_case((T + 1, 0, 7, 700, 300), (2 * T + 3, 5, 0, 40, 300), max_q=512, window=window, heads=4,
                kv_heads=2, d=128, device=device)  # fmt: skip
    assert gluon_calls, "the Gluon forward did not run"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_calls_reach_the_gluon_forward(causal, device, gluon_calls):
    """float8_e4m3fn q, k, v with descales through flash_attn_func take the Gluon kernel, causal
    included (a window check once sent causal FP8 to Triton); accuracy is tests/test_fp8.py's."""
    from lp_fa4 import flash_attn_func
    from lp_fa4.bench import dequantise_fp8, quantise_fp8

    q, k, v = (randn((2, 300, 4, 128), dtype=torch.bfloat16, device=device, seed=40 + i) for i in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (quantise_fp8(t, 4) for t in (q, k, v))
    out = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)[0]
    assert gluon_calls, "the FP8 call did not reach the Gluon forward"
    deq = [dequantise_fp8(t, s) for t, s in ((q8, qd), (k8, kd), (v8, vd))]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = sdpa(*(t.transpose(1, 2) for t in deq), is_causal=causal)
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.transpose(1, 2).flatten(), dim=0)
    assert cos > 0.999, float(cos)
