"""MXFP8 varlen metadata, the quantised-tensor container, quantisation and dequantisation.

MXFP8 here is the OCP microscaling format: an E4M3 payload and one E8M0 scale byte (value
2^(byte - 127), byte 255 = NaN) per 32 consecutive elements. Packed variable-length batches
(tokens, H, 128) are quantised without crossing a sequence boundary, in two orientations:

* ``hdim``: blocks of 32 along the head dimension, 4 scales per (token, head). The payload is
  (tokens, H, 128) E4M3. The scales are laid out per head over the *padded* token axis (each sequence
  padded to a multiple of 128 tokens, the offsets ``cu_seqlens_sf``; padding bytes are 0), i.e. a
  logical (H, P, 4) byte matrix with P = ``meta.padded_tokens``, then packed into the tcgen05 / cuBLAS
  blocked scale layout and stored (H·P/4, 16).
* ``seq``: blocks of 32 along the token axis for each (head, dim). Each sequence is zero-padded to a
  multiple of 128 tokens before quantising, so blocks start at the sequence's first token; the payload
  keeps the row-major (tokens, H, 128) layout (padding rows are not stored). The scales form a logical
  (H, 128, P/32) byte matrix (row = dim, column = 32-token block of the padded axis), packed into the
  same blocked layout and stored (H·32, P/8).

The blocked layout (one formula for both orientations): a logical (L, MN, K) byte matrix, MN a
multiple of 128 and K of 4, is cut into 128 x 4 tiles ordered (l, MN tile, K tile), each tile stored
as 512 contiguous bytes in which element (row r, column c) sits at byte
``(r % 32) * 16 + (r // 32) * 4 + c``. For ``hdim`` L = H, MN = P, K = 4 (one K tile); for ``seq``
L = H, MN = 128 (one MN tile), K = P/32. The stored 2-D shapes are views of that flat byte order.
Every 128-token tile lies inside one sequence because each sequence is padded to 128.

Scale rules (spec §1.3, bit-exact with ``ads_kernel_tools.reference.mxfp8``): ``rceil`` (default):
2^ceil(log2(amax / 448)) read off the fp32 bits of amax / 448 (+1 exponent if any mantissa bit is
set), capped at byte 255, never saturates; ``floor``: 2^(floor(log2 amax) - 8), clamped to [0, 255],
may clip maxima in (448, 512)·2^e. A NaN in a block gives byte 255. The payload is
``clamp(x / max(scale, 2^-126), ±448)`` rounded to nearest-even E4M3.

Choices where the spec is silent (and why):

* Scale bytes are returned as ``torch.uint8`` (the spec calls them "E8M0 bytes"; uint8 works on
  every torch build, and ``.view(torch.float8_e8m0fnu)`` is free). Operands whose scales are
  ``float8_e8m0fnu`` are accepted as well.
* A block with byte 255 (a NaN in it, or with ``rceil`` an infinite amax) decodes to NaN, so its whole
  payload is NaN: the same as the tools reference, and what dequantising byte 255 gives anyway.
* Padding bytes of the ``hdim`` scales and fully padded ``seq`` blocks are 0 (2^-127).
* A batch whose sequences are all empty is rejected (there is nothing to quantise).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ads_kernel_tools import checks

__all__ = [
    "HEAD_DIM",
    "SCALE_TILE",
    "Mxfp8VarlenMeta",
    "Mxfp8VarlenTensor",
    "dequantize_mxfp8_varlen",
    "mxfp8_scales_logical",
    "quantize_mxfp8_varlen",
]

Orientation = Literal["hdim", "seq"]
Orientations = Literal["both", "hdim", "seq"]
ScalingMode = Literal["rceil", "floor"]

HEAD_DIM = 128  # the only head dim of the MXFP8 API
SCALE_TILE = 128  # every sequence's scale rows are padded to this many tokens
BLOCK = 32  # elements per E8M0 scale
E4M3_MAX = 448.0
_MANTISSA_BITS = 23
_NAN_BYTE = 255
_MIN_NORMAL = 2.0**-126
_SCALING_MODES = ("rceil", "floor")
_ORIENTATIONS = ("both", "hdim", "seq")
_P = "Mxfp8VarlenMeta: "


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _prefix(values: Sequence[int]) -> tuple[int, ...]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


def _check_lengths(lengths) -> tuple[int, ...]:
    if isinstance(lengths, torch.Tensor):
        if lengths.ndim != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError("Mxfp8VarlenMeta: lengths must be a 1-D integer tensor or a sequence of ints")
        lengths = lengths.tolist()
    lengths = tuple(lengths)
    if not lengths:
        raise ValueError("Mxfp8VarlenMeta: at least one sequence length is required")
    lengths = tuple(checks.integer("sequence length", n, prefix=_P, minimum=0) for n in lengths)
    if sum(_round_up(n, SCALE_TILE) for n in lengths) >= 2**31:
        raise ValueError("Mxfp8VarlenMeta: the padded token count does not fit int32 offsets")
    return lengths


def _check_offsets(offsets, name: str, *, cpu: bool = False) -> tuple[int, ...]:
    """Values of a valid offsets tensor (contiguous int32, 1-D, >= 2 entries, from 0, monotonic)."""
    if not isinstance(offsets, torch.Tensor):
        raise ValueError(f"Mxfp8VarlenMeta: {name} must be a tensor, got {type(offsets).__name__}")
    if offsets.dtype != torch.int32 or offsets.ndim != 1 or offsets.shape[0] < 2:
        raise ValueError(
            f"Mxfp8VarlenMeta: {name} must be 1-D int32 with at least two entries, "
            f"got {offsets.dtype} of shape {tuple(offsets.shape)}"
        )
    if not offsets.is_contiguous():
        raise ValueError(f"Mxfp8VarlenMeta: {name} must be contiguous")
    if cpu and offsets.device.type != "cpu":
        raise ValueError(f"Mxfp8VarlenMeta: {name} must be on the CPU, got {offsets.device}")
    values = tuple(int(v) for v in offsets.detach().cpu().tolist())
    if values[0] != 0:
        raise ValueError(f"Mxfp8VarlenMeta: {name} must start at 0, got {values[0]}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"Mxfp8VarlenMeta: {name} must be non-decreasing, got {list(values)}")
    return values


@dataclass(frozen=True)
class Mxfp8VarlenMeta:
    """Offsets of a packed batch and of its 128-padded MXFP8 scale rows.

    ``cu_seqlens`` int32 (B+1,) on the data's device; ``cu_seqlens_sf`` the same with every length
    rounded up to 128; ``max_seqlen`` the largest length; ``cpu_cu_seqlens`` a CPU copy of
    ``cu_seqlens`` (equal values). Build with :meth:`from_lengths` or :meth:`from_cu_seqlens`; direct
    construction is validated the same way (ValueError on any mismatch).

    >>> Mxfp8VarlenMeta.from_lengths([17, 0, 129], device="cpu").cu_seqlens_sf.tolist()
    [0, 128, 128, 384]
    """

    cu_seqlens: torch.Tensor
    cu_seqlens_sf: torch.Tensor
    max_seqlen: int
    cpu_cu_seqlens: torch.Tensor

    def __post_init__(self) -> None:
        raw = _check_offsets(self.cu_seqlens, "cu_seqlens")
        sf = _check_offsets(self.cu_seqlens_sf, "cu_seqlens_sf")
        cpu = _check_offsets(self.cpu_cu_seqlens, "cpu_cu_seqlens", cpu=True)
        if self.cu_seqlens_sf.device != self.cu_seqlens.device:
            raise ValueError(
                f"Mxfp8VarlenMeta: cu_seqlens_sf is on {self.cu_seqlens_sf.device}, "
                f"cu_seqlens on {self.cu_seqlens.device}"
            )
        if cpu != raw:
            raise ValueError(f"Mxfp8VarlenMeta: cpu_cu_seqlens {list(cpu)} != cu_seqlens {list(raw)}")
        lengths = _check_lengths([b - a for a, b in zip(raw, raw[1:])])
        expected = _prefix([_round_up(n, SCALE_TILE) for n in lengths])
        if sf != expected:
            raise ValueError(
                f"Mxfp8VarlenMeta: cu_seqlens_sf must pad every sequence to {SCALE_TILE} tokens: "
                f"expected {list(expected)}, got {list(sf)}"
            )
        # a NumPy integer is stored as an int (frozen: set through object)
        object.__setattr__(self, "max_seqlen", checks.integer("max_seqlen", self.max_seqlen, prefix=_P))
        if self.max_seqlen != max(lengths):
            raise ValueError(
                f"Mxfp8VarlenMeta: max_seqlen {self.max_seqlen} != the largest length {max(lengths)}"
            )

    @classmethod
    def from_lengths(
        cls, lengths: Sequence[int] | torch.Tensor, *, device: torch.device | str
    ) -> Mxfp8VarlenMeta:
        """Metadata of sequences of the given lengths (non-negative ints; zero-length ones allowed)."""
        lengths = _check_lengths(lengths)
        cpu = torch.tensor(_prefix(lengths), dtype=torch.int32)
        sf = torch.tensor(_prefix([_round_up(n, SCALE_TILE) for n in lengths]), dtype=torch.int32)
        return cls(cpu.to(device), sf.to(device), max(lengths), cpu)

    @classmethod
    def from_cu_seqlens(
        cls, cu_seqlens: torch.Tensor, cpu_cu_seqlens: torch.Tensor | None = None
    ) -> Mxfp8VarlenMeta:
        """Metadata from int32 offsets; ``cpu_cu_seqlens`` (equal values) saves a device-to-host copy."""
        values = _check_offsets(cu_seqlens, "cu_seqlens")
        if cpu_cu_seqlens is not None:
            cpu_values = _check_offsets(cpu_cu_seqlens, "cpu_cu_seqlens", cpu=True)
            if cpu_values != values:
                raise ValueError(
                    f"Mxfp8VarlenMeta: cpu_cu_seqlens {list(cpu_values)} != cu_seqlens {list(values)}"
                )
        lengths = [b - a for a, b in zip(values, values[1:])]
        meta = cls.from_lengths(lengths, device=cu_seqlens.device)
        return (
            meta
            if cpu_cu_seqlens is None
            else cls(cu_seqlens, meta.cu_seqlens_sf, meta.max_seqlen, cpu_cu_seqlens)
        )

    @functools.cached_property
    def lengths(self) -> tuple[int, ...]:
        v = self.cpu_cu_seqlens.tolist()
        return tuple(b - a for a, b in zip(v, v[1:]))

    @property
    def total_tokens(self) -> int:
        return int(self.cpu_cu_seqlens[-1])

    @property
    def padded_tokens(self) -> int:
        return sum(_round_up(n, SCALE_TILE) for n in self.lengths)

    @property
    def batch_size(self) -> int:
        return self.cpu_cu_seqlens.shape[0] - 1

    @property
    def device(self) -> torch.device:
        return self.cu_seqlens.device

    def padded_index(self) -> torch.Tensor:
        """int64 (total_tokens,) on the device: token t's row in the 128-padded token axis (cached)."""
        return self._padded_index

    @functools.cached_property
    def _padded_index(self) -> torch.Tensor:
        cpu = self.cpu_cu_seqlens.to(torch.int64)
        sf = torch.tensor(_prefix([_round_up(n, SCALE_TILE) for n in self.lengths]), dtype=torch.int64)
        shift = torch.repeat_interleave(sf[:-1] - cpu[:-1], cpu[1:] - cpu[:-1], output_size=self.total_tokens)
        return (torch.arange(self.total_tokens, dtype=torch.int64) + shift).to(self.device)


