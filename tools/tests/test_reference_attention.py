"""Tests of the softmax-attention references against SDPA and hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ads_kernel_tools.reference.attention import (
    attention_mask,
    jagged_attention_ref,
    softmax_attention_ref,
    softmax_attention_varlen_ref,
)

F64 = torch.float64


def _rand(*shape, seed, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _sdpa(q, k, v, *, causal=False, scale=None, attn_mask=None):
    """torch SDPA on (B, S, H, D) tensors with GQA expanded by hand."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=attn_mask, is_causal=causal, scale=scale,
    )  # fmt: skip
    return out.transpose(1, 2)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_sdpa_no_window(heads, kv_heads, scale):
    q, k, v = (
        _rand(2, 7, heads, 16, seed=0),
        _rand(2, 9, kv_heads, 16, seed=1),
        _rand(2, 9, kv_heads, 8, seed=2),
    )
    out, lse = softmax_attention_ref(q, k, v, scale=scale, dtype=F64)
    assert out.shape == (2, 7, heads, 8) and lse.shape == (2, heads, 7)
    torch.testing.assert_close(out, _sdpa(q, k, v, scale=scale))
    s = scale if scale is not None else 1 / math.sqrt(16)
    kk = k.repeat_interleave(heads // kv_heads, dim=2)
    expected_lse = torch.logsumexp(torch.einsum("bihd,bjhd->bhij", q, kk) * s, dim=-1)
    torch.testing.assert_close(lse, expected_lse)


def test_causal_square_matches_sdpa():
    q, k, v = _rand(2, 6, 2, 8, seed=3), _rand(2, 6, 2, 8, seed=4), _rand(2, 6, 2, 8, seed=5)
    out, _ = softmax_attention_ref(q, k, v, causal=True, dtype=F64)
    torch.testing.assert_close(out, _sdpa(q, k, v, causal=True))


def test_causal_is_bottom_right_vs_sdpa_with_explicit_mask():
    # SDPA's is_causal is top-left; bottom-right means query i sees keys j <= i + (Lk - Lq)
    q, k, v = _rand(1, 3, 2, 8, seed=6), _rand(1, 5, 2, 8, seed=7), _rand(1, 5, 2, 8, seed=8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out, _ = softmax_attention_ref(q, k, v, causal=True, dtype=F64)
    torch.testing.assert_close(out, _sdpa(q, k, v, attn_mask=mask))


def test_masks_hand_built():
    assert torch.equal(
        attention_mask(3, 4, causal=True), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    )
    # local (1, 0) bottom-right
    assert torch.equal(
        attention_mask(3, 4, window=(1, 0)), torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]).bool()
    )
    # local (0, 1): diagonal and one to the right
    assert torch.equal(attention_mask(2, 2, window=(0, 1)), torch.tensor([[1, 1], [0, 1]]).bool())
    # causal overrides right; (None, 0) == causal; (-1, -1) == no window
    assert torch.equal(attention_mask(4, 6, causal=True, window=(2, 3)), attention_mask(4, 6, window=(2, 0)))
    assert torch.equal(attention_mask(4, 6, window=(None, 0)), attention_mask(4, 6, causal=True))
    assert attention_mask(4, 6, window=(-1, -1)).all()
    # top-left symmetric band
    assert torch.equal(
        attention_mask(3, 4, symmetric_window=1),
        torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]]).bool(),
    )


def test_local_window_small_example():
    # 1 head, D=1, Lq=Lk=3, window (1, 0): row i sees keys i-1 and i
    q = torch.tensor([1.0, 2.0, 3.0], dtype=F64).view(1, 3, 1, 1)
    k = torch.tensor([0.0, 1.0, 2.0], dtype=F64).view(1, 3, 1, 1)
    v = torch.tensor([10.0, 20.0, 30.0], dtype=F64).view(1, 3, 1, 1)
    out, lse = softmax_attention_ref(q, k, v, window=(1, 0), scale=1.0, dtype=F64)
    # row 0: only key 0 -> 10; row 1: scores (0*2, 1*2) = (0, 2); row 2: (3, 6)
    w1 = torch.softmax(torch.tensor([0.0, 2.0], dtype=F64), 0)
    w2 = torch.softmax(torch.tensor([3.0, 6.0], dtype=F64), 0)
    expected = torch.tensor(
        [10.0, w1 @ torch.tensor([10.0, 20.0], dtype=F64), w2 @ torch.tensor([20.0, 30.0], dtype=F64)]
    )
    torch.testing.assert_close(out.flatten(), expected.to(F64))
    torch.testing.assert_close(
        lse.flatten(),
        torch.tensor([0.0, math.log(1 + math.e**2), math.log(math.e**3 + math.e**6)], dtype=F64),
    )


