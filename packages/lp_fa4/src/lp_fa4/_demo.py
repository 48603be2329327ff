"""``python -m lp_fa4.bench --demo``: each public function once on a small case, checked against the
fp32 reference (through Triton's interpreter when there is no GPU)."""

from __future__ import annotations

import torch


def demo() -> int:
    from ads_kernel_tools.bench import DemoCase, run_demo
    from ads_kernel_tools.reference.attention import (
        jagged_attention_ref,
        softmax_attention_ref,
        softmax_attention_varlen_ref,
    )
    from ads_kernel_tools.testing import lengths_to_offsets, randn

    from . import flash_attn_func, flash_attn_varlen_func, jagged_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16
    lq, lk = [0, 1, 17, 33], [5, 0, 40, 33]  # empty q, an empty kv sequence, Lq != Lk, tile edges
    cu_q, cu_k = lengths_to_offsets(lq, device=dev), lengths_to_offsets(lk, device=dev)
    q = randn((sum(lq), 4, 64), dtype=dt, device=dev, seed=1)
    k = randn((sum(lk), 2, 64), dtype=dt, device=dev, seed=2)
    v = randn((sum(lk), 2, 64), dtype=dt, device=dev, seed=3)
    sink = randn((4,), dtype=dt, device=dev, seed=4)
    do = randn((sum(lq), 4, 64), dtype=dt, device=dev, seed=5)

    def varlen_fwd():
        kw = dict(causal=True, softcap=3.0)
        out, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), learnable_sink=sink, **kw)
        ref, _ = softmax_attention_varlen_ref(
            q.float(), k.float(), v.float(), cu_q, cu_k, sink=sink.float(), **kw
        )
        base, _ = softmax_attention_varlen_ref(q, k, v, cu_q, cu_k, sink=sink, dtype=dt, **kw)
        return out, ref, base

    def dk_of(fn, kk):
        return torch.autograd.grad(fn(kk), kk, allow_unused=False)[0]

    def varlen_bwd():
        def ours(kk):
            return (flash_attn_varlen_func(q, kk, v, cu_q, cu_k, max(lq), max(lk), window_size=(8, 0))[0]
                    .float() * do.float()).sum()  # fmt: skip

        def ref(kk, dtype):
            src = (q, v) if dtype == dt else (q.float(), v.float())
            out, _ = softmax_attention_varlen_ref(src[0], kk, src[1], cu_q, cu_k, window=(8, 0), dtype=dtype)
            return (out.float() * do.float()).sum()

        got = dk_of(ours, k.clone().requires_grad_())
        truth = dk_of(lambda x: ref(x, torch.float32), k.float().requires_grad_())
        return got, truth, dk_of(lambda x: ref(x, dt), k.clone().requires_grad_())

    qd, kd, vd = (randn((2, 24, 2, 64), dtype=dt, device=dev, seed=6 + i) for i in range(3))

    def dense():
        out, _ = flash_attn_func(qd, kd, vd, window_size=(4, 4))
        ref, _ = softmax_attention_ref(qd.float(), kd.float(), vd.float(), window=(4, 4))
        base, _ = softmax_attention_ref(qd, kd, vd, window=(4, 4), dtype=dt)
        return out, ref, base

    def jagged():
        kw = dict(window_size=3)
        out, _ = jagged_attention(q, k, v, cu_q, cu_k, 16, max(lk), **kw)
        ref, _ = jagged_attention_ref(q.float(), k.float(), v.float(), cu_q, cu_k, 16, **kw)
        base, _ = jagged_attention_ref(q, k, v, cu_q, cu_k, 16, dtype=dt, **kw)
        return out, ref, base

    return run_demo(
        "lp_fa4",
        [
            DemoCase("flash_attn_varlen_func fwd (causal, softcap, sink, GQA)", varlen_fwd),
            DemoCase("flash_attn_varlen_func bwd dk (local window)", varlen_bwd),
            DemoCase("flash_attn_func (local window)", dense),
            DemoCase("jagged_attention (top-left window, max_seqlen_q)", jagged),
        ],
    )
