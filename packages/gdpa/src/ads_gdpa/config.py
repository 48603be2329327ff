"""Tile configurations, autotune spaces and environment knobs.

Env:
    ADS_GDPA_DISABLE_AUTOTUNE=1  pin one config per kernel (always on under TRITON_INTERPRET).
    ADS_GDPA_BACKEND=triton|gluon|auto  forward backend (default auto: Gluon where it supports the call).
    ADS_GDPA_PERSISTENT=1  persistent forward grid (num_SMs programs) when a tile map exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton

SHORT_KV_MAX = 256  # max_seqlen_k at or below which dense KV takes the one-step short-KV path


def interpreter_active() -> bool:
    """True under the Triton CPU interpreter (inline PTX and autotuning are unavailable there)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def autotune_disabled() -> bool:
    return interpreter_active() or os.environ.get("ADS_GDPA_DISABLE_AUTOTUNE", "0") == "1"


def backend() -> str:
    b = os.environ.get("ADS_GDPA_BACKEND", "auto").lower()
    if b not in ("auto", "triton", "gluon"):
        raise ValueError(f"ADS_GDPA_BACKEND must be triton, gluon or auto, got {b!r}")
    return b


def persistent() -> bool:
    return os.environ.get("ADS_GDPA_PERSISTENT", "0") == "1"


@dataclass(frozen=True)
class TileConfig:
    """One kernel configuration: BLOCK_M query rows x BLOCK_N keys, warps, pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def triton(self) -> triton.Config:
        return triton.Config(
            {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n},
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def kwargs(self) -> dict:
        return {
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


# Pinned configs: small tiles for the interpreter (fast there, and tests hit tile±1 edges cheaply),
# and the measured-best H200 tiles otherwise.
FWD_PINNED_INTERP = TileConfig(32, 32, 4, 1)
BWD_PINNED_INTERP = TileConfig(16, 32, 4, 1)
FWD_PINNED_GPU = TileConfig(128, 64, 4, 3)
BWD_PINNED_GPU = TileConfig(64, 128, 8, 2)

# Forward: 128-row query tiles were always best on H100/H200 for this kernel shape; the map-based
# (tile-sorted) launch fixes BLOCK_M, so only BLOCK_N / warps / stages are tuned.
FWD_SPACE = [
    TileConfig(128, 64, 4, 3),
    TileConfig(128, 64, 8, 3),
    TileConfig(128, 128, 8, 2),
    TileConfig(128, 32, 4, 4),
]
# Backward (dK/dV kernel): BLOCK_N kv rows held in registers, BLOCK_M query rows streamed.
BWD_SPACE = [
    TileConfig(64, 128, 8, 2),
    TileConfig(32, 128, 4, 2),
    TileConfig(64, 64, 4, 2),
    TileConfig(32, 64, 4, 3),
]
DQ_SPACE = [
    TileConfig(128, 64, 8, 2),
    TileConfig(64, 64, 4, 2),
    TileConfig(128, 32, 4, 3),
]


def short_kv_space(block_n: int) -> list[TileConfig]:
    """Short-KV forward: all keys of a sequence in one step (BLOCK_N = next_pow2(max Lk))."""
    return [TileConfig(128, block_n, 8, 2), TileConfig(64, block_n, 4, 2), TileConfig(128, block_n, 4, 2)]


def seqlen_bucket(n: int) -> int:
    """Autotune key bucket: next power of two, at least 16."""
    return max(16, triton.next_power_of_2(max(int(n), 1)))
