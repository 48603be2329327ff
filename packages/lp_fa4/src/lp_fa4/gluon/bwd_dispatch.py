"""Which backward kernel runs a call: the one place that decides, as ``dispatch`` does for the forward.

Today every call runs the portable Triton backward (``lp_fa4.triton.launch.bwd``); a Hopper kernel
joins here behind its own support predicate.
"""

from __future__ import annotations

from ..triton import launch


def bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb: launch.Problem,
        deterministic: bool):  # fmt: skip
    """``lp_fa4.triton.launch.bwd``'s contract: (dq, dk, dv, delta)."""
    return launch.bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, used_q, used_k, pb, deterministic)
