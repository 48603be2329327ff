"""Numerics on the CPU interpreter (and on GPU when present): every activation, ragged edges, Lq != Lk,
GQA/MQA, masks, dtypes, broadcast_q, per-head activations, head dims, API wrappers."""

from __future__ import annotations

import pytest
import torch
from gdpa_testlib import Case, make_inputs, run_case

from ads_gdpa import Activation, gdpa, gdpa_varlen, generalized_dot_product_attention
from ads_kernel_tools.reference.gdpa import ACTIVATIONS
from ads_kernel_tools.testing import edge_lengths

TILE = 32  # the pinned interpreter tile (BLOCK_M = BLOCK_N = 32 forward, 16 x 32 backward)
EDGES = tuple(edge_lengths(TILE, 2 * TILE + 5))  # 0, 1, 31, 32, 33, 69


def test_activation_enum_matches_tools():
    assert tuple(a.name.lower() for a in Activation) == tuple(ACTIVATIONS)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_every_activation_fwd_bwd(act, device):
    run_case(Case(lq=(0, 1, 31, 40), lk=(3, 0, 33, 40), act=act), device)


@pytest.mark.parametrize("scale", [1.0, 1 / 40])
def test_fast_gelu_bf16_fp16_inputs(scale, device):
    # fast_gelu_bf16 works in the inputs' 16-bit type, as upstream rounds S to it before its 16-bit
    # tanh: fp16 inputs meet the fp16 rule (rounding to bf16 instead missed it by 6 %)
    case = Case(lq=(0, 1, 31, 40), lk=(3, 0, 33, 40), act="fast_gelu_bf16", dtype=torch.float16, scale=scale)
    run_case(case, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("host", [True, False], ids=["host", "nohost"])
def test_ragged_edges(dtype, host, device):
    lk = tuple(reversed(EDGES))  # Lq != Lk per sequence, including zero-length on either side
    run_case(Case(lq=EDGES, lk=lk, dtype=dtype, host=host), device)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (2, 1)], ids=["mha", "mqa"])
def test_gqa(heads, kv_heads, device):
    run_case(Case(lq=(17, 33), lk=(40, 9), heads=heads, kv_heads=kv_heads, act="silu"), device)


@pytest.mark.parametrize(
    "masks",
    [dict(window=0), dict(window=5), dict(causal=True), dict(local=(8, 2)), dict(local=(None, 4)),
     dict(causal=True, local=(6, None))],
    ids=["w0", "w5", "causal", "local8_2", "localNone_4", "causal_local"],
)  # fmt: skip
def test_masks(masks, device):
    # gelu has act'(0) = 0.5: dS must be re-masked for the masked-out entries
    run_case(Case(lq=(33, 20, 1), lk=(33, 45, 7), act="gelu", **masks), device)


def test_max_seqlen_q_clamps_rows(device):
    run_case(Case(lq=(40, 10, 35), lk=(20, 30, 35), max_q=17, act="raw"), device)


def test_max_seqlen_q_zero(device):
    run_case(Case(lq=(5, 3), max_q=0, act="raw", grad=False), device)


def test_broadcast_q(device):
    run_case(Case(lq=(21,), lk=(10, 33, 0), broadcast_q=True, act="relu"), device)


def test_activation_per_head(device):
    run_case(Case(lq=(20, 35), per_head=("relu_square",), act="gelu_approx"), device)


@pytest.mark.parametrize("d,dv", [(16, 16), (64, 64), (96, 96), (192, 128)])
def test_head_dims(d, dv, device):
    run_case(Case(lq=(9, 33), d=d, dv=dv, heads=1, kv_heads=1, act="fast_gelu"), device)


def test_scale_after_activation(device):
    run_case(Case(lq=(12, 30), scale=0.37, act="relu_square"), device)


def test_short_kv_dense(device):
    # dense KV (every Lk = max_seqlen_k <= 256) takes the one-step short-KV config
    run_case(Case(lq=(5, 40, 1), lk=(24, 24, 24), act="fast_gelu"), device)


def test_deterministic_backward_matches(device):
    run_case(Case(lq=(20, 37), lk=(33, 8), deterministic=True), device)
    run_case(Case(lq=(21,), lk=(10, 33), broadcast_q=True, deterministic=True, act="silu"), device)


