"""``python -m ads_gdpa.bench --demo``: every public op once on a small case, checked against the
fp32 reference (through Triton's interpreter when there is no GPU)."""

from __future__ import annotations

import torch


def demo() -> int:
    from ads_kernel_tools.bench import DemoCase, run_demo
    from ads_kernel_tools.reference.gdpa import gdpa_dense_ref, gdpa_ref
    from ads_kernel_tools.testing import lengths_to_offsets, randn

    from . import gdpa, gdpa_varlen, generalized_dot_product_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16
    lq, lk = [0, 1, 17, 33], [5, 1, 40, 33]  # empty query side, one token, Lq != Lk, tile edges
    heads, heads_kv, dim = 2, 1, 32
    cu_q, cu_k = lengths_to_offsets(lq, device=device), lengths_to_offsets(lk, device=device)
    q = randn((sum(lq), heads, dim), dtype=dt, device=device, seed=1, scale=0.5)
    k = randn((sum(lk), heads_kv, dim), dtype=dt, device=device, seed=2, scale=0.5)
    v = randn((sum(lk), heads_kv, dim), dtype=dt, device=device, seed=3)
    dout = randn((sum(lq), heads, dim), dtype=dt, device=device, seed=4)
    args = (cu_q, cu_k, max(lq), max(lk))

    def varlen_fwd():
        out = gdpa_varlen(q, k, v, *args, activation="fast_gelu")
        return (
            out,
            gdpa_ref(q, k, v, *args, activation="fast_gelu"),
            gdpa_ref(q, k, v, *args, activation="fast_gelu", dtype=dt),
        )

    def dk_of(fn, in_dtype, **kw):
        kk = k.detach().to(in_dtype).requires_grad_()
        out = fn(q.to(in_dtype), kk, v.to(in_dtype), *args, activation="silu", **kw)
        return torch.autograd.grad(out, kk, dout.to(out.dtype))[0]

    def varlen_bwd():
        return dk_of(gdpa_varlen, dt), dk_of(gdpa_ref, torch.float32), dk_of(gdpa_ref, dt, dtype=dt)

    def upstream_signature_window():
        kw = {"activation": "relu", "window_size": 4}
        out = generalized_dot_product_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), **kw)
        return out, gdpa_ref(q, k, v, *args, **kw), gdpa_ref(q, k, v, *args, dtype=dt, **kw)

    qd = randn((2, 24, heads, dim), dtype=dt, device=device, seed=5, scale=0.5)
    kd = randn((2, 24, heads, dim), dtype=dt, device=device, seed=6, scale=0.5)
    vd = randn((2, 24, heads, dim), dtype=dt, device=device, seed=7)

    def dense_causal():
        kw = {"activation": "gelu", "causal": True}
        out = gdpa(qd, kd, vd, **kw)
        return out, gdpa_dense_ref(qd, kd, vd, **kw), gdpa_dense_ref(qd, kd, vd, dtype=dt, **kw)

    return run_demo(
        "ads_gdpa",
        [
            DemoCase("gdpa_varlen fwd (fast_gelu, GQA, ragged)", varlen_fwd),
            DemoCase("gdpa_varlen bwd dk (silu)", varlen_bwd),
            DemoCase("generalized_dot_product_attention (window)", upstream_signature_window),
            DemoCase("gdpa dense (gelu, causal)", dense_causal),
        ],
    )
