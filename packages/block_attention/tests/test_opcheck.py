"""torch.library.opcheck, torch.compile(fullgraph=True) and the FLOP formulas of the custom ops."""

from __future__ import annotations

import pytest
import torch
from _cases import jagged_qkv
from torch.utils.flop_counter import FlopCounterMode

import ads_block_attention._ops as ops
from ads_block_attention import block_attention, qkv_proj_rotary_block_attention
from ads_kernel_tools.testing import lengths_to_offsets

LENGTHS = [0, 20, 70]


def test_opcheck_block_ops(device: str) -> None:
    q, k, v, offsets = jagged_qkv(LENGTHS, 2, 1, 32, torch.bfloat16, device, seed=0)
    args = (q, k, v, offsets, 5, 64, 0.2)
    torch.library.opcheck(ops.fwd, args)
    torch.library.opcheck(ops.fwd, (*args, lengths_to_offsets(LENGTHS, dtype=torch.int64)))
    out, table = ops.fwd(*args)
    torch.library.opcheck(
        ops.bwd, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), table, 64, 0.2)
    )


def test_opcheck_rotary_ops(device: str) -> None:
    total = sum(LENGTHS)
    qkv = torch.randn(total, 4 * 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    sinu = torch.randn(total, 32, device=device, dtype=torch.bfloat16)
    offsets = lengths_to_offsets(LENGTHS, device=device)
    args = (qkv, sinu, offsets, 5, 2, 1, True, 0.2)
    torch.library.opcheck(ops.rotary_fwd, args)
    out, table = ops.rotary_fwd(*args)
    torch.library.opcheck(ops.rotary_bwd, (torch.randn_like(out), qkv.detach(), sinu, table, 2, 1, True, 0.2))


def test_compile_fullgraph(device: str) -> None:
    q, k, v, offsets = jagged_qkv(LENGTHS, 2, 2, 32, torch.bfloat16, device, seed=1)
    eager = block_attention(q, k, v, offsets)
    eager.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    compiled = torch.compile(block_attention, fullgraph=True)
    out = compiled(q, k, v, offsets)
    out.sum().backward()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    for got, want in zip((q.grad, k.grad, v.grad), grads, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_compile_fullgraph_fused(device: str) -> None:
    total = sum(LENGTHS)
    x = torch.randn(total, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (0.05 * torch.randn(64, 4 * 32, device=device)).to(torch.bfloat16).requires_grad_()
    sinu = torch.randn(total, 32, device=device, dtype=torch.bfloat16)
    offsets = lengths_to_offsets(LENGTHS, device=device)

    def fn(x, w):
        return qkv_proj_rotary_block_attention(x, w, sinu, offsets, num_heads=2, num_kv_heads=1)

    out = torch.compile(fn, fullgraph=True)(x, w)
    out.float().square().sum().backward()
    assert x.grad is not None and w.grad is not None
    torch.testing.assert_close(out, fn(x, w), atol=2e-2, rtol=2e-2)


def test_flop_formulas(device: str) -> None:
    q, k, v, offsets = jagged_qkv(LENGTHS, 2, 1, 32, torch.bfloat16, device, seed=2)
    with FlopCounterMode(display=False) as counter:
        block_attention(q, k, v, offsets).sum().backward()
    fwd = 4 * 2 * 32 * 64 * sum(LENGTHS)
    assert counter.get_total_flops() == fwd + 2.5 * fwd


def test_compile_checks_host_offsets_without_recompiling(device: str) -> None:
    """offsets_cpu passed into a compiled function stays a graph input: new offsets reuse the graph,
    and their values are still checked (inside the op, where they are real data)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    total = sum(LENGTHS)
    q, k, v, _ = jagged_qkv(LENGTHS, 2, 1, 32, torch.bfloat16, device, seed=3)
    counter = CompileCounterWithBackend("aot_eager" if device == "cpu" else "inductor")
    torch._dynamo.reset()
    compiled = torch.compile(block_attention, fullgraph=True, backend=counter)
    for lengths in (LENGTHS, [45, 0, 45]):  # same T, different offsets
        host = lengths_to_offsets(lengths)
        offsets = host.to(device)
        torch.testing.assert_close(
            compiled(q, k, v, offsets, offsets_cpu=host), block_attention(q, k, v, offsets, offsets_cpu=host)
        )
    assert counter.frame_count == 1, "new host offsets recompiled the graph"
    short = torch.tensor([0, 20, total - 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="end at T"):
        compiled(q, k, v, short.to(device), offsets_cpu=short)
