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


def test_bf16x2_word_rounds_as_torch_does():
    """The packed kernels' PTX constants: each value rounded to bf16 as torch rounds it (nearest,
    ties to even), in both halves of the word."""
    from ads_gdpa.activations import GELU_B, GELU_BC, GELU_DBC, bf16x2_word

    # 1 + 2^-8 is a tie between two bf16 neighbours; 1 + 3·2^-8 rounds up to the even one
    for x in (GELU_B, GELU_BC, GELU_DBC, 0.5, 1.0, -2.75, 1 + 2**-8, 1 + 3 * 2**-8, 1e-30):
        half = torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
        assert bf16x2_word(x) == f"0x{half:04X}{half:04X}", x
