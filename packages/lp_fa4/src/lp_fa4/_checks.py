"""Argument validation for the public API: shapes, dtypes, devices, options and FA4 keywords.

ValueError for input that is wrong, NotImplementedError naming an FA4 keyword value this package
does not implement. ``host_checks`` is the optional (ADS_CHECK_INPUTS=1) value check that reads
device offsets and page tables; ``_check_fp8`` reads the FP8 descales under the same flag.
"""

from __future__ import annotations

import math

import torch

from ads_kernel_tools import checks
from ads_kernel_tools.offsets import validate_offsets

from . import config as cfg
from .triton.launch import BIG

Tensor = torch.Tensor
DTYPES = (torch.bfloat16, torch.float16)
FP8 = torch.float8_e4m3fn
MAX_HEAD_DIM = 256
_P = "lp_fa4: "


def _unsupported(**kw) -> None:
    """NotImplementedError naming every FA4 keyword given a value this package does not implement."""
    for name, value in kw.items():
        if value is not None:
            raise NotImplementedError(f"lp_fa4: {name} is not supported (got {type(value).__name__})")


def _check_splits(num_splits: int) -> None:
    num_splits = checks.integer("num_splits", num_splits, prefix=_P, minimum=0)
    if num_splits > 1:
        raise NotImplementedError(f"lp_fa4: num_splits={num_splits} (split-KV) is not supported; use 1")


def _check_pack_gqa(pack_gqa) -> None:
    if pack_gqa not in (None, True, False):
        raise ValueError(f"lp_fa4: pack_gqa must be None, True or False, got {pack_gqa!r}")


def _fa4_keywords(num_splits, pack_gqa, **unsupported) -> None:
    """The FA4 keywords both entry points take and this package only checks: ``num_splits``,
    ``pack_gqa`` and those it does not implement (NotImplementedError when given)."""
    _unsupported(**unsupported)
    _check_splits(num_splits)
    _check_pack_gqa(pack_gqa)


def _score_options(causal, window_size, softmax_scale, softcap, sink, heads: int, d: int, device):
    """FA4's score options resolved: (window left, window right, scale, softcap); the sink checked."""
    _check_sink(sink, heads, device)
    wl, wr = _resolve_window(causal, window_size)
    return wl, wr, _scale(softmax_scale, d), _softcap(softcap)


def _last_contig(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, q_dims: int, kv_dims: int) -> None:
    for name, t, dims in (("q", q, q_dims), ("k", k, kv_dims), ("v", v, kv_dims)):
        if not isinstance(t, Tensor):
            raise ValueError(f"lp_fa4: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"lp_fa4: {name} must be {dims}-D here, got shape {tuple(t.shape)}")
    if torch.float8_e5m2 in (q.dtype, k.dtype, v.dtype):
        raise NotImplementedError("lp_fa4: float8_e5m2 inputs are not supported (FP8 means float8_e4m3fn)")
    if q.dtype not in DTYPES and q.dtype != FP8:
        raise ValueError(f"lp_fa4: q must be bfloat16 or float16 (or float8_e4m3fn), got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"lp_fa4: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"lp_fa4: q, k, v on different devices: {q.device}, {k.device}, {v.device}")
    d, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"lp_fa4: q and k head dims differ: {d} vs {k.shape[-1]}")
    for name, x in (("head dim", d), ("v head dim", dv)):
        if x < 8 or x > MAX_HEAD_DIM or x % 8:
            raise ValueError(f"lp_fa4: {name} must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {x}")
    h, hkv = q.shape[-2], k.shape[-2]
    if v.shape[-2] != hkv:
        raise ValueError(f"lp_fa4: k has {hkv} heads but v has {v.shape[-2]}")
    if hkv == 0 or h % hkv:
        raise ValueError(f"lp_fa4: q heads ({h}) must be a multiple of kv heads ({hkv})")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"lp_fa4: k and v disagree on tokens: {tuple(k.shape)} vs {tuple(v.shape)}")


def _check_runnable(q: Tensor) -> None:
    """The last check before a launch (after every argument check, so those report first)."""
    if q.device.type != "cuda" and not cfg.interpreter_active():
        raise ValueError(
            f"lp_fa4: tensors must be on a CUDA device (or run under TRITON_INTERPRET=1), got {q.device}"
        )


