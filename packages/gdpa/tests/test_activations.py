"""Eager activations (used by the naive benchmark provider) vs the tools reference, f and f'."""

import pytest
import torch

from ads_gdpa.activations import Activation, act_grad_torch, act_torch, activation_id, activation_name
from ads_kernel_tools.reference.gdpa import ACTIVATIONS, activation_grad_ref, activation_ref


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_eager_matches_reference(name):
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    if name == "fast_gelu_taylor_approx":
        x = torch.linspace(-1.5, 1.5, 301, dtype=torch.float64)
    torch.testing.assert_close(act_torch(name, x), activation_ref(name, x), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(act_grad_torch(name, x), activation_grad_ref(name, x), atol=1e-6, rtol=1e-6)


def test_ids_and_names():
    assert activation_id("FAST_GELU") == 3 == activation_id(Activation.FAST_GELU) == activation_id(3)
    assert activation_name(11) == "fast_gelu_taylor_approx"
    with pytest.raises(ValueError):
        activation_id(True)
