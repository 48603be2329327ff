"""Host-side pieces of ``ads_kernel_tools.kernels.gluon_hopper``, on a CPU (descriptors are plain
host objects until a kernel is launched)."""

import pytest

pytest.importorskip("triton.experimental.gluon")

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma, warpgroup_mma_wait

from ads_kernel_tools.kernels.gluon_hopper import (
    acc_layout,
    bwd_buffers,
    bwd_grad_step,
    rows_desc,
    smem_layout,
    stage_for_tma,
    tma_reduce_add,
)


def test_rows_desc_views_rows_by_heads_times_d():
    x = torch.zeros(300, 4, 128, dtype=torch.bfloat16)
    d = rows_desc(x, 64, gl.bfloat16)
    assert list(d.shape) == [300, 512] and list(d.strides) == [512, 1]
    assert list(d.block_shape) == [64, 128] and d.layout == smem_layout(64, 128, gl.bfloat16)
    assert d.base.data_ptr() == x.data_ptr()


def test_rows_desc_takes_the_row_stride_of_a_packed_projection():
    """q, k and v sliced out of one (T, 3, heads, D) projection: each row's heads·D values are
    contiguous, the rows 3·heads·D apart; the descriptor starts at the slice and steps by that."""
    qkv = torch.zeros(300, 3, 4, 64, dtype=torch.bfloat16)
    for i, part in enumerate(qkv.unbind(1)):
        d = rows_desc(part, 64, gl.bfloat16)
        assert list(d.shape) == [300, 256] and list(d.strides) == [768, 1]
        assert d.base.data_ptr() == qkv.data_ptr() + i * 256 * 2
    one = rows_desc(qkv[:1, 0], 64, gl.bfloat16)  # a single row: its stride is never used
    assert list(one.shape) == [1, 256] and list(one.strides) == [256, 1]


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[:, ::2],  # heads not packed
        lambda t: t.transpose(0, 1),  # heads-major: rows not holding their heads together
        lambda t: t[..., ::2],  # D not contiguous
    ],
)
def test_rows_desc_refuses_rows_without_packed_heads(view):
    x = view(torch.zeros(64, 4, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="packed in each row"):
        rows_desc(x, 64, gl.bfloat16)


def test_rows_desc_narrower_boxes_and_fp32():
    x = torch.zeros(10, 2, 64, dtype=torch.float32)
    d = rows_desc(x, 64, gl.float32, cols=32)
    assert list(d.shape) == [10, 128] and list(d.block_shape) == [64, 32]
    assert d.layout == smem_layout(64, 32, gl.float32)


def test_rows_desc_without_rows_gets_a_one_row_dummy():
    x = torch.zeros(0, 3, 64, dtype=torch.float16)
    d = rows_desc(x, 128, gl.float16)
    assert list(d.shape) == [1, 192] and d.base.dtype == torch.float16
    assert (d.base == 0).all()


# A one-warpgroup kernel around the backward pieces, compiled for sm_90 (never launched: its
# barriers expect two warpgroups), to check that they build: wgmma for the three GEMMs, the
# shared memory they claim, no local memory.
@gluon.jit
def _bwd_pieces_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, STAGES: gl.constexpr):
    (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, qd_ready, qd_empty, kv_ready, kv_empty, ds_full,
     ds_free) = bwd_buffers(q_desc, do_desc, k_desc, v_desc, dq_desc, STAGES)  # fmt: skip
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    R: gl.constexpr = k_desc.block_type.shape[0] // 2
    DH: gl.constexpr = dq_desc.block_type.shape[1]
    kv_layout: gl.constexpr = acc_layout(D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    pt = gl.zeros([R, BM], gl.float32, acc_layout(BM))
    dv = gl.zeros([R, D], gl.float32, kv_layout)
    dq_zero = gl.zeros([BM, DH], gl.float32, acc_layout(DH))
    dv, dk, dq = bwd_grad_step(pt, pt, dv, dv, q_smem.index(0), do_smem.index(0), k_smem.slice(0, DH, dim=1),
                               ds_smem, 0, 0, ds_full, ds_free, qd_empty.index(0), dq_zero, 0,
                               p_layout)  # fmt: skip
    dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
    stage_for_tma(dq_smem.index(0), dq + gl.sum(gl.sum(dv + dk, 1), 0))
    tma_reduce_add(dq_desc, [0, 0], dq_smem.index(0))
    tma.store_wait(0)


def _bwd_pieces_job(d: int) -> dict:
    from triton.runtime.jit import mangle_type

    def desc(rows, cols, dtype, tdtype):
        return mangle_type(rows_desc(torch.zeros(256, 2, d, dtype=tdtype), rows, dtype, cols=cols))

    bf16 = (gl.bfloat16, torch.bfloat16)
    fp32 = (gl.float32, torch.float32)
    types = {"q_desc": desc(64, d, *bf16), "do_desc": desc(64, d, *bf16), "k_desc": desc(128, d, *bf16),
             "v_desc": desc(128, d, *bf16), "dq_desc": desc(64, d // 2, *fp32)}  # fmt: skip
    consts = dict(STAGES=2)
    return dict(module=__name__, kernel="_bwd_pieces_kernel", types=types, constexprs=consts, gluon=True)


@pytest.mark.parametrize("d", [64, 128])
def test_backward_pieces_build_for_sm90(d):
    from ads_kernel_tools.compile_check import ptx_counts_batch

    (c,) = ptx_counts_batch([_bwd_pieces_job(d)])
    assert "error" not in c, c.get("error")
    assert c["wgmma"] > 0 and c["tma_reduce"] > 0 and c["local_memory"] == 0, c
    # 2 stages of Q and dO, K, two dS^T buffers, two fp32 dQ tiles (+ barriers); V, which this
    # kernel never reads, is not allocated
    want = 2 * 2 * 64 * d * 2 + 128 * d * 2 + 2 * 128 * 64 * 2 + 2 * 64 * (d // 2) * 4
    assert want <= c["shared_bytes"] <= want + 1024, (c["shared_bytes"], want)