@dataclass(frozen=True)
class Mxfp8VarlenTensor:
    """A packed (tokens, H, 128) tensor quantised to MXFP8 in one or both orientations.

    ``hdim`` / ``seq``: E4M3 payloads (tokens, H, 128); ``hdim_scale`` uint8 (H·P/4, 16) and
    ``seq_scale`` uint8 (H·32, P/8) in the blocked layout of the module docstring (P = the meta's
    ``padded_tokens``). An orientation not quantised is None.
    """

    hdim: torch.Tensor | None = None
    hdim_scale: torch.Tensor | None = None
    seq: torch.Tensor | None = None
    seq_scale: torch.Tensor | None = None

    @property
    def num_heads(self) -> int:
        payload = self.hdim if self.hdim is not None else self.seq
        if payload is None:
            raise ValueError("Mxfp8VarlenTensor: neither orientation is present")
        return payload.shape[1]


# --- scale bytes and payload -------------------------------------------------------------------------


def _scale_bytes(amax: torch.Tensor, mode: str) -> torch.Tensor:
    """E8M0 bytes (int32) of fp32 block maxima (>= 0 or NaN)."""
    if mode == "rceil":
        bits = (amax / E4M3_MAX).view(torch.int32)
        mantissa = bits & ((1 << _MANTISSA_BITS) - 1)
        byte = (bits >> _MANTISSA_BITS) & 0xFF
        byte = torch.clamp(byte + (mantissa != 0).to(torch.int32), max=_NAN_BYTE)
    else:
        byte = torch.clamp(((amax.view(torch.int32) >> _MANTISSA_BITS) & 0xFF) - 8, min=0, max=_NAN_BYTE)
    return torch.where(torch.isnan(amax), _NAN_BYTE, byte)


