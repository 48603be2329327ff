"""What ads-jfa needs from lp-fa4's engine: exact per-sequence FLOP counts from host offsets, and keys
past max_seqlen_k ignored by forward and backward alike (both once strict xfails, now provided)."""

from __future__ import annotations

import torch

import lp_fa4
from ads_jfa import jagged_flash_attention
from ads_kernel_tools.bench import flops
from ads_kernel_tools.reference.attention import jagged_attention_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

BF = torch.bfloat16


def test_flops_exact_per_sequence_with_host_offsets(device):
    from torch.utils.flop_counter import FlopCounterMode

    lq, lk = (5, 17, 0), (16, 3, 9)
    q = randn((sum(lq), 2, 32), dtype=BF, device=device)
    k = randn((sum(lk), 1, 32), dtype=BF, device=device, seed=1)
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)
    host = dict(query_offset_cpu=cu_q.cpu(), key_offset_cpu=cu_k.cpu())
    with FlopCounterMode(display=False) as fc:
        jagged_flash_attention(q, k, k, cu_q, cu_k, 17, 16, window_size=2, **host)
    assert fc.get_total_flops() == flops.attention_fwd(list(lq), list(lk), 2, 32, symmetric_window=2)


def test_keys_past_max_seqlen_k_are_ignored(device):
    """Called on the engine directly: our API rejects such offsets wherever it can see them."""
    lq, lk, max_k = (6,), (40,), 8
    q = randn((6, 2, 32), dtype=BF, device=device).requires_grad_()
    k = randn((40, 2, 32), dtype=BF, device=device, seed=1).requires_grad_()
    v = randn((40, 2, 32), dtype=BF, device=device, seed=2).requires_grad_()
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)
    out, _ = lp_fa4.jagged_attention(q, k, v, cu_q, cu_k, 6, max_k)
    cut = lengths_to_offsets([max_k], device=device)
    truth = [t.detach().double()[: max_k if i else None].requires_grad_() for i, t in enumerate((q, k, v))]
    base = [t.detach()[: max_k if i else None].clone().requires_grad_() for i, t in enumerate((q, k, v))]
    r_out, _ = jagged_attention_ref(*truth, cu_q, cut, 6, dtype=torch.float64)
    b_out, _ = jagged_attention_ref(*base, cu_q, cut, 6, dtype=BF)
    assert_close_vs_baseline(out, r_out, b_out, name="out")
    do = randn(out.shape, dtype=BF, device=device, seed=3)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    r = torch.autograd.grad(r_out, truth, do.double())
    b = torch.autograd.grad(b_out, base, do)
    assert (dk[max_k:] == 0).all() and (dv[max_k:] == 0).all()
    for name, g, rr, bb in zip(("dq", "dk", "dv"), (dq, dk[:max_k], dv[:max_k]), r, b):
        assert_close_vs_baseline(g, rr, bb, name=name)
