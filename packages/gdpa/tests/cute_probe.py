"""GPU bisection of the CuTe DSL backward's build switches, for one device run (not a pytest module).

``python tests/cute_probe.py bisect``: each build (``VARIANTS``) checks two small cases against the
fp32 reference in its own process (a device fault poisons the CUDA context), then compute-sanitizer
runs the default build if it failed, then the first good build runs the GPU case matrix of
``test_cute_bwd`` and the A/B timing against the Gluon backward (B=1152, H=4, D=128, max 2048,
sparsity 1.0 and 0.5, fast_gelu, medians of ``ads_kernel_tools.bench.time_fn``; with
``CUTE_PROBE_AB=short`` max 512 at sparsity 0.5 and the bench's short KV, 256 keys per sequence;
``keys`` 512 and 1024 keys against max 2048 queries, and max 1024 and 512 self-attention).
``python tests/cute_probe.py run VARIANT smoke|all|ab [ACT]`` runs one build (``ab``: smoke cases and
the A/B timing, no matrix). ``python tests/cute_probe.py compare VARIANT ...`` runs ``ab`` for each
build in its own process. ``python tests/cute_probe.py profile [VARIANT [MAX_LEN]]`` launches the
Gluon and the CuTe backward once each at sparsity 1.0, 264 x 2048 / MAX_LEN sequences (after
compiling), for a profiler:
``ncu --set full -k regex:"gdpa_bwd_ws|GdpaBwdSm90" -c 2 -o bwd python tests/cute_probe.py profile``.
Output lines start with the build's name.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# build switches of ads_gdpa.cute.bwd_sm90.GdpaBwdSm90; "nodq" leaves dQ out (wrong dQ, diagnosis only)
VARIANTS = {
    "default": {},
    # the two instructions FA4's sm90 backward does not use, replaced by the ones it does
    "fa4like": {"DS_KMAJOR": True, "DQ_MODE": "bulk"},
    "bulk": {"DQ_MODE": "bulk"},  # dQ by plain bulk reductions, no tensor map
    "kmajor": {"DS_KMAJOR": True},  # dQ GEMM with A K-major, no transposed-A wgmma
    "hint": {"L2_HINT": 0x1000000000000000},  # CUTLASS's EVICT_NORMAL policy on every TMA instruction
    "atomic": {"DQ_MODE": "atomic"},
    "noreg": {"REGS": None},
    "nodq": {"DQ_MODE": "none"},
    # dQ staged column-block-major at every key length, or row-major at every one
    "col8": {"DQ_COL8": True},
    "rowdq": {"DQ_COL8": False},
    # fast_gelu's act and act' in packed bf16x2 arithmetic (bf16 inputs)
    "packed": {"ACT_PACKED": True},
}
SMOKE = [
    dict(lens_q=[128, 256], lens_k=[128, 256], H=2, H_kv=2),
    dict(lens_q=[130, 64, 1, 300, 0], lens_k=[130, 64, 1, 300, 7], H=4, H_kv=2),
]


def _run(name: str, what: str, act: int) -> int:
    from ads_gdpa import bwd_plan
    from ads_gdpa.cute import bwd_sm90 as cb

    for key, value in VARIANTS[name].items():
        setattr(cb.GdpaBwdSm90, key, value)
    schedule = bwd_plan.schedule

    def synced_schedule(*a, **k):
        # a fault in the tile-list kernel must not be blamed on the CuTe kernel
        out = schedule(*a, **k)
        torch.cuda.synchronize()
        return out

    bwd_plan.schedule = synced_schedule
    t0 = time.time()
    cb.compiled(torch.bfloat16, 128, act)
    print(f"[{name}] first compile {time.time() - t0:.2f} s", flush=True)
    from test_cute_bwd import CASES
    from test_gluon_bwd import _check

    def attempt(label, **case):
        try:
            _check(kernel=cb.gdpa_bwd_cute, **case)
        except AssertionError as e:
            print(f"[{name}] WRONG {label}: {str(e)[:300]}", flush=True)
            return False
        print(f"[{name}] PASS {label}", flush=True)
        return True

    ok = all([attempt(f"smoke{i}", act=act, **c) for i, c in enumerate(SMOKE)])
    if what == "smoke":
        return 0 if ok else 1
    if what == "ab":  # a wrong build's timing means nothing
        if ok:
            _ab(name, cb.gdpa_bwd_cute)
        return 0 if ok else 1
    passed = sum(attempt(f"case{i} {c}", **c) for i, c in enumerate(CASES))
    print(f"[{name}] matrix {passed}/{len(CASES)} passed", flush=True)
    _ab(name, cb.gdpa_bwd_cute)
    return 0


# the A/B's shapes, (max query length, sparsity, key length or None for the query lengths), chosen
# by CUTE_PROBE_AB: "long" (the max 2048 rows), "short" (max 512 and the bench's short KV) or
# "keys"
AB_SHAPES = {
    "long": [(2048, 1.0, None), (2048, 0.5, None)],
    "short": [(512, 0.5, None), (2048, 1.0, 256)],
    # key length against query length, for a per-shape choice of a build
    "keys": [(2048, 1.0, 512), (2048, 1.0, 1024), (1024, 1.0, None), (512, 1.0, None)],
}


def _ab(name: str, cute_bwd) -> None:
    for shape in AB_SHAPES[os.environ.get("CUTE_PROBE_AB", "long")]:
        _ab_one(name, cute_bwd, *shape)
        torch.cuda.empty_cache()


def _ab_inputs(B: int, sparsity: float, max_len: int = 2048, key_len: int | None = None):
    """The A/B problem (H=4, D=128, bf16): query lengths by the upstream rule up to ``max_len``, key
    lengths the same or all ``key_len``; returns (query-key pairs, backward arguments up to the
    activation: dO, q, k, v, cu_q, cu_k, max_q, max_k)."""
    from ads_kernel_tools.testing import jagged_lengths, lengths_to_offsets

    H, D = 4, 128
    lens_q = jagged_lengths(B, max_len, sparsity, seed=0)
    lens_k = lens_q if key_len is None else [key_len] * B
    g = torch.Generator(device="cuda").manual_seed(0)

    def rows(n, scale):
        return (torch.randn(n, H, D, generator=g, device="cuda") * scale).to(torch.bfloat16)

    q, k = rows(sum(lens_q), D**-0.25), rows(sum(lens_k), D**-0.25)
    v, do = rows(sum(lens_k), 1.0), rows(sum(lens_q), 1.0)
    cu_q, cu_k = (lengths_to_offsets(n, device="cuda") for n in (lens_q, lens_k))
    pairs = sum(a * b for a, b in zip(lens_q, lens_k))
    return pairs, (do, q, k, v, cu_q, cu_k, max_len, max_len if key_len is None else key_len)


def _ab_one(name: str, cute_bwd, max_len: int, sparsity: float, key_len: int | None) -> None:
    from ads_gdpa.gluon.bwd_sm90 import gdpa_bwd_gluon
    from ads_kernel_tools.bench.timing import time_fn

    pairs, inputs = _ab_inputs(1152, sparsity, max_len, key_len)
    q, k, v = inputs[1:4]
    T, H, D = q.shape
    flop = 2.5 * 4 * H * D * pairs
    shape = f"max{max_len}" + (f" kv{key_len}" if key_len else "")
    ms, grads = {}, {}
    for kname, fn in (("gluon", gdpa_bwd_gluon), ("cute", cute_bwd)):
        out = (
            torch.zeros(T, H, D, dtype=torch.float32, device="cuda"),
            torch.empty_like(k),
            torch.empty_like(v),
        )
        args = (*inputs, 3, 1.0, *out)
        fn(*args)
        torch.cuda.synchronize()
        grads[kname] = [t.clone() for t in out]
        r = time_fn(functools.partial(fn, *args), warmup_ms=300, rep_ms=2000)
        ms[kname] = r["ms"]
        print(f"[{name}] {shape} s={sparsity} {kname}: {r['ms']:.3f} ms (p20 {r['p20']:.3f}, p80 "
              f"{r['p80']:.3f}, n={r['n']}) {flop / r['ms'] / 1e9:.1f} TFLOP/s", flush=True)  # fmt: skip
    rel = [(a.float() - b.float()).abs().max().item() / b.float().abs().max().item()
           for a, b in zip(grads["cute"], grads["gluon"])]  # fmt: skip
    print(f"[{name}] {shape} s={sparsity} cute/gluon speed {ms['gluon'] / ms['cute']:.3f}, "
          f"max |cute - gluon| / max |gluon| dq/dk/dv {rel}", flush=True)  # fmt: skip


def _profile(name: str, max_len: int = 2048) -> int:
    from ads_gdpa.cute import bwd_sm90 as cb
    from ads_gdpa.gluon.bwd_sm90 import gdpa_bwd_gluon

    for key, value in VARIANTS[name].items():
        setattr(cb.GdpaBwdSm90, key, value)
    _, inputs = _ab_inputs(264 * 2048 // max_len, 1.0, max_len)
    q, k, v = inputs[1:4]
    T, H, D = q.shape
    cb.compiled(torch.bfloat16, D, 3)
    for fn in (gdpa_bwd_gluon, cb.gdpa_bwd_cute):
        dq = torch.zeros(T, H, D, dtype=torch.float32, device="cuda")
        fn(*inputs, 3, 1.0, dq, torch.empty_like(k), torch.empty_like(v))
        torch.cuda.synchronize()
    print(f"[{name}] profile: one launch of each backward done", flush=True)
    return 0


def _bisect() -> int:
    here = os.path.abspath(__file__)
    good = None

    def sub(args, timeout, tool=()):
        try:
            run = subprocess.run([*tool, sys.executable, here, "run", *args], capture_output=True, text=True,
                                 timeout=timeout)  # fmt: skip
            return run.returncode, run.stdout + run.stderr
        except FileNotFoundError as e:  # no compute-sanitizer on this machine
            return "missing", str(e)
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            return "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out

    for name in VARIANTS:
        rc, text = sub([name, "smoke"], 90)
        lines = [ln for ln in text.splitlines() if ln.startswith("[") or "Error" in ln]
        print(f"== {name}: rc={rc}", *lines[-6:], sep="\n  ", flush=True)
        if rc == 0 and good is None and name != "nodq":
            good = name
    rc, text = sub(["default", "smoke", "0"], 90)
    print(f"== default, raw activation: rc={rc}", flush=True)
    if good != "default":
        rc, text = sub(["default", "smoke"], 120, tool=("compute-sanitizer", "--print-limit", "5"))
        lines = [ln for ln in text.splitlines() if "=====" in ln][:20]
        print(f"== compute-sanitizer, default build: rc={rc}", *lines, sep="\n  ", flush=True)
    if good is not None:
        rc, text = sub([good, "all"], 300)
        print(f"== {good}: matrix and A/B, rc={rc}", *text.splitlines()[-30:], sep="\n  ", flush=True)
    return 0


def _compare(names: list[str]) -> int:
    here = os.path.abspath(__file__)
    for name in names:
        try:
            run = subprocess.run([sys.executable, here, "run", name, "ab"], capture_output=True, text=True,
                                 timeout=120)  # fmt: skip
            rc, text = run.returncode, run.stdout + run.stderr
        except subprocess.TimeoutExpired:
            rc, text = "timeout", ""
        lines = [ln for ln in text.splitlines() if ln.startswith("[") or "Error" in ln]
        print(f"== {name}: rc={rc}", *lines[-12:], sep="\n  ", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "bisect":
        sys.exit(_bisect())
    if sys.argv[1] == "compare":
        sys.exit(_compare(sys.argv[2:]))
    if sys.argv[1] == "profile":
        sys.exit(_profile(sys.argv[2] if len(sys.argv) > 2 else "default", *map(int, sys.argv[3:4])))
    sys.exit(_run(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 3))
