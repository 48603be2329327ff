"""Bad inputs raise ValueError naming the problem, before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _cases import DEVICE

from ads_norm_fusion import (
    linear_layernorm,
    linear_layernorm_input_grad,
    linear_rmsnorm,
    linear_rmsnorm_input_grad,
    rmsnorm_linear,
)


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


BAD = {
    "fp32": (
        lambda: linear_layernorm(_t(4, 32, dtype=torch.float32), _t(16, 32, dtype=torch.float32)),
        "dtype",
    ),
    "mixed dtypes": (lambda: linear_rmsnorm(_t(4, 32), _t(16, 32, dtype=torch.float16)), "w is"),
    "K not /16": (lambda: linear_layernorm(_t(4, 24), _t(16, 24)), "K=24"),
    "N not /16": (lambda: linear_rmsnorm(_t(4, 32), _t(40, 32)), "N=40"),
    "K mismatch": (lambda: linear_layernorm(_t(4, 32), _t(16, 48)), "features"),
    "w 1-D": (lambda: linear_layernorm(_t(4, 32), _t(32)), "(N, K)"),
    "bias shape": (lambda: linear_layernorm(_t(4, 32), _t(16, 32), bias=_t(32)), "bias"),
    "norm weight shape": (lambda: linear_rmsnorm(_t(4, 32), _t(16, 32), norm_weight=_t(17)), "norm_weight"),
    "norm bias dtype": (
        lambda: linear_layernorm(_t(4, 32), _t(16, 32), norm_bias=_t(16, dtype=torch.float16)),
        "norm_bias",
    ),
    "negative eps": (lambda: linear_layernorm(_t(4, 32), _t(16, 32), eps=-1.0), "eps"),
    "infinite eps": (lambda: linear_layernorm(_t(4, 32), _t(16, 32), eps=float("inf")), "finite"),
    "NaN eps": (lambda: linear_rmsnorm(_t(4, 32), _t(16, 32), eps=float("nan")), "eps must be a finite"),
    "string eps": (lambda: rmsnorm_linear(_t(4, 32), None, _t(16, 32), eps="1e-6"), "got str '1e-6'"),
    "bool eps": (lambda: linear_layernorm(_t(4, 32), _t(16, 32), eps=True), "got bool True"),
    "rmsnorm_linear weight over N": (lambda: rmsnorm_linear(_t(4, 32), _t(16), _t(16, 32)), "norm_weight"),
    "not a tensor": (lambda: linear_rmsnorm([[1.0]], _t(16, 32)), "tensor"),
    "input grad K": (
        lambda: linear_rmsnorm_input_grad(_t(4, 32), _t(48, 16), _t(4, 16), torch.ones(4, device=DEVICE)),
        "rows",
    ),
    "input grad x_hat": (
        lambda: linear_layernorm_input_grad(_t(4, 32), _t(32, 16), _t(4, 32), torch.ones(4, device=DEVICE)),
        "x_hat",
    ),
    "input grad rstd dtype": (
        lambda: linear_layernorm_input_grad(_t(4, 32), _t(32, 16), _t(4, 16), _t(4)),
        "rstd",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name: str) -> None:
    fn, words = BAD[name]
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        fn()


def test_numpy_eps_taken_like_a_float() -> None:
    """A numpy.float32 eps gives what the same float gives (2**-16: exact in both)."""
    x, w = _t(4, 32), _t(16, 32)
    for fn in (linear_layernorm, linear_rmsnorm):
        assert torch.equal(fn(x, w, eps=np.float32(2.0**-16)), fn(x, w, eps=2.0**-16))
