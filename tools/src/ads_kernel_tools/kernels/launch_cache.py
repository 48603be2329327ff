"""Relaunching a compiled Triton / Gluon kernel without Triton's per-call argument binding.

``kernel[grid](*args, **kw)`` costs tens of microseconds of host time before the launch itself:
Triton binds the arguments, specialises each one (pointer alignment, integers equal to 1 or
divisible by 16, descriptor types with their layouts' text), hashes the result and looks the
compiled kernel up. Where the GPU work of a call is a few hundred microseconds, that host time can
bound a loop of calls. ``LaunchCache`` keeps the compiled kernel of each specialisation under a key
it computes itself from the same properties (:func:`spec_key`) and, on a hit, calls the compiled
kernel's launcher directly, with the arguments in the kernel's parameter order, as Triton's own
``JITFunction.run`` does after its lookup. A miss, or an argument whose type the key does not know,
takes Triton's path (which compiles where needed).

What the key covers: tensors by dtype and 16-byte alignment of their data pointer; Python ints by
equality to 1, divisibility by 16 and width (i32, i64, u64); floats, bools and None by type (bools by value);
Gluon host tensor descriptors by dtype, block shape and layout; constexpr parameters (passed by
keyword or by position) and option keywords by value; the current device. What it does not:
Triton's debug and instrumentation knobs and global values a kernel reads (set them before the first
launch), and pre-run hooks (none in this project's kernels).

``ADS_LAUNCH_CACHE=0`` sends every launch that does not choose for itself through Triton (A/B runs);
a package's own switch, passed as ``cached=``, takes precedence.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ads_kernel_tools import envvars
from ads_kernel_tools.capability import interpreter_active

__all__ = ["LaunchCache", "enabled", "spec_key"]

_UNKNOWN = object()


def _relaunch_supported() -> bool:
    """The direct relaunch follows Triton 3.6's ``JITFunction.run`` and launcher signature: other
    versions take Triton's path every time."""
    try:
        import triton
    except ImportError:  # pragma: no cover - the kernels need Triton anyway
        return False
    return triton.__version__.split(".")[:2] == ["3", "6"]


_RELAUNCH = _relaunch_supported()


def _int_width(a: int) -> int:
    """Triton's integer argument types: i32, i64, u64 (0, 1, 2)."""
    if -(2**31) <= a < 2**31:
        return 0
    return 1 if -(2**63) <= a < 2**63 else 2


def _descriptor_types() -> tuple[type, ...]:
    types = []
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        types.append(GluonDescriptor)
    except ImportError:  # pragma: no cover - Triton without Gluon
        pass
    return tuple(types)


_DESCRIPTORS = _descriptor_types()