def test_deterministic_is_bitwise_repeatable(device):
    case = Case(lq=(20, 37), lk=(33, 8))
    q, k, v, cu_q, cu_k, mq, mk = make_inputs(case, device)
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        gdpa_varlen(*leaves, cu_q, cu_k, mq, mk, deterministic=True).sum().backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_dense_wrapper_matches_varlen(device):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 20, 2, 32, generator=g).to(device, torch.bfloat16) * 0.5
    k = torch.randn(2, 24, 1, 32, generator=g).to(device, torch.bfloat16) * 0.5
    v = torch.randn(2, 24, 1, 32, generator=g).to(device, torch.bfloat16)
    out = gdpa(q, k, v, activation="silu", causal=True)
    cu_q = torch.tensor([0, 20, 40], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 24, 48], dtype=torch.int32, device=device)
    flat = gdpa_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 20, 24,
                       activation="silu", causal=True)  # fmt: skip
    assert out.shape == (2, 20, 2, 32)
    assert torch.equal(out.flatten(0, 1), flat)


def test_upstream_signature_defaults(device):
    case = Case(lq=(10, 20), lk=(15, 5), act="raw")
    q, k, v, cu_q, cu_k, mq, mk = make_inputs(case, device)
    out = generalized_dot_product_attention(q, k, v, cu_q, cu_k, mq, mk)  # raw, qk_scale 1.0
    ref = gdpa_varlen(q, k, v, cu_q, cu_k, mq, mk, activation="raw", scale=1.0)
    assert torch.equal(out, ref)
    out2 = generalized_dot_product_attention(q, k, v, cu_q, cu_k, mq, mk, qk_scale=0.5, activation=3,
                                             window_size=4, ensemble_activation_list=[5])  # fmt: skip
    ref2 = gdpa_varlen(q, k, v, cu_q, cu_k, mq, mk, activation="fast_gelu", scale=0.5, window_size=4,
                       activation_per_head=["relu"])  # fmt: skip
    assert torch.equal(out2, ref2)


def test_tma_descriptor_path(device, monkeypatch):
    """The TMA (tensor-descriptor) forward, forced on; the interpreter runs descriptor loads too."""
    monkeypatch.setenv("ADS_GDPA_TMA", "1")
    run_case(Case(lq=(0, 1, 33, 40), lk=(5, 0, 31, 70), grad=False, host=False), device)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a stride-2 view (every other element of a wider buffer)."""
    wide = torch.zeros((t.shape[0], 2), dtype=t.dtype, device=t.device)
    wide[:, 1] = t
    return wide[:, 1]


def test_strided_offsets_and_buckets_give_their_contiguous_result(device):
    """Offsets and encoding buckets passed as strided views (a column of a matrix, ``t[::2]``) give
    the outputs and gradients of their contiguous copies: the kernels read them by position, so the
    interface hands them contiguous ones (strided views were read as the wrong entries: wrong
    gradients, and under causal a wrong output, without an error)."""
    cu = torch.tensor([0, 13, 13, 50, 70], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(70, 2, 32, device=device).to(torch.bfloat16) for _ in range(3))
    table = torch.randn(7, 2, 32, device=device)
    buckets = torch.randint(0, 7, (70,), dtype=torch.int32, device=device)

    def run(cu, buckets):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, table)]
        a, b, c, tab = leaves
        # deterministic: the default backward adds dQ by fp32 atomics, whose order varies on a GPU
        out = gdpa_varlen(a, b, c, cu, cu, 37, 37, activation="fast_gelu", scale=1 / 37, causal=True,
                          encodings=[(tab, buckets)], deterministic=True)  # fmt: skip
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    for got, want in zip(run(_strided(cu), _strided(buckets)), run(cu, buckets), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
def test_encoding_grads_deterministic_path_sums_the_same(shared, device):
    """``deterministic=True`` forms the encoding tables' gradients by ``index_put_(accumulate=True)``
    (sorted, one fixed order) instead of ``index_add_`` (atomics on a GPU): the same sums, to fp32
    rounding, including clamped out-of-range buckets."""
    from ads_gdpa.problem import encoding_grads

    g = torch.Generator().manual_seed(3)
    dq = torch.randn(70, 2, 32, generator=g).to(device)
    table = torch.zeros((7, 32) if shared else (7, 2, 32), device=device)
    buckets = torch.randint(-2, 9, (70,), generator=g).to(device)
    want = torch.zeros(table.shape, dtype=torch.float64, device=device).index_add_(
        0, buckets.clamp(0, 6), (dq.sum(1) if shared else dq).double()
    )
    for deterministic in (False, True):
        got = encoding_grads([table], [buckets], dq, deterministic)[0]
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
