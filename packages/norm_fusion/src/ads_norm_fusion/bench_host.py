"""Host time per call, kernels stubbed: ``TRITON_INTERPRET=1 python -m ads_norm_fusion.bench_host``.

CPU tensors, the Triton launchers replaced by no-ops (the norm backward's kernel alone, so that its
launcher's allocations count), so what is timed is the Python and dispatch cost of one call: the
checks, the op or the eager autograd.Function, allocations. Not a GPU measurement. The forward runs
at ``--shape`` (default 8192 512 512); forward+backward at ``--bwd-shape`` (default 64 64 64),
because the backward's dense GEMMs (cuBLAS on a GPU) are real CPU work here and would swamp the
host time at larger shapes.
Each op is timed on the eager path and with the custom ops forced (``plain_eager`` patched to False).
``--launchers``: every launcher runs instead (configs, allocations, ``launch_cache`` keys, the
plain-eager autograd Functions), only the compiled kernels' launches are no-ops, and torch's own
``F.linear`` + norm step on the same CPU tensors is timed beside it: the closest CPU proxy of a GPU
host's time per call (use a small ``--bwd-shape``, e.g. 16 16 16, so that the CPU GEMMs stay small).
``--gluon``: ``linear_layernorm`` / ``linear_rmsnorm`` through the Gluon normalisation-partition
forward's host path instead (``ADS_NORM_FUSION_GLUON=on``, the device taken for an sm_90 GPU, the
compiled kernel's launcher a no-op): its predicate, exchange buffers, TMA descriptors and
``ads_kernel_tools.kernels.launch_cache`` key run as on a GPU, on CPU tensors.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from . import _ops
from .interface import linear_layernorm, linear_rmsnorm, rmsnorm_linear
from .triton import launch

_STUBBED = (
    "launch_rownorm",
    "launch_row_stat",
    "launch_scaled_gemm",
    "launch_rms_gemm",
    "launch_row_col_scale",
)


def _stub(gluon: bool = False) -> None:
    for name in _STUBBED[1:] if gluon else _STUBBED:
        setattr(_ops, name, lambda *a, **k: None)
    if gluon:  # the Triton kernels a call falls back to (and the wide-row backward) launch nothing
        launch._ROWNORM = _no_launch(launch._ROWNORM)
        launch._ROWNORM_PERSISTENT = _no_launch(launch._ROWNORM_PERSISTENT)
        _stub_gluon()
    launch._NORM_BWD = _no_launch(launch._NORM_BWD)  # its launcher's allocations and checks still run


class _NoKernel:
    """A compiled kernel whose launcher does nothing (the tools' ``kernels.launch_cache`` relaunches
    it)."""

    function = packed_metadata = None

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        return None


class _NoJit:
    """A jit function's surface (``fn``, ``fn[grid](...)``) whose launches compile nothing."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _NoKernel()


def _no_launch(cache):
    """``cache`` (a ``LaunchCache``) over a kernel that compiles and launches nothing; its key is
    still computed where the cache is active (``_stub_gluon``)."""
    from ads_kernel_tools.kernels.launch_cache import LaunchCache

    return LaunchCache(_NoJit(cache.fn.fn))


def _launch_cache_as_on_gpu() -> None:
    """The tools' launch cache keys and relaunches as on an sm_90 GPU (device 0, default stream)."""
    from ads_kernel_tools.kernels import launch_cache

    launch_cache.interpreter_active = lambda: False
    launch_cache._RELAUNCH = True
    launch_cache._current_device = lambda: 0
    launch_cache._current_stream = lambda: 0
    launch_cache._launch_hooks = lambda: (None, None)


def _stub_gluon() -> None:
    """The Gluon normalisation-partition forward as on an sm_90 GPU, minus the kernel."""
    from .gluon import dispatch, fwd_epi_sm90

    dispatch.device_reason = lambda x: None
    dispatch.num_sms = lambda device: 132
    _launch_cache_as_on_gpu()
    fwd_epi_sm90._LAUNCH = _no_launch(fwd_epi_sm90._LAUNCH)


def _stub_launches() -> None:
    """Every launcher's Python runs (as on an sm_90 GPU for the launch cache); only the compiled
    kernels' launches are no-ops."""
    from ads_kernel_tools.kernels import launch_cache

    _launch_cache_as_on_gpu()
    for name, obj in vars(launch).copy().items():
        if isinstance(obj, launch_cache.LaunchCache):
            setattr(launch, name, _no_launch(obj))


