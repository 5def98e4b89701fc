"""Our CPU kernels: built once per machine with the system C++ compiler, loaded with ctypes.

One source, three builds: AVX2 + FMA (8-lane vectors), AVX-512 (16 lanes), and AVX-512 with
VNNI (adds the int4 x int8 product that drafters use); the widest the CPU runs is used. A
build is cached under ``$SPECDEC_HOME/kernels/<hash>/`` (keyed by the source and flags), so
the first use on a machine costs a few seconds and later ones nothing. ``SPECDEC_KERNELS``
overrides the choice: ``avx2``, ``avx512``, ``avx512vnni``, or ``torch`` (no kernels).
Where the kernels cannot be used (not x86-64 with AVX2/FMA, no compiler) callers fall back to
plain torch operations; ``status()`` says which path is live and why.

GGUF quantized matrices (Q4_K, Q6_K, ...) are multiplied in their file layout by the same
library (``gguf_kernels.h``, included by ``cpu.cpp``; Python API in ``specdec.kernels.gguf``).

Each build is batch invariant on its own; AVX2 and AVX-512 reduce in different orders, so bits
(not tokens, in practice) may differ between them, as between any two machines.
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
from specdec.platform import cpu_flags

SOURCE = Path(__file__).with_name("cpu.cpp")
HEADERS = [Path(__file__).with_name("gguf_kernels.h")]  # included by SOURCE: part of the build key
# tests: an AVX-512 build's code on an AVX2 CPU, through SIMDe (load_build(..., emulated=True))
EMULATION = Path(__file__).with_name("emulate_avx512.h")
COMMON_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# build name -> (extra compiler flags, CPU flags it needs beyond AVX2/FMA/F16C)
BUILDS = {
    "avx512vnni": (  # AVX-512 plus the int8 dot product: int4 drafters with int8 activations
        ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512vnni"],
        ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"),
    ),
    "avx512": (
        ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"],
        ("avx512f", "avx512bw", "avx512dq", "avx512vl"),
    ),
    "avx2": ([], ()),
}
ABI_VERSION = 10

_P = ctypes.c_void_p
_L = ctypes.c_long
_F = ctypes.c_float
_I = ctypes.c_int
_SIGNATURES = {
    "linear_f32": [_P, _P, _P, _P, _L, _L, _L, _I],
    "linear_bf16": [_P, _P, _P, _P, _L, _L, _L, _I],
    "linear_i8": [_P, _P, _P, _P, _P, _L, _L, _L, _I],
    "linear_i4": [_P, _P, _P, _P, _P, _L, _L, _L, _I],
    "linear_i4q": [_P, _P, _P, _P, _P, _L, _L, _L, _I],  # avx512vnni only
    "rmsnorm": [_P, _P, _P, _L, _L, _F, _I],
    "add_rmsnorm": [_P, _P, _P, _P, _L, _L, _F, _I],
    "silu_mul": [_P, _P, _L, _L, _I],
    "rope": [_P, _P, _P, _P, _L, _L, _L, _I],
    "rope_qk": [_P, _L, _P, _P, _P, _L, _L, _L, _L, _P, _P, _I],
    "attend": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _L, _P, _L, _L, _L, _L, _L, _L, _F, _I],
    "gguf_linear": [_I, _P, _P, _P, _P, _L, _L, _L, _L, _I, _I],
    "gguf_linear_parts": [_I, _P, _P, _P, _P, _P, _P, _L, _L, _L, _I, _I],
    "gguf_dequantize": [_I, _P, _P, _L, _L, _L, _P, _I],
    "gguf_repack": [_I, _P, _L, _L, _I],
    "gguf_quantize_q4_0": [_P, _L, _P, _I],
    # layers, L, kcs, vcs, x, B, T, Dm, HQ, HK, D, I, pos, cos, sin, rows, start, nnew, mask,
    # MS, S, scale, eps, threads
    "decoder_layers": [_P, _L, _P, _P, _P, *[_L] * 7, *[_P] * 7, _L, _L, _F, _F, _I],
}
_RESTYPES = {
    "gguf_linear": _I,
    "gguf_linear_parts": _I,
    "gguf_dequantize": _I,
    "gguf_repack": _I,
    "gguf_quantize_q4_0": _I,
    "decoder_layers": _I,
}  # the others return nothing
OPTIONAL = {"linear_i4q"}  # present in some builds only


def supported_builds() -> list[str]:
    """The builds this CPU can run, widest first."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    flags = cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return []
    return [name for name, (_, needs) in BUILDS.items() if set(needs) <= flags]


