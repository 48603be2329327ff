"""Option combinations the per-feature tests do not reach: broadcast_q with GQA and masks, masks with
GQA and per-head activations, rows past max_seqlen_q under masks, loose max_seqlen_k, empty sides,
fp16 masks, scale with every activation in the backward, non-contiguous inputs, int64 offsets, rows
owned by no sequence, huge window sides, and the dense / upstream wrappers."""

from __future__ import annotations

import pytest
import torch
from gdpa_testlib import Case, make_inputs, run_case

from ads_gdpa import gdpa, gdpa_varlen, generalized_dot_product_attention
from ads_kernel_tools.reference.gdpa import ACTIVATIONS, gdpa_dense_ref, gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

MASKS = {
    "w3": dict(window=3),
    "causal": dict(causal=True),
    "local5_2": dict(local=(5, 2)),
    "causal_local": dict(causal=True, local=(7, None)),
}


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
def test_broadcast_q_gqa(deterministic, device):
    # dQ sums over every kv sequence and over the G query heads' shared kv head
    run_case(Case(lq=(19,), lk=(7, 0, 35), heads=4, kv_heads=2, act="silu", broadcast_q=True,
                  deterministic=deterministic), device)  # fmt: skip


@pytest.mark.parametrize("mask", ["w3", "causal"])
def test_broadcast_q_masks_clamped(mask, device):
    run_case(Case(lq=(37,), lk=(20, 40), heads=2, kv_heads=1, act="gelu", broadcast_q=True, max_q=33,
                  **MASKS[mask]), device)  # fmt: skip


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
def test_masks_gqa_per_head(mask, deterministic, device):
    # heads 0 and 1 share kv head 0 but use different activations; heads 2, 3 use the default
    case = Case(lq=(33, 5, 40), lk=(21, 40, 40), heads=4, kv_heads=2, act="gelu",
                per_head=("relu", "hardswish"), deterministic=deterministic, **MASKS[mask])  # fmt: skip
    run_case(case, device)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
def test_masks_rows_past_max_seqlen_q(mask, deterministic, device):
    # bottom-right masks align on the unclamped Lq; rows >= max_seqlen_q give zero output and zero dq
    run_case(Case(lq=(45, 10, 70), lk=(30, 12, 50), max_q=20, act="silu", deterministic=deterministic,
                  **MASKS[mask]), device)  # fmt: skip


@pytest.mark.parametrize("host", [True, False], ids=["host", "nohost"])
def test_loose_max_seqlen_k(host, device):
    case = Case(lq=(9, 33), lk=(20, 3), act="gelu_approx", host=host, causal=True)
    q, k, v, cu_q, cu_k, max_q, _ = make_inputs(case, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    _check_vs_ref(case, q, k, v, cu_q, cu_k, max_q, 100, device)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
def test_empty_sides_gqa_masks(deterministic, device):
    # Lk = 0 with Lq > 0 (zero output, zero dq) and Lq = 0 with Lk > 0 (zero dk, dv), under masks
    run_case(Case(lq=(0, 20, 33, 0), lk=(17, 0, 40, 0), heads=4, kv_heads=1, act="leaky_relu",
                  local=(4, 4), deterministic=deterministic), device)  # fmt: skip


@pytest.mark.parametrize("mask", list(MASKS))
def test_fp16_masks(mask, device):
    run_case(Case(lq=(33, 7), lk=(25, 40), dtype=torch.float16, act="fast_gelu", **MASKS[mask]), device)


def test_head_dim_96_backward_gqa_window(device):
    # D = 96 is padded to BLOCK_D = 128: padded columns must stay out of dq / dk / dv
    run_case(Case(lq=(17, 34), lk=(40, 9), heads=2, kv_heads=1, d=96, act="silu", window=6), device)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_scale_every_activation_backward(act, device):
    run_case(Case(lq=(20, 33), lk=(33, 17), act=act, scale=0.3), device)


def test_deterministic_gqa_window(device):
    run_case(Case(lq=(33, 20), lk=(18, 40), heads=4, kv_heads=2, window=4, deterministic=True), device)


def _check_vs_ref(case, q, k, v, cu_q, cu_k, max_q, max_k, device, **call):
    """Kernel (fwd + bwd) vs the fp32 reference with the baseline rule on given (maybe strided) inputs."""
    common = dict(activation=case.act, scale=case.scale, window_size=case.window, causal=case.causal,
                  local_window=case.local, broadcast_q=case.broadcast_q)  # fmt: skip
    host = dict(cu_seqlens_q_cpu=cu_q.cpu(), cu_seqlens_k_cpu=cu_k.cpu()) if case.host else {}
    out = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **host, **common, **call)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = gdpa_ref(*leaves, cu_q, cu_k, max_q, max_k, **common)
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = gdpa_ref(*base_leaves, cu_q, cu_k, max_q, max_k, dtype=q.dtype, **common)
    assert_close_vs_baseline(out, ref, base, name="out")
    do = randn(out.shape, dtype=q.dtype, device=device, seed=7)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref.backward(do.float())
    base.backward(do)
    for name, g, r, b in zip("qkv", grads, leaves, base_leaves):
        assert g.shape == r.shape
        assert_close_vs_baseline(g, r.grad, b.grad, name=f"d{name}")


