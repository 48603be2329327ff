"""Tile configurations, autotune spaces and every environment knob of ads-gdpa (read here only).

Booleans are parsed one way (``_flag``: 1/true/yes/on, 0/false/no/off); choices raise ValueError on an
unknown value. Whether the Triton interpreter runs and how many SMs a GPU has come from
``ads_kernel_tools.capability``; ``ADS_CHECK_INPUTS`` (device offsets validated with one sync per call)
is read by ``ads_kernel_tools.offsets`` for every package.

Env:
    ADS_GDPA_BACKEND=auto|triton|gluon|cute  forward backend. auto: the fastest kernel whose support
        table covers the call (``ads_gdpa.dispatch``: the warp-specialised Gluon kernels on sm90), the
        portable Triton kernels everywhere else; ``triton`` forces Triton (forward and backward);
        ``cute`` takes the CuTe DSL sm_90 forward (``pip install ads-gdpa[cute]``) wherever its table
        covers the call, Gluon elsewhere (opt-in: 0.97-1.01x the Gluon forward, BENCHMARKS.md).
    ADS_GDPA_BWD_BACKEND=auto|triton|gluon|cute  the same for the backward alone. With the CuTe DSL
        installed (``pip install ads-gdpa[cute]``) auto takes its sm_90 kernel in the shape class
        where it measured faster (``dispatch.PREFER``: D=128, more than 256 keys per sequence) and
        Gluon elsewhere; ``cute`` takes it wherever its support table covers the call, ``gluon``
        never; outside its table either goes where auto would.
    ADS_GDPA_CUTE_CACHE=0  keep the CuTe DSL kernels compiled in memory only (default: also on disk,
        so a later process loads them instead of compiling; ``ads_gdpa.cute.kernel_cache``);
        ADS_GDPA_CUTE_CACHE_DIR moves that folder (default ~/.cache/ads_gdpa/cute).
    ADS_GDPA_DISABLE_AUTOTUNE=1  pin one config per Triton kernel (always on under the interpreter).
    ADS_GDPA_PERSISTENT=1  persistent Triton forward grid (2 programs per SM) when a tile map exists.
    ADS_GDPA_TMA=0|1  force the Triton kernels' TMA descriptor loads off or on (default: where the
        tensors' alignment allows, sm90+).
    ADS_GDPA_BWD_TMA=1  Triton backward with TMA Q/dO loads; ADS_GDPA_BWD_DQ_TMA=1 adds dQ by bulk
        TMA reductions. Opt-in: slower than the default on the H200 (BENCHMARKS.md).
    ADS_GDPA_SKIP_DEAD=0|1  the Hopper forwards' (Gluon and CuTe) build that skips a consumer
        warpgroup's GEMMs when its half of a tile is past the sequence (default: on for
        max_seqlen_q <= SKIP_DEAD_MAX_Q).
    ADS_GDPA_DEFER_SCALE=0  keep the scale on every score in the Gluon forward (tuning).
    ADS_GDPA_PACKED_ACT=1  the Gluon forward's bf16 fast_gelu in packed bf16x2 arithmetic, two scores
        per instruction (opt-in: slower than the default at long jagged rows, faster at short and
        dense ones on the H100; BENCHMARKS.md).
    ADS_GDPA_GLUON_CFG="stages,qbuf,epilogue"  override the Gluon forward's ring depth, Q buffers and
        epilogue (tuning); ADS_GDPA_GLUON_VARIANT=ws|ws_simple its consumer schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import triton

from ads_kernel_tools import envvars
from ads_kernel_tools.capability import interpreter_active

SHORT_KV_MAX = 256  # max_seqlen_k at or below which dense KV takes the one-step short-KV path
# The dead-half skip pays where dead halves are a large share of the half-steps (short maxima at
# sparsity 0.5) and costs a little at long maxima (BENCHMARKS.md).
SKIP_DEAD_MAX_Q = 512

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str, default: bool | None) -> bool | None:
    """A boolean knob: unset gives ``default``; any other value than the accepted ones raises."""
    raw = envvars.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}")


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = envvars.get(name, default).strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def autotune_disabled() -> bool:
    return interpreter_active() or bool(_flag("ADS_GDPA_DISABLE_AUTOTUNE", False))


def backend() -> str:
    """Forward backend wanted (ADS_GDPA_BACKEND): "gluon" (the fast path where it covers the call;
    also what auto means), "cute" (the CuTe DSL forward where its table covers the call, opt-in)
    or "triton"."""
    b = _choice("ADS_GDPA_BACKEND", "auto", ("auto", "triton", "gluon", "cute"))
    return "gluon" if b == "auto" else b


def bwd_backend() -> str:
    """Backward backend wanted (ADS_GDPA_BWD_BACKEND: auto, gluon, cute or triton);
    ADS_GDPA_BACKEND=triton forces Triton here too."""
    b = _choice("ADS_GDPA_BWD_BACKEND", "auto", ("auto", "triton", "gluon", "cute"))
    return "triton" if backend() == "triton" else b


def cute_disk_cache() -> bool:
    """Whether compiled CuTe DSL kernels are kept on disk across processes (ADS_GDPA_CUTE_CACHE)."""
    return bool(_flag("ADS_GDPA_CUTE_CACHE", True))


def cute_cache_dir() -> Path:
    """The folder of the CuTe DSL kernel cache (ADS_GDPA_CUTE_CACHE_DIR)."""
    raw = envvars.get("ADS_GDPA_CUTE_CACHE_DIR", "").strip()
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "ads_gdpa" / "cute"


def cute_dsl_arch() -> str | None:
    """The CuTe DSL's own ``CUTE_DSL_ARCH`` (set for offline builds without a GPU), or None: the
    disk cache names its entries by the architecture the DSL compiles for."""
    return envvars.get("CUTE_DSL_ARCH", "").strip() or None


def bwd_tma() -> bool:
    return bool(_flag("ADS_GDPA_BWD_TMA", False))


def dq_tma() -> bool:
    return bool(_flag("ADS_GDPA_BWD_DQ_TMA", False))


def persistent() -> bool:
    return bool(_flag("ADS_GDPA_PERSISTENT", False))


def tma_override() -> bool | None:
    """ADS_GDPA_TMA: True/False forces the Triton kernels' TMA loads; None lets alignment decide."""
    return _flag("ADS_GDPA_TMA", None)


