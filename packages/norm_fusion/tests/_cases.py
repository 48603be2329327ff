"""Inputs, fp32 references (ads_kernel_tools.reference.norm) and same-precision PyTorch baselines.

The baseline is what a user gets unfused at the input precision: ``F.linear`` then ``F.layer_norm`` /
``F.rms_norm`` in bf16/fp16 (z rounded in between); the reference runs the same math in fp32 on the
same (rounded) inputs. Gradients of both come from autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ads_kernel_tools.reference.norm import layer_norm_ref, rms_norm_gemm_ref, rms_norm_ref
from ads_kernel_tools.testing import device_for_tests, randn
from ads_kernel_tools.tolerance import assert_close_vs_baseline

DEVICE = device_for_tests()


@dataclass(frozen=True)
class Case:
    m: int
    k: int
    n: int
    dtype: torch.dtype = torch.bfloat16
    bias: bool = True
    affine: bool = True
    norm_bias: bool = True

    def __str__(self) -> str:
        flags = "".join(c for c, on in (("b", self.bias), ("g", self.affine), ("B", self.norm_bias)) if on)
        return f"{self.m}x{self.k}x{self.n}-{str(self.dtype)[6:]}-{flags or 'plain'}"


def inputs(case: Case, *, norm_over: str = "n", seed: int = 0) -> dict[str, torch.Tensor | None]:
    """x (M, K), w (N, K) at nn.Linear-like scale, bias, norm weight/bias over N (or K), dy (M, N)."""
    dt, dev = case.dtype, DEVICE
    width = case.n if norm_over == "n" else case.k
    return {
        "x": randn((case.m, case.k), dtype=dt, device=dev, seed=seed),
        "w": randn((case.n, case.k), dtype=dt, device=dev, seed=seed + 1, scale=case.k**-0.5),
        "bias": randn((case.n,), dtype=dt, device=dev, seed=seed + 2) if case.bias else None,
        "gamma": (1 + 0.5 * randn((width,), seed=seed + 3)).to(dt).to(dev) if case.affine else None,
        "beta": randn((width,), dtype=dt, device=dev, seed=seed + 4) if case.norm_bias else None,
        "dy": randn((case.m, case.n), dtype=dt, device=dev, seed=seed + 5),
    }


def _wide(t, dtype):
    return None if t is None else t.detach().to(dtype).requires_grad_()


def _leaves(d: dict, names, dtype):
    return {k: _wide(d[k], dtype) for k in names}


def linear_norm_torch(kind: str, t: dict, dtype: torch.dtype, eps: float):
    """The unfused computation in ``dtype``: fp32 for the reference (tools' norm refs), else torch's."""
    z = F.linear(t["x"], t["w"], t["bias"])
    if dtype == torch.float32:
        if kind == "ln":
            return layer_norm_ref(z, t["gamma"], t["beta"], eps)
        return rms_norm_ref(z, t["gamma"], eps)
    if kind == "ln":
        return F.layer_norm(z, (z.shape[-1],), t["gamma"], t["beta"], eps)
    return F.rms_norm(z, (z.shape[-1],), t["gamma"], eps)


def rmsnorm_linear_torch(t: dict, dtype: torch.dtype, eps: float):
    if dtype == torch.float32:
        y = rms_norm_gemm_ref(t["x"], t["w"].t(), t["gamma"], eps)
    else:
        y = F.linear(F.rms_norm(t["x"], (t["x"].shape[-1],), t["gamma"], eps), t["w"])
    return y if t["bias"] is None else y + t["bias"]


def ref_and_baseline(fn, d: dict, names, dtype: torch.dtype, grads: bool):
    """(out, grads) of ``fn`` at fp32 and at ``dtype`` on the same inputs."""
    res = []
    for dt in (torch.float32, dtype):
        t = _leaves(d, ("x", "w", "bias", "gamma", "beta"), dt)
        y = fn(t, dt)
        g = {}
        if grads:
            leaves = [n for n in names if t[n] is not None]
            vals = torch.autograd.grad(y, [t[n] for n in leaves], d["dy"].to(dt))
            g = dict(zip(leaves, vals))
        res.append((y.detach(), g))
    return res


def check(out, ref, baseline, name: str) -> None:
    assert out.dtype == baseline.dtype, f"{name}: dtype {out.dtype}, expected {baseline.dtype}"
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert_close_vs_baseline(out, ref, baseline, name=name)