def test_packed_qkv_views(device):
    """q, k, v as head-strided views of one packed (T, 3, H, D) tensor: correct, not rejected."""
    lens = [13, 40]
    t, h, d = sum(lens), 2, 32
    qkv = randn((t, 3, h, d), dtype=torch.bfloat16, device=device, seed=3, scale=0.5).requires_grad_()
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2] * 2
    cu = lengths_to_offsets(lens, device=device)
    case = Case(lq=tuple(lens), act="silu", causal=True)
    _check_vs_ref(case, q, k, v, cu, cu, max(lens), max(lens), device)


def test_head_major_views(device):
    """Views of (H, T, D) tensors (token stride D, head stride T·D) give the contiguous answer."""
    case = Case(lq=(13, 40), lk=(33, 20), heads=2, kv_heads=2, act="gelu", window=5)
    q, k, v, cu_q, cu_k, max_q, max_k = make_inputs(case, device)
    qs, ks, vs = (t.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_() for t in (q, k, v))
    assert not qs.is_contiguous()
    _check_vs_ref(case, qs, ks, vs, cu_q, cu_k, max_q, max_k, device)
    kw = dict(activation="gelu", window_size=5, deterministic=True)
    out_s = gdpa_varlen(qs, ks, vs, cu_q, cu_k, max_q, max_k, **kw)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out_c = gdpa_varlen(*leaves, cu_q, cu_k, max_q, max_k, **kw)
    assert torch.equal(out_s, out_c)
    do = randn(out_c.shape, dtype=q.dtype, device=device, seed=9)
    for a, b in zip(torch.autograd.grad(out_s, (qs, ks, vs), do), torch.autograd.grad(out_c, leaves, do)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("host", [True, False], ids=["host", "nohost"])
def test_int64_offsets(host, device):
    case = Case(lq=(0, 33, 9), lk=(5, 20, 0), heads=2, kv_heads=1, act="relu_square", causal=True, host=host)
    q, k, v, cu_q, cu_k, max_q, max_k = make_inputs(case, device)
    _check_vs_ref(case, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cu_q.long(), cu_k.long(),
                  max_q, max_k, device)  # fmt: skip


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("host", [True, False], ids=["host", "nohost"])
def test_rows_owned_by_no_sequence_get_zero_grads(deterministic, host, device):
    """Offsets need not span q/k (leading and trailing rows are allowed): those rows take no part, so
    their dq / dk / dv are exactly zero, never uninitialised memory."""
    lq, lk = [9, 20], [30, 4]
    q = randn((3 + sum(lq) + 2, 2, 32), dtype=torch.bfloat16, device=device, seed=0, scale=0.5)
    k = randn((4 + sum(lk) + 5, 1, 32), dtype=torch.bfloat16, device=device, seed=1, scale=0.5)
    v = randn(k.shape, dtype=torch.bfloat16, device=device, seed=2)
    cu_q = lengths_to_offsets(lq, device=device) + 3
    cu_k = lengths_to_offsets(lk, device=device) + 4
    host_kw = dict(cu_seqlens_q_cpu=cu_q.cpu(), cu_seqlens_k_cpu=cu_k.cpu()) if host else {}
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # torch.empty gives NaN
    try:
        out = gdpa_varlen(q, k, v, cu_q, cu_k, 20, 30, activation="gelu", deterministic=deterministic,
                          **host_kw)  # fmt: skip
        do = randn(out.shape, dtype=out.dtype, device=device, seed=3)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    finally:
        torch.use_deterministic_algorithms(False)
    spans = (("dq", dq, 3, 3 + sum(lq)), ("dk", dk, 4, 4 + sum(lk)), ("dv", dv, 4, 4 + sum(lk)))
    for name, g, lo, hi in spans:
        assert torch.isfinite(g[lo:hi]).all(), name
        assert torch.all(g[:lo] == 0) and torch.all(g[hi:] == 0), f"{name}: rows outside every sequence"
    # the rows inside the sequences still meet the tolerance rule against the reference
    live = (torch.arange(out.shape[0], device=device) >= 3).view(-1, 1, 1)
    grads = {}
    for dt in (torch.float32, torch.bfloat16):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        ref = gdpa_ref(*leaves, cu_q, cu_k, 20, 30, activation="gelu", dtype=dt)
        ref.backward((do * live).to(dt))
        grads[dt] = [t.grad for t in leaves]
    for name, g, r, b in zip("qkv", (dq, dk, dv), grads[torch.float32], grads[torch.bfloat16]):
        assert_close_vs_baseline(g, r, b, name=f"d{name}")


@pytest.mark.parametrize("big", [2**31 - 1, 2**31 - 40, 1 << 40], ids=["int32max", "near", "int64"])
def test_huge_window_sides_mean_unbounded(big, device):
    """A window side larger than any length (INT_MAX is a common 'unbounded') equals no limit."""
    case = Case(lq=(33, 10), lk=(40, 33), act="silu")
    q, k, v, cu_q, cu_k, max_q, max_k = make_inputs(case, device)
    want = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="silu")
    want_causal = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="silu", causal=True)
    got = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="silu", window_size=big)
    assert torch.equal(got, want)
    got = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="silu", local_window=(big, big))
    assert torch.equal(got, want)
    got = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation="silu", causal=True,
                      local_window=(big, None))  # fmt: skip
    assert torch.equal(got, want_causal)


