"""torch.library integration: opcheck, torch.compile(fullgraph=True), FLOP formula, poisoned outputs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import ads_gdpa  # noqa: F401  (registers the ops)
from ads_gdpa import gdpa_varlen
from ads_gdpa.activations import Activation
from ads_gdpa.problem import BIG, MaskMode, Problem
from ads_gdpa.triton import launch
from ads_kernel_tools.testing import assert_rows_written, lengths_to_offsets, randn

LQ, LK = [5, 0, 17], [9, 4, 17]


def _inputs(device, dtype=torch.bfloat16, requires_grad=False):
    q = randn((sum(LQ), 2, 32), dtype=dtype, device=device, seed=0, scale=0.5).requires_grad_(requires_grad)
    k = randn((sum(LK), 1, 32), dtype=dtype, device=device, seed=1, scale=0.5).requires_grad_(requires_grad)
    v = randn((sum(LK), 1, 32), dtype=dtype, device=device, seed=2).requires_grad_(requires_grad)
    return q, k, v, lengths_to_offsets(LQ, device=device), lengths_to_offsets(LK, device=device)


def _fwd_args(q, k, v, cu_q, cu_k, host=False, mask_mode=0):
    hq = lengths_to_offsets(LQ, dtype=torch.int64) if host else None
    hk = lengths_to_offsets(LK, dtype=torch.int64) if host else None
    act = int(Activation.FAST_GELU)
    return (q, k, v, cu_q, cu_k, max(LQ), max(LK), act, None, 1.0, int(mask_mode), BIG, BIG,
            False, None, None, None, hq, hk, False)  # fmt: skip


@pytest.mark.parametrize("host", [False, True], ids=["nohost", "host"])
def test_opcheck_fwd(host, device):
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    torch.library.opcheck(torch.ops.ads_gdpa.fwd.default, _fwd_args(q, k, v, cu_q, cu_k, host))


def test_opcheck_bwd(device):
    q, k, v, cu_q, cu_k = _inputs(device)
    do = randn(q.shape, dtype=q.dtype, device=device, seed=5)
    act, mask = int(Activation.SILU), int(MaskMode.BOTTOM_RIGHT)
    args = (do, q, k, v, cu_q, cu_k, max(LQ), max(LK), act, None, 0.5, mask, 3, 0, False, True, None, None)
    torch.library.opcheck(torch.ops.ads_gdpa.bwd.default, args)


def test_compile_fullgraph_fwd_bwd(device):
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    hq, hk = lengths_to_offsets(LQ).tolist(), lengths_to_offsets(LK).tolist()

    def f(q, k, v):
        o = gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="silu", scale=0.5,
                        cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk)  # fmt: skip
        return (o.float() * 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_e = f(q, k, v)
    grads_e = torch.autograd.grad(loss_e, (q, k, v))
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b)


def test_flop_formula_per_sequence(device):
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    hq, hk = lengths_to_offsets(LQ).tolist(), lengths_to_offsets(LK).tolist()
    with FlopCounterMode(display=False) as fc:
        o = gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk)
        o.sum().backward()
    pairs = sum(a * b for a, b in zip(LQ, LK))
    fwd = 4 * 2 * 32 * pairs
    assert fc.get_total_flops() == fwd + int(2.5 * fwd)


def test_flop_formula_bound_without_host(device):
    q, k, v, cu_q, cu_k = _inputs(device)
    with FlopCounterMode(display=False) as fc:
        gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK))
    # CPU offsets are host data already (exact count); on CUDA without copies: the max-length bound
    pairs = sum(a * b for a, b in zip(LQ, LK)) if device == "cpu" else len(LQ) * max(LQ) * max(LK)
    assert fc.get_total_flops() == 4 * 2 * 32 * pairs


def test_eager_path_matches_the_custom_op(monkeypatch, device):
    """Plain eager calls skip the dispatcher (``_ops._EagerGDPA``); results and gradients must be
    bit-identical to the registered op's, and the op must still be what runs under a dispatch mode."""
    from ads_gdpa import _ops

    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    args = _fwd_args(q, k, v, cu_q, cu_k, host=True)
    do = randn((sum(LQ), 2, 32), dtype=q.dtype, device=device, seed=7)
    ops_calls = []
    original = _ops.fwd_impl
    monkeypatch.setattr(_ops, "fwd_impl", lambda *a: (ops_calls.append(1), original(*a))[1])
    eager = _ops.gdpa_fwd(*args)
    assert ops_calls, "plain eager call did not take the eager path"
    assert eager.grad_fn is not None and "EagerGDPA" in type(eager.grad_fn).__name__
    via_op = torch.ops.ads_gdpa.fwd(*args)
    assert torch.equal(eager, via_op)
    g_eager = torch.autograd.grad(eager, (q, k, v), do)
    g_op = torch.autograd.grad(via_op, (q, k, v), do)
    for a, b in zip(g_eager, g_op):
        assert torch.equal(a, b)
    with FlopCounterMode(display=False):
        under_mode = _ops.gdpa_fwd(*args)
    assert "EagerGDPA" not in type(under_mode.grad_fn).__name__


