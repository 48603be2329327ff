"""Bit-exact MXFP8 (E4M3 payload + E8M0 scale per 32 elements) quantize / dequantize references.

Spec: lp_fa4_and_jfa.md §1.3. Scale bytes are derived from fp32 bit patterns, so the result does not
depend on floating-point log2:

* ``rceil`` (default, NVIDIA MXFP8 recipe): scale = 2^ceil(log2(amax / 448)). The biased exponent field
  of the fp32 quotient ``amax / 448`` is bumped by one if any mantissa bit is set (a denormal quotient
  thus becomes 2^-126), capped at 255. The block maximum never saturates.
* ``floor``: scale = 2^(floor(log2(amax)) - 8), i.e. the exponent field of amax minus 8, clamped to
  [0, 255]. Block maxima in (448, 512)·2^e are clipped to 448.

NaN anywhere in a block gives byte 0xFF. The payload is ``clamp(x / max(scale, 2^-126), ±448)`` rounded
to nearest-even E4M3; the 2^-126 floor on the divisor means a block with scale byte 0 (all zeros, or a
tiny floor-mode amax < 2^-118) is quantized against 2^-126 while the byte still decodes as 2^-127.
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK_SIZE",
    "E4M3_MAX",
    "dequantize_mxfp8",
    "e8m0_to_float",
    "mxfp8_scale_bytes",
    "quantize_mxfp8",
    "quantize_mxfp8_along",
]

BLOCK_SIZE = 32
E4M3_MAX = 448.0
_E4M3_MAX_EXP = 8  # 448 = 1.75 * 2^8
_MANTISSA_BITS = 23
_EXP_BIAS = 127
_NAN_BYTE = 255
_MIN_NORMAL = 2.0**-126


def _exponent_and_mantissa(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased exponent field and mantissa field of non-negative fp32 values, as int32."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    return (bits >> _MANTISSA_BITS) & 0xFF, bits & ((1 << _MANTISSA_BITS) - 1)


def mxfp8_scale_bytes(amax: torch.Tensor, rounding: str = "rceil") -> torch.Tensor:
    """E8M0 scale byte (uint8) for each block absolute maximum ``amax`` (fp32, >= 0 or NaN)."""
    amax = amax.to(torch.float32)
    if rounding == "rceil":
        exponent, mantissa = _exponent_and_mantissa(amax / E4M3_MAX)
        biased = torch.clamp(exponent + (mantissa != 0).to(torch.int32), max=_NAN_BYTE)
    elif rounding == "floor":
        exponent, _ = _exponent_and_mantissa(amax)
        biased = torch.clamp(exponent - _E4M3_MAX_EXP, min=0, max=_NAN_BYTE)
    else:
        raise ValueError(f"rounding must be 'rceil' or 'floor', got {rounding!r}")
    biased = torch.where(torch.isnan(amax), torch.full_like(biased, _NAN_BYTE), biased)
    return biased.to(torch.uint8)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 bytes to fp32: 2^(byte - 127), byte 255 = NaN (byte 0 is the denormal 2^-127)."""
    exponent = scales.to(torch.int32) - _EXP_BIAS
    value = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    return torch.where(scales.to(torch.int32) == _NAN_BYTE, torch.full_like(value, float("nan")), value)


def quantize_mxfp8(x: torch.Tensor, rounding: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the last dim (size a multiple of 32) in blocks of 32.

    Returns ``(data, scales)``: data float8_e4m3fn of x's shape, scales uint8 E8M0 bytes of shape
    (..., K // 32). x may be fp32, bf16 or fp16 (all exact in fp32).
    """
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of {BLOCK_SIZE}")
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    # amax that propagates NaN (torch.amax does); abs() keeps -0.0 out of the exponent bits
    amax = blocks.abs().amax(dim=-1)
    scales = mxfp8_scale_bytes(amax, rounding)
    divisor = torch.clamp(e8m0_to_float(scales), min=_MIN_NORMAL)
    payload = torch.clamp(blocks / divisor[..., None], min=-E4M3_MAX, max=E4M3_MAX)
    data = payload.to(torch.float8_e4m3fn).reshape(x.shape)
    return data, scales


def dequantize_mxfp8(
    data: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``data * 2^(scale - 127)`` per 32-element block along the last dim, returned in ``dtype``."""
    k = data.shape[-1]
    if k % BLOCK_SIZE or scales.shape != (*data.shape[:-1], k // BLOCK_SIZE):
        raise ValueError(f"scales {tuple(scales.shape)} do not match data {tuple(data.shape)}")
    blocks = data.to(torch.float32).reshape(*data.shape[:-1], k // BLOCK_SIZE, BLOCK_SIZE)
    return (blocks * e8m0_to_float(scales)[..., None]).reshape(data.shape).to(dtype)


def quantize_mxfp8_along(
    x: torch.Tensor, dim: int, rounding: str = "rceil"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of 32 along ``dim`` (e.g. the token axis, the spec's "seq" orientation).

    data keeps x's layout; scales have x's shape with ``dim`` divided by 32.
    """
    data, scales = quantize_mxfp8(x.movedim(dim, -1), rounding)
    return data.movedim(-1, dim), scales.movedim(-1, dim)
