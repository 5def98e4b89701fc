"""Our CPU kernels: built once per machine with the system C++ compiler, loaded with ctypes.

The build is cached under ``$SPECDEC_HOME/kernels/<hash>/`` (keyed by the source and flags),
so the first use on a machine costs a few seconds and later ones nothing. Where the kernels
cannot be used (not x86-64 with AVX2/FMA, no compiler, or ``SPECDEC_KERNELS=torch``) callers
fall back to plain torch operations; ``status()`` says which path is live and why.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from specdec.paths import specdec_home

SOURCE = Path(__file__).with_name("cpu.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
ABI_VERSION = 2

_P = ctypes.c_void_p
_L = ctypes.c_long
_F = ctypes.c_float
_I = ctypes.c_int
_SIGNATURES = {
    "linear_f32": [_P, _P, _P, _P, _L, _L, _L, _I],
    "linear_bf16": [_P, _P, _P, _P, _L, _L, _L, _I],
    "linear_i8": [_P, _P, _P, _P, _P, _L, _L, _L, _I],
    "linear_i4": [_P, _P, _P, _P, _P, _L, _L, _L, _I],
    "rmsnorm": [_P, _P, _P, _L, _L, _F, _I],
    "silu_mul": [_P, _P, _L, _L, _I],
    "rope": [_P, _P, _P, _P, _L, _L, _L, _I],
    "attend": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _L, _P, _L, _L, _L, _L, _L, _L, _F, _I],
}


def _cpu_supports_avx2() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f" {flag}" in flags for flag in ("avx2", "fma", "f16c"))


def _build(out_dir: Path) -> Path:
    lib = out_dir / "libspecdec_cpu.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several processes may ask at once (tests, workers)
        if lib.exists():
            return lib
        with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".so", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        cmd = [compiler, *FLAGS, str(SOURCE), "-o", str(tmp_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp_path.unlink(missing_ok=True)
            raise RuntimeError(f"kernel build failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        tmp_path.replace(lib)
    return lib


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("SPECDEC_KERNELS", "").lower() == "torch":
        return None, "disabled by SPECDEC_KERNELS=torch"
    if not _cpu_supports_avx2():
        return None, "CPU lacks AVX2/FMA/F16C (or is not x86-64)"
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    try:
        lib_path = _build(specdec_home() / "kernels" / key)
        lib = ctypes.CDLL(str(lib_path))
    except (OSError, RuntimeError) as exc:
        return None, f"unavailable: {exc}"
    if lib.specdec_abi_version() != ABI_VERSION:
        return None, "stale kernel build (ABI mismatch)"
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
    return lib, "specdec AVX2 kernels"


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None where torch operations must be used instead."""
    return _load()[0]


def status() -> str:
    """One line saying which CPU compute path is in use."""
    return _load()[1]
