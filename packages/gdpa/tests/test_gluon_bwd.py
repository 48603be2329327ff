"""GPU checks and a quick benchmark for the Gluon sm_90 GDPA backward (ads_gdpa.gluon.bwd_sm90).

pytest:   pytest -m gpu packages/gdpa/tests/test_gluon_bwd.py
script:   python packages/gdpa/tests/test_gluon_bwd.py [--bench]

dQ, dK, dV against autograd through ads_kernel_tools' fp32 ``gdpa_ref``, with the shared rule
max|grad - ref| <= 2 * max|base - ref| + floor (``base``: the same reference in the input precision).
dK/dV buffers start as NaN: every row inside a sequence must be written, rows outside none.
"""

from __future__ import annotations

import argparse
import sys
import time

import pytest
import torch

from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import lengths_to_offsets
from ads_kernel_tools.tolerance import assert_close_vs_baseline


def _cuda_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_sm90(), reason="needs a CUDA sm_90 GPU")]

RAGGED = [1, 63, 64, 65, 127, 128, 129, 300, 2048, 0]
RAGGED_K = [300, 2048, 1, 129, 64, 65, 127, 63, 128, 5]


def _check(lens_q, lens_k, *, H=4, H_kv=2, D=128, dtype=torch.bfloat16, act=3, scale=1.0, max_q=None, seed=0):
    from ads_gdpa.gluon import bwd_sm90

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
    bwd_sm90.gdpa_bwd_gluon(do, q, k, v, cu_q, cu_k, max_q, max_k, act, scale, dq, dk, dv)
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
        dict(lens_q=RAGGED, lens_k=RAGGED, act=3),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, D=64, dtype=torch.float16, H_kv=4),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, H_kv=1, scale=0.37),
        # max_seqlen_q below some lengths (those rows count for nothing), Lq = 0 and Lk = 0 sequences
        dict(lens_q=[300, 0, 5, 700, 129], lens_k=[17, 50, 0, 900, 129], act=3, max_q=130),
        dict(lens_q=RAGGED, lens_k=RAGGED, act=3, D=64),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, dtype=torch.float16),
    ]
    for a in (0, 1, 2, 4, 5, 7, 8, 9, 10):
        cases.append(dict(lens_q=[1, 65, 129, 300], lens_k=[129, 300, 1, 65], act=a, scale=0.5))
    return cases


@pytest.mark.parametrize("case", range(len(_cases())))
def test_gluon_bwd(case):
    _check(**_cases()[case])


def test_dispatch_uses_gluon_backward(monkeypatch):
    """ADS_GDPA_BWD_BACKEND=gluon sends a supported backward to the Gluon kernel, triton does not, and
    both agree with each other."""
    from ads_gdpa import gdpa_varlen
    from ads_gdpa.gluon import bwd_sm90

    calls = []
    original = bwd_sm90.gdpa_bwd_gluon
    monkeypatch.setattr(bwd_sm90, "gdpa_bwd_gluon", lambda *a, **k: (calls.append(1), original(*a, **k)))
    cu = lengths_to_offsets([129, 300, 64], device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    shape = (493, 2, 128)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) * 0.3 for _ in range(3))
    grads = {}
    for backend in ("triton", "gluon"):
        monkeypatch.setenv("ADS_GDPA_BWD_BACKEND", backend)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        gdpa_varlen(*leaves, cu, cu, 300, 300, activation="fast_gelu").sum().backward()
        grads[backend] = [t.grad.float() for t in leaves]
        assert bool(calls) == (backend == "gluon")
    for a, b in zip(grads["triton"], grads["gluon"]):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.05)


def _bench(B=1152, H=4, D=128, max_len=2048, sparsity_half=False):
    import triton

    from ads_gdpa import gdpa_varlen

    g = torch.Generator().manual_seed(123)
    lens = torch.randint(1, max_len + 1, (B,), generator=g).tolist() if sparsity_half else [max_len] * B
    cu = lengths_to_offsets(lens, device="cuda")
    T = sum(lens)
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) * 0.3 for _ in range(3))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = gdpa_varlen(*leaves, cu, cu, max_len, max_len, activation="fast_gelu", cu_seqlens_q_cpu=cu.cpu(),
                      cu_seqlens_k_cpu=cu.cpu())  # fmt: skip
    do = torch.randn_like(out)
    fn = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    return ms, 2.5 * 4 * H * D * sum(L * L for L in lens) / ms / 1e9


def _bench_kernel(B=1152, H=4, D=128, max_len=2048, sparsity_half=False, dq_mode="tma"):
    """The Gluon kernel alone (no dQ zeroing/conversion, no autograd); dq_mode as ``bwd_sm90.DQ_MODES``."""
    import triton

    from ads_gdpa.gluon import bwd_sm90

    g = torch.Generator().manual_seed(123)
    lens = torch.randint(1, max_len + 1, (B,), generator=g).tolist() if sparsity_half else [max_len] * B
    cu = lengths_to_offsets(lens, device="cuda")
    T = sum(lens)
    q, k, v, do = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) * 0.3 for _ in range(4))
    dq = torch.zeros(T, H, D, device="cuda", dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    fn = lambda: bwd_sm90.gdpa_bwd_gluon(
        do, q, k, v, cu, cu, max_len, max_len, 3, 1.0, dq, dk, dv, _dq_mode=dq_mode
    )
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    return ms, 2.5 * 4 * H * D * sum(L * L for L in lens) / ms / 1e9


def main():
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    failed = 0
    t0 = time.time()
    if not args.no_check:
        for c in _cases():
            try:
                print("PASS", _check(**c), flush=True)
            except AssertionError as e:
                failed += 1
                print("FAIL", c.get("act"), c.get("D", 128), e, flush=True)
        print(f"gluon bwd: {failed} failed, {time.time() - t0:.1f}s", flush=True)
    if args.bench:
        for backend in ("gluon", "triton"):
            os.environ["ADS_GDPA_BWD_BACKEND"] = backend
            for sp in (False, True):
                ms, tf = _bench(sparsity_half=sp)
                print(f"BENCH bwd {backend} B=1152 H=4 D=128 len=2048 {'s=0.5' if sp else 's=1.0(full)'}: "
                      f"{ms:.3f} ms {tf:.1f} TFLOP/s", flush=True)  # fmt: skip
    if args.bench:
        for sp in (False, True):
            for mode in ("tma", "red", "none"):
                ms, tf = _bench_kernel(sparsity_half=sp, dq_mode=mode)
                what = ("s=0.5" if sp else "s=1.0(full)") + f" dQ by {mode}"
                print(f"BENCH kernel-only {what}: {ms:.3f} ms {tf:.1f} TFLOP/s", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
