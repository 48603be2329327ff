"""Benchmark: ``python -m ads_norm_fusion.bench [--quick] [--json P] [--plot P] [--sweep] [--sweep-rms]``.

GEMM followed by LayerNorm / RMSNorm over its N outputs, and RMSNorm over K followed by a GEMM, bf16,
forward and forward+backward (gradients to every input). Providers: ours; the cuBLAS GEMM alone (the
floor: what the fused op would cost if the norm were free); cuBLAS + F.layer_norm / F.rms_norm eager;
torch.compile of the pair (max-autotune too without --quick); Liger and QuACK norms after cuBLAS
when importable. TFLOP/s count the GEMMs only (2·M·N·K forward, 3× that forward+backward), so every
provider of one shape is divided by the same work and ratios read as speedups.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch
import torch.nn.functional as F

TARGET_FWD_VS_GEMM = 1.10  # fused forward time <= 1.10 x the GEMM alone, every shape
TARGET_FWD_SPEEDUP = 1.5  # >= 1.5x the best unfused forward at (65536, 1024, 1024)
TARGET_FWDBWD_SPEEDUP = 1.3  # >= 1.3x the best unfused forward+backward
HEADLINE = (65536, 1024, 1024)

LN_SHAPES = [
    (8192, 512, 512),
    (65536, 1024, 1024),
    (16384, 4096, 4096),
    (65536, 4096, 1024),
    (65536, 1024, 4096),
]
RMS_LINEAR_SHAPES = [
    (m, k, n) for m in (65536, 131072, 524288) for k in (256, 512, 1024) for n in (256, 512, 1024)
]
RMS_LINEAR_QUICK = [(65536, 1024, 1024), (131072, 512, 512), (524288, 256, 256), (524288, 1024, 1024)]
UNFUSED = ("cublas+eager", "torch.compile", "torch.compile max-autotune", "cublas+liger", "cublas+quack")


def _import(bench, module: str):
    try:
        return importlib.import_module(module)
    except Exception as e:  # a broken optional install must not stop the benchmark
        bench.peers.note(module, f"import failed: {type(e).__name__}: {e}")
        return None


def _peer_norms(bench, kind: str):
    """Liger / QuACK norm functions (z, weight, bias, eps) -> y, or missing with a note."""
    out = {}
    liger = bench.peers.liger()
    if liger is not None:
        if kind == "ln":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            out["cublas+liger"] = lambda z, g, b, eps: LigerLayerNormFunction.apply(z, g, b, eps)
        else:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            out["cublas+liger"] = lambda z, g, b, eps: LigerRMSNormFunction.apply(z, g, eps)
    quack = _import(bench, "quack")
    if quack is not None:
        if kind == "rms" and hasattr(quack, "rmsnorm"):
            out["cublas+quack"] = lambda z, g, b, eps: quack.rmsnorm(z, g, eps=eps)
        elif kind == "ln" and hasattr(quack, "layernorm"):
            out["cublas+quack"] = lambda z, g, b, eps: quack.layernorm(z, g, eps=eps)
    return out


def _time(bench, fn, leaves, dy, mode):
    if mode == "fwd":
        with torch.no_grad():
            fn()  # compile / autotune outside the timing
            return bench.time_fn(fn)["ms"]

    def step():
        # allow_unused: the GEMM-alone floor does not touch the norm's parameters
        torch.autograd.grad(fn(), leaves, dy, allow_unused=True)

    step()
    return bench.time_fn(step)["ms"]


def bench_linear_norm(report, bench, kind: str, shape, *, compile_peers: bool, autotune: bool) -> None:
    """LayerNorm(x·Wᵀ + b) (kind "ln") or RMSNorm(x·Wᵀ + b) ("rms") over N, every provider."""
    from . import linear_layernorm, linear_rmsnorm

    m, k, n = shape
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    w = (torch.randn(n, k, device=dev) * k**-0.5).to(dt).requires_grad_()
    b = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    g = torch.rand(n, device=dev, dtype=dt).add_(0.5).requires_grad_()
    be = torch.randn(n, device=dev, dtype=dt, requires_grad=True) if kind == "ln" else None
    leaves = [t for t in (x, w, b, g, be) if t is not None]
    dy = torch.randn(m, n, device=dev, dtype=dt)
    eps = 1e-5 if kind == "ln" else 1e-6
    op = f"linear_{'layernorm' if kind == 'ln' else 'rmsnorm'}"

    def norm(z):
        if kind == "ln":
            return F.layer_norm(z, (n,), g, be, eps)
        return F.rms_norm(z, (n,), g, eps)

    def pair():
        return norm(F.linear(x, w, b))

    providers = {
        "ours": (lambda: linear_layernorm(x, w, b, g, be, eps))
        if kind == "ln"
        else (lambda: linear_rmsnorm(x, w, b, g, eps)),
        "cublas gemm (floor)": lambda: F.linear(x, w, b),
        "cublas+eager": pair,
    }
    if compile_peers:
        providers["torch.compile"] = bench.peers.compiled(pair)
        if autotune:
            providers["torch.compile max-autotune"] = bench.peers.compiled(
                pair, mode="max-autotune-no-cudagraphs"
            )
    for name, peer in _peer_norms(bench, kind).items():
        providers[name] = lambda peer=peer: peer(F.linear(x, w, b), g, be, eps)
    _run_providers(report, bench, op, shape, providers, leaves, dy)
    torch.cuda.empty_cache()


def bench_rmsnorm_linear(report, bench, shape, *, compile_peers: bool) -> None:
    from . import rmsnorm_linear

    m, k, n = shape
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    w = (torch.randn(n, k, device=dev) * k**-0.5).to(dt).requires_grad_()
    g = torch.rand(k, device=dev, dtype=dt).add_(0.5).requires_grad_()
    dy = torch.randn(m, n, device=dev, dtype=dt)
    eps = 1e-6

    def pair():
        return F.linear(F.rms_norm(x, (k,), g, eps), w)

    providers = {
        "ours": lambda: rmsnorm_linear(x, g, w, None, eps),
        "cublas gemm (floor)": lambda: F.linear(x, w),
        "cublas+eager": pair,
    }
    if compile_peers:
        providers["torch.compile"] = bench.peers.compiled(pair)
    for name, peer in _peer_norms(bench, "rms").items():
        providers[name] = lambda peer=peer: F.linear(peer(x, g, None, eps), w)
    print(f"  rmsnorm_linear M={m} K={k} N={n}: forward {rms_forward_path(x, w)}", flush=True)
    _run_providers(report, bench, "rmsnorm_linear", shape, providers, [x, w, g], dy)
    torch.cuda.empty_cache()


def rms_forward_path(x: torch.Tensor, w: torch.Tensor) -> str:
    """Which forward ``rmsnorm_linear`` takes for x (M, K) and w (N, K) without bias, as the rows
    time it: "on the Gluon kernel", or "on the Triton kernels (why the Gluon one refused)". The
    output's check reads only its dtype and layout, so a one-row tensor stands in for it."""
    from .gluon.dispatch import rms_linear_why_not

    why = rms_linear_why_not(x, w, x.new_empty((1, w.shape[0])), bias=None)
    return "on the Gluon kernel" if why is None else f"on the Triton kernels ({why})"


