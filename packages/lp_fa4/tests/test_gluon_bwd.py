"""The Gluon Hopper backward (lp_fa4.gluon.bwd_sm90): which calls it takes (the dispatch predicate,
on any machine) and, on an H200, that its gradients match the fp32 tools reference under the
baseline-relative rule: ragged lengths 0, 1, 127, 128, 129, 1000, 2049; causal (bottom-right, Lq > Lk
and Lq < Lk); GQA 4:1 and MQA; D 64/128; fp16/bf16; a loss on the LSE (dLSE); a learnable sink;
seqused_q/k; jagged attention with a row cap; gradient buffers drawn from NaN-poisoned memory. Each
GPU test asserts that the Gluon kernel ran. Its sm_90 build (wgmma, TMA, no spills, shared memory)
is checked in test_compile_sm90.py."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import WINDOWED, Case, count_calls, jagged_case, run_case

from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from lp_fa4 import flash_attn_varlen_func
from lp_fa4.gluon import bwd_dispatch
from lp_fa4.triton.launch import BIG, Problem


def _pb(**kw) -> Problem:
    base = dict(max_q=64, max_k=64, scale=0.125, softcap=0.0, win_left=BIG, win_right=BIG, top_left=False,
                broadcast_q=False, rows_cap=BIG)  # fmt: skip
    return Problem(**(base | kw))


def _tensors(device, d=128, dv=None, dtype=torch.bfloat16, heads=4, kv_heads=2):
    q = torch.zeros(64, heads, d, dtype=dtype, device=device)
    k = torch.zeros(64, kv_heads, d, dtype=dtype, device=device)
    v = torch.zeros(64, kv_heads, dv or d, dtype=dtype, device=device)
    return torch.zeros_like(q), q, k, v


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(deterministic=True), "deterministic"),
        (dict(pb=dict(softcap=5.0)), "softcap"),
        (dict(pb=dict(broadcast_q=True)), "jagged broadcast_q"),
        (dict(pb=dict(scale=-1.0)), "softmax_scale"),
        (dict(t=dict(d=96)), "head dims"),
        (dict(t=dict(d=256)), "head dims"),
        (dict(t=dict(d=128, dv=64)), "head dims"),
        (dict(t=dict(dtype=torch.float32)), "dtype"),
        (dict(strided=True), "strided"),
        (dict(do_strided=True), "strided"),
    ],
    ids=lambda x: str(x),
)
def test_predicate_sends_the_rest_to_triton(change, reason, device):
    """Every option outside the Gluon backward's scope falls back to Triton, on any machine."""
    do, q, k, v = _tensors(device, **change.get("t", {}))
    if change.get("strided"):
        q = torch.zeros(64, 8, 128, dtype=q.dtype, device=device)[:, ::2]
    if change.get("do_strided"):
        do = torch.zeros(64, 8, 128, dtype=q.dtype, device=device)[:, ::2]
    got = bwd_dispatch.why_not(do, q, k, v, _pb(**change.get("pb", {})), change.get("deterministic", False))
    assert got is not None and reason in got, got


@pytest.mark.parametrize(
    "pb",
    [dict(win_left=16), dict(win_left=16, win_right=0), dict(top_left=True, win_left=16, win_right=16),
     dict(top_left=True, win_left=BIG, win_right=0)],
    ids=str,
)  # fmt: skip
def test_predicate_takes_windows_unless_opted_out(pb, device, monkeypatch):
    """Local and top-left windows pass the score checks by default (and go to Gluon on an sm_90 GPU);
    LP_FA4_BWD_WINDOWS=0 keeps them on the Triton backward."""
    do, q, k, v = _tensors(device)
    monkeypatch.setenv("LP_FA4_BWD_WINDOWS", "0")
    assert "window" in bwd_dispatch.why_not(do, q, k, v, _pb(**pb), False)
    monkeypatch.delenv("LP_FA4_BWD_WINDOWS")
    got = bwd_dispatch.why_not(do, q, k, v, _pb(**pb), False)
    on_h = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    assert got is None if on_h and not bwd_dispatch.cfg.interpreter_active() else got in (
        "interpreter", "not an sm_90 GPU"), got  # fmt: skip


