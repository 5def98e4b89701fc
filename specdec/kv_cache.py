"""KVCache: preallocated keys/values for a batch of sequences, one row per sequence.

Each row has its own length. Appending happens inside the attention op (new keys go to slots
length..length+T-1); rolling back after a rejected speculation is O(1): only the length
moves, and stale slots are overwritten by the next append. Slots and RoPE positions are
separate ideas, so a tree of speculative branches can share a prefix in one row.
"""

from __future__ import annotations

import psutil
import torch

from specdec.config import KV_BUDGET, ModelConfig


def kv_budget_bytes() -> int:
    """Bytes the KV caches may take: a fixed share of the machine's RAM."""
    return int(psutil.virtual_memory().total * KV_BUDGET)


class CacheFullError(RuntimeError):
    pass


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        max_rows: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.max_rows = max_rows
        self.max_len = max_len
        shape = (max_rows, cfg.num_kv_heads, max_len, cfg.head_dim)
        # one tensor, each layer's keys and values a contiguous view of it: moving slots
        # (``move_slots``) is then one copy for every layer, where a copy per layer and K/V took
        # 1.8 ms for SSD's draft (48 tensors), in every round the target waited for it
        self.kv = torch.zeros((2, cfg.num_layers, *shape), device=device, dtype=dtype)
        self.k, self.v = list(self.kv[0].unbind(0)), list(self.kv[1].unbind(0))
        self.lengths = torch.zeros(max_rows, dtype=torch.int64)  # on the CPU: cheap to read
        self._free = list(range(max_rows - 1, -1, -1))

    # -- rows --------------------------------------------------------------------------------
    def allocate(self) -> int:
        if not self._free:
            raise CacheFullError(f"all {self.max_rows} cache rows are in use")
        row = self._free.pop()
        self.lengths[row] = 0
        return row

    def free(self, row: int) -> None:
        self.lengths[row] = 0
        self._free.append(row)

    @property
    def free_rows(self) -> int:
        return len(self._free)

    # -- lengths -----------------------------------------------------------------------------
    def length(self, row: int) -> int:
        return int(self.lengths[row])

    def rollback(self, row: int, length: int) -> None:
        """Forget everything after ``length`` tokens (O(1))."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot roll row {row} back to {length} (has {self.length(row)})")
        self.lengths[row] = length

    def move_slots(self, row: int, slots: list[int], dst: int) -> None:
        """Copy the keys/values at ``slots`` (in order) to slots dst, dst+1, .. and end the row
        there: a drafted branch of a speculation tree becomes the row's continuation. The
        source is read before anything is written, so the two may overlap."""
        n = len(slots)
        if dst > self.lengths[row] or dst + n > self.max_len:
            raise ValueError(f"cannot move {n} slots to {dst} in row {row}")
        src = torch.as_tensor(slots, dtype=torch.int64, device=self.kv.device)
        self.kv[:, :, row, :, dst : dst + n] = self.kv[:, :, row, :, src]
        self.lengths[row] = dst + n

    def check_room(self, rows: torch.Tensor, new_tokens: int) -> None:
        need = int(self.lengths[rows].max()) + new_tokens
        if need > self.max_len:
            raise CacheFullError(f"KV cache holds {self.max_len} slots per row, {need} needed")
