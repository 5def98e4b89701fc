#!/usr/bin/env bash
# Creates .venv in the repository root and installs specdec with its test tools (and
# lm-evaluation-harness, which a real-model test runs against the server).
# torch is pinned to the CPU build 2.13.0 first: an unpinned torch would pull several GB of CUDA.
# --peers also builds llama-cpp-python from source (5-20 min) for the bench's llamacpp rows.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
pip_install() {  # pip's own exit status counts; only its noisy location warnings are dropped
    .venv/bin/python -m pip install -q "$@" 2> >(grep -v '^WARNING: Location' >&2)
}
pip_install --upgrade pip
pip_install torch==2.13.0
pip_install -e ".[test,eval]"
if [ "${1:-}" = "--peers" ]; then
    echo "building llama-cpp-python from source (5-20 min)..."
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" .venv/bin/python -m pip install -e ".[test,eval,peers]"
fi
.venv/bin/python -c "import specdec, torch; print('specdec ready: torch', torch.__version__)"
