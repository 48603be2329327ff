"""Tile choices for the norm-fused GEMMs, with environment overrides for tuning runs.

One program owns ``BLOCK_M`` whole rows of the normalised dimension and walks its ``BLOCK_N``-wide
column tiles, so tiles are picked for the GEMM (wgmma m64 per warpgroup, 64-wide K steps) and for
how many row blocks the grid gets: below two row blocks per SM the rows are cut to 64.

Env knobs (sweeps only; unset in normal use), all integers:
``ADS_NORM_FUSION_BLOCK_M``, ``ADS_NORM_FUSION_BLOCK_N``, ``ADS_NORM_FUSION_BLOCK_K``,
``ADS_NORM_FUSION_WARPS``, ``ADS_NORM_FUSION_STAGES`` (row-norm kernels) and
``ADS_NORM_FUSION_RMS_BLOCK_N``, ``ADS_NORM_FUSION_RMS_STAGES`` (the ``rmsnorm_linear`` GEMM),
``ADS_NORM_FUSION_RMS_BLOCK_M`` (its whole-row dx tile, see ``rms_gemm_config``); and
``ADS_NORM_FUSION_RMS_FLATTEN``, ``ADS_NORM_FUSION_RMS_TMA_STORE`` (0/1, see ``rms_flatten``),
``ADS_NORM_FUSION_RMS_AUX_DESC`` (0/1, see ``rms_aux_desc``),
``ADS_NORM_FUSION_RMS_FWD`` (fused/auto/rowpass, see ``rms_forward_rowpass``),
``ADS_NORM_FUSION_RMS_BWD`` (cublas/input/output, see ``rms_backward_mode``),
``ADS_NORM_FUSION_RMS_DW`` (cublas/kernel, see ``rms_weight_grad``), ``ADS_NORM_FUSION_DW_STAGES``,
``ADS_NORM_FUSION_RMS_GLUON`` (auto/on/0, see ``rms_gluon``), ``ADS_NORM_FUSION_RMS_GLUON_NT``
(1/2/4, see ``rms_gluon_nt``),
``ADS_NORM_FUSION_FLATTEN`` (0/1, see ``flatten_loops``),
``ADS_NORM_FUSION_PERSISTENT`` (0/1, see ``rownorm_persistent``), ``ADS_NORM_FUSION_PROGS_PER_SM``
(see ``persistent_config``), ``ADS_NORM_FUSION_GLUON`` (auto/on/0, see ``gluon_forward``),
``ADS_NORM_FUSION_GLUON_SPLIT`` (1/2, see ``gluon_split``), ``ADS_NORM_FUSION_GLUON_WS`` (0/1, see
``gluon_ws``), ``ADS_NORM_FUSION_GLUON_EPI`` (0/1, see ``gluon_epi``), ``ADS_NORM_FUSION_GLUON_PART``
(512/256, see ``gluon_split``); ``ADS_NORM_FUSION_BWD_BLOCK_M``,
``ADS_NORM_FUSION_BWD_ROWS``, ``ADS_NORM_FUSION_BWD_WARPS``, ``ADS_NORM_FUSION_BWD_STAGES``,
``ADS_NORM_FUSION_BWD_ACC2D`` (the row-wise norm backward, see ``norm_bwd_config``),
``ADS_NORM_FUSION_BWD_SUMS`` (fused/torch/kernel, see ``norm_bwd_sums``);
``ADS_NORM_FUSION_SAVE`` (z/xhat, see ``save_prenorm``). Every launch goes through the tools' launch
cache, switched by the tools' ``ADS_LAUNCH_CACHE``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ads_kernel_tools import envvars
from ads_kernel_tools.capability import interpreter_active

SUPPORTED_MULTIPLE = 16  # N and K: TMA needs 16-byte strides, wgmma k-steps of 16
# Interpreter tiles: small, so CPU tests cross several column tiles (the two-phase path) on small N.
_INTERP = (32, 32, 32, 4, 1)  # block_m, block_n, block_k, warps, stages


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def single_tile(self, n: int) -> bool:
        return n <= self.block_n


_MEMO_MAX = 256
_MISSING = object()


def _per_knobs(*knobs: str):
    """Memoises a tile choice per arguments, per the values of ``knobs`` (the ones it reads, one
    ``envvars.snapshot``; a test checks each list against the function's source) and per
    ``interpreter_active()``: the launchers ask for their tiles on every launch, and a choice reads
    several knobs and builds a dataclass. A changed knob (a sweep, ``monkeypatch.setenv``) is a new
    key. Errors are not cached."""

    def wrap(fn):
        cache: dict = {}

        @functools.wraps(fn)
        def memo(*args, **kwargs):
            key = (args, tuple(kwargs.items()), envvars.snapshot(knobs), interpreter_active())
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = fn(*args, **kwargs)
                if len(cache) >= _MEMO_MAX:
                    cache.clear()
                cache[key] = value
            return value

        memo.knobs = knobs
        memo.cache_clear = cache.clear
        return memo

    return wrap


def _env_int(name: str) -> int | None:
    value = envvars.get(name)
    return int(value) if value else None


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


@_per_knobs(
    "ADS_NORM_FUSION_BLOCK_K",
    "ADS_NORM_FUSION_BLOCK_M",
    "ADS_NORM_FUSION_BLOCK_N",
    "ADS_NORM_FUSION_STAGES",
    "ADS_NORM_FUSION_WARPS",
)
def rownorm_config(m: int, n: int, k: int, num_sms: int, *, backward: bool = False) -> TileConfig:
    """Tiles for the kernels that normalise over the GEMM's output width n (row-norm epilogue).

    n <= 256 fits one register tile (whole row in the accumulator); wider rows take 128- or 256-wide
    column tiles, whichever divides n (masked tail otherwise), staged through the output buffer.
    A one-tile ``backward`` (``_rownorm._bwd_single``: x̂ in, dz and x̂·γ out through tensor
    descriptors) holds g, x̂ and dz of its rows at once: 64 rows (at 128 its sm_90 build spills) and two
    stages, so that two programs share an SM and one's epilogue hides the other's loads.
    """
    if interpreter_active():
        bm, bn, bk, warps, stages = _INTERP
        bn = max(16, min(bn, _pow2_at_least(n)))
    else:
        bm = 128 if (m + 127) // 128 >= 2 * num_sms else 64
        bn = _pow2_at_least(n) if n <= 256 else (256 if n % 256 == 0 else 128)
        bk = 64
        # 8 warps = two warpgroups per 128-row tile; a 64-row tile is one warpgroup's wgmma
        warps = 8 if bm * bn >= 128 * 128 else 4
        stages = 4  # H200 sweep at 65536x1024x1024: 4 stages 2-3 % faster than 3 (BENCHMARKS.md)
        if backward and n <= 256:
            bm, warps, stages = 64, 8, 2
    return TileConfig(
        block_m=_env_int("ADS_NORM_FUSION_BLOCK_M") or bm,
        block_n=_env_int("ADS_NORM_FUSION_BLOCK_N") or bn,
        block_k=_env_int("ADS_NORM_FUSION_BLOCK_K") or bk,
        num_warps=_env_int("ADS_NORM_FUSION_WARPS") or warps,
        num_stages=_env_int("ADS_NORM_FUSION_STAGES") or stages,
    )


@_per_knobs("ADS_NORM_FUSION_RMS_BLOCK_M", "ADS_NORM_FUSION_RMS_BLOCK_N", "ADS_NORM_FUSION_RMS_STAGES")
def rms_gemm_config(m: int, n: int, k: int, *, backward: bool = False, row_coef: bool = False) -> TileConfig:
    """Tiles for ``rmsnorm_linear``'s persistent GEMM (the norm is a per-row scale in the epilogue).

    Forward: 128×256×64, 8 warps, 3 stages (the shape of Triton's persistent TMA matmul on Hopper; 3
    stages of A and B tiles plus the halved TMA-store tile fit shared memory). Backward dx (the epilogue
    also reads an x tile): 128×128, so acc, x and the result stay in registers. ``row_coef`` (n <=
    ``ROW_COEF_MAX_N``): one tile spans the row, 64 rows so that acc and x fit registers at 256 wide.
    """
    if interpreter_active():
        if row_coef:
            return TileConfig(_INTERP[0], max(16, _pow2_at_least(n)), *_INTERP[2:])
        return TileConfig(*_INTERP)
    if row_coef:
        return TileConfig(
            _env_int("ADS_NORM_FUSION_RMS_BLOCK_M") or 64, _pow2_at_least(n), 64, 8,
            _env_int("ADS_NORM_FUSION_RMS_STAGES") or 4,
        )  # fmt: skip
    if backward:
        bn = 128 if n >= 128 else _pow2_at_least(n)
    else:
        bn = 256 if n >= 256 else _pow2_at_least(n)
    bn = _env_int("ADS_NORM_FUSION_RMS_BLOCK_N") or bn
    return TileConfig(128, bn, 64, 8, _env_int("ADS_NORM_FUSION_RMS_STAGES") or 3)


@_per_knobs("ADS_NORM_FUSION_DW_STAGES")
def rms_dw_config() -> TileConfig:
    """Tiles of ``rmsnorm_linear``'s weight-gradient kernel (``triton._rms_dw``): BLOCK_M rows of the
    reduction per step, a (BLOCK_N, BLOCK_K) output tile, two warpgroups of m64 over BLOCK_N."""
    if interpreter_active():
        return TileConfig(*_INTERP)
    return TileConfig(64, 128, 128, 8, _env_int("ADS_NORM_FUSION_DW_STAGES") or 3)


def rms_flatten() -> bool:
    """``ADS_NORM_FUSION_RMS_FLATTEN=0`` turns off the flattened (tile × K) software pipeline of the
    ``rmsnorm_linear`` persistent GEMM (on by default, as in Triton's persistent TMA matmul; the
    benchmark table was measured with it on, the isolated GEMM at 65536×1024×1024 took 225 µs on and
    211 µs off: a candidate for the next run)."""
    return envvars.get("ADS_NORM_FUSION_RMS_FLATTEN", "1") == "1"


RMS_ROWPASS_MIN_K = 1024  # H200: the row pass + persistent GEMM beat the Σx²-in-K-loop kernel at K=1024
# and lost to it at K=256 and 512 (BENCHMARKS.md)


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = envvars.get(name, default).strip().lower() or default
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def rms_forward_rowpass(k: int) -> bool:
    """Which ``rmsnorm_linear`` forward runs: the row pass + persistent scaled GEMM, or the single
    kernel with Σx² in its K loop. ``ADS_NORM_FUSION_RMS_FWD``: ``auto`` (default: the row pass at
    K >= 1024, where the H200 measured it faster, the single kernel below), ``fused`` (always the
    single kernel) or ``rowpass`` (always the row pass)."""
    mode = _choice("ADS_NORM_FUSION_RMS_FWD", "auto", ("fused", "auto", "rowpass"))
    return mode == "rowpass" or (mode == "auto" and k >= RMS_ROWPASS_MIN_K)


def rms_gluon(m: int, n: int) -> bool:
    """``ADS_NORM_FUSION_RMS_GLUON``: whether the Gluon sm_90 ``rmsnorm_linear`` forward
    (``gluon.rms_linear_sm90``: Σx² from the GEMM's own A tiles, no row pass) may take an (M, K) x
    (N, K) call, which ``gluon.dispatch.rms_linear_why_not`` then checks. ``auto`` (default): calls of
    M·N >= 2^25 outputs (below, host time dominates, as for ``gluon_forward``), where it measured
    1.05-1.12x the cuBLAS GEMM on the H100 against 1.21-1.76x for the Triton kernels
    (BENCHMARKS.md); ``on``: every call (tests); ``0``: never (the Triton kernels,
    ``rms_forward_rowpass``)."""
    mode = _choice("ADS_NORM_FUSION_RMS_GLUON", "auto", ("auto", "on", "0"))
    return mode == "on" or (mode == "auto" and m * n >= GLUON_MIN_ELEMENTS)


def rms_gluon_nt() -> int:
    """``ADS_NORM_FUSION_RMS_GLUON_NT``: column tiles per program of the Gluon ``rmsnorm_linear``
    forward (each program sums x² once per row block, in its first tile). ``1`` (default): every
    program one 256-column tile of a row block; ``2``, ``4``: fewer programs per row block, each
    walking more tiles (A/B runs)."""
    return int(_choice("ADS_NORM_FUSION_RMS_GLUON_NT", "1", ("1", "2", "4")))


def rms_backward_mode() -> str:
    """``ADS_NORM_FUSION_RMS_BWD``, how ``rmsnorm_linear``'s backward forms dx and dγ. ``cublas``
    (default): g = dy @ W through cuBLAS, then the row-wise RMSNorm backward over K (``_norm_bwd``,
    whole rows of K in registers, dγ summed in the kernel) which also writes x̂·γ for dW; faster
    than ``output`` on the H200 at K = 256, 512 and 1024 (BENCHMARKS.md). ``output``: dx from the
    saved output (a row pass for Σ dy·(y − b), then an output-tiled GEMM with a per-row epilogue; at
    K <= ``ROW_COEF_MAX_N`` one tile spans the row and forms that sum itself, no row pass);
    ``input``: dy @ W with the RMSNorm backward over K in the GEMM's epilogue
    (``gemm_norm_input_grad``); ``auto``: ``output`` where K <= ``ROW_COEF_MAX_N``, else ``cublas``.
    K above ``NORM_BWD_MAX_N`` takes ``output``."""
    return _choice("ADS_NORM_FUSION_RMS_BWD", "cublas", ("auto", "cublas", "input", "output"))


def rms_weight_grad() -> str:
    """``ADS_NORM_FUSION_RMS_DW``, how ``rmsnorm_linear``'s backward forms dW. ``cublas`` (default):
    dyᵀ @ (x̂·γ) through cuBLAS, x̂·γ written by the kernel that forms dx; ``kernel``: the split-M
    kernel that scales x by rrms in registers (``triton._rms_dw``), no x̂·γ tensor; ``auto``: the kernel
    where dx comes from the ``output`` path (which makes no x̂·γ), else cuBLAS."""
    return _choice("ADS_NORM_FUSION_RMS_DW", "cublas", ("auto", "cublas", "kernel"))


def rms_aux_desc() -> bool:
    """``ADS_NORM_FUSION_RMS_AUX_DESC``: the whole-row (K <= ``ROW_COEF_MAX_N``) dx GEMM reads x and
    writes dx through tensor descriptors where their alignment allows (``1``, default: 1.3-1.6x faster
    than pointer tiles on the H100, BENCHMARKS.md) or through pointers (``0``)."""
    return envvars.get("ADS_NORM_FUSION_RMS_AUX_DESC", "1") == "1"


def rms_tma_store() -> bool:
    """``ADS_NORM_FUSION_RMS_TMA_STORE=0``: the ``rmsnorm_linear`` forward GEMM stores its tiles with
    masked pointer stores instead of TMA stores (a sweep knob)."""
    return envvars.get("ADS_NORM_FUSION_RMS_TMA_STORE", "1") == "1"


# "gemm" (4) is the same kernel without the norm: the benchmark's measure of our GEMM alone
ROWNORM_MODES = {"ln_fwd": 0, "rms_fwd": 1, "ln_bwd": 2, "rms_bwd": 3, "gemm": 4}


def flatten_loops(default: bool = False) -> bool:
    """``ADS_NORM_FUSION_FLATTEN=1``/``0``: let Triton flatten the column-tile (or step) and K loops
    into one pipeline; unset: ``default`` (off for ``rownorm_kernel``, on for the persistent one)."""
    value = envvars.get("ADS_NORM_FUSION_FLATTEN", "")
    return default if not value else value == "1"


PERSISTENT_MAX_N = 8192  # widest rows the persistent forward takes: timed to N = 4096, GPU-tested to 8192;
# wider rows keep the per-row-block two-phase kernel


def rownorm_persistent(n: int, block_n: int) -> bool:
    """Whether the ``linear_*norm`` forward runs the persistent kernel (``rownorm_persistent_kernel``)
    rather than one program per row block: rows wider than one column tile, up to
    ``PERSISTENT_MAX_N``. ``ADS_NORM_FUSION_PERSISTENT=0`` keeps the per-row-block kernel (A/B knob)."""
    if envvars.get("ADS_NORM_FUSION_PERSISTENT", "1") != "1":
        return False
    return block_n < n <= PERSISTENT_MAX_N


@dataclass(frozen=True)
class PersistentConfig:
    tiles: TileConfig
    programs: int


@_per_knobs(
    "ADS_NORM_FUSION_BLOCK_K",
    "ADS_NORM_FUSION_BLOCK_M",
    "ADS_NORM_FUSION_BLOCK_N",
    "ADS_NORM_FUSION_PROGS_PER_SM",
    "ADS_NORM_FUSION_STAGES",
    "ADS_NORM_FUSION_WARPS",
)
def persistent_config(m: int, n: int, k: int, num_sms: int) -> PersistentConfig:
    """Tiles and grid of the persistent forward: 128×256×64 tiles, 8 warps, one program per SM (no
    more programs than row blocks); 4 stages at K >= 1024 (H200: 2-10 % faster than 3 at every such
    LayerNorm shape; 2 programs per SM with smaller tiles were 25-45 % slower) and 3 below (faster at
    8192×512×512). The interpreter takes its small tiles and three programs, so the CPU suite walks
    several row blocks per program."""
    if interpreter_active():
        tiles = TileConfig(*_INTERP)
        tiles = TileConfig(tiles.block_m, max(16, min(tiles.block_n, _pow2_at_least(n))), *_INTERP[2:])
        per_sm, sms = 1, 3
    else:
        bn = 256 if n % 256 == 0 else 128
        tiles = TileConfig(128, bn, 64, 8, 4 if k >= 1024 else 3)
        per_sm, sms = 1, num_sms
    tiles = TileConfig(
        block_m=_env_int("ADS_NORM_FUSION_BLOCK_M") or tiles.block_m,
        block_n=_env_int("ADS_NORM_FUSION_BLOCK_N") or tiles.block_n,
        block_k=_env_int("ADS_NORM_FUSION_BLOCK_K") or tiles.block_k,
        num_warps=_env_int("ADS_NORM_FUSION_WARPS") or tiles.num_warps,
        num_stages=_env_int("ADS_NORM_FUSION_STAGES") or tiles.num_stages,
    )
    per_sm = _env_int("ADS_NORM_FUSION_PROGS_PER_SM") or per_sm
    blocks = -(-m // tiles.block_m)
    return PersistentConfig(tiles, max(1, min(blocks, per_sm * sms)))


GLUON_MIN_ELEMENTS = 1 << 25  # M·N below which ``auto`` keeps the Triton forward


def gluon_forward(m: int, n: int) -> bool:
    """``ADS_NORM_FUSION_GLUON``: whether the Gluon sm_90 forward of ``linear_*norm`` (the row
    block's GEMM output kept in shared memory, ``gluon.fwd_sm90``) may take an (M, K) x (N, K)
    call, which its predicate ``gluon.dispatch.why_not`` then checks (a training forward that saves
    the pre-norm value runs it only where ``gluon_epi_split`` cuts N). ``auto`` (default): calls of
    M·N >= 2^25 outputs, where with its warp-specialised kernel (``gluon_ws``) it measured faster
    than the Triton forward on the H200 (65536×1024×1024: LayerNorm 339 -> 285 us, RMSNorm 310 ->
    261 us); below, its host launch dominates (8192×512×512 RMSNorm: 141 us against 96 us).
    ``on``: every call (tests); ``0``: never (BENCHMARKS.md)."""
    mode = gluon_mode()
    return mode == "on" or (mode == "auto" and m * n >= GLUON_MIN_ELEMENTS)


def gluon_mode() -> str:
    """``ADS_NORM_FUSION_GLUON`` as given: auto (default), on or 0 (see ``gluon_forward``)."""
    return _choice("ADS_NORM_FUSION_GLUON", "auto", ("auto", "on", "0"))


GLUON_MAX_PART = 512  # gluon.fwd_sm90.MAX_PART: columns one program holds of a 128-row block
GLUON_MAX_SPLIT = 16  # programs per row block: N up to 16 x 512 = 8192


def gluon_split(n: int) -> int:
    """``ADS_NORM_FUSION_GLUON_SPLIT``: how many programs share one row block of the Gluon forward's warp-
    specialised and single-partition kernels (``gluon.fwd_sm90``; calls with x̂, or
    ``ADS_NORM_FUSION_GLUON_EPI=0``: the normalisation-partition kernel splits by ``gluon_epi_split``).
    ``2`` (default): 128-row blocks, each of S programs holding N/S columns and exchanging row
    statistics with its partners; S = 2 up to N = 1024 (N a multiple of 128, otherwise 1), above that
    the fewest programs whose parts are multiples of 128 of at most 512 columns (N = 4096: 8; 1 where
    none of up to 16 programs fits: the Gluon forward then refuses N > 1024;
    ``ADS_NORM_FUSION_GLUON_PART=256`` caps the parts at 256 columns instead, for A/B runs). ``1``:
    64-row blocks, each program holding all N <= 1024 columns. H200, 65536×1024×1024 LayerNorm: 1.56×
    (split 2) and 1.92× (split 1) the cuBLAS GEMM of their runs (split 2 loads half the bytes per FLOP;
    BENCHMARKS.md)."""
    if _choice("ADS_NORM_FUSION_GLUON_SPLIT", "2", ("1", "2")) == "1":
        return 1
    max_part = int(_choice("ADS_NORM_FUSION_GLUON_PART", str(GLUON_MAX_PART), ("512", "256")))
    if n <= 1024 and (n % 128 or n // 2 <= max_part):
        return 1 if n % 128 else 2
    for split in range(2, max(GLUON_MAX_SPLIT, 2 * n // max_part) + 1):
        part, rest = divmod(n, split)
        if rest == 0 and part % (128 if n > 1024 else 64) == 0 and part <= max_part:
            return split
    return 1


GLUON_EPI_PARTS = (256, 128)  # gluon.fwd_epi_sm90: the columns one program holds, widest first
GLUON_EPI_MAX_SPLIT = 32


def gluon_epi() -> bool:
    """``ADS_NORM_FUSION_GLUON_EPI``: ``1`` (default) sends the Gluon forward's calls without x̂
    whose N ``gluon_epi_split`` can cut to its kernel (``gluon.fwd_epi_sm90``: the normalisation in
    a partition of its own, under the next row block's GEMM); ``0`` keeps ``fwd_sm90``. The default
    since it measured faster at every benchmark shape but one (level there; BENCHMARKS.md,
    Experiments)."""
    return _choice("ADS_NORM_FUSION_GLUON_EPI", "1", ("0", "1")) == "1"


def gluon_epi_split(n: int) -> int:
    """Programs per 128-row block of ``gluon.fwd_epi_sm90`` for N columns: N/256 where 256 divides
    N, else N/128, at most ``GLUON_EPI_MAX_SPLIT``; 0 where neither fits (N = 4096: 16)."""
    for part in GLUON_EPI_PARTS:
        if n % part == 0 and n // part <= GLUON_EPI_MAX_SPLIT:
            return n // part
    return 0


def gluon_ws() -> bool:
    """``ADS_NORM_FUSION_GLUON_WS``: ``1`` (default) runs the Gluon forward's warp-specialised kernel
    (``fwd_sm90.linear_norm_fwd_ws_kernel``: a one-warp TMA producer feeding one 64-row MMA
    warpgroup per ``gluon_split``, ring slots released through empty mbarriers, step counters
    carried); ``0`` the single-partition kernel, whose warps issue both the TMA loads and the wgmma
    (same tiles, ring depth and results; 1.16-1.24x slower on the H200, BENCHMARKS.md)."""
    return _choice("ADS_NORM_FUSION_GLUON_WS", "1", ("0", "1")) == "1"


def save_prenorm() -> bool:
    """What a training forward of ``linear_*norm`` keeps for the backward (affine norms only).
    ``ADS_NORM_FUSION_SAVE=z``: the pre-norm value with a per-row offset, from which the backward
    recomputes x̂ in fp32: the Triton forwards save the tile they stage the row in (z shifted by
    the first column tile's mean for LayerNorm, that mean the offset), so it costs them no extra
    M×N store; the Gluon normalisation-partition kernel (``gluon_epi``, N cut by
    ``gluon_epi_split``) stores z minus the row mean (offset 0) or, RMSNorm, z from its
    normalisation partition. ``xhat``: a separate x̂ written next to y by the Triton kernels or
    ``gluon.fwd_sm90``. Default ``z`` (H200, LayerNorm training forward at 65536×1024×1024 through
    the Triton kernels: 415 → 332 µs; through the normalisation partition on the H100, 1.3-1.5x
    faster than the Triton forward at N or K of 4096; BENCHMARKS.md)."""
    return _choice("ADS_NORM_FUSION_SAVE", "z", ("z", "xhat")) == "z"


def norm_bwd_sums() -> str:
    """``ADS_NORM_FUSION_BWD_SUMS``: where the norm backward's per-program partial sums become dγ, dβ
    and the GEMM bias gradient. ``fused`` (default): in the norm-backward kernel itself (the last
    program of each group of 32 adds the group's rows, the last group the groups', counted with
    atomics; no further launch, no zero fill); ``torch``: one reduction and one cast per output;
    ``kernel``: one more Triton launch for all of them. On the H200 ``fused`` was the fastest where
    the host bounds the step (8192×512×512) and level with ``torch`` at 65536×1024×1024
    (BENCHMARKS.md). All three add in a fixed order."""
    return _choice("ADS_NORM_FUSION_BWD_SUMS", "fused", ("fused", "torch", "kernel"))


ROW_COEF_MAX_N = 256  # rmsnorm_linear's dx GEMM forms the row coefficient in-tile up to this K
NORM_BWD_MAX_N = 16384  # whole rows in registers; wider rows use the two-phase row-norm kernel
_INTERP_NORM_BWD_MAX_N = 64  # so that the CPU suite's shapes exercise both backward paths


@dataclass(frozen=True)
class NormBwdConfig:
    block_m: int
    block_n: int
    rows_per_prog: int
    num_warps: int
    num_stages: int = 3  # Triton's default for a launch
    acc_2d: bool = False  # column partials per tile row, reduced once per program (see _norm_bwd)


@_per_knobs(
    "ADS_NORM_FUSION_BWD_ACC2D",
    "ADS_NORM_FUSION_BWD_BLOCK_M",
    "ADS_NORM_FUSION_BWD_ROWS",
    "ADS_NORM_FUSION_BWD_STAGES",
    "ADS_NORM_FUSION_BWD_WARPS",
)
def norm_bwd_config(m: int, n: int, num_sms: int) -> NormBwdConfig | None:
    """Memory-bound row kernel: each program walks its rows four at a time (``BLOCK_M`` = 4 for
    1024 <= N <= 4096; tiles of 4096 elements below, of 16384 above), 4 warps up to 4096 elements a
    tile and 8 beyond, about eight programs per SM and at least eight tiles per program (fewer,
    longer programs keep the weight-gradient partial-sum buffer small). H200, LayerNorm at
    65536×1024 / 16384×4096: 112 / 128 µs against ~96 µs for the 403 MB it moves; the previous
    8-row (2-row at N = 4096) tiles took 350 / 173 µs (BENCHMARKS.md, Experiments). The sweep knobs
    ``ADS_NORM_FUSION_BWD_BLOCK_M`` (rows per register tile, a power of two; the other defaults follow
    it, so ``8192 // BLOCK_N`` gives back the previous tiles), ``ADS_NORM_FUSION_BWD_ROWS`` (rows per
    program, a multiple of it), ``ADS_NORM_FUSION_BWD_WARPS``, ``ADS_NORM_FUSION_BWD_STAGES`` and
    ``ADS_NORM_FUSION_BWD_ACC2D=1`` (weight-gradient partials kept per tile row, reduced across rows
    once per program instead of every tile; slower with these tiles) override it."""
    if n > (_INTERP_NORM_BWD_MAX_N if interpreter_active() else NORM_BWD_MAX_N):
        return None
    block_n = _pow2_at_least(n)
    if interpreter_active():
        block_m = _env_int("ADS_NORM_FUSION_BWD_BLOCK_M") or min(max(1, 8192 // block_n), 8)
        rows, warps = 32, 4
    else:
        block_m = max(1, min(max(4, 4096 // block_n), 16384 // block_n))
        block_m = _env_int("ADS_NORM_FUSION_BWD_BLOCK_M") or block_m
        rows = _pow2_at_least(max(block_m, -(-m // (8 * num_sms))))
        rows = min(max(rows, 8 * block_m), max(1024, block_m))
        warps = 4 if block_m * block_n <= 4096 else 8
    rows = _env_int("ADS_NORM_FUSION_BWD_ROWS") or rows
    if block_m & (block_m - 1) or rows % block_m:
        raise ValueError(
            f"norm backward tiles: BLOCK_M {block_m} must be a power of two dividing ROWS {rows}"
        )
    return NormBwdConfig(
        block_m=block_m,
        block_n=block_n,
        rows_per_prog=rows,
        num_warps=_env_int("ADS_NORM_FUSION_BWD_WARPS") or warps,
        num_stages=_env_int("ADS_NORM_FUSION_BWD_STAGES") or 3,
        acc_2d=envvars.get("ADS_NORM_FUSION_BWD_ACC2D", "0") == "1",
    )
