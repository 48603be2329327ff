"""Shared test helpers: seeded jagged inputs, the fp32 reference and the upstream gradient gates."""

from __future__ import annotations

import torch

from ads_block_attention import block_attention
from ads_kernel_tools.reference.block import block_attention_ref
from ads_kernel_tools.testing import lengths_to_offsets, make_generator
from ads_kernel_tools.tolerance import assert_close, assert_close_vs_baseline, sqnr_db

GRAD_RTOL, GRAD_ATOL, GRAD_SNR_DB = 0.2, 0.1, 45.0  # upstream test 1 (spec A5)


def on_gpu(device: str) -> bool:
    return device == "cuda"


def jagged_qkv(
    lengths: list[int], heads: int, heads_kv: int, head_dim: int, dtype: torch.dtype, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q (T, H, D), k/v (T, H_kv, D) leaves with grad, and int32 offsets, all on ``device``."""
    gen = make_generator(seed)
    total = sum(lengths)
    q = torch.randn(total, heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(total, heads_kv, head_dim, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(total, heads_kv, head_dim, generator=gen).to(device=device, dtype=dtype)
    offsets = lengths_to_offsets(lengths, device=device)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), offsets


def check_block_attention(
    lengths: list[int],
    *,
    heads: int,
    heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 123,
    block_size: int = 64,
    scale: float | None = None,
    offsets_dtype: torch.dtype = torch.int32,
    pass_offsets_cpu: bool = False,
) -> dict[str, float]:
    """Forward vs the bf16/fp16 baseline and backward vs the fp32 reference with the upstream gates."""
    q, k, v, offsets = jagged_qkv(lengths, heads, heads_kv, head_dim, dtype, device, seed)
    offsets = offsets.to(offsets_dtype)
    offsets_cpu = offsets.cpu() if pass_offsets_cpu else None
    out = block_attention(q, k, v, offsets, block_size=block_size, scale=scale, offsets_cpu=offsets_cpu)
    dout = torch.randn(out.shape, generator=make_generator(seed + 1)).to(device=device, dtype=dtype)
    out.backward(dout)
    assert out.shape == q.shape and out.dtype == dtype
    if out.numel() == 0:  # all sequences empty: the reference has no graph to differentiate
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        return {}

    host_offsets = offsets.cpu()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = block_attention_ref(*leaves, host_offsets, block_size=block_size, scale=scale)
    ref.backward(dout.float())
    base = block_attention_ref(
        *(t.detach() for t in (q, k, v)), host_offsets, block_size=block_size, scale=scale, dtype=dtype
    )
    if dtype == torch.float32:  # the fp32 "baseline" is the reference itself: use a plain fp32 tolerance
        assert_close(out, ref, atol=1e-4, rtol=1e-4, name="out")
    else:
        assert_close_vs_baseline(out, ref, base, name="out")
    snrs = {"out": sqnr_db(out, ref)}
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), leaves, strict=True):
        assert got.shape == want.shape
        assert_close(got, want.grad, atol=GRAD_ATOL, rtol=GRAD_RTOL, name=name)
        snrs[name] = sqnr_db(got, want.grad)
        assert snrs[name] > GRAD_SNR_DB, f"{name}: SNR {snrs[name]:.1f} dB <= {GRAD_SNR_DB} dB"
    return snrs