def skip_dead_halves(max_seqlen_q: int) -> bool:
    """Whether the Hopper forwards (Gluon, CuTe) take their build that skips a consumer warpgroup's
    GEMMs when its half of a tile is past the sequence: for max_seqlen_q <= SKIP_DEAD_MAX_Q by
    default (measured on the Gluon forward); ADS_GDPA_SKIP_DEAD overrides."""
    forced = _flag("ADS_GDPA_SKIP_DEAD", None)
    return max_seqlen_q <= SKIP_DEAD_MAX_Q if forced is None else forced


def packed_act() -> bool:
    """Whether the Gluon forward computes bf16 fast_gelu's deferred form in packed bf16x2 arithmetic
    (ADS_GDPA_PACKED_ACT=1; opt-in)."""
    return bool(_flag("ADS_GDPA_PACKED_ACT", False))


def defer_scale() -> bool:
    """Whether a forward may leave the scale to the output tile (where the kernel has such a form);
    ADS_GDPA_DEFER_SCALE=0 keeps it on every score (tuning)."""
    return bool(_flag("ADS_GDPA_DEFER_SCALE", True))


def gluon_cfg() -> tuple[int, int, int] | None:
    """ADS_GDPA_GLUON_CFG="stages,qbuf,epilogue" for the Gluon forward (tuning), or None."""
    raw = envvars.get("ADS_GDPA_GLUON_CFG", "").strip()
    if not raw:
        return None
    parts = raw.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"ADS_GDPA_GLUON_CFG={raw!r}: expected three integers 'stages,qbuf,epilogue'")
    st, qb, epi = (int(p) for p in parts)
    return st, qb, epi


def gluon_variant() -> str:
    """ADS_GDPA_GLUON_VARIANT: the Gluon forward's consumer schedule ("ws" ping-pong, default, or
    "ws_simple" free-running)."""
    return _choice("ADS_GDPA_GLUON_VARIANT", "ws", ("ws", "ws_simple"))


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
