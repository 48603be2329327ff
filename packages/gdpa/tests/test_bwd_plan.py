"""The Hopper backwards' shared host plan (``ads_gdpa.bwd_plan``): what a launch gets, on the CPU
(the tile list's kernel runs under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from ads_gdpa.bwd_plan import plan_kv_tiles
from ads_kernel_tools.testing import lengths_to_offsets

DTYPES = (torch.bfloat16, torch.float16)


def _args(lens_q, lens_k, h=4, h_kv=2, d=64, dtype=torch.bfloat16, device="cpu"):
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(tk, h_kv, d, dtype=dtype, device=device) for _ in range(2))
    do = torch.randn(tq, h, d, dtype=dtype, device=device)
    dq_acc = torch.zeros(tq, h, d, dtype=torch.float32, device=device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cu_q, cu_k = lengths_to_offsets(lens_q).to(device), lengths_to_offsets(lens_k).to(device)
    return do, q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dq_acc, dk, dv


def test_plan_holds_the_launch(device):
    lens_q, lens_k = [130, 0, 1, 300], [129, 5, 0, 257]
    do, q, k, v, cu_q, cu_k, mq, mk, dq_acc, dk, dv = _args(lens_q, lens_k, device=device)
    p = plan_kv_tiles(
        do, q.transpose(0, 1).contiguous().transpose(0, 1), k, v, cu_q.long(), cu_k, mq, mk, dq_acc, dk, dv,
        block_n=128, dtypes=DTYPES,
    )  # fmt: skip
    assert p is not None
    assert (p.heads, p.kv_heads, p.group, p.head_dim) == (4, 2, 2, 64)
    assert p.q.is_contiguous() and p.cu_q.dtype == torch.int32 and p.cu_k.dtype == torch.int32
    assert p.n_kv_tiles == 3  # ceil(300 / 128)
    assert p.programs <= 4 * 2 * 3
    # one entry per (sequence, kv head, kv tile) with keys, queries or not (dK/dV rows of a sequence
    # without queries are still written, as zeros): sequences 0 (2 tiles), 1 (1) and 3 (3), two kv
    # heads each; sequence 2 has no keys
    assert int(p.count[0]) == (2 + 1 + 3) * 2


def test_negative_max_seqlen_q_counts_as_zero(device):
    do, q, k, v, cu_q, cu_k, _, mk, dq_acc, dk, dv = _args([64, 10], [64, 10], device=device)
    p = plan_kv_tiles(do, q, k, v, cu_q, cu_k, -5, mk, dq_acc, dk, dv, block_n=128, dtypes=DTYPES)
    assert p.max_seqlen_q == 0


@pytest.mark.parametrize("lens_q, lens_k", [([], []), ([3], [0])])
def test_nothing_to_launch(lens_q, lens_k):
    if not lens_q:
        z = torch.zeros(0, 2, 64, dtype=torch.bfloat16)
        args = (z, z, z, z, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 0, 0,
                z.float(), z, z)  # fmt: skip
    else:
        args = _args(lens_q, lens_k)
    assert plan_kv_tiles(*args, block_n=128, dtypes=DTYPES) is None


def test_contract_is_checked():
    do, q, k, v, cu_q, cu_k, mq, mk, dq_acc, dk, dv = _args([64], [64], dtype=torch.float32)
    with pytest.raises(AssertionError):
        plan_kv_tiles(do, q, k, v, cu_q, cu_k, mq, mk, dq_acc, dk, dv, block_n=128, dtypes=DTYPES)
