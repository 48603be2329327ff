"""The kernels compile for Hopper and use its tensor cores, checked without a GPU.

The interpreter runs the kernels' math on the CPU but never lowers them; these tests compile them
for sm_90 with Triton's offline compiler (in one child process without the interpreter), so a change
that breaks the GPU build or falls off wgmma fails CPU CI too.
"""

from __future__ import annotations

import pytest

from ads_kernel_tools.compile_check import ptx_counts_batch

_POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SINU": "*bf16", "TABLE": "*i32"}
FWD_TYPES = _POINTERS | {"OUT": "*bf16", "qk_scale": "fp32"}
BWD_TYPES = (
    _POINTERS | {n: "*bf16" for n in ("DO", "DQ", "DK", "DV")} | {"sm_scale": "fp32", "qk_scale": "fp32"}
)
CASES = {
    "d64": dict(D=64),
    "d128_gqa": dict(D=128, G=2),
    "d128_rotary": dict(D=128, ROT_QK=True, ROT_V=True),
    "d256": dict(D=256),
}


def _consts(**kw) -> dict:
    return dict(H_KV=4, G=1, D=128, BLOCK=64, ROT_QK=False, ROT_V=False, PRECISION="tf32") | kw


def _jobs() -> dict[str, dict]:
    jobs = {}
    for name, kw in CASES.items():
        launch = dict(constexprs=_consts(**kw), num_warps=8 if kw["D"] > 128 else 4, num_stages=1)
        fwd = dict(module="ads_block_attention.triton._fwd", kernel="block_attn_fwd_kernel", types=FWD_TYPES)
        bwd = dict(module="ads_block_attention.triton._bwd", kernel="block_attn_bwd_kernel", types=BWD_TYPES)
        jobs[f"fwd_{name}"] = fwd | launch
        jobs[f"bwd_{name}"] = bwd | launch
    return jobs


@pytest.fixture(scope="module")
def ptx() -> dict[str, dict]:
    jobs = _jobs()
    return dict(zip(jobs, ptx_counts_batch(list(jobs.values()))))


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
@pytest.mark.parametrize("case", CASES)
def test_kernels_compile_for_sm90_with_wgmma(ptx, kind, case):
    counts = ptx[f"{kind}_{case}"]
    assert "error" not in counts, f"{kind} {case} did not compile for sm_90: {counts.get('error')}"
    assert counts["wgmma"] > 0
    if case != "d256":  # the D=256 tiles hold two D-wide fp32 accumulators; spills there are priced in
        assert counts["local_memory"] == 0, f"{kind} {case} spills registers"