def _arg_key(a: Any) -> Any:
    """What Triton's specialisation of one runtime argument depends on, or ``_UNKNOWN``."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    if a is None or isinstance(a, float):
        return type(a)
    if isinstance(a, bool):  # before int: a bool is an int
        return a
    if isinstance(a, int):
        return (int, a == 1, a & 15 == 0, _int_width(a))
    if _DESCRIPTORS and isinstance(a, _DESCRIPTORS):
        return (a.base.dtype, tuple(a.block_shape), a.layout, a.padding)
    return _UNKNOWN


def enabled() -> bool:
    """``ADS_LAUNCH_CACHE``: ``1`` (default) relaunches compiled kernels directly where a launch does
    not say otherwise; ``0`` takes Triton's path every time."""
    value = envvars.get("ADS_LAUNCH_CACHE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"ADS_LAUNCH_CACHE must be 0 or 1, got {value!r}")
    return value == "1"


_TENSOR = torch.Tensor
_NONE = type(None)
_DESCRIPTOR = _DESCRIPTORS[0] if _DESCRIPTORS else _NONE
_I32 = (-(2**31), 2**31)


def spec_key(args: tuple, kwargs: dict, constexpr_at: frozenset[int] = frozenset()) -> tuple | None:
    """The cache key of one launch (positional arguments, constexpr / option keywords), or None where
    an argument's type is not covered (the caller then takes Triton's path). ``constexpr_at``: the
    positions of constexpr parameters among ``args``, keyed by value (Triton compiles them in).
    Keywords are keyed in the order given (a call site that reorders them only adds an entry).

    This runs on every launch, so the common exact types (tensor, int, descriptor, float, None) are
    keyed inline, as ``_arg_key`` would key them; anything else goes through ``_arg_key``."""
    keys = []
    add = keys.append
    lo, hi = _I32
    for i, a in enumerate(args):
        t = type(a)
        if constexpr_at and i in constexpr_at:
            try:
                hash(a)
            except TypeError:
                return None
            add(("constexpr", a))
        elif t is _TENSOR:
            add((a.dtype, not a.data_ptr() & 15))
        elif t is int:
            add((int, a == 1, not a & 15, 0 if lo <= a < hi else _int_width(a)))
        elif t is _DESCRIPTOR:
            add((a.base.dtype, tuple(a.block_shape), a.layout, a.padding))
        elif t is float or t is _NONE:
            add(t)
        else:
            k = _arg_key(a)
            if k is _UNKNOWN:
                return None
            add(k)
    for v in kwargs.values():  # by keyword only constants: a tensor would be keyed (and kept) by value
        if type(v) is _TENSOR or type(v) is _DESCRIPTOR:
            return None
    return (_current_device(), tuple(keys), tuple(kwargs.items()))


def _is_constexpr(param: inspect.Parameter) -> bool:
    """As Triton reads a parameter's kind: its annotation (object or string) names constexpr."""
    ann = param.annotation
    return ann is not inspect.Parameter.empty and "constexpr" in (ann if isinstance(ann, str) else repr(ann))


def _current_device() -> int:
    return torch.cuda.current_device()


def _current_stream() -> int:
    """The stream Triton would launch on: the current device's current stream."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(driver.active.get_current_device())


def _launch_hooks() -> tuple:
    from triton import knobs

    return knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook


class LaunchCache:
    """``LaunchCache(fn).launch(grid, args, kwargs)`` launches ``fn[grid](*args, **kwargs)``.

    ``fn`` is a ``@triton.jit`` / ``@gluon.jit`` function; ``args`` its leading arguments in order,
    ``kwargs`` the rest by name and launch options (``num_warps``...). The first launch of each
    :func:`spec_key` goes through Triton; later ones reuse its compiled kernel. ``cached=False``
    always takes Triton's path (A/B runs), ``None`` (default) follows :func:`enabled`; Triton's
    interpreter and Triton versions other than 3.6 always take Triton's path."""

    def __init__(self, fn: Callable, max_entries: int = 64) -> None:
        self.fn = fn
        self.max_entries = max_entries
        # key -> (compiled kernel, the values of the parameters after the positional ones: keywords
        # and defaults, which the key fixes)
        self._kernels: dict[tuple, tuple[Any, tuple]] = {}
        params = inspect.signature(fn.fn).parameters
        self._names = tuple(params)
        self._defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        self._constexpr_at = frozenset(i for i, p in enumerate(params.values()) if _is_constexpr(p))

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict, *, cached: bool | None = None) -> None:
        if cached is None:
            cached = enabled()
        usable = cached and _RELAUNCH and not interpreter_active()
        key = spec_key(args, kwargs, self._constexpr_at) if usable else None
        entry = self._kernels.get(key) if key is not None else None
        if entry is None:
            kernel = self.fn[grid](*args, **kwargs)
            if key is not None and len(self._kernels) < self.max_entries:
                tail = self._names[len(args) :]
                self._kernels[key] = (
                    kernel,
                    tuple(kwargs[n] if n in kwargs else self._defaults[n] for n in tail),
                )
            return
        self._run(entry[0], grid, args, entry[1])

    def _run(self, kernel, grid, args, tail: tuple) -> None:
        """What ``JITFunction.run`` does once it has found the compiled kernel: every parameter's
        value in order (constexprs included; the launcher skips them; ``tail`` the values of those
        after ``args``), the current stream, the launch hooks and their metadata."""
        bound = args + tail
        stream = _current_stream()
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        run = kernel.run  # after the first launch: the handles are loaded
        enter, leave = _launch_hooks()
        # what ``launch_metadata`` returns without an enter hook, without its call
        meta = kernel.launch_metadata(grid, stream, *bound) if enter is not None else None
        run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, meta, enter, leave, *bound)
