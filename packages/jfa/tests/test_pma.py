"""PoolingByMultiheadAttention: learned queries over jagged sequences on broadcast_q, GQA, against
the fp64 reference with the queries repeated per sequence (what a user would otherwise write)."""

from __future__ import annotations

import pytest
import torch

from ads_jfa import PoolingByMultiheadAttention
from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

LK = (5, 0, 20)


def _repeated_ref(query, k, v, lk, dtype):
    """Each sequence's own copy of the queries; dQ of the copies summed by autograd."""
    n_q = query.shape[0]
    q_rep = query.repeat(len(lk), 1, 1)
    cu_q = lengths_to_offsets([n_q] * len(lk), device=k.device)
    cu_k = lengths_to_offsets(list(lk), device=k.device)
    return softmax_attention_varlen_ref(q_rep, k, v, cu_q, cu_k, dtype=dtype)[0]


@pytest.mark.parametrize("heads,kv_heads,dtype", [(2, 2, torch.bfloat16), (4, 2, torch.float16)],
                         ids=["mha-bf16", "gqa-fp16"])  # fmt: skip
def test_pma_forward_backward(heads, kv_heads, dtype, device):
    n_q, d = 9, 32
    pma = PoolingByMultiheadAttention(n_q, heads, d, kv_heads).to(device)
    assert pma.query.dtype == torch.float32 and pma.query.shape == (n_q, heads, d)
    k = randn((sum(LK), kv_heads, d), dtype=dtype, device=device, seed=1).requires_grad_()
    v = randn((sum(LK), kv_heads, d), dtype=dtype, device=device, seed=2).requires_grad_()
    cu_k = lengths_to_offsets(list(LK), device=device)
    out = pma(k, v, cu_k, max(LK))
    assert out.shape == (len(LK) * n_q, heads, d) and out.dtype == dtype
    assert (out[n_q : 2 * n_q] == 0).all()  # the empty sequence
    do = randn(out.shape, dtype=dtype, device=device, seed=3)
    grads = torch.autograd.grad(out, (pma.query, k, v), do)

    q_in = pma.query.detach().to(dtype)  # the queries the kernel sees
    truth = [t.detach().double().requires_grad_() for t in (q_in, k, v)]
    base = [t.detach().clone().requires_grad_() for t in (q_in, k, v)]
    r_out = _repeated_ref(*truth, LK, torch.float64)
    b_out = _repeated_ref(*base, LK, dtype)
    assert_close_vs_baseline(out, r_out, b_out, name="pma out")
    r_grads = torch.autograd.grad(r_out, truth, do.double())
    b_grads = torch.autograd.grad(b_out, base, do)
    for name, g, r, b in zip(("dquery", "dk", "dv"), grads, r_grads, b_grads):
        assert_close_vs_baseline(g.to(dtype), r, b, name=f"pma {name}")
    assert grads[0].dtype == torch.float32  # the parameter's gradient in the parameter's dtype


def test_pma_module_basics(device):
    pma = PoolingByMultiheadAttention(4, 2, 16)
    assert "num_queries=4" in repr(pma) and pma.num_kv_heads == 2
    assert [n for n, _ in pma.named_parameters()] == ["query"]
    assert "query_offset" not in pma.state_dict()  # derived from num_queries, not saved
    assert pma.query_offset.tolist() == [0, 4]
    pma = pma.to(device=device, dtype=torch.bfloat16)
    assert pma.query.dtype == torch.bfloat16 and pma.query_offset.dtype == torch.int32
    k = randn((7, 2, 16), dtype=torch.bfloat16, device=device)
    out = pma(k, k, lengths_to_offsets([3, 4], device=device), 4)
    assert out.shape == (8, 2, 16)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_queries=0, num_heads=2, head_dim=16), "num_queries"),
        (dict(num_queries=4, num_heads=3, head_dim=16, num_kv_heads=2), "multiple"),
        (dict(num_queries=4, num_heads=2, head_dim=True), "head_dim"),
    ],
)
def test_pma_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PoolingByMultiheadAttention(**kwargs)


def test_pma_bad_key(device):
    pma = PoolingByMultiheadAttention(4, 2, 16, 1)
    k = randn((7, 2, 16), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="expected"):
        pma(k, k, lengths_to_offsets([3, 4], device=device), 4)
    with pytest.raises(ValueError, match="3-D"):
        pma(k[0], k[0], lengths_to_offsets([3, 4], device=device), 4)
