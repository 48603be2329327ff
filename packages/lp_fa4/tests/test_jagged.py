"""jagged_attention (the ads-jfa core): cross attention with independent offsets, the top-left
symmetric window, rows past max_seqlen_q, empty kv sequences, broadcast_q, GQA."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import jagged_case

LQ = (5, 0, 17, 33, 1)
LK = (16, 3, 0, 40, 1)


@pytest.mark.parametrize("window", [None, 0, 3, 20])
def test_cross_attention_windows(window, device):
    jagged_case(LQ, LK, max_q=33, window=window, device=device)


def test_rows_past_max_seqlen_q_are_zero(device):
    jagged_case(LQ, LK, max_q=16, window=2, device=device)


def test_broadcast_q_window_gqa(device):
    jagged_case((17,), (5, 0, 33), max_q=17, window=4, broadcast_q=True, heads=4, kv_heads=2, device=device)


def test_fp16_no_grad_large_head(device):
    jagged_case((9, 18), (18, 9), max_q=18, d=128, dtype=torch.float16, grad=False, device=device)


def test_keys_past_max_seqlen_k_are_ignored(device):
    """A kv sequence longer than max_seqlen_k attends to its first max_seqlen_k keys in the forward
    and the backward alike; the keys past it get zero dK/dV."""
    from ads_kernel_tools.reference.attention import jagged_attention_ref
    from ads_kernel_tools.testing import lengths_to_offsets, randn
    from ads_kernel_tools.tolerance import assert_close_vs_baseline
    from lp_fa4 import jagged_attention

    lq, lk, max_k = (5, 17), (30, 9), 20
    q = randn((sum(lq), 2, 32), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((sum(lk), 1, 32), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((sum(lk), 1, 32), dtype=torch.bfloat16, device=device, seed=3)
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)
    keep = torch.cat([torch.arange(0, max_k), torch.arange(30, 39)])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = jagged_attention(*leaves, cu_q, cu_k, max(lq), max_k, window_size=6)
    cu_t = lengths_to_offsets([max_k, 9], device=device)
    truth = [q.float().requires_grad_(), k[keep].float().requires_grad_(), v[keep].float().requires_grad_()]
    base = [q.clone().requires_grad_(), k[keep].clone().requires_grad_(), v[keep].clone().requires_grad_()]
    ref, _ = jagged_attention_ref(*truth, cu_q, cu_t, max(lq), window_size=6)
    b_out, _ = jagged_attention_ref(*base, cu_q, cu_t, max(lq), window_size=6, dtype=torch.bfloat16)
    assert_close_vs_baseline(out, ref, b_out, name="out")
    do = randn(out.shape, dtype=torch.bfloat16, device=device, seed=4)
    dq, dk, dv = torch.autograd.grad(out, leaves, do)
    rq, rk, rv = torch.autograd.grad(ref, truth, do.float())
    bq, bk, bv = torch.autograd.grad(b_out, base, do)
    assert_close_vs_baseline(dq, rq, bq, name="dq")
    assert_close_vs_baseline(dk[keep], rk, bk, name="dk")
    assert_close_vs_baseline(dv[keep], rv, bv, name="dv")
    assert (dk[max_k:30] == 0).all() and (dv[max_k:30] == 0).all()


def test_host_offsets_give_exact_flops(device):
    """cu_seqlens_q_cpu / cu_seqlens_k_cpu: the FLOP formula counts each sequence's pairs (window,
    rows past max_seqlen_q and keys past max_seqlen_k excluded), forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode

    from ads_kernel_tools.bench.flops import valid_pairs
    from ads_kernel_tools.testing import lengths_to_offsets, randn
    from lp_fa4 import jagged_attention

    lq, lk, max_q, max_k, w = [5, 0, 17], [16, 3, 30], 16, 20, 4
    q = randn((sum(lq), 2, 32), dtype=torch.bfloat16, device=device, seed=1).requires_grad_()
    k = randn((sum(lk), 1, 32), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((sum(lk), 1, 32), dtype=torch.bfloat16, device=device, seed=3)
    cu_q, cu_k = lengths_to_offsets(lq, device=device), lengths_to_offsets(lk, device=device)
    pairs = sum(valid_pairs(a, min(c, max_k), symmetric_window=w, q_rows=max_q) for a, c in zip(lq, lk))
    with FlopCounterMode(display=False) as fc:
        host = dict(cu_seqlens_q_cpu=cu_q.cpu(), cu_seqlens_k_cpu=[0, 16, 19, 49])  # a tensor or a list
        out, _ = jagged_attention(q, k, v, cu_q, cu_k, max_q, max_k, window_size=w, **host)
        out.float().sum().backward()
    fwd = 2 * 2 * 64 * pairs
    assert fc.get_total_flops() == fwd + int(2.5 * fwd)
    with pytest.raises(ValueError, match="cu_seqlens_k_cpu"):
        jagged_attention(q, k, v, cu_q, cu_k, max_q, max_k, cu_seqlens_k_cpu=[0, 1])
