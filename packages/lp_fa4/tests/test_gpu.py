"""GPU tests at real sizes: a grid modelled on FA4's published test matrix (head dims, 27 (Sq, Sk)
pairs from (1, 1) to (4224, 4224), causal, local, softcap, GQA, sink), varlen at real lengths, and
int64 index math past 2^31 elements."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import Case, compare_lse, paged_cache, run_case

from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
from ads_kernel_tools.testing import jagged_lengths, lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from lp_fa4 import flash_attn_varlen_func

pytestmark = pytest.mark.gpu

PAIRS = [
    (1, 1), (1, 3), (2, 1), (511, 1), (3, 513), (64, 128), (128, 128), (256, 256), (113, 203),
    (128, 217), (113, 211), (108, 256), (256, 512), (307, 256), (640, 128), (512, 256), (1024, 1024),
    (1023, 1024), (1024, 1023), (2048, 2048), (239, 1), (799, 3), (4224, 4224), (1, 4224), (2000, 77),
    (577, 1029), (3131, 2048),
]  # fmt: skip
MODES = [
    dict(),
    dict(causal=True),
    dict(window=(128, 64)),
    dict(softcap=15.0, causal=True),
    dict(sink=True, heads=6, kv_heads=2),
    dict(causal=True, heads=6, kv_heads=1),
]
# every pair at D=128, every other at 64/256, every third at 96/192 (compile time of the GPU job)
STEP = {128: 1, 64: 2, 256: 2, 96: 3, 192: 3}
GRID = [(d, p, i % len(MODES)) for d, step in STEP.items() for i, p in enumerate(PAIRS) if i % step == 0]


@pytest.mark.parametrize("d,pair,mode", GRID, ids=lambda x: str(x))
def test_fa4_grid(d, pair, mode, device):
    sq, sk = pair
    opts = dict(heads=4, kv_heads=4) | MODES[mode]
    run_case(Case((sq, sq), (sk, sk), dense=True, d=d, seed=d + mode, **opts), device)


@pytest.mark.parametrize("opts", [dict(causal=True), dict(window=(256, 0), softcap=20.0, sink=True)])
def test_varlen_real_lengths(opts, device):
    lens = jagged_lengths(64, 1024, 0.5, seed=3)
    lk = jagged_lengths(64, 1024, 0.5, seed=4)
    run_case(Case(tuple(lens), tuple(lk), heads=8, kv_heads=2, d=128, **opts), device)


def test_deterministic_bitwise_at_size(device):
    lens = jagged_lengths(32, 2048, 0.5, seed=5)
    case = Case(tuple(lens), heads=8, kv_heads=2, d=128)
    cu = lengths_to_offsets(lens, device=device)
    q = randn((sum(lens), 8, 128), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((sum(lens), 2, 128), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((sum(lens), 2, 128), dtype=torch.bfloat16, device=device, seed=3)
    do = torch.randn_like(q)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = flash_attn_varlen_func(
            *leaves, cu, cu, max(lens), max(lens), causal=True, deterministic=True
        )
        runs.append(torch.autograd.grad(out, leaves, do))
    assert case.lq and all(torch.equal(a, b) for a, b in zip(*runs))


def test_int64_indexing_past_2_31(device):
    """T·H·D > 2^31 elements: offsets·strides only fit in int64; the last sequence is checked."""
    n_seq, length, h, d = 1040, 1024, 16, 128
    t = n_seq * length
    assert t * h * d > 2**31
    q = torch.randn(t, h, d, device=device, dtype=torch.bfloat16)
    k = torch.randn(t, 1, d, device=device, dtype=torch.bfloat16)
    v = torch.randn(t, 1, d, device=device, dtype=torch.bfloat16)
    cu = torch.arange(0, n_seq + 1, device=device, dtype=torch.int32) * length
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out, _ = flash_attn_varlen_func(*leaves, cu, cu, length, length, causal=True)
    last = slice(t - length, t)
    ref, _ = softmax_attention_varlen_ref(q[last].float(), k[last].float(), v[last].float(), [0, length],
                                          [0, length], causal=True)  # fmt: skip
    base, _ = softmax_attention_varlen_ref(q[last], k[last], v[last], [0, length], [0, length], causal=True,
                                           dtype=torch.bfloat16)  # fmt: skip
    assert_close_vs_baseline(out[last], ref, base, name="out (last sequence)")
    dq, dk, dv = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert torch.isfinite(dq[last]).all() and dq[last].abs().sum() > 0
    assert torch.isfinite(dk[last]).all() and dk[last].abs().sum() > 0


@pytest.mark.parametrize("page_size", [64, 128, 256])
def test_paged_kv_real_sizes(page_size, device, monkeypatch):
    """Paged KV at serving sizes equals the same call on contiguous K/V, and the reference. The
    contiguous call is held to the kernel the paged one runs (Triton, pointer loads), so the bits
    must agree."""
    monkeypatch.setenv("LP_FA4_BACKEND", "triton")
    monkeypatch.setenv("LP_FA4_FWD_TMA", "0")
    lq = jagged_lengths(16, 512, 0.5, seed=page_size)
    lk = jagged_lengths(16, 4096, 0.5, seed=page_size + 1)
    q = randn((sum(lq), 8, 128), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((sum(lk), 2, 128), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((sum(lk), 2, 128), dtype=torch.bfloat16, device=device, seed=3)
    cu_q, cu_k = lengths_to_offsets(lq, device=device), lengths_to_offsets(lk, device=device)
    kc, vc, table = paged_cache(k, v, cu_k, page_size)
    used_k = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    kw = dict(causal=True, return_lse=True)
    with torch.no_grad():
        out, lse = flash_attn_varlen_func(q, kc, vc, cu_q, None, max(lq), max(lk), seqused_k=used_k,
                                          page_table=table, **kw)  # fmt: skip
        flat, flat_lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
    assert torch.equal(out, flat) and torch.equal(lse, flat_lse)
    ref, rlse = softmax_attention_varlen_ref(q.float(), k.float(), v.float(), cu_q, cu_k, causal=True)
    base, _ = softmax_attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, dtype=torch.bfloat16)
    assert_close_vs_baseline(out, ref, base, name=f"paged out (page {page_size})")
    compare_lse(lse, rlse, "paged lse")
