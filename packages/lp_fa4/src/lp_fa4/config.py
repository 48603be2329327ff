"""Tile configurations and every environment knob of lp_fa4, read in one place.

Env:
    LP_FA4_DQ=pass|atomic  how the backward forms dQ when ``deterministic=False``: ``pass`` (default) a
        second kernel per query tile (bitwise repeatable, recomputes P), ``atomic`` fp32 atomics from
        the dK/dV kernel plus a cast. ``deterministic=True`` always takes ``pass``.
    LP_FA4_TMA=1  loads through per-sequence TMA tensor descriptors instead of pointer loads (K/V in
        the forward and the dQ pass, Q/dO in the dK/dV kernel; sm90+, not paged, 16-byte aligned
        rows). Opt-in: not timed on a GPU yet.
    LP_FA4_FWD_TMA=1|0  the Triton forward alone loads K/V through TMA descriptors (default 1 on a
        GPU, 0 under the interpreter: only with them does Triton pipeline the forward's K/V loads at
        128x128 tiles; LP_FA4_TMA=1 also turns it on).
    LP_FA4_BACKEND=auto|triton  the forward's kernel family: ``auto`` (default) takes the Gluon
        Hopper kernel (``lp_fa4.gluon``) where its support predicate admits the call, else Triton;
        ``triton`` always the portable Triton kernels.
    LP_FA4_FWD_LPT_MAX_S=8192  the longest dense causal sequence whose Gluon forward walks its tiles in
        L2-sized head groups, heaviest first (``fwd_sm90.fwd``'s ``lpt``); longer ones take the
        workload-sorted tile list (at 8192 the walk with balanced groups measured 579-583 TFLOP/s
        against the list's 546-579 on the H200; longer sequences were not measured).
    LP_FA4_FWD_LPT_BALANCE=1|0  size those groups for even work per persistent program
        (``fwd_sm90.lpt_group``, default 1) rather than by the L2 budget alone (0).
    LP_FA4_BWD_WINDOWS=1|0  whether the Gluon Hopper backward also takes windows: FA4's local windows
        and ``jagged_attention``'s top-left band (query tiles outside a kv tile's band skipped, edge
        tiles masked). Default 1: 1.66-1.73x the Triton backward at W = 256 on the H200
        (BENCHMARKS.md); ``0`` sends windowed backwards to the Triton kernels.
    LP_FA4_BWD_WINDOW_PHASE=1|0  the Gluon Hopper backward under a window walks each kv tile's query
        tiles in a rotated order (``bwd_sm90._q_tile_at``): the band's kv tiles then read each Q/dO
        tile and add into its dQ at the same step, while it is in L2. Default 1: 1.09-1.16x the plain
        walk at W = 256 on the H100 (BENCHMARKS.md); ``0`` walks each kv tile's range in order.
    LP_FA4_BWD_CAUSAL_WALK=1|0  the Gluon Hopper causal backward walks the first kv tile of each slot's
        pair from the last query tile down and the second up (``bwd_sm90._q_tile_at``), so the slots
        of a head meet the same query tile at the same step. Opt-in: 3-6 % slower dense and at
        varlen s = 1.0, 2-5 % faster at varlen s = 0.5 on the H100 (BENCHMARKS.md).
    LP_FA4_BWD_GRID=auto|persistent|items  the Gluon Hopper backward's grid: ``persistent`` one program
        per SM walking every num_SMs-th work item, ``items`` one program per work item, started in
        the tile list's order as SMs free up, so the kv tiles side by side in the list stay side by
        side in time (persistent programs drift apart as their items' lengths differ, and a band's
        neighbouring kv tiles then meet their shared query tiles out of step, outside L2); ``auto``
        (default) ``items`` under a window, else ``persistent``. H100: 1.14-1.23x at W = 256,
        level or 2-6 % slower without a window (BENCHMARKS.md).
    LP_FA4_BROADCAST_Q=auto|repeat|resident|kernel  how a ``broadcast_q`` call (PMA) runs
        (``lp_fa4.broadcast``): ``repeat`` repeats the queries per kv sequence before the op, so
        forward and backward run as ordinary jagged attention (the Gluon Hopper kernels where they
        take it); ``resident`` keeps broadcast_q in the op: the forward repeats internally onto the
        Gluon kernel where it takes the call (or runs the Triton kernel at a 64-row tile for the
        short query blocks of ``LP_FA4_BQ_SMALL_FWD``), the backward runs the query-resident kernel
        (``triton._bwd_resident``: MHA, Lq <= 128, no window, not deterministic), else the Triton
        in-place kernels; ``kernel`` the Triton in-place kernels both ways; ``auto`` (default)
        ``resident`` where its backward takes the call on a Gluon device and Lq <=
        ``LP_FA4_RESIDENT_MAX_LQ`` or the Gluon resident backward runs it (``LP_FA4_RESIDENT_KERNEL``),
        else ``repeat`` where the Gluon kernels take the repeated call (bf16/fp16, D == Dv in
        {64, 128}, sm_90, not deterministic), else ``kernel``.
    LP_FA4_RESIDENT_MAX_LQ=64  the longest query block ``auto`` sends to the Triton resident backward
        (at most 128, what it takes).
    LP_FA4_RESIDENT_KERNEL=auto|triton|gluon  which query-resident backward runs a ``resident`` call:
        ``gluon`` the Hopper kernel (``gluon.bwd_resident_sm90``: D = 128, a packed query block of at
        most 128 rows) wherever it takes the call, ``triton`` always ``triton._bwd_resident``, ``auto``
        (default, ``RESIDENT_KERNEL_DEFAULT``) the Gluon one for query blocks of more than 64
        computed rows (its two warpgroups hold 64 rows each; shorter blocks waste them).
    LP_FA4_BQ_SMALL_FWD=auto|0|1  which broadcast_q query blocks run the Triton forward's in-place
        broadcast at ``bq_fwd_tile`` instead of the Gluon forward on repeated queries: ``auto``
        (default) up to ``BQ_SMALL_AUTO_Q`` (32) rows, ``1`` up to one 64-row tile, ``0`` none
        (H200: faster at 32 rows, level at 64; BENCHMARKS.md).
    LP_FA4_BQ_FWD_BLOCK=0|1  ``1`` (default): the resident plan's Gluon forward loads every
        sequence's query tiles from the one block (``fwd_sm90.fwd``'s ``q_block``); ``0``: from a
        copy of the queries repeated per kv sequence (the path before; BENCHMARKS.md has both).
    LP_FA4_RESIDENT_TILE=N,W,S  the resident backward's key tile, warps and pipeline stages (default
        by the query block: ``config.resident_tile``).
    ADS_CHECK_INPUTS=1  value checks that read device offsets / page tables / FP8 descales (one host
        sync per call): monotone offsets inside the tensors, lengths <= max_seqlen (not
        ``jagged_attention``'s query rows, which are cut), page indices in range, descales finite and
        >= 0. Off by
        default: the hot path never syncs.
    TRITON_INTERPRET=1  (Triton's own) run the kernels on the CPU; tiles are pinned small there so
        tests reach tile edges with short sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from ads_kernel_tools import envvars

_TRUE = ("1", "true", "yes", "on")


def _flag(name: str, default: str = "0") -> bool:
    return envvars.get(name, default).strip().lower() in _TRUE


def interpreter_active() -> bool:
    return _flag("TRITON_INTERPRET")


def check_inputs() -> bool:
    from ads_kernel_tools.offsets import check_inputs_enabled

    return check_inputs_enabled()


def use_tma() -> bool:
    return _flag("LP_FA4_TMA")


def fwd_tma() -> bool:
    # off by default under the interpreter: its software descriptors change the dot's summation
    # order, and CPU tests compare the paged (pointer-load) forward bitwise with the flat one
    return use_tma() or _flag("LP_FA4_FWD_TMA", "0" if interpreter_active() else "1")


def backend() -> str:
    mode = envvars.get("LP_FA4_BACKEND", "auto").strip().lower()
    if mode not in ("auto", "triton"):
        raise ValueError(f"LP_FA4_BACKEND must be auto or triton, got {mode!r}")
    return mode


def fwd_lpt_max_s() -> int:
    mode = envvars.get("LP_FA4_FWD_LPT_MAX_S", "8192").strip()
    if not mode.isdigit():
        raise ValueError(f"LP_FA4_FWD_LPT_MAX_S must be a sequence length, got {mode!r}")
    return int(mode)


def fwd_lpt_balance() -> bool:
    return _flag("LP_FA4_FWD_LPT_BALANCE", "1")


def bwd_windows() -> bool:
    return _flag("LP_FA4_BWD_WINDOWS", "1")


def bwd_walk(window: bool, causal: bool) -> int:
    """The Gluon backward's query-tile walk (``gluon.bwd_sm90._q_tile_at``): 1 a window's in phase,
    2 causal pairs' first tile down and second up, 0 in order."""
    if window:
        return 1 if _flag("LP_FA4_BWD_WINDOW_PHASE", "1") else 0
    if causal:
        return 2 if _flag("LP_FA4_BWD_CAUSAL_WALK", "0") else 0
    return 0