def test_predicate_takes_slices_of_a_packed_projection(device):
    """Row-strided q, k, v, dO (each row's heads·D contiguous) are judged as contiguous ones."""
    do, q, k, v = _tensors(device)
    width = (4 + 2 * 2) * 128
    qkv = torch.zeros(64, width, dtype=q.dtype, device=device).view(64, -1, 128)
    sq, sk, sv = qkv.split([4, 2, 2], dim=1)
    do_rows = torch.zeros(64, 2, 4, 128, dtype=q.dtype, device=device)[:, 0]
    got = bwd_dispatch.why_not(do_rows, sq, sk, sv, _pb(), False)
    assert got == bwd_dispatch.why_not(do, q, k, v, _pb(), False), got
    assert got in (None, "interpreter", "not an sm_90 GPU"), got


@pytest.mark.parametrize("mask", ["none", "causal", "jagged-capped"])
@pytest.mark.parametrize("d,dtype,kv_heads", [(64, torch.float16, 1), (128, torch.bfloat16, 4)])
def test_predicate_takes_supported_calls_on_sm90_only(mask, d, dtype, kv_heads, device, monkeypatch):
    """A supported call (MHA/GQA/MQA, causal, a jagged call with a row cap) goes to Gluon exactly on an
    sm_90 GPU outside the interpreter; LP_FA4_BACKEND=triton always keeps Triton."""
    do, q, k, v = _tensors(device, d=d, dtype=dtype, kv_heads=kv_heads)
    pb = _pb(win_right=0 if mask == "causal" else BIG, top_left=mask == "jagged-capped",
             rows_cap=32 if mask == "jagged-capped" else BIG)  # fmt: skip
    got = bwd_dispatch.why_not(do, q, k, v, pb, False)
    on_h = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    if on_h and not bwd_dispatch.cfg.interpreter_active():
        assert got is None
    else:
        assert got in ("interpreter", "not an sm_90 GPU"), got
    monkeypatch.setenv("LP_FA4_BACKEND", "triton")
    assert bwd_dispatch.why_not(do, q, k, v, pb, False) == "LP_FA4_BACKEND=triton"


# ---------------------------------------------------------------------------------------------
# GPU: against the fp32 reference, through the public API, asserting that Gluon ran
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gluon_bwd_calls(monkeypatch):
    """Counts the calls that reach the Gluon backward's launcher."""
    from lp_fa4.gluon import bwd_sm90

    return count_calls(monkeypatch, bwd_sm90, "bwd")


T = 128  # the kernel's kv tile (64-row query steps)
VARLEN = [
    Case(
        lq=(0, 1, T - 1, T, T + 1, 1000, 2049),
        lk=(5, 1, T - 1, T + 1, T, 1000, 2049),
        heads=4,
        kv_heads=4,
        d=128,
    ),  # fmt: skip
    Case(lq=(1, T + 1, 0, 777, 2049), lk=(T + 1, 0, 9, 300, 1000), heads=8, kv_heads=2, d=128, causal=True),
    Case(
        lq=(5, T - 1, 1000), lk=(300, 1000, 2049), heads=4, kv_heads=1, d=64, causal=True, dtype=torch.float16
    ),  # fmt: skip
    Case(lq=(T - 1, 2049, 3), heads=6, kv_heads=3, d=64, dtype=torch.float16),
    Case(lq=(1500, T + 1), lk=(1000, T + 2), heads=4, kv_heads=2, d=128, causal=True, dtype=torch.float16),
    Case(lq=(513, 64), heads=2, kv_heads=2, d=128, causal=True, scale=0.3),
    # a user's 1/max_len scale
    Case(lq=(2049, 500), heads=4, kv_heads=4, d=128, causal=True, scale=1 / 2049),
    Case(lq=(T + 1, 1000), heads=4, kv_heads=2, d=128, causal=True, sink=True),
    Case(lq=(1, 300), lk=(129, 2), heads=4, kv_heads=1, d=64, dlse=False),
]
DENSE = [
    Case(lq=(1024,) * 2, lk=(1024,) * 2, heads=4, kv_heads=4, d=128, dense=True),
    Case(lq=(333,) * 3, lk=(1000,) * 3, heads=4, kv_heads=2, d=64, dense=True, causal=True),
    Case(lq=(2048,) * 2, lk=(2048,) * 2, heads=8, kv_heads=8, d=128, dense=True, causal=True),
]