def test_eager_backward_counted_under_a_later_flop_counter(device):
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    hq, hk = lengths_to_offsets(LQ).tolist(), lengths_to_offsets(LK).tolist()
    o = gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk)
    with FlopCounterMode(display=False) as fc:
        o.sum().backward()
    assert fc.get_total_flops() == int(2.5 * 4 * 2 * 32 * sum(a * b for a, b in zip(LQ, LK)))


def test_eager_path_refuses_double_backward(device):
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    out = gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="silu")
    (gq,) = torch.autograd.grad(out.float().pow(2).sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        gq.float().sum().backward()


@pytest.mark.parametrize("max_q", [17, 3], ids=["full", "clamped"])
def test_poisoned_output_rows(max_q, device):
    """Every row of every sequence is written (zeros past max_q); rows owned by no sequence are not."""
    q, k, v, cu_q, cu_k = _inputs(device)
    extra = 4  # trailing rows past cu_seqlens_q[-1]: no sequence owns them, they must stay NaN
    out = torch.full((q.shape[0] + extra, 2, 32), float("nan"), dtype=q.dtype, device=device)
    pb = Problem(max_q=max_q, max_k=max(LK), act=Activation.GELU, scale=1.0, mask=MaskMode.NONE,
                 win_left=BIG, win_right=BIG, broadcast_q=False)  # fmt: skip
    launch.fwd(q, k, v, cu_q, cu_k, pb, out)
    valid = torch.arange(out.shape[0], device=device) < q.shape[0]
    assert_rows_written(out, valid)
    starts = cu_q.tolist()
    for b, lq in enumerate(LQ):
        rows = out[starts[b] + min(lq, max_q) : starts[b] + lq]
        assert torch.all(rows == 0), "rows past max_seqlen_q must be zero"


@pytest.mark.parametrize("d", [32, 128])  # on an sm_90 GPU D=128 takes the Gluon forward
@pytest.mark.parametrize("host", [False, True], ids=["device-offsets", "host-offsets"])
def test_rows_no_sequence_owns_are_zero(monkeypatch, host, d, device):
    """Offsets need not span q: rows before cu_seqlens_q[0] and from cu_seqlens_q[-1] on belong to no
    sequence and come out as 0, not as ``torch.empty``'s leftovers (NaN-filled here); the sequences'
    rows equal those of the same call on the tensors cut to the spans."""
    q, k, v = (randn((sum(n), h, d), dtype=torch.bfloat16, device=device, seed=s, scale=0.5)
               for n, h, s in ((LQ, 2, 0), (LK, 1, 1), (LK, 1, 2)))  # fmt: skip
    cu_q, cu_k = lengths_to_offsets(LQ, device=device), lengths_to_offsets(LK, device=device)
    lead, tail = 3, 4
    rows = [randn((n, *q.shape[1:]), dtype=q.dtype, device=device, seed=9 + n) for n in (lead, tail)]
    qp = torch.cat([rows[0], q, rows[1]])
    cu_qp = cu_q + lead
    hosts = dict(cu_seqlens_q_cpu=cu_qp.cpu(), cu_seqlens_k_cpu=cu_k.cpu()) if host else {}
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    out = gdpa_varlen(qp, k, v, cu_qp, cu_k, max(LQ), max(LK), activation="silu", **hosts)
    monkeypatch.setattr(torch, "empty", empty)
    want = gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="silu")
    assert (out[:lead] == 0).all() and (out[lead + q.shape[0] :] == 0).all()
    assert torch.equal(out[lead : lead + q.shape[0]], want)


