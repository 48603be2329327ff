"""Compile Triton kernels for a GPU that is not in the machine.

Triton's compiler needs no GPU: given argument types and constexpr values it lowers a kernel to PTX
and, with the ptxas bundled in the triton wheel, to a cubin for any target. CPU CI uses this to prove
that kernels still compile for Hopper (and Blackwell) after a change, and that the Hopper build really
uses Hopper instructions (wgmma, TMA), which the interpreter can never show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# PTX markers of the features a Hopper kernel is expected to use
PTX_MARKERS = {
    "wgmma": r"wgmma\.mma_async",
    "mma": r"\bmma\.sync",
    "tma": r"cp\.async\.bulk\.tensor",
    "tma_reduce": r"cp\.reduce\.async\.bulk\.tensor",
    "tanh_approx": r"tanh\.approx",
    "atomic_add": r"(red|atom)\.global[\w.]*\.add",
    "local_memory": r"\b(ld|st)\.local",  # register spills
    "vector_load": r"\bld\.global(\.\w+)*\.v[248]\.",
}


def signature(fn, types: Mapping[str, str], constexprs: Mapping[str, Any], default: str = "i32") -> dict:
    """Argument types for ``fn``: ``types`` where given, "constexpr" for constexprs, else ``default``.

    Types use Triton's spelling: "*bf16" (pointer to bf16), "i32", "fp32", ...
    """
    unknown = (set(types) | set(constexprs)) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no arguments named {sorted(unknown)}")
    return {name: "constexpr" if name in constexprs else types.get(name, default) for name in fn.arg_names}


def compile_for(
    fn,
    *,
    types: Mapping[str, str],
    constexprs: Mapping[str, Any],
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 2,
    gluon: bool = False,
    divisible: Sequence[str] = (),
):
    """Compile the ``@triton.jit`` (or, with ``gluon``, ``@gluon.jit``) function ``fn`` for
    sm_``arch``; returns Triton's compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``,
    ``.metadata``). ``divisible`` names integer/pointer arguments to specialise as multiples of 16,
    as Triton's launcher does for aligned pointers and strides at run time (some compiler passes only
    fail, or only vectorise, under that specialisation). Raises whatever the compiler raises.
    Tensor-descriptor arguments take the type string ``triton.runtime.jit.mangle_type(descriptor)``.
    ``fn`` must have been defined while TRITON_INTERPRET was off (an interpreted kernel cannot be
    lowered): under the interpreter use :func:`ptx_counts_batch`, which compiles in a clean child
    process."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    while not hasattr(fn, "arg_names"):  # unwrap an Autotuner / Heuristics to the JITFunction
        fn = fn.fn
    source_cls = ASTSource
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source_cls
    unknown = set(divisible) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no arguments named {sorted(unknown)}")
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    # constexpr parameters left out take their defaults, as at a launch (not an i32 runtime argument)
    constexprs = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | dict(constexprs)
    src = source_cls(fn, signature(fn, types, constexprs), constexprs=constexprs, attrs=attrs)
    warp_size = 32
    return triton.compile(
        src,
        target=GPUTarget("cuda", arch, warp_size),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def ptx_counts(compiled, markers: Mapping[str, str] = PTX_MARKERS) -> dict[str, int]:
    """How often each marker's instruction pattern occurs in the kernel's PTX."""
    ptx = compiled.asm["ptx"]
    return {name: len(re.findall(pattern, ptx)) for name, pattern in markers.items()}


def sass(compiled) -> str:
    """The kernel's machine code (SASS) as text, from the nvdisasm that ships with Triton. PTX says
    what Triton asked for; only SASS shows what ptxas made of it (where it put a wait, for one)."""
    import os
    import subprocess
    import tempfile

    import triton.backends.nvidia as nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([tool, "-c", cubin.name], capture_output=True, text=True, check=True).stdout


def counts_between(text: str, start: str, stop: str, pattern: str) -> list[int]:
    """For each line matching ``start``, how many of the following lines match ``pattern`` before
    the next line matching ``stop`` (or the end). Regular expressions, searched per line: e.g. how
    many activation instructions a kernel executes while an asynchronous GEMM is still in flight."""
    lines = text.splitlines()
    counts = []
    for i, line in enumerate(lines):
        if re.search(start, line):
            n = 0
            for later in lines[i + 1 :]:
                if re.search(stop, later):
                    break
                n += bool(re.search(pattern, later))
            counts.append(n)
    return counts


# --- batches in a clean process -------------------------------------------------------------------
# Under TRITON_INTERPRET=1 every @triton.jit function is an interpreter object that the compiler
# cannot lower, and the variable is read when a module is imported. So the CPU test suites, which run
# under the interpreter, compile in a child process started without it: one child per batch, since
# importing torch costs seconds.


def _run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    import importlib

    kernel = getattr(importlib.import_module(job["module"]), job["kernel"])
    try:
        compiled = compile_for(
            kernel,
            types=job.get("types", {}),
            constexprs=job.get("constexprs", {}),
            arch=job.get("arch", 90),
            num_warps=job.get("num_warps", 4),
            num_stages=job.get("num_stages", 2),
            gluon=job.get("gluon", False),
            divisible=job.get("divisible", ()),
        )
    except Exception as e:  # reported per job so one failure does not hide the others
        return {"error": f"{type(e).__name__}: {e}"[:4000]}
    result: dict[str, Any] = dict(ptx_counts(compiled))
    # what the launch will ask for: a build over the SM's 227 KB fails only at run time
    result["shared_bytes"] = int(getattr(compiled.metadata, "shared", 0) or 0)
    between = job.get("sass_between", {})
    if between:
        text = sass(compiled)
        result |= {name: counts_between(text, *spec) for name, spec in between.items()}
    return result


def ptx_counts_batch(jobs: list[Mapping[str, Any]], *, timeout: float = 900.0) -> list[dict[str, Any]]:
    """Compile each job and count PTX markers; a job names ``module`` and ``kernel`` (importable),
    plus the keyword arguments of :func:`compile_for` (JSON values only), and optionally
    ``sass_between``: ``{name: [start, stop, pattern]}``, answered as ``name: counts_between(...)``
    over the kernel's SASS. Failures come back as ``{"error": message}``. Runs in this process, or
    in a child without TRITON_INTERPRET when the interpreter is active here."""
    import json
    import os
    import subprocess
    import sys

    from ads_kernel_tools.capability import interpreter_active

    if not interpreter_active():
        return [_run_job(job) for job in jobs]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-m", "ads_kernel_tools.compile_check"],
        input=json.dumps(list(jobs)),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"compile child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _main() -> None:
    import json
    import sys

    jobs = json.loads(sys.stdin.read())
    print(json.dumps([_run_job(job) for job in jobs]))


if __name__ == "__main__":
    _main()
