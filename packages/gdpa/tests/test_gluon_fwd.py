"""GPU checks of the Gluon sm_90 GDPA forward (ads_gdpa.gluon.fwd_sm90); its speed is measured by
``python -m ads_gdpa.bench`` (``--variants`` for the schedules and tuning knobs).

The reference is ads_kernel_tools' fp32 ``gdpa_ref``; the tolerance is the shared rule:
max|out - ref| <= 2 * max|base - ref| + floor, where ``base`` is ``gdpa_ref`` in the input precision.
"""

from __future__ import annotations

import pytest
import torch

from ads_kernel_tools.reference.gdpa import gdpa_ref
from ads_kernel_tools.tolerance import assert_close_vs_baseline


def _load_fwd():
    from ads_gdpa.gluon import fwd_sm90

    return fwd_sm90


pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


def _make_case(lens_q, lens_k, H, H_kv, D, dtype, seed, pad_rows=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    tq, tk = int(cu_q[-1]) + pad_rows, max(int(cu_k[-1]), 1)
    # S ~ N(0, 1): q, k scaled by D^-1/4 so activations see their interesting range.
    sc = D**-0.25
    q = (torch.randn(tq, H, D, generator=g, device="cuda") * sc).to(dtype)
    k = (torch.randn(tk, H_kv, D, generator=g, device="cuda") * sc).to(dtype)
    v = torch.randn(tk, H_kv, D, generator=g, device="cuda").to(dtype)
    return q, k, v, cu_q, cu_k


def _check(
    fwd,
    lens_q,
    lens_k,
    *,
    H=4,
    H_kv=2,
    D=128,
    dtype=torch.bfloat16,
    act=3,
    scale=1.0,
    max_q=None,
    pad_rows=3,
    seed=0,
    variant="ws",
    skip_dead_halves=None,
    kernel=None,
):
    """``kernel``: another forward with ``gdpa_fwd_gluon``'s contract (``fwd`` and the Gluon options
    unused), e.g. the CuTe DSL one."""
    q, k, v, cu_q, cu_k = _make_case(lens_q, lens_k, H, H_kv, D, dtype, seed, pad_rows)
    max_q = max(lens_q) if max_q is None else max_q
    out = torch.full_like(q, float("nan"))
    # longest_q as the package passes it with host offsets: the zero-tail launch is skipped unless
    # a sequence outgrows max_seqlen_q's tiles (the NaN poison catches a wrong skip)
    args = (q, k, v, cu_q, cu_k, max_q, max(lens_k), act, scale, out)
    if kernel is None:
        fwd.gdpa_fwd_gluon(*args, variant=variant, longest_q=max(lens_q), skip_dead_halves=skip_dead_halves)
    else:
        kernel(*args, longest_q=max(lens_q))
        variant = kernel.__name__
    torch.cuda.synchronize()
    n_seq_rows = int(cu_q[-1])
    # Contract: every row of every sequence is written (zeros past max_seqlen_q); rows that belong
    # to no sequence stay untouched.
    assert torch.isfinite(out[:n_seq_rows]).all(), "rows inside sequences not written (NaN left)"
    assert torch.isnan(out[n_seq_rows:]).all(), "rows outside every sequence were written"
    args = (q[:n_seq_rows], k, v, cu_q, cu_k, max_q, max(lens_k))
    ref = gdpa_ref(*args, activation=act, scale=scale)
    base = gdpa_ref(*args, activation=act, scale=scale, dtype=dtype)
    desc = f"{variant} act={act} D={D} {str(dtype)[6:]} H={H}/{H_kv} scale={scale} max_q={max_q}"
    desc += f" skip_dead={skip_dead_halves}"
    assert_close_vs_baseline(out[:n_seq_rows], ref, base, name=desc)
    return desc


RAGGED = [1, 63, 64, 65, 127, 128, 129, 300, 2048]
RAGGED_K = [300, 2048, 1, 129, 64, 65, 127, 63, 128]


def _cases(quick: bool):
    cases = [
        dict(lens_q=RAGGED, lens_k=RAGGED, act=3),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, D=64, dtype=torch.float16, H_kv=4),
        dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, H_kv=1, scale=0.37),
        # max_seqlen_q below some lengths: rows past it must be zeros, and Lq = 0 / Lk = 0 sequences.
        dict(lens_q=[300, 0, 5, 700, 129], lens_k=[17, 50, 0, 900, 129], act=3, max_q=130),
        # More tiles than programs, some without keys, several per program.
        dict(lens_q=[130, 0, 64, 300, 7] * 12, lens_k=[0, 5, 129, 0, 300] * 12, act=3),
    ]
    if not quick:
        for a in (0, 1, 2, 4, 5, 7, 8, 9, 10):
            cases.append(dict(lens_q=[1, 65, 129, 300], lens_k=[129, 300, 1, 65], act=a, scale=0.5))
        cases.append(dict(lens_q=RAGGED, lens_k=RAGGED, act=3, D=64, dtype=torch.bfloat16))
        cases.append(dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, D=128, dtype=torch.float16))
    return cases


