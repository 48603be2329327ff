"""block_attention vs the fp32 reference: upstream gates, edge lengths, GQA, head dims, dtypes, scale."""

from __future__ import annotations

import pytest
import torch
from _cases import check_block_attention, jagged_qkv, on_gpu

from ads_block_attention import block_attention
from ads_kernel_tools.testing import jagged_lengths, make_generator


def test_upstream_jagged_bf16(device: str) -> None:
    """Upstream test 1: lengths uniform in [1, 256], D=64, bf16, seed 123 (B=64, H=4 on the GPU)."""
    batch, heads = (64, 4) if on_gpu(device) else (5, 2)
    lengths = torch.randint(1, 257, (batch,), generator=make_generator(123)).tolist()
    check_block_attention(
        lengths, heads=heads, heads_kv=heads, head_dim=64, dtype=torch.bfloat16, device=device
    )


def test_edge_lengths(device: str) -> None:
    """Empty sequences (first, middle, last) and lengths 1, 63, 64, 65, 128 in one batch."""
    lengths = [0, 1, 63, 0, 64, 65, 128, 0]
    check_block_attention(lengths, heads=2, heads_kv=2, head_dim=32, dtype=torch.bfloat16, device=device)


def test_all_empty(device: str) -> None:
    check_block_attention([0, 0, 0], heads=2, heads_kv=1, head_dim=64, dtype=torch.bfloat16, device=device)


@pytest.mark.parametrize("heads,heads_kv", [(2, 1), (4, 2)])
def test_gqa(device: str, heads: int, heads_kv: int) -> None:
    lengths = [70, 0, 33, 64] if not on_gpu(device) else jagged_lengths(32, 512, 0.7, seed=1)
    check_block_attention(
        lengths, heads=heads, heads_kv=heads_kv, head_dim=32, dtype=torch.bfloat16, device=device, seed=7
    )


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims(device: str, head_dim: int) -> None:
    lengths = [65, 20] if not on_gpu(device) else jagged_lengths(64, 1024, 0.7, seed=2)
    check_block_attention(
        lengths,
        heads=1 if not on_gpu(device) else 4,
        heads_kv=1 if not on_gpu(device) else 4,
        head_dim=head_dim,
        dtype=torch.bfloat16,
        device=device,
    )


@pytest.mark.gpu
def test_head_dim_256_gqa(device: str) -> None:
    check_block_attention(
        jagged_lengths(16, 512, 0.7, seed=3),
        heads=4,
        heads_kv=2,
        head_dim=256,
        dtype=torch.bfloat16,
        device=device,
    )


def test_fp16_int64_offsets_host_offsets(device: str) -> None:
    check_block_attention(
        [5, 64, 100],
        heads=2,
        heads_kv=2,
        head_dim=32,
        dtype=torch.float16,
        device=device,
        offsets_dtype=torch.int64,
        pass_offsets_cpu=True,
    )


def test_fp32_custom_scale(device: str) -> None:
    check_block_attention(
        [40, 90], heads=2, heads_kv=1, head_dim=32, dtype=torch.float32, device=device, scale=0.3
    )


def test_block_size_32(device: str) -> None:
    check_block_attention(
        [31, 32, 33, 0, 70],
        heads=1,
        heads_kv=1,
        head_dim=32,
        dtype=torch.bfloat16,
        device=device,
        block_size=32,
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "batch,max_len",
    [(128, 1024), pytest.param(1152, 2048, marks=pytest.mark.slow)],
    ids=["B128", "benchmark_shape"],
)
def test_real_size_d128_host_offsets(device: str, batch: int, max_len: int) -> None:
    """Real-size jagged batches (sparsity 0.7, H=4, D=128) with the exact grid size; the benchmark's
    batch (B=1152, max 2048) is marked slow."""
    check_block_attention(
        jagged_lengths(batch, max_len, 0.7, seed=0),
        heads=4,
        heads_kv=4,
        head_dim=128,
        dtype=torch.bfloat16,
        device=device,
        pass_offsets_cpu=True,
    )


@pytest.mark.gpu
def test_no_host_sync(device: str) -> None:
    """Without offsets_cpu, forward and backward never synchronise with the host (grid sized by a bound)."""
    q, k, v, offsets = jagged_qkv([0, 100, 64, 3], 4, 2, 64, torch.bfloat16, device, seed=3)
    block_attention(q, k, v, offsets).sum().backward()  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = block_attention(q, k, v, offsets)
        out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
