"""Tile configurations, autotune spaces and environment knobs.

Env:
    ADS_GDPA_DISABLE_AUTOTUNE=1  pin one config per kernel (always on under TRITON_INTERPRET).
    ADS_GDPA_BACKEND=auto|triton|gluon  forward backend. Default auto = gluon: the warp-specialised
        Gluon forward on sm90 wherever it supports the call (``ads_gdpa.gluon.supports``), Triton
        everywhere else. In one H200 run (BENCHMARKS.md) Gluon measured 561 / 458 / 631 TFLOP/s
        (max len 2048 at sparsity 1.0 / 0.5, dense 4x16x4096) against 490 / 447 / 495 for Triton.
        ``triton`` forces the portable Triton forward.
    ADS_GDPA_BWD_BACKEND=auto|triton|gluon  backward backend; auto = gluon: the warp-specialised Gluon
        backward (dK/dV + vector-atomic dQ) on sm90 where it supports the call (the forward's
        conditions, non-deterministic mode), Triton elsewhere; see ``bwd_backend`` for measurements.
    ADS_GDPA_PERSISTENT=1  persistent forward grid (num_SMs programs) when a tile map exists.
    ADS_GDPA_BWD_TMA=1  backward with TMA Q/dO loads on sm90 (software-pipelined by Triton, unlike the
        pointer loads); ADS_GDPA_BWD_DQ_TMA=1 adds dQ by bulk TMA reductions instead of scalar fp32
        atomics. Both opt-in: together they measured 8-10 % slower on the H200; the loads alone are
        not measured yet (``python -m ads_gdpa.bench --variants`` times each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton

SHORT_KV_MAX = 256  # max_seqlen_k at or below which dense KV takes the one-step short-KV path
# The Gluon forward's dead-half skip on an H200 (B=1152, H=4, D=128, sparsity 0.5, A/B in one
# process): +4 % at max 256, +13 % at 512, -1 % at 1024, -4 % at 2048, where dead halves are
# 15/8/4/2 % of the half-steps; so only short maxima take it.
SKIP_DEAD_MAX_Q = 512


def interpreter_active() -> bool:
    """True under the Triton CPU interpreter (inline PTX and autotuning are unavailable there)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def autotune_disabled() -> bool:
    return interpreter_active() or os.environ.get("ADS_GDPA_DISABLE_AUTOTUNE", "0") == "1"


def backend() -> str:
    b = os.environ.get("ADS_GDPA_BACKEND", "auto").lower()
    if b not in ("auto", "triton", "gluon"):
        raise ValueError(f"ADS_GDPA_BACKEND must be auto, triton or gluon, got {b!r}")
    return "gluon" if b == "auto" else b


def bwd_backend() -> str:
    """Backward backend from ADS_GDPA_BWD_BACKEND (auto|triton|gluon); auto = gluon: the
    warp-specialised Gluon backward where it supports the call (sm90), Triton elsewhere. On the H200
    (BENCHMARKS.md) it measured 434 / 400 / 469 / 323 / 333 TFLOP/s (max len 2048 s=1.0, 1024, dense
    4x16x4096, short KV, max len 2048 s=0.5) against Triton's 357 / 315 / 363 / 277 / 322.
    ADS_GDPA_BACKEND=triton forces Triton here too."""
    b = os.environ.get("ADS_GDPA_BWD_BACKEND", "auto").lower()
    if b not in ("auto", "triton", "gluon"):
        raise ValueError(f"ADS_GDPA_BWD_BACKEND must be auto, triton or gluon, got {b!r}")
    return "triton" if b == "triton" or backend() == "triton" else "gluon"


def bwd_tma() -> bool:
    return os.environ.get("ADS_GDPA_BWD_TMA", "0") == "1"


def dq_tma() -> bool:
    return os.environ.get("ADS_GDPA_BWD_DQ_TMA", "0") == "1"


def persistent() -> bool:
    return os.environ.get("ADS_GDPA_PERSISTENT", "0") == "1"