def bwd_grid(window: bool) -> str:
    """How many programs the Gluon backward launches: ``persistent`` one per SM, each walking every
    num_SMs-th work item; ``items`` one per work item (the hardware starts them in list order as SMs
    free up)."""
    mode = envvars.get("LP_FA4_BWD_GRID", "auto").strip().lower()
    if mode not in ("auto", "persistent", "items"):
        raise ValueError(f"LP_FA4_BWD_GRID must be auto, persistent or items, got {mode!r}")
    if mode == "auto":
        return "items" if window else "persistent"
    return mode


def broadcast_q() -> str:
    mode = envvars.get("LP_FA4_BROADCAST_Q", "auto").strip().lower()
    if mode not in ("auto", "repeat", "resident", "kernel"):
        raise ValueError(f"LP_FA4_BROADCAST_Q must be auto, repeat, resident or kernel, got {mode!r}")
    return mode


RESIDENT_LQ = 128  # the query block the resident backward holds on chip (rows, padded to a power of 2)
# auto sends query blocks up to this long to it: at Lq = 128 the Gluon backward on repeated queries
# is faster, at Lq <= 64 the resident one (BENCHMARKS.md, "broadcast_q (PMA)")
RESIDENT_AUTO_LQ = 64


def resident_max_lq() -> int:
    raw = envvars.get("LP_FA4_RESIDENT_MAX_LQ", str(RESIDENT_AUTO_LQ)).strip()
    if not raw.isdigit() or not 0 <= int(raw) <= RESIDENT_LQ:
        raise ValueError(f"LP_FA4_RESIDENT_MAX_LQ must be an integer in [0, {RESIDENT_LQ}], got {raw!r}")
    return int(raw)


