"""A/B probe of the no-grad ``linear_layernorm`` / ``linear_rmsnorm`` forwards (GPU; not collected by
pytest): each setting of ``VARIANTS`` (environment knobs of ``ads_norm_fusion.config``) and cuBLAS's
``F.linear`` alone, in interleaved rounds in one process, medians of ``ads_kernel_tools.bench.time_fn``
per round; first the max error of each setting's LayerNorm against fp32.

    python tests/gluon_fwd_probe.py [--rounds 3] [--variants partition,ws512,ws256,triton] [M,K,N ...]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

from ads_kernel_tools.bench import time_fn
from ads_norm_fusion import linear_layernorm, linear_rmsnorm

VARIANTS = {
    "partition": {"ADS_NORM_FUSION_GLUON_EPI": "1"},
    "ws512": {"ADS_NORM_FUSION_GLUON_EPI": "0"},
    "ws256": {"ADS_NORM_FUSION_GLUON_EPI": "0", "ADS_NORM_FUSION_GLUON_PART": "256"},
    "triton": {"ADS_NORM_FUSION_GLUON": "0"},
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


def probe(m: int, k: int, n: int, names: list[str], rounds: int) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    b, g, be = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tag = f"{m}x{k}x{n}"
    times: dict[str, list[float]] = {}
    with torch.no_grad():
        ref = F.layer_norm(F.linear(x.float(), w.float(), b.float()), (n,), g.float(), be.float())
        for name in names:
            _use(name)
            err = (linear_layernorm(x, w, b, g, be).float() - ref).abs().max() / ref.abs().max()
            linear_rmsnorm(x, w, b, g)  # compiled before the timing
            print(f"{tag} {name}: LayerNorm max error {err.item():.2e} (relative to max |y|)", flush=True)
        for _ in range(rounds):
            for name in names:
                _use(name)
                times.setdefault(f"LN {name}", []).append(_us(lambda: linear_layernorm(x, w, b, g, be)))
                times.setdefault(f"RMS {name}", []).append(_us(lambda: linear_rmsnorm(x, w, b, g)))
            times.setdefault("cuBLAS", []).append(_us(lambda: F.linear(x, w, b)))
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
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    print(torch.cuda.get_device_name(), flush=True)
    for shape in args.shapes:
        m, k, n = (int(v) for v in shape.split(","))
        probe(m, k, n, names, args.rounds)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
