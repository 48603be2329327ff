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
MAY_SPILL: set[str] = set()  # none at the tiles config.py picks for D <= 128


@pytest.fixture(scope="module")
def counts():
    return dict(zip(JOBS, ptx_counts_batch(list(JOBS.values()))))


@pytest.mark.parametrize("name", list(JOBS))
def test_compiles_for_sm90_with_wgmma(name, counts):
    c = counts[name]
    assert "error" not in c, c.get("error")
    assert c["wgmma"] > 0, f"{name}: no wgmma in the PTX"
    if name not in MAY_SPILL:
        assert c["local_memory"] == 0, f"{name}: {c['local_memory']} local-memory accesses (spills)"
    if name.endswith("atomic"):
        assert c["atomic_add"] > 0
    if name.endswith("tma"):
        assert c["tma"] > 0, f"{name}: no TMA loads"