RESIDENT_GLUON_MIN_ROWS = 65  # auto: the Gluon resident backward from this many computed query rows


RESIDENT_KERNEL_DEFAULT = "auto"


def resident_kernel() -> str:
    mode = envvars.get("LP_FA4_RESIDENT_KERNEL", RESIDENT_KERNEL_DEFAULT).strip().lower()
    if mode not in ("auto", "triton", "gluon"):
        raise ValueError(f"LP_FA4_RESIDENT_KERNEL must be auto, triton or gluon, got {mode!r}")
    return mode


def resident_tile(block_m: int) -> tuple[int, int, int]:
    """(key tile, warps, stages) of the resident broadcast_q backward for a query block of
    ``block_m`` rows, picked by the H200 sweep of BENCHMARKS.md ("broadcast_q (PMA)"): up to 64
    rows 32 keys over 4 warps in 3 stages (the K/V loads of a short step need the deeper ring; 128
    keys over 4 warps spill: the step's fp32 tiles and the dQ accumulator share the registers), 128
    rows 128 keys over 8 warps in 2. ``LP_FA4_RESIDENT_TILE=N,W,S`` overrides it."""
    if interpreter_active():
        return 16, 4, 1
    raw = envvars.get("LP_FA4_RESIDENT_TILE", "").strip()
    if raw:
        parts = raw.split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"LP_FA4_RESIDENT_TILE must be N,W,S (three integers), got {raw!r}")
        n, w, s = (int(p) for p in parts)
        if n not in (16, 32, 64, 128) or w not in (1, 2, 4, 8) or not 1 <= s <= 4:
            raise ValueError(f"LP_FA4_RESIDENT_TILE: N a power of 2 in 16..128, W 1..8, S 1..4; got {raw!r}")
        return n, w, s
    return resident_gpu_tile(block_m)


