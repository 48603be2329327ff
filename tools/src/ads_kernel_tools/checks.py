"""Scalar arguments of the public APIs (scales, eps, softcap, sequence bounds, window sides), and
index vectors (offsets, lengths, indices), checked one way in every package.

``real`` takes any ``numbers.Real`` and ``integer`` any ``numbers.Integral``, Python and NumPy
scalars alike (``numpy.float32(0.125)`` is as good a scale as ``0.125``). Both refuse:

* a bool: ``True`` is an int to Python, but as a scale or a length it is a bug;
* a string or bytes: ``float("0.5")`` would parse it;
* NaN and ±inf (``real``): one non-finite scale makes every output row non-finite;
* a non-integral real (``integer``): ``12.7`` and ``12.0`` are refused, never truncated.

``integer`` also takes a ``torch.SymInt`` (a length traced symbolically) and returns it unconverted,
so that it stays symbolic; ``minimum`` then compares it (a guard). A bad value raises ValueError
naming the argument, the rule and the value, after the caller's prefix, e.g.
``lp_fa4: softmax_scale must be None or a finite real number, got nan``.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["index_vector", "integer", "nonnegative_values", "real"]


def _got(value: object) -> str:
    if value is None or (isinstance(value, numbers.Number) and not isinstance(value, bool)):
        return repr(value)
    return f"{type(value).__name__} {value!r}"  # "str '0.5'", "bool True": the type is the reason


def _rule(kind: str, minimum, exclusive_minimum, allow_none: bool) -> str:
    if minimum is not None:
        kind += f" >= {minimum}"
    if exclusive_minimum is not None:
        kind += f" > {exclusive_minimum}"
    return f"None or {kind}" if allow_none else kind


def real(
    name: str,
    value: object,
    *,
    prefix: str = "",
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a finite float, or None when it is None and ``allow_none``.

    Args:
        name: the argument's name in the message.
        value: a ``numbers.Real`` (not a bool), finite.
        prefix: put before the message, e.g. ``"ads_gdpa: "``.
        minimum: the value must be >= it; ``exclusive_minimum``: must be > it.
        allow_none: None is accepted (and returned): the caller's default applies.

    Raises:
        ValueError: ``"{prefix}{name} must be a finite real number[ >= minimum][ > exclusive_minimum],
            got {value}"`` ("must be None or ..." with ``allow_none``).
    """
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        try:
            out = float(value)
        except OverflowError:  # an int too large for a float
            ok = False
        else:
            ok = math.isfinite(out)
            ok = ok and (minimum is None or out >= minimum)
            ok = ok and (exclusive_minimum is None or out > exclusive_minimum)
    if not ok:
        rule = _rule("a finite real number", minimum, exclusive_minimum, allow_none)
        raise ValueError(f"{prefix}{name} must be {rule}, got {_got(value)}")
    return out


def integer(
    name: str,
    value: object,
    *,
    prefix: str = "",
    minimum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """``value`` as an int (a ``torch.SymInt`` as is), or None when it is None and ``allow_none``.

    Args:
        name: the argument's name in the message.
        value: a ``numbers.Integral`` (not a bool) or a ``torch.SymInt``.
        prefix: put before the message, e.g. ``"lp_fa4: "``.
        minimum: the value must be >= it.
        allow_none: None is accepted (and returned): the caller's default applies.

    Raises:
        ValueError: ``"{prefix}{name} must be an integer[ >= minimum], got {value}"`` ("must be None
            or ..." with ``allow_none``).
    """
    if value is None and allow_none:
        return None
    symbolic = isinstance(value, torch.SymInt)
    ok = symbolic or (isinstance(value, numbers.Integral) and not isinstance(value, bool))
    if ok and minimum is not None:
        ok = value >= minimum
    if not ok:
        rule = _rule("an integer", minimum, None, allow_none)
        raise ValueError(f"{prefix}{name} must be {rule}, got {_got(value)}")
    # int() only where needed: a plain int (or what torch.compile traces as one) passes through untouched
    return value if symbolic or type(value) is int else int(value)


def nonnegative_values(
    tensors: dict[str, torch.Tensor | None], *, prefix: str = "", device: bool, cpu: bool = True
) -> None:
    """Every value of the named tensors is finite and >= 0 (FP8 descales: amax / 448 is). Tensors on
    a device are read when ``device`` is true (``ADS_CHECK_INPUTS=1``: their values cost a host sync,
    one for all of them), CPU tensors when ``cpu`` is (default: always). None, empty, meta and fake
    tensors are skipped, and so is a call under torch.compile's tracing (no data to read there).

    Raises:
        ValueError: ``"{prefix}{name} must be finite and >= 0, got [first values]"``.
    """
    if not (device or cpu) or torch.compiler.is_compiling():  # nothing to read: every call's fast exit
        return
    from torch._subclasses.fake_tensor import is_fake

    given = {
        name: t
        for name, t in tensors.items()
        if t is not None
        and t.numel()
        and t.device.type != "meta"
        and not is_fake(t)
        and (cpu if t.device.type == "cpu" else device)
    }
    if not given:
        return
    bad = torch.stack([(~torch.isfinite(t) | (t < 0)).any() for t in given.values()]).tolist()
    for (name, t), is_bad in zip(given.items(), bad):
        if is_bad:
            shown = t.detach().flatten()[:8].float().tolist()
            raise ValueError(f"{prefix}{name} must be finite and >= 0, got {shown}")


_INDEX_DTYPES = (torch.int32, torch.int64)


def index_vector(
    name: str,
    t: object,
    *,
    length: int | None = None,
    device: torch.device | None = None,
    device_of: str = "q",
    prefix: str = "",
) -> torch.Tensor:
    """``t`` checked to be a 1-D int32 or int64 tensor (of ``length`` entries, on ``device``,
    where given; ``device_of`` names the tensor it must share that device with) and returned
    contiguous. Kernels read offsets, lengths and indices by position, so a strided view (a column
    of a matrix, ``t[::2]``) would be read as the wrong entries, silently; a contiguous ``t`` comes
    back as itself. ValueError naming ``name`` otherwise. Reads no values (no device sync)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{prefix}{name} must be a 1-D int32 or int64 tensor, got {got}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{prefix}{name} must have {length} entries, got {t.shape[0]}")
    if device is not None and t.device != device:
        raise ValueError(f"{prefix}{name} is on {t.device}, {device_of} on {device}")
    return t.contiguous()