# q, k, v (and so dq, dk, dv) as slices of one packed projection: ragged, GQA, causal dense, fp16 D=64
PACKED = [
    Case(lq=(0, 1, T - 1, T + 1, 1000), heads=4, kv_heads=2, d=128, packed=True),
    Case(lq=(1024,) * 2, heads=4, kv_heads=4, d=128, dense=True, causal=True, packed=True),
    Case(lq=(T + 1, 300), heads=2, kv_heads=1, d=64, causal=True, dtype=torch.float16, packed=True),
]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", VARLEN + DENSE + PACKED, ids=lambda c: c.id)
def test_gluon_bwd_matches_reference(case, device, gluon_bwd_calls):
    run_case(case, device)
    assert gluon_bwd_calls, "the Gluon backward did not run"


# the backward's opt-in variant LP_FA4_BWD_CAUSAL_WALK=1 (each slot's first kv tile walks its query
# tiles down) on the causal cases
OPT_IN = [
    ({"LP_FA4_BWD_CAUSAL_WALK": "1"}, case, f"causal-walk-{case.id}")
    for case in VARLEN + DENSE
    if case.causal
]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("env, case", [o[:2] for o in OPT_IN], ids=[o[2] for o in OPT_IN])
def test_gluon_bwd_opt_in_variants(env, case, device, gluon_bwd_calls, monkeypatch):
    """Each opt-in variant gives the reference's gradients."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run_case(case, device)
    assert gluon_bwd_calls, "the Gluon backward did not run"


@pytest.mark.gpu
@pytest.mark.sm90
def test_gluon_bwd_deterministic_stays_on_triton(device, gluon_bwd_calls):
    run_case(Case(lq=(300, 129), heads=4, kv_heads=2, d=128, causal=True, deterministic=True), device)
    assert not gluon_bwd_calls, "deterministic=True must keep the Triton backward"


@pytest.mark.gpu
@pytest.mark.sm90
def test_gluon_bwd_jagged_row_cap(device, gluon_bwd_calls):
    """jagged_attention without a window: cross attention, an empty kv sequence, query rows past
    max_seqlen_q (zero dQ), GQA."""
    jagged_case([130, 0, 7, 300, 64], [200, 5, 0, 129, 1], max_q=256, heads=4, kv_heads=2, d=128,
                device=device)  # fmt: skip
    assert gluon_bwd_calls, "the Gluon backward did not run"


def _poison_allocator(device, nbytes=1 << 30):
    """Fill memory the caching allocator will hand out next with NaN."""
    junk = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device=device)
    del junk


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fill", ["spans", "whole"])
def test_gluon_bwd_seqused_and_poisoned_buffers(fill, causal, device, gluon_bwd_calls, monkeypatch):
    """seqused_q/k, with every buffer of the backward drawn from NaN-filled memory: rows past
    seqused_q get dQ = 0, keys past seqused_k (and rows outside every sequence) dK = dV = 0, the
    rest the reference on the used rows. ``fill``: dK/dV zeroed outside the key spans only
    (``zero_outside_spans``, what large buffers get) or as a whole (small ones)."""
    from ads_kernel_tools.kernels import span_fill

    monkeypatch.setattr(span_fill, "SPAN_FILL_MIN_BYTES", 0 if fill == "spans" else 1 << 62)
    lq, lk, uq, uk = (200, 5, 130, 0, 70), (300, 140, 0, 7, 2100), [131, 5, 129, 0, 70], [300, 3, 0, 7, 2049]
    h, hkv, d = 4, 2, 128
    pad = 9  # rows after the last sequence, in no sequence
    q = randn((sum(lq) + pad, h, d), dtype=torch.bfloat16, device=device, seed=11)
    k = randn((sum(lk) + pad, hkv, d), dtype=torch.bfloat16, device=device, seed=12)
    v = randn((sum(lk) + pad, hkv, d), dtype=torch.bfloat16, device=device, seed=13)
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)
    used_q = torch.tensor(uq, dtype=torch.int32, device=device)
    used_k = torch.tensor(uk, dtype=torch.int32, device=device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lq), max(lk), causal=causal, seqused_q=used_q,
                                 seqused_k=used_k)[0]  # fmt: skip
    do = randn(out.shape, dtype=torch.bfloat16, device=device, seed=14)
    _poison_allocator(device)
    dq, dk, dv = torch.autograd.grad(out, leaves, do)
    assert gluon_bwd_calls, "the Gluon backward did not run"
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not g.isnan().any(), f"{name} has NaN"
    hq, hk = cu_q.tolist(), cu_k.tolist()
    live_q = torch.zeros(q.shape[0], dtype=torch.bool, device=device)
    live_k = torch.zeros(k.shape[0], dtype=torch.bool, device=device)
    for b in range(len(lq)):
        a, c = uq[b], uk[b]
        rq, rk = slice(hq[b], hq[b] + a), slice(hk[b], hk[b] + c)
        live_q[rq] = True
        live_k[rk] = True
        if a == 0 or c == 0:
            continue
        xs = [t[r].detach() for t, r in ((q, rq), (k, rk), (v, rk))]
        truth = [x.float().requires_grad_() for x in xs]
        base = [x.clone().requires_grad_() for x in xs]
        offs_q, offs_k = [0, a], [0, c]
        r_out, _ = softmax_attention_varlen_ref(*truth, offs_q, offs_k, causal=causal)
        b_out, _ = softmax_attention_varlen_ref(*base, offs_q, offs_k, causal=causal, dtype=torch.bfloat16)
        rg = torch.autograd.grad(r_out, truth, do[rq].float())
        bg = torch.autograd.grad(b_out, base, do[rq])
        for name, got, r, bb in zip(("dq", "dk", "dv"), (dq[rq], dk[rk], dv[rk]), rg, bg):
            assert_close_vs_baseline(got, r, bb, name=f"{name}[{b}]")
    assert (dq[~live_q] == 0).all(), "dQ of rows past seqused_q or outside the sequences"
    assert (dk[~live_k] == 0).all() and (dv[~live_k] == 0).all(), "dK/dV of keys past seqused_k"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("case", WINDOWED, ids=lambda c: c.id)
def test_gluon_bwd_windows_match_reference(case, device, gluon_bwd_calls, monkeypatch):
    """Local windows through the Gluon backward (the default), against the fp32 reference."""
    monkeypatch.delenv("LP_FA4_BWD_WINDOWS", raising=False)
    run_case(case, device)
    assert gluon_bwd_calls, "the Gluon backward did not run"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("phase", ["1", "0"], ids=["phased-walk", "plain-walk"])
@pytest.mark.parametrize("window", [0, 5, 32, 256])
def test_gluon_bwd_jagged_top_left_windows(window, phase, device, gluon_bwd_calls, monkeypatch):
    """jagged_attention's top-left band |i - j| <= W through the Gluon backward (the default): cross
    attention with Lq != Lk, an empty kv sequence, rows past max_seqlen_q, GQA; under both query-tile
    walks (LP_FA4_BWD_WINDOW_PHASE)."""
    monkeypatch.delenv("LP_FA4_BWD_WINDOWS", raising=False)
    monkeypatch.setenv("LP_FA4_BWD_WINDOW_PHASE", phase)
    jagged_case((T + 1, 0, 7, 700, 300), (2 * T + 3, 5, 0, 40, 300), max_q=512, window=window, heads=4,
                kv_heads=2, d=128, device=device)  # fmt: skip
    assert gluon_bwd_calls, "the Gluon backward did not run"