@pytest.mark.parametrize("deterministic", [False, True])
def test_poisoned_grads(deterministic, device):
    """Backward outputs come from torch.empty; NaN-filled allocations prove every element is written."""
    q, k, v, cu_q, cu_k = _inputs(device, requires_grad=True)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        o = gdpa_varlen(q, k, v, cu_q, cu_k, 3, max(LK), activation="gelu", deterministic=deterministic)
        dq, dk, dv = torch.autograd.grad(o.float().sum(), (q, k, v))
    finally:
        torch.use_deterministic_algorithms(False)
    for t in (o, dq, dk, dv):
        assert torch.isfinite(t).all()


def test_compile_host_offsets_are_inputs_not_constants(device):
    """CPU copies of the offsets passed into a compiled function: new offsets reuse the graph (no
    recompile, no graph break) and the op still checks their values."""
    from torch._dynamo.testing import CompileCounterWithBackend

    q, k, v, _, _ = _inputs(device)

    def f(q, k, v, cu_q, cu_k, hq, hk):
        return gdpa_varlen(q, k, v, cu_q, cu_k, max(LQ), max(LK), activation="gelu",
                           cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hk)  # fmt: skip

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager" if device == "cpu" else "inductor")
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    for order in ([0, 1, 2], [2, 0, 1]):  # same totals and maxima, different offsets
        lq, lk = [LQ[i] for i in order], [LK[i] for i in order]
        hq, hk = lengths_to_offsets(lq, dtype=torch.int64), lengths_to_offsets(lk, dtype=torch.int64)
        cu_q, cu_k = hq.to(device=device, dtype=torch.int32), hk.to(device=device, dtype=torch.int32)
        torch.testing.assert_close(compiled(q, k, v, cu_q, cu_k, hq, hk), f(q, k, v, cu_q, cu_k, hq, hk))
    assert counter.frame_count == 1, "new host offsets recompiled the graph"
    bad = torch.tensor([0, 5, 3, sum(LQ)], dtype=torch.int64)
    with pytest.raises(ValueError, match="non-decreasing"):
        compiled(q, k, v, cu_q, cu_k, bad, hk)


def test_fast_path_backward_gets_the_buffers_and_safe_offsets(monkeypatch):
    """Where the dispatcher picks the fast path, the backward op hands it zeroed buffers shaped like
    the inputs and int32 offsets; checked on the CPU with the kernel replaced by a stub."""
    from ads_gdpa import dispatch

    q, k, v, cu_q, cu_k = _inputs("cpu")
    do = torch.ones_like(q)
    seen = {}

    def fake_backward(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq_acc, dk, dv):
        assert dq_acc.dtype == torch.float32 and not dq_acc.any() and dk.shape == k.shape
        seen["offsets"] = (cu_q.dtype, cu_k.dtype)
        dq_acc.fill_(2.0)
        dk.fill_(3.0)
        dv.fill_(4.0)

    monkeypatch.setattr(dispatch, "backend_for", lambda direction, device, call: "gluon")
    monkeypatch.setattr(dispatch, "kernel", lambda backend, device, direction: fake_backward)
    hq, hk = lengths_to_offsets(LQ, dtype=torch.int64), lengths_to_offsets(LK, dtype=torch.int64)
    dq, dk, dv, _ = torch.ops.ads_gdpa.bwd(
        do, q, k, v, cu_q.long(), cu_k.long(), max(LQ), max(LK), int(Activation.FAST_GELU), None, 1.0,
        int(MaskMode.NONE), BIG, BIG, False, False, hq, hk,
    )  # fmt: skip
    assert seen["offsets"] == (torch.int32, torch.int32)
    assert dq.dtype == q.dtype and dq.shape == q.shape
    assert (dq == 2).all() and (dk == 3).all() and (dv == 4).all()
