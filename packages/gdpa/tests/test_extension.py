"""ads_gdpa.extension: the forward and backward alone, as a package building on ads-gdpa calls them."""

from __future__ import annotations

import pytest
import torch

from ads_gdpa import extension, gdpa_varlen
from ads_kernel_tools.testing import lengths_to_offsets, randn

LQ, LK = [5, 0, 17, 1], [9, 4, 17, 0]


def _inputs(device, h=4, hkv=2, d=32):
    q = randn((sum(LQ), h, d), dtype=torch.bfloat16, device=device, seed=0, scale=0.5)
    k = randn((sum(LK), hkv, d), dtype=torch.bfloat16, device=device, seed=1, scale=0.5)
    v = randn((sum(LK), hkv, d), dtype=torch.bfloat16, device=device, seed=2)
    do = randn((sum(LQ), h, d), dtype=torch.bfloat16, device=device, seed=3)
    return q, k, v, do, lengths_to_offsets(LQ, device=device), lengths_to_offsets(LK, device=device)


@pytest.mark.parametrize("host", [False, True], ids=["device-offsets", "host-offsets"])
def test_forward_and_backward_match_the_public_op(device, host):
    """The same kernels as gdpa_varlen: equal outputs, and equal gradients to its autograd (GQA,
    an empty query and an empty kv sequence included)."""
    q, k, v, do, cu_q, cu_k = _inputs(device)
    hosts = (None, None)
    if host:
        hosts = (lengths_to_offsets(LQ, dtype=torch.int64), lengths_to_offsets(LK, dtype=torch.int64))
    kw = dict(activation="fast_gelu", scale=0.5, cu_seqlens_q_cpu=hosts[0], cu_seqlens_k_cpu=hosts[1])
    out = extension.forward(q, k, v, cu_q, cu_k, max(LQ), max(LK), **kw)
    dq, dk, dv = extension.backward(do, q, k, v, cu_q, cu_k, max(LQ), max(LK), **kw, deterministic=True)

    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = gdpa_varlen(*leaves, cu_q, cu_k, max(LQ), max(LK), **kw)
    ref_grads = torch.autograd.grad(ref, leaves, do)
    torch.testing.assert_close(out, ref.detach(), rtol=0, atol=0)
    for got, want in zip((dq, dk, dv), ref_grads):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    assert out.abs().sum() > 0 and dk.abs().sum() > 0  # the comparison is not of zeros


def test_compiles_fullgraph(device):
    q, k, v, do, cu_q, cu_k = _inputs(device)

    def both(q, k, v, do):
        out = extension.forward(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="silu")
        return out, extension.backward(do, q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="silu")

    eager = both(q, k, v, do)
    compiled = torch.compile(both, fullgraph=True, backend="aot_eager")(q, k, v, do)
    torch.testing.assert_close(compiled[0], eager[0])
    for got, want in zip(compiled[1], eager[1]):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_bad_activation_raises(device):
    q, k, v, do, cu_q, cu_k = _inputs(device)
    with pytest.raises(ValueError):
        extension.forward(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="softmax")