def _build(out_dir: Path, flags: list[str]) -> Path:
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
        cmd = [compiler, *flags, str(SOURCE), "-o", str(tmp_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp_path.unlink(missing_ok=True)
            raise RuntimeError(f"kernel build failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        tmp_path.replace(lib)
    return lib


def emulated_flags(name: str) -> list[str]:
    """Compiler flags for an AVX-512 build's code that runs on AVX2 (emulate_avx512.h)."""
    vnni = ["-DSPECDEC_EMULATE_VNNI"] if name == "avx512vnni" else []
    return COMMON_FLAGS + ["-include", str(EMULATION), *vnni]


@cache
def load_build(name: str, emulated: bool = False) -> tuple[ctypes.CDLL | None, str]:
    """(library, description) for one build, or (None, why not).

    ``emulated``: an AVX-512 build compiled for AVX2 with SIMDe (the same bits, several times
    slower), so that tests check those builds on AVX2-only CPUs; needs SIMDe's headers.
    """
    if emulated:
        if name == "avx2" or "avx2" not in supported_builds():
            return None, f"no emulation of the {name} build on this CPU"
        if not _simde_found():
            return None, "emulating AVX-512 needs SIMDe's headers (apt-get install libsimde-dev)"
        flags = emulated_flags(name)
    elif name not in supported_builds():
        return None, f"this CPU cannot run the {name} build"
    else:
        flags = COMMON_FLAGS + BUILDS[name][0]
    sources = [SOURCE, *HEADERS, *([EMULATION] if emulated else [])]
    text = b"".join(path.read_bytes() for path in sources)
    key = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    try:
        lib_path = _build(specdec_home() / "kernels" / key, flags)
        lib = ctypes.CDLL(str(lib_path))
    except (OSError, RuntimeError) as exc:
        return None, f"unavailable: {exc}"
    if lib.specdec_abi_version() != ABI_VERSION:
        return None, "stale kernel build (ABI mismatch)"
    for fn_name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, fn_name, None)
        if fn is None and fn_name in OPTIONAL:
            continue
        fn.argtypes = argtypes
        fn.restype = _RESTYPES.get(fn_name)
    how = ", emulated on AVX2" if emulated else ""
    return lib, f"specdec {name.upper()} kernels ({lib.specdec_vector_lanes()} fp32 lanes{how})"


def load_build_or_emulation(name: str) -> tuple[ctypes.CDLL | None, str]:
    """The build itself where this CPU runs it, else its AVX2 emulation (tests)."""
    if name in supported_builds():
        return load_build(name)
    return load_build(name, emulated=True)


def _simde_found() -> bool:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return False
    probe = subprocess.run(
        [compiler, "-x", "c++", "-E", "-", "-o", os.devnull],
        input="#include <simde/x86/avx512.h>\n",
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    choice = os.environ.get("SPECDEC_KERNELS", "").lower()
    if choice == "torch":
        return None, "disabled by SPECDEC_KERNELS=torch"
    if choice and choice not in BUILDS:  # a typo must not quietly run the slow torch path
        raise ValueError(f"SPECDEC_KERNELS={choice!r} is not one of torch, {', '.join(BUILDS)}")
    builds = supported_builds()
    if not builds:
        return None, "CPU lacks AVX2/FMA/F16C (or is not x86-64)"
    if choice:
        return load_build(choice)
    why = ""
    for name in builds:  # widest first; a build that fails falls back to the next
        lib, why = load_build(name)
        if lib is not None:
            return lib, why
    return None, why


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None where torch operations must be used instead."""
    return _load()[0]


def status() -> str:
    """One line saying which CPU compute path is in use."""
    return _load()[1]
