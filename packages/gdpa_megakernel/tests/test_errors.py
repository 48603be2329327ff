"""Bad inputs raise a ValueError that says what is wrong, before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ads_gdpa_megakernel import GDPABlock, gdpa_megakernel
from ads_kernel_tools.testing import lengths_to_offsets, randn

T, H, D = 6, 2, 16
N = H * D


def _base():
    q = torch.zeros(T, H, D, dtype=torch.bfloat16)
    cu = lengths_to_offsets([2, 4])
    return dict(
        q=q, k=q.clone(), v=q.clone(), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=4, max_seqlen_k=4
    )


W = torch.ones(N)
BAD = {
    "q_layernorm weight must have shape": dict(q_layernorm=(torch.ones(N + 1), None)),
    "q_layernorm bias must have shape": dict(q_layernorm=(W, torch.ones(D))),
    "q_layernorm must be None or a pair": dict(q_layernorm=W),
    "rms_norm_weight must have shape": dict(rms_norm_weight=torch.ones(H, D)),
    "rms_norm_weight must be float32": dict(rms_norm_weight=torch.ones(N, dtype=torch.int32)),
    "rms_norm=False contradicts": dict(rms_norm_weight=W, rms_norm=False),
    "rms_norm must be a bool": dict(rms_norm=1),
    "residual must have q's shape": dict(residual=torch.zeros(T, H, D + 1, dtype=torch.bfloat16)),
    "residual must have q's dtype": dict(residual=torch.zeros(T, H, D, dtype=torch.float16)),
    "residual must be a torch.Tensor": dict(residual=1.0),
    "q_residual must be a bool": dict(q_residual=1),
    "eps must be a finite real number > 0, got 0.0": dict(eps=0.0),
    "eps must be a finite real number > 0, got str '1e-5'": dict(eps="1e-5"),
    "scale must be a finite real number, got inf": dict(scale=float("inf")),
    "scale must be a finite real number, got str '0.5'": dict(scale="0.5"),
    "scale must be a finite real number, got bool True": dict(scale=True),
    "max_seqlen_q must be an integer, got 4.5": dict(max_seqlen_q=4.5),
    "unknown GDPA activation": dict(activation="softmax"),
}


@pytest.mark.parametrize("match", list(BAD))
def test_bad_option(match):
    kw = _base() | dict(activation="silu") | BAD[match]
    with pytest.raises(ValueError, match=match):
        gdpa_megakernel(**kw)


def test_block_checks_scale_and_eps():
    """The module refuses at construction what the call would refuse (it stores the floats)."""
    with pytest.raises(ValueError, match="scale must be a finite real number, got str '0.5'"):
        GDPABlock(H, D, activation="silu", scale="0.5")
    with pytest.raises(ValueError, match="eps must be a finite real number > 0"):
        GDPABlock(H, D, activation="silu", eps=-1.0)


def test_numpy_scalars_taken_like_python_numbers(device):
    """numpy.float32 scale and eps, numpy.int64 bounds: the same output as the Python numbers."""
    q, k, v = (randn((T, H, D), dtype=torch.bfloat16, device=device, seed=i) for i in range(3))
    cu = lengths_to_offsets([2, 4], device=device)
    kw = dict(activation="silu", rms_norm=True)
    want = gdpa_megakernel(q, k, v, cu, cu, 4, 4, scale=0.5, eps=2.0**-16, **kw)
    got = gdpa_megakernel(
        q, k, v, cu, cu, np.int64(4), np.int64(4), scale=np.float32(0.5), eps=np.float32(2.0**-16), **kw
    )
    assert torch.equal(got, want)


def test_bad_tensors():
    base = _base() | dict(activation="silu")
    q = base["q"]
    cases = {
        "q must be bfloat16 or float16": dict(q=q.float(), k=q.float(), v=q.float()),
        "share a dtype": dict(k=q.half()),
        r"\(tokens, heads, head_dim\)": dict(q=q[0]),
        "multiple of kv heads": dict(
            k=torch.zeros(T, 3, D, dtype=q.dtype), v=torch.zeros(T, 3, D, dtype=q.dtype)
        ),
        "head dims must be equal": dict(v=torch.zeros(T, H, 32, dtype=q.dtype)),
        "head dim 48 not supported": dict(
            q=torch.zeros(T, H, 48, dtype=q.dtype),
            k=torch.zeros(T, H, 48, dtype=q.dtype),
            v=torch.zeros(T, H, 48, dtype=q.dtype),
        ),  # fmt: skip
        "contiguous in its last": dict(k=torch.zeros(T, H, 2 * D, dtype=q.dtype)[..., ::2]),
        "cu_seqlens_q must be int32 or int64": dict(cu_seqlens_q=base["cu_seqlens_q"].float()),
        "1-D tensor of B\\+1 offsets": dict(cu_seqlens_k=torch.zeros(0, dtype=torch.int32)),
        "entries, cu_seqlens_k": dict(cu_seqlens_k=lengths_to_offsets([6])),
        "max_seqlen_q and max_seqlen_k must be >= 0": dict(max_seqlen_q=-1),
    }
    for match, over in cases.items():
        with pytest.raises(ValueError, match=match):
            gdpa_megakernel(**(base | over))


def test_bad_host_offsets_raise_from_ads_gdpa():
    """Host offsets are checked against the tensors (ads-gdpa's validator, inside the op)."""
    kw = _base() | dict(activation="silu", cu_seqlens_q_cpu=[0, 4, 2], cu_seqlens_k_cpu=[0, 4, 2])
    with pytest.raises(ValueError, match="non-decreasing"):
        gdpa_megakernel(**kw)


@pytest.mark.parametrize(
    "var,value",
    [
        ("ADS_GDPA_MK_TILE_ELEMS", "100"),
        ("ADS_GDPA_MK_MAX_BLOCK_N", "x"),
        ("ADS_GDPA_MK_REDUCE_PROGRAMS", "0"),
    ],
)
def test_bad_env_knobs(var, value, monkeypatch):
    from ads_gdpa_megakernel import config

    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        config.row_tile(512) if var != "ADS_GDPA_MK_REDUCE_PROGRAMS" else config.reduce_programs(
            torch.device("cpu")
        )
