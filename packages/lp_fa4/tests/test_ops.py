"""torch.library integration (opcheck, torch.compile(fullgraph=True), FLOP counter), determinism,
poisoned outputs, and kernels that stay inside their tensors whatever the offsets and page tables say."""

from __future__ import annotations

import math

import pytest
import torch

from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.testing import assert_rows_written, lengths_to_offsets, randn
from lp_fa4 import _ops, flash_attn_func, flash_attn_varlen_func, jagged_attention
from lp_fa4.triton import launch

BF = torch.bfloat16
LQ, LK = (5, 17, 0), (16, 3, 9)


def _inputs(device, heads=2, kv_heads=1, d=32, grad=False):
    q = randn((sum(LQ), heads, d), dtype=BF, device=device, seed=0).requires_grad_(grad)
    k = randn((sum(LK), kv_heads, d), dtype=BF, device=device, seed=1).requires_grad_(grad)
    v = randn((sum(LK), kv_heads, d), dtype=BF, device=device, seed=2).requires_grad_(grad)
    return q, k, v, lengths_to_offsets(list(LQ), device=device), lengths_to_offsets(list(LK), device=device)


def _op_args(device, sink=True, lse_dense=False):
    q, k, v, cu_q, cu_k = _inputs(device, grad=True)
    s = torch.randn(2, dtype=BF, device=device).requires_grad_() if sink else None
    return (
        q,
        k,
        v,
        cu_q,
        cu_k,
        None,
        None,
        None,
        s,
        max(LQ),
        max(LK),
        0.2,
        0.0,
        4,
        launch.BIG,
        False,
        False,
        launch.BIG,
        lse_dense,
        sink,
        False,
    )


def test_opcheck_fwd(device):
    torch.library.opcheck(torch.ops.lp_fa4.fwd.default, _op_args(device))


def test_opcheck_bwd(device):
    args = _op_args(device)
    out, lse, _ = torch.ops.lp_fa4.fwd(*args)
    do = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    bargs = (
        do,
        *[a.detach() if isinstance(a, torch.Tensor) else a for a in (*args[:3], out, lse)],
        dlse,
        args[3],
        args[4],
        None,
        None,
        args[8].detach(),
        *args[9:19],
        True,
    )
    torch.library.opcheck(torch.ops.lp_fa4.bwd.default, bargs)


def test_compile_fullgraph_fwd_bwd(device):
    q, k, v, cu_q, cu_k = _inputs(device, grad=True)
    sink = torch.randn(2, dtype=BF, device=device, requires_grad=True)

    def f(q, k, v, sink):
        out, lse = flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(LQ), max(LK), causal=True, learnable_sink=sink, return_lse=True
        )
        return out.float().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()

    eager = torch.autograd.grad(f(q, k, v, sink), (q, k, v, sink))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v, sink), (q, k, v, sink))
    for a, b in zip(eager, got):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_compile_dense(device):
    q, k, v = (randn((2, 9, 2, 32), dtype=BF, device=device, seed=i) for i in range(3))
    compiled = torch.compile(
        lambda q, k, v: flash_attn_func(q, k, v, softcap=2.0)[0], fullgraph=True, backend="aot_eager"
    )
    assert torch.equal(compiled(q, k, v), flash_attn_func(q, k, v, softcap=2.0)[0])


