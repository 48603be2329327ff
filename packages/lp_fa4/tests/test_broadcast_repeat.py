"""broadcast_q by repeating the queries per kv sequence (``lp_fa4.broadcast``): the same answers as
the in-place broadcast, against the fp32 reference (forced with LP_FA4_BROADCAST_Q=repeat on any
machine), the choice of ``auto``, and on an sm_90 GPU that PMA calls reach both Gluon kernels."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import count_calls
from test_bwd_broadcast import LK, _check

from lp_fa4 import broadcast, interface, offsets
from lp_fa4 import config as cfg
from lp_fa4.gluon import dispatch
from lp_fa4.triton.launch import BIG


@pytest.fixture
def repeat_mode(monkeypatch):
    """Forces the repeat; the list counts the calls that took it."""
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "repeat")
    return count_calls(monkeypatch, interface, "repeat_queries")


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_repeat_matches_reference_gqa_ragged(kv_heads, repeat_mode, device):
    """Ragged kv lengths with empty and one-key sequences, GQA and MQA; dQ summed by the repeat."""
    _check(17, LK, max_q=17, heads=4, kv_heads=kv_heads, d=32, deterministic=False, device=device)
    assert repeat_mode


def test_repeat_rows_past_max_q_and_window(repeat_mode, device):
    _check(20, LK, max_q=13, heads=2, kv_heads=2, d=16, deterministic=False, device=device, window=3)
    assert repeat_mode


def test_repeat_equals_in_place_broadcast(monkeypatch, device):
    """Both ways give the same output and gradients up to bf16 rounding of the summation order."""
    got = {}
    for mode in ("repeat", "kernel"):
        monkeypatch.setenv("LP_FA4_BROADCAST_Q", mode)
        _, _, _, _, _, _, grads = _check(
            9, LK, max_q=9, heads=2, kv_heads=1, d=32, deterministic=False, device=device
        )
        got[mode] = grads
    for a, b in zip(got["repeat"], got["kernel"]):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_auto_choice(monkeypatch):
    q = torch.zeros(8, 2, 128, dtype=torch.bfloat16)
    v = torch.zeros(8, 2, 128, dtype=torch.bfloat16)
    nw = (BIG, BIG)
    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    # a CPU tensor (or the interpreter) never has the Gluon kernels
    assert broadcast.plan(q, v, v, 4, nw, False) == "kernel"
    assert broadcast.plan(q, v, v, 4, nw, True) == "kernel"
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "repeat")
    assert broadcast.plan(q, v, v, 4, nw, True) == "repeat"
    assert broadcast.plan(q, v, v, 2**31, nw, False) == "kernel"  # offsets past int32: the in-place path
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "kernel")
    assert broadcast.plan(q, v, v, 4, nw, False) == "kernel"
    monkeypatch.setenv("LP_FA4_BROADCAST_Q", "sometimes")
    with pytest.raises(ValueError, match="LP_FA4_BROADCAST_Q"):
        cfg.broadcast_q()


def test_repeat_offsets_without_sync():
    q = torch.arange(6.0).view(3, 1, 2)
    rep, cu = dispatch.repeat_queries(q, 4)
    assert rep.shape == (12, 1, 2) and torch.equal(rep[9:], q)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 6, 9, 12]
    # the cached dense offsets, which the Gluon forward trusts without a clamp
    assert dispatch.repeat_queries(q, 4)[1] is cu and offsets.dense_length(cu, 12) == 3


def test_repeat_plan_host_offsets(repeat_mode, monkeypatch, device):
    """The interface's repeat hands the op the repeated offsets' CPU copy (exact FLOP counts)."""
    from ads_kernel_tools.testing import lengths_to_offsets
    from lp_fa4 import _ops, jagged_attention

    seen = []
    real = _ops.attention
    monkeypatch.setattr(_ops, "attention", lambda *a: seen.append(a) or real(*a))
    q = torch.zeros(5, 1, 16, dtype=torch.bfloat16, device=device)
    k = torch.zeros(7, 1, 16, dtype=torch.bfloat16, device=device)
    cu_q = torch.tensor([0, 5], dtype=torch.int32, device=device)
    jagged_attention(q, k, k, cu_q, lengths_to_offsets([3, 0, 4], device=device), 5, 4, broadcast_q=True)
    inputs = seen[0]
    assert repeat_mode and inputs[16] is False  # broadcast_q off: ordinary jagged attention
    assert inputs[21].tolist() == inputs[3].tolist() == [0, 5, 10, 15]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("lq", [32, 128])
def test_pma_reaches_both_gluon_kernels(lq, monkeypatch, device):
    """PMA shapes with GQA on the H200 (the resident backward is MHA only): the default (auto)
    repeats, so the Gluon forward and backward run, and the answers hold against the reference."""
    from ads_kernel_tools.testing import jagged_lengths
    from lp_fa4.gluon import bwd_sm90, fwd_sm90

    monkeypatch.delenv("LP_FA4_BROADCAST_Q", raising=False)
    rep_calls = count_calls(monkeypatch, interface, "repeat_queries")
    fwd_calls = count_calls(monkeypatch, fwd_sm90, "fwd")
    bwd_calls = count_calls(monkeypatch, bwd_sm90, "bwd")
    lk = (0, 1) + tuple(jagged_lengths(200, 512, 0.5, seed=lq))
    _check(lq, lk, max_q=lq, heads=4, kv_heads=2, d=128, deterministic=False, device=device, seed=lq)
    assert rep_calls and fwd_calls and bwd_calls, (len(rep_calls), len(fwd_calls), len(bwd_calls))


@pytest.mark.parametrize("mode", ["repeat", "auto"])
def test_pma_compiles_fullgraph(mode, monkeypatch, device):
    """The repeat and its choice (the device part a constant) trace under
    torch.compile(fullgraph=True): same bits as eager. ``auto`` takes the Gluon kernels on an sm_90
    GPU and keeps the in-place broadcast elsewhere."""
    from ads_kernel_tools.testing import lengths_to_offsets, randn
    from lp_fa4 import jagged_attention

    monkeypatch.setenv("LP_FA4_BROADCAST_Q", mode)
    lk = (0, 1, 130, 77) if device == "cuda" else (0, 1, 20, 7)
    q = randn((32, 4, 64), dtype=torch.bfloat16, device=device, seed=1).requires_grad_()
    k, v = (randn((sum(lk), 2, 64), dtype=torch.bfloat16, device=device, seed=s) for s in (2, 3))
    cu_q = torch.tensor([0, 32], dtype=torch.int32, device=device)
    cu_k = lengths_to_offsets(list(lk), device=device)

    def f(q):
        out, _ = jagged_attention(q, k, v, cu_q, cu_k, 32, max(lk), broadcast_q=True)
        return out.float().square().sum()

    eager = torch.autograd.grad(f(q), q)[0]
    got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q), q)[0]
    assert torch.equal(eager, got)
