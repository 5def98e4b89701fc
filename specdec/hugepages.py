"""Weights held in anonymous memory on 2 MB pages (transparent huge pages), where the OS allows.

A decode step streams every weight byte once, so how fast memory delivers them sets the speed.
Read through the file's mapping, a GGUF model's matrices sit on 4 KB page-cache pages: one TLB
entry and one hardware-prefetch stream break per 4 KB. Copied once at load into a private
anonymous mapping advised ``MADV_HUGEPAGE``, they sit on 2 MB pages. Measured on a 2-core AMD
EPYC (AVX2), the default target's 197 matrices multiplied by one token: 55.4 ms from the mapped
file, 54.0 ms from ordinary torch allocations, 48.1 ms from huge pages (20.4 GB/s, about what the
machine's memory gives). The copy is read with ``readinto``, so the file's pages never enter the
process's own memory: resident memory stays about the matrices' bytes.
"""

from __future__ import annotations

import contextlib
import mmap

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # every matrix starts on a cache line


class Arena:
    """One anonymous mapping that matrices are placed in back to back. Pages are committed
    only when written, so sizing it from an upper bound costs nothing."""

    def __init__(self, nbytes: int):
        size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            # THP off in this kernel: ordinary pages, still fine
            with contextlib.suppress(OSError):
                self._map.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(self._map, dtype=torch.uint8)  # keeps the mapping alive
        skip = -whole.data_ptr() % HUGE_PAGE  # start on a 2 MB boundary
        self.bytes = whole[skip : skip + size - HUGE_PAGE]
        self.used = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` uint8 of the arena, starting on a cache line."""
        start = -(-self.used // ALIGN) * ALIGN
        if start + nbytes > self.bytes.numel():
            raise MemoryError(f"arena of {self.bytes.numel()} bytes cannot hold {nbytes} more")
        self.used = start + nbytes
        return self.bytes[start : start + nbytes]
