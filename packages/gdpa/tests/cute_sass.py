"""Per-step SASS figures of the backward's query-step loop, offline (not a pytest module).

``python tests/cute_sass.py [SWITCHES ...]`` builds the CuTe DSL backward (bf16, D=128, fast_gelu) for
sm_90a once per build (``default`` or a ``tests/cute_probe.py`` variant name, or a Python dict of
``GdpaBwdSm90`` class attributes), disassembles it with nvdisasm (on PATH or Triton's) and prints the
loop's figures: instructions, wgmma, the waits and barriers in issue order, local-memory traffic.
``python tests/cute_sass.py --file K.sass`` reads an ``nvdisasm -c`` listing instead (the Gluon
backward's, for one). ``test_cute_bwd`` uses :func:`step_loops` and :func:`figures` for its checks.

A query-step loop is a loop (a backward branch and its target) that holds wgmma and no inner loop
that does: one in the CuTe kernel, one per consumer warpgroup in the Gluon kernel (its two
partitions are separate code).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?`\((\.L_x_\d+)\)")
# what a step's figures count, by opcode prefix (predicates stripped)
KINDS = {
    "wgmma": "HGMMA",
    "local": ("STL", "LDL"),
    "shared_store": ("STS", "STSM"),
    "shared_load": ("LDS", "LDSM"),
    "named_barrier": "BAR.",
    "wgmma_wait": "WARPGROUP.DEPBAR",
    "tanh": "MUFU.TANH",
    "fp32_math": ("FFMA", "FMUL", "FADD", "FSEL", "FMNMX"),
    "convert": "F2FP",
    "integer": ("IMAD", "IADD3", "VIADD", "LEA", "ISETP", "LOP3", "SHF", "PRMT", "MOV", "IABS"),
    "uniform": "U",
}


def parse(text: str) -> list[tuple[int, str]]:
    """(address, instruction) of an ``nvdisasm -c`` listing, branch targets as ``@label`` addresses."""
    insns, labels, pending = [], {}, []
    for line in text.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _INSN.search(line)
        if m:
            pc = int(m.group(1), 16)
            for name in pending:
                labels[name] = pc
            pending = []
            insns.append((pc, m.group(2)))
    return [(pc, _BRANCH.sub(lambda b: f"BRA @{labels.get(b.group(1), -1)}", op)) for pc, op in insns]


def _opcode(insn: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", insn).split()[0] if insn else ""


def step_loops(insns: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The instructions of each query-step loop (see the module docstring), in address order."""
    spans = set()
    for pc, op in insns:
        m = re.search(r"BRA @(\d+)", op)
        # an unconditional jump back is the return from an out-of-line mbarrier retry, not a loop
        if m and int(m.group(1)) <= pc and op.startswith("@"):
            spans.add((int(m.group(1)), pc))
    with_mma = [
        (lo, hi)
        for lo, hi in spans
        if any(lo <= a <= hi and _opcode(o).startswith("HGMMA") for a, o in insns)
    ]
    inner = [s for s in with_mma if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in with_mma)]
    assert inner, "no loop with wgmma in this kernel"
    return [[(a, o) for a, o in insns if lo <= a <= hi] for lo, hi in sorted(inner)]


