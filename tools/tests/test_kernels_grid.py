"""``kernels.grid.cdiv``: the host-side ceiling division agrees with Triton's and is exact."""

from __future__ import annotations

import pytest

from ads_kernel_tools.kernels.grid import cdiv

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("b", [1, 2, 3, 16, 64, 128, 1000])
def test_cdiv_matches_triton_and_is_exact(b: int) -> None:
    for a in [0, 1, b - 1, b, b + 1, 2 * b, 7 * b + 3, 2**31 + 5, 2**40 + b - 1]:
        got = cdiv(a, b)
        assert type(got) is int and got == triton.cdiv(a, b)
        assert got * b >= a > (got - 1) * b