def test_flop_counter(device):
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = (randn((2, 16, 2, 32), dtype=BF, device=device, seed=i).requires_grad_() for i in range(3))
    with FlopCounterMode(display=False) as fc:
        out, _ = flash_attn_func(q, k, v)
        out.sum().backward()
    fwd = 4 * 2 * 2 * 32 * 16 * 16
    assert fc.get_total_flops() == fwd + int(2.5 * fwd)
    with FlopCounterMode(display=False) as fc:
        flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
    assert fc.get_total_flops() == 2 * 2 * 2 * 32 * 2 * (16 * 17 // 2)


@pytest.mark.parametrize("mode", ["deterministic", "atomic"])
def test_backward_repeatable(mode, device, monkeypatch):
    """deterministic=True (the default dQ pass's code) is bitwise repeatable; atomic dQ agrees to
    rounding. GQA so that dK/dV sum over a head group."""
    if mode == "atomic":
        monkeypatch.setenv("LP_FA4_DQ", "atomic")
    q, k, v, cu_q, cu_k = _inputs(device, heads=4, kv_heads=2)
    do = randn((sum(LQ), 4, 32), dtype=BF, device=device, seed=5)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = flash_attn_varlen_func(
            *leaves, cu_q, cu_k, max(LQ), max(LK), causal=True, deterministic=mode == "deterministic"
        )
        runs.append(torch.autograd.grad(out, leaves, do))
    for a, b in zip(*runs):
        if mode == "atomic":
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
        else:
            assert torch.equal(a, b)


def _problem(max_q=17, max_k=16, rows_cap=launch.BIG, top_left=False):
    return launch.Problem(
        max_q=max_q,
        max_k=max_k,
        scale=0.2,
        softcap=0.0,
        win_left=launch.BIG,
        win_right=launch.BIG,
        top_left=top_left,
        broadcast_q=False,
        rows_cap=rows_cap,
    )


def test_poisoned_outputs(device):
    """Every row of every sequence is written; rows owned by no sequence keep their NaN poison."""
    q, k, v, cu_q, cu_k = _inputs(device)
    extra = 3
    out = torch.full((q.shape[0] + extra, 2, 32), math.nan, dtype=BF, device=device)
    lse = torch.full((2, q.shape[0] + extra), math.nan, dtype=torch.float32, device=device)
    used_q = torch.tensor([2, 17, 0], dtype=torch.int32, device=device)
    qq = torch.cat([q, q[:extra]])
    launch.fwd(qq, k, v, cu_q, cu_k, used_q, None, None, None, _problem(), out, lse, False)
    valid = torch.arange(out.shape[0], device=device) < q.shape[0]
    assert_rows_written(out, valid)
    # -inf is a written LSE value: only NaN means untouched
    assert not torch.isnan(lse[:, valid]).any() and torch.isnan(lse[:, ~valid]).all()
    assert (out[2:5] == 0).all() and torch.isneginf(lse[:, 2:5]).all()  # past seqused_q


def test_poisoned_grads(device):
    """Backward buffers filled with NaN where torch would leave them uninitialised: all finite."""
    q, k, v, cu_q, cu_k = _inputs(device, grad=True)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        out, lse = jagged_attention(q, k, v, cu_q, cu_k, 9, window_size=3)
        grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    finally:
        torch.use_deterministic_algorithms(False)
    for t in (out, *grads):
        assert torch.isfinite(t).all()
    assert (grads[0][5 + 9 : 5 + 17] == 0).all()  # rows past max_seqlen_q of the second sequence


@pytest.mark.parametrize(
    "cu_q,cu_k",
    [
        ([0, 5, 999, 22], [0, 16, 19, 28]),
        ([0, -7, 22, 22], [0, 40, 2, 28]),
        ([30, 2, 22, -1], [0, 16, 19, 1 << 30]),
    ],
    ids=["past-end", "negative-decreasing", "garbage"],
)
def test_bad_offsets_stay_in_bounds(cu_q, cu_k, device):
    """Offsets that lie: the kernels clamp every span to its tensor (a GPU run repeats this under
    compute-sanitizer memcheck); forward and backward finish, the rows of the clamped spans are
    finite (rows no span covers are left unwritten, as for any varlen call) and so are the
    zero-initialised gradients."""
    q, k, v, _, _ = _inputs(device, grad=True)
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=device) for x in (cu_q, cu_k))
    out, lse = flash_attn_varlen_func(q, k, v, cq, ck, 40, 40, return_lse=True)
    covered = torch.zeros(q.shape[0], dtype=torch.bool, device=device)
    rows = q.shape[0]
    for b in range(len(cu_q) - 1):
        lo = min(max(cu_q[b], 0), rows)
        covered[lo : min(max(cu_q[b + 1], lo), rows)] = True
    assert covered.any() and torch.isfinite(out[covered]).all()
    grads = torch.autograd.grad(torch.where(covered[:, None, None], out.float(), 0.0).sum(), (q, k, v))
    for t in grads:
        assert torch.isfinite(t).all()


