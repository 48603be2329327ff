"""GPU checks of the Gluon sm_90 GDPA backward (ads_gdpa.gluon.bwd_sm90); its speed is measured by
``python -m ads_gdpa.bench``.

dQ, dK, dV against autograd through ads_kernel_tools' fp32 ``gdpa_ref``, with the shared rule
max|grad - ref| <= 2 * max|base - ref| + floor (``base``: the same reference in the input precision).
dK/dV buffers start as NaN: every row inside a sequence must be written, rows outside none.
"""

from __future__ import annotations

import pytest
import torch

from ads_gdpa.activations import Activation
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets
from ads_kernel_tools.tolerance import assert_close_vs_baseline

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]
A = Activation

RAGGED = [1, 63, 64, 65, 127, 128, 129, 300, 2048, 0]
RAGGED_K = [300, 2048, 1, 129, 64, 65, 127, 63, 128, 5]


def _check(
    lens_q,
    lens_k,
    *,
    H=4,
    H_kv=2,
    D=128,
    dtype=torch.bfloat16,
    act=A.FAST_GELU,
    scale=1.0,
    max_q=None,
    seed=0,
    kernel=None,
):
    """``kernel``: a backward with ``gdpa_bwd_gluon``'s signature (default: the Gluon one)."""
    if kernel is None:
        from ads_gdpa.gluon.bwd_sm90 import gdpa_bwd_gluon as kernel

    g = torch.Generator(device="cuda").manual_seed(seed)
    cu_q, cu_k = lengths_to_offsets(lens_q, device="cuda"), lengths_to_offsets(lens_k, device="cuda")
    tq, tk = sum(lens_q), sum(lens_k)
    sc = D**-0.25  # S ~ N(0, 1): every activation sees both signs and its curved part
    q = (torch.randn(tq, H, D, generator=g, device="cuda") * sc).to(dtype)
    k = (torch.randn(tk, H_kv, D, generator=g, device="cuda") * sc).to(dtype)
    v = torch.randn(tk, H_kv, D, generator=g, device="cuda").to(dtype)
    do = torch.randn(tq, H, D, generator=g, device="cuda").to(dtype)
    max_q = max(lens_q) if max_q is None else max_q
    max_k = max(lens_k)
    dq = torch.zeros(tq, H, D, dtype=torch.float32, device="cuda")
    dk = torch.full_like(k, float("nan"))
    dv = torch.full_like(v, float("nan"))
    kernel(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq, dk, dv)
    torch.cuda.synchronize()
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all(), "dK/dV rows inside sequences not written"
    grads = {}
    for name, dt in (("ref", torch.float32), ("base", dtype)):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        out = gdpa_ref(*leaves, cu_q, cu_k, max_q, max_k, activation=act, scale=scale, dtype=dt)
        out.backward(do.to(dt))
        grads[name] = [t.grad for t in leaves]
    desc = f"act={act} D={D} {str(dtype)[6:]} H={H}/{H_kv} scale={scale} max_q={max_q}"
    for name, got, ref, base in zip("qkv", (dq.to(dtype), dk, dv), grads["ref"], grads["base"]):
        assert_close_vs_baseline(got, ref, base, name=f"d{name} {desc}")
    return desc


def _cases():
    cases = [
        dict(lens_q=RAGGED, lens_k=RAGGED, act=A.FAST_GELU),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=A.FAST_GELU, D=64, dtype=torch.float16, H_kv=4),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=A.FAST_GELU, H_kv=1, scale=0.37),
        # max_seqlen_q below some lengths (those rows count for nothing), Lq = 0 and Lk = 0 sequences
        dict(lens_q=[300, 0, 5, 700, 129], lens_k=[17, 50, 0, 900, 129], act=A.FAST_GELU, max_q=130),
        dict(lens_q=RAGGED, lens_k=RAGGED, act=A.FAST_GELU, D=64),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=A.FAST_GELU, dtype=torch.float16),
        # the scale users pass upstream, 1/max_seqlen, with inputs at unit magnitude
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=A.FAST_GELU, scale=1.0 / max(RAGGED_K)),
    ]
    for a in (
        A.RAW,
        A.GELU,
        A.GELU_APPROX,
        A.LEAKY_RELU,
        A.RELU,
        A.SILU,
        A.FAST_SILU,
        A.HARDSWISH,
        A.RELU_SQUARE,
    ):
        cases.append(dict(lens_q=[1, 65, 129, 300], lens_k=[129, 300, 1, 65], act=a, scale=0.5))
    return cases


@pytest.mark.parametrize("case", range(len(_cases())))
def test_gluon_bwd(case):
    _check(**_cases()[case])


def dispatch_check(monkeypatch, module, name: str, backend: str):
    """ADS_GDPA_BWD_BACKEND=``backend`` sends a supported backward through the op to ``module.name``,
    triton does not, and both meet the tolerance rule against the fp32 reference."""
    from ads_gdpa import gdpa_varlen

    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(1), original(*a, **k)))
    cu = lengths_to_offsets([129, 300, 64], device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    shape = (493, 2, 128)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) * 0.3 for _ in range(3))
    do = torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
    ref_grads = {}
    for dt in (torch.float32, torch.bfloat16):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        gdpa_ref(*leaves, cu, cu, 300, 300, activation="fast_gelu", dtype=dt).backward(do.to(dt))
        ref_grads[dt] = [t.grad for t in leaves]
    for chosen in ("triton", backend):
        monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", chosen)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        gdpa_varlen(*leaves, cu, cu, 300, 300, activation="fast_gelu").backward(do)
        assert bool(calls) == (chosen == backend)
        for grad_name, t, ref, base in zip(
            "qkv", leaves, ref_grads[torch.float32], ref_grads[torch.bfloat16]
        ):
            assert_close_vs_baseline(t.grad, ref, base, name=f"d{grad_name} via {chosen}")


def test_dispatch_uses_gluon_backward(monkeypatch):
    from ads_gdpa.gluon import bwd_sm90

    dispatch_check(monkeypatch, bwd_sm90, "gdpa_bwd_gluon", "gluon")
