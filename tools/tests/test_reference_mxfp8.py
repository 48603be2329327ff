"""Tests of the MXFP8 references: hand-computed E8M0 bytes for both roundings and round trips."""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.reference.mxfp8 import (
    dequantize_mxfp8,
    e8m0_to_float,
    mxfp8_scale_bytes,
    quantize_mxfp8,
    quantize_mxfp8_along,
)


def _block(amax: float, fill: float = 0.25) -> torch.Tensor:
    """A 32-wide block whose absolute maximum is ``amax`` (negative sign, to exercise abs)."""
    b = torch.full((32,), fill * amax)
    b[7] = -amax
    return b


# (amax, rceil byte, floor byte), bytes worked out by hand with bias 127
SCALE_CASES = [
    (0.0, 0, 0),  # all-zero block
    (448.0, 127, 127),  # 448/448 = 2^0 exactly; floor: 448 = 1.75*2^8 -> 8 - 8 = 0
    (896.0, 128, 128),  # exact power-of-two ratio 2^1
    (449.0, 128, 127),  # ratio just above 1 rounds up; floor keeps 2^0 and clips 449 to 448
    (500.0, 128, 127),
    (512.0, 128, 128),  # floor: 2^9 -> 9 - 8 = 1
    (1.0, 119, 119),  # 1/448 = 2^-8.8 -> ceil -8 ; floor: 0 - 8
    (0.9, 119, 118),  # floor: 0.9 = 1.8*2^-1 -> -1 - 8 = -9
    (0.875, 118, 118),  # 0.875/448 = 2^-9 exactly
    (3.5, 120, 120),  # 448 * 2^-7
    (2.0**-130, 1, 0),  # rceil: denormal ratio -> 2^-126 ; floor: clamped at byte 0
    (2.0**127, 246, 246),  # 2^127/448 = 1.14*2^118 -> 2^119 ; floor: 127 - 8 = 119
]


@pytest.mark.parametrize("amax,rceil,floor", SCALE_CASES)
def test_scale_bytes_by_hand(amax, rceil, floor):
    x = _block(amax)
    _, s_r = quantize_mxfp8(x, "rceil")
    _, s_f = quantize_mxfp8(x, rounding="floor")
    assert s_r.dtype == torch.uint8 and s_r.shape == (1,)
    assert s_r.item() == rceil
    assert s_f.item() == floor
    assert mxfp8_scale_bytes(torch.tensor([amax]), "rceil").item() == rceil


def test_payload_by_hand():
    x = torch.cat([_block(448.0), _block(449.0), _block(500.0), _block(0.0)])
    data, scales = quantize_mxfp8(x)
    assert data.dtype == torch.float8_e4m3fn and data.shape == x.shape
    d = data.float().view(4, 32)
    assert d[0, 7].item() == -448.0 and d[0, 0].item() == 112.0
    assert d[1, 7].item() == -224.0  # 449 / 2 = 224.5 -> nearest-even e4m3 (step 16) = 224
    assert d[2, 7].item() == -256.0  # 500 / 2 = 250 -> 256
    assert (d[3] == 0).all() and scales[3].item() == 0
    data_f, _ = quantize_mxfp8(x, "floor")
    df = data_f.float().view(4, 32)
    assert df[1, 7].item() == -448.0 and df[2, 7].item() == -448.0  # floor clips maxima in (448, 512)


def test_nan_and_inf_blocks():
    x = torch.cat([_block(1.0), _block(1.0)])
    x[40] = float("nan")
    _, s = quantize_mxfp8(x)
    assert s.tolist() == [119, 255]
    _, s = quantize_mxfp8(x, "floor")
    assert s.tolist() == [119, 255]
    assert mxfp8_scale_bytes(torch.tensor([float("inf")]), "rceil").item() == 255
    assert torch.isnan(e8m0_to_float(torch.tensor([255], dtype=torch.uint8))).all()


def test_e8m0_decoding():
    bytes_ = torch.tensor([0, 1, 119, 127, 128, 254], dtype=torch.uint8)
    expected = torch.tensor([2.0**-127, 2.0**-126, 2.0**-8, 1.0, 2.0, 2.0**127])
    assert torch.equal(e8m0_to_float(bytes_), expected)


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip(rounding, dtype):
    g = torch.Generator().manual_seed(0)
    magnitudes = torch.exp2(torch.randint(-20, 20, (4, 6, 1), generator=g).float())
    x = (torch.randn(4, 6, 128, generator=g) * magnitudes).to(dtype)
    data, scales = quantize_mxfp8(x, rounding)
    assert scales.shape == (4, 6, 4)
    y = dequantize_mxfp8(data, scales)
    assert y.dtype == torch.float32
    assert torch.equal(y.view(4, 6, 4, 32), data.float().view(4, 6, 4, 32) * e8m0_to_float(scales)[..., None])
    xf = x.float()
    scale = e8m0_to_float(scales).repeat_interleave(32, dim=-1)
    # e4m3 keeps 3 mantissa bits (relative error <= 2^-4); subnormals are spaced 2^-9 * scale
    bound = torch.maximum(xf.abs() * 2.0**-4, scale * 2.0**-10)
    if rounding == "floor":
        bound = torch.maximum(bound, (xf.abs() - 448 * scale).clamp(min=0))  # clipped maxima
    assert ((y - xf).abs() <= bound * (1 + 1e-6)).all()
    if rounding == "rceil":
        assert (xf.abs() <= 448 * scale).all()  # never saturates
    # dequantized values are representable, so a second round trip is exact
    data2, scales2 = quantize_mxfp8(y, rounding)
    assert torch.equal(dequantize_mxfp8(data2, scales2), y)
    if rounding == "floor":
        # the block max stays in [256, 448] * scale: same bytes
        assert torch.equal(scales2, scales)
    else:
        # a max rounded down to <= 224 * scale may need one power of two less
        assert ((scales.int() - scales2.int()) >= 0).all() and ((scales.int() - scales2.int()) <= 1).all()
    assert dequantize_mxfp8(data, scales, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_exact_values_survive():
    # small integers times a power of two are exactly representable: round trip is exact
    x = torch.arange(-16, 16).float() * 2.0**-5
    data, scales = quantize_mxfp8(x)
    torch.testing.assert_close(dequantize_mxfp8(data, scales), x, rtol=0, atol=0)


def test_quantize_along_token_dim():
    x = torch.randn(64, 3, 16, generator=torch.Generator().manual_seed(1))
    data, scales = quantize_mxfp8_along(x, 0)
    assert data.shape == x.shape and scales.shape == (2, 3, 16)
    ref_data, ref_scales = quantize_mxfp8(x.permute(1, 2, 0).contiguous())
    assert torch.equal(scales, ref_scales.permute(2, 0, 1))
    assert torch.equal(data.view(torch.uint8), ref_data.permute(2, 0, 1).view(torch.uint8))


def test_bad_inputs():
    with pytest.raises(ValueError):
        quantize_mxfp8(torch.zeros(33))
    with pytest.raises(ValueError):
        quantize_mxfp8(torch.zeros(32), "round")
    data, scales = quantize_mxfp8(torch.zeros(64))
    with pytest.raises(ValueError):
        dequantize_mxfp8(data, scales[:1])
