#!/usr/bin/env bash
# Creates .venv in the repository root and installs specdec with its test tools.
# torch is pinned to the CPU build 2.13.0 first: an unpinned torch would pull several GB of CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import specdec, torch; print('specdec ready: torch', torch.__version__)"
