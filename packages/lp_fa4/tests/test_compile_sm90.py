"""The Triton kernels compile for Hopper (sm_90) with wgmma and without register spills at the
tiles config.py picks, checked on a CPU with Triton's offline compiler (one child process)."""

from __future__ import annotations

import pytest

from ads_kernel_tools.compile_check import ptx_counts_batch

_F32 = {n: "fp32" for n in ("qk_scale2", "cap_in", "cap_out2")}
_IDX = {n: "*i32" for n in ("CU_Q", "CU_K", "USED_Q", "USED_K")}
FWD_T = {n: "*bf16" for n in ("Q", "K", "V", "OUT", "SINK")} | {"LSE": "*fp32", "PT": "*i32"} | _IDX | _F32
_BWD = {n: "*bf16" for n in ("Q", "K", "V", "DO")} | {"LSE": "*fp32", "DELTA": "*fp32", "sm_scale": "fp32"}
BWD_T = _BWD | {"DK": "*bf16", "DV": "*bf16"} | _IDX | _F32
DQ_T = _BWD | {"DQ": "*bf16"} | _IDX | _F32
FLAGS = dict(
    HAS_USED_Q=False, HAS_USED_K=False, SOFTCAP=False, TOP_LEFT=False, BROADCAST_Q=False, USE_TMA=False
)
GPU_TILES = {"fwd": (128, 64, 4, 3), "dkdv": (64, 128, 8, 2), "dq": (128, 64, 8, 2)}  # config.py, D <= 128


def _job(kernel, types, d, tile, **consts):
    bm, bn, warps, stages = tile
    c = dict(D_QK=d, D_V=d, BLOCK_D=d, BLOCK_DV=d, BLOCK_M=bm, BLOCK_N=bn, **FLAGS) | consts
    mod = "lp_fa4.triton._fwd" if kernel == "fwd_kernel" else "lp_fa4.triton._bwd"
    return dict(module=mod, kernel=kernel, types=types, constexprs=c, num_warps=warps, num_stages=stages)


FWD_EXTRA = dict(PAGE_SIZE=1, PAGED=False, HAS_SINK=False, LSE_PER_SEQ=True)
JOBS = {
    "fwd-d128": _job("fwd_kernel", FWD_T, 128, GPU_TILES["fwd"], **FWD_EXTRA),
    "fwd-d64-causal-softcap-sink": _job(
        "fwd_kernel", FWD_T, 64, GPU_TILES["fwd"], **(FWD_EXTRA | dict(HAS_SINK=True)), SOFTCAP=True
    ),
    "fwd-d128-tma": _job("fwd_kernel", FWD_T, 128, GPU_TILES["fwd"], **(FWD_EXTRA | dict(USE_TMA=True))),
    "fwd-d128-paged": _job(
        "fwd_kernel", FWD_T, 128, GPU_TILES["fwd"], **(FWD_EXTRA | dict(PAGED=True, PAGE_SIZE=64))
    ),
    "dkdv-d128-atomic": _job("dkdv_kernel", BWD_T | {"DQ": "*fp32"}, 128, GPU_TILES["dkdv"], DQ_ATOMIC=True),
    "dq-d128": _job("dq_kernel", DQ_T, 128, GPU_TILES["dq"]),
    "dq-d128-tma": _job("dq_kernel", DQ_T, 128, GPU_TILES["dq"], USE_TMA=True),
    "dkdv-d128-tma": _job(
        "dkdv_kernel", BWD_T | {"DQ": "*fp32"}, 128, GPU_TILES["dkdv"], DQ_ATOMIC=False, USE_TMA=True
    ),
}
_RES_T = _BWD | {"DK": "*bf16", "DV": "*bf16", "DQ": "*fp32", "qk_scale2": "fp32"}
RESIDENT_T = _RES_T | {n: "*i32" for n in ("CU_Q", "CU_K", "USED_K", "ORDER")}


