"""Public API: validate and canonicalise inputs, then call the ``ads_gdpa::fwd`` custom op.

O = scale · (act(Q Kᵀ) ⊙ M) · V per sequence (spec §1.1): no softmax, ``scale`` applied after the
activation. Validation never reads device memory: offsets are checked for monotonicity only when
they live on the CPU or CPU copies are given (no host sync on the hot path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ads_kernel_tools import checks
from ads_kernel_tools.offsets import host_copy

from . import _ops  # registers torch.ops.ads_gdpa.*
from .activations import Activation, activation_id
from .problem import BIG, MAX_ENCODINGS, Fused, MaskMode, split_fused

__all__ = ["gdpa_varlen", "gdpa", "generalized_dot_product_attention"]

_HALF = (torch.bfloat16, torch.float16)
_FP8 = (torch.float8_e4m3fn,)
_HEAD_DIMS = {(16, 16), (32, 32), (64, 64), (96, 96), (128, 128), (192, 128)}
_P = "ads_gdpa: "


def _err(msg: str) -> ValueError:
    return ValueError(_P + msg)


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
    return host_copy(name, t, cpu_copy, prefix=_P)


def _as_int(name: str, value) -> int:
    """An integer argument: a float (12.7) or a string is refused rather than truncated."""
    return checks.integer(name, value, prefix=_P)


def _as_scale(value, name: str = "scale") -> float:
    """A finite real scale (NaN or inf would turn every output row non-finite)."""
    return checks.real(name, value, prefix=_P)


def _mask(window_size, causal, local_window) -> tuple[MaskMode, int, int]:
    """(mode, left, right) of the band; an unbounded side is ``BIG``."""
    if window_size is not None:
        window_size = _as_int("window_size", window_size)
        if causal or local_window is not None:
            raise _err("window_size (top-left, upstream) cannot be combined with causal/local_window")
        if window_size < 0:
            raise _err(f"window_size must be >= 0, got {window_size}")
        # clamp to BIG (longer than any sequence, so the same mask): the kernels add a side to a row
        # index in int32, and a side near INT_MAX (a common "unbounded") wrapped to an empty band
        w = min(window_size, BIG)
        return MaskMode.TOP_LEFT, w, w
    if local_window is None and not causal:
        return MaskMode.NONE, BIG, BIG
    if local_window is not None and not (isinstance(local_window, (tuple, list)) and len(local_window) == 2):
        raise _err(f"local_window must be a pair (left, right) of ints or None, got {local_window!r}")
    left, right = (None, None) if local_window is None else local_window
    left = None if left is None else _as_int("local_window[0]", left)
    right = None if right is None else _as_int("local_window[1]", right)
    left = BIG if left is None or left < 0 else min(left, BIG)
    right = BIG if right is None or right < 0 else min(right, BIG)
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
    k: torch.Tensor | None,
    v: torch.Tensor | None,
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
    kv_index: torch.Tensor | None = None,
    start_end_offsets: bool = False,
    cu_seqlens_o: torch.Tensor | None = None,
    total_out: int | None = None,
    encodings: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Jagged GDPA. Differentiable in q, k, v (bf16/fp16) and the encoding tables.

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
        deterministic: backward computes dQ in a second pass instead of fp32 atomics, and the
            encoding tables' gradients in a fixed order.
        cu_seqlens_q_cpu, cu_seqlens_k_cpu: host copies (CPU tensors or int sequences); enable value
            checks (non-decreasing, within q/k, lengths <= max_seqlen_k), the workload-sorted tile
            order and exact per-sequence FLOP counts without a device sync. Under torch.compile pass
            CPU tensors: they stay graph inputs, so new offsets do not recompile.

    Upstream extras (the Triton kernels take these calls; CPU tensors are checked as host data,
    device ones are clamped into the tensors on the device):
        k = v = None: fused QKV, q is (total, H, 3·D) holding [q | k | v] per head; the keys are the
            query rows (cu_seqlens_k is not read). v = None: fused KV, k is (total_k, H_kv, 2·D)
            holding [k | v]. Strided views, never copied; gradients land in the fused tensor.
        kv_index: (B,) ints (upstream ``ad_to_request_offset``): sequence b attends to key sequence
            kv_index[b] of cu_seqlens_k (R+1 entries), so many query sequences share one KV without
            copying it; dK/dV sum over the sharing sequences.
        start_end_offsets: cu_seqlens_q / cu_seqlens_k are (2B,) [s0, e0, s1, e1, ...] spans that
            may overlap (dQ/dK/dV sum over overlaps); the output has ``total_out`` rows, sequence b's
            from cu_seqlens_o[2b] (default cu_seqlens_q[2b]); unwritten rows are zero.
        cu_seqlens_o: output starts (upstream ``output_offset``): entry b (2b with start/end) is the
            first output row of sequence b; output spans must not overlap.
        encodings: up to five (table, buckets) pairs; table (num_buckets, H, D_qk) per head or
            (num_buckets, D_qk) shared by all heads, float; buckets (total_q,) ints per query row.
            q + Σ table[buckets] is what attends (fused into every Q load); tables get gradients.

    Returns:
        (total_q, H, D_v) in q's dtype (bf16 for FP8), (B * total_q, H, D_v) with ``broadcast_q``, or
        (total_out, H, D_v) with ``start_end_offsets``.
    """
    fused = Fused.NONE
    if k is None and v is None:
        fused = Fused.QKV
        if cu_seqlens_k is not cu_seqlens_q:
            cu_seqlens_k, cu_seqlens_k_cpu = cu_seqlens_q, cu_seqlens_q_cpu  # keys are the query rows
    elif v is None:
        fused = Fused.KV
    elif k is None:
        raise _err("k is None but v is given: fused layouts are k = v = None (QKV) or v = None (KV)")
    qv, kv, vv = _fused_views(q, k, v, fused)
    _check_tensors(qv, kv, vv, 3)
    if fused == Fused.QKV:
        k = v = q  # the op takes the fused tensor in every slot it fills (one gradient)
    elif fused == Fused.KV:
        v = k
    act = activation_id(activation)
    host_q = _host_offsets("cu_seqlens_q", cu_seqlens_q, cu_seqlens_q_cpu)
    if cu_seqlens_k is cu_seqlens_q and cu_seqlens_k_cpu is cu_seqlens_q_cpu:
        host_k = host_q  # self attention: convert and check the offsets once
    else:
        host_k = _host_offsets("cu_seqlens_k", cu_seqlens_k, cu_seqlens_k_cpu)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.device != q.device:
            raise _err(f"{name} is on {t.device}, q on {q.device}")
    # the kernels read offsets by position: a strided view (a column of a matrix, ``t[::2]``) would be
    # read as the wrong entries; self attention keeps one object for both
    self_offsets = cu_seqlens_k is cu_seqlens_q
    cu_seqlens_q = cu_seqlens_q.contiguous()
    cu_seqlens_k = cu_seqlens_q if self_offsets else cu_seqlens_k.contiguous()
    max_seqlen_q, max_seqlen_k = _as_int("max_seqlen_q", max_seqlen_q), _as_int("max_seqlen_k", max_seqlen_k)
    scale = _as_scale(scale)
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        raise _err("max_seqlen_q and max_seqlen_k must be >= 0")
    if broadcast_q:
        if cu_seqlens_q.shape[0] != 2:
            raise _err("broadcast_q needs cu_seqlens_q with exactly 2 entries (one shared query sequence)")
    elif kv_index is None and cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise _err(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries, cu_seqlens_k {cu_seqlens_k.shape[0]}")
    extras = _extras(
        q, fused, cu_seqlens_q, cu_seqlens_k, kv_index, start_end_offsets, cu_seqlens_o, total_out,
        encodings, broadcast_q, deterministic,
    )  # fmt: skip
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
        hk = kv.shape[1]
        descales = (
            _descale("q_descale", q_descale, q.shape[1], q.device),
            _descale("k_descale", k_descale, hk, q.device),
            _descale("v_descale", v_descale, hk, q.device),
        )
    # with host offsets the exact maxima are known: tighter tiles for callers that pass loose bounds
    return _ops.gdpa_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, act, per_head, float(scale),
        int(mode), left, right, bool(broadcast_q), *descales, host_q, host_k, bool(deterministic),
        *extras,
    )  # fmt: skip


