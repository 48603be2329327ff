"""Accuracy checks for kernels.

The main rule (as FlashAttention's tests use it): a kernel computed in precision p may be at most
``factor`` times further from the fp32/fp64 reference than the same computation done in plain PyTorch
in precision p (the *baseline*), plus a small rounding floor so that exact-ish cases don't demand
bit-equality. Everything is measured in float64 to keep the measurement itself out of the error.
"""

from __future__ import annotations

import math

import torch

# Unit roundoff (half the machine epsilon) of the storage formats we emit.
_UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float8_e4m3fn: 2.0**-4,
    torch.float8_e5m2: 2.0**-3,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    return _UNIT_ROUNDOFF.get(dtype, 2.0**-24)


def _pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tensors in float64 on out's device: comparing on the GPU keeps checks of
    benchmark-sized tensors (10^9 elements) from spending minutes in host copies."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    return out.detach().to(torch.float64), ref.detach().to(device=out.device, dtype=torch.float64)


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref|; NaN anywhere in out gives NaN (so it fails any comparison)."""
    o, r = _pair(out, ref)
    if o.numel() == 0:
        return 0.0
    if not torch.isfinite(o).all():
        return math.nan
    return (o - r).abs().max().item()


def rel_norm_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 (0 when both are empty or zero)."""
    o, r = _pair(out, ref)
    denom = r.norm().item()
    num = (o - r).norm().item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


def cosine_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = _pair(out, ref)
    o, r = o.flatten(), r.flatten()
    denom = (o.norm() * r.norm()).item()
    if denom == 0.0:
        return 1.0 if o.norm().item() == r.norm().item() else 0.0
    return (o @ r).item() / denom


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio 10·log10(Σref² / Σ(out−ref)²) in dB (inf when exact)."""
    o, r = _pair(out, ref)
    noise = ((o - r) ** 2).sum().item()
    signal = (r**2).sum().item()
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def mismatch_report(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float,
    rtol: float,
    *,
    name: str = "out",
    max_items: int = 8,
) -> str:
    """A readable account of where ``out`` differs from ``ref`` beyond atol + rtol·|ref|.

    Lists the first bad indices with both values, and counts NaN/inf in ``out`` separately because
    they usually point at unwritten or out-of-bounds rows rather than rounding.
    """
    o, r = _pair(out, ref)
    bad = ~((o - r).abs() <= atol + rtol * r.abs())  # NaN compares False, so it lands in bad
    n_bad = int(bad.sum())
    lines = [
        f"{name}: {n_bad} of {o.numel()} elements outside atol={atol:g} rtol={rtol:g}"
        f" (NaN: {int(torch.isnan(o).sum())}, inf: {int(torch.isinf(o).sum())}, "
        f"ref NaN: {int(torch.isnan(r).sum())})"
    ]
    if o.numel():
        finite = torch.isfinite(o)
        if finite.any():
            diff = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
            lines.append(f"  max |out-ref| over finite entries: {diff.max().item():.4g}")
    for idx in bad.nonzero()[:max_items].cpu().tolist():
        t = tuple(idx)
        lines.append(f"  at {t}: out={o[t].item():.6g} ref={r[t].item():.6g}")
    return "\n".join(lines)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float, name: str = "out"
) -> None:
    """Elementwise |out-ref| <= atol + rtol·|ref| everywhere, with a mismatch report on failure."""
    o, r = _pair(out, ref)
    if not bool(((o - r).abs() <= atol + rtol * r.abs()).all()):
        raise AssertionError(mismatch_report(out, ref, atol, rtol, name=name))


def baseline_error(ref: torch.Tensor, baseline: torch.Tensor) -> float:
    """How far a same-precision PyTorch computation lands from the reference (max abs)."""
    return max_abs_error(baseline, ref)


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype, ulps: float = 2.0) -> float:
    """A few units of roundoff of ``dtype`` at the reference's magnitude: the error a correct kernel
    can show even where the baseline happens to round exactly."""
    r = ref.detach().to(torch.float64)
    scale = r.abs().max().item() if r.numel() else 0.0
    return ulps * unit_roundoff(dtype) * max(scale, 1e-6)


def assert_close_vs_baseline(
    out: torch.Tensor,
    ref: torch.Tensor,
    baseline: torch.Tensor,
    *,
    name: str = "out",
    factor: float = 2.0,
    floor: float | None = None,
) -> None:
    """max|out−ref| <= factor·max|baseline−ref| + floor; NaN/inf in ``out`` always fails.

    ``floor`` defaults to two units of roundoff of ``out.dtype`` at max|ref|.
    """
    if floor is None:
        floor = rounding_floor(ref, out.dtype)
    err = max_abs_error(out, ref)
    base = baseline_error(ref, baseline)
    limit = factor * base + floor
    if not (err <= limit):  # written this way so that NaN fails
        report = mismatch_report(out, ref, atol=limit, rtol=0.0, name=name)
        raise AssertionError(
            f"{name}: max error {err:.4g} > {factor:g} × baseline error {base:.4g} + floor {floor:.3g}"
            f" = {limit:.4g}\n{report}"
        )