def _resident_job(block_m: int) -> dict:
    """The query-resident broadcast_q backward at the tile config.resident_tile picks."""
    from lp_fa4 import config

    bn, warps, stages = config.resident_gpu_tile(block_m)
    c = dict(D=128, BLOCK_D=128, BLOCK_M=block_m, BLOCK_N=bn, HAS_USED_K=False, NUM_STAGES=stages)
    return dict(module="lp_fa4.triton._bwd_resident", kernel="bq_resident_bwd_kernel", types=RESIDENT_T,
                constexprs=c, num_warps=warps, num_stages=1)  # fmt: skip


JOBS["fwd-d128-broadcast-small-q"] = _job(
    "fwd_kernel", FWD_T, 128, (64, 64, 4, 3), **(FWD_EXTRA | dict(USE_TMA=True)), BROADCAST_Q=True
)  # config.bq_fwd_tile
JOBS["resident-lq32-d128"] = _resident_job(32)
JOBS["resident-lq64-d128"] = _resident_job(64)
MAY_SPILL: set[str] = set()  # none at the tiles config.py picks for D <= 128
# every GEMM of a 32-row query block at 32-key tiles is narrower than wgmma's 64 rows: mma.sync,
# which the resident backward's memory-bound steps do not notice (BENCHMARKS.md, "broadcast_q")
NO_WGMMA = {"resident-lq32-d128"}


@pytest.fixture(scope="module")
def counts():
    return dict(zip(JOBS, ptx_counts_batch(list(JOBS.values()))))


@pytest.mark.parametrize("name", list(JOBS))
def test_compiles_for_sm90_with_wgmma(name, counts):
    c = counts[name]
    assert "error" not in c, c.get("error")
    assert (c["wgmma"] > 0) != (name in NO_WGMMA), f"{name}: {c['wgmma']} wgmma in the PTX"
    if name not in MAY_SPILL:
        assert c["local_memory"] == 0, f"{name}: {c['local_memory']} local-memory accesses (spills)"
    if name.endswith("atomic"):
        assert c["atomic_add"] > 0
    if name.endswith("tma"):
        assert c["tma"] > 0, f"{name}: no TMA loads"


# ---------------------------------------------------------------------------------------------
# The Gluon backward (lp_fa4.gluon.bwd_sm90): wgmma, TMA loads and bulk reductions, no spills,
# shared memory inside one sm_90 block's 227 KB
# ---------------------------------------------------------------------------------------------

SMEM_LIMIT = 232448


