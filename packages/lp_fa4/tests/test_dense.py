"""flash_attn_func on dense batches: every mask, softcap, sink, GQA, dtype and head dim it claims,
forward, LSE and gradients against the fp32 reference (Triton interpreter on a CPU)."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import Case, run_case

# (Sq, Sk) around the 16-row interpreter tile: single token, tile-1/+1, Lq < Lk, Lq > Lk
SHAPES = [(1, 1), (17, 15), (15, 33), (33, 17)]
OPTIONS = {
    "plain": {},
    "causal": dict(causal=True),
    "local": dict(window=(5, 3)),
    "left-only": dict(window=(4, None)),
    "right-only": dict(window=(None, 2)),
    "negative-side": dict(window=(-2, 6)),
    "softcap": dict(softcap=2.0),
    "sink": dict(sink=True),
    "causal-sink-softcap": dict(causal=True, sink=True, softcap=1.5),
}


# every option on two shapes (a rotation keeps the CPU suite short); plain and causal on all four
GRID = [
    (s, o) for i, o in enumerate(OPTIONS) for s in (SHAPES if i < 2 else (SHAPES[1 + i % 3], SHAPES[i % 4]))
]


@pytest.mark.parametrize("shape,opt", GRID, ids=lambda x: f"{x[0]}x{x[1]}" if isinstance(x, tuple) else x)
def test_dense_options(shape, opt, device):
    sq, sk = shape
    run_case(Case((sq, sq), (sk, sk), dense=True, heads=2, kv_heads=1, **OPTIONS[opt]), device)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1)], ids=["gqa", "mqa"])
def test_dense_gqa(heads, kv_heads, device):
    run_case(Case((17, 17), (20, 20), dense=True, heads=heads, kv_heads=kv_heads, causal=True), device)


def test_fp16_scale_and_dv(device):
    run_case(Case((17, 17), (33, 33), dense=True, dtype=torch.float16, scale=0.3, dv=16, softcap=3.0), device)


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_head_dims_forward(d, device):
    run_case(Case((17,), (19,), dense=True, d=d, grad=False, causal=d % 64 == 0), device)


@pytest.mark.parametrize("d", [64, 96, 128])
def test_head_dims_backward(d, device):
    run_case(Case((17,), (18,), dense=True, d=d, window=(7, 2)), device)


def test_window_equivalences(device):
    """(None, 0) is causal; left + right < 0 drops the window, before causal overrides right."""
    from ads_kernel_tools.testing import randn
    from lp_fa4 import flash_attn_func

    q = randn((1, 19, 2, 32), dtype=torch.bfloat16, device=device, seed=1)
    k = randn((1, 23, 2, 32), dtype=torch.bfloat16, device=device, seed=2)
    v = randn((1, 23, 2, 32), dtype=torch.bfloat16, device=device, seed=3)
    causal, _ = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(None, 0))[0], causal)
    assert torch.equal(flash_attn_func(q, k, v, causal=True, window_size=(None, 5))[0], causal)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(-1, -1))[0], flash_attn_func(q, k, v)[0])
    assert torch.equal(flash_attn_func(q, k, v, window_size=(3, -4))[0], flash_attn_func(q, k, v)[0])
    # FA2's "no window" beside causal stays causal (FA4 4.0.0b36 drops causality here: README)
    assert torch.equal(flash_attn_func(q, k, v, causal=True, window_size=(-1, -1))[0], causal)


def test_rows_without_keys_zero_and_neg_inf(device):
    """Causal with Sq > Sk: the first Sq - Sk rows see no key (0 / -inf); with a sink their LSE is
    the sink's logit (the sink is the only term of the denominator) and out stays 0."""
    from ads_kernel_tools.testing import randn
    from lp_fa4 import flash_attn_func

    q = randn((2, 21, 2, 32), dtype=torch.bfloat16, device=device, seed=4)
    k = randn((2, 5, 1, 32), dtype=torch.bfloat16, device=device, seed=5)
    v = randn((2, 5, 1, 32), dtype=torch.bfloat16, device=device, seed=6)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert (out[:, :16] == 0).all() and torch.isneginf(lse[:, :, :16]).all()
    assert torch.isfinite(lse[:, :, 16:]).all()
    sink = torch.tensor([0.5, -1.0], dtype=torch.bfloat16, device=device)
    out, lse = flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True)
    assert (out[:, :16] == 0).all()
    torch.testing.assert_close(lse[:, :, :16], sink.float()[None, :, None].expand(2, 2, 16))