def _run_providers(report, bench, op, shape, providers, leaves, dy) -> None:
    from .costs import gemm_flops

    m, k, n = shape
    label = f"M={m} K={k} N={n}"
    for mode in ("fwd", "fwd+bwd"):
        flops = gemm_flops(m, n, k) * (1 if mode == "fwd" else 3)
        for name, fn in providers.items():
            with bench.peers.skip_on_error(f"{op} {name}"):
                ms = _time(bench, fn, leaves, dy, mode)
                report.add(
                    bench.Row(
                        op, name, mode, label, ms, flops / (ms * 1e9), None, "", {"M": m, "K": k, "N": n}
                    )
                )


# forward settings the sweep times (config.py knobs; {} = the defaults); the Gluon ones fall back to the
# Triton kernels where gluon.dispatch.why_not refuses (split 1: N > 1024; else N > 8192 or no split)
SWEEP_VARIANTS = {
    "gluon normalisation partition": {"ADS_NORM_FUSION_GLUON": "on", "ADS_NORM_FUSION_GLUON_EPI": "1"},
    "gluon ws split 2": {
        "ADS_NORM_FUSION_GLUON": "on", "ADS_NORM_FUSION_GLUON_EPI": "0", "ADS_NORM_FUSION_GLUON_SPLIT": "2",
    },
    "gluon ws split 1": {
        "ADS_NORM_FUSION_GLUON": "on", "ADS_NORM_FUSION_GLUON_EPI": "0", "ADS_NORM_FUSION_GLUON_SPLIT": "1",
    },
    "per-row-block kernel": {"ADS_NORM_FUSION_PERSISTENT": "0"},
    "persistent default": {},
    "persistent 3 stages": {"ADS_NORM_FUSION_STAGES": "3"},
    "persistent 4 stages": {"ADS_NORM_FUSION_STAGES": "4"},
    "persistent no flatten": {"ADS_NORM_FUSION_FLATTEN": "0"},
    "persistent 64x256 4 warps 2 stages 2/SM": {
        "ADS_NORM_FUSION_BLOCK_M": "64", "ADS_NORM_FUSION_WARPS": "4", "ADS_NORM_FUSION_STAGES": "2",
        "ADS_NORM_FUSION_PROGS_PER_SM": "2",
    },
    "persistent 128x128 4 warps 3 stages 2/SM": {
        "ADS_NORM_FUSION_BLOCK_N": "128", "ADS_NORM_FUSION_WARPS": "4", "ADS_NORM_FUSION_STAGES": "3",
        "ADS_NORM_FUSION_PROGS_PER_SM": "2",
    },
}  # fmt: skip