def _gluon_bwd_job(
    d: int,
    causal: bool = False,
    used: bool = False,
    fp16: bool = False,
    window: bool = False,
    top_left: bool = False,
    walk: int | None = None,
) -> dict:
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from lp_fa4.gluon import bwd_sm90 as g

    heads = 4
    t, gdt, name = (torch.float16, gl.float16, "fp16") if fp16 else (torch.bfloat16, gl.bfloat16, "bf16")

    def desc(rows, cols=d, dtype=gdt, host_dtype=t):
        host = torch.empty(256, heads * d, dtype=host_dtype)
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)
        return mangle_type(TensorDescriptor(host, [256, heads * d], [heads * d, 1], [rows, cols], layout))

    types = {"q_desc": desc(g.BLOCK_M), "do_desc": desc(g.BLOCK_M), "k_desc": desc(g.BLOCK_N),
             "v_desc": desc(g.BLOCK_N), "dq_desc": desc(g.BLOCK_M, d // 2, gl.float32, torch.float32),
             "dk_ptr": f"*{name}", "dv_ptr": f"*{name}", "lse_ptr": "*fp32", "delta_ptr": "*fp32",
             "scale": "fp32", "qk_scale2": "fp32",
             **{n: "*i32" for n in ("tiles_ptr", "count_ptr", "cu_q_ptr", "cu_k_ptr", "used_q_ptr",
                                    "used_k_ptr")}}  # fmt: skip
    consts = dict(D=d, BM=g.BLOCK_M, BN=g.BLOCK_N, STAGES=g.STAGES, CAUSAL=causal, HAS_USED_Q=used,
                  HAS_USED_K=used, CONSUMER_REGS=g.CONSUMER_REGS, PRODUCER_REGS=g.PRODUCER_REGS,
                  WINDOW=window, TOP_LEFT=top_left,
                  WALK=(1 if window else 0) if walk is None else walk)  # fmt: skip
    return dict(module=g.__name__, kernel="attn_bwd_ws", types=types, constexprs=consts, gluon=True)


GLUON_BWD_JOBS = {
    # dense, causal (bottom-right), seqused_q/k, fp16
    "d128": dict(d=128),
    "d128-causal": dict(d=128, causal=True),
    "d128-causal-seqused-fp16": dict(d=128, causal=True, used=True, fp16=True),
    "d64": dict(d=64),
    "d64-causal-seqused-fp16": dict(d=64, causal=True, used=True, fp16=True),
    # windows (the default unless LP_FA4_BWD_WINDOWS=0): local (bottom-right) and jagged top-left
    # bands, walked in phase (WALK=1, the default) or in order (LP_FA4_BWD_WINDOW_PHASE=0)
    "d128-window": dict(d=128, window=True),
    "d128-window-top-left-seqused-fp16": dict(d=128, window=True, top_left=True, used=True, fp16=True),
    "d64-window-top-left": dict(d=64, window=True, top_left=True),
    "d128-window-plain": dict(d=128, window=True, walk=0),
    # LP_FA4_BWD_CAUSAL_WALK=1 (WALK=2): causal pairs walked down, then up
    "d128-causal-walk": dict(d=128, causal=True, walk=2),
    "d64-causal-seqused-fp16-walk": dict(d=64, causal=True, used=True, fp16=True, walk=2),
}


@pytest.fixture(scope="module")
def gluon_bwd_counts():
    return dict(
        zip(GLUON_BWD_JOBS, ptx_counts_batch([_gluon_bwd_job(**kw) for kw in GLUON_BWD_JOBS.values()]))
    )


@pytest.mark.parametrize("name", list(GLUON_BWD_JOBS))
def test_gluon_bwd_compiles_for_sm90(name, gluon_bwd_counts):
    c = gluon_bwd_counts[name]
    assert "error" not in c, c.get("error")
    assert c["wgmma"] > 0 and c["tma"] > 0 and c["tma_reduce"] > 0, c
    assert c["local_memory"] == 0, f"{name}: {c['local_memory']} local-memory accesses (spills)"
    assert 0 < c["shared_bytes"] <= SMEM_LIMIT, c["shared_bytes"]


# SASS of the whole kernel: HGMMA instructions, and those that close a commit group (gsb0). When
# ptxas cannot keep an accumulator's registers untouched while its wgmma is in flight it serialises
# every wgmma of the kernel (warning C7514): each HGMMA then closes its own group.
SASS_WGMMA = {
    "hgmma": [r"^\.text\.attn_bwd_ws:", r"(?!)", r"\bHGMMA\."],
    "hgmma_gsb0": [r"^\.text\.attn_bwd_ws:", r"(?!)", r"\bHGMMA\..*\bgsb0\b"],
}
WGMMA_BUILDS = {
    "d128": dict(d=128),
    "d128-causal": dict(d=128, causal=True),
    "d128-window": dict(d=128, window=True),
}


@pytest.fixture(scope="module")
def gluon_bwd_wgmma():
    jobs = [_gluon_bwd_job(**kw) | {"sass_between": SASS_WGMMA} for kw in WGMMA_BUILDS.values()]
    return dict(zip(WGMMA_BUILDS, ptx_counts_batch(jobs)))


@pytest.mark.parametrize("name", list(WGMMA_BUILDS))
def test_gluon_bwd_wgmma_stays_asynchronous(name, gluon_bwd_wgmma):
    """The dense, causal and windowed builds keep their wgmma asynchronous: one commit group per GEMM
    of the step (8 or 4 HGMMA each), not one per instruction. A wgmma accumulator that is in flight
    across the loop's back edge or through a branch that yields it makes ptxas serialise them all (a
    pipelined step schedule's first draft did: 80 of 80 HGMMA closed a group)."""
    c = gluon_bwd_wgmma[name]
    assert "error" not in c, c.get("error")
    (hgmma,), (groups,) = c["hgmma"], c["hgmma_gsb0"]
    assert hgmma >= 64, c
    assert 4 * groups < hgmma, f"{name}: {groups} of {hgmma} HGMMA close a commit group (serialised)"


def _launch_args(monkeypatch, keys, calls):
    """Run ``bwd_sm90.bwd`` once per (env, causal, window) of ``calls`` with the kernel replaced by a
    recorder (the offsets clamp and the tile list still run as kernels: on the GPU where there is
    one); returns the constexprs ``keys`` of each launch (``"grid"``: the launch grid). One SM."""
    import torch

    from lp_fa4.gluon import bwd_sm90

    seen = []

    class Recorder:  # the kernel's launch cache
        def launch(self, grid, args, kw, cached=None):
            seen.append(tuple(grid if k == "grid" else kw[k] for k in keys))

    monkeypatch.setattr(bwd_sm90, "_BWD", Recorder())
    monkeypatch.setattr(bwd_sm90, "num_sms", lambda device: 1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.zeros(64, 2, 64, dtype=torch.bfloat16, device=dev)
    lse = torch.zeros(2, 64, device=dev)
    cu = torch.tensor([0, 64], dtype=torch.int32, device=dev)
    for env, causal, window, *max_k in calls:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        mk = max_k[0] if max_k else 64
        bwd_sm90.bwd(q, q, q, q, lse, lse, cu, cu, None, None, 64, mk, 64, 0.125, causal, window=window)
    return seen


def test_bwd_grid_switch_is_read(monkeypatch):
    """LP_FA4_BWD_GRID: ``auto`` launches one program per work item under a window and one per SM
    otherwise; ``persistent`` / ``items`` force either; anything else is an error. The recorder's
    call has 2 kv heads x 1 kv tile = 2 items on a 1-SM device; with max_seqlen_k 1024 the grid
    still counts the 64 keys there are (1 tile + 1 per sequence, x 2 heads), not 8 tile slots."""
    from lp_fa4 import config

    monkeypatch.delenv("LP_FA4_BWD_GRID", raising=False)
    assert (config.bwd_grid(True), config.bwd_grid(False)) == ("items", "persistent")
    calls = [
        ({}, False, (8, 8)),
        ({}, False, None),
        ({}, True, None),
        ({"LP_FA4_BWD_GRID": " Persistent"}, False, (8, 8)),
        ({"LP_FA4_BWD_GRID": "items"}, False, None),
        ({"LP_FA4_BWD_GRID": "auto"}, False, (8, 8), 1024),
    ]
    grids = [((2,),), ((1,),), ((1,),), ((1,),), ((2,),), ((4,),)]
    assert _launch_args(monkeypatch, ("grid",), calls) == grids
    monkeypatch.setenv("LP_FA4_BWD_GRID", "sm")
    with pytest.raises(ValueError, match="LP_FA4_BWD_GRID"):
        config.bwd_grid(False)


def test_bwd_walk_switches_are_read(monkeypatch):
    """The backward's query-tile walk (``_q_tile_at``'s WALK): a window walks in phase unless
    LP_FA4_BWD_WINDOW_PHASE=0, a causal call in order unless LP_FA4_BWD_CAUSAL_WALK=1, anything else
    in order; the launcher passes what it reads (the kernel is replaced by a recorder: no GPU
    needed)."""
    from lp_fa4 import config

    monkeypatch.delenv("LP_FA4_BWD_WINDOW_PHASE", raising=False)
    monkeypatch.delenv("LP_FA4_BWD_CAUSAL_WALK", raising=False)
    masks = ((True, False), (False, True), (False, False))  # (window, causal)
    assert [config.bwd_walk(*m) for m in masks] == [1, 0, 0]
    monkeypatch.setenv("LP_FA4_BWD_WINDOW_PHASE", "0")
    monkeypatch.setenv("LP_FA4_BWD_CAUSAL_WALK", "1")
    assert [config.bwd_walk(*m) for m in masks] == [0, 2, 0]

    calls = [
        ({"LP_FA4_BWD_WINDOW_PHASE": "1"}, False, (8, 8)),
        ({"LP_FA4_BWD_WINDOW_PHASE": "0"}, False, (8, 8)),
        ({"LP_FA4_BWD_WINDOW_PHASE": "1"}, True, None),
    ]
    seen = _launch_args(monkeypatch, ("WINDOW", "WALK"), calls)
    assert seen == [(True, 1), (True, 0), (False, 2)]


def _gluon_resident_job(used: bool = False, fp16: bool = False) -> dict:
    """The Gluon query-resident broadcast_q backward (``gluon.bwd_resident_sm90``) at its one build
    (D = 128), pointers 16-byte aligned as the launcher specialises them at run time (without that
    the dK/dV stores compile to 2-byte pieces)."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from lp_fa4.gluon import bwd_resident_sm90 as g

    d, heads = g.HEAD_DIM, 4
    t, gdt, name = (torch.float16, gl.float16, "fp16") if fp16 else (torch.bfloat16, gl.bfloat16, "bf16")

    def desc(rows):
        host = torch.empty(256, heads * d, dtype=t)
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
        return mangle_type(TensorDescriptor(host, [256, heads * d], [heads * d, 1], [rows, d], layout))

    ptrs = ("order_ptr", "cu_q_ptr", "cu_k_ptr", "used_k_ptr")
    types = {"q_desc": desc(g.BLOCK_Q), "do_desc": desc(g.BLOCK_Q), "k_desc": desc(g.BLOCK_N),
             "v_desc": desc(g.BLOCK_N), "dq_ptr": "*fp32", "dk_ptr": f"*{name}", "dv_ptr": f"*{name}",
             "lse_ptr": "*fp32", "delta_ptr": "*fp32", "scale": "fp32", "qk_scale2": "fp32",
             **{n: "*i32" for n in ptrs}}  # fmt: skip
    consts = dict(D=d, BN=g.BLOCK_N, STAGES=g.STAGES, HAS_USED_K=used, CONSUMER_REGS=g.CONSUMER_REGS,
                  PRODUCER_REGS=g.PRODUCER_REGS)  # fmt: skip
    divisible = ("dq_ptr", "dk_ptr", "dv_ptr", "lse_ptr", "delta_ptr", *ptrs)
    return dict(module=g.__name__, kernel="bq_resident_bwd_ws", types=types, constexprs=consts, gluon=True,
                divisible=divisible)  # fmt: skip


def test_gluon_resident_bwd_compiles_for_sm90():
    """Both builds (bf16; fp16 with seqused_k) compile with wgmma and TMA, fit shared memory, and
    store dK/dV in 16-byte pieces (16 ``st.global.v4`` per build: 4 per tile, warpgroup and
    tensor)."""
    jobs = [_gluon_resident_job(), _gluon_resident_job(used=True, fp16=True)]
    text = r"^\.text\.bq_resident_bwd_ws:"
    for job in jobs:
        job["sass_between"] = {
            "stg128": [text, r"(?!)", r"\bSTG\.E\.128\b"],
            "stg16": [text, r"(?!)", r"\bSTG\.E\.U16\b"],
        }
    for c in ptx_counts_batch(jobs):
        assert "error" not in c, c.get("error")
        assert c["wgmma"] > 0 and c["tma"] > 0 and c["local_memory"] == 0, c
        assert 0 < c["shared_bytes"] <= SMEM_LIMIT, c["shared_bytes"]
        assert c["stg128"] == [16] and c["stg16"] == [0], c
