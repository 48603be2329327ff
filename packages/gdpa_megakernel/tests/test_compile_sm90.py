"""The row kernels compile for Hopper without register spills, checked without a GPU (Triton's
offline compiler in one child process; see ads_kernel_tools.compile_check)."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from ads_gdpa_megakernel import config
from ads_kernel_tools.compile_check import ptx_counts_batch

_MOD = "ads_gdpa_megakernel.triton."
_F32 = ("MEAN", "RSTD", "RRMS", "PART_W", "PART_B")


def _types(ptrs: tuple[str, ...], weights: tuple[str, ...] = ("W", "B")) -> dict:
    """bf16 activations, fp32 statistics, partials and (nn.LayerNorm-style) weights, int32 offsets."""
    special = {"eps": "fp32", "CU": "*i32"}
    return {p: special.get(p, "*fp32" if p in _F32 or p in weights else "*bf16") for p in ptrs}


def _tile(n: int) -> dict:
    """The tile the GPU runs (the interpreter's smaller test tiles, set in conftest, left out)."""
    with mock.patch.dict(os.environ):
        for knob in ("ADS_GDPA_MK_TILE_ELEMS", "ADS_GDPA_MK_MAX_BLOCK_N"):
            os.environ.pop(knob, None)
        tile = config.row_tile(n)
    kw = tile.kwargs()
    warps = kw.pop("num_warps")
    return kw, warps


def _jobs() -> dict[str, dict]:
    jobs = {}
    for n in (512, 4096):  # the production H·D = 4·128; a wide token (two 2048-wide chunks)
        kw, warps = _tile(n)
        jobs[f"ln_fwd_n{n}"] = dict(
            module=_MOD + "_layernorm", kernel="ln_fwd_kernel",
            types=_types(("X", "W", "B", "Y", "MEAN", "RSTD", "eps")),
            constexprs=dict(HAS_W=True, HAS_B=True, **kw), num_warps=warps,
        )  # fmt: skip
        jobs[f"q_bwd_n{n}"] = dict(
            module=_MOD + "_layernorm", kernel="q_bwd_kernel",
            types=_types(("DQ", "DR", "X", "W", "MEAN", "RSTD", "DX", "PART_W", "PART_B")),
            constexprs=dict(HAS_DR=True, HAS_LN=True, HAS_W=True, WANT_W=True, WANT_B=True, **kw),
            num_warps=warps,
        )  # fmt: skip
        jobs[f"epilogue_fwd_n{n}"] = dict(
            module=_MOD + "_epilogue", kernel="epilogue_fwd_kernel",
            types=_types(("A", "QR", "W", "R", "OUT", "RRMS", "CU", "eps")),
            constexprs=dict(HAS_QRES=True, HAS_RMS=True, HAS_W=True, HAS_RES=True, **kw), num_warps=warps,
        )  # fmt: skip
        jobs[f"epilogue_bwd_n{n}"] = dict(
            module=_MOD + "_epilogue", kernel="epilogue_bwd_kernel",
            types=_types(("DOUT", "A", "QR", "W", "RRMS", "CU", "DY", "PART_W")),
            constexprs=dict(HAS_QRES=True, HAS_W=True, WANT_W=True, **kw), num_warps=warps,
        )  # fmt: skip
    return jobs


# each compile costs seconds of CPU: the production width by default, the wide token with --run-slow
_DEFAULT = ("ln_fwd_n512", "q_bwd_n512", "epilogue_fwd_n512", "epilogue_bwd_n512")


@pytest.fixture(scope="module")
def ptx(request) -> dict[str, dict]:
    jobs = _jobs()
    if not request.config.getoption("--run-slow"):
        jobs = {k: v for k, v in jobs.items() if k in _DEFAULT}
    return dict(zip(jobs, ptx_counts_batch(list(jobs.values()))))


CASES = [c if c in _DEFAULT else pytest.param(c, marks=pytest.mark.slow) for c in _jobs()]


def test_production_tile() -> None:
    """What the compile jobs check is the GPU's tile at H·D = 512: 4 tokens x 512 features, 4 warps."""
    assert _tile(512) == (dict(BLOCK_T=4, BLOCK_N=512, CHUNKS=1), 4)
    assert _tile(4096) == (dict(BLOCK_T=1, BLOCK_N=2048, CHUNKS=2), 4)


@pytest.mark.parametrize("case", CASES)
def test_compiles_for_sm90(ptx, case) -> None:
    counts = ptx[case]
    assert "error" not in counts, f"{case} did not compile for sm_90: {counts.get('error')}"
    assert counts["local_memory"] == 0, f"{case} spills registers"