def test_dense_wrapper_cross_causal_grads(device):
    """Dense (B, S, H, D) with Sq != Sk and bottom-right causal, forward and backward."""
    g = torch.Generator().manual_seed(1)
    q = (torch.randn(2, 37, 2, 32, generator=g) * 0.5).to(device, torch.bfloat16).requires_grad_()
    k = (torch.randn(2, 21, 1, 32, generator=g) * 0.5).to(device, torch.bfloat16).requires_grad_()
    v = torch.randn(2, 21, 1, 32, generator=g).to(device, torch.bfloat16).requires_grad_()
    kw = dict(activation="gelu", causal=True, scale=0.5)
    out = gdpa(q, k, v, **kw)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = gdpa_dense_ref(*leaves, **kw)
    base_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base = gdpa_dense_ref(*base_leaves, dtype=torch.bfloat16, **kw)
    assert out.shape == (2, 37, 2, 32)
    assert_close_vs_baseline(out, ref, base, name="out")
    do = randn(out.shape, dtype=out.dtype, device=device, seed=4)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref.backward(do.float())
    base.backward(do)
    for name, a, r, b in zip("qkv", grads, leaves, base_leaves):
        assert_close_vs_baseline(a, r.grad, b.grad, name=f"d{name}")


@pytest.mark.parametrize("sq,sk", [(0, 5), (6, 0)])
def test_dense_wrapper_empty_dims(sq, sk, device):
    q = torch.randn(2, sq, 2, 32).to(device, torch.bfloat16)
    k = torch.randn(2, sk, 1, 32).to(device, torch.bfloat16)
    v = torch.randn(2, sk, 1, 32).to(device, torch.bfloat16)
    out = gdpa(q, k, v, activation="gelu")
    assert out.shape == (2, sq, 2, 32)
    assert torch.all(out == 0)


def test_upstream_signature_ensemble_and_window(device):
    case = Case(lq=(33, 12), lk=(20, 40), heads=4, kv_heads=2, act="raw")
    q, k, v, cu_q, cu_k, max_q, max_k = make_inputs(case, device)
    out = generalized_dot_product_attention(q, k, v, cu_q, cu_k, max_q, max_k, qk_scale=0.5,
                                            activation="gelu", window_size=3,
                                            ensemble_activation_list=[5, 10])  # fmt: skip
    kw = dict(activation="gelu", scale=0.5, window_size=3, activation_per_head=["relu", "relu_square"])
    ref = gdpa_ref(q.float(), k.float(), v.float(), cu_q, cu_k, max_q, max_k, **kw)
    base = gdpa_ref(q, k, v, cu_q, cu_k, max_q, max_k, dtype=q.dtype, **kw)
    assert_close_vs_baseline(out, ref, base, name="out")
