"""Run by the GPU job under ``compute-sanitizer --tool memcheck``: lying offsets, seqused entries
and page indices, forward and backward, bf16 (local and top-left windows, a learnable sink included)
and FP8. The
kernels clamp every span to its tensor, so memcheck must
report 0 errors. Not a pytest file (it needs the sanitizer around the whole process)."""

from __future__ import annotations

import os

import torch

from lp_fa4 import flash_attn_func, flash_attn_varlen_func, jagged_attention


def main() -> None:
    from ads_kernel_tools.kernels import span_fill

    span_fill.SPAN_FILL_MIN_BYTES = 0  # large calls zero dK/dV outside the key spans only: check that
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(300, 4, 128, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(200, 2, 128, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(200, 2, 128, device=dev, dtype=bf, requires_grad=True)
    bad = [
        ([0, 100, 5000, 300], [0, 150, 9999, 200]),  # past the end
        ([0, -50, 100, 300], [0, 200, 10, -3]),  # negative and decreasing
        ([250, 10, 300, 1 << 30], [1 << 30, 0, 199, 200]),  # garbage
    ]
    for cq, ck in bad:
        cu_q = torch.tensor(cq, dtype=torch.int32, device=dev)
        cu_k = torch.tensor(ck, dtype=torch.int32, device=dev)
        for kw in (dict(causal=True), dict(window_size=(40, 7), softcap=5.0), dict(window_size=(40, 7))):
            out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 512, 512, return_lse=True, **kw)
            torch.autograd.grad(out.float().sum(), (q, k, v))
        # a learnable sink that needs its gradient: the Gluon forward with the sink and its fp32 out
        sink = torch.randn(4, device=dev, dtype=bf, requires_grad=True)
        out, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 512, 512, causal=True, learnable_sink=sink)
        torch.autograd.grad(out.float().sum(), (q, k, v, sink))
        used = torch.tensor([500, -4, 1 << 30], dtype=torch.int32, device=dev)
        out, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 512, 512, seqused_q=used, seqused_k=used)
        torch.autograd.grad(out.float().sum(), (q, k, v))
        out, _ = jagged_attention(q, k, v, cu_q, cu_k, 64, 512, window_size=9)
        torch.autograd.grad(out.float().sum(), (q, k, v))
        # FP8 (the Gluon forward with V's K-major copy, then the backward of the dequantised inputs)
        q8, k8, v8 = (t.detach().to(torch.float8_e4m3fn).requires_grad_() for t in (q, k, v))
        ones = torch.ones(3, 2, device=dev)
        for causal in (False, True):
            out, _ = flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, 512, 512, causal=causal, q_descale=ones,
                                            k_descale=ones, v_descale=ones)  # fmt: skip
            torch.autograd.grad(out.float().sum(), (q8, k8, v8))
    cq = torch.tensor([0, 300], dtype=torch.int32, device=dev)
    ck = torch.tensor([0, 77, 5000, -1], dtype=torch.int32, device=dev)
    out, _ = jagged_attention(q, k, v, cq, ck, 300, 512, broadcast_q=True)
    torch.autograd.grad(out.float().sum(), (q, k, v))
    # MHA broadcast_q, the resident plan: the Triton query-resident backward and the Gluon one
    # (LP_FA4_RESIDENT_KERNEL, read per call), whose TMA boxes of 128 query rows pass the block's end
    q4 = torch.randn(100, 4, 128, device=dev, dtype=bf, requires_grad=True)
    k4 = torch.randn(200, 4, 128, device=dev, dtype=bf, requires_grad=True)
    v4 = torch.randn(200, 4, 128, device=dev, dtype=bf, requires_grad=True)
    for kernel in ("triton", "gluon"):
        os.environ["LP_FA4_BROADCAST_Q"], os.environ["LP_FA4_RESIDENT_KERNEL"] = "resident", kernel
        # with the Gluon backward, the forward that reads the one query block (LP_FA4_BQ_FWD_BLOCK)
        os.environ["LP_FA4_BQ_FWD_BLOCK"] = "1" if kernel == "gluon" else "0"
        for cq4 in ([0, 100], [40, 1 << 30], [-5, 60]):
            cq4 = torch.tensor(cq4, dtype=torch.int32, device=dev)
            out, _ = jagged_attention(q4, k4, v4, cq4, ck, 100, 512, broadcast_q=True)
            torch.autograd.grad(out.float().sum(), (q4, k4, v4))
    for knob in ("LP_FA4_BROADCAST_Q", "LP_FA4_RESIDENT_KERNEL", "LP_FA4_BQ_FWD_BLOCK"):
        del os.environ[knob]
    # paged KV: page indices out of range both ways, seqused_k past the table
    with torch.no_grad():
        kc = torch.randn(6, 64, 2, 128, device=dev, dtype=bf)
        table = torch.tensor([[0, 99, -7], [1 << 30, 5, 2], [3, 3, 3]], dtype=torch.int32, device=dev)
        used = torch.tensor([1000, 64, -9], dtype=torch.int32, device=dev)
        cu_q = torch.tensor([0, 100, 200, 300], dtype=torch.int32, device=dev)
        flash_attn_varlen_func(
            q, kc, kc, cu_q, None, 512, None, seqused_k=used, page_table=table, causal=True
        )
        flash_attn_func(
            q[:256].view(2, 128, 4, 128), k[:128].view(2, 64, 2, 128), v[:128].view(2, 64, 2, 128)
        )
    torch.cuda.synchronize()
    print("memcheck cases: all paths ran")


if __name__ == "__main__":
    main()
