"""The shared offsets validator, the ADS_CHECK_INPUTS switch and the device clamp."""

import re

import pytest
import torch

from ads_kernel_tools.offsets import check_inputs_enabled, validate_offsets


def test_validator_rules_and_messages():
    assert validate_offsets("cu", torch.tensor([0, 2, 2, 5]), 5).tolist() == [2, 0, 3]
    assert validate_offsets("cu", [1, 3], 4).tolist() == [2]  # leading and trailing rows allowed
    with pytest.raises(ValueError, match=r"pkg: cu must be non-decreasing: cu\[1\] = 6 > cu\[2\] = 3"):
        validate_offsets("cu", [0, 6, 3, 9], 9, prefix="pkg: ")
    with pytest.raises(ValueError, match=r"spans \[0, 5000\] but the tensor has 1000 rows"):
        validate_offsets("cu", [0, 600, 600, 5000], 1000)
    with pytest.raises(ValueError, match="spans"):
        validate_offsets("cu", [-1, 3], 4)
    with pytest.raises(ValueError, match="must start at 0 and end at T=4"):
        validate_offsets("cu", [0, 3], 4, cover=True)
    with pytest.raises(ValueError, match="sequence 1 has 7 rows > max_len=5"):
        validate_offsets("cu", [0, 2, 9], 9, max_len=5, max_name="max_len")
    with pytest.raises(ValueError, match="1-D"):
        validate_offsets("cu", [], 0)


def test_host_copy_metadata_and_copies():
    from ads_kernel_tools.offsets import host_copy

    dev = torch.tensor([0, 3, 5], dtype=torch.int32)
    assert host_copy("cu", dev, None).dtype == torch.int64  # CPU offsets are their own host copy
    assert host_copy("cu", dev, [0, 3, 5]).tolist() == [0, 3, 5]
    assert host_copy("cu", dev, torch.tensor([0, 3, 5])).dtype == torch.int64
    if torch.cuda.is_available():
        assert host_copy("cu", dev.cuda(), None) is None  # device offsets: nothing read
    bad = [
        (torch.zeros((2, 2), dtype=torch.int32), None, "1-D tensor"),
        (torch.zeros(0, dtype=torch.int32), None, "1-D tensor"),
        (torch.zeros(3), None, "int32 or int64"),
        (dev, [0, 3], "cu_cpu has (2,) entries"),
    ]
    for offsets, copy, msg in bad:
        with pytest.raises(ValueError, match=r"^pkg: .*" + re.escape(msg)):
            host_copy("cu", offsets, copy, prefix="pkg: ")


def test_check_inputs_switch(monkeypatch):
    monkeypatch.delenv("ADS_CHECK_INPUTS", raising=False)
    assert not check_inputs_enabled()
    for on in ("1", "true", "ON"):
        monkeypatch.setenv("ADS_CHECK_INPUTS", on)
        assert check_inputs_enabled()
    monkeypatch.setenv("ADS_CHECK_INPUTS", "0")
    assert not check_inputs_enabled()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_clamp_keeps_valid_offsets_and_bounds_bad_ones(device, dtype):
    pytest.importorskip("triton")
    from ads_kernel_tools.kernels.offsets import clamp_offsets

    good = torch.tensor([0, 3, 3, 10], dtype=dtype, device=device)
    bad = torch.tensor([5, -4, 600, 300, 5000, 2**40 if dtype == torch.int64 else 2**31 - 1], dtype=dtype)
    a, b = clamp_offsets(good, 12, bad.to(device), 1000)
    assert a.dtype == torch.int32 and a.tolist() == [0, 3, 3, 10]
    assert b.tolist() == [5, 5, 600, 600, 1000, 1000]  # non-decreasing, inside [0, rows]
    same, again = clamp_offsets(good, 12, good, 12)
    assert again is same
    n = 2500  # more than one chunk: the running maximum carries across chunks
    long = torch.randint(-50, 3000, (n,), dtype=dtype)
    (c, _) = clamp_offsets(long.to(device), 2000)
    want = torch.cummax(long.clamp(0, 2000), 0).values
    assert c.cpu().tolist() == want.tolist()


@pytest.mark.parametrize(
    ("cu", "rows"),
    [([2, 6, 9], 12), ([0, 5, 12], 12), ([0], 7), ([-3, 4, 40], 10), ([6, 2, 3], 9), ([3, 3], 5)],
    ids=["both-ends", "spanning", "no-sequence", "out-of-range", "decreasing", "empty-sequence"],
)
def test_clamp_zeroes_rows_no_sequence_owns(device, cu, rows):
    """``zero_outside``: rows before the first and from the last clamped offset on become 0, the
    owned rows keep their (NaN) contents, and the clamped offsets are those of a plain call."""
    pytest.importorskip("triton")
    from ads_kernel_tools.kernels.offsets import clamp_offsets

    offs = torch.tensor(cu, dtype=torch.int64, device=device)
    buf = torch.full((rows, 3, 5), float("nan"), dtype=torch.bfloat16, device=device)
    (a, _) = clamp_offsets(offs, rows, zero_outside=buf)
    (plain, _) = clamp_offsets(offs, rows)
    assert a.tolist() == plain.tolist()
    first, last = a[0].item(), a.max().item()
    owned = (torch.arange(rows) >= first) & (torch.arange(rows) < last)
    assert torch.isnan(buf[owned.to(device)].float()).all(), "owned rows must not be written"
    assert (buf[~owned.to(device)] == 0).all(), "rows no sequence owns must be zero"


def test_clamp_zero_outside_rejects_a_buffer_of_other_rows(device):
    pytest.importorskip("triton")
    from ads_kernel_tools.kernels.offsets import clamp_offsets

    offs = torch.tensor([0, 4], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="zero_outside must be contiguous with 4 rows"):
        clamp_offsets(offs, 4, zero_outside=torch.zeros(5, 2, device=device))
