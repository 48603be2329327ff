"""The Gluon kernels relaunched from the tools' launch cache (``ads_kernel_tools.kernels.launch_cache``):
the same bits as Triton's own launch, and calls that Triton specialises otherwise (offsets whose
lengths are or are not multiples of 16, another head count) reach a kernel of their own."""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.testing import lengths_to_offsets, randn
from lp_fa4 import flash_attn_varlen_func, jagged_attention
from lp_fa4.gluon import bwd_resident_sm90, bwd_sm90, fwd_sm90

CASES = [  # (kv lengths, heads, broadcast_q rows or 0)
    ([64, 128, 32], 2, 0),
    ([65, 1, 200], 2, 0),
    ([64, 128, 32], 4, 0),
    ([300, 0, 77, 128], 4, 128),
]


def _run(lengths, h, bq, device):
    d = 128
    cu = lengths_to_offsets(lengths, device=device)
    n = sum(lengths)
    k, v = (randn((n, h, d), dtype=torch.bfloat16, device=device, seed=s).requires_grad_() for s in (2, 3))
    if bq:
        q = randn((bq, h, d), dtype=torch.bfloat16, device=device, seed=1).requires_grad_()
        cu_q = lengths_to_offsets([bq], device=device)
        out, _ = jagged_attention(q, k, v, cu_q, cu, bq, max(lengths), broadcast_q=True)
    else:
        q = randn((n, h, d), dtype=torch.bfloat16, device=device, seed=1).requires_grad_()
        out, _ = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), return_lse=True)
    do = randn(out.shape, dtype=torch.bfloat16, device=device, seed=4)
    return (out, *torch.autograd.grad(out, (q, k, v), do))


@pytest.mark.gpu
@pytest.mark.sm90
def test_relaunch_gives_tritons_bits(device, monkeypatch):
    runs = []
    for switch in ("0", "1", "1"):  # Triton's path, then the first and a cached launch of each key
        monkeypatch.setenv("ADS_LAUNCH_CACHE", switch)
        runs.append([_run(*case, device) for case in CASES])
    for case, a, b, c in zip(CASES, *runs):
        for x, y, z in zip(a, b, c):
            assert torch.equal(x, y) and torch.equal(x, z), case
    assert len(fwd_sm90._FWD._kernels) >= 2 and len(bwd_sm90._BWD._kernels) >= 2
    assert len(bwd_resident_sm90._RESIDENT._kernels) >= 1
