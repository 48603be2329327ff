"""Public API: FlashAttention-4's ``flash_attn_func`` / ``flash_attn_varlen_func`` (names, keywords
and return values of flash-attn-4 4.0.0b36's ``flash_attn.cute``) and ``jagged_attention``.

Canonicalisation lives here (validation in ``_checks``); every call becomes one ``lp_fa4::fwd``
custom op in varlen form. Nothing here reads device memory unless ``ADS_CHECK_INPUTS=1`` or a
max_seqlen is omitted.
"""

from __future__ import annotations

import functools

import torch

from . import _ops, broadcast, fp8_bwd
from . import config as cfg
from ._checks import (
    _check_fp8,
    _check_index,
    _check_max,
    _check_paged,
    _check_qkv,
    _check_runnable,
    _fa4_keywords,
    _host_checks,
    _last_contig,
    _scale,
    _score_options,
)
from .gluon.dispatch import repeat_queries
from .offsets import batch_offsets
from .triton.launch import BIG

Tensor = torch.Tensor


def _host_copy(name: str, host, entries: int) -> Tensor | None:
    """A CPU int64 copy of host offsets (a list or a CPU tensor) with ``entries`` entries, or None."""
    if host is None:
        return None
    t = torch.as_tensor(host)
    if t.device.type != "cpu" or t.dim() != 1 or t.shape[0] != entries or t.is_floating_point():
        raise ValueError(f"lp_fa4: {name} must be {entries} integer offsets on the CPU, got {t.dtype} "
                         f"{tuple(t.shape)} on {t.device}")  # fmt: skip
    return t.to(torch.int64)


def _longest(cu: Tensor) -> int:
    """max(cu[b+1] - cu[b]): a device sync, only when the caller omitted max_seqlen."""
    return int((cu[1:] - cu[:-1]).max().item()) if cu.shape[0] > 1 else 0


_HALF = (torch.bfloat16, torch.float16)


def _run(
    q3,
    k,
    v,
    cu_q,
    cu_k,
    used_q,
    used_k,
    page_table,
    sink,
    max_q,
    max_k,
    scale,
    softcap,
    wl,
    wr,
    *,
    top_left=False,
    broadcast_q=False,
    rows_cap=BIG,
    lse_dense=False,
    zero_fill=False,
    deterministic=False,
    host_q=None,
    host_k=None,
    descale=None,
    sources=None,
):
    _check_runnable(q3)
    # the kernels index page tables and the sink by position: a strided view (a column of a matrix,
    # ``t[::2]``) would be read as the wrong entries (offsets and lengths come contiguous from
    # ``_check_index``)
    page_table = page_table.contiguous() if page_table is not None else None
    sink = sink.contiguous() if sink is not None else None
    resident_bwd = False
    if broadcast_q and _plain(used_q, page_table, sink, softcap, descale):
        n_b = cu_k.shape[0] - 1
        plan = broadcast.plan(q3, k, v, n_b, (wl, wr), deterministic)
        if plan == "repeat":
            # the repeated offsets on the CPU, for exact FLOP counts without a device sync
            host_q = torch.arange(n_b + 1, dtype=torch.int64) * q3.shape[0]
            q3, cu_q = repeat_queries(q3, n_b)
            broadcast_q = False
        resident_bwd = plan == "resident"
    q3, k, v = _last_contig(q3), _last_contig(k), _last_contig(v)
    zero_fill = zero_fill or sink is not None
    # a sink that needs its gradient: the forward also keeps its output in fp32, unrounded, for the
    # backward's row term (``_ops.bwd_impl``)
    out32 = sink is not None and sink.requires_grad and torch.is_grad_enabled() and q3.dtype in _HALF
    # FP8 tensors from quantize_fp8: gradients go to their bf16 sources (lp_fa4.fp8_bwd)
    attention = _ops.attention if sources is None else functools.partial(fp8_bwd.attend_sources, sources)
    out, lse, _ = attention(
        q3,
        k,
        v,
        cu_q,
        cu_k,
        used_q,
        used_k,
        page_table,
        sink,
        max_q,
        max_k,
        scale,
        softcap,
        wl,
        wr,
        top_left,
        broadcast_q,
        rows_cap,
        lse_dense,
        zero_fill,
        bool(deterministic),
        host_q,
        host_k,
        *(descale if descale is not None else (None, None, None)),
        resident_bwd,
        out32,
    )
    return out, lse


