"""Forward and every gradient (q, k, v, both norms' weights and biases, residual) against the fp32
reference composed from the tools' LayerNorm, GDPA and RMSNorm, under the baseline rule."""

from __future__ import annotations

import pytest
import torch
from _cases import Case, check, leaves, make_inputs, run_ours, run_ref

# every option on and off at least once, and each pair of neighbours together
OPTIONS = {
    "all": dict(),
    "none": dict(ln="off", q_residual=False, rms="off", residual=False),
    "ln_only": dict(q_residual=False, rms="off", residual=False),
    "ln_plain_qres": dict(ln="plain", rms="off", residual=False),
    "ln_weight_rms": dict(ln="weight", q_residual=False, residual=False),
    "qres_raw_rms": dict(ln="off"),
    "rms_plain_res": dict(ln="off", q_residual=False, rms="plain"),
    "residual_only": dict(ln="off", q_residual=False, rms="off"),
    "ln_residual": dict(q_residual=False, rms="off"),
    "qres_ln_no_rms": dict(rms="off"),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options(name, device):
    check(Case(**OPTIONS[name]), device)


@pytest.mark.parametrize("activation", ["raw", "gelu", "silu", "relu_square"])
def test_activations(activation, device):
    check(Case(activation=activation), device)


def test_fp16_mha(device):
    check(Case(dtype=torch.float16, heads=2, heads_kv=2, activation="gelu_approx"), device)


def test_mqa_bf16_weights(device):
    check(Case(heads=4, heads_kv=1, weight_dtype=torch.bfloat16, lengths=[3, 0, 17]), device)


@pytest.mark.parametrize("ln", ["affine", "plain"])
def test_column_chunks(ln, device, monkeypatch):
    """Tokens wider than one column chunk: 48 features in chunks of 32 (the second one partial),
    LayerNorm statistics merged across chunks (Chan), RMSNorm sums across chunks."""
    monkeypatch.setenv("ADS_GDPA_MK_MAX_BLOCK_N", "32")
    check(Case(heads=3, heads_kv=1, ln=ln, lengths=[9, 1, 20]), device)


def test_short_kv_cross_attention(device):
    """Jagged queries against a fixed number of keys per sequence (the short-KV shape)."""
    check(Case(lengths=[0, 1, 31, 33], lengths_k=[8, 8, 8, 8]), device)


def test_rows_past_max_seqlen_q(device):
    """Rows past max_seqlen_q take the attention output as 0 (ads-gdpa zeroes them) and still get
    the rest of the chain, as the unfused stack computes it."""
    check(Case(lengths=[20, 3, 12], max_q=10), device)


@pytest.mark.parametrize("name", ["all", "none", "ln_only"])
def test_rows_outside_every_sequence(name, device, monkeypatch):
    """Offsets that leave leading and trailing rows to no sequence (rows 0, 1 and 14..18 of 19):
    those rows take the attention output as 0 (ads-gdpa zeroes them) and the rest of the chain, with
    or without an epilogue, and their gradients follow it. Fresh allocations are NaN-filled, so a row
    left unwritten fails the comparison."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    check(Case(offsets=[2, 5, 5, 14], total=19, **OPTIONS[name]), device)


def test_empty_batch(device):
    c = Case(lengths=[0, 0])
    ins = make_inputs(c, device)
    q = ins["q"].requires_grad_()
    out = run_ours(c, ins)
    assert out.shape == (0, 2, 16)
    (g,) = torch.autograd.grad(out.float().sum(), q)
    assert g.shape == q.shape


@pytest.mark.parametrize("name", ["none", "ln_only"])
def test_empty_batch_against_the_reference(name, device):
    """No rows at all, with the options that leave nothing but the attention (or the LayerNorm) to
    carry the graph: every gradient exists and matches the reference's (zeros)."""
    check(Case(lengths=[0, 0], **OPTIONS[name]), device)


def test_layernorm_large_mean(device):
    """Features with a mean 3000x their spread: fp32 statistics by Chan's formula keep the
    LayerNorm output exact where E[x²] − E[x]² would cancel to noise."""
    c = Case(q_residual=False, rms="off", residual=False, lengths=[7, 12])
    ins = make_inputs(c, device)
    ins["q"] = (ins["q"].float() + 3000.0).to(c.dtype)
    check_ins = dict(ins)
    ours = run_ours(c, check_ins).float()
    ref = run_ref(c, check_ins)
    base = run_ref(c, check_ins, c.dtype)
    from ads_kernel_tools.tolerance import assert_close_vs_baseline

    assert_close_vs_baseline(ours, ref, base, name="out")


def test_deterministic_weight_grads(device):
    """The weight gradients come from fixed per-program partials reduced in a fixed order: two
    backward passes give the same bits."""
    c = Case()
    ins = make_inputs(c, device)
    ws = [ins[k].requires_grad_() for k in ("ln_w", "ln_b", "rms_w")]
    runs = []
    for _ in range(2):
        out = run_ours(c, ins, deterministic=True)
        runs.append(torch.autograd.grad(out, ws, ins["dout"]))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_strided_offsets_give_their_contiguous_result(device):
    """Offsets passed as strided views (a column of a matrix, ``t[::2]``) give the output and
    gradients of their contiguous copies: the kernels read them by position, so the interface hands
    them contiguous ones (strided offsets were read as the wrong entries: wrong results, no error)."""
    from _cases import _grads

    c = Case()
    ins = make_inputs(c, device)
    names = leaves(ins)
    wide = torch.zeros((ins["cu"].shape[0], 2), dtype=ins["cu"].dtype, device=device)
    wide[:, 1] = ins["cu"]
    strided = dict(ins, cu=wide[:, 1], cu_k=wide[:, 1])
    # deterministic: the default backward adds dQ by fp32 atomics, whose order varies on a GPU
    want, g_want = _grads(lambda i: run_ours(c, i, deterministic=True), ins, names, lambda t: t)
    got, g_got = _grads(lambda i: run_ours(c, i, deterministic=True), strided, names, lambda t: t)
    assert torch.equal(got, want)
    for a, b in zip(g_got, g_want, strict=True):
        assert torch.equal(a, b)