def test_softcap_example():
    q = torch.tensor([2.0], dtype=F64).view(1, 1, 1, 1)
    k = torch.tensor([1.0, 3.0], dtype=F64).view(1, 2, 1, 1)
    v = torch.tensor([1.0, -1.0], dtype=F64).view(1, 2, 1, 1)
    out, lse = softmax_attention_ref(q, k, v, scale=0.5, softcap=2.0, dtype=F64)
    s = 2.0 * torch.tanh(torch.tensor([1.0, 3.0], dtype=F64) / 2.0)  # scaled scores 1, 3 then capped
    p = torch.softmax(s, 0)
    torch.testing.assert_close(out.flatten(), (p[0] - p[1]).view(1))
    torch.testing.assert_close(lse.flatten(), torch.logsumexp(s, 0).view(1))


def test_sink_example_and_grad():
    q = torch.tensor([1.0], dtype=F64).view(1, 1, 1, 1)
    k = torch.tensor([0.0, 2.0], dtype=F64).view(1, 2, 1, 1)
    v = torch.tensor([3.0, 5.0], dtype=F64).view(1, 2, 1, 1)
    sink = torch.tensor([1.5], dtype=F64, requires_grad=True)
    out, lse = softmax_attention_ref(q, k, v, scale=1.0, sink=sink, dtype=F64)
    denom = math.exp(0.0) + math.exp(2.0) + math.exp(1.5)  # sink is not scaled and adds no value
    torch.testing.assert_close(out.flatten(), torch.tensor([(3 + 5 * math.exp(2.0)) / denom], dtype=F64))
    torch.testing.assert_close(lse.flatten(), torch.tensor([math.log(denom)], dtype=F64))
    (g,) = torch.autograd.grad(out.sum(), sink)
    assert g.item() == pytest.approx(-out.item() * math.exp(1.5) / denom)


def test_empty_rows_zero_out_and_neg_inf_lse():
    q, k, v = _rand(1, 4, 1, 4, seed=9), _rand(1, 2, 1, 4, seed=10), _rand(1, 2, 1, 4, seed=11)
    out, lse = softmax_attention_ref(q, k, v, causal=True, dtype=F64)  # rows 0, 1 see no key
    assert (out[0, :2] == 0).all() and torch.isinf(lse[0, 0, :2]).all() and (lse[0, 0, :2] < 0).all()
    assert torch.isfinite(out).all()
    qq = q.clone().requires_grad_(True)
    out2, _ = softmax_attention_ref(qq, k, v, causal=True, dtype=F64)
    (g,) = torch.autograd.grad(out2.sum(), qq)
    assert torch.isfinite(g).all() and (g[0, :2] == 0).all()


def test_grad_matches_sdpa():
    q, k, v = (_rand(2, 5, 2, 8, seed=s).requires_grad_(True) for s in (12, 13, 14))
    out, _ = softmax_attention_ref(q, k, v, causal=True, dtype=F64)
    ref = _sdpa(q, k, v, causal=True)
    do = _rand(*out.shape, seed=15)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), do), torch.autograd.grad(ref, (q, k, v), do), strict=True
    ):
        torch.testing.assert_close(a, b)


def _cu(lengths):
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window": (2, 1)}, {"softcap": 1.5}])
def test_varlen_matches_dense_per_sequence(kw):
    lq, lk = [3, 0, 5], [4, 2, 5]
    q, k, v = _rand(sum(lq), 4, 8, seed=16), _rand(sum(lk), 2, 8, seed=17), _rand(sum(lk), 2, 8, seed=18)
    sink = _rand(4, seed=19)
    out, lse = softmax_attention_varlen_ref(q, k, v, _cu(lq), _cu(lk), sink=sink, dtype=F64, **kw)
    assert out.shape == (8, 4, 8) and lse.shape == (4, 8)
    oq, ok = _cu(lq), _cu(lk)
    for b in range(3):
        if lq[b] == 0:
            continue
        qb, kb, vb = q[oq[b] : oq[b + 1]][None], k[ok[b] : ok[b + 1]][None], v[ok[b] : ok[b + 1]][None]
        ob, lb = softmax_attention_ref(qb, kb, vb, sink=sink, dtype=F64, **kw)
        torch.testing.assert_close(out[oq[b] : oq[b + 1]], ob[0])
        torch.testing.assert_close(lse[:, oq[b] : oq[b + 1]], lb[0])


