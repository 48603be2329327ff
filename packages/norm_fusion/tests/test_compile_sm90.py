"""The kernels compile for Hopper with wgmma and TMA loads and without register spills, checked
without a GPU (Triton's offline compiler in one child process; see ads_kernel_tools.compile_check)."""

from __future__ import annotations

import pytest

from ads_kernel_tools.compile_check import ptx_counts_batch

_ROWNORM_PTRS = ("A", "B", "BIAS", "GAMMA", "BETA", "AUX", "OUT", "XHAT")
ROWNORM_TYPES = {p: "*bf16" for p in _ROWNORM_PTRS} | {
    "STAT1": "*fp32", "STAT2": "*fp32", "PART": "*fp32", "XOFF": "*fp32", "eps": "fp32", "part_plane": "i32",
}  # fmt: skip
_FLAGS = dict(HAS_GEMM=True, B_TRANS=True, HAS_BIAS=True, HAS_GAMMA=True, HAS_BETA=True, SAVE_XHAT=False,
              AUX_RAW=False, WEIGHT_GRADS=False, BIAS_GRAD=False, NUM_STAGES=4, BLOCK_K=64,
              FLATTEN=False)  # fmt: skip
# the tiles config.rownorm_config picks on the H200
# fmt: off
ROWNORM_CASES = {
    "ln_fwd_n1024": dict(MODE=0, SINGLE=False, BLOCK_M=128, BLOCK_N=256, _warps=8),
    "ln_fwd_n256_single": dict(MODE=0, SINGLE=True, BLOCK_M=128, BLOCK_N=256, _warps=8),
    "ln_fwd_m64_xhat": dict(MODE=0, SINGLE=False, BLOCK_M=64, BLOCK_N=256, SAVE_XHAT=True, _warps=4),
    "rms_fwd_n1040": dict(MODE=1, SINGLE=False, BLOCK_M=128, BLOCK_N=128, _warps=8),
    "ln_input_grad": dict(MODE=2, SINGLE=False, BLOCK_M=128, BLOCK_N=256, B_TRANS=False, HAS_BIAS=False,
                          WEIGHT_GRADS=True, _warps=8),
    "rms_input_grad_raw": dict(MODE=3, SINGLE=False, BLOCK_M=128, BLOCK_N=256, B_TRANS=False, AUX_RAW=True,
                               WEIGHT_GRADS=True, _warps=8),
    # rmsnorm_linear's input-mode dx at K <= 256 (the one-tile backward, _bwd_single), x̂·γ out
    "rms_input_grad_single_xg": dict(MODE=3, SINGLE=True, BLOCK_M=64, BLOCK_N=256, B_TRANS=False,
                                     AUX_RAW=True, WEIGHT_GRADS=True, SAVE_XHAT=True, NUM_STAGES=2,
                                     _warps=8),
    "ln_norm_bwd": dict(MODE=2, SINGLE=False, BLOCK_M=128, BLOCK_N=256, HAS_GEMM=False, WEIGHT_GRADS=True,
                        BIAS_GRAD=True, _warps=8),
}
# fmt: on