def resident_gpu_tile(block_m: int) -> tuple[int, int, int]:
    """``resident_tile``'s default on a GPU (also what the offline sm_90 compile test builds)."""
    if block_m <= 64:
        return 32, 4, 3
    return 128, 8, 2


def dq_mode(deterministic: bool) -> str:
    if deterministic:
        return "pass"
    mode = envvars.get("LP_FA4_DQ", "pass").strip().lower()
    if mode not in ("pass", "atomic"):
        raise ValueError(f"LP_FA4_DQ must be pass or atomic, got {mode!r}")
    return mode


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def launch(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "num_warps": self.num_warps,
                "num_stages": self.num_stages}  # fmt: skip


# Interpreter tiles: 16 rows/keys, so lengths 15/16/17 cross a tile edge cheaply on a CPU.
_INTERP = Tile(16, 16, 4, 1)


def fwd_tile(d_pad: int) -> Tile:
    """Forward tile for padded head dim d_pad (64..256). Registers hold the BLOCK_M x d_pad fp32
    accumulator. Up to 128: 128 x 128 tiles over 8 warps (two warpgroups of 64 rows, as FA3), 3
    stages (with TMA loads: 225 KB of shared memory at 128); 256 wide keeps 128 x 64 over 8 warps
    and one stage less to stay in shared memory."""
    if interpreter_active():
        return _INTERP
    if d_pad <= 128:
        return Tile(128, 128, 8, 3)
    return Tile(128, 64, 8, 2)


BQ_SMALL_Q = 64  # a broadcast_q query block this short may run the Triton forward at ``bq_fwd_tile``
# ... and this short does by default: at Lq = 64 that forward only matched the Gluon kernel on
# repeated queries, at Lq = 32 it was faster (BENCHMARKS.md, "broadcast_q (PMA)")
BQ_SMALL_AUTO_Q = 32


def bq_small_fwd_rows() -> int:
    """The longest broadcast_q query block whose forward runs the Triton in-place broadcast at
    ``bq_fwd_tile`` (``LP_FA4_BQ_SMALL_FWD``: ``auto`` ``BQ_SMALL_AUTO_Q``, ``1`` ``BQ_SMALL_Q``,
    ``0`` none)."""
    raw = envvars.get("LP_FA4_BQ_SMALL_FWD", "auto").strip().lower()
    if raw == "auto":
        return BQ_SMALL_AUTO_Q
    if raw in _TRUE:
        return BQ_SMALL_Q
    if raw in ("0", "false", "no", "off", ""):
        return 0
    raise ValueError(f"LP_FA4_BQ_SMALL_FWD must be auto, 0 or 1, got {raw!r}")


def bq_fwd_block() -> bool:
    return _flag("LP_FA4_BQ_FWD_BLOCK", "1")


def bq_fwd_tile(d_pad: int) -> Tile:
    """Triton forward tile of a broadcast_q call whose query block fits one 64-row tile (PMA's
    learned queries): 64 x 64 over 4 warps, 3 stages. Each (kv sequence, head) program then streams
    its keys once with little compute per byte; on the H200 this beat both the 128 x 128 tile and
    the Gluon kernel on repeated queries (BENCHMARKS.md, "broadcast_q (PMA)")."""
    if interpreter_active():
        return _INTERP
    if d_pad <= 128:
        return Tile(64, 64, 4, 3)
    return fwd_tile(d_pad)


def dkdv_tile(d_pad: int) -> Tile:
    """dK/dV kernel: BLOCK_N keys resident (K, V, dK, dV), BLOCK_M queries streamed. On the H200
    (varlen max 2048, D=128) 64 x 128 over 8 warps, 2 stages ran at twice the rate of the Triton
    tutorial's 32 x 128 / 4 warps / 3 stages (with its 128 x 32 dQ tile)."""
    if interpreter_active():
        return _INTERP
    if d_pad <= 128:
        return Tile(64, 128, 8, 2)
    return Tile(32, 64, 8, 1)


def dq_tile(d_pad: int) -> Tile:
    if interpreter_active():
        return _INTERP
    if d_pad <= 128:
        return Tile(128, 64, 8, 2)
    return Tile(64, 64, 8, 1)
