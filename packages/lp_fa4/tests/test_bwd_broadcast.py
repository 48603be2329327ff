"""broadcast_q backward: the dQ pass spreads the B kv sequences over batch chunks and sums the chunks
(fp32 atomics, or per-chunk partials summed in a fixed order when deterministic). Against the fp32
tools reference with GQA, ragged kv lengths including 0 and 1, enough sequences for several chunks
(the interpreter's chunks hold two sequences), bitwise repeats, and poisoned buffers."""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.reference.attention import jagged_attention_ref
from ads_kernel_tools.testing import jagged_lengths, lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline
from lp_fa4 import flash_attn_varlen_func, jagged_attention

# ragged, with empty and one-key sequences, odd count: the last chunk is short
LK = (5, 0, 33, 1, 16, 17, 0, 9, 2)


def _inputs(lq, lk, heads, kv_heads, d, device, seed=0, dtype=torch.bfloat16):
    q = randn((lq, heads, d), dtype=dtype, device=device, seed=seed)
    k = randn((sum(lk), kv_heads, d), dtype=dtype, device=device, seed=seed + 1)
    v = randn((sum(lk), kv_heads, d), dtype=dtype, device=device, seed=seed + 2)
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=device)
    return q, k, v, cu_q, lengths_to_offsets(list(lk), device=device)


def _grads(q, k, v, cu_q, cu_k, max_q, max_k, do, *, deterministic, window=None):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = jagged_attention(
        *leaves, cu_q, cu_k, max_q, max_k, window_size=window, broadcast_q=True, deterministic=deterministic
    )
    return out, torch.autograd.grad(out, leaves, do)


def _check(lq, lk, *, max_q, heads, kv_heads, d, deterministic, device, window=None, seed=0,
           dtype=torch.bfloat16):  # fmt: skip
    q, k, v, cu_q, cu_k = _inputs(lq, lk, heads, kv_heads, d, device, seed, dtype=dtype)
    do = randn((len(lk) * lq, heads, d), dtype=dtype, device=device, seed=seed + 3)
    out, grads = _grads(q, k, v, cu_q, cu_k, max_q, max(lk), do, deterministic=deterministic, window=window)
    truth = [t.detach().float().requires_grad_() for t in (q, k, v)]
    base = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kw = dict(window_size=window, broadcast_q=True)
    r_out, _ = jagged_attention_ref(*truth, cu_q, cu_k, max_q, **kw)
    b_out, _ = jagged_attention_ref(*base, cu_q, cu_k, max_q, dtype=dtype, **kw)
    name = f"bq lq{lq} B{len(lk)} h{heads}/{kv_heads} det{deterministic}"
    assert_close_vs_baseline(out, r_out, b_out, name=f"out[{name}]")
    rg = torch.autograd.grad(r_out, truth, do.float())
    bg = torch.autograd.grad(b_out, base, do)
    for n, a, r, b in zip(("dq", "dk", "dv"), grads, rg, bg):
        assert a.dtype == q.dtype
        assert_close_vs_baseline(a, r, b, name=f"{n}[{name}]")
    return q, k, v, cu_q, cu_k, do, grads


@pytest.mark.parametrize("deterministic", [False, True])
def test_broadcast_dq_chunks_gqa_ragged(deterministic, device):
    _check(17, LK, max_q=17, heads=4, kv_heads=2, d=32, deterministic=deterministic, device=device)


def test_broadcast_dq_rows_past_max_q_and_window(device):
    """Query rows past max_seqlen_q get zero dQ in every chunk; the window limits each chunk's keys."""
    q, k, v, cu_q, cu_k, do, grads = _check(
        20, LK, max_q=13, heads=2, kv_heads=1, d=32, deterministic=True, window=3, device=device
    )
    assert (grads[0][13:] == 0).all()


def test_broadcast_dq_deterministic_bitwise(device):
    q, k, v, cu_q, cu_k = _inputs(17, LK, 4, 1, 32, device, seed=7)
    do = randn((len(LK) * 17, 4, 32), dtype=torch.bfloat16, device=device, seed=8)
    runs = [_grads(q, k, v, cu_q, cu_k, 17, 33, do, deterministic=True)[1] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_broadcast_dq_single_sequence_and_all_empty(device):
    """One kv sequence (one chunk, stored directly) and a batch of only empty kv sequences (dQ 0)."""
    _check(9, (12,), max_q=9, heads=2, kv_heads=1, d=32, deterministic=True, device=device)
    q, k, v, cu_q, cu_k = _inputs(9, (0, 0, 0, 0, 0), 2, 1, 32, device)
    k = randn((1, 1, 32), dtype=torch.bfloat16, device=device, seed=3)
    v = randn((1, 1, 32), dtype=torch.bfloat16, device=device, seed=4)
    for det in (False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = jagged_attention(*leaves, cu_q, cu_k, 9, 1, broadcast_q=True, deterministic=det)
        dq, dk, dv = torch.autograd.grad(out.float().sum(), leaves)
        assert (out == 0).all() and (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


def test_broadcast_dq_poisoned_buffers(device):
    """Buffers torch would leave uninitialised are NaN-filled: every gradient is still finite, and q
    rows outside the query sequence (cu_seqlens_q need not span q) keep zero dQ. (out has B·len(q) rows;
    rows past B·Lq are unwritten, as for any varlen call, and are not looked at.)"""
    lq, extra = 11, 3
    q, k, v, _, cu_k = _inputs(lq + extra, LK, 2, 1, 32, device, seed=4)
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device=device)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        for det in (False, True):
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            out, lse = flash_attn_varlen_func(
                *leaves, cu_q, cu_k, lq, max(LK), broadcast_q=True, deterministic=det, return_lse=True
            )
            live = torch.arange(out.shape[0], device=device) < len(LK) * lq  # rows b·Lq + i
            do = torch.zeros_like(out)
            do[live] = 1.0
            grads = torch.autograd.grad(out, leaves, do)
            assert torch.isfinite(out[live]).all() and not torch.isnan(lse[:, live]).any()
            for t in grads:
                assert torch.isfinite(t).all()
            assert (grads[0][lq:] == 0).all()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
@pytest.mark.parametrize("lq,kv_heads", [(32, 4), (128, 2), (200, 1)])
def test_broadcast_dq_real_sizes(lq, kv_heads, device):
    """PMA shapes: hundreds of kv sequences (many chunks), GQA, the deterministic path and atomics."""
    lk = tuple(jagged_lengths(300, 512, 0.5, seed=lq))
    lk = (0, 1) + lk
    for det in (True, False):
        _check(lq, lk, max_q=lq, heads=4, kv_heads=kv_heads, d=128, deterministic=det, device=device, seed=lq)


@pytest.mark.gpu
def test_broadcast_dq_bitwise_at_size(device):
    lk = tuple(jagged_lengths(1152, 1024, 0.5, seed=11))
    q, k, v, cu_q, cu_k = _inputs(128, lk, 4, 4, 128, device, seed=12)
    do = randn((len(lk) * 128, 4, 128), dtype=torch.bfloat16, device=device, seed=13)
    runs = [_grads(q, k, v, cu_q, cu_k, 128, max(lk), do, deterministic=True)[1] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
