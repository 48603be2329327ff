"""Tests of the block-attention, rotary and fused-projection references."""

from __future__ import annotations

import math

import pytest
import torch

from ads_kernel_tools.reference.block import (
    block_attention_ref,
    block_diagonal_mask,
    qkv_proj_rotary_block_attention_ref,
    rotary_interleaved_ref,
)

F64 = torch.float64


def _rand(*shape, seed, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _cu(lengths):
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


def _dense_block_softmax(q, k, v, mask, scale):
    """Whole-batch attention with a dense (T, T) boolean mask, GQA expanded by hand."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    p = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1)
    return torch.einsum("hij,jhd->ihd", p, v)


def test_block_diagonal_mask_hand_built():
    # lengths [3, 2] with block 2: blocks {0,1}, {2}, {3,4}
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_diagonal_mask([0, 3, 5], block_size=2), expected)


@pytest.mark.parametrize("lengths", [[130], [1, 63, 64, 65, 0, 128]])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2)])
def test_block_attention_matches_dense_mask(lengths, heads, kv_heads):
    t = sum(lengths)
    q, k, v = _rand(t, heads, 16, seed=0), _rand(t, kv_heads, 16, seed=1), _rand(t, kv_heads, 16, seed=2)
    out = block_attention_ref(q, k, v, torch.tensor(_cu(lengths), dtype=torch.int32), dtype=F64)
    mask = block_diagonal_mask(_cu(lengths))
    torch.testing.assert_close(out, _dense_block_softmax(q, k, v, mask, 1 / math.sqrt(16)))


def test_block_attention_one_sequence_small_blocks_and_scale():
    q, k, v = _rand(10, 1, 4, seed=3), _rand(10, 1, 4, seed=4), _rand(10, 1, 4, seed=5)
    out = block_attention_ref(q, k, v, [0, 10], block_size=4, scale=0.7, dtype=F64)
    mask = block_diagonal_mask([0, 10], block_size=4)
    torch.testing.assert_close(out, _dense_block_softmax(q, k, v, mask, 0.7))
    # a single-token block attends only to itself: output equals v
    torch.testing.assert_close(block_attention_ref(q, k, v, [0, 10], block_size=1, dtype=F64), v)


def test_block_attention_grads_match_dense():
    q, k, v = (_rand(70, 2, 8, seed=s).requires_grad_(True) for s in (6, 7, 8))
    out = block_attention_ref(q, k, v, [0, 5, 70], dtype=F64)
    ref = _dense_block_softmax(q, k, v, block_diagonal_mask([0, 5, 70]), 1 / math.sqrt(8))
    do = _rand(70, 2, 8, seed=9)
    got = torch.autograd.grad(out, (q, k, v), do)
    exp = torch.autograd.grad(ref, (q, k, v), do)
    for a, b in zip(got, exp, strict=True):
        torch.testing.assert_close(a, b)


def test_block_attention_low_precision_baseline():
    q, k, v = (_rand(100, 2, 64, seed=s, dtype=torch.float32).to(torch.bfloat16) for s in (10, 11, 12))
    base = block_attention_ref(q, k, v, [0, 37, 100], dtype=torch.bfloat16)
    exact = block_attention_ref(q, k, v, [0, 37, 100], dtype=F64)
    assert base.dtype == torch.bfloat16
    err = (base.double() - exact).abs().max().item()
    assert 0 < err < 0.02


def test_rotary_one_token_by_hand():
    # D = 4: pairs (x0, x1) and (x2, x3); sinu_pos = [s0, s1, c0, c1]
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 4)
    s0, s1, c0, c1 = 0.6, 1.0, 0.8, 0.0
    sinu = torch.tensor([[s0, s1, c0, c1]])
    expected = torch.tensor(
        [1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1]
    )  # = [-0.4, 2.2, -4, 3]
    y = rotary_interleaved_ref(x, sinu)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.view(4), expected)


def test_rotary_is_a_rotation_per_pair():
    theta = _rand(5, 8, seed=13)
    sinu = torch.cat([theta.sin(), theta.cos()], dim=1)
    x = _rand(5, 3, 16, seed=14)
    y = rotary_interleaved_ref(x, sinu)
    assert y.dtype == F64
    norms = lambda t: t.view(5, 3, 8, 2).norm(dim=-1)
    torch.testing.assert_close(norms(y), norms(x))
    # the inverse rotation (negated sin) undoes it
    back = rotary_interleaved_ref(y, torch.cat([-theta.sin(), theta.cos()], dim=1))
    torch.testing.assert_close(back, x)


@pytest.mark.parametrize("rotate_v", [True, False])
def test_fused_projection_matches_unfused(rotate_v):
    lengths, heads, d = [70, 3], 3, 8
    t, hidden = sum(lengths), heads * d
    x = _rand(t, hidden, seed=15).requires_grad_(True)
    w = (0.2 * _rand(hidden, 3 * heads * d, seed=16)).requires_grad_(True)
    bias = _rand(3 * heads * d, seed=17).requires_grad_(True)
    theta = _rand(t, d // 2, seed=18)
    sinu = torch.cat([theta.sin(), theta.cos()], dim=1)
    out = qkv_proj_rotary_block_attention_ref(
        x, w, sinu, _cu(lengths), num_heads=heads, bias=bias, rotate_v=rotate_v, dtype=F64
    )
    assert out.shape == (t, heads, d) and out.dtype == F64
    qkv = x @ w + bias
    q, k, v = (qkv[:, i * heads * d : (i + 1) * heads * d].view(t, heads, d) for i in range(3))
    q, k = rotary_interleaved_ref(q, sinu), rotary_interleaved_ref(k, sinu)
    if rotate_v:
        v = rotary_interleaved_ref(v, sinu)
    ref = _dense_block_softmax(q, k, v, block_diagonal_mask(_cu(lengths)), 1 / math.sqrt(d))
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.sum(), (x, w, bias))
    ref_grads = torch.autograd.grad(ref.sum(), (x, w, bias))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_fused_projection_gqa_layout():
    t, heads, kv_heads, d = 6, 4, 2, 4
    x, w = _rand(t, 16, seed=19), _rand(16, (heads + 2 * kv_heads) * d, seed=20)
    sinu = torch.cat([torch.zeros(t, d // 2), torch.ones(t, d // 2)], dim=1).double()  # identity rotary
    out = qkv_proj_rotary_block_attention_ref(
        x, w, sinu, [0, t], num_heads=heads, num_kv_heads=kv_heads, dtype=F64
    )
    qkv = x @ w
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    torch.testing.assert_close(out, block_attention_ref(q, k, v, [0, t], dtype=F64))
    with pytest.raises(ValueError):
        qkv_proj_rotary_block_attention_ref(
            x, w[:, :-1], sinu, [0, t], num_heads=heads, num_kv_heads=kv_heads
        )
