"""Public API: ``jagged_flash_attention``, the upstream (TLX JFA) signature plus our options.

Validation and semantics live here; the kernels are lp-fa4's softmax engine
(``lp_fa4.jagged_attention``, one ``lp_fa4::fwd`` custom op with autograd, fake tensors and a FLOP
formula). Offsets are read on the host only where they already are host data (CPU tensors, the
``*_cpu`` copies) or when ``ADS_CHECK_INPUTS=1`` asks for one sync per call; the engine clamps every
span to its tensor, so offsets that lie give wrong numbers, never an access outside a tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import lp_fa4
from ads_kernel_tools import checks
from ads_kernel_tools.offsets import check_inputs_enabled, host_values, validate_offsets

__all__ = ["jagged_flash_attention"]

Tensor = torch.Tensor
HostOffsets = Tensor | Sequence[int] | np.ndarray
_DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256  # the engine's limit (multiples of 8)
_P = "ads_jfa: "


def _err(msg: str) -> ValueError:
    return ValueError(_P + msg)


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q (Tq, H, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv): bf16/fp16, one device, H % Hkv == 0."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, Tensor):
            raise _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise _err(f"{name} must be 3-D (tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"query, key, value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise _err(f"dtype must be bfloat16 or float16, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise _err(f"query, key, value must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:2] != v.shape[:2]:
        raise _err(f"key and value must agree in tokens and heads, got {tuple(k.shape)} and {tuple(v.shape)}")
    h, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or h % hkv:
        raise _err(f"query heads ({h}) must be a multiple of key/value heads ({hkv})")
    if q.shape[2] != k.shape[2]:
        raise _err(f"query and key head dims differ: {q.shape[2]} vs {k.shape[2]}")
    for name, d in (("head_dim", q.shape[2]), ("value head_dim", v.shape[2])):
        if d < 8 or d > MAX_HEAD_DIM or d % 8:
            raise _err(f"{name} must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {d}")


def check_offsets(name: str, t, device, entries: int | None = None) -> None:
    if not isinstance(t, Tensor) or t.dim() != 1 or t.shape[0] < 1:
        desc = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise _err(f"{name} must be a 1-D tensor of B+1 offsets, got {desc}")
    if t.dtype not in (torch.int32, torch.int64):
        raise _err(f"{name} must be int32 or int64, got {t.dtype}")
    if t.device != device:
        raise _err(f"{name} is on {t.device}, query on {device}")
    if entries is not None and t.shape[0] != entries:
        raise _err(f"{name} must have {entries} entries, got {t.shape[0]}")


def check_bound(name: str, value) -> int:
    """A sequence bound: an integer >= 0 (NumPy integers too, a traced SymInt as is)."""
    return checks.integer(name, value, prefix=_P, minimum=0)


def host_offsets(name: str, t: Tensor, cpu_copy: HostOffsets | None) -> np.ndarray | None:
    """The offsets' values where they are known on the host without a sync (a CPU tensor, or the
    caller's copy), or at the price of one sync under ``ADS_CHECK_INPUTS=1``; None otherwise and
    always under torch.compile (host reads would break the graph)."""
    if torch.compiler.is_compiling():
        return None
    if cpu_copy is not None:
        if isinstance(cpu_copy, Tensor) and cpu_copy.device.type != "cpu":
            raise _err(f"{name}_cpu must live on the CPU, got {cpu_copy.device}")
        host = host_values(cpu_copy)
        if host.ndim != 1 or host.shape[0] != t.shape[0]:
            raise _err(f"{name}_cpu has shape {host.shape}, {name} has {t.shape[0]} entries")
        return host
    if t.device.type == "cpu" or check_inputs_enabled():
        return host_values(t)
    return None


def _check_host(
    hq: np.ndarray | None,
    hk: np.ndarray | None,
    ho: np.ndarray | None,
    tq: int,
    tk: int,
    max_kv: int,
    broadcast_q: bool,
) -> None:
    """Value checks of the offsets known on the host (see :func:`host_offsets`)."""
    if hq is not None:
        if broadcast_q and (int(hq[0]) != 0 or int(hq[1]) != tq):
            raise _err(f"broadcast_q needs query_offset = [0, {tq}] (all query rows), got {hq.tolist()}")
        validate_offsets("query_offset", hq, tq, prefix=_P)
    if hk is not None:
        validate_offsets("key_offset", hk, tk, max_len=max_kv, max_name="max_seq_len_kv", prefix=_P)
    if ho is None:
        return
    if broadcast_q:
        if hk is None:
            return
        want = np.arange(hk.shape[0], dtype=np.int64) * tq
    elif hq is not None:
        want = hq
    else:
        return
    if ho.shape != want.shape or not np.array_equal(ho, want):
        what = "b * Lq" if broadcast_q else "query_offset"
        raise _err(
            f"output_offset must equal {what} (the output layout), got {ho[:8].tolist()} "
            f"instead of {want[:8].tolist()}"
        )


def jagged_flash_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_offset: Tensor,
    key_offset: Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    *,
    output_offset: Tensor | None = None,
    sm_scale: float | None = None,
    window_size: int | None = None,
    broadcast_q: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    query_offset_cpu: HostOffsets | None = None,
    key_offset_cpu: HostOffsets | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Jagged softmax attention: ``O_i = softmax_j(sm_scale · q_i · k_j) · v_j`` per sequence.

    Args:
        query: (Tq, H, D); key: (Tk, Hkv, D); value: (Tk, Hkv, Dv); bf16 or fp16; H % Hkv == 0
            (GQA/MQA, forward and backward); D, Dv multiples of 8 up to 256.
        query_offset, key_offset: int32/int64 (B+1,) offsets, independent (cross attention, Lq != Lk):
            query sequence b attends to key/value sequence b. With ``broadcast_q`` query_offset is
            [0, Tq]: the one query sequence attends to each of the B kv sequences (PMA).
        max_seq_len_q: query rows i >= max_seq_len_q of a sequence give zeros (and lse -inf, zero dQ).
        max_seq_len_kv: must bound every kv length (the backward sizes its key tiles by it; checked
            where offsets are known on the host).
        output_offset: accepted for upstream compatibility; output rows always follow query_offset
            (b·Lq under broadcast_q), and a given output_offset must describe that layout (checked
            where host values are known).
        sm_scale: default 1/sqrt(D).
        window_size: W restricts query i to keys |i - j| <= W, both counted from their sequence's
            start (top-left; equals FlashAttention's local (W, W) only when Lq == Lk). W = 0 is the
            diagonal.
        return_lse: also return lse (H, Tq_out) fp32, natural log of the softmax denominator of the
            scaled scores (-inf on rows with no key or past max_seq_len_q); differentiable.
        deterministic: bitwise repeatable backward.
        query_offset_cpu, key_offset_cpu: host copies (CPU tensors or int sequences) of the offsets:
            enable value checks without a device sync.

    Returns:
        out (Tq_out, H, Dv) in the input dtype, Tq_out = Tq (B·Tq with ``broadcast_q``); an empty kv
        sequence gives zero rows. With ``return_lse``: (out, lse).

    Raises:
        ValueError: on shapes, dtypes, devices or options the op does not take, and on offsets whose
            host values are decreasing, outside their tensors or longer than max_seq_len_kv.
    """
    check_qkv(query, key, value)
    dev = query.device
    if not isinstance(broadcast_q, bool):
        raise _err(f"broadcast_q must be a bool, got {broadcast_q!r}")
    check_offsets("query_offset", query_offset, dev, 2 if broadcast_q else None)
    check_offsets("key_offset", key_offset, dev, None if broadcast_q else query_offset.shape[0])
    n_b = key_offset.shape[0] - 1
    if output_offset is not None:
        check_offsets("output_offset", output_offset, dev, n_b + 1)
    max_seq_len_q = check_bound("max_seq_len_q", max_seq_len_q)
    max_seq_len_kv = check_bound("max_seq_len_kv", max_seq_len_kv)
    window_size = checks.integer("window_size", window_size, prefix=_P, minimum=0, allow_none=True)
    sm_scale = checks.real("sm_scale", sm_scale, prefix=_P, allow_none=True)
    for name, flag in (("return_lse", return_lse), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise _err(f"{name} must be a bool, got {flag!r}")
    hq = host_offsets("query_offset", query_offset, query_offset_cpu)
    hk = host_offsets("key_offset", key_offset, key_offset_cpu)
    ho = None
    if output_offset is not None and output_offset is not query_offset:
        ho = host_offsets("output_offset", output_offset, None)
    _check_host(hq, hk, ho, query.shape[0], key.shape[0], max_seq_len_kv, broadcast_q)
    out, lse = lp_fa4.jagged_attention(
        query,
        key,
        value,
        query_offset,
        key_offset,
        max_seq_len_q,
        max_seq_len_kv,
        softmax_scale=sm_scale,
        window_size=window_size,
        broadcast_q=broadcast_q,
        deterministic=deterministic,
        cu_seqlens_q_cpu=None if hq is None else torch.from_numpy(hq),
        cu_seqlens_k_cpu=None if hk is None else torch.from_numpy(hk),
    )
    return (out, lse) if return_lse else out
