"""Test data and test-time helpers shared by every package's suite."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence

import torch

from ads_kernel_tools.capability import interpreter_active


def device_for_tests() -> str:
    """ "cuda" when a GPU is present, else "cpu" (Triton kernels then need TRITON_INTERPRET=1)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def randn(
    shape: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    scale: float = 1.0,
) -> torch.Tensor:
    """Seeded normal samples drawn on the CPU in fp32 (identical on every machine), then moved."""
    x = torch.randn(tuple(shape), generator=make_generator(seed), dtype=torch.float32) * scale
    return x.to(device=device, dtype=dtype)


def jagged_lengths(batch: int, max_len: int, sparsity: float, *, seed: int = 0) -> list[int]:
    """Sequence lengths by the upstream benchmark rule (``sparsity`` is really a fill fraction).

    For s >= 0.5 lengths are uniform on [(2s-1)·max_len, max_len] (mean s·max_len, s=1 all full);
    for s < 0.5 uniform on [1, 2s·max_len]. The low end is at least 1.
    """
    if batch < 0 or max_len < 1:
        raise ValueError(f"need batch >= 0 and max_len >= 1, got batch={batch}, max_len={max_len}")
    if not 0.0 < sparsity <= 1.0:
        raise ValueError(f"sparsity must be in (0, 1], got {sparsity}")
    if sparsity >= 0.5:
        low, high = round((2 * sparsity - 1) * max_len), max_len
    else:
        low, high = 1, round(2 * sparsity * max_len)
    low = max(low, 1)
    high = max(high, low)
    gen = make_generator(seed)
    return torch.randint(low, high + 1, (batch,), generator=gen).tolist()


def lengths_to_offsets(
    lengths: Sequence[int] | torch.Tensor,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """(B,) lengths -> (B+1,) exclusive prefix sums [0, L0, L0+L1, ...]."""
    lens = torch.as_tensor(lengths, dtype=torch.int64).flatten()
    if (lens < 0).any():
        raise ValueError("lengths must be non-negative")
    offsets = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lens, 0)
    return offsets.to(device=device, dtype=dtype)


def edge_lengths(tile: int, long: int | None = None) -> list[int]:
    """The lengths that break tiled kernels: empty, one, around one tile, and a long one."""
    long = long if long is not None else 3 * tile + 5
    return [0, 1, tile - 1, tile, tile + 1, long]


def poisoned_empty(shape: Sequence[int], *, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """An output buffer filled with NaN, so any element a kernel forgets to write stays visible."""
    return torch.full(tuple(shape), math.nan, dtype=dtype, device=device)


def assert_rows_written(out: torch.Tensor, valid_rows: torch.Tensor, *, name: str = "out") -> None:
    """Every valid row (dim 0) is finite and every other row still holds its NaN poison."""
    valid_rows = valid_rows.to(device=out.device, dtype=torch.bool).flatten()
    if valid_rows.numel() != out.shape[0]:
        raise ValueError(f"valid_rows has {valid_rows.numel()} entries, out has {out.shape[0]} rows")
    flat = out.detach().reshape(out.shape[0], -1).float()
    finite = torch.isfinite(flat).all(dim=1)
    untouched = torch.isnan(flat).all(dim=1)
    missing = (valid_rows & ~finite).nonzero().flatten().tolist()
    clobbered = (~valid_rows & ~untouched).nonzero().flatten().tolist()
    problems = []
    if missing:
        problems.append(f"{len(missing)} valid rows not (finitely) written, first {missing[:8]}")
    if clobbered:
        problems.append(f"{len(clobbered)} rows written that should not be, first {clobbered[:8]}")
    if problems:
        raise AssertionError(f"{name}: " + "; ".join(problems))


def assert_memcheck_clean(
    script: str | os.PathLike,
    *,
    done_marker: str,
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> None:
    """Run ``python script`` under ``compute-sanitizer --tool memcheck``; pass when it exits 0, prints
    ``done_marker`` (so a script that stopped early cannot pass) and memcheck reports 0 errors.
    Skips the calling test when compute-sanitizer is not installed. ``env`` adds variables."""
    import pytest

    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not installed")
    done = subprocess.run(
        # API errors are not memory errors: cuda-python probes driver entry points the driver lacks
        # (cuGetProcAddress answers "invalid argument"), which memcheck would count otherwise
        [tool, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "3", sys.executable,
         str(script)],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})),
    )  # fmt: skip
    report = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0 and done_marker in done.stdout, report
    assert "ERROR SUMMARY: 0 errors" in done.stdout + done.stderr, report


# --- Triton interpreter fixes --------------------------------------------------------------------
# The interpreter keeps bf16 tensors as raw uint16 words and its dot hands them straight to numpy,
# which multiplies the integers (errors around 1e10). The fix widens bf16 operands to float32 first:
# a bf16 word is the top half of the float32 with the same value, so (bits << 16) viewed as float32
# is exact.

# Second fix: the interpreter's fp32 -> bf16 cast truncates (rounds toward zero) where the GPU rounds
# to nearest even. The bias that truncation adds costs bf16 attention gradients several dB of SNR, a
# failure that does not exist on hardware, so casts are rounded the way the GPU does.

