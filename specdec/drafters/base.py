"""The drafter interface. The speculative round does not care who drafts: a smaller model,
prompt lookup (n-gram), or SSD's speculation cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.sequence import Sequence


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B,K] drafted tokens (right-padded)
    k: torch.Tensor  # [B] how many of each row's K are real
    q: torch.Tensor  # [B,K,V] the distributions they were drawn from (over the target's V)


def point_masses(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """q for a deterministic drafter: a point mass on each proposed token."""
    q = torch.zeros(*tokens.shape, vocab)
    return q.scatter_(-1, tokens[..., None], 1.0)


class Drafter:
    name = "drafter"

    def ensure_capacity(self, rows: int, max_len: int) -> None:
        """Make room for ``rows`` sequences of up to ``max_len`` tokens."""

    def allocate(self, seq: Sequence) -> None:
        """A sequence joins the running batch."""

    def release(self, seq: Sequence) -> None:
        """A sequence leaves the running batch."""

    def before_prefill(self, seqs: list[Sequence]) -> None:
        """The target is about to prefill these sequences (no pending token yet)."""

    def after_prefill(self, seqs: list[Sequence]) -> None:
        """The target has just prefilled these sequences (each has one pending token)."""

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        """Up to ks[b] draft tokens continuing each sequence (all its tokens, pending included)."""
        raise NotImplementedError

    def on_verify_start(self, seqs: list[Sequence], proposal: Proposal) -> None:
        """The target is about to verify ``proposal`` (a parallel drafter starts work now)."""

    def accept_outcome(
        self,
        seqs: list[Sequence],
        prev_lengths: list[int],
        num_accepted: list[int],
        next_tokens: list[int],
    ) -> float:
        """After verification: sequence b had prev_lengths[b] tokens before the round, then
        took num_accepted[b] of the drafts and the target's next_tokens[b]. Returns the
        seconds the target waited here for next round's drafts (SSD's outcome lookup and
        just-in-time backup), which count as draft time."""
        return 0.0

    def close(self) -> None:
        """Release processes or other resources."""
