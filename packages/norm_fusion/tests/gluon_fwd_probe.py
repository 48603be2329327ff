"""A/B probe of the ``linear_layernorm`` / ``linear_rmsnorm`` forwards (GPU; not collected by pytest):
each setting of ``VARIANTS`` (environment knobs of ``ads_norm_fusion.config``) and cuBLAS's
``F.linear`` alone, in interleaved rounds in one process, medians of ``ads_kernel_tools.bench.time_fn``
per round; first the max error of each setting's LayerNorm against fp32. ``--training``: the
training step (forward and backward, every input requiring grad) instead of the no-grad forward.
``--host``: also the host time per call (100 calls issued without a sync; a call whose host time
reaches its ``time_fn`` is bounded by the host, not the GPU).

    python tests/gluon_fwd_probe.py [--rounds 3] [--variants partition,ws512,ws256,triton,nocache]
        [--training] [--host] [M,K,N ...]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from ads_kernel_tools.bench import time_fn
from ads_norm_fusion import linear_layernorm, linear_rmsnorm

VARIANTS = {
    "partition": {"ADS_NORM_FUSION_GLUON_EPI": "1"},
    "ws512": {"ADS_NORM_FUSION_GLUON_EPI": "0"},
    "ws256": {"ADS_NORM_FUSION_GLUON_EPI": "0", "ADS_NORM_FUSION_GLUON_PART": "256"},
    "triton": {"ADS_NORM_FUSION_GLUON": "0"},
    "nocache": {"ADS_LAUNCH_CACHE": "0"},
}
SHAPES = ["65536,1024,1024", "65536,1024,4096", "16384,4096,4096", "65536,4096,1024", "65536,1024,2048"]


def _use(name: str) -> None:
    for knobs in VARIANTS.values():
        for knob in knobs:
            os.environ.pop(knob, None)
    os.environ["ADS_NORM_FUSION_GLUON"] = "auto"
    os.environ.update(VARIANTS[name])


def _us(fn) -> float:
    return time_fn(fn)["ms"] * 1e3


def _host_us(fn, calls: int = 100) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def probe(m: int, k: int, n: int, names: list[str], rounds: int, training: bool, host: bool) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    b, g, be = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    leaves = [t.requires_grad_(training) for t in (x, w, b, g, be)]
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    tag = f"{m}x{k}x{n}"
    times: dict[str, list[float]] = {}

    def step(op, inputs):
        if not training:
            return lambda: op(*inputs)
        return lambda: torch.autograd.grad(op(*inputs), inputs, dy)

    calls = {
        "LN": step(linear_layernorm, leaves),
        "RMS": step(linear_rmsnorm, leaves[:4]),
        "cuBLAS": step(lambda *t: F.linear(*t), leaves[:3]),
    }
    with torch.no_grad():
        ref = F.layer_norm(F.linear(x.float(), w.float(), b.float()), (n,), g.float(), be.float())
        for name in names:
            _use(name)
            err = (linear_layernorm(x, w, b, g, be).float() - ref).abs().max() / ref.abs().max()
            linear_rmsnorm(x, w, b, g)  # compiled before the timing
            print(f"{tag} {name}: LayerNorm max error {err.item():.2e} (relative to max |y|)", flush=True)
    del ref
    with torch.set_grad_enabled(training):
        for _ in range(rounds):
            for name in names:
                _use(name)
                for op in ("LN", "RMS"):
                    times.setdefault(f"{op} {name}", []).append(_us(calls[op]))
                    if host:
                        times.setdefault(f"{op} {name} host", []).append(_host_us(calls[op]))
            times.setdefault("cuBLAS", []).append(_us(calls["cuBLAS"]))
    gemm = sorted(times["cuBLAS"])[len(times["cuBLAS"]) // 2]
    for key, vals in times.items():
        med = sorted(vals)[len(vals) // 2]
        rounds_us = " / ".join(f"{v:.1f}" for v in vals)
        print(f"{tag} {key:14s} {rounds_us} us, median {med:.1f} = {med / gemm:.3f}x cuBLAS", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=SHAPES, help="M,K,N")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="partition,ws512")
    ap.add_argument("--training", action="store_true", help="time forward + backward steps")
    ap.add_argument("--host", action="store_true", help="also the host time per call")
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    print(torch.cuda.get_device_name(), flush=True)
    for shape in args.shapes:
        m, k, n = (int(v) for v in shape.split(","))
        probe(m, k, n, names, args.rounds, args.training, args.host)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