def _jobs() -> dict[str, dict]:
    jobs = {}
    for name, kw in ROWNORM_CASES.items():
        kw = dict(kw)
        warps = kw.pop("_warps")
        jobs[name] = dict(
            module="ads_norm_fusion.triton._rownorm", kernel="rownorm_kernel", types=ROWNORM_TYPES,
            constexprs=_FLAGS | kw, num_warps=warps,
        )  # fmt: skip
    gemm_types = {p: "*bf16" for p in ("A", "B", "GAMMA", "BIAS", "AUX", "OUT")} | {
        "ALPHA": "*fp32", "COEF": "*fp32", "PART": "*fp32",
    }  # fmt: skip
    gemm_flags = dict(BLOCK_M=128, BLOCK_K=64, GROUP_M=8, NUM_PROGS=132, FLATTEN=True)
    # the tiles config.rms_gemm_config picks: forward (TMA store) and the dx backward (x tile, dγ partials)
    jobs["rms_gemm"] = dict(
        module="ads_norm_fusion.triton._rms_gemm", kernel="scaled_gemm_kernel", types=gemm_types,
        constexprs=gemm_flags | dict(B_TRANS=True, HAS_GAMMA=False, HAS_BIAS=True, HAS_AUX=False,
                                     PART_GRADS=False, TMA_STORE=True, BLOCK_N=256),
        num_warps=8, num_stages=3,
    )  # fmt: skip
    jobs["rms_gemm_dx"] = dict(
        module="ads_norm_fusion.triton._rms_gemm", kernel="scaled_gemm_kernel", types=gemm_types,
        constexprs=gemm_flags | dict(B_TRANS=False, HAS_GAMMA=True, HAS_BIAS=False, HAS_AUX=True,
                                     PART_GRADS=True, TMA_STORE=False, BLOCK_N=128),
        num_warps=8, num_stages=3,
    )  # fmt: skip
    # K <= 256: one 64 x 256 tile spans the row and forms its coefficient in the epilogue
    jobs["rms_gemm_dx_row_coef"] = dict(
        module="ads_norm_fusion.triton._rms_gemm", kernel="scaled_gemm_kernel", types=gemm_types,
        constexprs=gemm_flags | dict(B_TRANS=False, HAS_GAMMA=True, HAS_BIAS=False, HAS_AUX=True,
                                     PART_GRADS=True, TMA_STORE=False, BLOCK_M=64, BLOCK_N=256,
                                     ROW_COEF=True),
        num_warps=8, num_stages=4,
    )  # fmt: skip
    jobs["rms_gemm_fused"] = dict(
        module="ads_norm_fusion.triton._rms_gemm", kernel="rms_gemm_kernel",
        types={"A": "*bf16", "B": "*bf16", "BIAS": "*bf16", "OUT": "*bf16", "RRMS": "*fp32", "eps": "fp32"},
        constexprs=dict(HAS_BIAS=True, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, NUM_STAGES=3),
        num_warps=8,
    )  # fmt: skip
    # the persistent forward (config.persistent_config's H200 tiles at K >= 1024): still
    # software-pipelined, i.e. four-stage TMA buffers, with the read-back barrier inside its loop
    jobs["ln_fwd_persistent"] = dict(
        module="ads_norm_fusion.triton._rownorm", kernel="rownorm_persistent_kernel",
        types={p: "*bf16" for p in ("A", "B", "BIAS", "GAMMA", "BETA", "OUT", "XHAT")}
        | {"STAT1": "*fp32", "STAT2": "*fp32", "XOFF": "*fp32", "eps": "fp32"},
        constexprs=dict(MODE=0, HAS_BIAS=True, HAS_GAMMA=True, HAS_BETA=True, SAVE_XHAT=False, BLOCK_M=128,
                        BLOCK_N=256, BLOCK_K=64, NUM_PROGS=132, FLATTEN=True, SYNC_ASM=True),
        num_warps=8, num_stages=4,
    )  # fmt: skip
    # the training forward: tiles staged in XHAT and kept there (config.save_prenorm)
    jobs["ln_fwd_persistent_stage_xhat"] = dict(
        jobs["ln_fwd_persistent"], constexprs=jobs["ln_fwd_persistent"]["constexprs"] | dict(STAGE_XHAT=True)
    )
    # config.norm_bwd_config's H200 tiles for N = 1024, the weight-gradient sums in the kernel (the
    # default config.norm_bwd_sums): two counter atomics and the fences around them
    norm_bwd_ptrs = {p: "*bf16" for p in ("DY", "XHAT", "GAMMA", "DZ", "OUT0", "OUT1", "OUT2")}
    jobs["norm_bwd"] = dict(
        module="ads_norm_fusion.triton._norm_bwd", kernel="norm_bwd_kernel",
        types=norm_bwd_ptrs | {"RSTAT": "*fp32", "PART": "*fp32", "COUNT": "*i32"},
        constexprs=dict(RMS=False, HAS_GAMMA=True, WEIGHT_GRADS=True, BIAS_GRAD=True, BLOCK_M=4, BLOCK_N=1024,
                        ROWS_PER_PROG=64, SUMS=True, GROUP=32, BLOCK_P=8, FENCE=True),
        num_warps=4, sass_between=_SASS_FENCE,
    )  # fmt: skip
    # the backward of a saved pre-norm value
    jobs["norm_bwd_raw"] = dict(
        jobs["norm_bwd"], types=jobs["norm_bwd"]["types"] | {"XOFF": "*fp32"},
        constexprs=jobs["norm_bwd"]["constexprs"] | dict(XHAT_RAW=True),
    )  # fmt: skip
    # rmsnorm_linear's backward over K (config.rms_backward_mode cublas): raw x, dγ only, x̂·γ out
    jobs["norm_bwd_rms_xg"] = dict(
        jobs["norm_bwd"], types=jobs["norm_bwd"]["types"] | {"XG": "*bf16"},
        constexprs=jobs["norm_bwd"]["constexprs"]
        | dict(RMS=True, BIAS_GRAD=False, XHAT_RAW=True, STORE_XG=True),
    )  # fmt: skip
    # rmsnorm_linear's weight gradient from raw x (config.rms_dw_config's tiles): x scaled in registers
    # between its TMA load and the wgmma, without spilling
    jobs["rms_dw"] = dict(
        module="ads_norm_fusion.triton._rms_dw", kernel="rms_dw_kernel",
        types={"DY": "*bf16", "X": "*bf16", "RRMS": "*fp32", "GAMMA": "*bf16", "PART": "*fp32"},
        constexprs=dict(HAS_GAMMA=True, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, NUM_STAGES=3), num_warps=8,
        sass_between={"stl": [r"^\.text\.rms_dw_kernel:", r"(?!)", r"\bSTL\b"]},
    )  # fmt: skip
    jobs["gluon_ln_fwd_n1024"] = _gluon_job(1024, rms=False, xhat=False)
    jobs["gluon_rms_fwd_n384_xhat"] = _gluon_job(384, rms=True, xhat=True)
    jobs["gluon_ln_fwd_n1024_split2"] = _gluon_job(1024, rms=False, xhat=False, split=2)
    jobs["gluon_rms_fwd_n768_xhat_split2"] = _gluon_job(768, rms=True, xhat=True, split=2)
    # the warp-specialised kernel (config.gluon_ws), with its SASS HGMMA counts
    for name, (n, rms, xhat, split) in GLUON_WS.items():
        jobs[name] = _gluon_job(n, rms=rms, xhat=xhat, split=split, ws=True) | {"sass_between": _SASS_WGMMA}
    for name, (n, rms, save_z) in GLUON_EPI.items():
        jobs[name] = _gluon_epi_job(n, rms=rms, save_z=save_z) | {"sass_between": _SASS_WGMMA_EPI}
    for name, (n, nt) in GLUON_RMS_LINEAR.items():
        jobs[name] = _gluon_rms_linear_job(n, nt) | {"sass_between": _SASS_WGMMA_RMS_LINEAR}
    return jobs