def test_low_precision_baseline():
    q, k, v = (_rand(1, 16, 2, 16, seed=s, dtype=torch.float32).to(torch.bfloat16) for s in (20, 21, 22))
    base, lse = softmax_attention_ref(q, k, v, dtype=torch.bfloat16)
    exact, lse64 = softmax_attention_ref(q, k, v, dtype=F64)
    assert base.dtype == torch.bfloat16 and lse.dtype == torch.float32
    err = (base.double() - exact).abs().max().item()
    assert 0 < err < 0.03
    torch.testing.assert_close(lse.double(), lse64, rtol=1e-5, atol=1e-5)


def test_jagged_attention_window_and_max_seqlen():
    lq, lk = [5, 3], [3, 6]
    q, k, v = _rand(8, 2, 4, seed=23), _rand(9, 2, 4, seed=24), _rand(9, 2, 4, seed=25)
    out, lse = jagged_attention_ref(q, k, v, _cu(lq), _cu(lk), 4, window_size=1, dtype=F64)
    # sequence 0: top-left band |i - j| <= 1 over 3 keys; row 3 sees key 2 only; row 4 is past max_seqlen_q
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    ref = _sdpa(q[None, :4], k[None, :3], v[None, :3], attn_mask=mask)[0]
    torch.testing.assert_close(out[:4], ref)
    assert (out[4] == 0).all() and torch.isinf(lse[:, 4]).all()


def test_jagged_attention_broadcast_q():
    lq, lk = 3, [2, 5]
    q, k, v = _rand(lq, 2, 4, seed=26), _rand(7, 2, 4, seed=27), _rand(7, 2, 4, seed=28)
    out, _ = jagged_attention_ref(q, k, v, [0, lq], _cu(lk), lq, broadcast_q=True, dtype=F64)
    assert out.shape == (6, 2, 4)
    torch.testing.assert_close(out[:3], _sdpa(q[None], k[None, :2], v[None, :2])[0])
    torch.testing.assert_close(out[3:], _sdpa(q[None], k[None, 2:], v[None, 2:])[0])


@pytest.mark.parametrize("with_sink", [False, True])
def test_empty_kv_sequence_with_queries(with_sink):
    # a kv sequence of length 0 whose q sequence is not empty: out 0, lse -inf (sink: lse = sink)
    lq, lk = [2, 3], [0, 4]
    q, k, v = _rand(5, 2, 4, seed=29), _rand(4, 2, 4, seed=30), _rand(4, 2, 4, seed=31)
    sink = _rand(2, seed=32) if with_sink else None
    out, lse = softmax_attention_varlen_ref(q, k, v, _cu(lq), _cu(lk), sink=sink, dtype=F64)
    assert (out[:2] == 0).all()
    if with_sink:
        torch.testing.assert_close(lse[:, :2], sink[:, None].expand(2, 2))
    else:
        assert torch.isneginf(lse[:, :2]).all()
    ref, _ = softmax_attention_ref(q[None, 2:], k[None], v[None], sink=sink, dtype=F64)
    torch.testing.assert_close(out[2:], ref[0])
    jag, jlse = jagged_attention_ref(q, k, v, _cu(lq), _cu(lk), 3, dtype=F64)
    assert (jag[:2] == 0).all() and torch.isneginf(jlse[:, :2]).all()
    dense, dlse = softmax_attention_ref(q[None, :2], k[None, :0], v[None, :0], dtype=F64)
    assert (dense == 0).all() and torch.isneginf(dlse).all()


def test_empty_kv_sequence_gradients_are_zero():
    q = _rand(3, 1, 4, seed=33).requires_grad_(True)
    k, v = _rand(2, 1, 4, seed=34), _rand(2, 1, 4, seed=35)
    out, _ = softmax_attention_varlen_ref(q, k, v, [0, 1, 3], [0, 0, 2], dtype=F64)
    (g,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(g).all() and (g[0] == 0).all()


def test_batch_without_query_rows_keeps_the_graph():
    """No sequence has a query row: out and lse still depend on the inputs (zero gradients), so a
    gradient check of an empty batch runs; inf in the keys does not leak into them."""
    q = _rand(0, 2, 4, seed=36).requires_grad_(True)
    k = _rand(3, 1, 4, seed=37)
    k[0, 0, 0] = math.inf
    k.requires_grad_(True)
    v = _rand(3, 1, 4, seed=38).requires_grad_(True)
    out, lse = softmax_attention_varlen_ref(q, k, v, [0, 0], [0, 3], dtype=F64)
    assert out.shape == (0, 2, 4) and out.requires_grad and lse.requires_grad
    gq, gk, gv = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))
    assert gq.shape == q.shape and (gk == 0).all() and (gv == 0).all()