def skip_dead_halves(max_seqlen_q: int) -> bool:
    """Whether the Gluon forward takes its build that skips a consumer warpgroup's GEMMs when its
    half of a tile is past the sequence: for max_seqlen_q <= SKIP_DEAD_MAX_Q, where it measured
    faster (BENCHMARKS.md, eighth session); ADS_GDPA_SKIP_DEAD=0|1 overrides."""
    env = os.environ.get("ADS_GDPA_SKIP_DEAD")
    if env is not None:
        return env != "0"
    return max_seqlen_q <= SKIP_DEAD_MAX_Q


def defer_scale() -> bool:
    """Whether a forward may leave the scale to the output tile (where the kernel has such a form);
    ADS_GDPA_DEFER_SCALE=0 keeps it on every score (tuning)."""
    return os.environ.get("ADS_GDPA_DEFER_SCALE", "1") != "0"


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
    TileConfig(128, 64, 4, 2),  # 96 KB of shared memory: two CTAs per SM overlap each other's activation
    TileConfig(128, 64, 8, 3),
    TileConfig(128, 128, 8, 2),
    TileConfig(128, 32, 4, 4),
]
# Backward (dK/dV kernel): BLOCK_N kv rows held in registers, BLOCK_M query rows streamed.
BWD_SPACE = [
    TileConfig(64, 128, 8, 2),
    TileConfig(64, 128, 8, 3),
    TileConfig(32, 128, 8, 2),
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
    """Short-KV forward: all keys of a sequence in one step (BLOCK_N = next_pow2(max Lk)), raced
    against the streaming configs: a one-step tile has no load/compute overlap inside the CTA and
    needs ~160 KB of shared memory at Lk = 256 (one CTA per SM), so on H200 the 2-CTA streaming
    configs can win; autotuning decides per shape.
    """
    # one loop iteration: a second pipeline stage would only double the shared memory
    return [TileConfig(128, block_n, 8, 1), TileConfig(64, block_n, 4, 1), TileConfig(128, block_n, 4, 1)] + [
        c for c in FWD_SPACE if c.block_n < block_n
    ]


SMEM_LIMIT = 232448  # bytes per CTA on sm90
# estimates below are scaled by 4/3: layout-conversion scratch measured on H200 at D=256 (256 KB vs 192 KB)


def fwd_smem(c: TileConfig, d_qk: int, d_v: int, elem: int = 2) -> int:
    """Shared memory of a forward config: the Q tile plus num_stages K/V tiles (padded head dims)."""
    return elem * (c.block_m * d_qk + c.num_stages * c.block_n * (d_qk + d_v)) * 4 // 3


def bwd_smem(c: TileConfig, d_qk: int, d_v: int, elem: int = 2) -> int:
    """dK/dV kernel: resident K/V tiles plus num_stages Q/dO tiles."""
    return elem * (c.block_n * (d_qk + d_v) + max(c.num_stages, 1) * c.block_m * (d_qk + d_v)) * 4 // 3


def fit(space: list[TileConfig], pinned: TileConfig, smem, d_qk: int, d_v: int) -> tuple:
    """Drop configs over the shared-memory budget (large head dims, e.g. 192 padded to 256)."""
    ok = [c for c in space if smem(c, d_qk, d_v) <= SMEM_LIMIT]
    if not ok:  # shrink the cheapest config until it fits
        c = min(space, key=lambda c: smem(c, d_qk, d_v))
        while smem(c, d_qk, d_v) > SMEM_LIMIT and (c.num_stages > 1 or c.block_n > 16 or c.block_m > 16):
            if c.num_stages > 1:
                c = TileConfig(c.block_m, c.block_n, c.num_warps, c.num_stages - 1)
            elif c.block_n >= c.block_m:
                c = TileConfig(c.block_m, c.block_n // 2, c.num_warps, 1)
            else:
                c = TileConfig(c.block_m // 2, c.block_n, c.num_warps, 1)
        ok = [c]
    if smem(pinned, d_qk, d_v) > SMEM_LIMIT:
        pinned = ok[0]
    return ok, pinned


def seqlen_bucket(n: int) -> int:
    """Autotune key bucket: next power of two, at least 16."""
    return max(16, triton.next_power_of_2(max(int(n), 1)))
