"""Bad offsets never make a kernel leave its tensors; ADS_CHECK_INPUTS=1 turns them into errors; the
FLOP formula counts exactly the pairs a mask allows."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import ads_gdpa  # noqa: F401  (registers the ops)
from ads_gdpa import gdpa_varlen
from ads_gdpa.activations import Activation
from ads_gdpa.problem import BIG, MaskMode
from ads_kernel_tools.testing import randn

ROWS = 100
# decreasing, past the end, negative, and past int32 (int64 only): every kind of span a kernel
# would follow outside the tensors
BAD = {
    "decreasing_past_end": [0, 60, 30, 500],
    "negative_start": [-40, 20, 100],
    "huge": [0, 50, 2**40],
}


def _op_args(
    q, k, v, cu, max_len, host=None, act=Activation.FAST_GELU, mask=MaskMode.NONE, left=BIG, right=BIG
):
    return (q, k, v, cu, cu, max_len, max_len, int(act), None, 1.0, int(mask), left, right, False,
            None, None, None, host, host, False)  # fmt: skip


def _qkv(device, rows=ROWS, requires_grad=False):
    q = randn((rows, 2, 32), dtype=torch.bfloat16, device=device, seed=0, scale=0.5)
    k = randn((rows, 1, 32), dtype=torch.bfloat16, device=device, seed=1, scale=0.5)
    v = randn((rows, 1, 32), dtype=torch.bfloat16, device=device, seed=2)
    return (t.requires_grad_(requires_grad) for t in (q, k, v))


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_bad_device_offsets_stay_inside_the_tensors(monkeypatch, device, name, backend):
    """Without host offsets the op cannot read the values without a sync: it clamps them on the
    device, so forward and backward run and give finite numbers (on the GPU the memcheck run of
    this file proves no access leaves the tensors)."""
    monkeypatch.setenv("ADS_GDPA_BACKEND", backend)
    monkeypatch.delenv("ADS_CHECK_INPUTS", raising=False)
    q, k, v = _qkv(device, requires_grad=True)
    cu = torch.tensor(BAD[name], dtype=torch.int64, device=device)
    out = torch.ops.ads_gdpa.fwd(*_op_args(q, k, v, cu, 512))
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t).all()


@pytest.mark.parametrize("name", list(BAD))
def test_check_inputs_raises_on_device_offsets(monkeypatch, device, name):
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")
    q, k, v = _qkv(device)
    cu = torch.tensor(BAD[name], dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="ads_gdpa: cu_seqlens_q"):
        torch.ops.ads_gdpa.fwd(*_op_args(q, k, v, cu, 512))


def test_check_inputs_bounds_key_lengths(monkeypatch, device):
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")
    q, k, v = _qkv(device)
    cu = torch.tensor([0, 70, 100], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="cu_seqlens_k: sequence 0 has 70 rows > max_seqlen_k=64"):
        torch.ops.ads_gdpa.fwd(*_op_args(q, k, v, cu, 64))


def test_host_offsets_are_checked_whatever_the_switch(monkeypatch):
    monkeypatch.delenv("ADS_CHECK_INPUTS", raising=False)
    q, k, v = _qkv("cpu")
    cu = torch.tensor([0, 60, 30, 100])
    with pytest.raises(ValueError, match="non-decreasing"):
        gdpa_varlen(q, k, v, cu, cu, 100, 100)


@pytest.mark.parametrize(
    "mask,expected",
    [
        (dict(causal=True), 2 * (64 * 65 // 2)),  # two causal 64-token sequences: 2080 pairs each
        (dict(window_size=3), 2 * sum(min(i + 3, 63) - max(i - 3, 0) + 1 for i in range(64))),
        (dict(local_window=(5, 0)), 2 * sum(min(i, 5) + 1 for i in range(64))),
    ],
    ids=["causal", "symmetric_window", "local"],
)
def test_flops_count_the_allowed_pairs_exactly(device, mask, expected):
    q, k, v = _qkv(device, rows=128)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=device)
    host = dict(cu_seqlens_q_cpu=cu.cpu(), cu_seqlens_k_cpu=cu.cpu())
    with FlopCounterMode(display=False) as fc:
        gdpa_varlen(q, k, v, cu, cu, 64, 64, **host, **mask)
    assert fc.get_total_flops() == 2 * 2 * (32 + 32) * expected


def test_flops_of_a_causal_64_64_batch_match_the_issue(device):
    """The example of the FLOP-count report (H·D = 16, two causal 64-token sequences): 266,240 exact,
    where the old formula counted 524,288."""
    q = torch.zeros(128, 1, 16, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=device)
    host = dict(cu_seqlens_q_cpu=cu.cpu(), cu_seqlens_k_cpu=cu.cpu())
    with FlopCounterMode(display=False) as fc:
        gdpa_varlen(q, q, q, cu, cu, 64, 64, causal=True, **host)
    assert fc.get_total_flops() == 266_240
