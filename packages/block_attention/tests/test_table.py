"""Device block table and write discipline of the kernels (poisoned outputs, nothing past a sequence end)."""

from __future__ import annotations

import math

import torch

from ads_block_attention.triton.launch import build_block_table, launch_bwd, launch_fwd, max_blocks_bound
from ads_kernel_tools.testing import assert_rows_written, lengths_to_offsets, poisoned_empty


def _expected_blocks(lengths: list[int], block: int) -> list[tuple[int, int]]:
    rows, start = [], 0
    for n in lengths:
        rows += [(start + j * block, min(block, n - j * block)) for j in range(math.ceil(n / block))]
        start += n
    return rows


def test_table_matches_python(device: str) -> None:
    lengths = [0, 1, 63, 64, 65, 0, 128, 200, 0]
    offsets = lengths_to_offsets(lengths, device=device)
    bound = max_blocks_bound(sum(lengths), len(lengths), 64)
    table = build_block_table(offsets, bound, 64).cpu()
    want = _expected_blocks(lengths, 64)
    assert table[: len(want)].tolist() == [list(r) for r in want]
    assert (table[len(want) :, 1] == 0).all()  # unused slots of the bound are skipped by the kernels


def test_table_many_sequences(device: str) -> None:
    """More sequences than one scan chunk (1024) and int64 offsets."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 140, (2500,), generator=gen).tolist()
    offsets = lengths_to_offsets(lengths, device=device, dtype=torch.int64)
    want = _expected_blocks(lengths, 64)
    table = build_block_table(offsets, len(want), 64).cpu()
    assert table.tolist() == [list(r) for r in want]


def test_poisoned_outputs(device: str) -> None:
    """Kernels write every row of every block and nothing else: rows past offsets[-1] stay NaN."""
    lengths, pad, heads, heads_kv, dim = [0, 1, 63, 65, 0], 70, 2, 1, 32
    used = sum(lengths)
    total = used + pad  # trailing rows belong to no sequence
    offsets = lengths_to_offsets(lengths, device=device)
    table = build_block_table(offsets, max_blocks_bound(used, len(lengths), 64), 64)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(total, heads, dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    k, v = (
        torch.randn(total, heads_kv, dim, generator=gen).to(device=device, dtype=torch.bfloat16)
        for _ in range(2)
    )
    valid = torch.arange(total) < used
    out = poisoned_empty(q.shape, dtype=q.dtype, device=device)
    launch_fwd(q, k, v, out, table, 0.125, 64)
    assert_rows_written(out, valid, name="out")
    dq, dk, dv = (poisoned_empty(t.shape, dtype=t.dtype, device=device) for t in (q, k, v))
    launch_bwd(torch.randn_like(q), q, k, v, dq, dk, dv, table, 0.125, 64)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert_rows_written(t, valid, name=name)
