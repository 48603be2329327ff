"""Bad input gives a ValueError that says what is wrong; an FA4 keyword value we do not implement
gives a NotImplementedError naming it. Nothing reaches a kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ads_kernel_tools.testing import randn
from lp_fa4 import flash_attn_func, flash_attn_varlen_func, jagged_attention

BF = torch.bfloat16


def _dense(b=1, s=8, h=2, hk=1, d=32, dtype=BF):
    return tuple(randn((b, s, n, d), dtype=dtype, device="cpu", seed=i) for i, n in enumerate((h, hk, hk)))


def _varlen(t=8, h=2, hk=1, d=32, device="cpu"):
    q, k, v = (randn((t, n, d), dtype=BF, device=device, seed=i) for i, n in enumerate((h, hk, hk)))
    cu = torch.tensor([0, 3, t], dtype=torch.int32, device=device)
    return q, k, v, cu


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(qv=torch.zeros(1)), "qv"),
        (dict(score_mod=lambda *a: a), "score_mod"),
        (dict(mask_mod=lambda *a: a), "mask_mod"),
        (dict(aux_tensors=[]), "aux_tensors"),
        (dict(block_sparse_tensors=object()), "block_sparse_tensors"),
        (dict(num_splits=4), "num_splits"),
        (dict(gather_kv_indices=torch.zeros(1)), "gather_kv_indices"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_unsupported_keywords(kw, match):
    with pytest.raises(NotImplementedError, match=match):
        flash_attn_func(*_dense(), **kw)


def test_unsupported_varlen_keywords():
    q, k, v, cu = _varlen()
    with pytest.raises(NotImplementedError, match="scheduler_metadata"):
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, scheduler_metadata=object())
    with pytest.raises(NotImplementedError, match="e5m2"):
        flash_attn_func(*(t.to(torch.float8_e5m2) for t in _dense()))


def test_accepted_fa4_keywords(device):
    out, lse = flash_attn_func(
        *(t.to(device) for t in _dense()), pack_gqa=True, num_splits=1, return_lse=False
    )
    assert lse is None and out.shape == (1, 8, 2, 32)
    q, k, v, cu = (t.to(device) for t in _varlen())
    flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, pack_gqa=False, min_seqlen_k=3, scheduler_metadata=None)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (*_dense(dtype=torch.float32),), "bfloat16 or float16"),
        (lambda: (_dense()[0], _dense()[1].half(), _dense()[2]), "share a dtype"),
        (lambda: _dense(h=3, hk=2), "multiple of kv heads"),
        (lambda: _dense(d=12), "multiple of 8"),
        (lambda: _dense(d=264), "multiple of 8 in"),
        (lambda: (_dense()[0], _dense(b=2)[1], _dense(b=2)[2]), "batch"),
        (lambda: (_dense()[0][0], *_dense()[1:]), "4-D"),
    ],
)
def test_bad_dense_inputs(make, match):
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*make())


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window_size=(1,)), "window_size"),
        (dict(window_size=(1.5, None)), "window_size"),
        (dict(softcap=-1.0), "softcap"),
        (dict(softmax_scale=float("nan")), "softmax_scale"),
        (dict(softmax_scale="0.5"), "softmax_scale must be None or a finite real number, got str '0.5'"),
        (dict(softmax_scale=True), "softmax_scale must be None or a finite real number, got bool True"),
        (dict(softcap=float("inf")), "softcap must be None or a finite real number >= 0, got inf"),
        (dict(window_size=(True, None)), r"window_size\[0\] must be None or an integer, got bool True"),
        (dict(learnable_sink=torch.zeros(3)), "learnable_sink"),
        (dict(causal=1), "causal"),
        (dict(pack_gqa="yes"), "pack_gqa"),
    ],
)
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*_dense(), **kw)


def test_bad_varlen_inputs():
    q, k, v, cu = _varlen()
    with pytest.raises(ValueError, match="max_seqlen_k must be None or an integer >= 0, got 5.0"):
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5.0)
    with pytest.raises(ValueError, match="num_splits must be an integer >= 0, got bool True"):
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, num_splits=True)
    with pytest.raises(ValueError, match="1-D int32"):
        flash_attn_varlen_func(q, k, v, cu.float(), cu, 5, 5)
    with pytest.raises(ValueError, match="entries"):
        flash_attn_varlen_func(q, k, v, cu, cu[:2], 5, 5)
    with pytest.raises(ValueError, match="seqused_k"):
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, seqused_k=torch.ones(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, cu, cu, -1, 5)
    table = torch.zeros(2, 2, dtype=torch.int32)
    kc = torch.zeros(4, 4, 1, 32, dtype=BF)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash_attn_varlen_func(q, kc, kc, cu, cu, 5, 5, page_table=table)
    with pytest.raises(ValueError, match="page_table"):
        flash_attn_varlen_func(q, kc, kc, cu, None, 5, 5, page_table=table[:1])
    with pytest.raises(ValueError, match="broadcast_q"):
        flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, broadcast_q=True)


def test_check_inputs_reads_device_values(monkeypatch, device):
    """ADS_CHECK_INPUTS=1: offsets outside the tensor, decreasing offsets, a length over max_seqlen
    (the FA4 functions; jagged_attention truncates) and page indices out of range are ValueErrors;
    without it the kernels clamp (see test_ops)."""
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")
    q, k, v, cu = _varlen()
    bad = torch.tensor([0, 3, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="spans"):
        flash_attn_varlen_func(q, k, v, bad, cu, 6, 5)
    with pytest.raises(ValueError, match="non-decreasing"):
        flash_attn_varlen_func(q, k, v, torch.tensor([0, 5, 3], dtype=torch.int32), cu, 6, 5)
    with pytest.raises(ValueError, match="max_seqlen"):
        flash_attn_varlen_func(q, k, v, cu, cu, 2, 5)
    kc = torch.zeros(4, 4, 1, 32, dtype=BF)
    with pytest.raises(ValueError, match="pages"):
        flash_attn_varlen_func(
            q, kc, kc, cu, None, 5, 5, page_table=torch.tensor([[0], [4]], dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="spans"):
        jagged_attention(q, k, v, bad, cu, 5)
    # jagged_attention truncates by contract (ads-jfa's upstream): longer sequences are valid there
    # (this call launches a kernel: on the test device, the checks above need none)
    q, k, v, cu = _varlen(device=device)
    out, _ = jagged_attention(q, k, v, cu, cu, 2, 2)
    assert (out[2:3] == 0).all() and (out[5:] == 0).all()
    # broadcast_q: one block of q's rows per kv sequence, so the query offsets must span q exactly
    short = torch.tensor([0, q.shape[0] - 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"broadcast_q needs cu_seqlens_q == \[0, "):
        flash_attn_varlen_func(q, k, v, short, cu, None, 5, broadcast_q=True)


def test_bad_jagged_inputs():
    q, k, v, cu = _varlen()
    with pytest.raises(ValueError, match="window_size"):
        jagged_attention(q, k, v, cu, cu, 5, window_size=-1)
    with pytest.raises(ValueError, match="max_seqlen_q must be None or an integer >= 0, got 5.5"):
        jagged_attention(q, k, v, cu, cu, 5.5)
    with pytest.raises(ValueError, match="2 entries"):
        jagged_attention(q, k, v, cu, cu, 5, broadcast_q=True)


def test_cpu_tensors_without_interpreter(monkeypatch):
    """Off the interpreter, CPU tensors are a ValueError, raised after every argument check."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA device"):
        flash_attn_func(*_dense())
    with pytest.raises(ValueError, match="multiple of kv heads"):
        flash_attn_func(*_dense(h=3, hk=2))


