"""Compiled CuTe DSL kernels of ads-gdpa: built once per configuration, kept in memory for the process
and on disk for the next one.

``cute.compile`` never consults the DSL's own file cache, so without this every process paid the IR
build and the compile of each configuration (seconds). Here a kernel is compiled with TVM-FFI calling
(torch tensors go to the kernel as they are, the stream is the caller's current torch stream), its
host and device code exported to one object file, and a later process loads that file instead of
compiling. An entry's name hashes the compile key with everything that can change the generated code:
the sources of this package and of ``ads_kernel_tools``, the DSL, TVM-FFI and Python versions, and the
target architecture. Writes go to a temporary name renamed into place, so a killed process never
leaves half an entry; an entry that fails to load is compiled again and replaced.

Env (read in ``ads_gdpa.config``): ``ADS_GDPA_CUTE_CACHE=0`` keeps compiled kernels in memory only;
``ADS_GDPA_CUTE_CACHE_DIR`` moves the folder (default ``~/.cache/ads_gdpa/cute``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import cutlass
import cutlass.cute as cute

from .. import config as cfg

_FUNCTION = "kernel"
_IN_MEMORY: dict[tuple, Callable] = {}


@lru_cache(maxsize=1)
def _fingerprint() -> str:
    """What a cached kernel depends on besides its compile key."""
    import tvm_ffi

    import ads_kernel_tools

    h = hashlib.sha256()
    h.update(f"py{sys.version_info[0]}.{sys.version_info[1]}|cutlass={cutlass.__version__}".encode())
    h.update(f"|tvm_ffi={tvm_ffi.__version__}".encode())
    for package in (Path(__file__).resolve().parent.parent, Path(ads_kernel_tools.__file__).resolve().parent):
        for src in sorted(package.rglob("*.py")):
            h.update(src.relative_to(package).as_posix().encode())
            h.update(src.read_bytes())
    return h.hexdigest()[:24]


@lru_cache(maxsize=1)
def _load_runtime_libraries() -> None:
    # The exported object files resolve the DSL runtime's symbols at load time: make them global.
    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if Path(lib).exists():
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def target_arch() -> str:
    """The architecture the DSL compiles for: ``CUTE_DSL_ARCH`` where set (offline builds), else the
    current GPU's (sm_90a on Hopper)."""
    forced = cfg.cute_dsl_arch()
    if forced:
        return forced
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def _entry(key: tuple, arch: str) -> Path:
    digest = hashlib.sha256(repr((key, arch)).encode()).hexdigest()[:32]
    return cfg.cute_cache_dir() / _fingerprint() / f"{digest}.o"


def _load(path: Path) -> Callable | None:
    if not path.is_file():
        return None
    _load_runtime_libraries()
    try:
        return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), _FUNCTION)
    except Exception:  # a truncated or foreign entry is a miss: compile and replace it
        return None


def _store(fn, path: Path) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.o")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fn.export_to_c(object_file_path=str(tmp), function_name=_FUNCTION)
        os.replace(tmp, path)
    except OSError:  # a read-only, full or blocked cache folder costs the next process a compile
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def compiled(key: tuple, build: Callable[[], tuple]) -> Callable:
    """The kernel of ``key`` for ``target_arch()``: from this process's memory, else from the
    disk cache, else compiled. ``build()`` returns ``cute.compile``'s positional arguments (the kernel
    object, then its fake arguments with ``cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)``
    last)."""
    fn = _IN_MEMORY.get(key)
    if fn is not None:
        return fn
    use_disk = cfg.cute_disk_cache()
    path = _entry(key, target_arch()) if use_disk else None
    fn = _load(path) if use_disk else None
    if fn is None:
        fn = cute.compile(*build(), options="--enable-tvm-ffi")
        if use_disk:
            _store(fn, path)
    _IN_MEMORY[key] = fn
    return fn