def _fused_views(q, k, v, fused: Fused):
    """Views of the fused inputs, after checking that their last dims split evenly."""
    if fused == Fused.QKV:
        if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[-1] % 3:
            raise _err(f"fused QKV (k = v = None) needs q of shape (T, H, 3*D), got {_shape(q)}")
    elif fused == Fused.KV:
        if not isinstance(k, torch.Tensor) or k.dim() != 3 or k.shape[-1] % 2:
            raise _err(f"fused KV (v = None) needs k of shape (T, H_kv, 2*D), got {_shape(k)}")
    return split_fused(q, k, v, fused)


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _int_vector(name: str, t, length: int | None, device) -> torch.Tensor:
    """``t`` checked and contiguous: the kernels read it by position
    (``ads_kernel_tools.checks.index_vector``)."""
    return checks.index_vector(name, t, length=length, device=device, prefix=_P)


def _extras(
    q, fused, cu_q, cu_k, kv_index, start_end, cu_o, total_out, encodings, broadcast_q, deterministic
) -> tuple:
    """The op's upstream-extras arguments (``_ops.FwdArgs`` from kv_index on), after shape checks."""
    qv = split_fused(q, q, q, fused)[0] if fused == Fused.QKV else q
    tq, heads, d = qv.shape
    if start_end:
        if total_out is None or _as_int("total_out", total_out) < 0:
            raise _err("start/end offsets need total_out (upstream total_num_objects), the output rows")
        if cu_q.shape[0] % 2 or cu_k.shape[0] != cu_q.shape[0]:
            raise _err(
                f"start/end offsets come in pairs: query_offset has {cu_q.shape[0]} entries, key_offset "
                f"{cu_k.shape[0]} (both must be 2B)"
            )
        if broadcast_q or fused != Fused.NONE or kv_index is not None:
            raise _err(
                "start/end offsets cannot be combined with broadcast_q, fused QKV/KV or ad_to_request_offset"
            )
        if deterministic:
            raise _err(
                "deterministic=True cannot be combined with start/end offsets (overlaps sum dQ atomically)"
            )
    if kv_index is not None:
        if broadcast_q or fused == Fused.QKV:
            raise _err("ad_to_request_offset cannot be combined with broadcast_q or fused QKV")
        kv_index = _int_vector("ad_to_request_offset", kv_index, cu_q.shape[0] - 1, q.device)
    if cu_o is not None:
        if broadcast_q:
            cu_o = None  # broadcast_q outputs sit at b * Lq, what upstream callers pass
        else:
            cu_o = _int_vector("output_offset", cu_o, cu_q.shape[0], q.device)
    tables, buckets = [], []
    for i, pair in enumerate(encodings or ()):
        table, bkt = pair
        name = f"encodings[{i}]"
        if not isinstance(table, torch.Tensor) or table.dim() not in (2, 3):
            raise _err(f"{name} table must be (num_buckets, H, D) or (num_buckets, D), got {_shape(table)}")
        want = (heads, d) if table.dim() == 3 else (d,)
        if tuple(table.shape[1:]) != want or table.shape[0] < 1:
            raise _err(
                f"{name} table has shape {tuple(table.shape)}; expected (num_buckets >= 1, "
                f"{', '.join(map(str, want))})"
                " (upstream reads (num_buckets, H*D) tables with head 0's D values for every head: reshape"
                " to (num_buckets, H, D), or pass (num_buckets, D) to share one row across heads)"
            )
        if table.dtype not in (torch.float32, torch.bfloat16, torch.float16) or table.stride(-1) != 1:
            raise _err(f"{name} table must be fp32/bf16/fp16 and contiguous in its last dim")
        if table.device != q.device:
            raise _err(f"{name} table is on {table.device}, q on {q.device}")
        tables.append(table)
        buckets.append(_int_vector(f"{name} buckets", bkt, tq, q.device))
    if len(tables) > MAX_ENCODINGS:
        raise _err(f"at most {MAX_ENCODINGS} encodings, got {len(tables)}")
    if tables and q.dtype in _FP8:
        raise _err("encodings are not supported with float8 inputs")
    pad = [None] * (MAX_ENCODINGS - len(tables))
    total = int(total_out) if start_end else -1
    return (kv_index, None, bool(start_end), cu_o, None, total, int(fused), *tables, *pad, *buckets, *pad)


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


