"""What the current machine can run.

Everything here is cheap and cached where it queries the driver. Tests can pretend to be another GPU
with ``ADS_SM_OVERRIDE="9.0"`` (or ``"none"`` for no GPU), which is read on every call so that a
``monkeypatch.setenv`` takes effect immediately.
"""

from __future__ import annotations

import functools

import torch

from ads_kernel_tools import envvars

SM_OVERRIDE_ENV = "ADS_SM_OVERRIDE"


def interpreter_active() -> bool:
    """True when Triton kernels run through the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return envvars.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _device_index(device: torch.device | str | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _parse_override(text: str) -> tuple[int, int] | None:
    if text.strip().lower() in ("", "none", "cpu"):
        return None
    major, _, minor = text.strip().partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(
            f"{SM_OVERRIDE_ENV}={text!r}: expected 'MAJOR.MINOR' (e.g. '9.0') or 'none'"
        ) from None


def sm_version(device: torch.device | str | int | None = None) -> tuple[int, int] | None:
    """Compute capability ``(major, minor)`` of ``device``; None without CUDA.

    ``ADS_SM_OVERRIDE`` takes precedence so CPU tests can exercise per-architecture dispatch.
    """
    override = envvars.get(SM_OVERRIDE_ENV)
    if override is not None:
        return _parse_override(override)
    if not torch.cuda.is_available():
        return None
    return _cuda_capability(_device_index(device))


def num_sms(device: torch.device | str | int | None = None) -> int:
    """Real multiprocessor count (132 on an H100/H200 SXM); 1 without CUDA so grids stay valid."""
    if not torch.cuda.is_available():
        return 1
    return _cuda_sm_count(_device_index(device))


def is_hopper(device: torch.device | str | int | None = None) -> bool:
    cc = sm_version(device)
    return cc is not None and cc[0] == 9


def is_blackwell(device: torch.device | str | int | None = None) -> bool:
    cc = sm_version(device)
    return cc is not None and cc[0] in (10, 11, 12)


def has_tma(device: torch.device | str | int | None = None) -> bool:
    """Bulk tensor copies (TMA) exist from sm_90 on; the interpreter emulates descriptor loads too,
    but kernels should not rely on that for speed, so this answers for real hardware only."""
    cc = sm_version(device)
    return cc is not None and cc >= (9, 0)


def has_fp8(device: torch.device | str | int | None = None) -> bool:
    """FP8 (e4m3/e5m2) tensor-core math: sm_89 (Ada) and sm_90+."""
    cc = sm_version(device)
    return cc is not None and cc >= (8, 9)


@functools.cache
def gluon_importable() -> bool:
    """Triton's Gluon (``triton.experimental.gluon``, triton >= 3.5) is installed. Asked once and
    without importing it: the lookup would cost host time on every call of a dispatch predicate."""
    import importlib.util

    return importlib.util.find_spec("triton.experimental.gluon") is not None


def gluon_sm90_reason(t: torch.Tensor | torch.device) -> str | None:
    """None when tensor ``t``'s device (or the device ``t``) can run a Gluon sm_90 (Hopper) kernel,
    else why not: "interpreter" (``TRITON_INTERPRET=1``), "not an sm_90 GPU" (the real device's
    capability; ``ADS_SM_OVERRIDE`` is not consulted, as a kernel would really be launched) or
    "triton.experimental.gluon missing". The device checks every package's Gluon support predicate
    ends with."""
    if interpreter_active():
        return "interpreter"
    device = t if isinstance(t, torch.device) else t.device
    if device.type != "cuda" or _cuda_capability(_device_index(device)) != (9, 0):
        return "not an sm_90 GPU"
    if not gluon_importable():
        return "triton.experimental.gluon missing"
    return None


def gpu_name(device: torch.device | str | int | None = None) -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    return torch.cuda.get_device_name(_device_index(device))


def require(
    op: str,
    *,
    min_sm: tuple[int, int] = (8, 0),
    tma: bool = False,
    fp8: bool = False,
    device: torch.device | str | int | None = None,
) -> None:
    """Raise a RuntimeError naming ``op``, what it needs and the GPU found, if the need is not met.

    Under the Triton interpreter every requirement is waived: kernels then run on the CPU.
    """
    if interpreter_active():
        return
    cc = sm_version(device)
    needs = [f"compute capability >= {min_sm[0]}.{min_sm[1]}"]
    if tma:
        needs.append("TMA (sm_90+)")
    if fp8:
        needs.append("FP8 tensor cores (sm_89+)")
    if cc is None:
        raise RuntimeError(
            f"{op} needs a CUDA GPU with {', '.join(needs)}; none was found "
            "(set TRITON_INTERPRET=1 to run the Triton kernels on the CPU)"
        )
    ok = cc >= min_sm and (not tma or has_tma(device)) and (not fp8 or has_fp8(device))
    if not ok:
        raise RuntimeError(f"{op} needs {', '.join(needs)}; found {gpu_name(device)} (sm_{cc[0]}{cc[1]})")
