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
# SIMDe's headers let the tests run the AVX-512 kernel builds on AVX2-only CPUs (emulated)
if [ ! -f /usr/include/simde/x86/avx512.h ] && command -v apt-get >/dev/null; then
    if [ "$(id -u)" = 0 ]; then APT=(apt-get); else APT=(sudo -n apt-get); fi
    echo "installing libsimde-dev (Debian) for the AVX-512 kernel tests on AVX2 CPUs"
    { "${APT[@]}" install -y -q libsimde-dev >/dev/null 2>&1 ||
        { "${APT[@]}" update -q >/dev/null 2>&1 && "${APT[@]}" install -y -q libsimde-dev >/dev/null; }; } ||
        echo "warning: libsimde-dev not installed: AVX-512 kernel tests skip on AVX2-only CPUs" >&2
fi
pip_install --upgrade pip
pip_install torch==2.13.0
pip_install -e ".[test,eval]"
if [ "${1:-}" = "--peers" ]; then
    echo "building llama-cpp-python from source (5-20 min)..."
    ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
    # llama.cpp's AMX backend crashes on our Q4_K_M files on a Sapphire Rapids (SIGSEGV in
    # ggml_backend_amx_mul_mat, llama.cpp issue 20824): built without it, llama.cpp keeps its
    # AVX-512 VNNI kernels and repacked weights, the path it takes on any other AVX-512 CPU
    if [ -z "${CMAKE_ARGS:-}" ] && grep -q -w amx_int8 /proc/cpuinfo 2>/dev/null; then
        NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        ARGS="$ARGS -DCMAKE_C_FLAGS='$NOAMX' -DCMAKE_CXX_FLAGS='$NOAMX'"
        echo "this CPU has AMX: llama.cpp is built without its AMX backend (llama.cpp issue 20824)"
    fi
    # --no-cache-dir: llama.cpp builds for the CPU it is built on (-march=native), so a wheel
    # that pip cached on another machine (or with other CMAKE_ARGS) must not be reused
    CMAKE_ARGS="$ARGS" .venv/bin/python -m pip install --no-cache-dir -e ".[test,eval,peers]"
fi
.venv/bin/python -c "import specdec, torch; print('specdec ready: torch', torch.__version__)"
