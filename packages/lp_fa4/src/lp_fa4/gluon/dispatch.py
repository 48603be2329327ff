"""Which forward kernel runs a call: the Gluon Hopper kernel (``fwd_sm90``) where ``why_not`` finds
nothing against it, else the portable Triton forward. The one place that decides.

The Gluon forward covers: bf16/fp16 and float8_e4m3fn (bf16 out, descales per (batch, kv head)),
head dims 64 and 128 (D == Dv), MHA/GQA/MQA, no mask or a
bottom-right causal mask, local windows (FA4's bottom-right ``window_size``) and the top-left
windows of ``jagged_attention`` (bf16/fp16), dense and varlen (dense arrives as varlen with
cu_seqlens), seqused_q/k, the LSE in either layout, and ``jagged_attention`` (its rows past
max_seqlen_q are pre-filled with zeros by the op); on an sm_90 GPU with ``LP_FA4_BACKEND=auto`` (the
default), and broadcast_q calls on their queries repeated per kv sequence (``fwd``); a learnable
sink (16-bit inputs), with the fp32 copy of the output the op asks for when the sink needs its
gradient (``fwd``'s out32). Everything else keeps the Triton path: paged KV, softcap, a row cap
below max_seqlen_q, other head dims, fp32 inputs, strided tensors, the interpreter.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ads_kernel_tools.capability import gluon_sm90_reason as device_reason

from .. import config as cfg
from ..offsets import batch_offsets
from ..triton import launch


def repeat_queries(q: torch.Tensor, n_b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q repeated n_b times along rows, its (B+1,) offsets b·Lq): a broadcast_q call's one query
    block as B ordinary sequences, for the interface's ``repeat`` plan and ``fwd``'s repeat inside
    the op alike. Built from shapes only (no host sync); the offsets are ``batch_offsets``', so the
    Gluon kernels take them without a clamp launch outside torch.compile."""
    return q.repeat(n_b, 1, 1), batch_offsets(n_b, q.shape[0], q.device)


# input dtype -> output dtype of the Gluon forward
_DTYPES = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float16, torch.float8_e4m3fn: torch.bfloat16}


def _packed(t: torch.Tensor) -> bool:
    """(rows, heads, D) whose rows each hold heads·D contiguous values, 16-byte aligned, rows any
    16-byte multiple apart without overlapping: a 2-D TMA view of rows x heads·D
    (``ads_kernel_tools.kernels.gluon_hopper.rows_desc``). Slices of a packed projection qualify
    (q, k, v of ``qkv.unbind`` on a (T, 3, H, D) tensor, or of ``split`` on the heads of a
    (T, H + 2·Hkv, D) one); a heads-major or head-strided view does not."""
    if t.dim() != 3:
        return False
    rows, h, d = t.shape
    s0, s1, s2 = t.stride()
    return (
        s2 == 1
        and (s1 == d or h == 1)
        and (rows <= 1 or (s0 >= h * d and (s0 * t.element_size()) % 16 == 0))
        and t.data_ptr() % 16 == 0
    )


def why_not(q, k, v, page_table, sink, pb: launch.Problem, out) -> str | None:
    """None when the Gluon forward takes the call, else the first reason it does not (options first,
    then tensors, then the device, so the reasons are testable on a CPU)."""
    if cfg.backend() != "auto":
        return "LP_FA4_BACKEND=triton"
    if page_table is not None:
        return "paged KV"
    if sink is not None and q.dtype == torch.float8_e4m3fn:
        return "FP8 with a learnable sink"
    if (reason := score_reason(pb, windows=True)) is not None:
        return reason
    if q.dtype == torch.float8_e4m3fn and _band(pb) == "window":
        return "FP8 with a window"
    if pb.rows_cap < pb.max_q:
        return "jagged max_seqlen_q row cap"
    if k.dtype != q.dtype or k.shape[-1] != q.shape[-1]:
        return f"k {k.dtype}, head dim {k.shape[-1]} unlike q's"
    if (reason := tile_reason(q.dtype, q.shape[-1], v)) is not None:
        return reason
    if out.dtype != _DTYPES[q.dtype]:
        return f"out {out.dtype} for {q.dtype} inputs"
    if not (_packed(q) and _packed(k) and _packed(v) and _packed(out)):
        return "strided or unaligned tensors"
    return device_reason(q)


def tile_reason(dtype: torch.dtype, d: int, v: torch.Tensor) -> str | None:
    """None when the Gluon forward's tiles take queries of ``dtype`` and head dim ``d`` with values
    ``v`` (same dtype, D == Dv in {64, 128}), else which does not fit; shared with ``broadcast``."""
    if dtype not in _DTYPES or v.dtype != dtype:
        return f"dtype {dtype}"
    if d not in (64, 128) or v.shape[-1] != d:
        return f"head dims {d}/{v.shape[-1]}"
    return None