_ENCODING_NAMES = (
    "ts_encoding",
    "ts_event_request_even",
    "ts_event_request_log",
    "ts_adjacent_event_log",
    "pos_emb",
)


def generalized_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    query_offset: torch.Tensor,
    key_offset: torch.Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    ad_to_request_offset: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    attn_offset: torch.Tensor | None = None,
    is_causal: bool = False,
    qk_scale: float | None = None,
    seq_index: torch.Tensor | None = None,
    allow_tf32: bool = True,
    output_offset: torch.Tensor | None = None,
    use_start_end_offsets: bool = False,
    window_size: int | None = None,
    broadcast_q: bool = False,
    activation: str | int = "raw",
    enable_persistent: bool = False,
    enable_tma: bool = False,
    enable_ws: bool = False,
    use_dq_atomic_add: bool = False,
    total_num_objects: int | None = None,
    ts_encoding_params: torch.Tensor | None = None,
    ts_event_request_even_params: torch.Tensor | None = None,
    ts_event_request_log_params: torch.Tensor | None = None,
    ts_adjacent_event_log_params: torch.Tensor | None = None,
    ts_encoding_bucket_values: torch.Tensor | None = None,
    ts_event_request_even_bucket_values: torch.Tensor | None = None,
    ts_event_request_log_bucket_values: torch.Tensor | None = None,
    ts_adjacent_event_log_bucket_values: torch.Tensor | None = None,
    pos_emb_params: torch.Tensor | None = None,
    pos_emb_bucket_values: torch.Tensor | None = None,
    bwd_opt_tech: str = "base",
    ensemble_activation_list: Sequence[int] | None = None,
) -> torch.Tensor:
    """Drop-in for the upstream Triton ``generalized_dot_product_attention``: the same arguments in
    the same order with the same defaults (``ensemble_activation_list`` last), so callers switch by
    changing the import. README "Upstream interface" describes each argument.

    * ``qk_scale`` (default 1.0) multiplies after the activation. ``key = value = None``: fused QKV
      in ``query`` (T, H, 3·D); ``value = None``: fused KV in ``key`` (T, H_kv, 2·D): views, no copies.
    * ``ad_to_request_offset`` (B,): sequence b attends to key sequence ``ad_to_request_offset[b]``.
    * ``use_start_end_offsets``: offsets are [s0, e0, s1, e1, ...] spans (they may overlap), the
      output has ``total_num_objects`` rows, sequence b's from ``output_offset[2b]``.
    * ``output_offset``: each sequence's first output row (default ``query_offset``); ignored with
      ``broadcast_q``, whose outputs sit at b·Lq.
    * The five ``*_params`` / ``*_bucket_values`` pairs: ``query += params[bucket_values]`` per
      query row before Q·Kᵀ. Tables are (num_buckets, H, D) (one row per head) or (num_buckets, D)
      (shared); upstream reads every head's values from head 0's slot. Their gradients are exact
      (upstream's dQ pass leaves the encodings out of S).
    * Accepted as upstream does and otherwise without effect: ``attn_mask`` / ``attn_offset`` must be
      None and ``is_causal`` False (ValueError otherwise, where upstream asserts); ``allow_tf32``,
      ``enable_persistent``, ``enable_tma``, ``enable_ws``, ``use_dq_atomic_add`` and
      ``bwd_opt_tech`` (our dispatch picks the kernels); ``seq_index``, a processing-order hint (a
      permutation of the sequences does not change the result).

    Returns:
        (total_q, H, D) in the query dtype; (B·Lq, H, D) with ``broadcast_q``; (total_num_objects,
        H, D) with ``use_start_end_offsets``.
    """
    if attn_mask is not None or attn_offset is not None:
        raise _err("attn_mask / attn_offset are not supported (upstream asserts they are None)")
    if is_causal:
        raise _err("is_causal=True is not supported by the upstream interface; use gdpa_varlen(causal=True)")
    if not isinstance(bwd_opt_tech, str):
        raise _err(f"bwd_opt_tech must be a string, got {type(bwd_opt_tech).__name__}")
    del seq_index, allow_tf32, enable_persistent, enable_tma, enable_ws, use_dq_atomic_add, bwd_opt_tech
    if use_start_end_offsets and total_num_objects is None:
        raise _err("use_start_end_offsets=True needs total_num_objects (the output rows)")
    if not use_start_end_offsets:
        _check_increasing(query_offset)
    params = (ts_encoding_params, ts_event_request_even_params, ts_event_request_log_params,
              ts_adjacent_event_log_params, pos_emb_params)  # fmt: skip
    buckets = (ts_encoding_bucket_values, ts_event_request_even_bucket_values,
               ts_event_request_log_bucket_values, ts_adjacent_event_log_bucket_values,
               pos_emb_bucket_values)  # fmt: skip
    encodings = []
    for name, table, bkt in zip(_ENCODING_NAMES, params, buckets):
        if (table is None) != (bkt is None):
            raise _err(f"{name}_params and {name}_bucket_values must be given together")
        if table is not None:
            encodings.append((table, bkt))
    cu_o = None if output_offset is None or output_offset is query_offset else output_offset
    return gdpa_varlen(
        query, key, value, query_offset, key_offset, max_seq_len_q, max_seq_len_kv,
        activation=activation, scale=1.0 if qk_scale is None else _as_scale(qk_scale, "qk_scale"),
        window_size=window_size, broadcast_q=broadcast_q, activation_per_head=ensemble_activation_list,
        kv_index=ad_to_request_offset, start_end_offsets=use_start_end_offsets, cu_seqlens_o=cu_o,
        total_out=total_num_objects, encodings=encodings or None,
    )  # fmt: skip


def _check_increasing(query_offset) -> None:
    """Host query offsets that decrease are overlapping spans: name the switch they need."""
    if torch.compiler.is_compiling():  # values unknown while tracing: the op still checks them
        return
    if not isinstance(query_offset, torch.Tensor) or query_offset.device.type != "cpu":
        return
    if isinstance(query_offset, torch._subclasses.fake_tensor.FakeTensor) or query_offset.dim() != 1:
        return
    h = query_offset.to(torch.int64)
    drops = torch.nonzero(h[1:] < h[:-1])
    if drops.numel():
        b = int(drops[0, 0])
        raise _err(
            f"query_offset decreases (query_offset[{b}] = {int(h[b])} > query_offset[{b + 1}] = "
            f"{int(h[b + 1])}): overlapping spans need use_start_end_offsets=True with [start, end] pairs"
        )
