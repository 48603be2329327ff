# Sourced by the ci/ scripts: picks the Python to use and how the packages become importable.
#
# Where torch and triton already import (the GPU machine, a developer's env), nothing is installed and
# the packages run from source through PYTHONPATH. Otherwise a .venv is made once with the CPU build of
# torch and the pinned triton, and the tools and packages are installed into it in editable mode.
# ADS_TORCH_INDEX may name an extra package index (e.g. the CPU wheel index of PyTorch).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_PIN=${ADS_TORCH_PIN:-torch==2.13.0}
TRITON_PIN=${ADS_TRITON_PIN:-triton==3.6.0}
TEST_TOOLS=(pytest numpy matplotlib expecttest ruff)

ci_log() { printf '[ci] %s\n' "$*" >&2; }

ci_base_python() {
  local py
  for py in "${PYTHON:-}" python3 python; do
    [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 && { echo "$py"; return 0; }
  done
  ci_log "no python3 found"; return 1
}

# ci_with_deps FOLDER... -> the folders and, transitively, the sibling packages of this repository
# their pyproject dependencies name (ads-jfa needs lp-fa4), one per line
ci_with_deps() {
  "$(ci_base_python)" - "$ROOT" "$@" <<'PYEOF'
import re, sys
from pathlib import Path
root = Path(sys.argv[1])
sys.path.insert(0, str(root / "ci"))
from packages import all_packages  # noqa: E402
by_dist = {p.dist: p.folder for p in all_packages()}
def deps(folder):
    text = (root / folder / "pyproject.toml").read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    names = re.findall(r'"\s*([A-Za-z0-9_.-]+)', block.group(1)) if block else []
    return [by_dist[n] for n in names if n in by_dist]
seen, todo = [], list(sys.argv[2:])
while todo:
    f = todo.pop(0).rstrip("/")
    if f not in seen:
        seen.append(f)
        todo += deps(f)
print("\n".join(seen))
PYEOF
}

# ci_setup_python FOLDER...  -> sets PY and CI_MODE (source|venv); sibling dependencies come along
ci_setup_python() {
  local base; base=$(ci_base_python) || return 1
  mapfile -t _ci_folders < <(ci_with_deps "$@") || return 1
  set -- "${_ci_folders[@]}"
  if "$base" -c "import torch, triton, pytest" >/dev/null 2>&1; then
    PY=$base; CI_MODE=source
    local paths=() f
    for f in $(printf "%s\n" "$@" | sort -u); do paths+=("$ROOT/$f/src"); done
    PYTHONPATH=$(IFS=:; echo "${paths[*]}")${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
    ci_log "torch and triton found in $("$base" -c 'import sys; print(sys.prefix)' | sed "s#^$HOME#~#"): running from source, installing nothing"
    return 0
  fi
  CI_MODE=venv
  PY=$ROOT/.venv/bin/python
  local extra=()
  [ -n "${ADS_TORCH_INDEX:-}" ] && extra=(--extra-index-url "$ADS_TORCH_INDEX")
  if ! { [ -x "$PY" ] && "$PY" -c "import torch, triton, pytest" >/dev/null 2>&1; }; then
    ci_log "torch/triton missing: creating .venv with $TORCH_PIN (CPU) and $TRITON_PIN"
    "$base" -m venv "$ROOT/.venv" || return 1
    "$PY" -m pip install -q --upgrade pip >/dev/null 2>&1
    "$PY" -m pip install -q "${extra[@]}" "$TORCH_PIN" "$TRITON_PIN" "${TEST_TOOLS[@]}" || return 1
  fi
  local editable=() f
  for f in $(printf "%s\n" "$@" | sort -u); do editable+=(-e "$ROOT/$f"); done
  "$PY" -m pip install -q --no-deps "${editable[@]}" || return 1
}

# Triton kernels go through the interpreter wherever there is no GPU.
ci_set_interpreter() {
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    unset TRITON_INTERPRET; CI_GPU=1
  else
    export TRITON_INTERPRET=1; CI_GPU=0
  fi
}

# ci_resolve NAME... -> lines "folder<TAB>dist<TAB>module"; exits 2 on an unknown name
ci_resolve() {
  "$(ci_base_python)" "$ROOT/ci/packages.py" resolve "$@"
}