def sweep(bench) -> None:
    """Every LayerNorm shape: cuBLAS (with the GEMM bias), the forward op (bias, γ, β) under the
    settings of ``SWEEP_VARIANTS`` and our persistent kernel without the norm (mode gemm)."""

    def show(tag, name, fn, ref=None):
        try:
            ms = bench.time_fn(fn)["ms"]
            rel = f" = {ms / ref:.3f}x cuBLAS" if ref else ""
            print(f"sweep {tag} {name}: {ms * 1e3:.1f} us{rel}", flush=True)
            return ms
        except Exception as e:  # a setting that fails to compile must not end the sweep
            print(f"sweep {tag} {name}: {type(e).__name__}: {e}"[:300], flush=True)
            return None

    for shape in LN_SHAPES:
        _sweep_shape(bench, show, shape)
        torch.cuda.empty_cache()


def _sweep_shape(bench, show, shape) -> None:
    from . import linear_layernorm, linear_rmsnorm
    from .triton.launch import launch_rownorm

    m, k, n = shape
    tag = f"{m}x{k}x{n}"
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    b, g, be = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    stat = torch.empty(m, device="cuda")
    with torch.no_grad():
        cublas = show(tag, "cuBLAS F.linear", lambda: F.linear(x, w, b))
        for name, env in SWEEP_VARIANTS.items():
            os.environ.update(env)
            show(tag, f"LN {name}", lambda: linear_layernorm(x, w, b, g, be), cublas)
            for knob in env:
                os.environ.pop(knob)
        show(tag, "RMS persistent default", lambda: linear_rmsnorm(x, w, b, g), cublas)
        prev = os.environ.get("ADS_NORM_FUSION_GLUON")
        os.environ["ADS_NORM_FUSION_GLUON"] = "on"
        show(tag, "RMS gluon (default split)", lambda: linear_rmsnorm(x, w, b, g), cublas)
        if prev is None:
            os.environ.pop("ADS_NORM_FUSION_GLUON")
        else:
            os.environ["ADS_NORM_FUSION_GLUON"] = prev
        show(tag, "GEMM alone, persistent", lambda: launch_rownorm("gemm", x, y, stat, b=w, bias=b), cublas)


def sweep_rms(bench) -> None:
    """rmsnorm_linear piece by piece: forward (the row pass, the scaled GEMM with and without the
    flattened pipeline, the op) at three shapes; backward (the coefficient pass, the dx GEMM with and
    without dγ partials, x̂·γ, cuBLAS dW, the whole op) at the headline shape."""

    def show(name, fn):
        try:
            ms = bench.time_fn(fn)["ms"]
            print(f"sweep-rms {name}: {ms * 1e3:.0f} us", flush=True)
        except Exception as e:  # a setting that fails to compile must not end the sweep
            print(f"sweep-rms {name}: {type(e).__name__}: {e}"[:300], flush=True)

    for shape in (HEADLINE, (131072, 512, 512), (524288, 256, 256)):
        _sweep_rms_shape(bench, show, shape)