@pytest.mark.parametrize("case", range(len(_cases(False))))
def test_gluon_fwd(case):
    """The default (warp-specialised) variant over the full case list."""
    _check(_load_fwd(), variant="ws", **_cases(False)[case])


@pytest.mark.parametrize("variant", ["ws_simple"])
@pytest.mark.parametrize("case", range(len(_cases(True))))
def test_gluon_fwd_other_variants(variant, case):
    """The other schedules on the quick list (each variant is a separate compile per case)."""
    _check(_load_fwd(), variant=variant, **_cases(True)[case])


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("case", range(len(_cases(True))))
def test_gluon_fwd_dead_half_skip_forced(skip, case):
    """Both builds on every quick case: the default picks one by max_seqlen_q, so forcing each
    covers the dead-half skip on long maxima and its absence on short ones."""
    _check(_load_fwd(), skip_dead_halves=skip, **_cases(True)[case])


PACKED_CASES = [c for c in _cases(True) if "dtype" not in c] + [
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act=3, scale=1.0 / 2048),  # upstream's 1/max_seqlen
    dict(lens_q=RAGGED, lens_k=RAGGED, act=3, D=64),
]


@pytest.mark.parametrize("case", range(len(PACKED_CASES)))
def test_gluon_fwd_packed_act(monkeypatch, case):
    """ADS_GDPA_PACKED_ACT=1 (bf16 fast_gelu in bf16x2 arithmetic) under the same tolerance rule."""
    monkeypatch.setenv("ADS_GDPA_PACKED_ACT", "1")
    _check(_load_fwd(), **PACKED_CASES[case])


def test_dispatch_routes_to_gluon_when_asked(monkeypatch):
    """ADS_GDPA_BACKEND=gluon sends supported forwards through the Gluon kernel, with the same result."""
    from ads_gdpa import gdpa_varlen

    fwd = _load_fwd()
    calls = []
    original = fwd.gdpa_fwd_gluon

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(fwd, "gdpa_fwd_gluon", counting)
    q, k, v, cu_q, cu_k = _make_case(RAGGED, RAGGED_K, 4, 2, 128, torch.bfloat16, seed=5)
    args = (q, k, v, cu_q, cu_k, max(RAGGED), max(RAGGED_K))
    monkeypatch.setenv("ADS_GDPA_BACKEND", "triton")
    triton_out = gdpa_varlen(*args, activation="fast_gelu")
    assert not calls
    monkeypatch.setenv("ADS_GDPA_BACKEND", "gluon")
    gluon_out = gdpa_varlen(*args, activation="fast_gelu")
    assert calls, "the Gluon kernel was not called"
    ref = gdpa_ref(*args, activation="fast_gelu")
    base = gdpa_ref(*args, activation="fast_gelu", dtype=torch.bfloat16)
    assert_close_vs_baseline(gluon_out, ref, base, name="gluon via dispatch")
    assert_close_vs_baseline(triton_out, ref, base, name="triton via dispatch")


