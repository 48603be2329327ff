"""Reference GDPA (generalized dot product attention): ``O = scale * (act(Q Kᵀ) ⊙ M) V``.

No softmax, no normalisation. Everything here is plain PyTorch, slow and readable, and is meant to be
the ground truth that kernels are tested against (forward values, and gradients through autograd).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ads_kernel_tools.reference._jagged import sequence_ranges, with_graph

__all__ = [
    "ACTIVATIONS",
    "activation_grad_ref",
    "activation_id",
    "activation_name",
    "activation_ref",
    "gdpa_dense_ref",
    "gdpa_mask",
    "gdpa_ref",
]

# Upstream enum order; append-only, because `activation_per_head` lists carry these ids.
ACTIVATIONS: tuple[str, ...] = (
    "raw",
    "gelu",
    "gelu_approx",
    "fast_gelu",
    "leaky_relu",
    "relu",
    "fast_gelu_bf16",
    "silu",
    "fast_silu",
    "hardswish",
    "relu_square",
    "fast_gelu_taylor_approx",
)

_BETA = math.sqrt(2.0 / math.pi)  # 0.7978845608
_GELU_TANH_C = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # 0.3989422804
_LEAKY_SLOPE = 0.01
# erf-GELU Maclaurin coefficients: x*Phi(x) = x/2 + (x^2 - x^4/6 + x^6/40) / sqrt(2*pi) + O(x^8).
_TAYLOR_C2 = 0.3989422804
_TAYLOR_C4 = -0.0664903801
_TAYLOR_C6 = 0.0099735570

ActivationLike = str | int


def activation_id(name_or_id: ActivationLike) -> int:
    """Enum id of an activation given by name or id; ValueError if unknown."""
    is_int = isinstance(name_or_id, int) and not isinstance(name_or_id, bool)
    if is_int and 0 <= name_or_id < len(ACTIVATIONS):
        return name_or_id
    if isinstance(name_or_id, str) and name_or_id in ACTIVATIONS:
        return ACTIVATIONS.index(name_or_id)
    raise ValueError(
        f"unknown activation {name_or_id!r}: expected one of {', '.join(ACTIVATIONS)} "
        f"or an id in 0..{len(ACTIVATIONS) - 1}"
    )


def activation_name(name_or_id: ActivationLike) -> str:
    """Canonical name of an activation given by name or id; ValueError if unknown."""
    return ACTIVATIONS[activation_id(name_or_id)]


def _gelu_tanh_t(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(_BETA * (x + _GELU_TANH_C * x * x * x))


def activation_ref(name: ActivationLike, x: torch.Tensor) -> torch.Tensor:
    """act(x) in the dtype of ``x`` (pass fp32 or fp64), following spec §1.4.

    The ``fast_*`` variants are references for approximate hardware paths, so they use the exact math of
    their base: fast_gelu and fast_gelu_bf16 -> tanh GELU, fast_silu -> silu.

    ``fast_gelu_taylor_approx`` is the erf-GELU Maclaurin polynomial
    ``g(x) = 0.5x + c2 x^2 + c4 x^4 + c6 x^6``; it is accurate only for |x| <~ 1.5 and diverges quickly
    beyond, so it is an opt-in kernel trick, not a GELU substitute for arbitrary inputs.

    Piecewise activations are written with ``torch.where`` so that autograd through this function gives
    the spec's derivative conventions at the kinks (relu'(0) = leaky'(0) = 1, hardswish'(-3) = 0,
    hardswish'(3) = 1); the GDPA backward reference relies on that.
    """
    a = activation_name(name)
    if a == "raw":
        return x
    if a == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x * _INV_SQRT_2))
    if a in ("gelu_approx", "fast_gelu", "fast_gelu_bf16"):
        return 0.5 * x * (1.0 + _gelu_tanh_t(x))
    if a == "leaky_relu":
        return torch.where(x >= 0, x, _LEAKY_SLOPE * x)
    if a == "relu":
        return torch.where(x >= 0, x, torch.zeros_like(x))
    if a in ("silu", "fast_silu"):
        return x * torch.sigmoid(x)
    if a == "hardswish":
        middle = x * (x + 3.0) / 6.0
        return torch.where(x <= -3.0, torch.zeros_like(x), torch.where(x >= 3.0, x, middle))
    if a == "relu_square":
        return torch.where(x >= 0, x * x, torch.zeros_like(x))
    if a == "fast_gelu_taylor_approx":
        x2 = x * x
        return 0.5 * x + x2 * (_TAYLOR_C2 + x2 * (_TAYLOR_C4 + x2 * _TAYLOR_C6))
    raise AssertionError(f"activation {a} not handled")  # pragma: no cover - table and code out of sync


def activation_grad_ref(name: ActivationLike, x: torch.Tensor) -> torch.Tensor:
    """act'(x) in the dtype of ``x`` by the closed-form formulas of spec §1.4 (what a kernel evaluates).

    Equals autograd of :func:`activation_ref` everywhere, including the kink conventions.
    """
    a = activation_name(name)
    if a == "raw":
        return torch.ones_like(x)
    if a == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(x * _INV_SQRT_2))
        pdf = torch.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return cdf + x * pdf
    if a in ("gelu_approx", "fast_gelu", "fast_gelu_bf16"):
        t = _gelu_tanh_t(x)
        # 3 * 0.044715 * beta = 0.1070322243: d/dx of the tanh argument beyond beta.
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_BETA + 3.0 * _GELU_TANH_C * _BETA * x * x)
    if a == "leaky_relu":
        return torch.where(x >= 0, torch.ones_like(x), torch.full_like(x, _LEAKY_SLOPE))
    if a == "relu":
        return (x >= 0).to(x.dtype)
    if a in ("silu", "fast_silu"):
        s = torch.sigmoid(x)
        return s * (1.0 + x * (1.0 - s))
    if a == "hardswish":
        inner = x / 3.0 + 0.5
        return torch.where(x <= -3.0, torch.zeros_like(x), torch.where(x >= 3.0, torch.ones_like(x), inner))
    if a == "relu_square":
        return torch.where(x >= 0, 2.0 * x, torch.zeros_like(x))
    if a == "fast_gelu_taylor_approx":
        x2 = x * x
        return 0.5 + x * (2.0 * _TAYLOR_C2 + x2 * (4.0 * _TAYLOR_C4 + x2 * 6.0 * _TAYLOR_C6))
    raise AssertionError(f"activation {a} not handled")  # pragma: no cover


def gdpa_mask(
    lq: int,
    lk: int,
    *,
    window_size: int | None = None,
    causal: bool = False,
    local_window: tuple[int | None, int | None] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean (lq, lk) mask of allowed (query i, key j) pairs for one sequence.

    ``window_size=w``: symmetric band |i - j| <= w on top-left (local) indices (upstream Triton).
    ``causal``: bottom-right, j <= i + (lk - lq) (FlashAttention convention).
    ``local_window=(left, right)``: bottom-right band i + (lk - lq) - left <= j <= i + (lk - lq) + right,
    None meaning unbounded on that side. All given masks are intersected.
    """
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if window_size is not None:
        if window_size < 0:
            raise ValueError(f"window_size must be >= 0, got {window_size}")
        allowed &= (i - j).abs() <= window_size
    diag = i + (lk - lq)  # key index aligned with query i when the ends of q and k are aligned
    if causal:
        allowed &= j <= diag
    if local_window is not None:
        left, right = local_window
        if left is not None:
            allowed &= j >= diag - left
        if right is not None:
            allowed &= j <= diag + right
    return allowed


