"""qkv_proj_rotary_block_attention vs the fp32 reference with upstream test 2's SNR gates."""

from __future__ import annotations

import pytest
import torch
from _cases import on_gpu

from ads_block_attention import qkv_proj_rotary_block_attention
from ads_kernel_tools.reference.block import qkv_proj_rotary_block_attention_ref
from ads_kernel_tools.testing import lengths_to_offsets, make_generator
from ads_kernel_tools.tolerance import sqnr_db

OUT_SNR_DB, PARAM_GRAD_SNR_DB = 35.0, 20.0  # upstream test 2 (spec A5)


def _check_fused(
    lengths: list[int],
    *,
    heads: int,
    heads_kv: int,
    head_dim: int,
    device: str,
    use_bias: bool,
    rotate_v: bool,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 123,
) -> None:
    gen = make_generator(seed)
    total, hidden = sum(lengths), heads * head_dim  # upstream infers D = hidden // H
    width = (heads + 2 * heads_kv) * head_dim
    x = torch.randn(total, hidden, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    w = (0.01 * torch.randn(hidden, width, generator=gen)).to(device=device, dtype=dtype).requires_grad_()
    bias = (
        (0.1 * torch.randn(width, generator=gen)).to(device=device, dtype=dtype).requires_grad_()
        if use_bias
        else None
    )
    sinu = torch.randn(total, head_dim, generator=gen).to(
        device=device, dtype=dtype
    )  # upstream: not real sin/cos
    offsets = lengths_to_offsets(lengths, device=device)

    out = qkv_proj_rotary_block_attention(
        x, w, sinu, offsets, num_heads=heads, num_kv_heads=heads_kv, bias=bias, rotate_v=rotate_v
    )
    dout = torch.randn(out.shape, generator=make_generator(seed + 1)).to(device=device, dtype=dtype)
    out.backward(dout)

    leaves = [t.detach().float().requires_grad_() for t in (x, w)]
    bias_ref = bias.detach().float().requires_grad_() if use_bias else None
    ref = qkv_proj_rotary_block_attention_ref(
        *leaves,
        sinu.float(),
        offsets.cpu(),
        num_heads=heads,
        num_kv_heads=heads_kv,
        bias=bias_ref,
        rotate_v=rotate_v,
    )
    ref.backward(dout.float())
    assert out.shape == (total, heads, head_dim) and out.dtype == dtype
    snr = sqnr_db(out, ref)
    assert snr > OUT_SNR_DB, f"out: SNR {snr:.1f} dB"
    grads = [("dx", x.grad, leaves[0].grad), ("dw", w.grad, leaves[1].grad)]
    if use_bias:
        grads.append(("dbias", bias.grad, bias_ref.grad))
    for name, got, want in grads:
        snr = sqnr_db(got, want)
        assert snr > PARAM_GRAD_SNR_DB, f"{name}: SNR {snr:.1f} dB"


def test_upstream_fused(device: str) -> None:
    """Upstream test 2: B=64, max_len 256, 3/3 heads, D=64, W ~ 0.01·randn (B=4, 2/2 heads on the CPU)."""
    batch, heads = (64, 3) if on_gpu(device) else (4, 2)
    lengths = torch.randint(1, 257, (batch,), generator=make_generator(5)).tolist()
    _check_fused(
        lengths, heads=heads, heads_kv=heads, head_dim=64, device=device, use_bias=False, rotate_v=True
    )


@pytest.mark.parametrize("rotate_v", [True, False])
def test_fused_gqa_bias_edges(device: str, rotate_v: bool) -> None:
    _check_fused(
        [0, 1, 63, 65, 0], heads=2, heads_kv=1, head_dim=32, device=device, use_bias=True, rotate_v=rotate_v
    )


def test_fused_fp16_d128(device: str) -> None:
    lengths = [64, 70] if not on_gpu(device) else [64, 70, 1000, 3]
    _check_fused(
        lengths,
        heads=1,
        heads_kv=1,
        head_dim=128,
        device=device,
        use_bias=True,
        rotate_v=True,
        dtype=torch.float16,
    )
