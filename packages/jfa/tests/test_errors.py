"""Bad inputs raise a ValueError that says what and why, before any kernel runs. Offset values are
checked where the host can see them: the tests set ADS_CHECK_INPUTS=1 so that device offsets (on a
GPU) are checked too; CPU offsets are host data and always checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ads_jfa import jagged_flash_attention
from ads_kernel_tools.testing import lengths_to_offsets, randn

BF = torch.bfloat16


def _args(device, **change):
    q = randn((8, 2, 16), dtype=change.pop("dtype", BF), device=device)
    shape = (change.pop("k_rows", 6), change.pop("kv_heads", 1), change.pop("kd", 16))
    k = randn(shape, dtype=q.dtype, device=device)
    v = change.pop("v", None)
    v = k if v is None else v
    cu_q = change.pop("cu_q", lengths_to_offsets([3, 5], device=device))
    cu_k = change.pop("cu_k", lengths_to_offsets([2, 4], device=device))
    args = [q, k, v, cu_q, cu_k, change.pop("max_q", 5), change.pop("max_k", 4)]
    return args, change


CASES = {
    "q 2-D": (dict(), lambda a: a.__setitem__(0, a[0][:, 0]), "3-D"),
    "fp32": (dict(dtype=torch.float32), None, "bfloat16 or float16"),
    "dtype mix": (dict(), lambda a: a.__setitem__(2, a[2].half()), "share a dtype"),
    "heads": (dict(kv_heads=3), None, "multiple of key/value heads"),
    "head dim": (dict(kd=24), None, "head dims differ"),
    "v tokens": (dict(), lambda a: a.__setitem__(2, a[2][:5]), "agree in tokens"),
    "float offsets": (dict(cu_q=torch.tensor([0.0, 3.0, 8.0])), None, "int32 or int64"),
    "2-D offsets": (dict(cu_q=torch.zeros(2, 3, dtype=torch.int32)), None, "1-D"),
    "batch mismatch": (dict(cu_k=torch.tensor([0, 6], dtype=torch.int32)), None, "entries"),
    "max_q negative": (dict(max_q=-1), None, "max_seq_len_q"),
    "max_k float": (dict(max_k=4.0), None, "max_seq_len_kv"),
    "decreasing": (dict(cu_q=torch.tensor([0, 5, 3], dtype=torch.int32)), None, "non-decreasing"),
    "past end": (dict(cu_k=torch.tensor([0, 2, 9], dtype=torch.int32)), None, "spans"),
    "kv too long": (dict(max_k=3), None, "max_seq_len_kv=3"),
}


@pytest.fixture(autouse=True)
def _check_inputs(monkeypatch):
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")


@pytest.mark.parametrize("name", list(CASES))
def test_bad_inputs(name, device):
    change, edit, match = CASES[name]
    change = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in change.items()}
    args, rest = _args(device, **change)
    if edit is not None:
        edit(args)
    with pytest.raises(ValueError, match=match):
        jagged_flash_attention(*args, **rest)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window_size=-1), "window_size"),
        (dict(window_size=True), "window_size"),
        (dict(sm_scale=float("nan")), "sm_scale"),
        (dict(sm_scale="0.5"), "sm_scale must be None or a finite real number, got str '0.5'"),
        (dict(sm_scale=True), "sm_scale must be None or a finite real number, got bool True"),
        (dict(window_size=2.0), "window_size must be None or an integer >= 0, got 2.0"),
        (dict(broadcast_q=1), "broadcast_q must be a bool"),
        (dict(return_lse="yes"), "return_lse"),
        (dict(output_offset=torch.tensor([0, 3, 9], dtype=torch.int32)), "output_offset"),
        (dict(query_offset_cpu=[0, 3]), "query_offset_cpu"),
        (dict(key_offset_cpu=[0, 4, 2]), "non-decreasing"),
    ],
)
def test_bad_options(kw, match, device):
    args, _ = _args(device)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    with pytest.raises(ValueError, match=match):
        jagged_flash_attention(*args, **kw)


def test_broadcast_q_offsets(device):
    args, _ = _args(device, cu_q=torch.tensor([0, 3, 8], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="2 entries"):
        jagged_flash_attention(*args, broadcast_q=True)
    args[3] = torch.tensor([0, 5], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"query_offset = \[0, 8\]"):
        jagged_flash_attention(*args, broadcast_q=True)
    args[3] = torch.tensor([0, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="b \\* Lq"):
        jagged_flash_attention(*args, broadcast_q=True, output_offset=args[4])


def test_query_longer_than_max_seq_len_q_is_truncated_not_refused(device):
    """Under ADS_CHECK_INPUTS=1 (this module's fixture) a query sequence longer than max_seq_len_q is
    valid input, the upstream contract: its rows past the bound are zeros. A key sequence longer than
    max_seq_len_kv is the error ("kv too long" above)."""
    args, _ = _args(device, max_q=2)  # query lengths 3 and 5
    out = jagged_flash_attention(*args)
    assert (out[2:3] == 0).all() and (out[5:8] == 0).all()
    assert (out[0:2] != 0).any() and (out[3:5] != 0).any()


def test_device_offsets_unread_without_check_inputs(device, monkeypatch):
    """Without ADS_CHECK_INPUTS device offsets are never read (no sync): bad ones are not reported
    (the engine clamps them); CPU offsets are host data and still checked."""
    monkeypatch.setenv("ADS_CHECK_INPUTS", "0")
    args, _ = _args(device, cu_k=torch.tensor([0, 2, 9], dtype=torch.int32, device=device))
    if device == "cpu":
        with pytest.raises(ValueError, match="spans"):
            jagged_flash_attention(*args)
    else:
        assert torch.isfinite(jagged_flash_attention(*args)).all()


def test_numpy_scalars_taken_like_python_numbers(device):
    """numpy.float32 sm_scale and numpy.int64 bounds and window: the output of the Python numbers."""
    args, _ = _args(device)
    want = jagged_flash_attention(*args, sm_scale=0.25, window_size=2)
    args[5:7] = np.int64(args[5]), np.int64(args[6])
    got = jagged_flash_attention(*args, sm_scale=np.float32(0.25), window_size=np.int64(2))
    assert torch.equal(got, want)
