"""Drafting every branch of the speculation tree together, in the sequence's own cache row.

After the trunk pass the row holds the prefix, then the trunk [b_prev, d_1..d_K] at slots
L..L+K. Branch j continues the outcome (k_j accepted, then candidate b_j): its root b_j sits
at position L+k_j+1 and each of its K draft steps adds one token. All branches advance one
step per forward pass: step s writes branch j's token at slot C0 + s*B + j (C0 = L+K+1), and
that token sees the prefix, the trunk up to d_{k_j}, and its own branch's earlier tokens. No
prefix is copied per branch; the mask does the forking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TreeLayout:
    """One sequence's branches: trunk start L, trunk drafts K_t, and each branch's k."""

    start: int  # slot (and position) of b_prev, the trunk's first token
    trunk_drafts: int  # K_t: drafts in the trunk after b_prev
    branch_k: list[int]  # accepted-prefix length of each branch

    @property
    def first_branch_slot(self) -> int:
        return self.start + self.trunk_drafts + 1

    @property
    def width(self) -> int:
        return len(self.branch_k)

    def slot(self, step: int, j: int) -> int:
        return self.first_branch_slot + step * self.width + j

    def positions(self, step: int) -> list[int]:
        return [self.start + k + 1 + step for k in self.branch_k]

    def visible(self, step: int, j: int) -> list[int]:
        """Cache slots branch j's token at ``step`` attends to (itself included)."""
        k = self.branch_k[j]
        trunk = list(range(self.start + k + 1))  # prefix, b_prev, d_1..d_k
        own = [self.slot(s, j) for s in range(step + 1)]
        return trunk + own


def step_inputs(layouts: list[TreeLayout], step: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """RoPE positions [N,Bmax] and attention mask [N,Bmax,S] for tree step ``step`` of N
    sequences (rows past a sequence's own width are padding)."""
    n = len(layouts)
    width = max(lay.width for lay in layouts)
    s_max = max(lay.slot(step, lay.width - 1) + 1 for lay in layouts if lay.width)
    positions = torch.zeros(n, width, dtype=torch.int64)
    mask = torch.zeros(n, width, s_max, dtype=torch.bool)
    for i, lay in enumerate(layouts):
        if not lay.width:
            continue
        positions[i, : lay.width] = torch.tensor(lay.positions(step))
        for j in range(lay.width):
            k = lay.branch_k[j]
            mask[i, j, : lay.start + k + 1] = True
            own = lay.first_branch_slot + torch.arange(step + 1) * lay.width + j
            mask[i, j, own] = True
        mask[i, lay.width :, 0] = True  # padding queries see something: finite, ignored
    return positions, mask, width