def _decode(byte: torch.Tensor) -> torch.Tensor:
    """fp32 value of E8M0 bytes: 2^(byte - 127) (byte 0 is the denormal 2^-127, byte 255 NaN)."""
    b = byte.to(torch.int32)
    value = torch.where(b == 0, 2.0**-127, (b << _MANTISSA_BITS).view(torch.float32))
    return torch.where(b == _NAN_BYTE, float("nan"), value)


def _payload(x: torch.Tensor, byte: torch.Tensor) -> torch.Tensor:
    """clamp(x / max(scale, 2^-126), ±448) in fp32 (``byte`` broadcast against x)."""
    divisor = torch.clamp(_decode(byte), min=_MIN_NORMAL)
    return torch.clamp(x / divisor, min=-E4M3_MAX, max=E4M3_MAX)


def quantize_mxfp8_rows(x: torch.Tensor, scaling_mode: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of 32 along the last dim: E4M3 payload of x's shape, uint8 scales (..., K/32)."""
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    byte = _scale_bytes(blocks.abs().amax(dim=-1), scaling_mode)
    data = _payload(blocks, byte[..., None]).to(torch.float8_e4m3fn).reshape(x.shape)
    return data, byte.to(torch.uint8)


# --- blocked scale layout ----------------------------------------------------------------------------


def _to_blocked(logical: torch.Tensor) -> torch.Tensor:
    """(L, MN, K) bytes, MN % 128 == K % 4 == 0 -> flat (L·MN·K,) bytes in the tcgen05 blocked order."""
    n_l, mn, k = logical.shape
    tiles = logical.reshape(n_l, mn // 128, 4, 32, k // 4, 4)  # (l, mn tile, r // 32, r % 32, k tile, c)
    return tiles.permute(0, 1, 4, 3, 2, 5).reshape(-1)  # (l, mn tile, k tile, r % 32, r // 32, c)


def _from_blocked(flat: torch.Tensor, n_l: int, mn: int, k: int) -> torch.Tensor:
    """Inverse of :func:`_to_blocked`."""
    tiles = flat.reshape(n_l, mn // 128, k // 4, 32, 4, 4)
    return tiles.permute(0, 1, 4, 3, 2, 5).reshape(n_l, mn, k)


def mxfp8_scales_logical(
    scale: torch.Tensor, meta: Mxfp8VarlenMeta, num_heads: int, orientation: Orientation
):
    """Unpack blocked scale bytes (uint8 or E8M0) to their logical matrix.

    ``hdim``: (P, H, 4), row = padded token; ``seq``: (P/32, H, 128), row = 32-token block of the
    padded axis (P = ``meta.padded_tokens``).
    """
    flat = scale.contiguous().view(torch.uint8).reshape(-1)
    p = meta.padded_tokens
    if orientation == "hdim":
        return _from_blocked(flat, num_heads, p, 4).permute(1, 0, 2)
    if orientation == "seq":
        return _from_blocked(flat, num_heads, HEAD_DIM, p // BLOCK).permute(2, 0, 1)
    raise ValueError(f"orientation must be 'hdim' or 'seq', got {orientation!r}")


# --- public quantise / dequantise --------------------------------------------------------------------


def _check_source(x, meta: Mxfp8VarlenMeta) -> None:
    if not isinstance(meta, Mxfp8VarlenMeta):
        raise TypeError(f"quantize_mxfp8_varlen: meta must be an Mxfp8VarlenMeta, got {type(meta).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize_mxfp8_varlen: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"quantize_mxfp8_varlen: x must be bfloat16 or float32, got {x.dtype}")
    if x.ndim != 3 or x.shape[1] < 1 or x.shape[2] != HEAD_DIM:
        raise ValueError(f"quantize_mxfp8_varlen: x must be (tokens, H, {HEAD_DIM}), got {tuple(x.shape)}")
    if x.shape[0] != meta.total_tokens:
        raise ValueError(f"quantize_mxfp8_varlen: x has {x.shape[0]} tokens, the offsets {meta.total_tokens}")
    if not x.is_contiguous():
        raise ValueError("quantize_mxfp8_varlen: x must be contiguous")
    if x.device != meta.device:
        raise ValueError(f"quantize_mxfp8_varlen: x is on {x.device}, the offsets on {meta.device}")
    if meta.padded_tokens == 0:
        raise ValueError("quantize_mxfp8_varlen: every sequence is empty, nothing to quantise")


def quantize_mxfp8_varlen(
    x: torch.Tensor,
    meta: Mxfp8VarlenMeta,
    *,
    orientations: Orientations = "both",
    scaling_mode: ScalingMode = "rceil",
) -> Mxfp8VarlenTensor:
    """Quantise a contiguous bf16/fp32 (tokens, H, 128) packed batch to MXFP8, per sequence.

    ``orientations``: "both", "hdim" (32-blocks along D, for Q·K^T and for V in the backward) or
    "seq" (32-blocks along tokens, for V in the forward and Q/K in the backward). Layouts and scale
    rules: module docstring. Vectorised over tokens and sequences (no Python loop).
    """
    _check_source(x, meta)
    if orientations not in _ORIENTATIONS:
        raise ValueError(
            f"quantize_mxfp8_varlen: orientations must be one of {_ORIENTATIONS}, got {orientations!r}"
        )
    if scaling_mode not in _SCALING_MODES:
        raise ValueError(
            f"quantize_mxfp8_varlen: scaling_mode must be one of {_SCALING_MODES}, got {scaling_mode!r}"
        )
    t, h, d = x.shape
    p = meta.padded_tokens
    rows = meta.padded_index()
    hdim = hdim_scale = seq = seq_scale = None
    if orientations in ("both", "hdim"):
        hdim, byte = quantize_mxfp8_rows(x, scaling_mode)  # byte (T, H, 4)
        logical = torch.zeros((p, h, d // BLOCK), dtype=torch.uint8, device=x.device)
        logical[rows] = byte
        hdim_scale = _to_blocked(logical.permute(1, 0, 2)).reshape(h * p // 4, 16)
    if orientations in ("both", "seq"):
        padded = torch.zeros((p, h, d), dtype=torch.float32, device=x.device)
        padded[rows] = x.to(torch.float32)
        blocks = padded.view(p // BLOCK, BLOCK, h, d)
        byte = _scale_bytes(blocks.abs().amax(dim=1), scaling_mode)  # (P/32, H, 128)
        payload = _payload(blocks, byte[:, None]).view(p, h, d)
        seq = payload[rows].to(torch.float8_e4m3fn)
        logical = byte.to(torch.uint8).permute(1, 2, 0)  # (H, 128, P/32)
        seq_scale = _to_blocked(logical).reshape(h * 32, p // 8)
    return Mxfp8VarlenTensor(hdim, hdim_scale, seq, seq_scale)


def dequantize_mxfp8_varlen(
    t: Mxfp8VarlenTensor,
    meta: Mxfp8VarlenMeta,
    orientation: Orientation = "hdim",
    *,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``payload · 2^(byte - 127)`` of one orientation, (tokens, H, 128) in ``dtype``.

    E4M3 times a power of two is exact in bf16 and fp32 (short of bf16's underflow below 2^-133), so
    bf16 and fp32 are computed directly in ``dtype`` (a broadcast multiply, no fp32 temporary); other
    dtypes go through fp32.
    """
    if orientation not in ("hdim", "seq"):
        raise ValueError(f"dequantize_mxfp8_varlen: orientation must be 'hdim' or 'seq', got {orientation!r}")
    payload, scale = (t.hdim, t.hdim_scale) if orientation == "hdim" else (t.seq, t.seq_scale)
    if payload is None or scale is None:
        raise ValueError(f"dequantize_mxfp8_varlen: the tensor has no {orientation} orientation")
    n_t, h, d = payload.shape
    work = dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32
    logical = mxfp8_scales_logical(scale, meta, h, orientation)
    rows = meta.padded_index()
    if orientation == "hdim":
        factor = _decode(logical[rows]).to(work)  # (T, H, 4)
        out = payload.reshape(n_t, h, d // BLOCK, BLOCK).to(work) * factor[..., None]
    else:
        factor = _decode(logical).to(work)[rows // BLOCK]  # (T, H, 128)
        out = payload.to(work) * factor
    return out.reshape(n_t, h, d).to(dtype)
