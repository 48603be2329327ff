"""Bad inputs raise ValueError with a message naming the problem."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ads_gdpa import gdpa, gdpa_varlen, generalized_dot_product_attention
from ads_kernel_tools.testing import randn


def _inputs(dtype=torch.bfloat16, d=32, dv=None, heads=2, kv_heads=1):
    q = torch.zeros(10, heads, d, dtype=dtype)
    k = torch.zeros(12, kv_heads, d, dtype=dtype)
    v = torch.zeros(12, kv_heads, dv or d, dtype=dtype)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 12], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _call(q, k, v, cu_q, cu_k, max_q=6, max_k=6, **kw):
    return gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


CASES = {
    "fp32": (lambda: _inputs(torch.float32), {}, "dtype"),
    "mixed_dtype": (lambda: (lambda t: (t[0], t[1].half(), t[2].half(), *t[3:]))(_inputs()), {},
                    "share a dtype"),
    "rank": (lambda: (lambda t: (t[0][None], *t[1:]))(_inputs()), {}, "dims"),
    "noncontig_last": (lambda: (lambda t: (t[0].transpose(1, 2).contiguous().transpose(1, 2), *t[1:]))(
        _inputs(heads=32)), {}, "contiguous"),
    "heads": (lambda: _inputs(heads=3, kv_heads=2), {}, "multiple"),
    "head_dim": (lambda: _inputs(d=80), {}, "head dims"),
    "qk_dim": (lambda: (lambda t: (t[0], t[1][..., :16].contiguous(), *t[2:]))(_inputs()), {},
               "head dims differ"),
    "offsets_float": (lambda: (lambda t: (*t[:3], t[3].float(), t[4]))(_inputs()), {}, "int32 or int64"),
    "offsets_decreasing": (lambda: (lambda t: (*t[:3], torch.tensor([0, 6, 4], dtype=torch.int32), t[4]))(
        _inputs()), {}, "non-decreasing"),
    "offsets_len": (lambda: (lambda t: (*t[:3], torch.tensor([0, 10], dtype=torch.int32), t[4]))(
        _inputs()), {},
                    "entries"),
    "activation": (lambda: _inputs(), {"activation": "softmax"}, "unknown GDPA activation"),
    "activation_id": (lambda: _inputs(), {"activation": 12}, "unknown GDPA activation"),
    "per_head_too_long": (lambda: _inputs(), {"activation_per_head": ["relu"] * 3}, "activation_per_head"),
    "window_and_causal": (lambda: _inputs(), {"window_size": 3, "causal": True}, "cannot be combined"),
    "negative_window": (lambda: _inputs(), {"window_size": -1}, ">= 0"),
    "max_k_too_small": (lambda: _inputs(), {"max_k": 3}, "max_seqlen_k"),
    "broadcast_offsets": (lambda: _inputs(), {"broadcast_q": True}, "broadcast_q"),
    "fp8_no_descale": (lambda: _inputs(torch.float8_e4m3fn), {}, "descale"),
    "float_window": (lambda: _inputs(), {"window_size": 2.7}, "window_size must be an integer"),
    "float_local_window": (lambda: _inputs(), {"local_window": (1.5, 2)}, r"local_window\[0\] must be an"),
    "local_window_one_side": (lambda: _inputs(), {"local_window": (1,)}, "local_window must be a pair"),
    "float_max_q": (lambda: _inputs(), {"max_q": 6.5}, "max_seqlen_q must be an integer"),
    "nan_scale": (lambda: _inputs(), {"scale": float("nan")}, "scale must be a finite"),
    "inf_scale": (lambda: _inputs(), {"scale": float("inf")}, "scale must be a finite"),
    "string_scale": (lambda: _inputs(), {"scale": "1"}, "scale must be a finite"),
    "bool_scale": (lambda: _inputs(), {"scale": True}, "scale must be a finite real number, got bool True"),
    "bool_window": (lambda: _inputs(), {"window_size": True}, "window_size must be an integer, got bool"),
    "numpy_float_max_k": (lambda: _inputs(), {"max_k": np.float64(6)}, "max_seqlen_k must be an integer"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises(name):
    make, kw, msg = CASES[name]
    args = make()
    with pytest.raises(ValueError, match=msg):
        _call(*args, **kw)


def test_cpu_copy_checked_without_device_read():
    q, k, v, cu_q, cu_k = _inputs()
    with pytest.raises(ValueError, match="non-decreasing"):
        _call(q, k, v, cu_q, cu_k, cu_seqlens_q_cpu=[0, 7, 5])


@pytest.mark.parametrize("host", [None, [0, 4, 10]])
def test_shared_self_attention_offsets_checked_as_key_offsets(host):
    """One offsets object (and one host copy) for queries and keys is converted once and still
    checked against the keys: max_seqlen_k, and the key tensor's rows."""
    q, _, _, cu, _ = _inputs()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    k = v = torch.zeros(10, 1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        gdpa_varlen(q, k, v, cu, cu, 6, 5, cu_seqlens_q_cpu=host, cu_seqlens_k_cpu=host)
    short = torch.zeros(8, 1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rows"):
        gdpa_varlen(q, short, short, cu, cu, 6, 6, cu_seqlens_q_cpu=host, cu_seqlens_k_cpu=host)


def test_dense_batch_mismatch():
    q = torch.zeros(2, 4, 1, 32, dtype=torch.bfloat16)
    k = torch.zeros(3, 4, 1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="batch"):
        gdpa(q, k, k)


def test_backend_env(monkeypatch):
    monkeypatch.setenv("ADS_GDPA_BACKEND", "cuda")
    with pytest.raises(ValueError, match="ADS_GDPA_BACKEND"):
        _call(*_inputs())


def test_upstream_qk_scale_checked():
    """The upstream entry refuses what float() would parse ("0.5", True) under its own argument name."""
    q, k, v, cu_q, cu_k = _inputs()
    for bad, shown in (("0.5", "str '0.5'"), (True, "bool True"), (float("nan"), "nan")):
        with pytest.raises(ValueError, match=f"qk_scale must be a finite real number, got {shown}"):
            generalized_dot_product_attention(q, k, v, cu_q, cu_k, 6, 6, qk_scale=bad)


def test_start_end_total_out_not_truncated():
    q, k, v, _, _ = _inputs()
    se = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="total_out must be an integer, got 7.5"):
        gdpa_varlen(q, k, v, se, se, 6, 6, start_end_offsets=True, total_out=7.5)


def test_numpy_scalars_taken_like_python_numbers(device):
    """numpy.float32 scale and numpy.int64 bounds and window: the output of the Python numbers."""
    q, k, v = (
        randn((10, h, 32), dtype=torch.bfloat16, device=device, seed=i) for i, h in enumerate((2, 1, 1))
    )
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    want = gdpa_varlen(q, k, v, cu_q, cu_k, 6, 5, activation="silu", scale=0.25, window_size=2)
    got = gdpa_varlen(
        q, k, v, cu_q, cu_k, np.int64(6), np.int64(5), activation="silu", scale=np.float32(0.25),
        window_size=np.int64(2),
    )  # fmt: skip
    assert torch.equal(got, want)
