"""Coupled sampling: a seeded request's randomness is a function of the token's position.

For a request with seed s, the token at position t (its index in prompt + output) is

    x_t = argmax_v  p~_t(v) / E_t(v),      E_t(v) = -log U_t(v),   U_t = Philox4x64(key=(s, t))

where p~_t is the target's sampling distribution (temperature, then top-k, then top-p). With
E_t(v) i.i.d. Exp(1) this is the exponential race, i.e. the Gumbel-max trick written without
logs (argmax log p~ + G with G = -log E ~ Gumbel(0, 1)): x_t is an exact sample of p~_t. The noise
U_t depends on (s, t) alone, never on what was drawn before, so x_t does not depend on how many
tokens one pass computed, on K, on the batch, or on the method:

  AR           x_t directly
  SD, SSD      the drafter guesses d_t = argmax q~_t / E_t (same noise, its own distribution);
               the verifier accepts while d_t == x_t and emits x_t at the first difference (or at
               the bonus position), so every emitted token is the AR sample for that seed
  prompt lookup  its usual token, judged the same way

The price, against rejection sampling: the chance that a draft survives is P(argmax q~/E ==
argmax p~/E) instead of sum_v min(p~, q~); see README "Same seed, same text".

U_t is numpy's Philox4x64 counter stream under the 128-bit key (s mod 2^64, t): its first V
64-bit words, the top 53 bits of each as (m + 1/2) / 2^53, in (0, 1). A stream's prefix does
not depend on its length, so models whose vocabularies differ in padding rows agree on every
real token.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def race_weights(seed: int, position: int, vocab: int) -> torch.Tensor:
    """1 / E_t(v) for v < vocab: the weights x_t = argmax p~_t * w_t picks with (fp64, CPU)."""
    key = np.array([seed & _MASK64, position], dtype=np.uint64)
    raw = np.random.Philox(key=key).random_raw(vocab)
    u = torch.from_numpy((raw >> np.uint64(11)).astype(np.float64)).add_(0.5).mul_(2.0**-53)
    return u.log_().neg_().reciprocal_()


class PositionNoise:
    """One request's race weights, computed once per position: a speculative round asks for
    the same positions as the drafter did (and a rejected position again next round)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._at: dict[int, torch.Tensor] = {}

    def weights(self, positions: list[int], vocab: int) -> torch.Tensor:
        """[len(positions), vocab] fp64."""
        rows = []
        for t in positions:
            w = self._at.get(t)
            if w is None or w.shape[0] < vocab:
                w = self._at[t] = race_weights(self.seed, t, vocab)
            rows.append(w[:vocab])
        return torch.stack(rows)

    def forget_before(self, position: int) -> None:
        """Drop positions the sequence has moved past (their tokens are final)."""
        for t in [t for t in self._at if t < position]:
            del self._at[t]


def coupled_choice(probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """argmax_v probs(v) * weights(v) over the last dimension: an exact sample of ``probs``
    under exponential-race weights, the argmax itself under weights of 1 (greedy)."""
    return (probs.double() * weights.to(probs.device)).argmax(-1)
