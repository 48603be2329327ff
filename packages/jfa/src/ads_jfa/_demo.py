"""``python -m ads_jfa.bench --demo``: each public function once on a small case, checked against
the fp64 reference (through Triton's interpreter when there is no GPU)."""

from __future__ import annotations

import torch


def demo() -> int:
    from ads_kernel_tools.bench import DemoCase, run_demo
    from ads_kernel_tools.reference.attention import jagged_attention_ref
    from ads_kernel_tools.testing import lengths_to_offsets, randn

    from . import PoolingByMultiheadAttention, jagged_flash_attention
    from .fbgemm import jagged_flash_attention_basic

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16
    lq, lk = [0, 1, 17, 33], [5, 0, 40, 20]  # empty q, an empty kv sequence, Lq != Lk, tile edges
    cu_q, cu_k = lengths_to_offsets(lq, device=dev), lengths_to_offsets(lk, device=dev)
    q = randn((sum(lq), 4, 64), dtype=dt, device=dev, seed=1)
    k = randn((sum(lk), 2, 64), dtype=dt, device=dev, seed=2)
    v = randn((sum(lk), 2, 64), dtype=dt, device=dev, seed=3)
    do = randn((sum(lq), 4, 64), dtype=dt, device=dev, seed=4)

    def ref(qq, kk, vv, cq, dtype, **kw):
        return jagged_attention_ref(qq, kk, vv, cq, cu_k, kw.pop("max_q"), dtype=dtype, **kw)[0]

    def cross_window():
        kw = dict(window_size=4)
        out = jagged_flash_attention(q, k, v, cu_q, cu_k, 24, max(lk), **kw)
        truth = ref(q.double(), k.double(), v.double(), cu_q, torch.float64, max_q=24, **kw)
        return out, truth, ref(q, k, v, cu_q, dt, max_q=24, **kw)

    def dk_of(fn, kk):
        return torch.autograd.grad((fn(kk).double() * do.double()).sum(), kk)[0]

    def cross_bwd():
        def ours(kk):
            return jagged_flash_attention(q, kk, v, cu_q, cu_k, max(lq), max(lk), window_size=8)

        def r(kk, dtype):
            src = (q, v) if dtype == dt else (q.double(), v.double())
            return ref(src[0], kk, src[1], cu_q, dtype, max_q=max(lq), window_size=8)

        got = dk_of(ours, k.clone().requires_grad_())
        truth = dk_of(lambda x: r(x, torch.float64), k.double().requires_grad_())
        return got, truth, dk_of(lambda x: r(x, dt), k.clone().requires_grad_())

    def pma():
        mod = PoolingByMultiheadAttention(16, 4, 64, 2).to(dev)
        out = mod(k, v, cu_k, max(lk))
        qq = mod.query.detach().to(dt)
        one = torch.tensor([0, 16], dtype=torch.int32, device=dev)
        kw = dict(broadcast_q=True, max_q=16)
        truth = ref(qq.double(), k.double(), v.double(), one, torch.float64, **kw)
        return out, truth, ref(qq, k, v, one, dt, **kw)

    def fbgemm():
        x = randn((sum(lk), 32), dtype=dt, device=dev, seed=5)
        out = jagged_flash_attention_basic(x, x, x, cu_k, 24, use_mask=True)

        def math(t):
            res = torch.zeros_like(t)
            for s, e in zip(cu_k.tolist()[:-1], cu_k.tolist()[1:]):
                n = min(e - s, 24)
                p = torch.softmax(t[s : s + n] @ t[s : s + n].T, -1) / 24
                res[s : s + n] = torch.triu(p) @ t[s : s + n]
            return res

        return out, math(x.double()), math(x)

    return run_demo(
        "ads_jfa",
        [
            DemoCase("jagged_flash_attention (cross, window, GQA)", cross_window),
            DemoCase("jagged_flash_attention bwd dk (window)", cross_bwd),
            DemoCase("PoolingByMultiheadAttention (broadcast_q)", pma),
            DemoCase("fbgemm.jagged_flash_attention_basic (use_mask)", fbgemm),
        ],
    )
