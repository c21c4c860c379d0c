#!/usr/bin/env bash
# Create .venv (seeing the system's packages, so an installed torch, CUDA or not, is reused as it is)
# and install vlmspec into it. torch is installed only when missing, pinned to the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLMSPEC_VENV:-.venv}
TORCH_SPEC=${VLMSPEC_TORCH_SPEC:-torch==2.13.0}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: torch not found, installing $TORCH_SPEC"
    "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
fi
stamp="$VENV/.vlmspec-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet -e ".[dev]"
    touch "$stamp"
fi
