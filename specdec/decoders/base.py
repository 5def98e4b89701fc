"""What every decoding method shares: the target, its KV cache, prefill, and sampling.

A decoder keeps one invariant per running sequence: the target's cache holds every token
of the sequence except the last one, which is "pending" and is fed first in the next pass.
"""

from __future__ import annotations

import time

import torch

from specdec.coupling import coupled_choice
from specdec.kv_cache import KVCache
from specdec.logprobs import TokenLogprob, emitted_logprobs
from specdec.model import Transformer
from specdec.processors import process_sequences
from specdec.sampling import first_argmax, probabilities, sample
from specdec.scoring import score_ids
from specdec.sequence import Sequence


def pad_right(rows: list[list[int]], fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[B,T] tokens padded on the right, and each row's real length."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    out = torch.full((len(rows), int(lengths.max())), fill, dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
    return out, lengths


class Decoder:
    method = "base"
    cache_slack = 2  # slots beyond the context a round may write (speculative tokens)

    def __init__(self, target: Transformer, vocab_size: int):
        self.target = target
        self.vocab_size = vocab_size  # tokenizer's: model rows beyond it are padding, masked
        self.cache: KVCache | None = None

    # -- capacity ----------------------------------------------------------------------------
    def ensure_capacity(self, rows: int, max_len: int) -> None:
        """(Re)allocate caches for ``rows`` sequences of up to ``max_len`` tokens; only called
        when nothing is running."""
        c = self.cache
        if c is None or c.max_rows < rows or c.max_len < max_len + self.cache_slack:
            self.cache = None  # free the old one first
            self.cache = self.target.new_cache(rows, max_len + self.cache_slack)

    def bytes_per_token(self) -> int:
        cfg = self.target.config
        elem = torch.finfo(self.target.act_dtype).bits // 8
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem

    def free_rows(self) -> int:
        return self.cache.free_rows

    def allocate(self, seq: Sequence) -> None:
        seq.row = self.cache.allocate()

    def release(self, seq: Sequence) -> None:
        if seq.row is not None:
            self.cache.free(seq.row)
            seq.row = None

    # -- shared steps ------------------------------------------------------------------------
    def rows_of(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor([s.row for s in seqs], dtype=torch.int64)

    def score_prompts(self, seqs: list[Sequence]) -> None:
        """Set ``prompt_logprobs`` of each sequence: a scoring pass of its own over the prompt
        (``scoring``), under the request's distribution, before or instead of its prefill."""
        entries = score_ids(
            self.target,
            [s.prompt_ids for s in seqs],
            [1] * len(seqs),
            [s.params for s in seqs],
            [s.params.prompt_logprobs for s in seqs],
            self.vocab_size,
        )
        for s, e in zip(seqs, entries):
            s.prompt_logprobs = [None, *e]

    def prefill(self, seqs: list[Sequence]) -> None:
        """Run the prompts through the target and sample each sequence's first token."""
        self.before_prefill(seqs)
        tokens, lengths = pad_right([s.prompt_ids for s in seqs])
        logits = self.target.forward(
            tokens,
            self.cache,
            self.rows_of(seqs),
            num_new=lengths,
            logits_at=(lengths - 1)[:, None],
        )[:, 0]
        for s in seqs:  # the cache now holds the prompt; the sampled token becomes pending
            s.stats.target_forwards += 1
        self.after_prefill(seqs)
        self.append_sampled(logits, seqs)

    def before_prefill(self, seqs: list[Sequence]) -> None:
        """Hook for drafters that work beside the target (SSD's worker prefills meanwhile)."""

    def after_prefill(self, seqs: list[Sequence]) -> None:
        """Hook for drafters that keep state per sequence."""

    def append_sampled(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Sample one token per row of ``logits`` [B,V] and append it to its sequence, with its
        logprob entry where the request asks for one."""
        logits = process_sequences(logits, seqs)  # penalties, bias, constraints first
        tokens = self.sample_tokens(logits, seqs)
        lps = self.logprobs_of(logits[:, None], seqs, [[t] for t in tokens])
        for s, tok, lp in zip(seqs, tokens, lps):
            s.append(tok, lp[0])

    def logprobs_of(
        self, logits: torch.Tensor, seqs: list[Sequence], emitted: list[list[int]]
    ) -> list[list[TokenLogprob | None]]:
        """The one place generated tokens get their logprobs: row b of logits [B,P,V] emitted
        ``emitted[b][j]`` from position j. ``logits`` must be what ``probabilities`` was given
        for the same rows (after any logits processor), so that the entries describe the
        distribution the tokens were drawn from (``specdec.logprobs``)."""
        return emitted_logprobs(logits, [s.params for s in seqs], self.vocab_size, emitted)

    def sample_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row of ``logits`` [B,V] (already through the sequences' processors)
        under each sequence's own parameters."""
        if all(s.params.greedy for s in seqs):  # the first argmax, as the one-hot would give
            return first_argmax(logits[:, : self.vocab_size]).tolist()
        probs = probabilities(logits, [s.params for s in seqs], self.vocab_size)
        uniforms = [0.0 if s.params.greedy or s.params.coupled else s.rng.uniform() for s in seqs]
        tokens = sample(probs, uniforms)
        coupled = [i for i, s in enumerate(seqs) if s.params.coupled]
        if coupled:  # the token at index num_tokens, from the request's noise there
            w = torch.cat(
                [seqs[i].rng.noise.weights([seqs[i].num_tokens], probs.shape[-1]) for i in coupled]
            )
            tokens[coupled] = coupled_choice(probs[coupled], w).to(tokens.dtype)
            for i in coupled:
                seqs[i].rng.noise.forget_before(seqs[i].num_tokens)
        return tokens.tolist()

    def round(self, seqs: list[Sequence]) -> None:
        raise NotImplementedError


class RoundTimer:
    """Adds a round's phases to every sequence that took part in it."""

    def __init__(self, seqs: list[Sequence]):
        self.seqs = seqs
        self.t0 = time.perf_counter()
        self.phases: dict[str, float] = {}

    def phase(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def done(self) -> float:
        total = time.perf_counter() - self.t0
        for s in self.seqs:
            s.stats.rounds += 1
            s.stats.decode_time += total
            s.stats.draft_time += self.phases.get("draft", 0.0)
            s.stats.verify_time += self.phases.get("verify", 0.0)
        return total