def figures(body: list[tuple[int, str]]) -> dict:
    """Counts per kind (``KINDS``), all instructions and those a full tile's step runs (``full_tile``:
    without the sequence mask's blocks), the activation's tanh issued under dPᵀ, and the issue order
    of the wgmma groups, their waits and the named barriers (``G`` a group of wgmma closed by
    ``gsb0``, ``W1`` a wait that leaves one group in flight, ``B`` a barrier sync, ``A`` a barrier
    arrive, ``L`` local memory)."""
    ops = [_opcode(o) for _, o in body]
    out = {"instructions": len(ops), "full_tile": len(ops) - _mask_blocks(body)}
    for kind, prefixes in KINDS.items():
        out[kind] = sum(op.startswith(prefixes) for op in ops)
    order, run = [], 0
    for _, insn in body:
        op = _opcode(insn)
        if op.startswith("HGMMA"):
            run += 1
            if "gsb0" in insn:
                order.append(f"G{run}")
                run = 0
        elif op.startswith("WARPGROUP.DEPBAR"):
            order.append("W" + insn.rsplit("0x", 1)[-1])
        elif op.startswith("BAR.SYNC"):
            order.append("B")
        elif op.startswith("BAR.ARV"):
            order.append("A")
        elif op.startswith(("STL", "LDL")) and not (order and order[-1] == "L"):
            order.append("L")
    out["order"] = " ".join(order)
    # the activation's MUFU.TANH issued while the step's second GEMM (dPᵀ) is still in flight
    under, inside = 0, False
    for _, insn in body:
        op = _opcode(insn)
        if op.startswith("WARPGROUP.DEPBAR"):
            if inside:
                break
            inside = insn.endswith("0x1")
        under += inside and op.startswith("MUFU.TANH")
    out["tanh_under_gemm"] = under
    out["top"] = Counter(ops).most_common(8)
    return out


def _mask_blocks(body: list[tuple[int, str]]) -> int:
    """Instructions that a step whose tile needs no sequence mask jumps over: the blocks a forward
    branch skips that hold the mask's selects (16 or more FSEL) and no wgmma."""
    skipped = 0
    for pc, op in body:
        m = re.search(r"BRA (?:!?U?P\w+, )?@(\d+)", op)
        if m and op.startswith("@") and int(m.group(1)) > pc:
            block = [_opcode(o) for a, o in body if pc < a < int(m.group(1))]
            if sum(o == "FSEL" for o in block) >= 16 and not any(o.startswith("HGMMA") for o in block):
                skipped += len(block)
    return skipped


def nvdisasm() -> str:
    tool = shutil.which("nvdisasm")
    if tool is None:
        import importlib.util

        spec = importlib.util.find_spec("triton")
        if spec and spec.origin:
            tool = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "nvdisasm")
    if not tool or not os.path.exists(tool):
        raise FileNotFoundError("nvdisasm: not on PATH and no Triton wheel that ships it")
    return tool


_BUILD = """
import torch
from ads_gdpa.cute import bwd_sm90
for key, value in {switches!r}.items():
    setattr(bwd_sm90.GdpaBwdSm90, key, value)
bwd_sm90.compiled(torch.bfloat16, 128, {act})
"""


def build_sass(switches: dict, act: int = 3, python: str = sys.executable) -> str:
    """The ``nvdisasm -c`` listing of one offline sm_90a build (a child process: the DSL compiles
    each configuration once per process; the disk cache is off, since a loaded kernel dumps nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=tmp)
        env["ADS_GDPA_CUTE_CACHE"] = "0"
        script = textwrap.dedent(_BUILD.format(switches=switches, act=act))
        run = subprocess.run([python, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise RuntimeError(run.stderr[-4000:])
        (cubin,) = Path(tmp).glob("*.cubin")
        return subprocess.run(
            [nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True
        ).stdout


def _switches(arg: str) -> dict:
    if arg.startswith("{"):
        return ast.literal_eval(arg)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cute_probe import VARIANTS

    return VARIANTS[arg]


def _show(name: str, text: str) -> None:
    for i, body in enumerate(step_loops(parse(text))):
        f = figures(body)
        order, top = f.pop("order"), f.pop("top")
        print(f"[{name} loop {i}]", " ".join(f"{k}={v}" for k, v in f.items()), flush=True)
        print(f"[{name} loop {i}] order: {order}", flush=True)
        print(f"[{name} loop {i}] most frequent: {top}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:] or ["default"]
    if args[0] == "--file":
        for path in args[1:]:
            _show(Path(path).name, Path(path).read_text())
    else:
        for arg in args:
            _show(arg, build_sass(_switches(arg)))
