"""The shared kernels (``ads_kernel_tools.kernels``) build for sm_90 without register spills, on a CPU."""

import pytest

pytest.importorskip("triton")

from ads_kernel_tools.compile_check import ptx_counts_batch

I32 = "*i32"
_SORT = dict(cu_q_ptr=I32, cu_k_ptr=I32, work_ptr=I32, order_ptr=I32, ends_ptr=I32, n_seq="i32", max_q="i32",
             heads="i32", slots="i32")  # fmt: skip
_FUSED = {a: t for a, t in _SORT.items() if a not in ("order_ptr", "ends_ptr")}
_MOD = "ads_kernel_tools.kernels.tile_list"
JOBS = {
    # the one-program sort at its largest size, with and without caller weights, and the fill
    "sort_count": dict(module=_MOD, kernel="_sort_and_count", types=_SORT,
                       constexprs=dict(BLOCK=128, N=4096, TILE_Q=True, HAS_WORK=False), num_warps=8),
    "sort_fill": dict(module=_MOD, kernel="_sort_and_fill", types=dict(_FUSED, list_ptr=I32, count_ptr=I32),
                      constexprs=dict(BLOCK=128, N=2048, TILE_Q=True, HAS_WORK=True), num_warps=8),
    "fill": dict(module=_MOD, kernel="_tile_fill",
                 types=dict(order_ptr=I32, cu_ptr=I32, ends_ptr=I32, list_ptr=I32, heads="i32", slots="i32"),
                 constexprs=dict(BLOCK=128, WIDTH=64)),
    "clamp": dict(module="ads_kernel_tools.kernels.offsets", kernel="_clamp_offsets",
                  types=dict(src_a=I32, dst_a=I32, n_a="i32", rows_a="i64", src_b="*i64", dst_b=I32,
                             n_b="i32", rows_b="i64", buf=I32),
                  constexprs=dict(CHUNK=1024, TWO=True, ZERO=False, BLOCK=4096)),
    "clamp_zero": dict(module="ads_kernel_tools.kernels.offsets", kernel="_clamp_offsets",
                       types=dict(src_a="*i64", dst_a=I32, n_a="i32", rows_a="i32", src_b="*i64", dst_b=I32,
                                  n_b="i32", rows_b="i32", buf="*bf16", width="i32", total="i64"),
                       constexprs=dict(CHUNK=1024, TWO=True, ZERO=True, BLOCK=4096)),
}  # fmt: skip


@pytest.fixture(scope="module")
def ptx():
    return dict(zip(JOBS, ptx_counts_batch(list(JOBS.values()))))


@pytest.mark.parametrize("name", list(JOBS))
def test_compiles_for_sm90_without_spills(ptx, name):
    counts = ptx[name]
    assert "error" not in counts, counts.get("error")
    assert counts["local_memory"] == 0, name