_PATCH_ATTR = "_ads_bf16_dot_patched"


def _bf16_words_to_f32(data):
    import numpy as np

    return (data.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _patched_create_dot(original):
    import triton.language as tl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            from triton.runtime.interpreter import TensorHandle

            if a.dtype.scalar == tl.bfloat16:
                a = TensorHandle(_bf16_words_to_f32(a.data), tl.float32)
            if b.dtype.scalar == tl.bfloat16:
                b = TensorHandle(_bf16_words_to_f32(b.data), tl.float32)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot.__wrapped__ = original
    return create_dot


def _f32_to_bf16_words_rne(data):
    import numpy as np

    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # keep NaN a quiet NaN: adding the rounding bias could carry a NaN payload into infinity
    return np.where(np.isnan(data), np.uint16(0x7FC0), rounded)


def _patched_cast_impl(original):
    import triton.language as tl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            from triton.runtime.interpreter import TensorHandle

            return TensorHandle(_f32_to_bf16_words_rne(src.data), tl.bfloat16)
        return original(self, src, dst_type)

    cast_impl.__wrapped__ = original
    return cast_impl


# Fourth fix: casts to fp8 (e4m3 / e5m2) round the mantissa without carrying into the exponent, so
# 0.49 becomes 0.25 instead of 0.5, and overflow is not saturated as the GPU's satfinite conversion
# does. torch's own fp8 casts round to nearest even; e4m3 is clamped to ±448 first, as on the GPU.


def _fp8_words(handle, dst_scalar):
    import numpy as np
    import torch
    import triton.language as tl

    src = handle.dtype.scalar
    data = handle.data
    if src == tl.bfloat16:
        values = _bf16_words_to_f32(data)
    else:
        values = np.ascontiguousarray(data).astype(np.float32)
    t = torch.from_numpy(np.ascontiguousarray(values))
    if dst_scalar == tl.float8e4nv:
        t = torch.where(torch.isnan(t), t, t.clamp(-448.0, 448.0))
        return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    return t.to(torch.float8_e5m2).view(torch.uint8).numpy()


def _patched_fp_to_fp(original):
    import triton.language as tl

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        dst = dst_type.scalar
        if dst in (tl.float8e4nv, tl.float8e5) and src.dtype.scalar in (tl.float32, tl.float16, tl.bfloat16):
            from triton.runtime.interpreter import TensorHandle

            return TensorHandle(_fp8_words(src, dst), dst)
        return original(self, src, dst_type, rounding_mode)

    create_fp_to_fp.__wrapped__ = original
    return create_fp_to_fp


# Third fix: a runtime scalar (a kernel argument, or a value loaded from memory) used as a loop bound
# reaches int() as a one-element 1-D numpy array, which numpy 2 refuses ("only 0-dimensional arrays
# can be converted to Python scalars"), so `for i in range(n)` fails in the interpreter alone.


def _patched_lang_tensor(original):
    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.__wrapped__ = original
    return patch_lang_tensor


def _builder_class():
    from triton.runtime import interpreter

    return interpreter.InterpreterBuilder


def bf16_dot_patched() -> bool:
    return getattr(_builder_class(), _PATCH_ATTR, False)


def apply_interpreter_patches(force: bool = False) -> bool:
    """Install the interpreter fixes (bf16 dot, round-to-nearest-even bf16 and fp8 casts, runtime loop
    bounds) into Triton's interpreter (idempotent).

    Does nothing unless TRITON_INTERPRET=1 (or ``force``): compiled kernels never see it.
    Returns whether the patch is in place afterwards.
    """
    if not (force or interpreter_active()):
        return False
    from triton.runtime import interpreter

    cls = _builder_class()
    if not getattr(cls, _PATCH_ATTR, False):
        cls.create_dot = _patched_create_dot(cls.create_dot)
        cls.cast_impl = _patched_cast_impl(cls.cast_impl)
        cls.create_fp_to_fp = _patched_fp_to_fp(cls.create_fp_to_fp)
        interpreter._patch_lang_tensor = _patched_lang_tensor(interpreter._patch_lang_tensor)
        # create_fp_trunc and the other cast entry points call self.cast_impl, so they follow the patch
        setattr(cls, _PATCH_ATTR, True)
    return True


def remove_interpreter_patches() -> None:
    from triton.runtime import interpreter

    cls = _builder_class()
    if getattr(cls, _PATCH_ATTR, False):
        cls.create_dot = cls.create_dot.__wrapped__
        cls.cast_impl = cls.cast_impl.__wrapped__
        cls.create_fp_to_fp = cls.create_fp_to_fp.__wrapped__
        interpreter._patch_lang_tensor = interpreter._patch_lang_tensor.__wrapped__
        setattr(cls, _PATCH_ATTR, False)


@contextlib.contextmanager
def interpreter_bf16_dot_patch(force: bool = False) -> Iterator[bool]:
    """Context manager form; restores the previous state on exit."""
    was = bf16_dot_patched()
    active = apply_interpreter_patches(force=force)
    try:
        yield active
    finally:
        if not was and active:
            remove_interpreter_patches()
