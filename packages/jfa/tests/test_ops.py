"""torch.library integration through our API: opcheck of the engine op with the arguments
jagged_flash_attention passes, torch.compile(fullgraph=True) forward and backward (functions and the
PMA module), FLOP counts, determinism and poisoned buffers."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ads_jfa import PoolingByMultiheadAttention, jagged_flash_attention
from ads_jfa.fbgemm import jagged_flash_attention_basic
from ads_kernel_tools.bench import flops
from ads_kernel_tools.testing import lengths_to_offsets, randn

BF = torch.bfloat16
LQ, LK = (5, 17, 0), (16, 3, 9)


def _inputs(device, heads=2, kv_heads=1, d=32, lq=LQ, lk=LK):
    q = randn((sum(lq), heads, d), dtype=BF, device=device, seed=0)
    k = randn((sum(lk), kv_heads, d), dtype=BF, device=device, seed=1)
    v = randn((sum(lk), kv_heads, d), dtype=BF, device=device, seed=2)
    return q, k, v, lengths_to_offsets(list(lq), device=device), lengths_to_offsets(list(lk), device=device)


class _Capture(TorchDispatchMode):
    """Records the engine op calls our API makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.lp_fa4.fwd.default:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["window", pytest.param("broadcast_q", marks=pytest.mark.gpu)])
def test_opcheck_engine_op_with_our_arguments(mode, device):
    q, k, v, cu_q, cu_k = _inputs(device, heads=4, kv_heads=2, d=16, lq=(3, 6), lk=(5, 2))
    kw = dict(window_size=1) if mode == "window" else dict(broadcast_q=True)
    if mode == "broadcast_q":
        q, cu_q = q[:3], torch.tensor([0, 3], dtype=torch.int32, device=device)
    with _Capture() as cap:
        jagged_flash_attention(q, k, v, cu_q, cu_k, 4, 5, **kw)
    assert len(cap.calls) == 1
    args = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
            for a in cap.calls[0]]  # fmt: skip
    torch.library.opcheck(torch.ops.lp_fa4.fwd.default, tuple(args))


def _loss(out, lse):
    return out.float().square().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()


def test_compile_fullgraph_fwd_bwd(device):
    q, k, v, cu_q, cu_k = _inputs(device, heads=4, kv_heads=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def f(q, k, v):
        out, lse = jagged_flash_attention(q, k, v, cu_q, cu_k, 12, max(LK), window_size=4, return_lse=True)
        return _loss(out, lse)

    eager = torch.autograd.grad(f(*leaves), leaves)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(*leaves), leaves)
    for a, b in zip(eager, got):
        assert torch.equal(a, b)


def test_compile_fullgraph_pma_and_fbgemm(device):
    pma = PoolingByMultiheadAttention(6, 2, 32, 1).to(device)
    _, k, v, _, cu_k = _inputs(device)
    compiled = torch.compile(pma, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(k, v, cu_k, max(LK)), pma(k, v, cu_k, max(LK)))
    x = randn((sum(LK), 32), dtype=BF, device=device)

    def fb(x):
        return jagged_flash_attention_basic(x, x, x, cu_k, 8, use_mask=True)

    assert torch.equal(torch.compile(fb, fullgraph=True, backend="aot_eager")(x), fb(x))


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def test_flops_uniform_lengths_window(device):
    """Equal lengths: the engine's count is exact, and a window counts only the band (key length
    min(L, 2W+1) in the interior)."""
    q, k, v, cu, _ = _inputs(device, lq=(12, 12), lk=(12, 12))
    for w in (None, 0, 3):
        got = _counted(lambda w=w: jagged_flash_attention(q, q, q, cu, cu, 12, 12, window_size=w))
        assert got == flops.attention_fwd([12, 12], [12, 12], 2, 32, symmetric_window=w), w


def test_deterministic_backward_repeatable(device):
    q, k, v, cu_q, cu_k = _inputs(device, heads=4, kv_heads=2, d=16)
    do = randn((sum(LQ), 4, 16), dtype=BF, device=device, seed=5)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = jagged_flash_attention(*leaves, cu_q, cu_k, 17, 16, window_size=5, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, do))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_poisoned_buffers(device):
    """Uninitialised memory filled with NaN: rows outside every sequence (the offsets do not span q)
    are written as 0 / -inf, all others finite; gradients finite and zero outside the sequences."""
    q, k, v, cu_q, cu_k = _inputs(device)
    extra = 4
    q = torch.cat([q, q[:extra]]).requires_grad_()
    k, v = (t.clone().requires_grad_() for t in (k, v))
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        out, lse = jagged_flash_attention(q, k, v, cu_q, cu_k, 9, 16, window_size=3, return_lse=True)
        grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    finally:
        torch.use_deterministic_algorithms(False)
    for t in (out, *grads):
        assert torch.isfinite(t).all()
    assert not torch.isnan(lse).any()
    tail = slice(sum(LQ), sum(LQ) + extra)
    assert (out[tail] == 0).all() and torch.isneginf(lse[:, tail]).all() and (grads[0][tail] == 0).all()