def test_check_inputs_with_seqused(monkeypatch, device):
    """With seqused, max_seqlen bounds the used prefixes, not the slots (the first call runs)."""
    monkeypatch.setenv("ADS_CHECK_INPUTS", "1")
    q, k, v, cu = _varlen(device=device)  # slots of 3 and 5 rows
    used = torch.tensor([2, 2], dtype=torch.int32, device=device)
    flash_attn_varlen_func(q, k, v, cu, cu, 2, 2, seqused_q=used, seqused_k=used)
    with pytest.raises(ValueError, match="seqused_q"):
        flash_attn_varlen_func(q, k, v, cu, cu, 1, 2, seqused_q=used, seqused_k=used)


def test_numpy_scalars_taken_like_python_numbers(device):
    """numpy.float32 softmax_scale / softcap and numpy.int64 bounds and window sides: the output of the
    Python numbers."""
    q, k, v = (t.to(device) for t in _dense())
    want, _ = flash_attn_func(q, k, v, softmax_scale=0.25, softcap=2.0, window_size=(3, 1))
    got, _ = flash_attn_func(
        q,
        k,
        v,
        softmax_scale=np.float32(0.25),
        softcap=np.float32(2.0),
        window_size=(np.int64(3), np.int64(1)),
    )
    assert torch.equal(got, want)
    q, k, v, cu = (t.to(device) for t in _varlen())
    want, _ = jagged_attention(q, k, v, cu, cu, 5, 5, softmax_scale=0.25, window_size=2)
    got, _ = jagged_attention(
        q, k, v, cu, cu, np.int64(5), np.int64(5), softmax_scale=np.float32(0.25), window_size=np.int64(2)
    )
    assert torch.equal(got, want)
