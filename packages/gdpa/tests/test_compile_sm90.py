"""The kernels compile for Hopper and use its instructions, checked without a GPU.

The interpreter runs the kernels' math on the CPU but never lowers them; these tests compile the
same kernels for sm_90 with Triton's offline compiler (in one child process without the
interpreter), so a change that breaks the GPU build, or silently loses wgmma, TMA or the hardware
tanh, fails CPU CI too.
"""

from __future__ import annotations

import pytest

from ads_kernel_tools.compile_check import ptx_counts_batch
from ads_kernel_tools.reference.gdpa import ACTIVATIONS

_INDEX = {"CU_Q": "*i32", "CU_K": "*i32", "ACT_TBL": "*i32", "TILE_MAP": "*i32", "scale": "fp32"}
# the upstream encodings' tables, bucket values and metadata (unused slots still need a type)
_INDEX |= {f"E{i}": "*fp32" for i in range(5)} | {f"B{i}": "*i64" for i in range(5)} | {"ENC_META": "*i64"}
FWD_TYPES = {n: "*bf16" for n in "QKVO"} | _INDEX | {f"{n}_DESCALE": "*fp32" for n in "QKV"}
BWD_TYPES = {n: "*bf16" for n in ("Q", "K", "V", "DO", "DK", "DV")} | {"DQ": "*fp32"} | _INDEX
DQ_TYPES = {n: "*bf16" for n in ("Q", "K", "V", "DO", "DQ")} | _INDEX

FWD = dict(
    D_QK=128, D_V=128, BLOCK_DQK=128, BLOCK_DV=128, BLOCK_M=128, BLOCK_N=64, ACT=3, PER_HEAD=False,
    FAST=True, HAS_WINDOW=False, BOTTOM_RIGHT=False, BROADCAST_Q=False, FP8=False, USE_TMA=True,
    HAS_TILE_MAP=True, SPANS=False, N_ENC=0,
)  # fmt: skip
BWD = dict(
    D_QK=128, D_V=128, BLOCK_DQK=128, BLOCK_DV=128, BLOCK_M=64, BLOCK_N=128, ACT=3, PER_HEAD=False,
    FAST=True, HAS_WINDOW=False, BOTTOM_RIGHT=False, BROADCAST_Q=False, DQ_ATOMIC=True, HAS_TILE_MAP=True,
    USE_TMA=False, DQ_TMA=False, SPANS=False, N_ENC=0, DKV_ATOMIC=False,
)  # fmt: skip
_DKDV_ONLY = ("DQ_ATOMIC", "DQ_TMA", "DKV_ATOMIC")
# upstream extras: spans table (ad_to_request / start-end / output offsets) and all five encodings
EXTRAS = dict(SPANS=True, N_ENC=5, HAS_TILE_MAP=False)
DQ = {k: v for k, v in dict(BWD, BLOCK_M=128, BLOCK_N=64).items() if k not in _DKDV_ONLY}
OPTIONS = {
    "per_head": dict(PER_HEAD=True),
    "causal_window": dict(HAS_WINDOW=True, BOTTOM_RIGHT=True),
    "broadcast_q": dict(BROADCAST_Q=True, HAS_TILE_MAP=False),
    "d192": dict(D_QK=192, BLOCK_DQK=256),
}


def _fwd(**consts):
    return dict(module="ads_gdpa.triton._fwd", kernel="gdpa_fwd_kernel", types=FWD_TYPES, constexprs=consts)