def _sweep_rms_shape(bench, show, shape) -> None:
    from . import _ops, rmsnorm_linear
    from .triton.launch import launch_row_stat, launch_scaled_gemm, rms_gemm_blocks

    m, k, n = shape
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt)
    w = (torch.randn(n, k, device=dev) * k**-0.5).to(dt)
    g = torch.rand(k, device=dev, dtype=dt).add_(0.5)
    y = torch.empty(m, n, device=dev, dtype=dt)
    r = torch.empty(m, device=dev)
    tag = f"{m}x{k}x{n}"
    show(f"{tag} cuBLAS x@w^T", lambda: F.linear(x, w))
    show(f"{tag} row pass rrms", lambda: launch_row_stat(x, r, eps=1e-6))
    variants = {"default": {}, "flatten=1": {"ADS_NORM_FUSION_RMS_FLATTEN": "1"}}
    if shape != HEADLINE:
        variants["pointer store"] = {"ADS_NORM_FUSION_RMS_TMA_STORE": "0"}
        variants["BLOCK_N=128"] = {"ADS_NORM_FUSION_RMS_BLOCK_N": "128"}
    for name, env in variants.items():
        os.environ.update(env)
        show(f"{tag} scaled GEMM {name}", lambda: launch_scaled_gemm(x, w, y, r, b_trans=True))
        for knob in env:
            os.environ.pop(knob)
    with torch.no_grad():
        for fwd in ("rowpass", "fused"):
            os.environ["ADS_NORM_FUSION_RMS_FWD"] = fwd
            show(f"{tag} forward op ({fwd})", lambda: rmsnorm_linear(x, g, w))
        os.environ.pop("ADS_NORM_FUSION_RMS_FWD")
    if (m, k, n) != HEADLINE:
        return
    dy = torch.randn(m, n, device=dev, dtype=dt)
    coef = torch.empty(m, device=dev)
    dx = torch.empty_like(x)
    part = torch.empty((rms_gemm_blocks(m, k, n, backward=True), k), device=dev)
    show("bwd row pass coef", lambda: launch_row_stat(dy, coef, b=y, r=r, divisor=k))
    show("bwd dx GEMM", lambda: launch_scaled_gemm(dy, w, dx, r, b_trans=False, gamma=g, aux=x, coef=coef))
    show(
        "bwd dx GEMM + dgamma partials",
        lambda: launch_scaled_gemm(dy, w, dx, r, b_trans=False, gamma=g, aux=x, coef=coef, part=part),
    )
    show("bwd cuBLAS dy@w", lambda: dy @ w)
    show("bwd x_hat*gamma", lambda: _ops.row_col_scale(x, r, g))
    show("bwd cuBLAS dW", lambda: dy.t() @ x)
    xg, wg, gg = (t.clone().requires_grad_() for t in (x, w, g))
    show("fwd+bwd op", lambda: torch.autograd.grad(rmsnorm_linear(xg, gg, wg), (xg, gg, wg), dy))


def _summary(report) -> None:
    by = {(r.op, r.provider, r.mode, r.shape): r.ms for r in report.rows if r.ms}
    print(
        f"\n# targets (H200): fused fwd <= {TARGET_FWD_VS_GEMM:.2f}x the GEMM alone; >= {TARGET_FWD_SPEEDUP}x"
        f" the best unfused fwd at M,K,N={HEADLINE}; fwd+bwd >= {TARGET_FWDBWD_SPEEDUP}x the best unfused"
    )
    for (op, provider, mode, shape), ms in by.items():
        if provider != "ours":
            continue
        floor = by.get((op, "cublas gemm (floor)", mode, shape))
        unfused = [by[(op, p, mode, shape)] for p in UNFUSED if (op, p, mode, shape) in by]
        parts = [f"{op} {mode} {shape}: {ms * 1e3:.0f} us"]
        if floor:
            verdict = "" if mode != "fwd" else (" MET" if ms / floor <= TARGET_FWD_VS_GEMM else " missed")
            parts.append(f"{ms / floor:.3f}x the GEMM{verdict}")
        if unfused:
            speed = min(unfused) / ms
            target = TARGET_FWD_SPEEDUP if mode == "fwd" else TARGET_FWDBWD_SPEEDUP
            applies = mode == "fwd+bwd" or shape == "M={} K={} N={}".format(*HEADLINE)
            verdict = (" MET" if speed >= target else " missed") if applies else ""
            parts.append(f"{speed:.2f}x the best unfused{verdict}")
        print(", ".join(parts))