# (N, column tiles per program) of the Gluon rmsnorm_linear forward (gluon.rms_linear_sm90)
GLUON_RMS_LINEAR = {"gluon_rms_linear_n1024": (1024, 1), "gluon_rms_linear_n1024_nt4": (1024, 4)}
_SASS_WGMMA_RMS_LINEAR = {
    "hgmma": [r"^\.text\.rms_linear_fwd_kernel:", r"(?!)", r"\bHGMMA\."],
    "hgmma_gsb0": [r"^\.text\.rms_linear_fwd_kernel:", r"(?!)", r"\bHGMMA\..*\bgsb0\b"],
}


def _gluon_rms_linear_job(n: int, nt: int) -> dict:
    """The Gluon ``rmsnorm_linear`` forward at the tiles and ring depth its launcher picks."""
    import torch
    from triton.runtime.jit import mangle_type

    from ads_norm_fusion.gluon import fwd_sm90 as g
    from ads_norm_fusion.gluon import rms_linear_sm90 as r

    bn = r.block_n(n)
    host = torch.empty(256, 256, dtype=torch.bfloat16)

    def desc(rows, cols):
        return mangle_type(g._desc(host, rows, cols))

    types = {"a_desc": desc(128, g.BLOCK_K), "b_desc": desc(bn, g.BLOCK_K),
             "out_desc": desc(64, bn), "bias_ptr": "*bf16", "rrms_ptr": "*fp32", "eps": "fp32"}  # fmt: skip
    consts = dict(HAS_BIAS=True, NT=nt, STAGES=r.stages_for(bn), SPLIT=r.split_for(n, bn, nt, 132))
    return dict(module=r.__name__, kernel="rms_linear_fwd_kernel", types=types, constexprs=consts,
                gluon=True, num_warps=4)  # fmt: skip


# (N, RMS, SAVE_Z) of the normalisation-partition Gluon builds (gluon.fwd_epi_sm90); SAVE_Z: a
# training forward, which also stores the pre-norm value
GLUON_EPI = {
    "gluon_epi_ln_fwd_n1024": (1024, False, False),
    "gluon_epi_rms_fwd_n384": (384, True, False),
    "gluon_epi_ln_fwd_n4096_save_z": (4096, False, True),
    "gluon_epi_rms_fwd_n1024_save_z": (1024, True, True),
}
_SASS_WGMMA_EPI = {
    "hgmma": [r"^\.text\.linear_norm_fwd_epi_kernel:", r"(?!)", r"\bHGMMA\."],
    "hgmma_gsb0": [r"^\.text\.linear_norm_fwd_epi_kernel:", r"(?!)", r"\bHGMMA\..*\bgsb0\b"],
}


