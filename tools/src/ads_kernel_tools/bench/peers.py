"""Other implementations we compare against, each optional.

A peer that can't be imported or doesn't run on this GPU is reported as missing (with the reason),
never silently dropped, so a table without it says why.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import torch

_NOTES: dict[str, str] = {}


def note(name: str, why: str) -> None:
    if name not in _NOTES:
        _NOTES[name] = why
        print(f"note: peer {name} unavailable: {why}", flush=True)


def notes() -> dict[str, str]:
    return dict(_NOTES)


_SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


def sdpa(backend: str) -> Callable[..., torch.Tensor] | None:
    """torch SDPA pinned to one backend, on (B, H, S, D) tensors; None if the backend is unknown."""
    if backend not in _SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {backend!r}; one of {sorted(_SDPA_BACKENDS)}")
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        note(f"sdpa-{backend}", str(e))
        return None
    kind = getattr(SDPBackend, _SDPA_BACKENDS[backend])

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        with sdpa_kernel([kind]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

    return run


def compiled(fn: Callable, **compile_kwargs: Any) -> Callable:
    """torch.compile of an eager function (the peer a user gets for free).

    Buffer donation is turned off: benchmarks time the backward repeatedly over one retained graph,
    which a compiled backward with donated buffers refuses ("non-empty donated buffers", seen on the
    H200 with torch 2.11)."""
    import torch._functorch.config as functorch_config

    functorch_config.donated_buffer = False
    return torch.compile(fn, **compile_kwargs)


def _optional(module: str, name: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except Exception as e:  # a broken optional install must not stop the benchmark
        note(name, f"import {module} failed: {type(e).__name__}: {e}")
        return None


def fa4() -> Any | None:
    """FlashAttention-4 (CuTe DSL) interface module, or None."""
    return _optional("flash_attn.cute.interface", "fa4")


def fa4_varlen() -> Callable | None:
    mod = fa4()
    return getattr(mod, "flash_attn_varlen_func", None) if mod is not None else None


def liger() -> Any | None:
    return _optional("liger_kernel.ops", "liger")


@contextlib.contextmanager
def skip_on_error(name: str):
    """Run a peer; on failure record the reason and carry on with the others."""
    try:
        yield
    except Exception as e:  # peers fail in many ways (unsupported shape, OOM, compile error)
        note(name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
