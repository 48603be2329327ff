"""One dispatch: which backend runs a call, from the GPU's architecture and each backend's support
table, and where that backend's kernel lives for the architecture.

The tables are data (``SUPPORT``): to add a kernel, add its row and its module in ``KERNELS``; the
dispatcher imports kernels by architecture and never catches an exception to fall back, so a bug in
a fast path is an error, not a silent slow run. The portable Triton kernels take every call the
fast paths do not (sm80+, and the CPU interpreter).

Extension checklist for a new architecture (e.g. an sm100 forward): write
``ads_gdpa/<backend>/fwd_sm100.py`` with the entry point named in ``KERNELS``, add
``("<backend>", 10)`` rows to ``SUPPORT`` and ``KERNELS``, and GPU tests over the rows it claims.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch

from ads_kernel_tools.capability import gluon_importable as _gluon_importable
from ads_kernel_tools.capability import interpreter_active, sm_version

from . import config as cfg
from .activations import Activation
from .problem import MaskMode

A = Activation


@dataclass(frozen=True)
class Support:
    """What one backend's kernel handles on one architecture."""

    activations: frozenset[int]
    head_dims: frozenset[tuple[int, int]]  # (d_qk, d_v)
    dtypes: frozenset[torch.dtype]
    masks: frozenset[MaskMode] = frozenset({MaskMode.NONE})
    broadcast_q: bool = False
    per_head: bool = False  # per-head activation lists
    deterministic: bool = False  # backward only: a bitwise-repeatable mode
    fp8_activations: frozenset[int] = frozenset()  # with float8_e4m3fn inputs (tested subset)
    # the upstream Triton interface's extras: ad_to_request_offset, start/end or output offsets,
    # fused QKV/KV views, learned encodings added to Q
    upstream_extras: bool = False

    def covers(self, call: Call) -> bool:
        acts = self.fp8_activations if call.dtype in _FP8 else self.activations
        return (
            call.act in acts
            and (call.d_qk, call.d_v) in self.head_dims
            and call.dtype in self.dtypes
            and call.mask in self.masks
            and (self.broadcast_q or not call.broadcast_q)
            and (self.per_head or not call.per_head)
            and (self.deterministic or not call.deterministic)
            and (self.upstream_extras or not call.upstream_extras)
        )


@dataclass(frozen=True)
class Call:
    """The features of one forward or backward call that decide its backend."""

    act: int
    d_qk: int
    d_v: int
    dtype: torch.dtype
    mask: MaskMode
    broadcast_q: bool
    per_head: bool
    deterministic: bool
    upstream_extras: bool = False
    max_k: int = 0  # the call's max_seqlen_k (keys per sequence at most)


_GLUON_ACTS = frozenset(
    int(a)
    for a in (A.RAW, A.GELU, A.GELU_APPROX, A.FAST_GELU, A.LEAKY_RELU, A.RELU, A.SILU, A.FAST_SILU,
              A.HARDSWISH, A.RELU_SQUARE)
)  # fmt: skip
_HALF = frozenset({torch.bfloat16, torch.float16})
_FP8 = frozenset({torch.float8_e4m3fn})
# FP8 through the Gluon forward: the activations its GPU tests cover against the dequantised reference
_GLUON_FP8_ACTS = frozenset(int(a) for a in (A.RAW, A.GELU, A.FAST_GELU, A.RELU, A.SILU, A.RELU_SQUARE))

# CuTe DSL kernels: the activations written in ``ads_gdpa.cute._act`` (kept here as data so that the
# table does not import the DSL)
_CUTE_ACTS = frozenset(
    int(a)
    for a in (A.RAW, A.GELU_APPROX, A.FAST_GELU, A.LEAKY_RELU, A.RELU, A.SILU, A.FAST_SILU, A.HARDSWISH,
              A.RELU_SQUARE)
)  # fmt: skip