def _plain(used_q, page_table, sink, softcap, descale) -> bool:
    """No option that keeps a call off the Gluon kernels whatever its queries (``lp_fa4.broadcast``)."""
    return used_q is None and page_table is None and sink is None and softcap == 0 and descale is None


def _sources(descale, q, k, v, shapes):
    """The bf16 sources of quantize_fp8 outputs, reshaped like the op's q, k, v, or None."""
    srcs = fp8_bwd.sources(q, k, v) if descale is not None else None
    if srcs is None:
        return None
    return tuple(None if s is None else s.reshape(shape) for s, shape in zip(srcs, shapes))


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int | None, int | None] = (None, None),
    learnable_sink: Tensor | None = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    *,
    qv: Tensor | None = None,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    aux_tensors=None,
    aux_scalars=None,
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    gather_kv_indices: Tensor | None = None,
    return_lse: bool = False,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Softmax attention on dense batches, FlashAttention-4's interface.

    q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); bf16 or fp16; H % Hkv == 0 (GQA/MQA).
    FP8: float8_e4m3fn q, k, v with ``q_descale`` / ``k_descale`` / ``v_descale`` fp32 (B, Hkv) each
    (FA3's layout; None = 1.0): the attention of q·q_descale[b, h // G], k·k_descale[b, hk],
    v·v_descale[b, hk]; out is bf16; no window other than causal, softcap or sink. Descales must be
    finite and >= 0 (zero is valid); ``ADS_CHECK_INPUTS=1`` reads them and raises ValueError
    otherwise (unchecked, a negative one gives a wrong output on the sm_90 kernel). Gradients are
    those of the dequantised inputs: bf16 to the sources of :func:`lp_fa4.fp8_bwd.quantize_fp8` outputs
    (straight through), the chain rule to float8 leaves and descales (``lp_fa4.fp8_bwd``).
    Returns ``(out, lse)``: out (B, Sq, H, Dv) in q's dtype (bf16 for FP8); lse (B, H, Sq) fp32 natural-log
    logsumexp of the scaled (and softcapped) scores, including the sink, when ``return_lse`` (else
    None); differentiable. Masks are bottom-right aligned: query i sees key j iff
    ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` for ``window_size=(left, right)`` (None =
    unbounded; causal sets right = 0; left + right < 0 means no window). ``softcap`` > 0 maps scores to
    ``softcap·tanh(s/softcap)``; ``learnable_sink`` (H,) is a per-head logit (not scaled) added to the
    softmax denominator only. Rows with no valid key give out 0, lse -inf (with a sink: out 0,
    lse = sink_h, FA4's value). ``pack_gqa`` is accepted (GQA needs no packing here);
    ``deterministic`` gives a bitwise repeatable backward. The backward recomputes P from the fp32
    LSE, as FA4 does, so gradients lose accuracy once the scaled scores |softmax_scale·q·k| reach
    about 1e6 and overflow near 1e9 (the forward is not affected).
    """
    _fa4_keywords(
        num_splits,
        pack_gqa,
        qv=qv,
        score_mod=score_mod,
        score_mod_bwd=score_mod_bwd,
        mask_mod=mask_mod,
        aux_tensors=aux_tensors,
        aux_scalars=aux_scalars,
        block_sparse_tensors=block_sparse_tensors,
        block_sparse_tensors_bwd=block_sparse_tensors_bwd,
        gather_kv_indices=gather_kv_indices,
    )
    _check_qkv(q, k, v, 4, 4)
    n_b, sq, h, d = q.shape
    sk = k.shape[1]
    if k.shape[0] != n_b:
        raise ValueError(f"lp_fa4: q has batch {n_b} but k has {k.shape[0]}")
    scores = (causal, window_size, softmax_scale, softcap, learnable_sink)
    wl, wr, scale, cap = _score_options(*scores, h, d, q.device)
    fp8 = (q_descale, k_descale, v_descale)
    descale = _check_fp8(q, k, v, *fp8, n_b, paged=False, sink=learnable_sink, softcap=cap, window=(wl, wr))
    cu_q, cu_k = batch_offsets(n_b, sq, q.device), batch_offsets(n_b, sk, q.device)
    q3 = q.reshape(n_b * sq, h, d)
    k3, v3 = k.reshape(n_b * sk, *k.shape[2:]), v.reshape(n_b * sk, *v.shape[2:])
    out, lse = _run(
        q3,
        k3,
        v3,
        cu_q,
        cu_k,
        None,
        None,
        None,
        learnable_sink,
        sq,
        sk,
        scale,
        cap,
        wl,
        wr,
        lse_dense=True,
        deterministic=deterministic,
        descale=descale,
        sources=_sources(descale, q, k, v, (q3.shape, k3.shape, v3.shape)),
    )
    return out.view(n_b, sq, h, v.shape[-1]), (lse if return_lse else None)


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    page_table: Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int | None, int | None] = (None, None),
    learnable_sink: Tensor | None = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    *,
    min_seqlen_k: int | None = None,
    qv: Tensor | None = None,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    aux_tensors=None,
    aux_scalars=None,
    block_sparse_tensors=None,
    gather_kv_indices: Tensor | None = None,
    scheduler_metadata=None,
    broadcast_q: bool = False,
    cpu_cu_seqlens_k=None,
    return_lse: bool = False,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Softmax attention on packed variable-length batches, FlashAttention-4's interface.

    q (Tq, H, D) with ``cu_seqlens_q`` int32 (B+1,), or (B, Sq, H, D) without it; k/v (Tk, Hkv, ·)
    with ``cu_seqlens_k``, (B, Sk, Hkv, ·) without it, or paged (num_pages, page_size, Hkv, ·) with
    ``page_table`` int32 (B, max_pages) (sequence b's key j lives in page page_table[b, j //
    page_size]; forward only; its length is seqused_k[b], else max_pages·page_size).
    ``seqused_q/k`` (B,) shorten each sequence to its first entries: query rows past seqused_q give
    out 0 / lse -inf (within the first max_seqlen_q rows of the slot; later slot rows are not
    written), keys past seqused_k are ignored and get zero dK/dV. ``max_seqlen_q/k`` must bound the
    longest sequence, as in FA4 (omitted: read from the offsets, one device sync); a longer one is a
    ValueError under ``ADS_CHECK_INPUTS=1``, and unchecked only its first max_seqlen_q rows are
    computed and its first max_seqlen_k keys attended, in the forward and the backward alike (keys
    past it get zero dK/dV; :func:`jagged_attention` makes that truncation its contract).
    ``broadcast_q``: the one query sequence (cu_seqlens_q = [0, Lq]) attends to each of the B kv
    sequences; out (B·Lq, H, Dv), dQ summed over the batch. Returns ``(out, lse)``: out (Tq, H, Dv),
    lse (H, Tq) fp32 natural log (for 4-D q: (B, Sq, H, Dv) and (B, H, Sq)) when ``return_lse``,
    else None. Rows before cu_seqlens_q[0]
    or after cu_seqlens_q[B] are left unwritten. FP8 descales are (B, Hkv), B the number of
    sequences. Other options as :func:`flash_attn_func`.
    """
    _fa4_keywords(
        num_splits,
        pack_gqa,
        qv=qv,
        score_mod=score_mod,
        score_mod_bwd=score_mod_bwd,
        mask_mod=mask_mod,
        aux_tensors=aux_tensors,
        aux_scalars=aux_scalars,
        block_sparse_tensors=block_sparse_tensors,
        gather_kv_indices=gather_kv_indices,
        scheduler_metadata=scheduler_metadata,
    )
    max_seqlen_q = _check_max("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max("max_seqlen_k", max_seqlen_k)
    _check_max("min_seqlen_k", min_seqlen_k)
    if not isinstance(broadcast_q, bool):
        raise ValueError(f"lp_fa4: broadcast_q must be a bool, got {broadcast_q!r}")
    dense_q = cu_seqlens_q is None
    paged = page_table is not None
    if paged and cu_seqlens_k is not None:
        raise ValueError("lp_fa4: page_table cannot be combined with cu_seqlens_k (use seqused_k)")
    dense_k = cu_seqlens_k is None and not paged
    if not isinstance(q, Tensor) or not isinstance(k, Tensor) or not isinstance(v, Tensor):
        raise ValueError("lp_fa4: q, k, v must be tensors")
    _check_qkv(q, k, v, 4 if dense_q else 3, 4 if (dense_k or paged) else 3)
    h, d = q.shape[-2], q.shape[-1]
    dev = q.device
    if dense_q:
        n_b, sq = q.shape[0], q.shape[1]
        if broadcast_q:
            raise ValueError("lp_fa4: broadcast_q needs 3-D q with cu_seqlens_q = [0, Lq]")
        cu_q = batch_offsets(n_b, sq, dev)
        q3 = q.reshape(n_b * sq, h, d)
        max_q = sq
    else:
        cu_seqlens_q = _check_index("cu_seqlens_q", cu_seqlens_q, None, dev)
        if cu_seqlens_q.shape[0] < 1:
            raise ValueError("lp_fa4: cu_seqlens_q needs at least one entry")
        if broadcast_q and cu_seqlens_q.shape[0] != 2:
            raise ValueError("lp_fa4: broadcast_q needs cu_seqlens_q with exactly 2 entries [0, Lq]")
        cu_q, q3 = cu_seqlens_q, q
        n_b = cu_q.shape[0] - 1
        max_q = max_seqlen_q if max_seqlen_q is not None else _longest(cu_q)
        if broadcast_q:
            max_q = q.shape[0] if max_seqlen_q is None else max_seqlen_q
    if paged:
        n_b = page_table.shape[0] if broadcast_q else n_b
        _check_paged(q, k, v, page_table, n_b, dev)
        cu_k, k3, v3 = None, k, v
        max_k = page_table.shape[1] * k.shape[1]
        max_k = min(max_k, max_seqlen_k) if max_seqlen_k is not None else max_k
    elif dense_k:
        if k.shape[0] != n_b and not broadcast_q:
            raise ValueError(f"lp_fa4: q has {n_b} sequences but dense k has batch {k.shape[0]}")
        n_b = k.shape[0] if broadcast_q else n_b
        cu_k = batch_offsets(k.shape[0], k.shape[1], dev)
        k3, v3 = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        max_k = k.shape[1]
    else:
        cu_seqlens_k = _check_index("cu_seqlens_k", cu_seqlens_k, None if broadcast_q else n_b + 1, dev)
        cu_k, k3, v3 = cu_seqlens_k, k, v
        n_b = cu_k.shape[0] - 1 if broadcast_q else n_b
        if max_seqlen_k is not None:
            max_k = max_seqlen_k
        elif cpu_cu_seqlens_k is not None:
            max_k = _longest(_host_copy("cpu_cu_seqlens_k", cpu_cu_seqlens_k, cu_k.shape[0]))
        else:
            max_k = _longest(cu_k)
    if paged and v.shape[:2] != k.shape[:2]:
        raise ValueError("lp_fa4: paged k and v must have the same pages")
    seqused_q = _check_index("seqused_q", seqused_q, n_b, dev)
    seqused_k = _check_index("seqused_k", seqused_k, n_b, dev)
    if broadcast_q and seqused_q is not None:
        raise ValueError("lp_fa4: broadcast_q does not take seqused_q")
    scores = (causal, window_size, softmax_scale, softcap, learnable_sink)
    wl, wr, scale, cap = _score_options(*scores, h, d, dev)
    fp8 = (q_descale, k_descale, v_descale)
    descale = _check_fp8(q, k, v, *fp8, n_b, paged=paged, sink=learnable_sink, softcap=cap, window=(wl, wr),
                         broadcast_q=broadcast_q)  # fmt: skip
    if cfg.check_inputs():
        n_pages = k.shape[0] if paged else 0
        k_rows = k3.shape[0] if not paged else 0
        _host_checks(
            q3.shape[0],
            k_rows,
            cu_q if not dense_q else None,
            cu_k if not (dense_k or paged) else None,
            seqused_q,
            seqused_k,
            page_table,
            n_pages,
            max_q,
            max_k,
            broadcast_q,
        )
    out, lse = _run(
        q3,
        k3,
        v3,
        cu_q,
        cu_k,
        seqused_q,
        seqused_k,
        page_table,
        learnable_sink,
        max_q,
        max_k,
        scale,
        cap,
        wl,
        wr,
        broadcast_q=broadcast_q,
        lse_dense=dense_q,
        deterministic=deterministic,
        descale=descale,
        sources=_sources(descale, q, k, v, (q3.shape, k3.shape, v3.shape)),
    )
    if dense_q:
        out = out.view(n_b, q.shape[1], h, v.shape[-1])
    return out, (lse if return_lse else None)


def jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int | None = None,
    *,
    softmax_scale: float | None = None,
    window_size: int | None = None,
    broadcast_q: bool = False,
    deterministic: bool = False,
    cu_seqlens_q_cpu: Tensor | None = None,
    cu_seqlens_k_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Jagged softmax attention (the semantics ads-jfa builds on; not an FA4 name).

    q (Tq, H, D), k/v (Tk, Hkv, ·); int32 offsets ``cu_seqlens_q`` / ``cu_seqlens_k`` (B+1,), independent
    (Lq != Lk: cross attention); query sequence b attends to kv sequence b. ``window_size=W``: the
    top-left symmetric band |i - j| <= W with i, j counted from each sequence's start. Query rows
    i >= ``max_seqlen_q`` are zeros (and get zero dQ); an empty kv sequence gives 0 / -inf.
    ``broadcast_q``: q is one sequence (cu_seqlens_q = [0, Lq]) attending to each of the B kv
    sequences; out (B·Lq, H, Dv), dQ summed over the batch. Keys past ``max_seqlen_k`` are ignored
    (zero dK/dV; omitted: the longest kv sequence, from ``cu_seqlens_k_cpu`` or else read from the
    offsets with one device sync). ``cu_seqlens_q_cpu/k_cpu``: optional CPU copies of the offsets
    (the FLOP formula then counts each sequence exactly). Returns (out, lse): lse (H, rows) fp32
    natural log (the upstream TLX kernel stores lse / ln 2); both differentiable.
    """
    _check_qkv(q, k, v, 3, 3)
    if q.dtype == torch.float8_e4m3fn:
        raise NotImplementedError(
            "lp_fa4: jagged_attention takes bf16/fp16 (FP8 is in flash_attn_func / _varlen_func)"
        )
    dev = q.device
    cu_seqlens_q = _check_index("cu_seqlens_q", cu_seqlens_q, 2 if broadcast_q else None, dev)
    cu_seqlens_k = _check_index(
        "cu_seqlens_k", cu_seqlens_k, None if broadcast_q else cu_seqlens_q.shape[0], dev
    )
    max_seqlen_q = _check_max("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max("max_seqlen_k", max_seqlen_k)
    if max_seqlen_q is None:
        raise ValueError("lp_fa4: jagged_attention needs max_seqlen_q")
    window_size = _check_max("window_size", window_size)
    host_q = _host_copy("cu_seqlens_q_cpu", cu_seqlens_q_cpu, cu_seqlens_q.shape[0])
    host_k = _host_copy("cu_seqlens_k_cpu", cu_seqlens_k_cpu, cu_seqlens_k.shape[0])
    if max_seqlen_k is not None:
        max_k = max_seqlen_k
    else:
        max_k = _longest(host_k if host_k is not None else cu_seqlens_k)
    w = BIG if window_size is None else min(window_size, BIG)
    scale = _scale(softmax_scale, q.shape[-1])
    if cfg.check_inputs():
        _host_checks(
            q.shape[0], k.shape[0], cu_seqlens_q, cu_seqlens_k, None, None, None, 0, None, None, broadcast_q
        )
    return _run(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        None,
        None,
        None,
        None,
        max_seqlen_q,
        max_k,
        scale,
        0.0,
        w,
        w,
        top_left=True,
        broadcast_q=broadcast_q,
        rows_cap=max_seqlen_q,
        zero_fill=True,
        deterministic=deterministic,
        host_q=host_q,
        host_k=host_k,
    )