def test_gluon_fwd_deferred_scale_same_bits(monkeypatch):
    """bf16 fast_gelu multiplies the output tile by scale·½ instead of every score (one multiply per
    score less); with a power-of-two scale that is exact, so both builds give the same bits."""
    fwd = _load_fwd()
    q, k, v, cu_q, cu_k = _make_case(RAGGED, RAGGED_K, 4, 2, 128, torch.bfloat16, seed=3)
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("ADS_GDPA_DEFER_SCALE", flag)
        out = torch.full_like(q, float("nan"))
        fwd.gdpa_fwd_gluon(q, k, v, cu_q, cu_k, max(RAGGED), max(RAGGED_K), 3, 0.25, out)
        outs.append(out[: int(cu_q[-1])])
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1]), (outs[0].float() - outs[1].float()).abs().max()


# ---------------------------------------------------------------------------------------------
# FP8 (e4m3 in, bf16 out) through the same kernel: against the fp64 GDPA of the dequantised inputs,
# per (sequence, head), with act(S) from ~1e-3 to ~1e3 and the upstream scales (test_fp8.py).
# ---------------------------------------------------------------------------------------------

FP8_CASES = [
    dict(lens_q=RAGGED, lens_k=RAGGED, act="fast_gelu", scale=1 / 2048),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="fast_gelu", scale=1.0, H_kv=1),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="silu", scale=1 / 256),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="relu", scale=1 / 2048),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="raw", scale=1.0),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="relu_square", scale=1 / 2048),
    dict(lens_q=RAGGED, lens_k=RAGGED_K, act="gelu", scale=1 / 256, D=64),
    dict(
        lens_q=[300, 0, 5, 700, 129], lens_k=[17, 50, 0, 900, 129], act="fast_gelu", scale=1 / 2048, max_q=130
    ),
    dict(lens_q=[130, 0, 64, 300, 7] * 12, lens_k=[0, 5, 129, 0, 300] * 12, act="relu_square", scale=1.0),
]


@pytest.mark.parametrize("case", range(len(FP8_CASES)), ids=lambda i: f"{FP8_CASES[i]['act']}-{i}")
def test_gluon_fwd_fp8(case):
    from test_fp8 import check, make_case

    from ads_kernel_tools.reference.gdpa import activation_id

    c = dict(FP8_CASES[case])
    lens_q, lens_k, act, scale = c.pop("lens_q"), c.pop("lens_k"), c.pop("act"), c.pop("scale")
    H, H_kv, D, max_q = c.pop("H", 4), c.pop("H_kv", 2), c.pop("D", 128), c.pop("max_q", max(lens_q))
    case_ = make_case(lens_q, lens_k, act, heads=H, heads_kv=H_kv, dim=D, seed=case, device="cuda")
    (q8, k8, v8), descale, (cu_q, cu_k) = case_["fp8"], case_["descale"], case_["cu"]
    pad = 3  # rows past every sequence: never written
    q8 = torch.cat([q8, torch.zeros(pad, H, D, device="cuda").to(q8.dtype)])
    out = torch.full(q8.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    fwd = _load_fwd()
    fwd.gdpa_fwd_gluon(q8, k8, v8, cu_q, cu_k, max_q, max(lens_k), activation_id(act), scale, out,
                       longest_q=max(lens_q), descale=tuple(descale))  # fmt: skip
    torch.cuda.synchronize()
    n = sum(lens_q)
    assert torch.isfinite(out[:n]).all(), "rows inside sequences not written (NaN left)"
    assert torch.isnan(out[n:]).all(), "rows outside every sequence were written"
    check(
        out[:n], case_, act, scale, max_q, max(lens_k), name=f"gluon fp8 {act} D={D} H={H}/{H_kv} s={scale:g}"
    )
    for b, lq in enumerate(lens_q):  # rows past max_seqlen_q are zeros
        if lq > max_q:
            q0 = sum(lens_q[:b])
            assert (out[q0 + max_q : q0 + lq] == 0).all()


def test_gluon_fwd_fp8_rejects_bad_calls():
    fwd = _load_fwd()
    q = torch.zeros(4, 2, 128, device="cuda").to(torch.float8_e4m3fn)
    cu = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    out = torch.empty(4, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="descale"):
        fwd.gdpa_fwd_gluon(q, q, q, cu, cu, 4, 4, 3, 1.0, out)
    ones = (torch.ones(2, device="cuda"),) * 3
    with pytest.raises(ValueError, match="ping-pong"):
        fwd.gdpa_fwd_gluon(q, q, q, cu, cu, 4, 4, 3, 1.0, out, descale=ones, variant="ws_simple")