def score_reason(pb: launch.Problem, windows: bool = False) -> str | None:
    """None when a Gluon kernel is not kept off by the score options (softcap, broadcast_q, windows,
    the scale), else which; shared by the forward's and the backward's predicates. ``windows``: the
    kernel takes any band (the forward), else only none or bottom-right causal."""
    if pb.softcap > 0:
        return "softcap"
    if pb.broadcast_q:
        return "jagged broadcast_q"
    if not windows and _band(pb) == "window":
        return "jagged top-left window" if pb.top_left else "local window"
    if not (pb.scale > 0 and pb.scale < float("inf")):
        return "softmax_scale <= 0"
    return None


def fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, pb: launch.Problem, out, lse,
        lse_dense: bool, descale=None, out32: torch.Tensor | None = None,
        prefill: bool = False) -> None:  # fmt: skip
    """``lp_fa4.triton.launch.fwd``'s contract; runs the Gluon kernel where ``why_not`` allows.
    ``descale``: (q, k, v) fp32 (B, Hkv) descales of float8_e4m3fn inputs, else None. A broadcast_q
    call (``lp_fa4.broadcast``'s ``resident`` plan) runs on the Gluon kernel as B ordinary sequences
    of Lq rows all reading the one query block (``fwd_sm90.fwd``'s ``q_block``: no repeated copy;
    ``LP_FA4_BQ_FWD_BLOCK=0``: on its queries repeated once per kv sequence), where the
    kernel takes that call, but for the short query blocks of
    ``config.bq_small_fwd_rows``, which the Triton kernel's in-place broadcast runs faster.
    ``out32``: an fp32 tensor like out that also gets the output, unrounded (the Triton kernels
    write it and out is its rounding). ``prefill``: out (and out32) must read 0 and lse -inf on rows
    no kernel program writes (``_ops.fwd_impl``'s ``zero_fill``): filled here first, unless the
    kernel taken writes every row (the one-block broadcast forward with max_seqlen_q >= Lq: each
    sequence's Lq rows are computed rows)."""
    q_block = checked = False
    if (pb.broadcast_q and used_q is None and cu_k is not None and q.shape[0] > cfg.bq_small_fwd_rows()
            and cfg.broadcast_q() != "kernel"):  # fmt: skip
        n_b = cu_k.shape[0] - 1
        rep = dataclasses.replace(pb, broadcast_q=False)
        if n_b * q.shape[0] < 2**31 and why_not(q, k, v, page_table, sink, rep, out) is None:
            pb, checked = rep, True
            if cfg.bq_fwd_block():
                cu_q, q_block = batch_offsets(n_b, q.shape[0], q.device), True
            else:  # the repeated copy is contiguous: the predicate's answer stands for it
                q, cu_q = repeat_queries(q, n_b)
    if prefill and not (q_block and pb.max_q >= q.shape[0]):
        out.zero_()
        lse.fill_(-math.inf)
        if out32 is not None:
            out32.zero_()
    # a broadcast_q call's predicate was just checked (and a q_block call's Triton fallback would read
    # B·Lq rows of q)
    if not checked and why_not(q, k, v, page_table, sink, pb, out) is not None:
        launch.fwd(q, k, v, cu_q, cu_k, used_q, used_k, page_table, sink, pb,
                   out if out32 is None else out32, lse, lse_dense, descale=descale)  # fmt: skip
        if out32 is not None:
            out.copy_(out32)
        return
    from . import fwd_sm90

    band = _band(pb)
    causal = band == "causal"
    window = None if band in (None, "causal") else (pb.win_left, pb.win_right)
    fwd_sm90.fwd(q, k, v, cu_q, cu_k, used_q, used_k, pb.max_q, pb.max_k, pb.scale, causal, out, lse,
                 lse_dense, descale=descale, window=window, top_left=pb.top_left, sink=sink,
                 out32=out32, q_block=q_block)  # fmt: skip


def _band(pb: launch.Problem) -> str | None:
    """None (every key), "causal" (bottom-right, the kernel's tuned path) or "window" (any other
    band, top-left or bottom-right)."""
    if pb.win_left == launch.BIG and pb.win_right == launch.BIG:
        return None  # top-left and bottom-right alignment mask nothing without a window
    if pb.win_left == launch.BIG and pb.win_right == 0 and not pb.top_left:
        return "causal"
    return "window"