def demo() -> int:
    """One small case per op, through the interpreter on a CPU, checked against the fp32 reference."""
    from ads_kernel_tools.bench import DemoCase, run_demo
    from ads_kernel_tools.reference.norm import (
        gemm_layer_norm_input_grad_ref,
        gemm_layer_norm_ref,
        gemm_rms_norm_ref,
        rms_norm_gemm_ref,
    )
    from ads_kernel_tools.testing import randn

    from . import linear_layernorm, linear_layernorm_input_grad, linear_rmsnorm, rmsnorm_linear

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16
    m, k, n = 37, 48, 80  # partial row tile, several column tiles with a masked tail
    x = randn((m, k), dtype=dt, device=dev, seed=1)
    w = randn((n, k), dtype=dt, device=dev, seed=2, scale=k**-0.5)
    g = (1 + 0.5 * randn((n,), seed=3)).to(dt).to(dev)
    be = randn((n,), dtype=dt, device=dev, seed=4)
    gk = (1 + 0.5 * randn((k,), seed=5)).to(dt).to(dev)

    def ln():
        ref = gemm_layer_norm_ref(x, w.t(), g, be)
        return linear_layernorm(x, w, None, g, be), ref, gemm_layer_norm_ref(x, w.t(), g, be, dtype=dt)

    def rms():
        ref = gemm_rms_norm_ref(x, w.t(), g, 1e-6)
        return linear_rmsnorm(x, w, None, g), ref, gemm_rms_norm_ref(x, w.t(), g, 1e-6, dtype=dt)

    def rms_lin():
        ref = rms_norm_gemm_ref(x, w.t(), gk)
        return rmsnorm_linear(x, gk, w), ref, rms_norm_gemm_ref(x, w.t(), gk, dtype=dt)

    def input_grad():
        dy = randn((m, k), dtype=dt, device=dev, seed=6)
        _, mean, rstd = gemm_layer_norm_ref(x, w.t(), return_stats=True)
        xhat = linear_layernorm(x, w)
        w_next_t = w.t().contiguous()  # a next layer of (K, N) weights
        out = linear_layernorm_input_grad(dy, w_next_t, xhat, rstd.to(dev), g)
        ref = gemm_layer_norm_input_grad_ref(dy, w_next_t, xhat, rstd, g)
        return out, ref, gemm_layer_norm_input_grad_ref(dy, w_next_t, xhat, rstd, g, dtype=dt)

    return run_demo(
        "ads_norm_fusion",
        [
            DemoCase("linear_layernorm fwd (37x48x80)", ln),
            DemoCase("linear_rmsnorm fwd", rms),
            DemoCase("rmsnorm_linear fwd", rms_lin),
            DemoCase("linear_layernorm_input_grad (dz)", input_grad),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    from ads_kernel_tools.bench import cli

    flags = {
        "--sweep": "only sweep tile settings of ours",
        "--sweep-rms": "only time rmsnorm_linear's pieces",
    }
    prog = "python -m ads_norm_fusion.bench"
    return cli.main(prog, __doc__.splitlines()[0], measure, demo=demo, flags=flags, argv=argv)


def measure(args) -> int:
    from ads_kernel_tools import bench
    from ads_kernel_tools.bench import cli

    if args.sweep:
        sweep(bench)
        return 0
    if args.sweep_rms:
        sweep_rms(bench)
        return 0
    report = bench.Report("GEMM + norm (bf16)", metric="tflops", progress=True)
    for shape in LN_SHAPES:
        compile_here = not args.quick or shape in (HEADLINE, (8192, 512, 512))
        bench_linear_norm(report, bench, "ln", shape, compile_peers=compile_here, autotune=not args.quick)
    for shape in LN_SHAPES if not args.quick else [HEADLINE, (16384, 4096, 4096)]:
        bench_linear_norm(
            report, bench, "rms", shape, compile_peers=shape == HEADLINE, autotune=not args.quick
        )
    for shape in RMS_LINEAR_SHAPES if not args.quick else RMS_LINEAR_QUICK:
        bench_rmsnorm_linear(report, bench, shape, compile_peers=not args.quick or shape == HEADLINE)
    return cli.finish(report, args, x_key="M", summary=_summary)


if __name__ == "__main__":
    sys.exit(main())