def _gluon_job(d: int, skip_dead: bool = False, fp8: bool = False, act: int = 3, **fp8_opts):
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from ads_gdpa.gluon import fwd_sm90 as g

    heads, bm, bn = 4, g.BLOCK_M, g.BLOCK_N
    stages, qbuf, epilogue = g._config(d, fp8)
    in_t, in_gl = (torch.float8_e4m3fn, gl.float8e4nv) if fp8 else (torch.bfloat16, gl.bfloat16)

    def desc(rows, cols=d, t=in_t, dt=in_gl):
        host = torch.empty(256, heads * 256, dtype=t)
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], dt)
        return mangle_type(TensorDescriptor(host, [256, heads * 256], [heads * 256, 1], [rows, cols], layout))

    pointers = {
        "out_ptr": "*bf16",
        "tiles_ptr": "*i32",
        "count_ptr": "*i32",
        "cu_q_ptr": "*i32",
        "cu_k_ptr": "*i32",
        **{f"{n}d_ptr": "*fp32" for n in "qkv"},
        "vcol_ptr": "*i32",
    }
    # FP8 reads V K-major: [D, BN] boxes of the (H_kv·D, keys) copy
    v_desc = desc(d, bn) if fp8 else desc(bn)
    types = {"q_desc": desc(bm), "k_desc": desc(bn), "v_desc": v_desc,
             "o_desc": desc(bm // 2, t=torch.bfloat16, dt=gl.bfloat16), "scale": "fp32",
             **pointers}  # fmt: skip
    consts = dict(D=d, BM=bm, BN=bn, STAGES=stages, ACT=act, QBUF=qbuf, SCHEDULE=1, EPILOGUE=epilogue,
                  SKIP_DEAD=skip_dead, DEFER=not fp8, CONSUMER_REGS=232, LOADER_REGS=24, FP8=fp8,
                  RELABEL=fp8 and fp8_opts.get("relabel", True))  # fmt: skip
    return dict(module=g.__name__, kernel="_gdpa_fwd_ws", types=types, constexprs=consts, gluon=True)


def _gluon_bwd_job(d: int, dq_mode: int) -> dict:
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from ads_gdpa.gluon import bwd_sm90 as g

    heads = 4
    host = torch.empty(256, heads * d, dtype=torch.bfloat16)

    def desc(rows, cols=d, dtype=gl.bfloat16, base=host):
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)
        return mangle_type(TensorDescriptor(base, [256, heads * d], [heads * d, 1], [rows, cols], layout))

    dq_host = torch.empty(256, heads * d, dtype=torch.float32)
    pointers = {"dq_ptr": "*fp32", "dk_ptr": "*bf16", "dv_ptr": "*bf16", "tiles_ptr": "*i32",
                "count_ptr": "*i32", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "scale": "fp32"}  # fmt: skip
    types = {"q_desc": desc(g.BLOCK_M), "do_desc": desc(g.BLOCK_M), "k_desc": desc(g.BLOCK_N),
             "v_desc": desc(g.BLOCK_N), "dq_desc": desc(g.BLOCK_M, d // 2, gl.float32, dq_host),
             **pointers}  # fmt: skip
    consts = dict(D=d, BM=g.BLOCK_M, BN=g.BLOCK_N, STAGES=g.STAGES, ACT=3, DQ_MODE=dq_mode,
                  CONSUMER_REGS=240, LOADER_REGS=24)  # fmt: skip
    return dict(module=g.__name__, kernel="_gdpa_bwd_ws", types=types, constexprs=consts, gluon=True)


# In the Gluon kernels' steady step a warpgroup waits for its first GEMM (wait_group 1, S or Sᵀ) and
# computes the activation while the second (P·V in the forward, dPᵀ in the backward) is meant to keep
# the tensor cores busy; how many MUFU.TANH ptxas schedules between those two waits shows whether it
# does.
ACT_UNDER_GEMM = [r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1", r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", r"MUFU\.TANH"]


def _jobs() -> dict[str, dict]:
    jobs = {"fwd_main": dict(_fwd(**FWD), num_stages=3)}
    jobs |= {f"fwd_{name}": _fwd(**dict(FWD, ACT=i, USE_TMA=False)) for i, name in enumerate(ACTIVATIONS)}
    jobs |= {f"fwd_{name}": _fwd(**dict(FWD, **opts)) for name, opts in OPTIONS.items()}
    fp8_types = dict(FWD_TYPES, Q="*fp8e4nv", K="*fp8e4nv", V="*fp8e4nv")
    jobs["fwd_fp8"] = dict(_fwd(**dict(FWD, FP8=True, USE_TMA=False)), types=fp8_types)
    jobs["bwd_dkdv"] = dict(module="ads_gdpa.triton._bwd", kernel="gdpa_bwd_dkdv_kernel", types=BWD_TYPES,
                            constexprs=BWD, num_warps=8)  # fmt: skip
    jobs["bwd_dkdv_tma"] = dict(jobs["bwd_dkdv"], constexprs=dict(BWD, USE_TMA=True, DQ_TMA=True))
    jobs["bwd_dkdv_tma_loads"] = dict(jobs["bwd_dkdv"], constexprs=dict(BWD, USE_TMA=True))
    jobs["bwd_dq_tma"] = dict(module="ads_gdpa.triton._bwd", kernel="gdpa_bwd_dq_kernel", types=DQ_TYPES,
                              constexprs=dict(DQ, USE_TMA=True), num_warps=8)  # fmt: skip
    jobs["bwd_dq"] = dict(module="ads_gdpa.triton._bwd", kernel="gdpa_bwd_dq_kernel", types=DQ_TYPES,
                          constexprs=DQ, num_warps=8)  # fmt: skip
    # Per-head activations in the deterministic dQ pass, specialised as the launcher does at run time
    # (aligned pointers, strides divisible by 16) and at the stage count it picks for them (the
    # software pipeliner fails at 2 on sm_90 with Triton 3.6).
    aligned = ["Q", "K", "V", "DO", "DQ", "CU_Q", "CU_K", "ACT_TBL", "TILE_MAP"] + [
        f"stride_{n}{a}" for n in ("q", "k", "v", "do", "dq") for a in "th"
    ]
    jobs["bwd_dq_per_head"] = dict(jobs["bwd_dq"], constexprs=dict(DQ, PER_HEAD=True, HAS_WINDOW=True),
                                   num_stages=1, divisible=aligned)  # fmt: skip
    # fast_gelu_bf16 with fp16 inputs rounds to fp16 (the activation helpers' LP branch)
    fp16 = {n: ("*fp16" if t == "*bf16" else t) for n, t in FWD_TYPES.items()}
    act_bf16 = ACTIVATIONS.index("fast_gelu_bf16")
    jobs["fwd_fast_gelu_bf16_fp16"] = dict(_fwd(**dict(FWD, ACT=act_bf16, USE_TMA=False)), types=fp16)
    jobs["bwd_dkdv_fast_gelu_bf16_fp16"] = dict(
        jobs["bwd_dkdv"],
        types={n: ("*fp16" if t == "*bf16" else t) for n, t in BWD_TYPES.items()},
        constexprs=dict(BWD, ACT=act_bf16),
    )
    jobs["fwd_upstream_extras"] = _fwd(**dict(FWD, **EXTRAS))
    # at the stage count the launcher gives encodings (``launch.bwd``): two stages overflow shared memory
    jobs["bwd_dkdv_upstream_extras"] = dict(jobs["bwd_dkdv"], constexprs=dict(BWD, DKV_ATOMIC=True, **EXTRAS),
                                            num_stages=1)  # fmt: skip
    jobs["bwd_dq_upstream_extras"] = dict(jobs["bwd_dq"], constexprs=dict(DQ, **EXTRAS))
    try:
        jobs |= {f"gluon_d{d}": _gluon_job(d) for d in (64, 128)}
        jobs["gluon_d128_skip_dead"] = _gluon_job(128, skip_dead=True)
        # ADS_GDPA_PACKED_ACT: fast_gelu's deferred form in bf16x2 arithmetic (DEFER=2)
        packed = _gluon_job(128)
        packed["constexprs"] = dict(packed["constexprs"], DEFER=2)
        packed["sass_between"] = {
            name: [r"\.text\.", r"(?!)", pattern]
            for name, pattern in (
                ("packed", r"HFMA2\.BF16"),
                ("fp32_tanh", r"MUFU\.TANH "),
                ("ffma", r"\bFFMA\b"),
            )
        }
        jobs["gluon_d128_packed"] = packed
        jobs |= {f"gluon_fp8_d{d}": _gluon_job(d, fp8=True) for d in (64, 128)}
        jobs["gluon_fp8_d128_relu_square"] = _gluon_job(128, fp8=True, act=10)
        # ptxas serialises every wgmma of a kernel it cannot pipeline (info C7512/C7514): then no
        # wait leaves a group in flight
        jobs["gluon_fp8_d128"]["sass_between"] = {
            "partial_waits": [r"DEPBAR\.LE gsb0, 0x1", r"EXIT", r"QGMMA"]
        }
        jobs["gluon_d128"]["sass_between"] = {"act_under_gemm": ACT_UNDER_GEMM}
        jobs |= {f"gluon_bwd_d{d}": _gluon_bwd_job(d, dq_mode=2) for d in (64, 128)}
        jobs["gluon_bwd_red_v4"] = _gluon_bwd_job(128, dq_mode=1)
        jobs["gluon_bwd_d128"]["sass_between"] = {"act_under_gemm": ACT_UNDER_GEMM}
    except ImportError:  # a Triton without Gluon: the Gluon path is optional
        pass
    return jobs


@pytest.fixture(scope="module")
def ptx() -> dict[str, dict]:
    jobs = _jobs()
    return dict(zip(jobs, ptx_counts_batch(list(jobs.values()))))


def _ok(ptx: dict, name: str) -> dict:
    counts = ptx[name]
    assert "error" not in counts, f"{name} did not compile for sm_90: {counts.get('error')}"
    return counts


def test_forward_hopper_build_uses_wgmma_tma_and_hardware_tanh(ptx):
    counts = _ok(ptx, "fwd_main")
    assert counts["wgmma"] > 0 and counts["tma"] > 0 and counts["tanh_approx"] > 0
    assert counts["local_memory"] == 0, "register spills in the main forward config"


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_forward_compiles_for_every_activation(ptx, name):
    assert _ok(ptx, f"fwd_{name}")["wgmma"] > 0


def test_fast_gelu_bf16_compiles_for_fp16(ptx):
    for name in ("fwd_fast_gelu_bf16_fp16", "bwd_dkdv_fast_gelu_bf16_fp16"):
        counts = _ok(ptx, name)
        assert counts["wgmma"] > 0 and counts["tanh_approx"] > 0 and counts["local_memory"] == 0, name


@pytest.mark.parametrize("name", OPTIONS)
def test_forward_options_compile(ptx, name):
    _ok(ptx, f"fwd_{name}")


@pytest.mark.parametrize(
    "name", ["fwd_upstream_extras", "bwd_dkdv_upstream_extras", "bwd_dq_upstream_extras"]
)
def test_upstream_extras_compile_with_wgmma(ptx, name):
    """wgmma, and a shared-memory request the SM can meet (a build over it fails only at launch)."""
    from ads_gdpa import config as cfg

    counts = _ok(ptx, name)
    assert counts["wgmma"] > 0 and counts["shared_bytes"] <= cfg.SMEM_LIMIT, counts["shared_bytes"]


def test_fp8_forward_uses_wgmma(ptx):
    assert _ok(ptx, "fwd_fp8")["wgmma"] > 0


def test_backward_kernels_compile_with_wgmma(ptx):
    dkdv = _ok(ptx, "bwd_dkdv")
    assert dkdv["wgmma"] > 0 and dkdv["atomic_add"] > 0 and dkdv["local_memory"] == 0
    tma = _ok(ptx, "bwd_dkdv_tma")
    # Q/dO by TMA, dQ by one bulk reduction per tile instead of scalar atomics
    assert tma["tma"] > 0 and tma["tma_reduce"] > 0 and tma["atomic_add"] == 0 and tma["local_memory"] == 0
    loads = _ok(ptx, "bwd_dkdv_tma_loads")
    assert loads["tma"] > 0 and loads["tma_reduce"] == 0 and loads["atomic_add"] > 0
    assert loads["local_memory"] == 0
    dq_tma = _ok(ptx, "bwd_dq_tma")
    assert dq_tma["tma"] > 0 and dq_tma["atomic_add"] == 0 and dq_tma["local_memory"] == 0
    dq = _ok(ptx, "bwd_dq")
    assert dq["wgmma"] > 0 and dq["atomic_add"] == 0  # the deterministic pass adds nothing atomically
    assert _ok(ptx, "bwd_dq_per_head")["wgmma"] > 0


@pytest.mark.parametrize("d", [64, 128])
def test_gluon_forward_compiles_for_sm90(ptx, d):
    if f"gluon_d{d}" not in ptx:
        pytest.skip("this Triton has no Gluon")
    counts = _ok(ptx, f"gluon_d{d}")
    assert counts["wgmma"] > 0 and counts["tma"] > 0 and counts["tanh_approx"] > 0
    if d == 128:  # the variant for short maxima (dead halves skipped) builds and does not spill
        skip = _ok(ptx, "gluon_d128_skip_dead")
        assert skip["wgmma"] > 0 and skip["local_memory"] == 0


def test_gluon_packed_fast_gelu_builds_for_sm90(ptx):
    """The opt-in packed forward (``ADS_GDPA_PACKED_ACT=1``): the activation in bf16x2 arithmetic, no
    fp32 tanh or FFMA left, wgmma and no register spills."""
    if "gluon_d128_packed" not in ptx:
        pytest.skip("this Triton has no Gluon")
    counts = _ok(ptx, "gluon_d128_packed")
    assert counts["wgmma"] > 0 and counts["local_memory"] == 0
    assert min(counts["packed"]) > 0 and max(counts["fp32_tanh"] + counts["ffma"]) == 0, counts


@pytest.mark.parametrize("d", [64, 128])
def test_gluon_fp8_forward_compiles_for_sm90(ptx, d):
    """The FP8 build: e4m3 wgmma for both GEMMs, TMA loads (V from its K-major copy), the MUFU tanh
    for fast_gelu, no register spills; relu_square (no transcendental) builds too."""
    if f"gluon_fp8_d{d}" not in ptx:
        pytest.skip("this Triton has no Gluon")
    counts = _ok(ptx, f"gluon_fp8_d{d}")
    assert counts["wgmma"] > 0 and counts["tma"] > 0 and counts["tanh_approx"] > 0
    assert counts["local_memory"] == 0
    if d == 128:
        assert counts["partial_waits"], "ptxas serialised the FP8 build's wgmmas"
    assert _ok(ptx, "gluon_fp8_d128_relu_square")["local_memory"] == 0


@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_compiles_for_sm90(ptx, d):
    """TMA loads, wgmma, the MUFU tanh, dQ by bulk TMA reductions (no per-element atomics), and no
    register spills in the warp-specialised backward; the vector-atomic dQ variant compiles too."""
    if f"gluon_bwd_d{d}" not in ptx:
        pytest.skip("this Triton has no Gluon")
    counts = _ok(ptx, f"gluon_bwd_d{d}")
    assert counts["wgmma"] > 0 and counts["tma"] > 0 and counts["tanh_approx"] > 0
    assert counts["tma_reduce"] > 0 and counts["atomic_add"] == 0 and counts["local_memory"] == 0
    red = _ok(ptx, "gluon_bwd_red_v4")
    assert red["atomic_add"] > 0 and red["tma_reduce"] == 0 and red["local_memory"] == 0


@pytest.mark.parametrize("job", ["gluon_d128", "gluon_bwd_d128"])
@pytest.mark.xfail(
    strict=True,
    reason="Triton 3.6 / its ptxas: the wait for the second GEMM lands before the activation (0-1 of the "
    "step's MUFU.TANH run under it). A forward build that forced the overlap was slower on the H200 "
    "(BENCHMARKS.md), so this is no longer a lead; passing means the compiler changed: time it "
    "before dropping this mark.",
)
def test_gluon_activation_runs_under_the_second_gemm(ptx, job):
    if job not in ptx:
        pytest.skip("this Triton has no Gluon")
    counts = _ok(ptx, job)["act_under_gemm"]
    assert len(counts) == 2  # one steady step per consumer warpgroup
    assert min(counts) >= 16, f"MUFU.TANH between the waits per consumer: {counts}"