def _gluon_epi_job(n: int, *, rms: bool, save_z: bool) -> dict:
    """The normalisation-partition Gluon forward at the tiles and ring depth its launcher picks."""
    import torch
    from triton.runtime.jit import mangle_type

    from ads_norm_fusion import config
    from ads_norm_fusion.gluon import fwd_epi_sm90 as e
    from ads_norm_fusion.gluon import fwd_sm90 as g

    bn = n // config.gluon_epi_split(n)
    host = torch.empty(256, 256, dtype=torch.bfloat16)

    def desc(rows, cols):
        return mangle_type(g._desc(host, rows, cols))

    types = {"a_desc": desc(128, e.BLOCK_K_EPI), "b_desc": desc(bn, e.BLOCK_K_EPI), "out_desc": desc(64, bn),
             **{p: "*bf16" for p in ("bias_ptr", "gamma_ptr", "beta_ptr")}, "stat1_ptr": "*fp32",
             "stat2_ptr": "*fp32", "part_ptr": "*fp32", "flag_ptr": "*i32", "zsave_ptr": "*bf16",
             "zoff_ptr": "*fp32", "eps": "fp32"}  # fmt: skip
    consts = dict(RMS=rms, HAS_BIAS=True, HAS_GAMMA=True, HAS_BETA=not rms, STAGES=e.stages_for_epi(bn),
                  SPLIT=config.gluon_epi_split(n), SAVE_Z=save_z)  # fmt: skip
    return dict(module=e.__name__, kernel="linear_norm_fwd_epi_kernel", types=types, constexprs=consts,
                gluon=True, num_warps=4)  # fmt: skip


# (N, RMS, x̂, split) of the warp-specialised Gluon builds
GLUON_WS = {
    "gluon_ws_ln_fwd_n1024": (1024, False, False, 1),
    "gluon_ws_rms_fwd_n384_xhat": (384, True, True, 1),
    "gluon_ws_ln_fwd_n1024_split2": (1024, False, False, 2),
    "gluon_ws_rms_fwd_n768_xhat_split2": (768, True, True, 2),
    # N = 4096: eight programs of 512 columns per row block (config.gluon_split)
    "gluon_ws_ln_fwd_n4096_split8": (4096, False, False, 8),
}
# SASS of the norm backward: the GPU-scope fences that order its partial sums around the counters
_SASS_FENCE = {"membar_gpu": [r"^\.text\.norm_bwd_kernel:", r"(?!)", r"\bMEMBAR\S*\.GPU\b"]}
# SASS of the whole kernel: HGMMA instructions, and those that close a commit group (gsb0); when
# ptxas cannot keep the accumulator untouched while its wgmma is in flight, every HGMMA closes one
_SASS_WGMMA = {
    "hgmma": [r"^\.text\.linear_norm_fwd_ws_kernel:", r"(?!)", r"\bHGMMA\."],
    "hgmma_gsb0": [r"^\.text\.linear_norm_fwd_ws_kernel:", r"(?!)", r"\bHGMMA\..*\bgsb0\b"],
}


