"""GPU tests at real sizes (marker ``gpu``): the CPU matrix scaled up, FP8, short KV, determinism.

conftest pins one config per specialisation (the tests check numerics, the benchmark tunes);
``test_autotuned_configs`` runs the autotuned path once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gdpa_testlib import Case, make_inputs, run_case

from ads_gdpa import gdpa, gdpa_varlen
from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.testing import assert_memcheck_clean, jagged_lengths, lengths_to_offsets

pytestmark = pytest.mark.gpu

B = 6
LENS = tuple(jagged_lengths(B, 700, 0.5, seed=3)) + (0, 1, 127, 128, 129)
LENS_K = tuple(jagged_lengths(len(LENS), 640, 0.5, seed=4))


@pytest.mark.parametrize("act", ["raw", "gelu", "fast_gelu", "silu", "fast_gelu_bf16", "relu_square",
                                 "fast_gelu_taylor_approx", "hardswish"])  # fmt: skip
def test_activations_real_size(act):
    run_case(Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=2, d=128, act=act), "cuda")


@pytest.mark.parametrize("d,dv", [(64, 64), (96, 96), (192, 128)])
def test_head_dims_real_size(d, dv):
    run_case(Case(lq=LENS, heads=2, kv_heads=2, d=d, dv=dv), "cuda")


def test_autotuned_configs(monkeypatch):
    """The configs the Triton autotuner picks (what users of the portable path and the benchmark run)
    are numerically right too. The Triton backend is forced: on sm90 the Gluon kernels take this
    case, and the autotuner would never run."""
    monkeypatch.setenv("ADS_GDPA_DISABLE_AUTOTUNE", "0")
    monkeypatch.setenv("ADS_GDPA_BACKEND", "triton")
    run_case(Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=2, d=128, act="fast_gelu"), "cuda")


@pytest.mark.parametrize("deterministic,dq_reduce", [(False, False), (False, True), (True, False)])
def test_backward_with_tma(monkeypatch, deterministic, dq_reduce):
    """The opt-in TMA backward (TMA Q/dO loads, optionally bulk dQ reductions) is right too."""
    monkeypatch.setenv("ADS_GDPA_BWD_TMA", "1")
    monkeypatch.setenv("ADS_GDPA_BWD_DQ_TMA", "1" if dq_reduce else "0")
    run_case(Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=2, d=96, deterministic=deterministic), "cuda")


@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_triton_forward_real_size(monkeypatch, d, dtype):
    """On Hopper the default forward is Gluon; the portable Triton forward keeps real-size coverage."""
    monkeypatch.setenv("ADS_GDPA_BACKEND", "triton")
    run_case(Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=2, d=d, dtype=dtype), "cuda")


def test_fp16_mqa_nohost():
    run_case(Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=1, d=128, dtype=torch.float16, host=False), "cuda")


@pytest.mark.parametrize("masks", [dict(window=100), dict(causal=True), dict(local=(200, 16))],
                         ids=["window", "causal", "local"])  # fmt: skip
def test_masks_real_size(masks):
    run_case(Case(lq=LENS, lk=LENS_K, heads=2, kv_heads=1, d=128, act="gelu", **masks), "cuda")


def test_broadcast_q_and_max_q():
    run_case(Case(lq=(300,), lk=LENS_K, heads=2, kv_heads=2, d=128, broadcast_q=True, max_q=200), "cuda")


def test_short_kv():
    lq = tuple(jagged_lengths(16, 1024, 0.5, seed=5))
    run_case(Case(lq=lq, lk=(256,) * 16, heads=4, kv_heads=4, d=128), "cuda")
    run_case(Case(lq=lq, lk=(64,) * 16, heads=4, kv_heads=4, d=128, act="silu"), "cuda")


def test_dense_api():
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 513, 4, 128, device="cuda", generator=g).bfloat16() * 0.3
    k = torch.randn(2, 700, 4, 128, device="cuda", generator=g).bfloat16() * 0.3
    v = torch.randn(2, 700, 4, 128, device="cuda", generator=g).bfloat16()
    out = gdpa(q, k, v, activation="fast_gelu")
    ref = gdpa_ref(q.flatten(0, 1).float(), k.flatten(0, 1).float(), v.flatten(0, 1).float(),
                   [0, 513, 1026], [0, 700, 1400], 513, 700, activation="fast_gelu")  # fmt: skip
    assert (out.flatten(0, 1).float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_deterministic_bitwise_and_close_to_atomic():
    case = Case(lq=LENS, lk=LENS_K, heads=4, kv_heads=2, d=128)
    q, k, v, cu_q, cu_k, mq, mk = make_inputs(case, "cuda")
    do = torch.randn(q.shape[0], 4, 128, device="cuda", dtype=q.dtype)
    runs = []
    for det in (True, True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = gdpa_varlen(*leaves, cu_q, cu_k, mq, mk, deterministic=det)
        runs.append(torch.autograd.grad(out, leaves, do))
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2 * b.float().abs().max().item(), rtol=0)


def _fp8_case(descale: bool):
    """Spec §4 FP8 setup: q, k ~ 0.2·randn, v ~ U(-0.1, 0.1); mismatch |Δ| > 0.2 + 0.1|ref| vs bf16."""
    g = torch.Generator(device="cuda").manual_seed(1)
    lens = jagged_lengths(8, 1024, 0.5, seed=7)
    cu = lengths_to_offsets(lens, device="cuda")
    t, h = sum(lens), 4
    q = 0.2 * torch.randn(t, h, 128, device="cuda", generator=g)
    k = 0.2 * torch.randn(t, h, 128, device="cuda", generator=g)
    v = (torch.rand(t, h, 128, device="cuda", generator=g) - 0.5) * 0.2
    ref = gdpa_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, max(lens), max(lens))
    if descale:  # per-head scales that use the e4m3 range, undone by the descale factors
        sq, sk, sv = (x.abs().amax(dim=(0, 2)) / 448.0 for x in (q, k, v))
    else:
        sq = sk = sv = torch.ones(h, device="cuda")
    q8, k8, v8 = ((x / s[None, :, None]).to(torch.float8_e4m3fn) for x, s in ((q, sq), (k, sk), (v, sv)))
    out = gdpa_varlen(q8, k8, v8, cu, cu, max(lens), max(lens), q_descale=sq, k_descale=sk, v_descale=sv)
    assert out.dtype == torch.bfloat16
    bad = (out.float() - ref.float()).abs() > 0.2 + 0.1 * ref.float().abs()
    return bad.float().mean().item(), out, ref


@pytest.mark.parametrize("descale", [False, True])
def test_fp8_forward_mismatch_rate(descale):
    rate, out, ref = _fp8_case(descale)
    assert rate < 0.01, f"FP8 mismatch rate {rate:.4f}"
    rel = (out.float() - ref.float()).norm() / ref.float().norm()
    assert rel < 0.1, f"FP8 relative error {rel:.3f}"


def test_bad_offsets_are_memcheck_clean():
    """Every path (Gluon and Triton, forward and backward, deterministic, windows, FP8) on offsets that
    decrease, pass the end or start below 0: compute-sanitizer's memcheck must find 0 errors."""
    script = Path(__file__).with_name("memcheck_bad_offsets.py")
    assert_memcheck_clean(
        script, done_marker="memcheck_bad_offsets: all paths ran", env=dict(ADS_GDPA_DISABLE_AUTOTUNE="1")
    )