def _check_sink(sink: Tensor | None, h: int, device) -> None:
    if sink is None:
        return
    if not isinstance(sink, Tensor) or sink.shape != (h,) or not sink.is_floating_point():
        shape = tuple(sink.shape) if isinstance(sink, Tensor) else type(sink).__name__
        raise ValueError(f"lp_fa4: learnable_sink must be a float tensor of shape ({h},), got {shape}")
    if sink.device != device:
        raise ValueError(f"lp_fa4: learnable_sink is on {sink.device}, q on {device}")


def _check_index(name: str, t: Tensor | None, length: int | None, device) -> Tensor | None:
    """None, or ``t`` checked (1-D int32/int64, ``length`` entries where given, on q's device) and
    contiguous: the kernels read it by position (``ads_kernel_tools.checks.index_vector``)."""
    if t is None:
        return None
    return checks.index_vector(name, t, length=length, device=device, prefix=_P)


def _resolve_window(causal: bool, window_size) -> tuple[int, int]:
    """FA4's rules: left + right < 0 drops the window; causal sets right = 0; None is unbounded.

    The window is dropped before causal applies, so ``causal=True`` always masks the future: FA4
    4.0.0b36 sets right = 0 first, which turns FA2's "no window" (-1, -1) into a dropped window and
    silently runs ``causal=True, window_size=(-1, -1)`` non-causal (README, "Differences from FA4")."""
    if not isinstance(causal, bool):
        raise ValueError(f"lp_fa4: causal must be a bool, got {causal!r}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"lp_fa4: window_size must be a pair (left, right), got {window_size!r}") from None
    left, right = (
        checks.integer(f"window_size[{i}]", side, prefix=_P, allow_none=True)
        for i, side in enumerate((left, right))
    )
    if left is not None and right is not None and left + right < 0:
        left, right = None, None
    if causal:
        right = 0
    wl = BIG if left is None else max(min(left, BIG), -BIG)
    wr = BIG if right is None else max(min(right, BIG), -BIG)
    return wl, wr


def _scale(softmax_scale, d: int) -> float:
    """The softmax scale: finite (NaN or inf would make every row non-finite); None: 1/sqrt(d)."""
    scale = checks.real("softmax_scale", softmax_scale, prefix=_P, allow_none=True)
    return 1.0 / math.sqrt(d) if scale is None else scale


def _softcap(softcap) -> float:
    """The softcap, finite and >= 0; None or 0: off (0.0)."""
    softcap = checks.real("softcap", softcap, prefix=_P, minimum=0, allow_none=True)
    return 0.0 if softcap is None else softcap


def _check_max(name: str, value) -> int | None:
    """None or an integer >= 0 (a sequence bound, a window width), returned as an int."""
    return checks.integer(name, value, prefix=_P, minimum=0, allow_none=True)


def _host_checks(
    q_rows, k_rows, cu_q, cu_k, used_q, used_k, page_table, n_pages, max_q, max_k, broadcast_q
) -> None:
    """ADS_CHECK_INPUTS=1: the value checks that need device data (one sync)."""
    if broadcast_q and cu_q is not None and cu_q.tolist() != [0, q_rows]:
        # the output holds one block of q_rows rows per kv sequence: other offsets leave rows unwritten
        raise ValueError(f"lp_fa4: broadcast_q needs cu_seqlens_q == [0, {q_rows}], got {cu_q.tolist()}")
    for name, cu, rows, mx in (("cu_seqlens_q", cu_q, q_rows, max_q), ("cu_seqlens_k", cu_k, k_rows, max_k)):
        if cu is None:
            continue
        used = used_q if name.endswith("q") else used_k
        # with seqused the sequences are the used prefixes: max_seqlen bounds those, not the slots
        bound = None if (broadcast_q and name.endswith("q")) or used is not None else mx
        max_name = "max_seqlen_" + name[-1]
        validate_offsets(name, cu, rows, max_len=bound, max_name=max_name, prefix="lp_fa4: ")
    for name, used, mx in (("seqused_q", used_q, max_q), ("seqused_k", used_k, max_k)):
        if used is None or not used.numel():
            continue
        lo, hi = int(used.min()), int(used.max())
        if lo < 0:
            raise ValueError(f"lp_fa4: {name} has negative entries")
        if mx is not None and hi > mx:
            raise ValueError(f"lp_fa4: {name} has {hi} > max_seqlen_{name[-1]}={mx}")
    if page_table is not None and page_table.numel():
        lo, hi = int(page_table.min()), int(page_table.max())
        if lo < 0 or hi >= n_pages:
            raise ValueError(f"lp_fa4: page_table holds pages [{lo}, {hi}] but k has {n_pages} pages")


def _check_paged(q: Tensor, k: Tensor, v: Tensor, page_table: Tensor, n_b: int, device) -> None:
    if page_table.dim() != 2 or page_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"lp_fa4: page_table must be 2-D int32 (batch, max_pages), got "
            f"{page_table.dtype} {tuple(page_table.shape)}"
        )
    if page_table.shape[0] != n_b:
        raise ValueError(f"lp_fa4: page_table has {page_table.shape[0]} rows for {n_b} sequences")
    if page_table.device != device:
        raise ValueError(f"lp_fa4: page_table is on {page_table.device}, q on {device}")
    if page_table.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError("lp_fa4: page_table needs at least one page of at least one row")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("lp_fa4: paged KV (page_table) is forward-only; call it under no_grad")