def _per_head_activations(
    activation: ActivationLike, activation_per_head: Sequence[ActivationLike] | None, num_heads: int
) -> list[int]:
    default = activation_id(activation)
    ids = [default] * num_heads
    for h, act in enumerate(list(activation_per_head or [])[:num_heads]):
        ids[h] = activation_id(act)
    return ids


def _apply_activation(s: torch.Tensor, head_ids: list[int]) -> torch.Tensor:
    """act over s (H, Lq, Lk), possibly a different activation per head."""
    if len(set(head_ids)) == 1:
        return activation_ref(head_ids[0], s)
    return torch.stack([activation_ref(a, s[h]) for h, a in enumerate(head_ids)])


def gdpa_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | Sequence[int],
    cu_seqlens_k: torch.Tensor | Sequence[int],
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: ActivationLike,
    scale: float = 1.0,
    window_size: int | None = None,
    causal: bool = False,
    local_window: tuple[int | None, int | None] | None = None,
    broadcast_q: bool = False,
    activation_per_head: Sequence[ActivationLike] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Jagged GDPA reference: q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv, Dv).

    Per sequence b: ``S = q_b k_bᵀ``, ``P = scale * act(S) * M``, ``O = P v_b``; masks zero P (never -inf,
    since GELU(-inf) is NaN). Returns (total_q, H, Dv) in ``dtype``, or (B * Lq, H, Dv) with
    ``broadcast_q`` (q is one sequence shared by all B kv sequences; cu_seqlens_q has 2 entries).

    * Query rows i >= min(Lq_b, max_seqlen_q) are ZERO here; kernels do not write them at all, so compare
      only valid rows. ``max_seqlen_k`` is accepted for API symmetry; Lk is not clamped (upstream).
    * ``causal`` / ``local_window`` offsets use the unclamped Lq_b (see :func:`gdpa_mask`).
    * GQA: head h reads kv head h // (H // H_kv).
    * ``activation_per_head``: head h < len(list) uses list[h], the other heads use ``activation``.
    * ``dtype`` fp32/fp64: exact math in that precision. ``dtype`` bf16/fp16 gives the same-precision
      baseline that mimics a kernel: inputs rounded to ``dtype``, S accumulated in fp32, act in fp32,
      P rounded to ``dtype`` before the PV GEMM (fp32 accumulation), output rounded to ``dtype``.

    Differentiable: torch.autograd gives dq, dk, dv, with dS masked as in the kernels.
    """
    del max_seqlen_k
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be (tokens, heads, dim)")
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads != 0 or v.shape[1] != num_kv_heads:
        raise ValueError(f"bad head counts: q {num_heads}, k {num_kv_heads}, v {v.shape[1]}")
    group = num_heads // num_kv_heads

    low_precision = dtype in (torch.bfloat16, torch.float16)
    compute = torch.float32 if low_precision else dtype
    # Low precision: the kernel reads inputs in `dtype`; products of those are exact in fp32.
    qc, kc, vc = ((t.to(dtype).to(compute) if low_precision else t.to(compute)) for t in (q, k, v))

    ranges = sequence_ranges(cu_seqlens_q, cu_seqlens_k, q.shape[0], broadcast_q)

    head_ids = _per_head_activations(activation, activation_per_head, num_heads)
    out = torch.zeros(ranges.total_out, num_heads, v.shape[2], dtype=dtype, device=q.device)
    for (q_start, q_end), (k_start, k_end), out_start in zip(ranges.q, ranges.k, ranges.out_starts):
        lq, lk = q_end - q_start, k_end - k_start
        rows = min(lq, max_seqlen_q)
        if rows <= 0:
            continue
        qb = qc[q_start : q_start + rows].transpose(0, 1)  # (H, rows, D)
        kb = kc[k_start:k_end].repeat_interleave(group, dim=1).transpose(0, 1)  # (H, Lk, D)
        vb = vc[k_start:k_end].repeat_interleave(group, dim=1).transpose(0, 1)  # (H, Lk, Dv)
        s = qb @ kb.transpose(1, 2)
        mask = gdpa_mask(
            lq, lk, window_size=window_size, causal=causal, local_window=local_window, device=q.device
        )[:rows]
        p = scale * _apply_activation(s, head_ids) * mask.to(compute)
        if low_precision:
            p = p.to(dtype).to(compute)
        ob = (p @ vb).transpose(0, 1)  # (rows, H, Dv)
        out[out_start : out_start + rows] = ob.to(dtype)
    return with_graph(out, q, k, v)


def gdpa_dense_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    activation: ActivationLike,
    scale: float = 1.0,
    window_size: int | None = None,
    causal: bool = False,
    local_window: tuple[int | None, int | None] | None = None,
    broadcast_q: bool = False,
    activation_per_head: Sequence[ActivationLike] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dense GDPA reference: q (B, Sq, H, D) (B = 1 with ``broadcast_q``), k/v (B, Sk, H_kv, D/Dv).

    Returns (B, Sq, H, Dv) in ``dtype``; same semantics as :func:`gdpa_ref` with all lengths full.
    """
    batch, sk = k.shape[0], k.shape[1]
    q_batch, sq = q.shape[0], q.shape[1]
    if broadcast_q and q_batch != 1:
        raise ValueError(f"broadcast_q needs q with batch 1, got {q_batch}")
    if not broadcast_q and q_batch != batch:
        raise ValueError(f"q batch {q_batch} != k batch {batch}")
    cu_q = [b * sq for b in range(q_batch + 1)]
    cu_k = [b * sk for b in range(batch + 1)]
    out = gdpa_ref(
        q.reshape(q_batch * sq, *q.shape[2:]),
        k.reshape(batch * sk, *k.shape[2:]),
        v.reshape(batch * sk, *v.shape[2:]),
        cu_q,
        cu_k,
        sq,
        sk,
        activation=activation,
        scale=scale,
        window_size=window_size,
        causal=causal,
        local_window=local_window,
        broadcast_q=broadcast_q,
        activation_per_head=activation_per_head,
        dtype=dtype,
    )
    return out.reshape(batch, sq, q.shape[2], v.shape[3])