def _gluon_job(n: int, *, rms: bool, xhat: bool, split: int = 1, ws: bool = False) -> dict:
    """The Gluon forward (``gluon.fwd_sm90``) at the tiles and ring depth its launcher picks; ``ws``
    its warp-specialised kernel."""
    import torch
    from triton.runtime.jit import mangle_type

    from ads_norm_fusion.gluon import fwd_sm90 as g

    bm, bn = g.block_m(split), g.block_n(n, split)
    bk = g.block_k(n, bn, xhat, split)
    host = torch.empty(256, 256, dtype=torch.bfloat16)

    def desc(rows, cols):
        return mangle_type(g._desc(host, rows, cols))

    out_rows = g.BLOCK_M if ws else bm
    types = {"a_desc": desc(bm, bk), "b_desc": desc(bn, bk), "out_desc": desc(out_rows, bn),
             "xhat_desc": desc(out_rows, bn), **{p: "*bf16" for p in ("bias_ptr", "gamma_ptr", "beta_ptr")},
             "stat1_ptr": "*fp32", "stat2_ptr": "*fp32", "part_ptr": "*fp32",
             "flag_ptr": "*i32" if split > 1 else "*fp32", "eps": "fp32"}  # fmt: skip
    consts = dict(RMS=rms, HAS_BIAS=True, HAS_GAMMA=True, HAS_BETA=not rms, SAVE_XHAT=xhat,
                  NT=n // split // bn, STAGES=g.stages_for(n, bn, xhat, split, bk), SPLIT=split)  # fmt: skip
    kernel = "linear_norm_fwd_ws_kernel" if ws else "linear_norm_fwd_kernel"
    return dict(module=g.__name__, kernel=kernel, types=types, constexprs=consts, gluon=True,
                num_warps=4 if ws else bm // 16)  # fmt: skip


@pytest.fixture(scope="module")
def ptx(request) -> dict[str, dict]:
    jobs = _jobs()
    if not request.config.getoption("--run-slow"):
        jobs = {k: v for k, v in jobs.items() if k in _DEFAULT}
    return dict(zip(jobs, ptx_counts_batch(list(jobs.values()))))


# each compile costs 10-20 s of CPU: the representative kernels by default, the rest with --run-slow
_DEFAULT = ("ln_fwd_n1024", "ln_fwd_persistent", "ln_fwd_persistent_stage_xhat", "rms_input_grad_raw",
            "rms_input_grad_single_xg", "rms_dw", "rms_gemm", "rms_gemm_dx", "rms_gemm_dx_row_coef",
            "norm_bwd", "norm_bwd_raw", "norm_bwd_rms_xg", "gluon_ln_fwd_n1024",
            "gluon_ln_fwd_n1024_split2", "gluon_ws_ln_fwd_n1024_split2",
            "gluon_rms_linear_n1024")  # fmt: skip
CASES = [
    c if c in _DEFAULT else pytest.param(c, marks=pytest.mark.slow)
    for c in [
        *ROWNORM_CASES,
        "ln_fwd_persistent",
        "ln_fwd_persistent_stage_xhat",
        "rms_gemm",
        "rms_gemm_dx",
        "rms_gemm_dx_row_coef",
        "rms_gemm_fused",
        "rms_dw",
        "norm_bwd",
        "norm_bwd_raw",
        "norm_bwd_rms_xg",
        "gluon_ln_fwd_n1024",
        "gluon_rms_fwd_n384_xhat",
        "gluon_ln_fwd_n1024_split2",
        "gluon_rms_fwd_n768_xhat_split2",
        *GLUON_WS,
        *GLUON_EPI,
        *GLUON_RMS_LINEAR,
    ]  # fmt: skip
]


@pytest.mark.parametrize("case", CASES)
def test_compiles_for_sm90(ptx, case) -> None:
    counts = ptx[case]
    assert "error" not in counts, f"{case} did not compile for sm_90: {counts.get('error')}"
    if case.startswith("norm_bwd"):  # two counters, each fenced on both sides
        assert counts["atomic_add"] >= 2 and counts["membar_gpu"][0] >= 4, counts
    if case != "ln_norm_bwd" and not case.startswith("norm_bwd"):  # no GEMM in the plain norm backward
        assert counts["wgmma"] > 0, f"{case}: no wgmma"
        assert counts["tma"] > 0, f"{case}: no TMA loads"
    assert counts["local_memory"] == 0, f"{case} spills registers"
    if case.startswith("gluon"):  # the row block's z tiles and the TMA ring inside one block's 227 KB
        assert counts["shared_bytes"] <= 232448, counts["shared_bytes"]
        assert counts["tma"] >= 3, f"{case}: TMA loads and stores"
    if case.startswith(
        "ln_fwd_persistent"
    ):  # 4 stages of 128x64 + 256x64 bf16 tiles (the K loop is pipelined)
        assert 4 * (128 + 256) * 64 * 2 <= counts["shared_bytes"] <= 227 * 1024, counts["shared_bytes"]
    if case == "rms_dw":  # ptxas spills show in SASS only
        assert counts["stl"] == [0], counts
    if case in GLUON_EPI:  # two MMA warpgroups, one commit group per K step each
        (hgmma,), (groups,) = counts["hgmma"], counts["hgmma_gsb0"]
        assert hgmma >= 4 and groups == 2, counts
    if case in GLUON_RMS_LINEAR:  # two MMA warpgroups, one commit group per K step each
        (hgmma,), (groups,) = counts["hgmma"], counts["hgmma_gsb0"]
        assert hgmma >= 8 and groups == 2, counts
        assert counts["shared_bytes"] >= 3 * 48 * 1024 + 64 * 1024, counts["shared_bytes"]  # >= 3 stages
    if case in GLUON_WS:  # one commit group per K step (2-4 HGMMA), not one per instruction
        (hgmma,), (groups,) = counts["hgmma"], counts["hgmma_gsb0"]
        warpgroups = min(GLUON_WS[case][3], 2)  # split > 1: two 64-row warpgroups
        assert hgmma >= 2 * warpgroups and groups == warpgroups, counts
