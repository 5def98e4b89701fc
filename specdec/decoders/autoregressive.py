"""Plain autoregressive decoding: one target pass per token. The baseline every method must
match token for token (greedy) and in distribution (sampling)."""

from __future__ import annotations

import time

import torch

from specdec.decoders.base import Decoder, RoundTimer
from specdec.sequence import Sequence


class AutoregressiveDecoder(Decoder):
    method = "ar"

    def round(self, seqs: list[Sequence]) -> None:
        timer = RoundTimer(seqs)
        pending = torch.tensor([[s.output_ids[-1]] for s in seqs], dtype=torch.int64)
        t = time.perf_counter()
        logits = self.target.forward(pending, self.cache, self.rows_of(seqs))[:, 0]
        timer.phase("verify", time.perf_counter() - t)
        for s in seqs:
            s.stats.target_forwards += 1
        self.append_sampled(logits, seqs)
        timer.done()