_TORCH_STEPS = {
    "linear_layernorm": lambda t: F.layer_norm(F.linear(t[0], t[1], t[2]), (t[1].shape[0],), t[3], t[4]),
    "linear_rmsnorm": lambda t: F.rms_norm(F.linear(t[0], t[1], t[2]), (t[1].shape[0],), t[3], 1e-6),
    "rmsnorm_linear": lambda t: F.linear(F.rms_norm(t[0], (t[0].shape[1],), t[5], 1e-6), t[1], t[2]),
}


def torch_step_us(op: str, bwd_shape, n: int = 300) -> float:
    """Median us of torch's unfused forward+backward of ``op`` on the same CPU tensors."""
    tb = _leaves(*bwd_shape)
    dy = torch.ones((bwd_shape[0], bwd_shape[2]), dtype=torch.bfloat16)
    inputs = [tb[i] for i in _INPUTS[op]]
    return _us(lambda: torch.autograd.grad(_TORCH_STEPS[op](tb), inputs, dy), n)


def _leaves(m: int, k: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = ((m, k), (n, k), (n,), (n,), (n,), (k,))
    return [torch.randn(s, generator=g).to(torch.bfloat16).requires_grad_() for s in shapes]


CALLS = {
    "linear_layernorm": lambda t: linear_layernorm(t[0], t[1], t[2], t[3], t[4]),
    "linear_rmsnorm": lambda t: linear_rmsnorm(t[0], t[1], t[2], t[3]),
    "rmsnorm_linear": lambda t: rmsnorm_linear(t[0], t[5], t[1], t[2]),
}
_INPUTS = {
    "linear_layernorm": (0, 1, 2, 3, 4),
    "linear_rmsnorm": (0, 1, 2, 3),
    "rmsnorm_linear": (0, 5, 1, 2),
}


def _us(fn, n: int, repeats: int = 7) -> float:
    for _ in range(max(n // 10, 5)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def measure(op: str, shape, bwd_shape, n: int = 300) -> dict[str, float]:
    """Median us per call: forward without grad, forward with grad (at shape), forward+backward."""
    call, idx = CALLS[op], _INPUTS[op]
    t = _leaves(*shape)
    plain = [a.detach() for a in t]
    out = {"fwd_nograd": _us(lambda: call(plain), n), "fwd_grad": _us(lambda: call(t), n)}
    tb = _leaves(*bwd_shape)
    dy = torch.ones((bwd_shape[0], bwd_shape[2]), dtype=torch.bfloat16)
    inputs = [tb[i] for i in idx]
    out["fwd_bwd"] = _us(lambda: torch.autograd.grad(call(tb), inputs, dy), n)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ads_norm_fusion.bench_host", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--shape", type=int, nargs=3, default=(8192, 512, 512), metavar=("M", "K", "N"))
    parser.add_argument("--bwd-shape", type=int, nargs=3, default=(64, 64, 64), metavar=("M", "K", "N"))
    parser.add_argument("-n", type=int, default=300, help="calls per sample (7 samples, median)")
    parser.add_argument("--gluon", action="store_true", help="the Gluon forward's host path (N %% 128 == 0)")
    parser.add_argument(
        "--launchers", action="store_true", help="run every launcher, only the compiled launches stubbed"
    )
    args = parser.parse_args(argv)
    if args.gluon:
        os.environ["ADS_NORM_FUSION_GLUON"] = "on"
    if args.launchers:
        _stub_launches()
        print(f"host us per step (fwd+bwd at {tuple(args.bwd_shape)}), launchers run, launches stubbed")
        for op in CALLS:
            ours = measure(op, args.bwd_shape, args.bwd_shape, args.n)["fwd_bwd"]
            print(f"{op:17s} ours {ours:7.1f}  torch {torch_step_us(op, args.bwd_shape, args.n):7.1f}")
        return 0
    _stub(args.gluon)
    eager = _ops.plain_eager
    print(
        f"host us per call, kernels stubbed; fwd at {tuple(args.shape)}, fwd+bwd at {tuple(args.bwd_shape)}"
        + ("; Gluon forward's host path" if args.gluon else "")
    )
    for op in ("linear_layernorm", "linear_rmsnorm") if args.gluon else CALLS:
        for path, pred in (("eager", eager), ("custom op", lambda tensors: False)):
            _ops.plain_eager = pred
            r = measure(op, args.shape, args.bwd_shape, args.n)
            print(
                f"{op:17s} {path:9s} fwd (no grad) {r['fwd_nograd']:6.1f}  fwd (grad) {r['fwd_grad']:6.1f}"
                f"  fwd+bwd {r['fwd_bwd']:6.1f}"
            )
    _ops.plain_eager = eager
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
