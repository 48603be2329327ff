"""Bad inputs raise clear ValueErrors before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ads_block_attention import block_attention, qkv_proj_rotary_block_attention


def _inputs(total: int = 10, heads: int = 2, heads_kv: int = 2, dim: int = 32, dtype=torch.bfloat16):
    q = torch.randn(total, heads, dim, dtype=dtype)
    k = torch.randn(total, heads_kv, dim, dtype=dtype)
    return q, k, k.clone(), torch.tensor([0, 4, total], dtype=torch.int32)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda q, k, v, o: (q.half(), k, v, o), "dtypes differ"),
        (lambda q, k, v, o: (q.to(torch.int32), k, v, o), "unsupported dtype"),
        (lambda q, k, v, o: (q[:, :, :24], k[:, :, :24], v[:, :, :24], o), "head dim"),
        (lambda q, k, v, o: (q, k[:5], v[:5], o), r"\(T, H_kv, D\)"),
        (lambda q, k, v, o: (q[:, :1].expand(-1, 3, -1), k, v, o), "multiple of H_kv"),
        (lambda q, k, v, o: (q[0], k, v, o), r"\(T, H, D\)"),
        (lambda q, k, v, o: (q, k, v, o.float()), "int32 or int64"),
        (lambda q, k, v, o: (q, k, v, o[None]), "1-D"),
        (lambda q, k, v, o: (q, k, v, torch.tensor([0, 6, 4, 10], dtype=torch.int32)), "non-decreasing"),
        (lambda q, k, v, o: (q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32)), "end at T"),
        (lambda q, k, v, o: (q, k, v, torch.tensor([1, 4, 10], dtype=torch.int32)), "start at 0"),
    ],
)
def test_block_attention_rejects(change, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        block_attention(*change(*_inputs()))


def test_rejects_block_size_and_offsets_cpu_mismatch() -> None:
    q, k, v, offsets = _inputs()
    with pytest.raises(ValueError, match="block_size"):
        block_attention(q, k, v, offsets, block_size=48)
    with pytest.raises(ValueError, match="shared memory"):
        block_attention(*_inputs(dim=256), block_size=128)
    with pytest.raises(ValueError, match="offsets_cpu"):
        block_attention(q, k, v, offsets, offsets_cpu=torch.tensor([0, 10]))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.5", True])
def test_rejects_bad_scale(scale) -> None:
    with pytest.raises(ValueError, match="scale must be None or a finite real number, got "):
        block_attention(*_inputs(), scale=scale)
    x, w, s = torch.randn(10, 64), torch.randn(64, 4 * 32), torch.randn(10, 32)
    with pytest.raises(ValueError, match="scale must be None or a finite real number, got "):
        qkv_proj_rotary_block_attention(x, w, s, _inputs()[3], num_heads=2, num_kv_heads=1, scale=scale)


def test_numpy_scalars_taken_like_python_numbers(device: str) -> None:
    """numpy.float32 scale and numpy.int64 block_size: the output of the Python numbers."""
    q, k, v, offsets = (t.to(device) for t in _inputs())
    want = block_attention(q, k, v, offsets, block_size=64, scale=0.25)
    got = block_attention(q, k, v, offsets, block_size=np.int64(64), scale=np.float32(0.25))
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_rejects_device_mismatch() -> None:
    q, k, v, offsets = _inputs()
    with pytest.raises(ValueError, match="devices differ"):
        block_attention(q.cuda(), k, v, offsets)
    with pytest.raises(ValueError, match="offsets are on"):
        block_attention(q.cuda(), k.cuda(), v.cuda(), offsets)


def test_fused_rejects() -> None:
    x, w, s = torch.randn(10, 64), torch.randn(64, 4 * 32), torch.randn(10, 32)
    offsets = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of"):
        qkv_proj_rotary_block_attention(x, w, s, offsets, num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="do not match"):
        qkv_proj_rotary_block_attention(x[:, :32], w, s, offsets, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="sinu_pos"):
        qkv_proj_rotary_block_attention(x, w, s[:, :16], offsets, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="bias"):
        qkv_proj_rotary_block_attention(x, w, s, offsets, num_heads=2, num_kv_heads=1, bias=torch.randn(7))
    with pytest.raises(ValueError, match="one dtype"):
        qkv_proj_rotary_block_attention(x, w.double(), s, offsets, num_heads=2, num_kv_heads=1)


@pytest.mark.parametrize("bad", [[0, 6, 4, 10], [0, 4, 9], [-2, 4, 10]])
def test_check_inputs_validates_device_offsets(monkeypatch, bad) -> None:
    """The op reads device offsets only under ADS_CHECK_INPUTS=1 (one sync); then it raises what host
    offsets raise. Called through the op with no host copy, as a GPU caller would."""
    import ads_block_attention._ops  # noqa: F401  (registers the ops)

    q, k, v, _ = _inputs()
    offsets = torch.tensor(bad, dtype=torch.int32)
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")
    with pytest.raises(ValueError, match="ads_block_attention: offsets"):
        torch.ops.ads_block_attention.fwd(q, k, v, offsets, 4, 64, 1.0, None)
