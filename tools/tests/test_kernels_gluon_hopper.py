"""Host-side pieces of ``ads_kernel_tools.kernels.gluon_hopper``, on a CPU (descriptors are plain
host objects until a kernel is launched)."""

import pytest

pytest.importorskip("triton.experimental.gluon")

import torch
from triton.experimental.gluon import language as gl

from ads_kernel_tools.kernels.gluon_hopper import rows_desc, smem_layout


def test_rows_desc_views_rows_by_heads_times_d():
    x = torch.zeros(300, 4, 128, dtype=torch.bfloat16)
    d = rows_desc(x, 64, gl.bfloat16)
    assert list(d.shape) == [300, 512] and list(d.strides) == [512, 1]
    assert list(d.block_shape) == [64, 128] and d.layout == smem_layout(64, 128, gl.bfloat16)
    assert d.base.data_ptr() == x.data_ptr()


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
