"""Host-side grid arithmetic for the launchers.

``triton.cdiv`` is a ``constexpr_function`` since Triton 3.6: called from host code it unwraps its
arguments through Triton's constexpr machinery, about 5 µs a call on the development CPU against
0.06 µs for the integer expression. The launchers call it several times per op, on the host path that
bounds small calls and training steps, so they use this one.
"""

from __future__ import annotations

__all__ = ["cdiv"]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a >= 0, b > 0 (tile counts, grid sizes); plain Python ints."""
    return -(-a // b)