def test_bad_page_indices_stay_in_bounds(device):
    q = randn((2, 5, 2, 32), dtype=BF, device=device, seed=1)
    kc = randn((3, 4, 1, 32), dtype=BF, device=device, seed=2)
    table = torch.tensor([[0, 7], [-5, 1 << 30]], dtype=torch.int32, device=device)
    used_k = torch.tensor([8, 1000], dtype=torch.int32, device=device)
    out, _ = flash_attn_varlen_func(q, kc, kc, page_table=table, seqused_k=used_k)
    assert torch.isfinite(out).all()
    # clamped pages: index 7 reads the last page, -5 the first
    clamped = torch.tensor([[0, 2], [0, 2]], dtype=torch.int32, device=device)
    ref, _ = flash_attn_varlen_func(q, kc, kc, page_table=clamped, seqused_k=used_k.clamp(max=8))
    assert torch.equal(out, ref)


def test_lse_unused_leaves_gradients(device):
    """A returned but unused lse changes nothing; a used one adds its term."""
    q, k, v, cu_q, cu_k = _inputs(device, grad=True)
    a, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK))
    b, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LQ), max(LK), return_lse=True)
    ga = torch.autograd.grad(a.float().sum(), (q, k, v))
    gb = torch.autograd.grad(b.float().sum(), (q, k, v), retain_graph=True)
    for x, y in zip(ga, gb):
        assert torch.equal(x, y)
    gc = torch.autograd.grad(b.float().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum(), (q, k, v))
    assert not torch.equal(gc[0], gb[0])


def test_custom_op_names():
    assert _ops.fwd_op._qualname == "lp_fa4::fwd" and _ops.bwd_op._qualname == "lp_fa4::bwd"


@pytest.mark.parametrize("d", [32, 96])
def test_tma_matches_pointer_loads(d, device, monkeypatch):
    """LP_FA4_TMA=1 (per-sequence descriptors; head dim 96 pads the 128-wide block with zeros) gives
    the same bits as the pointer loads on ragged GQA sequences, including an empty kv sequence,
    forward and backward."""
    lq, lk = (17, 1, 16), (33, 0, 15)
    q = randn((sum(lq), 4, d), dtype=BF, device=device, seed=11)
    k = randn((sum(lk), 2, d), dtype=BF, device=device, seed=12)
    v = randn((sum(lk), 2, d), dtype=BF, device=device, seed=13)
    do = randn((sum(lq), 4, d), dtype=BF, device=device, seed=14)
    cu_q, cu_k = lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lq), max(lk), causal=True, return_lse=True)
        return (out, lse, *torch.autograd.grad(out, leaves, do))

    base = run()
    monkeypatch.setenv("LP_FA4_TMA", "1")
    assert launch._tma_ok(q, k, v, do)
    for got, want in zip(run(), base):
        if interpreter_active():
            # numpy's matmul and sums block differently over a zero-padded or differently shaped
            # operand, so the interpreter's last bits depend on the host BLAS; on the GPU the
            # bits must match exactly
            torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
        else:
            assert torch.equal(got, want)


def test_eager_path_equals_custom_op(device):
    """Plain eager calls skip the op's dispatch (_EagerAttention); the op gives the same bits,
    forward, LSE and every gradient (sink included)."""
    q, k, v, cu_q, cu_k = _inputs(device)
    sink = torch.randn(2, dtype=BF, device=device)
    args = (cu_q, cu_k, None, None, None)
    opts = (max(LQ), max(LK), 0.2, 2.0, 5, 1, False, False, launch.BIG, False, True, False)
    results = []
    for fn in (_ops.attention, torch.ops.lp_fa4.fwd):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sink)]
        out, lse, _ = fn(*leaves[:3], *args, leaves[3], *opts)
        eager = "Eager" in type(out.grad_fn).__name__
        assert eager == (fn is _ops.attention), type(out.grad_fn).__name__
        loss = out.float().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()
        results.append((out, lse, *torch.autograd.grad(loss, leaves)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
