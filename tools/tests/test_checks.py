"""checks.real / checks.integer: what each takes, what it refuses, and the message."""

from __future__ import annotations

import fractions
import math

import numpy as np
import pytest
import torch

from ads_kernel_tools import checks


@pytest.mark.parametrize(
    "value,want",
    [
        (0.125, 0.125),
        (-2.5, -2.5),
        (3, 3.0),
        (np.float32(0.125), 0.125),
        (np.float64(-1.5), -1.5),
        (np.float16(2.0), 2.0),
        (np.int64(4), 4.0),
        (fractions.Fraction(1, 4), 0.25),
    ],
)
def test_real_accepts_real_numbers(value, want):
    got = checks.real("scale", value)
    assert type(got) is float and got == want


@pytest.mark.parametrize(
    "value,shown",
    [
        (True, "bool True"),
        (np.bool_(False), "bool"),
        ("0.5", "str '0.5'"),
        (b"1", "bytes b'1'"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (-math.inf, "-inf"),
        (np.float32("nan"), "nan"),
        (np.float64("inf"), "inf"),
        (10**400, "1000"),  # finite as an int, not as a float
        (1 + 2j, "(1+2j)"),
        (torch.tensor(0.5), "Tensor"),
        (None, "None"),
    ],
)
def test_real_refuses(value, shown):
    with pytest.raises(ValueError, match=r"^pkg: scale must be a finite real number, got ") as e:
        checks.real("scale", value, prefix="pkg: ")
    assert shown in str(e.value)


def test_real_none_and_minimum():
    assert checks.real("softmax_scale", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"^p: softmax_scale must be None or a finite real number, got nan$"):
        checks.real("softmax_scale", float("nan"), prefix="p: ", allow_none=True)
    assert checks.real("eps", 0.0, minimum=0) == 0.0
    with pytest.raises(ValueError, match=r"^eps must be a finite real number >= 0, got -1e-06$"):
        checks.real("eps", -1e-6, minimum=0)
    assert checks.real("eps", np.float32(1e-5), exclusive_minimum=0) == pytest.approx(1e-5)
    with pytest.raises(ValueError, match=r"eps must be a finite real number > 0, got 0.0$"):
        checks.real("eps", 0.0, exclusive_minimum=0)
    with pytest.raises(ValueError, match=r"softcap must be None or a finite real number >= 0, got inf$"):
        checks.real("softcap", math.inf, minimum=0, allow_none=True)


@pytest.mark.parametrize("value", [0, 7, -3, np.int64(7), np.int32(-3), np.uint8(200), 2**40])
def test_integer_accepts_integers(value):
    got = checks.integer("max_seqlen", value)
    assert type(got) is int and got == int(value)


@pytest.mark.parametrize(
    "value,shown",
    [
        (True, "bool True"),
        (np.bool_(True), "bool"),
        ("12", "str '12'"),
        (b"12", "bytes"),
        (12.7, "12.7"),
        (12.0, "12.0"),  # refused, not truncated: a float here is a caller's bug
        (np.float32(3.0), "3.0"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (torch.tensor(3), "Tensor"),
        (None, "None"),
    ],
)
def test_integer_refuses(value, shown):
    with pytest.raises(ValueError, match=r"^pkg: window_size must be an integer, got ") as e:
        checks.integer("window_size", value, prefix="pkg: ")
    assert shown in str(e.value)


def test_integer_none_and_minimum():
    assert checks.integer("max_seqlen_q", None, allow_none=True) is None
    assert checks.integer("max_seqlen_q", 0, minimum=0) == 0
    assert checks.integer("num_heads", np.int64(2), minimum=1) == 2
    with pytest.raises(ValueError, match=r"^p: max_seqlen_q must be None or an integer >= 0, got -1$"):
        checks.integer("max_seqlen_q", -1, prefix="p: ", minimum=0, allow_none=True)
    with pytest.raises(ValueError, match=r"num_heads must be an integer >= 1, got 0$"):
        checks.integer("num_heads", 0, minimum=1)


def test_integer_symint_passes_through():
    """A length traced symbolically stays symbolic (int() would specialise it)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    seen = []

    def f(x):
        n = x.shape[0]
        seen.append((n, checks.integer("max_seq_len", n, minimum=0)))
        return x * 2

    make_fx(f, tracing_mode="symbolic")(torch.zeros(5))
    n, got = seen[0]
    assert isinstance(n, torch.SymInt) and got is n


def test_nonnegative_values():
    ok = torch.tensor([[0.0, 0.5], [2.0, 1.0]])
    checks.nonnegative_values({"q_descale": ok, "k_descale": None, "v_descale": ok[:0]}, device=False)
    for bad in (-0.5, float("nan"), float("inf")):
        t = ok.clone()
        t[1, 0] = bad
        with pytest.raises(ValueError, match=r"^p: k_descale must be finite and >= 0, got "):
            checks.nonnegative_values({"q_descale": ok, "k_descale": t}, prefix="p: ", device=False)
    meta = torch.full((2,), -1.0, device="meta")  # no data to read: skipped, not an error
    checks.nonnegative_values({"q_descale": meta}, device=True)


def test_index_vector_returns_contiguous_entries() -> None:
    """A strided view comes back as a contiguous copy of the same entries (a kernel reading by
    position then reads the right ones); a contiguous vector comes back as itself."""
    table = torch.arange(12, dtype=torch.int32).reshape(4, 3)
    column = table[:, 1]
    got = checks.index_vector("cu_seqlens_q", column, length=4, device=column.device)
    assert got.is_contiguous() and got.tolist() == [1, 4, 7, 10]
    flat = torch.arange(5, dtype=torch.int64)
    assert checks.index_vector("offsets", flat) is flat


@pytest.mark.parametrize(
    "t, kw, match",
    [
        (torch.zeros(3), {}, "1-D int32 or int64 tensor, got torch.float32"),
        (torch.zeros(2, 2, dtype=torch.int32), {}, r"got torch.int32 \(2, 2\)"),
        ([0, 1], {}, "got list"),
        (torch.zeros(3, dtype=torch.int32), {"length": 4}, "must have 4 entries, got 3"),
        (torch.zeros(3, dtype=torch.int32), {"device": torch.device("meta")}, "is on cpu, q on meta"),
    ],
)
def test_index_vector_refuses(t, kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        checks.index_vector("cu", t, prefix="pkg: ", **kw)
