import math

import pytest
import torch

from ads_kernel_tools import tolerance as tol


def test_errors_basic():
    ref = torch.tensor([1.0, 2.0, 3.0])
    out = torch.tensor([1.0, 2.5, 3.0])
    assert tol.max_abs_error(out, ref) == pytest.approx(0.5)
    assert tol.rel_norm_error(out, ref) == pytest.approx(0.5 / math.sqrt(14))
    assert tol.rel_norm_error(ref, ref) == 0.0
    assert math.isnan(tol.max_abs_error(torch.tensor([math.nan, 2.0, 3.0]), ref))


def test_cosine_and_sqnr():
    ref = torch.tensor([1.0, 0.0])
    assert tol.cosine_similarity(torch.tensor([2.0, 0.0]), ref) == pytest.approx(1.0)
    assert tol.cosine_similarity(torch.tensor([0.0, 1.0]), ref) == pytest.approx(0.0)
    # noise power 0.01 against signal power 1 -> 20 dB
    assert tol.sqnr_db(torch.tensor([1.1, 0.0]), ref) == pytest.approx(20.0)
    assert tol.sqnr_db(ref, ref) == math.inf


def test_baseline_rule_passes_and_fails():
    ref = torch.linspace(-1, 1, 101, dtype=torch.float64)
    baseline = ref + 1e-3
    tol.assert_close_vs_baseline(ref + 1.9e-3, ref, baseline, floor=0.0)
    with pytest.raises(AssertionError, match="baseline error"):
        tol.assert_close_vs_baseline(ref + 2.1e-3, ref, baseline, floor=0.0)


def test_baseline_rule_rejects_nan_even_with_large_floor():
    ref = torch.zeros(4)
    out = torch.tensor([0.0, math.nan, 0.0, 0.0])
    with pytest.raises(AssertionError, match="NaN: 1"):
        tol.assert_close_vs_baseline(out, ref, ref, floor=1e9)


def test_default_floor_scales_with_dtype():
    ref = torch.full((8,), 4.0)
    assert tol.rounding_floor(ref, torch.bfloat16) == pytest.approx(2 * 2**-8 * 4)
    assert tol.rounding_floor(ref, torch.float16) == pytest.approx(2 * 2**-11 * 4)
    # an exact baseline still leaves room for bf16 rounding of the output
    out = (ref + 0.01).to(torch.bfloat16)
    tol.assert_close_vs_baseline(out, ref, ref)


def test_mismatch_report_names_first_bad_index():
    ref = torch.zeros(3, 4)
    out = ref.clone()
    out[1, 2] = 5.0
    out[2, 0] = math.inf
    text = tol.mismatch_report(out, ref, atol=0.1, rtol=0.0, name="dq")
    assert "dq: 2 of 12" in text and "(1, 2)" in text and "inf: 1" in text
    with pytest.raises(AssertionError, match=r"\(1, 2\)"):
        tol.assert_close(out, ref, atol=0.1, rtol=0.0)
    tol.assert_close(ref + 0.05, ref, atol=0.1, rtol=0.0)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape mismatch"):
        tol.max_abs_error(torch.zeros(2), torch.zeros(3))
