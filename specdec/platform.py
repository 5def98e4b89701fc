"""The machine: CPU feature flags, the cores this process may use, and pinning to them."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Sequence as Seq
from functools import cache
from pathlib import Path

import torch


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


# AMD's CPU families by core: 0x17 Zen and Zen 2, 0x19 Zen 3 and Zen 4 (only Zen 4 has
# AVX-512), 0x1A Zen 5. Clouds report a bare "AMD EPYC" as the model name, and the cores differ
# where our kernels care: Zen 4 runs a 512-bit instruction as two 256-bit halves, Zen 5 does
# two 512-bit FMAs or integer dot products a cycle.
_AMD_CORES = {0x17: "Zen 2", 0x1A: "Zen 5"}


@cache
def cpu_identity() -> dict:
    """The CPU as /proc/cpuinfo names it: model name, vendor, family, model, and the core
    (microarchitecture) where the family tells it (AMD); empty where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's entry is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    out = {"name": fields.get("model name"), "vendor": fields.get("vendor_id")}
    try:
        out["family"], out["model"] = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return out
    if out["vendor"] == "AuthenticAMD":
        if out["family"] == 0x19:
            out["core"] = "Zen 4" if "avx512f" in cpu_flags() else "Zen 3"
        elif out["family"] in _AMD_CORES:
            out["core"] = _AMD_CORES[out["family"]]
    elif out["vendor"] == "GenuineIntel" and "amx_int8" in cpu_flags():
        # a VM may report another model number (167 on this project's Xeon); AMX is what says
        # the core is a Sapphire Rapids or newer (AVX-512 at full width, VNNI, BF16)
        out["core"] = "Sapphire Rapids or newer (AMX)"
    return out


_kernel_threads = [max(1, torch.get_num_threads())]


def kernel_threads() -> int:
    """Threads our CPU kernels use (torch's own pool is set beside it by ``pin_cpu_cores``)."""
    return _kernel_threads[0]


def set_kernel_threads(n: int) -> None:
    _kernel_threads[0] = max(1, int(n))


def machine_cores() -> list[int] | None:
    """The CPUs this process could use when specdec was imported (pinning narrows it later)."""
    return list(_MACHINE_CORES) if _MACHINE_CORES is not None else None


_MACHINE_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pin_cpu_cores(cores: Seq[int] | None, num_threads: int | None) -> int:
    """Pin this process to ``cores`` (one thread each) and set torch's and our thread count."""
    if cores is not None:
        cores = sorted(set(int(c) for c in cores))
        if not cores:
            raise ValueError("cpu_cores is empty")
        try:
            os.sched_setaffinity(0, cores)
        except (OSError, AttributeError) as exc:
            raise ValueError(f"cannot run on CPU cores {cores}: {exc}") from exc
        num_threads = num_threads or len(cores)
    n = num_threads or torch.get_num_threads()
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    set_kernel_threads(n)
    return n


def split_cores(cpu_cores, draft_cpu_cores, device: str, draft_device: str | None):
    """SSD gives the drafter hardware of its own. On the CPU: by default the drafter takes the
    last available core and the target the others (2 cores: target 0, drafter 1)."""
    if (draft_device or device) != "cpu":
        return cpu_cores, draft_cpu_cores
    available = machine_cores()
    if draft_cpu_cores is None:
        pool = sorted(cpu_cores) if cpu_cores is not None else available
        if not pool or len(pool) < 2:
            raise ValueError(
                "SSD on the CPU needs at least 2 cores (one for the drafter); "
                "pass draft_cpu_cores to share"
            )
        draft_cpu_cores = [pool[-1]]
        if cpu_cores is None:
            cpu_cores = pool[:-1]
    elif cpu_cores is None and available is not None:
        rest = [c for c in available if c not in set(draft_cpu_cores)]
        cpu_cores = rest or available
    if available is not None and not set(draft_cpu_cores) <= set(available):
        raise ValueError(
            f"draft_cpu_cores {list(draft_cpu_cores)} not all available "
            f"(this process may use {available})"
        )
    return cpu_cores, list(draft_cpu_cores)


def release_freed_memory() -> None:
    """Give the C heap's freed pages back to the system (glibc keeps them otherwise: after a
    drafter is re-quantized from its dequantized matrices, ~0.5 GB of them)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)
