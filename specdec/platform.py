"""The CPU cores this process may use, and pinning it to some of them."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from specdec import ops

# what the process could use when specdec was imported (pinning narrows it later)
_MACHINE_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def machine_cores() -> list[int] | None:
    """The CPUs this process could use when specdec was imported (pinning narrows it later)."""
    return list(_MACHINE_CORES) if _MACHINE_CORES is not None else None


def pin_cpu_cores(cores: Sequence[int] | None, num_threads: int | None) -> int:
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
    ops.set_num_threads(n)
    return n
