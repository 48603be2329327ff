"""GDPA activations: the append-only enum (upstream ids) and eager PyTorch f / f'.

The eager functions serve the naive benchmark provider and documentation; the tests compare
the kernels against ``ads_kernel_tools.reference.gdpa`` instead.
"""

from __future__ import annotations

import enum
import math
import struct

import torch

__all__ = ["Activation", "activation_id", "activation_name", "act_torch", "act_grad_torch"]


class Activation(enum.IntEnum):
    """Upstream enum ids; append-only so ``ensemble_activation_list`` ids stay valid."""

    RAW = 0
    GELU = 1
    GELU_APPROX = 2
    FAST_GELU = 3
    LEAKY_RELU = 4
    RELU = 5
    FAST_GELU_BF16 = 6
    SILU = 7
    FAST_SILU = 8
    HARDSWISH = 9
    RELU_SQUARE = 10
    FAST_GELU_TAYLOR_APPROX = 11


_NAMES = {a.name.lower(): int(a) for a in Activation}

# Maclaurin coefficients of the erf-GELU (spec §1.4), used by FAST_GELU_TAYLOR_APPROX.
TAYLOR_C2 = 0.3989422804
TAYLOR_C4 = -0.0664903801
TAYLOR_C6 = 0.0099735570
BETA = 0.7978845608  # sqrt(2/pi)

# tanh-GELU (fast_gelu) in the kernels: tanh(x(β + βc·x²)), its derivative's β + 3βc·x²
GELU_B = 0.7978845608028654  # β = sqrt(2/pi)
GELU_BC = 0.035677408136300125  # βc, c = 0.044715
GELU_DBC = 0.10703222440890289  # 3βc


# act(x) = DEFERRED_GAIN[act] · act_deferred(x) for the activations that have a cheaper form without
# the scale: a forward that multiplies its output tile by scale · gain instead of every score by the
# scale saves one multiply per score. fast_gelu only: silu's form without the scale (x / (1 + e))
# measured slower on the H200 than with it (BENCHMARKS.md, experiment log).
DEFERRED_GAIN = {int(Activation.FAST_GELU): 0.5}


def bf16x2_word(x: float) -> str:
    """``x`` rounded to bf16 (nearest, ties to even) in both halves of a 32-bit word, as the hex
    literal a packed-bf16x2 PTX constant takes (e.g. 1.0 -> "0x3F803F80")."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    half = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return f"0x{half:04X}{half:04X}"


def activation_id(act: str | int | Activation) -> int:
    """Map a name (case-insensitive), an int id or an ``Activation`` to its int id.

    Raises:
        ValueError: unknown name or id out of range.
    """
    if isinstance(act, bool):
        raise ValueError(f"unknown GDPA activation {act!r}")
    if isinstance(act, int):
        if 0 <= int(act) < len(Activation):
            return int(act)
        raise ValueError(f"unknown GDPA activation id {act}; valid ids are 0..{len(Activation) - 1}")
    if isinstance(act, str) and act.lower() in _NAMES:
        return _NAMES[act.lower()]
    raise ValueError(f"unknown GDPA activation {act!r}; valid names: {', '.join(_NAMES)}")


def activation_name(act: str | int | Activation) -> str:
    """Canonical lower-case name of an activation."""
    return Activation(activation_id(act)).name.lower()


def act_torch(act: str | int, x: torch.Tensor) -> torch.Tensor:
    """f(x) in the precision of ``x`` (fast_* variants use the exact functions)."""
    a = activation_id(act)
    if a == Activation.RAW:
        return x
    if a == Activation.GELU:
        return torch.nn.functional.gelu(x)
    if a in (Activation.GELU_APPROX, Activation.FAST_GELU, Activation.FAST_GELU_BF16):
        return torch.nn.functional.gelu(x, approximate="tanh")
    if a == Activation.LEAKY_RELU:
        return torch.nn.functional.leaky_relu(x, 0.01)
    if a == Activation.RELU:
        return torch.relu(x)
    if a in (Activation.SILU, Activation.FAST_SILU):
        return torch.nn.functional.silu(x)
    if a == Activation.HARDSWISH:
        return torch.nn.functional.hardswish(x)
    if a == Activation.RELU_SQUARE:
        return torch.relu(x).square()
    x2 = x * x
    return 0.5 * x + x2 * (TAYLOR_C2 + x2 * (TAYLOR_C4 + x2 * TAYLOR_C6))


def act_grad_torch(act: str | int, x: torch.Tensor) -> torch.Tensor:
    """f'(x) as in spec §1.4 (relu' is 1 at 0)."""
    a = activation_id(act)
    if a == Activation.RAW:
        return torch.ones_like(x)
    if a == Activation.GELU:
        return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) * 0.3989422804
    if a in (Activation.GELU_APPROX, Activation.FAST_GELU, Activation.FAST_GELU_BF16):
        t = torch.tanh(BETA * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * (BETA + 0.1070322243 * x * x)
    if a == Activation.LEAKY_RELU:
        return torch.where(x >= 0, 1.0, 0.01).to(x.dtype)
    if a == Activation.RELU:
        return (x >= 0).to(x.dtype)
    if a in (Activation.SILU, Activation.FAST_SILU):
        s = torch.sigmoid(x)
        return s * (1 + x * (1 - s))
    if a == Activation.HARDSWISH:
        return torch.where(x <= -3, 0.0, torch.where(x >= 3, 1.0, x / 3 + 0.5)).to(x.dtype)
    if a == Activation.RELU_SQUARE:
        return torch.where(x >= 0, 2 * x, 0.0).to(x.dtype)
    return 0.5 + x * (2 * TAYLOR_C2 + x * x * (4 * TAYLOR_C4 + x * x * 6 * TAYLOR_C6))
