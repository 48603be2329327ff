"""Launch settings for the block-attention kernels, with environment overrides for tuning runs.

Defaults were picked on the H200 (see BENCHMARKS.md): one 64×D tile per program needs no software
pipelining, so only the warp count matters. (A persistent backward striding over tiles with
``tl.range`` pipelining measured slower than this plain grid at every setting and was removed.)
Env knobs (for sweeps, never needed in normal use): ``ADS_BLOCK_ATTN_FWD_WARPS``,
``ADS_BLOCK_ATTN_BWD_WARPS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ads_kernel_tools import envvars

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128)
MAX_BLOCK_ELEMS = 64 * 256  # block_size x head dim: 128 x 256 overflowed the H200's 227 KB per CTA


@dataclass(frozen=True)
class LaunchConfig:
    """Triton launch parameters for one kernel."""

    num_warps: int


def _env_int(name: str) -> int | None:
    value = envvars.get(name)
    return int(value) if value else None


def fwd_config(head_dim: int, block_size: int) -> LaunchConfig:
    """Forward: 4 warps (one warpgroup, wgmma m64) up to D=128; 8 at D=256 to bound register use."""
    warps = _env_int("ADS_BLOCK_ATTN_FWD_WARPS")
    if warps is None:
        warps = 8 if head_dim * block_size > 64 * 128 else 4
    return LaunchConfig(num_warps=warps)


def bwd_config(head_dim: int, block_size: int) -> LaunchConfig:
    """Backward: 4 warps up to D=128 (H200 sweep, D=128: 3166 GB/s with 4 warps, 2083 with 8, as more
    CTAs fit per SM); 8 at D=256 to bound the two fp32 D-wide accumulators (dK, dV)."""
    warps = _env_int("ADS_BLOCK_ATTN_BWD_WARPS")
    if warps is None:
        warps = 8 if head_dim * block_size > 64 * 128 else 4
    return LaunchConfig(num_warps=warps)
