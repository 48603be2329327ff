"""Serving benchmark: ``python -m ads_gdpa.bench_serving [--quick] [--json PATH] [--demo]``.

The ranking-serving shape of upstream's ``ad_to_request_offset``: B = 1152 candidate ads over 64
user requests (18 ads each), every request a history of 2048 tokens (the shared KV), every ad its
own 64..256 query tokens; H = 4, D = 128, bf16, fast_gelu. FLOPs = 4·H·D·Σ_ads Lq·Lk (×2.5
backward), the same useful work for every provider.

Providers: ``ours[shared-kv]`` (each ad reads its request's KV through the index, nothing copied);
``ours[materialised]`` (the KV gathered into one copy per ad, then the default kernels: the cost a
caller without ad_to_request_offset pays, gather included); ``ours[materialised,attn]`` (the same
attention with the copy made beforehand: the kernels alone).
"""

from __future__ import annotations

import sys

import torch

ADS, REQUESTS, HISTORY, Q_RANGE = 1152, 64, 2048, (64, 256)


def serving_case(ads: int, requests: int, history: int, q_range: tuple[int, int], heads: int, dim: int,
                 device: str, seed: int = 0):  # fmt: skip
    """(q, k, v, cu_q, cu_k, ad_to_request, lq): ads ordered by request, as a serving batch is."""
    from ads_kernel_tools.testing import lengths_to_offsets

    g = torch.Generator().manual_seed(seed)
    lq = torch.randint(q_range[0], q_range[1] + 1, (ads,), generator=g).tolist()
    a2r = torch.arange(ads) * requests // ads
    dt = torch.bfloat16
    q = (torch.randn(sum(lq), heads, dim, generator=g) * 0.3).to(device, dt)
    k = (torch.randn(requests * history, heads, dim, generator=g) * 0.3).to(device, dt)
    v = torch.randn(requests * history, heads, dim, generator=g).to(device, dt)
    cu_q = lengths_to_offsets(lq, device=device)
    cu_k = lengths_to_offsets([history] * requests, device=device)
    return q, k, v, cu_q, cu_k, a2r.to(device=device, dtype=torch.int32), lq


def materialise(k, v, a2r, history: int):
    """The shared KV copied once per ad: rows of request a2r[b] for every ad b."""
    rows = (a2r.long()[:, None] * history + torch.arange(history, device=k.device)[None, :]).reshape(-1)
    return k[rows], v[rows]


def run(args) -> None:
    from ads_kernel_tools.bench import Report, peers
    from ads_kernel_tools.testing import lengths_to_offsets

    from . import gdpa_varlen, generalized_dot_product_attention

    heads, dim = 4, 128
    report = Report(
        "ads_gdpa serving: 1152 ads over 64 requests, shared history 2048 (TFLOP/s)", progress=True
    )
    q, k, v, cu_q, cu_k, a2r, lq = serving_case(ADS, REQUESTS, HISTORY, Q_RANGE, heads, dim, "cuda")
    max_q = max(lq)
    flop = 4.0 * heads * dim * sum(lq) * HISTORY
    shape = f"B={ADS} R={REQUESTS} H={heads} D={dim} Lk={HISTORY} Lq={Q_RANGE[0]}..{Q_RANGE[1]}"
    cu_km = lengths_to_offsets([HISTORY] * ADS, device="cuda")
    hq, hkm = cu_q.tolist(), cu_km.tolist()
    warm, rep = (10, 50) if args.quick else (25, 200)

    def shared(grad=False):
        leaves = [t.detach().requires_grad_(grad) for t in (q, k, v)]
        out = generalized_dot_product_attention(
            *leaves, cu_q, cu_k, max_q, HISTORY, a2r, activation="fast_gelu"
        )
        return out, leaves

    def materialised(grad=False):
        leaves = [t.detach().requires_grad_(grad) for t in (q, k, v)]
        km, vm = materialise(leaves[1], leaves[2], a2r, HISTORY)
        out = gdpa_varlen(leaves[0], km, vm, cu_q, cu_km, max_q, HISTORY, activation="fast_gelu",
                          cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hkm)  # fmt: skip
        return out, leaves

    km0, vm0 = materialise(k, v, a2r, HISTORY)

    def attn_only(grad=False):
        leaves = [t.detach().requires_grad_(grad) for t in (q, km0, vm0)]
        out = gdpa_varlen(*leaves, cu_q, cu_km, max_q, HISTORY, activation="fast_gelu",
                          cu_seqlens_q_cpu=hq, cu_seqlens_k_cpu=hkm)  # fmt: skip
        return out, leaves

    for name, fn in (("ours[shared-kv]", shared), ("ours[materialised]", materialised),
                     ("ours[materialised,attn]", attn_only)):  # fmt: skip
        with peers.skip_on_error(name):
            _time_provider(report, name, fn, shape, flop, args.bwd, warm, rep)
        torch.cuda.empty_cache()
    report.print_table()
    if args.json:
        report.write_json(args.json)


def _time_provider(report, name, fn, shape, flop, bwd, warm, rep) -> None:
    from ads_kernel_tools.bench import Row, time_fn

    ms = time_fn(lambda: fn()[0], warmup_ms=warm, rep_ms=rep)["ms"]
    report.add(Row("serving fwd", name, "fwd", shape, ms, flop / (ms * 1e-3) / 1e12))
    if bwd:
        out, leaves = fn(grad=True)
        do = torch.randn_like(out)
        ms = time_fn(
            lambda: torch.autograd.grad(out, leaves, do, retain_graph=True), warmup_ms=warm, rep_ms=rep
        )
        report.add(Row("serving bwd", name, "bwd", shape, ms["ms"], 2.5 * flop / (ms["ms"] * 1e-3) / 1e12))


def demo() -> int:
    """A small serving-shaped batch (6 ads over 2 requests) through the interpreter on CPU or the
    GPU, checked against the fp32 reference of the materialised KV."""
    from ads_kernel_tools.bench import DemoCase, run_demo
    from ads_kernel_tools.reference.gdpa import gdpa_ref
    from ads_kernel_tools.testing import lengths_to_offsets

    from . import generalized_dot_product_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"
    history = 40
    q, k, v, cu_q, cu_k, a2r, lq = serving_case(6, 2, history, (1, 33), 2, 32, device, seed=3)
    km, vm = materialise(k, v, a2r, history)
    cu_km = lengths_to_offsets([history] * 6, device=device)

    def shared_kv():
        out = generalized_dot_product_attention(
            q, k, v, cu_q, cu_k, max(lq), history, a2r, activation="fast_gelu"
        )
        args = (q, km, vm, cu_q, cu_km, max(lq), history)
        return (
            out,
            gdpa_ref(*args, activation="fast_gelu"),
            gdpa_ref(*args, activation="fast_gelu", dtype=q.dtype),
        )

    return run_demo("ads_gdpa.bench_serving", [DemoCase("ad_to_request_offset (shared KV)", shared_kv)])


def main(argv: list[str] | None = None) -> int:
    from ads_kernel_tools.bench import cli

    return cli.main(
        "python -m ads_gdpa.bench_serving", __doc__.splitlines()[0], run, demo=demo,
        flags={"--bwd": "also time the backward (dK/dV summed over the ads)"}, argv=argv,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
