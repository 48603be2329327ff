"""Tile shapes of the row kernels and every environment knob of ads-gdpa-megakernel (read here only).

The prologue and epilogue kernels work on whole tokens: a program holds ``BLOCK_T`` tokens by
``BLOCK_N`` features of the (T, H·D) view and walks ``ceil(H·D / BLOCK_N)`` column chunks. One
chunk (the whole token in registers) up to ``MAX_BLOCK_N`` features; past that the statistics are
combined across chunks (Chan's formula for the LayerNorm, plain sums for the RMSNorm).

Env (integers; anything else raises ValueError):
    ADS_GDPA_MK_TILE_ELEMS   elements per program tile, BLOCK_T · BLOCK_N (default 2048: 16 fp32
        values per thread and tensor at 4 warps; the H200 sweep in BENCHMARKS.md chose it).
    ADS_GDPA_MK_MAX_BLOCK_N  widest column chunk (default 2048, a power of two).
    ADS_GDPA_MK_REDUCE_PROGRAMS  programs of the backward kernels, each owning one row of the
        deterministic weight-gradient partials (default 4 per SM; 4 under the interpreter).
ads-gdpa's own knobs (``ADS_GDPA_*``) keep their meaning for the attention inside.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from ads_kernel_tools import envvars
from ads_kernel_tools.capability import interpreter_active, num_sms
from ads_kernel_tools.kernels.grid import cdiv


def _int(name: str, default: int, *, minimum: int = 1, power_of_two: bool = False) -> int:
    raw = envvars.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {minimum}")
    value = int(raw)
    if power_of_two and value & (value - 1):
        raise ValueError(f"{name}={raw!r}: expected a power of two")
    return value


def tile_elems() -> int:
    return _int("ADS_GDPA_MK_TILE_ELEMS", 2048, minimum=16, power_of_two=True)


def max_block_n() -> int:
    return _int("ADS_GDPA_MK_MAX_BLOCK_N", 2048, minimum=16, power_of_two=True)


def reduce_programs(device) -> int:
    """Programs of a backward kernel (rows of its weight-gradient partials): fixed per device, so
    the partial sums and their reduction order, hence the gradients, are the same on every run."""
    default = 4 if interpreter_active() or device.type != "cuda" else 4 * num_sms(device)
    return _int("ADS_GDPA_MK_REDUCE_PROGRAMS", default)


@dataclass(frozen=True)
class RowTile:
    """BLOCK_T tokens x BLOCK_N features per program; CHUNKS column chunks cover a token."""

    block_t: int
    block_n: int
    chunks: int
    num_warps: int

    def kwargs(self) -> dict:
        return {
            "BLOCK_T": self.block_t,
            "BLOCK_N": self.block_n,
            "CHUNKS": self.chunks,
            "num_warps": self.num_warps,
        }


def row_tile(n: int) -> RowTile:
    """The tile for tokens of ``n`` features."""
    block_n = min(triton.next_power_of_2(max(n, 1)), max_block_n())
    block_t = max(1, tile_elems() // block_n)
    warps = 8 if block_t * block_n >= 4096 else 4
    return RowTile(block_t, block_n, cdiv(max(n, 1), block_n), warps)
