"""Compatibility with FBGEMM's jagged flash attention (``fbgemm_gpu.sll``): same names, arguments and
math, so a caller switches by changing the import. Not our recommended API (see
:func:`ads_jfa.jagged_flash_attention`): these functions keep FBGEMM's conventions.

FBGEMM's math, per sequence b of length n_b = min(offsets[b+1] - offsets[b], max_seq_len) (rows and
keys past max_seq_len are dropped, output rows there are zero):

    S = Q Kᵀ                    (no 1/sqrt(D) scale)
    P = softmax_row(S) / max_seq_len
    P[i, j] = 0 where i > j     (only with ``use_mask``: after the normalisation, so a row's weights
                                 no longer sum to 1/max_seq_len; this is not causal attention)
    O = P V

Runs on lp-fa4's engine (``lp_fa4.flash_attn_varlen_func`` with seqused_q/k = n_b). ``use_mask`` is
two engine calls: the band j >= i gives Σ_{j>=i} e^{S_ij} V_j / Z_band and its LSE, the full row
its LSE, and O = O_band · exp(lse_band - lse_full) / max_seq_len. Inputs are bf16/fp16 (the engine
has no fp32/TF32 path; ``allow_tf32`` is accepted and has no effect).
"""

from __future__ import annotations

import torch

import lp_fa4
from ads_kernel_tools.offsets import validate_offsets

from .interface import _err, check_bound, host_offsets

__all__ = ["jagged_flash_attention_basic", "multi_head_jagged_flash_attention"]

Tensor = torch.Tensor
_DTYPES = (torch.bfloat16, torch.float16)


def _check(fn: str, q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_seq_len: int, dims: int) -> int:
    """The arguments checked; returns max_seq_len as an int."""
    for name, t in (("q_weights", q), ("k_weights", k), ("v_weights", v)):
        if not isinstance(t, Tensor) or t.dim() != dims:
            desc = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise _err(f"{fn}: {name} must be a {dims}-D tensor, got {desc}")
    if not (q.shape == k.shape == v.shape):
        shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v))
        raise _err(f"{fn}: q, k, v must have one shape, got {shapes}")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"{fn}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise _err(
            f"{fn}: dtype must be bfloat16 or float16, got {q.dtype} (the engine has no fp32/TF32 path; "
            "cast the inputs)"
        )
    if not (q.device == k.device == v.device):
        raise _err(f"{fn}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    d = q.shape[-1]
    if d < 8 or d > 256 or d % 8:
        raise _err(f"{fn}: D must be a multiple of 8 in [8, 256], got {d}")
    if not isinstance(offsets, Tensor) or offsets.dim() != 1 or offsets.shape[0] < 1:
        raise _err(f"{fn}: offsets must be a 1-D tensor of B+1 offsets")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise _err(f"{fn}: offsets must be int32 or int64, got {offsets.dtype}")
    if offsets.device != q.device:
        raise _err(f"{fn}: offsets is on {offsets.device}, q on {q.device}")
    max_seq_len = check_bound("max_seq_len", max_seq_len)
    host = host_offsets("offsets", offsets, None)
    if host is not None:
        validate_offsets("offsets", host, q.shape[-2], prefix=f"ads_jfa: {fn}: ")
    return max_seq_len


def _kept_rows(offsets: Tensor, rows: int, max_seq_len: int) -> Tensor:
    """(rows,) bool: the row lies in a sequence at position < max_seq_len. On the device, no sync;
    offsets that lie give some mask, never an index outside ``offsets``."""
    off = offsets.to(torch.int64)
    n_b = off.shape[0] - 1
    r = torch.arange(rows, device=off.device)
    if n_b <= 0:
        return torch.zeros(rows, dtype=torch.bool, device=off.device)
    seq = (torch.searchsorted(off, r, right=True) - 1).clamp(0, n_b - 1)
    pos = r - off[seq]
    return (r >= off[0]) & (r < off[-1]) & (pos >= 0) & (pos < max_seq_len)


def _attend(q3: Tensor, k3: Tensor, v3: Tensor, offsets: Tensor, max_seq_len: int, use_mask: bool) -> Tensor:
    """q3, k3, v3 (T, H, D) -> (T, H, D) in FBGEMM's math (module docstring)."""
    n = (offsets[1:] - offsets[:-1]).clamp(0, max_seq_len).to(torch.int32)
    kw = dict(seqused_q=n, seqused_k=n, softmax_scale=1.0)
    m = max_seq_len
    full, lse = lp_fa4.flash_attn_varlen_func(q3, k3, v3, offsets, offsets, m, m, return_lse=use_mask, **kw)
    kept = _kept_rows(offsets, q3.shape[0], m)  # rows past a slot's computed tiles are not written
    out = full.float()
    if use_mask:
        band, lse_band = lp_fa4.flash_attn_varlen_func(
            q3, k3, v3, offsets, offsets, m, m, window_size=(0, None), return_lse=True, **kw
        )
        # equal seqused lengths: the bottom-right band (0, None) is j >= i; row i always keeps key i
        log_ratio = torch.where(kept[None, :], lse_band - lse, 0.0)
        out = band.float() * torch.exp(log_ratio).t()[:, :, None]
    out = torch.where(kept[:, None, None], out, 0.0) * (1.0 / max(m, 1))
    return out.to(q3.dtype)


def jagged_flash_attention_basic(
    q_weights: Tensor,
    k_weights: Tensor,
    v_weights: Tensor,
    offsets: Tensor,
    max_seq_len: int,
    use_mask: bool = False,
    allow_tf32: bool = True,
) -> Tensor:
    """FBGEMM ``jagged_flash_attention_basic``: one head, q/k/v (ΣB, D) jagged with shared
    ``offsets`` (B+1,); returns (ΣB, D). Math in the module docstring; differentiable."""
    fn = "jagged_flash_attention_basic"
    max_seq_len = _check(fn, q_weights, k_weights, v_weights, offsets, max_seq_len, 2)
    if not isinstance(use_mask, bool) or not isinstance(allow_tf32, bool):
        raise _err(f"{fn}: use_mask and allow_tf32 must be bools, got {use_mask!r}, {allow_tf32!r}")
    q3, k3, v3 = (t[:, None, :] for t in (q_weights, k_weights, v_weights))
    return _attend(q3, k3, v3, offsets, max_seq_len, use_mask)[:, 0, :]


def multi_head_jagged_flash_attention(
    q_weights: Tensor,
    k_weights: Tensor,
    v_weights: Tensor,
    offsets: Tensor,
    max_seq_len: int,
    allow_tf32: bool = True,
) -> Tensor:
    """FBGEMM ``multi_head_jagged_flash_attention``: q/k/v (H, ΣB, D) with shared ``offsets``
    (B+1,); returns (H, ΣB, D) contiguous. Math in the module docstring (no mask); differentiable."""
    fn = "multi_head_jagged_flash_attention"
    max_seq_len = _check(fn, q_weights, k_weights, v_weights, offsets, max_seq_len, 3)
    if not isinstance(allow_tf32, bool):
        raise _err(f"{fn}: allow_tf32 must be a bool, got {allow_tf32!r}")
    q3, k3, v3 = (t.transpose(0, 1) for t in (q_weights, k_weights, v_weights))
    return _attend(q3, k3, v3, offsets, max_seq_len, False).transpose(0, 1).contiguous()
