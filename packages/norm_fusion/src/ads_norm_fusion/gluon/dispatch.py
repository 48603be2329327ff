"""Which ``linear_*norm`` forward runs a call: the Gluon Hopper kernel (``fwd_sm90``) where
``why_not`` finds nothing against it, else the Triton kernels (``triton.launch``). The one place that
decides.

The Gluon forward covers: bf16/fp16 x, w and outputs; N a multiple of 64 up to 1024, or above 1024 a
multiple of 128 that ``config.gluon_split`` shares among at most 16 programs of at most 512 columns
each, so up to 8192 (each program's z tiles in shared memory); K a positive multiple of 8 (TMA's 16-byte
row strides); row-major 2-D tensors with 16-byte aligned bases and row strides, contiguous bias / γ / β;
an sm_90 GPU with Triton's Gluon, off the interpreter; ``ADS_NORM_FUSION_GLUON``
(``config.gluon_forward``: by default calls of 2^25 outputs or more). Where N is a multiple of 128 two
or more programs share each row block (``config.gluon_split``); ``config.gluon_ws`` picks the warp-
specialised kernel. Calls without x̂, and training calls that save the pre-norm value
(``config.save_prenorm``), go to the normalisation-partition kernel (``fwd_epi_sm90``) where
``config.gluon_epi_split`` cuts N; training calls it does not take run the Triton kernels.
"""

from __future__ import annotations

import torch

from ads_kernel_tools.capability import gluon_sm90_reason as device_reason
from ads_kernel_tools.capability import num_sms

from .. import config

_DTYPES = (torch.bfloat16, torch.float16)
MULTIPLE_N = 64
MAX_N = 1024  # fwd_sm90.MAX_N (not imported: this module must load without Gluon)


def tma_matrix(t: torch.Tensor) -> bool:
    """2-D, rows contiguous, 16-byte aligned base and row stride: a valid TMA descriptor."""
    return (
        t.dim() == 2
        and (t.stride(1) == 1 or t.shape[1] <= 1)
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def why_not(x, w, out, *, xhat=None, vectors=()) -> str | None:
    """None when the Gluon forward takes the call (x (M, K), w (N, K), out and xhat (M, N), vectors
    the bias / γ / β given), else the first reason it does not: the switch, then sizes and dtypes,
    then tensor layouts, then the device, so every reason but the device is testable on a CPU."""
    m, k = x.shape
    n = w.shape[0]
    if not config.gluon_forward(m, n):
        return f"ADS_NORM_FUSION_GLUON={config.gluon_mode()} (M·N={m * n})"
    if n % MULTIPLE_N != 0 or n <= 0 or (n > MAX_N and config.gluon_split(n) == 1):
        return (
            f"N={n} (needs a multiple of {MULTIPLE_N} up to {MAX_N}, or above it a multiple of 128 up to "
            f"{config.GLUON_MAX_SPLIT * config.GLUON_MAX_PART} split in parts of at most "
            f"{config.GLUON_MAX_PART} columns, ADS_NORM_FUSION_GLUON_SPLIT=2)"
        )
    if k <= 0 or k % 8 != 0:
        return f"K={k} (needs a positive multiple of 8)"
    mats = (x, w, out) + ((xhat,) if xhat is not None else ())
    if x.dtype not in _DTYPES or any(t.dtype != x.dtype for t in mats):
        return f"dtype {x.dtype} / {w.dtype} -> {out.dtype}"
    if not all(tma_matrix(t) for t in mats):
        return "strided or unaligned tensors"
    if any(v is not None and (v.dim() != 1 or v.stride(0) != 1) for v in vectors):
        return "strided bias or norm parameters"
    return device_reason(x)


def forward(mode: str, x, w, out, stat2, *, stat1, bias, gamma, beta, xhat, eps: float, raw: bool = False,
            xoff=None) -> bool:  # fmt: skip
    """Runs the Gluon forward for ``mode`` ("ln_fwd" / "rms_fwd") and returns True where ``why_not``
    allows, else returns False (the caller runs the Triton kernel). ``raw``: xhat is to get the
    pre-norm value (``config.save_prenorm``; LayerNorm: with its row offsets ``xoff``), which only
    the normalisation-partition kernel writes. The programs that share a row block wait for each
    other, so all of them must be resident at once: a split wider than the device's SMs (a small MIG
    slice) is refused here, where the SM count is known."""
    if why_not(x, w, out, xhat=xhat, vectors=(bias, gamma, beta)) is not None:
        return False
    sms = num_sms(x.device)
    n = w.shape[0]
    epi_split = config.gluon_epi_split(n) if config.gluon_epi() and (xhat is None or raw) else 0
    if 0 < epi_split <= sms:
        from . import fwd_epi_sm90

        fwd_epi_sm90.forward(
            x, w, out, stat2, stat1=stat1, bias=bias, gamma=gamma, beta=beta, eps=eps, rms=mode == "rms_fwd",
            num_sms=sms, split=epi_split, zsave=xhat if raw else None, zoff=xoff if raw else None,
        )  # fmt: skip
        return True
    if raw:
        return False
    split = config.gluon_split(n)
    if split > sms:
        return False
    from . import fwd_sm90

    fwd_sm90.forward(
        x, w, out, stat2, stat1=stat1, bias=bias, gamma=gamma, beta=beta, xhat=xhat, eps=eps,
        rms=mode == "rms_fwd", num_sms=sms, split=split, ws=config.gluon_ws(),
    )  # fmt: skip
    return True


def rms_linear_why_not(x, w, out, *, bias=None) -> str | None:
    """None when the Gluon ``rmsnorm_linear`` forward (``rms_linear_sm90``) takes the call (x (M, K),
    w (N, K) with γ folded in, out (M, N)), else the first reason it does not, in ``why_not``'s order:
    the switch (``config.rms_gluon``), sizes, dtypes, layouts, the device."""
    m, k = x.shape
    n = w.shape[0]
    if not config.rms_gluon(m, n):
        return f"ADS_NORM_FUSION_RMS_GLUON (M·N={m * n})"
    if n <= 0 or n % 8 != 0 or k <= 0 or k % 8 != 0:
        return f"N={n}, K={k} (need positive multiples of 8)"
    if x.dtype not in _DTYPES or w.dtype != x.dtype or out.dtype != x.dtype:
        return f"dtype {x.dtype} / {w.dtype} -> {out.dtype}"
    if not all(tma_matrix(t) for t in (x, w, out)):
        return "strided or unaligned tensors"
    if bias is not None and (bias.dim() != 1 or bias.stride(0) != 1):
        return "strided bias"
    return device_reason(x)


def rms_linear_forward(x, w, out, rrms, *, bias, eps: float) -> bool:
    """Runs the Gluon ``rmsnorm_linear`` forward where ``rms_linear_why_not`` allows and returns
    True, else returns False (the caller runs the Triton kernels)."""
    if rms_linear_why_not(x, w, out, bias=bias) is not None:
        return False
    from . import rms_linear_sm90

    rms_linear_sm90.forward(x, w, out, rrms, bias=bias, eps=eps, num_sms=num_sms(x.device),
                            nt=config.rms_gluon_nt())  # fmt: skip
    return True
