"""Run every GDPA path on bad device offsets; meant to run under ``compute-sanitizer --tool memcheck``
(``test_gpu.py::test_bad_offsets_are_memcheck_clean``), which must report 0 errors.

The offsets are the ones of the bug report ([0, 600, 300, 5000] for 1,000 rows: decreasing and past
the end) and a negative start; no host copies, so nothing is validated and only the kernels' own
clamping keeps them inside the tensors.
"""

from __future__ import annotations

import os

import torch

import ads_gdpa  # noqa: F401  (registers the ops)
from ads_gdpa.activations import Activation
from ads_gdpa.dispatch import cute_importable
from ads_gdpa.problem import BIG, MaskMode

ROWS = 1000
CASES = [[0, 600, 300, 5000], [-300, 200, 700, 1000]]


def run(
    backend: str, d: int, mask: MaskMode, deterministic: bool, fp8: bool, cu: list[int], bwd: str = "auto"
) -> None:
    os.environ["ADS_GDPA_BACKEND"] = backend
    os.environ["ADS_GDPA_BWD_BACKEND"] = bwd
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    q = (torch.randn(ROWS, 4, d, device="cuda", generator=g) * 0.3).to(dt)
    k = (torch.randn(ROWS, 2, d, device="cuda", generator=g) * 0.3).to(dt)
    v = torch.randn(ROWS, 2, d, device="cuda", generator=g).to(dt)
    offs = torch.tensor(cu, dtype=torch.int32, device="cuda")
    left, right = (64, 64) if mask != MaskMode.NONE else (BIG, BIG)
    descales = (None, None, None)
    if fp8:
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        descales = (torch.ones(4, device="cuda"), torch.ones(2, device="cuda"), torch.ones(2, device="cuda"))
    else:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = torch.ops.ads_gdpa.fwd(
        q, k, v, offs, offs, 1024, 1024, int(Activation.FAST_GELU), None, 1.0, int(mask), left, right, False,
        *descales, None, None, deterministic,
    )  # fmt: skip
    if not fp8:
        torch.autograd.grad(out.float().sum(), (q, k, v))
    torch.cuda.synchronize()


def run_upstream_extras(cu: list[int]) -> None:
    """The upstream extras on bad device data: ad_to_request_offset out of range, start/end spans
    and output offsets past their tensors, bucket values outside the tables (all clamped on the
    device), forward and backward."""
    from ads_gdpa import generalized_dot_product_attention

    os.environ["ADS_GDPA_BACKEND"] = "auto"
    g = torch.Generator(device="cuda").manual_seed(1)
    q = (torch.randn(ROWS, 4, 128, device="cuda", generator=g) * 0.3).bfloat16().requires_grad_()
    kv = (torch.randn(ROWS, 2, 256, device="cuda", generator=g) * 0.3).bfloat16().requires_grad_()
    table = torch.randn(16, 4, 128, device="cuda", generator=g).requires_grad_()
    bkt = torch.randint(-50, 50, (ROWS,), device="cuda", generator=g)
    offs = torch.tensor(cu, dtype=torch.int32, device="cuda")
    a2r = torch.tensor([7, -2, 1], dtype=torch.int32, device="cuda")
    out = generalized_dot_product_attention(
        q, kv, None, offs, offs, 1024, 1024, a2r, ts_encoding_params=table, ts_encoding_bucket_values=bkt,
        output_offset=offs.flip(0).contiguous(),
    )  # fmt: skip
    torch.autograd.grad(out.float().sum(), (q, kv, table))
    pairs = torch.tensor(cu + [cu[-1], cu[0]], dtype=torch.int32, device="cuda")
    out = generalized_dot_product_attention(
        q, kv[..., :128], kv[..., 128:], pairs, pairs.flip(0).contiguous(), 1024, 1024, output_offset=pairs,
        use_start_end_offsets=True, total_num_objects=ROWS // 2,
    )  # fmt: skip
    torch.autograd.grad(out.float().sum(), (q, kv))
    torch.cuda.synchronize()


# the CuTe backward's builds that read or write differently: the default (max 1024 keys: dQ staged
# column-block-major) and the row-major dQ staging of short-key calls; the CuTe forward runs before
# each (ADS_GDPA_BACKEND=cute)
CUTE_BUILDS = [{}, {"DQ_COL8": False}]


def run_cute_builds(cu: list[int]) -> None:
    from ads_gdpa.cute.bwd_sm90 import GdpaBwdSm90

    for switches in CUTE_BUILDS:
        saved = {key: getattr(GdpaBwdSm90, key) for key in switches}
        for key, value in switches.items():
            setattr(GdpaBwdSm90, key, value)
        try:
            run("cute", 128, MaskMode.NONE, False, False, cu, bwd="cute")
            run("cute", 64, MaskMode.NONE, False, False, cu, bwd="cute")
        finally:
            for key, value in saved.items():
                setattr(GdpaBwdSm90, key, value)


def main() -> None:
    for cu in CASES:
        for backend in ("auto", "triton"):
            run(backend, 128, MaskMode.NONE, False, False, cu)
        run("auto", 64, MaskMode.NONE, False, False, cu)
        run("triton", 128, MaskMode.NONE, True, False, cu)
        run("triton", 128, MaskMode.TOP_LEFT, False, False, cu)
        run("triton", 128, MaskMode.BOTTOM_RIGHT, False, False, cu)
        run("auto", 128, MaskMode.NONE, False, True, cu)
        if cute_importable():  # the CuTe DSL kernels, where the extra is installed
            run_cute_builds(cu)
        run_upstream_extras(cu)
    os.environ.pop("ADS_GDPA_BWD_BACKEND", None)
    print("memcheck_bad_offsets: all paths ran")


if __name__ == "__main__":
    main()
