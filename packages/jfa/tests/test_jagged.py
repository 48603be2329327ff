"""jagged_flash_attention on the CPU interpreter (16-row tiles there): edge lengths 0, 1, 15/17
and long; self and cross attention with unequal lengths; windows at sequence edges and W = 0; rows
past max_seq_len_q; empty kv sequences; broadcast_q; GQA/MQA; fp16/bf16; LSE; int64 offsets."""

from __future__ import annotations

import pytest
import torch
from jfa_testlib import Case, run_case

EDGE = (0, 1, 15, 17, 40)  # empty, one, tile - 1, tile + 1, long (interpreter tiles: 16)
LQ = (5, 0, 17, 33, 1, 16)
LK = (16, 3, 0, 40, 1, 9)  # an empty kv sequence for a non-empty query one; Lk < Lq and Lk > Lq


@pytest.mark.parametrize("window", [None, 0, 5], ids=lambda w: f"w{w}")
def test_self_attention_edge_lengths(window, device):
    run_case(Case(EDGE, window=window), device)


@pytest.mark.parametrize("window", [None, 0, 2], ids=lambda w: f"w{w}")
def test_cross_attention_unequal_lengths(window, device):
    """The top-left band with Lq != Lk: rows past Lk see only the keys within W of them (none once
    i > Lk - 1 + W), so they give 0 / -inf."""
    run_case(Case(LQ, LK, window=window), device)


def test_rows_past_max_seq_len_q(device):
    out, lse, dq, *_ = run_case(Case(LQ, LK, max_q=9, window=3), device)
    starts = (0, 5, 5, 22, 55, 56)
    for s, n in zip(starts, LQ):
        if n > 9:
            assert (out[s + 9 : s + n] == 0).all() and torch.isneginf(lse[:, s + 9 : s + n]).all()
            assert (dq[s + 9 : s + n] == 0).all()


def test_max_seq_len_q_zero(device):
    run_case(Case((3, 17), (5, 2), max_q=0), device)


def test_empty_kv_gives_zero_and_neg_inf(device):
    out, lse, dq, dk, dv = run_case(Case((4, 6), (0, 5)), device)
    assert (out[:4] == 0).all() and torch.isneginf(lse[:, :4]).all() and (dq[:4] == 0).all()


def test_empty_batch(device):
    run_case(Case((), ()), device)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
def test_gqa(heads, kv_heads, device):
    run_case(Case((5, 17, 0), (16, 3, 9), window=5, heads=heads, kv_heads=kv_heads), device)


@pytest.mark.parametrize("window", [None, 6], ids=lambda w: f"w{w}")
def test_broadcast_q(window, device):
    """One query sequence over every kv sequence (also empty and shorter than Lq)."""
    run_case(Case((17,), (5, 0, 33, 16), window=window, broadcast_q=True), device)


def test_broadcast_q_gqa_max_q(device):
    run_case(Case((20,), (7, 40, 1), max_q=12, broadcast_q=True, heads=4, kv_heads=2), device)


def test_fp16_scale_d64(device):
    run_case(Case((9, 18), (18, 9), window=7, d=64, dtype=torch.float16, scale=0.3), device)


def test_head_dim_128_forward(device):
    run_case(Case((17, 3), (5, 20), d=128, grad=False), device)


def test_int64_offsets_host_copies(device):
    run_case(Case((5, 17, 0), (16, 3, 9), window=4, int64=True, host=True, grad=False), device)


def test_lse_without_dlse(device):
    run_case(Case((5, 17, 0), (16, 3, 9), dlse=False), device)


def test_return_lse_false_returns_tensor(device):
    from jfa_testlib import inputs

    from ads_jfa import jagged_flash_attention

    q, k, v, cu_q, cu_k, lk = inputs(Case(LQ, LK), device)
    out = jagged_flash_attention(q, k, v, cu_q, cu_k, 33, 40)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


def test_output_offset_accepted(device):
    from jfa_testlib import inputs

    from ads_jfa import jagged_flash_attention

    q, k, v, cu_q, cu_k, lk = inputs(Case((3, 5), (2, 4)), device)
    a = jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 4)
    b = jagged_flash_attention(q, k, v, cu_q, cu_k, 5, 4, output_offset=cu_q.clone())
    assert torch.equal(a, b)
    cb = torch.tensor([0, 3], dtype=torch.int32, device=device)
    rep = torch.tensor([0, 3, 6], dtype=torch.int32, device=device)
    c = jagged_flash_attention(q[:3], k, v, cb, cu_k, 3, 4, broadcast_q=True, output_offset=rep)
    assert c.shape == (6, 2, 32)


@pytest.mark.parametrize("window", [None, 5], ids=lambda w: f"w{w}")
def test_strided_offsets_give_their_contiguous_result(window, device):
    """Offsets passed as strided views (a column of a matrix, ``t[::2]``) give the output and
    gradients of their contiguous copies (lp-fa4 reads offsets by position and now takes contiguous
    copies; strided ones were read as the wrong entries: wrong results, no error)."""
    from ads_jfa import jagged_flash_attention

    cu = torch.tensor([0, 13, 13, 50, 70], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(70, 2, 32, device=device).to(torch.bfloat16) for _ in range(3))
    wide = torch.zeros((5, 2), dtype=torch.int32, device=device)
    wide[:, 1] = cu

    def run(off):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = jagged_flash_attention(*leaves, off, off, 37, 37, window_size=window, deterministic=True)
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    for got, want in zip(run(wide[:, 1]), run(cu), strict=True):
        assert torch.equal(got, want)
