"""Public API: validate and canonicalise inputs, then call the ``ads_gdpa::fwd`` custom op.

O = scale · (act(Q Kᵀ) ⊙ M) · V per sequence (spec §1.1): no softmax, ``scale`` applied after the
activation. Validation never reads device memory: offsets are checked for monotonicity only when
they live on the CPU or CPU copies are given (no host sync on the hot path).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from . import _ops  # registers torch.ops.ads_gdpa.*
from .activations import Activation, activation_id
from .problem import BIG, MaskMode

__all__ = ["gdpa_varlen", "gdpa", "generalized_dot_product_attention"]

_HALF = (torch.bfloat16, torch.float16)
_FP8 = (torch.float8_e4m3fn,)
_HEAD_DIMS = {(16, 16), (32, 32), (64, 64), (96, 96), (128, 128), (192, 128)}


def _err(msg: str) -> ValueError:
    return ValueError(f"ads_gdpa: {msg}")


def _check_tensors(q, k, v, rank: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise _err(f"{name} must have {rank} dims, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise _err(f"{name} must be contiguous in its last (head) dim, got stride {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _HALF + _FP8:
        raise _err(f"dtype must be bfloat16, float16 or float8_e4m3fn (forward only), got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise _err(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    h, hk = q.shape[-2], k.shape[-2]
    if v.shape[-2] != hk or v.shape[:-2] != k.shape[:-2]:
        raise _err(f"k and v must agree in all but the last dim, got {tuple(k.shape)} and {tuple(v.shape)}")
    if hk == 0 or h % hk != 0:
        raise _err(f"query heads ({h}) must be a multiple of kv heads ({hk})")
    if q.shape[-1] != k.shape[-1]:
        raise _err(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    if (q.shape[-1], v.shape[-1]) not in _HEAD_DIMS:
        raise _err(
            f"unsupported head dims (qk={q.shape[-1]}, v={v.shape[-1]}); supported: "
            + ", ".join(f"{a}/{b}" for a, b in sorted(_HEAD_DIMS))
        )


def _host_offsets(name: str, t: torch.Tensor, cpu_copy) -> torch.Tensor | None:
    """Check an offsets tensor's metadata; return its host copy (CPU int64) when one exists.

    Host values are only read inside the op (``problem.check_offsets``), where they are real
    tensors even under torch.compile: a CPU tensor argument then stays a graph input, so new offsets
    neither break the graph nor recompile it.
    """
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < 1:
        raise _err(f"{name} must be a 1-D tensor of B+1 offsets")
    if t.dtype not in (torch.int32, torch.int64):
        raise _err(f"{name} must be int32 or int64, got {t.dtype}")
    if cpu_copy is None:
        return t.to(torch.int64) if t.device.type == "cpu" else None  # CPU offsets are host data
    if isinstance(cpu_copy, torch.Tensor):
        if cpu_copy.device.type != "cpu":
            raise _err(f"{name}_cpu must live on the CPU, got {cpu_copy.device}")
        host = cpu_copy.to(torch.int64)
    else:  # through numpy: torch.as_tensor took ~150 us for a list of 1153 ints (H200 host)
        host = torch.from_numpy(np.asarray(cpu_copy, dtype=np.int64))
    if host.dim() != 1 or host.shape[0] != t.shape[0]:
        raise _err(f"{name}_cpu has {tuple(host.shape)} entries, {name} has {t.shape[0]}")
    return host


def _mask(window_size, causal, local_window) -> tuple[MaskMode, int, int]:
    """(mode, left, right) of the band; an unbounded side is ``BIG``."""
    if window_size is not None:
        if causal or local_window is not None:
            raise _err("window_size (top-left, upstream) cannot be combined with causal/local_window")
        if int(window_size) < 0:
            raise _err(f"window_size must be >= 0, got {window_size}")
        # clamp to BIG (longer than any sequence, so the same mask): the kernels add a side to a row
        # index in int32, and a side near INT_MAX (a common "unbounded") wrapped to an empty band
        w = min(int(window_size), BIG)
        return MaskMode.TOP_LEFT, w, w
    if local_window is None and not causal:
        return MaskMode.NONE, BIG, BIG
    left, right = (None, None) if local_window is None else local_window
    left = BIG if left is None or left < 0 else min(int(left), BIG)
    right = BIG if right is None or right < 0 else min(int(right), BIG)
    if causal:
        right = min(right, 0)
    return MaskMode.BOTTOM_RIGHT, left, right


def _descale(name: str, t, heads: int, device) -> torch.Tensor:
    if t is None:
        raise _err(f"float8 inputs need {name} (fp32, shape ({heads},))")
    if not isinstance(t, torch.Tensor) or t.shape != (heads,) or t.dtype != torch.float32:
        raise _err(f"{name} must be an fp32 tensor of shape ({heads},)")
    if t.device != device:
        raise _err(f"{name} is on {t.device}, q on {device}")
    return t.contiguous()


def gdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: str | int | Activation = "fast_gelu",
    scale: float = 1.0,
    window_size: int | None = None,
    causal: bool = False,
    local_window: tuple[int | None, int | None] | None = None,
    broadcast_q: bool = False,
    activation_per_head: Sequence[str | int] | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    deterministic: bool = False,
    cu_seqlens_q_cpu: torch.Tensor | Sequence[int] | None = None,
    cu_seqlens_k_cpu: torch.Tensor | Sequence[int] | None = None,
) -> torch.Tensor:
    """Jagged GDPA. Differentiable in q, k, v (bf16/fp16).

    Args:
        q: (total_q, H, D_qk); k: (total_k, H_kv, D_qk); v: (total_k, H_kv, D_v). H % H_kv == 0.
        cu_seqlens_q, cu_seqlens_k: (B+1,) int32/int64 offsets. With ``broadcast_q`` cu_seqlens_q has
            two entries [0, total_q] and q is shared by all B kv sequences.
        max_seqlen_q: query rows i >= max_seqlen_q of a sequence are zero in the output.
        max_seqlen_k: must bound every key length.
        activation: name or ``Activation`` id; ``activation_per_head`` overrides it for heads
            0..len-1 (upstream ``ensemble_activation_list``).
        scale: multiplies act(S), after the activation (upstream ``qk_scale``).
        window_size: upstream symmetric top-left band |i - j| <= w.
        causal / local_window=(left, right): bottom-right (FlashAttention) band; None = unbounded.
        q_descale, k_descale, v_descale: fp32 (H,), (H_kv,), (H_kv,) for float8_e4m3fn inputs.
        deterministic: backward computes dQ in a second pass instead of fp32 atomics.
        cu_seqlens_q_cpu, cu_seqlens_k_cpu: host copies (CPU tensors or int sequences); enable value
            checks (non-decreasing, within q/k, lengths <= max_seqlen_k), the workload-sorted tile
            order and exact per-sequence FLOP counts without a device sync. Under torch.compile pass
            CPU tensors: they stay graph inputs, so new offsets do not recompile.

    Returns:
        (total_q, H, D_v) in q's dtype (bf16 for FP8), or (B * total_q, H, D_v) with ``broadcast_q``.
    """
    _check_tensors(q, k, v, 3)
    act = activation_id(activation)
    host_q = _host_offsets("cu_seqlens_q", cu_seqlens_q, cu_seqlens_q_cpu)
    if cu_seqlens_k is cu_seqlens_q and cu_seqlens_k_cpu is cu_seqlens_q_cpu:
        host_k = host_q  # self attention: convert and check the offsets once
    else:
        host_k = _host_offsets("cu_seqlens_k", cu_seqlens_k, cu_seqlens_k_cpu)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.device != q.device:
            raise _err(f"{name} is on {t.device}, q on {q.device}")
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        raise _err("max_seqlen_q and max_seqlen_k must be >= 0")
    if broadcast_q:
        if cu_seqlens_q.shape[0] != 2:
            raise _err("broadcast_q needs cu_seqlens_q with exactly 2 entries (one shared query sequence)")
    elif cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise _err(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries, cu_seqlens_k {cu_seqlens_k.shape[0]}")
    per_head = None
    if activation_per_head is not None:
        per_head = [activation_id(a) for a in activation_per_head]
        if len(per_head) > q.shape[1]:
            raise _err(f"activation_per_head has {len(per_head)} entries for {q.shape[1]} heads")
        per_head = per_head + [act] * (q.shape[1] - len(per_head))
        if len(set(per_head)) == 1:
            act, per_head = per_head[0], None
    mode, left, right = _mask(window_size, causal, local_window)
    descales = (None, None, None)
    if q.dtype in _FP8:
        hk = k.shape[1]
        descales = (
            _descale("q_descale", q_descale, q.shape[1], q.device),
            _descale("k_descale", k_descale, hk, q.device),
            _descale("v_descale", v_descale, hk, q.device),
        )
    # with host offsets the exact maxima are known: tighter tiles for callers that pass loose bounds
    return _ops.gdpa_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, act, per_head, float(scale),
        int(mode), left, right, bool(broadcast_q), *descales, host_q, host_k, bool(deterministic),
    )  # fmt: skip


_DENSE_CU: dict = {}


def _dense_offsets(b: int, s: int, device: torch.device) -> torch.Tensor:
    """Offsets [0, s, 2s, ..., b·s] on ``device``, cached per shape: the same object for q and k when
    Sq = Sk (``gdpa_varlen`` then converts and checks them once)."""
    key = (b, s, str(device))
    t = _DENSE_CU.get(key)
    if t is None:
        # arange(b + 1) * s, not arange(0, (b + 1) * s, s): a zero step raised for s = 0 (empty Sq or Sk)
        t = _DENSE_CU[key] = torch.arange(b + 1, dtype=torch.int32, device=device) * s
    return t


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """Dense GDPA. q (B, Sq, H, D_qk), k (B, Sk, H_kv, D_qk), v (B, Sk, H_kv, D_v) -> (B, Sq, H, D_v).

    Keyword arguments as in :func:`gdpa_varlen` (except offsets, max lengths and broadcast_q).
    """
    _check_tensors(q, k, v, 4)
    if q.shape[0] != k.shape[0]:
        raise _err(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
    if "broadcast_q" in kwargs:
        raise _err("broadcast_q is a jagged-layout option; use gdpa_varlen")
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    host_q = [i * sq for i in range(b + 1)]
    host_k = host_q if sk == sq else [i * sk for i in range(b + 1)]
    out = gdpa_varlen(
        q.reshape(b * sq, h, q.shape[-1]), k.reshape(b * sk, k.shape[2], k.shape[3]),
        v.reshape(b * sk, v.shape[2], v.shape[3]),
        _dense_offsets(b, sq, q.device), _dense_offsets(b, sk, q.device), sq, sk,
        cu_seqlens_q_cpu=host_q, cu_seqlens_k_cpu=host_k, **kwargs,
    )  # fmt: skip
    return out.view(b, sq, h, v.shape[-1])


def generalized_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_offset: torch.Tensor,
    key_offset: torch.Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    qk_scale: float | None = None,
    activation: str | int = "raw",
    window_size: int | None = None,
    output_offset: torch.Tensor | None = None,
    broadcast_q: bool = False,
    ensemble_activation_list: Sequence[int] | None = None,
) -> torch.Tensor:
    """Drop-in for the upstream Triton ``generalized_dot_product_attention`` (same argument order).

    ``qk_scale`` defaults to 1.0 and multiplies after the activation, as upstream. ``output_offset``
    is accepted for signature compatibility: output rows follow ``query_offset`` (or b * Lq for
    ``broadcast_q``), which is what upstream callers pass.
    """
    return gdpa_varlen(
        query, key, value, query_offset, key_offset, max_seq_len_q, max_seq_len_kv,
        activation=activation, scale=1.0 if qk_scale is None else float(qk_scale), window_size=window_size,
        broadcast_q=broadcast_q, activation_per_head=ensemble_activation_list,
    )  # fmt: skip
