"""The loop every model drafter runs: from the draft's logits for the first draft position,
draw a token (its distribution, then a sample from it), run the draft model on that token for
the next position's logits, and so on, ``depth`` tokens in all (no pass after the last).

Callers differ only in how they draw (SD samples from q, the SSD worker from Saguaro's q')
and how they run the model (one token per row, or one per branch of a tree), so both are
parameters. The draws happen in position order, so a seeded drafter's random stream is used
in the same order whatever the batch.

``stop`` makes the loop "anytime": asked before each pass, it can end the drafting early
(the SSD worker stops when the verification outcome it drafts for has arrived).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# (logits for draft position i [..., V], i) -> the tokens drawn there [...]
Draw = Callable[[torch.Tensor, int], torch.Tensor]
# (tokens drawn at position i [...], i) -> the logits for position i + 1 [..., V]
Advance = Callable[[torch.Tensor, int], torch.Tensor]


def draft_tokens(
    logits: torch.Tensor,
    depth: int,
    draw: Draw,
    advance: Advance,
    stop: Callable[[], bool] | None = None,
) -> list[torch.Tensor]:
    """The tokens drawn at positions 0..depth-1, one tensor each; fewer (at least one) if
    ``stop()`` turns true before a pass."""
    drawn = []
    for i in range(depth):
        tokens = draw(logits, i)
        drawn.append(tokens)
        if i + 1 == depth or (stop is not None and stop()):
            break
        logits = advance(tokens, i)
    return drawn
