"""Jagged-batch offsets: the one validator every package uses, and the ``ADS_CHECK_INPUTS`` switch.

Offsets are B+1 prefix sums: sequence b owns rows ``[offsets[b], offsets[b+1])`` of a (T, ...) tensor.
Their values can only be checked where they are host data: CPU offsets, or a host copy the caller
passes. Device offsets are not read on the hot path (reading them is a device sync); with
``ADS_CHECK_INPUTS=1`` every package copies them to the host once per call and runs the same checks,
raising the same ValueError, which is what a user debugging a wrong answer wants. Independently of
this switch the kernels clamp every span to its tensor (``ads_kernel_tools.kernels.offsets``), so bad
device offsets give wrong numbers, never an access outside a tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from ads_kernel_tools import envvars

__all__ = [
    "CHECK_INPUTS_ENV",
    "check_inputs_enabled",
    "validate_offsets",
    "host_values",
    "host_copy",
    "lengths",
]

CHECK_INPUTS_ENV = "ADS_CHECK_INPUTS"
_TRUE = ("1", "true", "yes", "on")


def check_inputs_enabled() -> bool:
    """True when ``ADS_CHECK_INPUTS`` is 1/true/yes/on: validate device offsets with one sync per call.
    Read on every call so that a test's ``monkeypatch.setenv`` takes effect at once."""
    return envvars.get(CHECK_INPUTS_ENV, "0").strip().lower() in _TRUE


def host_values(offsets: torch.Tensor | np.ndarray | list | tuple) -> np.ndarray:
    """Offsets as an int64 numpy array; a CUDA tensor is copied to the host (a sync: call only when
    the values are wanted, e.g. under ``check_inputs_enabled()``)."""
    if isinstance(offsets, torch.Tensor):
        return offsets.detach().to("cpu", torch.int64).numpy()
    return np.asarray(offsets, dtype=np.int64)


def host_copy(name: str, offsets, cpu_copy, *, prefix: str = "") -> torch.Tensor | None:
    """Check an offsets tensor's metadata (1-D, B+1 >= 1 entries, int32/int64) and return its host
    copy as a CPU int64 tensor when one exists: ``cpu_copy`` (a CPU tensor, list or array with the
    same entry count) or the offsets themselves when they live on the CPU; None for device offsets
    without a copy (their values are then not read). ValueError, messages prefixed with ``prefix``,
    on bad metadata. Values are not checked here (``validate_offsets`` does that)."""

    def err(msg: str) -> ValueError:
        return ValueError(prefix + msg)

    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.shape[0] < 1:
        raise err(f"{name} must be a 1-D tensor of B+1 offsets")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise err(f"{name} must be int32 or int64, got {offsets.dtype}")
    if cpu_copy is None:
        return offsets.to(torch.int64) if offsets.device.type == "cpu" else None
    if isinstance(cpu_copy, torch.Tensor):
        if cpu_copy.device.type != "cpu":
            raise err(f"{name}_cpu must live on the CPU, got {cpu_copy.device}")
        host = cpu_copy.to(torch.int64)
    else:  # through numpy: torch.as_tensor took ~150 us for a list of 1153 ints (H200 host)
        host = torch.from_numpy(np.asarray(cpu_copy, dtype=np.int64))
    if host.dim() != 1 or host.shape[0] != offsets.shape[0]:
        raise err(f"{name}_cpu has {tuple(host.shape)} entries, {name} has {offsets.shape[0]}")
    return host


def lengths(offsets) -> np.ndarray:
    """Per-sequence lengths (B,) of host offsets."""
    return np.diff(host_values(offsets))


def validate_offsets(
    name: str,
    offsets,
    rows: int,
    *,
    max_len: int | None = None,
    max_name: str = "the maximum",
    cover: bool = False,
    prefix: str = "",
) -> np.ndarray:
    """Check host offsets against a tensor of ``rows`` rows; return the per-sequence lengths.

    Rules: at least one entry; non-decreasing; every span inside [0, rows]; with ``cover`` the spans
    cover the tensor exactly (first 0, last ``rows``), for ops whose every row is one sequence's
    token; with ``max_len`` no sequence is longer (a kernel sized its tiles by it; ``max_name`` names
    that bound in the message, e.g. ``"max_seqlen_k"``).

    Raises:
        ValueError: naming ``name``, the rule broken and the values involved (``prefix`` first, e.g.
            ``"ads_gdpa: "``).
    """
    h = host_values(offsets)
    if h.ndim != 1 or h.size < 1:
        raise ValueError(f"{prefix}{name} must be a 1-D tensor of B+1 offsets, got shape {h.shape}")
    diffs = np.diff(h)
    if diffs.size and diffs.min() < 0:
        b = int(np.argmax(diffs < 0))
        raise ValueError(
            f"{prefix}{name} must be non-decreasing: "
            f"{name}[{b}] = {int(h[b])} > {name}[{b + 1}] = {int(h[b + 1])}"
        )
    first, last = int(h[0]), int(h[-1])
    if cover and (first != 0 or last != rows):
        raise ValueError(f"{prefix}{name} must start at 0 and end at T={rows}, got {first}..{last}")
    if first < 0 or last > rows:
        raise ValueError(f"{prefix}{name} spans [{first}, {last}] but the tensor has {rows} rows")
    if max_len is not None and diffs.size and int(diffs.max()) > max_len:
        b = int(np.argmax(diffs))
        raise ValueError(f"{prefix}{name}: sequence {b} has {int(diffs[b])} rows > {max_name}={max_len}")
    return diffs