def _check_fp8(q: Tensor, k: Tensor, v: Tensor, q_descale, k_descale, v_descale, n_b: int, *, paged: bool,
               sink, softcap: float, window: tuple[int, int], broadcast_q: bool = False):  # fmt: skip
    """The FP8 (float8_e4m3fn) forward's arguments: None for bf16/fp16 inputs (which take no
    descale), else (q_descale, k_descale, v_descale) as contiguous fp32 (B, Hkv) on q's device, FA3's
    layout (None = 1.0; q heads of a GQA group share their kv head's q_descale). The user's values are
    q·q_descale[b, h // G] and likewise for k and v. Options the FP8 path lacks raise
    NotImplementedError. Gradients are those of the dequantised inputs (``lp_fa4.fp8_bwd``).

    Descales must be finite and >= 0 (amax / 448 is): the Gluon sm_90 forward takes its row maximum
    as max(Q·Kᵀ)·scale, the largest scaled score only for a scale >= 0, so a negative one puts P
    outside e4m3's range and the output is wrong (H100: errors as large as the output); NaN or inf
    make the math NaN. Zero is valid (q or k: uniform weights; v: zero output). The values live on
    the device, so they are read (one sync) only under ``ADS_CHECK_INPUTS=1``."""
    given = [n for n, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
             if t is not None]  # fmt: skip
    if q.dtype != FP8:
        if given:
            raise ValueError(f"lp_fa4: {', '.join(given)} need float8_e4m3fn q, k, v (got {q.dtype})")
        return None
    lacking = [
        ("paged KV (page_table)", paged),
        ("softcap", softcap > 0),
        ("learnable_sink", sink is not None),
        ("a local window (window_size)", window[0] != BIG or window[1] not in (0, BIG)),
        ("broadcast_q", broadcast_q),
    ]
    for what, present in lacking:
        if present:
            raise NotImplementedError(f"lp_fa4: the FP8 path does not support {what}")
    hkv = k.shape[-2]
    out = []
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            out.append(torch.ones((n_b, hkv), dtype=torch.float32, device=q.device))
            continue
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (n_b, hkv):
            desc = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"lp_fa4: {name} must be a float32 tensor of shape (batch, kv heads) = "
                             f"({n_b}, {hkv}), got {desc}")  # fmt: skip
        if t.device != q.device:
            raise ValueError(f"lp_fa4: {name} is on {t.device}, q on {q.device}")
        out.append(t.contiguous())
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    flag = cfg.check_inputs()  # unflagged, no value is read, wherever it lives
    checks.nonnegative_values(descales, prefix=_P, device=flag, cpu=flag)
    return tuple(out)