# (backend, arch major, direction) -> what its kernel handles
SUPPORT: dict[tuple[str, int, str], Support] = {
    ("gluon", 9, "fwd"): Support(
        _GLUON_ACTS, frozenset({(64, 64), (128, 128)}), _HALF | _FP8, fp8_activations=_GLUON_FP8_ACTS
    ),
    ("gluon", 9, "bwd"): Support(_GLUON_ACTS, frozenset({(64, 64), (128, 128)}), _HALF),
    ("cute", 9, "bwd"): Support(_CUTE_ACTS, frozenset({(64, 64), (128, 128)}), _HALF),
    ("cute", 9, "fwd"): Support(_CUTE_ACTS, frozenset({(64, 64), (128, 128)}), _HALF),
}

# (backend, arch major, direction) -> (module, entry point)
KERNELS: dict[tuple[str, int, str], tuple[str, str]] = {
    ("gluon", 9, "fwd"): ("ads_gdpa.gluon.fwd_sm90", "gdpa_fwd_gluon"),
    ("gluon", 9, "bwd"): ("ads_gdpa.gluon.bwd_sm90", "gdpa_bwd_gluon"),
    ("cute", 9, "bwd"): ("ads_gdpa.cute.bwd_sm90", "gdpa_bwd_cute"),
    ("cute", 9, "fwd"): ("ads_gdpa.cute.fwd_sm90", "gdpa_fwd_cute"),
}


@dataclass(frozen=True)
class Prefer:
    """Where auto takes a backend over the one below it in the order: the shape class in which it was
    measured faster (BENCHMARKS.md)."""

    head_dims: frozenset[tuple[int, int]]
    min_keys: int  # the call's max_seqlen_k at least

    def matches(self, call: Call) -> bool:
        return (call.d_qk, call.d_v) in self.head_dims and call.max_k >= self.min_keys


# (backend, arch major, direction) -> where auto prefers it to Gluon, given its table covers the call
# and it is installed: the shape class where it measured faster (BENCHMARKS.md, "The dispatch rule");
# at 256 keys or fewer the two tie, and D=64 was not timed. (The CuTe backward's own switch of its dQ
# staging at 256 keys, ``cute.bwd_sm90.COL8_MIN_KEYS``, is a separate measurement.)
PREFER: dict[tuple[str, int, str], Prefer] = {
    ("cute", 9, "bwd"): Prefer(frozenset({(128, 128)}), min_keys=257),
}


@functools.lru_cache(maxsize=1)
def cute_importable() -> bool:
    """Whether the CuTe DSL (the optional ``cute`` extra) imports here; asked once."""
    try:
        importlib.import_module("cutlass.cute")
    except ImportError:
        return False
    return True


def _arch(device: torch.device) -> int | None:
    if device.type != "cuda" or interpreter_active():
        return None
    cc = sm_version(device)
    return None if cc is None else cc[0]


def backend_for(direction: str, device: torch.device, call: Call) -> str:
    """ "cute", "gluon" or "triton" for a call: the fast path where the backend switch allows it, the
    GPU's architecture has a kernel and its support table covers the call; Triton otherwise. CuTe
    also needs the DSL installed; auto takes it where ``PREFER`` says, ``cute`` wherever it covers
    the call; where it does not apply, the call goes to Gluon or Triton as auto would send it."""
    wanted = cfg.backend() if direction == "fwd" else cfg.bwd_backend()
    if wanted == "triton":
        return "triton"
    arch = _arch(device)
    key = ("cute", arch, direction)
    cute_covers = arch is not None and key in SUPPORT and SUPPORT[key].covers(call)
    preferred = wanted == "cute" or (wanted == "auto" and key in PREFER and PREFER[key].matches(call))
    if cute_covers and preferred and cute_importable():
        return "cute"
    key = ("gluon", arch, direction)
    if arch is None or key not in SUPPORT or not _gluon_importable():
        return "triton"
    return "gluon" if SUPPORT[key].covers(call) else "triton"


def kernel(backend: str, device: torch.device, direction: str):
    """The entry point of ``backend``'s kernel for ``device``'s architecture (imported on first use)."""
    module, name = KERNELS[(backend, _arch(device), direction)]
    return getattr(importlib.import_module(module), name)
