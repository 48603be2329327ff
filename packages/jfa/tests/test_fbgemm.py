"""ads_jfa.fbgemm against FBGEMM's documented math (fbgemm_gpu.sll), written out here with torch ops
in fp64: shared offsets, truncation at max_seq_len, no 1/sqrt(D), output divided by max_seq_len, and
use_mask zeroing P where the query index exceeds the key index after the normalisation."""

from __future__ import annotations

import pytest
import torch

from ads_jfa.fbgemm import jagged_flash_attention_basic, multi_head_jagged_flash_attention
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

LENS = (0, 1, 15, 17, 24)  # 24 > MAX: truncated; 17 == MAX
MAX = 17


def fbgemm_math(q, k, v, offsets, max_seq_len, use_mask):
    """q, k, v (H, T, D) in the compute dtype; FBGEMM's definition, one sequence at a time."""
    out = torch.zeros_like(q)
    off = offsets.tolist()
    for b in range(len(off) - 1):
        s = off[b]
        n = min(off[b + 1] - s, max_seq_len)
        if n <= 0:
            continue
        scores = q[:, s : s + n] @ k[:, s : s + n].transpose(1, 2)
        p = torch.softmax(scores, dim=-1) / max_seq_len
        if use_mask:
            i = torch.arange(n, device=q.device)
            p = p * (i[:, None] <= i[None, :])  # P[i, j] = 0 where i > j
        out[:, s : s + n] = p @ v[:, s : s + n]
    return out


def _check(fn, q, k, v, offsets, use_mask, heads_first, dtype):
    """ours vs fbgemm_math in fp64 (truth) and in the input dtype (baseline), forward and grads."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    lift = (lambda t: t) if heads_first else (lambda t: t[None])
    drop = (lambda t: t) if heads_first else (lambda t: t[0])
    truth = [t.detach().double().requires_grad_() for t in (q, k, v)]
    base = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    r_out = drop(fbgemm_math(*(lift(t) for t in truth), offsets, MAX, use_mask))
    b_out = drop(fbgemm_math(*(lift(t) for t in base), offsets, MAX, use_mask))
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_vs_baseline(out, r_out, b_out, name="out")
    do = randn(out.shape, dtype=dtype, device=q.device, seed=9)
    grads = torch.autograd.grad(out, leaves, do)
    r_grads = torch.autograd.grad(r_out, truth, do.double())
    b_grads = torch.autograd.grad(b_out, base, do)
    for name, g, r, b in zip(("dq", "dk", "dv"), grads, r_grads, b_grads):
        assert_close_vs_baseline(g, r, b, name=name)
    return out


@pytest.mark.parametrize("use_mask", [False, True], ids=["nomask", "use_mask"])
def test_basic(use_mask, device):
    t = sum(LENS)
    q, k, v = (randn((t, 32), dtype=torch.bfloat16, device=device, seed=i) for i in range(3))
    offsets = lengths_to_offsets(list(LENS), device=device, dtype=torch.int64)  # FBGEMM's offsets dtype

    def fn(q, k, v):
        return jagged_flash_attention_basic(q, k, v, offsets, MAX, use_mask=use_mask)

    out = _check(fn, q, k, v, offsets.cpu(), use_mask, False, torch.bfloat16)
    start = sum(LENS[:-1])
    assert (out[start + MAX :] == 0).all()  # rows past max_seq_len


def test_multi_head(device):
    t = sum(LENS)
    q, k, v = (randn((2, t, 32), dtype=torch.float16, device=device, seed=i) for i in range(3))
    offsets = lengths_to_offsets(list(LENS), device=device)

    def fn(q, k, v):
        return multi_head_jagged_flash_attention(q, k, v, offsets, MAX)

    _check(fn, q, k, v, offsets.cpu(), False, True, torch.float16)


def test_max_seq_len_zero_gives_zeros(device):
    q = randn((6, 16), dtype=torch.bfloat16, device=device).requires_grad_()
    out = jagged_flash_attention_basic(q, q, q, lengths_to_offsets([2, 4], device=device), 0)
    assert (out == 0).all()
    (g,) = torch.autograd.grad(out.float().sum(), q)
    assert (g == 0).all()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(dtype=torch.float32), "no fp32/TF32 path"),
        (dict(d=12), "multiple of 8"),
        (dict(k_rows=5), "one shape"),
        (dict(offsets=[0, 3, 2]), "non-decreasing"),
        (dict(offsets=[0, 3, 9]), "spans"),
        (dict(max_seq_len=-1), "max_seq_len"),
        (dict(use_mask=1), "bools"),
    ],
)
def test_bad_inputs(change, match, device, monkeypatch):
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")  # device offsets (on a GPU) checked too
    dtype, d = change.get("dtype", torch.bfloat16), change.get("d", 16)
    q = randn((6, d), dtype=dtype, device=device)
    k = randn((change.get("k_rows", 6), d), dtype=dtype, device=device)
    offsets = torch.tensor(change.get("offsets", [0, 2, 6]), device=device)
    with pytest.raises(ValueError, match=match):
        jagged_flash_attention_basic(
            q, k, q, offsets, change.get("max_seq_len", 4), change.get("use_mask", False)
        )


def test_multi_head_needs_3d(device):
    q = randn((6, 16), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="3-D"):
        multi_head_jagged_flash_attention(q, q, q, torch.tensor([0, 6], device=device), 6)
