"""Odd shapes through every kernel path, for ``compute-sanitizer --tool memcheck python3 memcheck_case.py``.

Partial row tiles (M = 77, 1), column tails (N = 80, 1040 with 128-wide tiles) and K = 48 that is no
multiple of the 64-wide K step; forward, backward (``rmsnorm_linear``'s on each dx and dW path) and
the input-grad ops. With
``ADS_NORM_FUSION_GLUON=on`` it runs the Gluon forward's cases instead (``gluon_main``), with
``ADS_NORM_FUSION_RMS_GLUON=on`` the Gluon ``rmsnorm_linear`` forward's (``rms_linear_main``). Prints
one line at the end.
"""

from __future__ import annotations

import os

import torch

from ads_norm_fusion import (
    linear_layernorm,
    linear_layernorm_input_grad,
    linear_rmsnorm,
    linear_rmsnorm_input_grad,
    rmsnorm_linear,
)


def _inputs(m: int, k: int, n: int):
    """x (M, K), w (N, K), bias, γ, β (N,) requiring grad, and dy (M, N): bf16 on the GPU."""
    dev, dt = "cuda", torch.bfloat16
    leaves = [torch.randn(m, k, device=dev, dtype=dt), torch.randn(n, k, device=dev, dtype=dt) * k**-0.5]
    leaves += [torch.randn(n, device=dev, dtype=dt) for _ in range(3)]
    x, w, b, g, be = (t.requires_grad_() for t in leaves)
    return x, w, b, g, be, torch.randn(m, n, device=dev, dtype=dt)


def gluon_main() -> None:
    """The Gluon forward in the layout and kernel the environment picks: partial row blocks (M = 77,
    1), K tails (48, 1040), split 1 (N = 192) and split 2, 133 row blocks of 128 over 66 program
    pairs, wide rows over 8 (N = 4096) and 3 (N = 1536) programs per row block; inference
    (statistics) and training (x̂, every gradient) forwards."""
    shapes = ((77, 48, 128), (1, 64, 256), (300, 1040, 1024), (129, 80, 192), (17000, 48, 256),
              (77, 48, 4096), (129, 1040, 1536))  # fmt: skip
    for m, k, n in shapes:
        x, w, b, g, be, dy = _inputs(m, k, n)
        with torch.no_grad():
            linear_layernorm(x, w, b, g, be, return_stats=True)
            linear_rmsnorm(x, w, b, g, return_stats=True)
        torch.autograd.grad(linear_layernorm(x, w, b, g, be), (x, w, b, g, be), dy)
        torch.autograd.grad(linear_rmsnorm(x, w, b, g), (x, w, b, g), dy)
    torch.cuda.synchronize()
    print("memcheck cases: all paths ran")


def rms_linear_main() -> None:
    """The Gluon ``rmsnorm_linear`` forward (``ADS_NORM_FUSION_RMS_GLUON=on``) in the tile walk the
    environment picks: partial row blocks, K tails (48, 1040), column tails (N = 80, 272, 1040 in
    256- or 128-wide tiles), 133 row blocks, 16 column tiles per row block; forward and gradients."""
    dev, dt = "cuda", torch.bfloat16
    for m, k, n in ((77, 48, 80), (1, 48, 1040), (300, 1040, 1040), (129, 80, 272), (17000, 48, 272),
                    (77, 48, 4096)):  # fmt: skip
        x, w, b, _, _, dy = _inputs(m, k, n)
        gk = torch.randn(k, device=dev, dtype=dt, requires_grad=True)
        torch.autograd.grad(rmsnorm_linear(x, gk, w, b), (x, gk, w, b), dy)
    torch.cuda.synchronize()
    print("memcheck cases: all paths ran")


def main() -> None:
    if os.environ.get("ADS_NORM_FUSION_RMS_GLUON") == "on":
        rms_linear_main()
        return
    if os.environ.get("ADS_NORM_FUSION_GLUON") == "on":
        gluon_main()
        return
    dev, dt = "cuda", torch.bfloat16
    # 17000 rows: 133 row blocks of 128 over 132 persistent programs, the second of program 0 partial
    for m, k, n in ((77, 48, 80), (1, 48, 1040), (300, 1040, 1040), (129, 80, 272), (17000, 48, 272)):
        x, w, b, g, be, dy = _inputs(m, k, n)
        y, mean, rstd = linear_layernorm(x, w, b, g, be, return_stats=True)
        torch.autograd.grad(y, (x, w, b, g, be), dy)
        y2, rrms = linear_rmsnorm(x, w, b, g, return_stats=True)
        torch.autograd.grad(y2, (x, w, b, g), dy)
        gk = torch.randn(k, device=dev, dtype=dt, requires_grad=True)
        y3 = rmsnorm_linear(x, gk, w, b)
        torch.autograd.grad(y3, (x, gk, w, b), dy)
        # the other backward: dx with x̂·γ from the GEMM's epilogue, then dW from raw x (split-M kernel)
        os.environ.update(ADS_NORM_FUSION_RMS_BWD="input", ADS_NORM_FUSION_RMS_DW="kernel")
        torch.autograd.grad(rmsnorm_linear(x, gk, w, b), (x, gk, w, b), dy)
        os.environ["ADS_NORM_FUSION_RMS_DW"] = "cublas"
        torch.autograd.grad(rmsnorm_linear(x, gk, w, b), (x, gk, w, b), dy)
        # dx by the output-tiled GEMM (K <= 256: row coefficient formed in its whole-row tile)
        os.environ.update(ADS_NORM_FUSION_RMS_BWD="output", ADS_NORM_FUSION_RMS_DW="kernel")
        torch.autograd.grad(rmsnorm_linear(x, gk, w, b), (x, gk, w, b), dy)
        os.environ["ADS_NORM_FUSION_RMS_AUX_DESC"] = "0"  # x in, dx out through pointer tiles
        torch.autograd.grad(rmsnorm_linear(x, gk, w, b), (x, gk, w, b), dy)
        for knob in ("ADS_NORM_FUSION_RMS_BWD", "ADS_NORM_FUSION_RMS_DW", "ADS_NORM_FUSION_RMS_AUX_DESC"):
            del os.environ[knob]
        xhat = linear_layernorm(x.detach(), w.detach())
        dyn = torch.randn(m, 48, device=dev, dtype=dt)
        w_next_t = torch.randn(48, n, device=dev, dtype=dt)
        linear_layernorm_input_grad(dyn, w_next_t, xhat, rstd, g.detach(), weight_grads=True)
        linear_rmsnorm_input_grad(dyn, w_next_t, xhat, rrms)
    torch.cuda.synchronize()
    print("memcheck cases: all paths ran")


if __name__ == "__main__":
    main()
