"""A smaller model as the drafter, with its own KV cache.

Its cache lags the sequence: before drafting it catches up on every token it has not seen
(the pending token, and after a fully accepted round the last draft too), then drafts K tokens
one pass each (``draft_loop``). After verification it rolls back to the part of the sequence it
got right.
The draft distribution q comes from the same sampling transform as the target's p.
"""

from __future__ import annotations

import torch

from specdec.coupling import coupled_choice
from specdec.decoders.base import pad_right
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.draft_loop import draft_tokens
from specdec.gguf_model import source_of
from specdec.kv_cache import KVCache
from specdec.model import Transformer
from specdec.platform import release_freed_memory
from specdec.processors import Job, process_jobs
from specdec.quantize import expand_logits, restrict_head
from specdec.sampling import probabilities, sample
from specdec.sequence import Sequence

# the longest draft a confident drafter makes by itself (``draft_confidence``): 6 was the best
# of 4, 6 and 8 in the teacher-forced study (README, "dynamic draft length"), with a Zen 2's
# pass costs and a Zen 5's alike
EXTEND_CAP = 6


def load_draft_model(
    path, dtype: str | torch.dtype, device: str, quantization: str | None, head_ids
) -> Transformer:
    """The draft model made as cheap as asked: int8/int4 matrices, an output head over
    ``head_ids``. A GGUF draft keeps its embedding as the file holds it and reads only the
    kept rows of its head; asked for int8/int4, its matrices are re-quantized one by one from the
    file's exact values (on AVX2 our int4 kernel drafts ~1.7x faster than the default draft's
    Q5_0/Q8_0 blocks)."""
    from specdec import quantize

    keep = None if head_ids is None else torch.as_tensor(head_ids, dtype=torch.int64)
    # a GGUF draft is re-quantized to Q4_0 as it is read (no second copy; the rest, below, then
    # finds nothing left to do)
    requantize = "q4_0" if quantization == "q4_0" and source_of(path) is not None else None
    draft = Transformer.from_path(path, dtype, device, head_ids=keep, requantize=requantize)
    if quantization is not None:
        getattr(quantize, f"quantize_model_{quantization}")(draft)
        release_freed_memory()
    if keep is not None and draft.head_ids is None:
        restrict_head(draft, keep)
    return draft


def process_draft_logits(logits: torch.Tensor, model: Transformer, rows: list) -> torch.Tensor:
    """Draft logits [R, V'] (V': the model's head, possibly restricted) through each row's
    processors: rows[r] = (processors, output, drafts) for the position after output + drafts,
    or None to leave row r as it is; rows sharing their processors (a sequence's branches) are
    processed together. Processors see full-vocabulary logits (token ids); a row they leave
    with no allowed token of a restricted head keeps its raw logits (the draft then proposes
    tokens the target may reject: slower, still exact)."""
    need = [r for r, row in enumerate(rows) if row]
    if not need:
        return logits
    groups: dict[int, list[int]] = {}  # by processors: one job per sequence
    for i, r in enumerate(need):
        groups.setdefault(id(rows[r][0]), []).append(i)
    jobs = []
    for members in groups.values():
        processors, output, _ = rows[need[members[0]]]
        jobs.append(Job(processors, output, members, [rows[need[i]][2] for i in members]))
    head_ids = getattr(model, "head_ids", None)
    raw = logits[need]
    x = raw if head_ids is None else expand_logits(raw, head_ids, model.config.vocab_size)
    x = process_jobs(x, jobs)
    if head_ids is not None:
        x = x[:, head_ids]
        dead = torch.isneginf(x).all(-1)
        if dead.any():
            x[dead] = raw[dead]
    out = logits.clone()
    out[need] = x
    return out


def draft_distribution(
    logits: torch.Tensor,
    params: list,
    model: Transformer,
    tokenizer_vocab: int,
    target_vocab: int,
) -> torch.Tensor:
    """q over the target's rows from draft logits (of its possibly restricted head), through
    the one sampling transform the target uses too."""
    head_ids = getattr(model, "head_ids", None)
    if head_ids is not None:
        logits = expand_logits(logits, head_ids, model.config.vocab_size)
    q = probabilities(logits, params, tokenizer_vocab)
    v = q.shape[-1]
    if v > target_vocab:  # rows beyond the tokenizer are zero already
        q = q[..., :target_vocab]
    elif v < target_vocab:
        q = torch.nn.functional.pad(q, (0, target_vocab - v))
    return q


class DraftModelDrafter(Drafter):
    name = "draft-model"
    cache_slack = 2

    def __init__(
        self,
        model: Transformer,
        target_vocab: int,
        tokenizer_vocab: int,
        confidence: float = 1.0,
        k_cap: int = 0,
    ):
        self.model = model
        self.target_vocab = target_vocab  # q is returned over the target's rows
        self.tokenizer_vocab = tokenizer_vocab
        # past a row's asked K, it drafts on while the draft's top probability at its last
        # position is above ``confidence``, up to ``k_cap`` tokens (``_extend``)
        self.confidence = confidence
        self.k_cap = min(k_cap, EXTEND_CAP)
        self.cache: KVCache | None = None
        self._row: dict[str, int] = {}
        self._len: dict[str, int] = {}  # tokens of the sequence held in the draft cache

    def ensure_capacity(self, rows: int, max_len: int) -> None:
        c = self.cache
        if c is None or c.max_rows < rows or c.max_len < max_len + self.cache_slack:
            self.cache = None
            self.cache = self.model.new_cache(rows, max_len + self.cache_slack)

    def allocate(self, seq: Sequence) -> None:
        self._row[seq.request_id] = self.cache.allocate()
        self._len[seq.request_id] = 0

    def release(self, seq: Sequence) -> None:
        row = self._row.pop(seq.request_id, None)
        self._len.pop(seq.request_id, None)
        if row is not None:
            self.cache.free(row)

    def after_prefill(self, seqs: list[Sequence]) -> None:
        """Prefill the draft on the prompts now, so the first round only catches up one token."""
        tokens, lengths = pad_right([s.prompt_ids for s in seqs])
        last = (lengths - 1)[:, None]
        self.model.forward(tokens, self.cache, self._rows(seqs), num_new=lengths, logits_at=last)
        for s in seqs:
            self._len[s.request_id] = len(s.prompt_ids)

    def _rows(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor([self._row[s.request_id] for s in seqs], dtype=torch.int64)

    def _distribution(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [s.params for s in seqs]
        return draft_distribution(
            logits, params, self.model, self.tokenizer_vocab, self.target_vocab
        )

    def _processed(self, logits, seqs: list[Sequence], drafted: list, live: list[bool]):
        """Draft logits [B, V'] at the position after each row's drafts so far (``drafted``:
        one [B] tensor a position), through the sequence's processors (the target's p goes
        through the same ones)."""
        if not any(s.processors for s in seqs):
            return logits
        drafted = (
            torch.stack(drafted, 1) if drafted else torch.zeros(len(seqs), 0, dtype=torch.int64)
        )
        rows = [
            (s.processors, s.output_ids, drafted[b].tolist()) if s.processors and ok else None
            for b, (s, ok) in enumerate(zip(seqs, live))
        ]
        return process_draft_logits(logits, self.model, rows)

    def _sample(
        self, q: torch.Tensor, seqs: list[Sequence], live: list[bool], i: int
    ) -> torch.Tensor:
        """Draft position i (0-based) of every row. Rows drafting past their own k are padding:
        they draw no randomness, so a seeded request's samples do not depend on what else is
        in the batch. Coupled rows guess the target's choice with its noise (coupling.py) at
        the draft's index in the sequence, num_tokens + i."""
        u = [
            s.rng.uniform() if ok and not s.params.greedy and not s.params.coupled else 0.0
            for s, ok in zip(seqs, live)
        ]
        tokens = sample(q, u)
        coupled = [b for b, (s, ok) in enumerate(zip(seqs, live)) if ok and s.params.coupled]
        if coupled:
            w = torch.cat(
                [seqs[b].rng.noise.weights([seqs[b].num_tokens + i], q.shape[-1]) for b in coupled]
            )
            tokens[coupled] = coupled_choice(q[coupled], w).to(tokens.dtype)
        return tokens

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        rows = self._rows(seqs)
        bsz = len(seqs)
        if max(ks) == 0:
            tokens = torch.zeros(bsz, 0, dtype=torch.int64)
            q = torch.zeros(bsz, 0, self.target_vocab)
            return Proposal(tokens, torch.zeros(bsz, dtype=torch.int64), q)
        plan = list(ks)  # each row's K so far: the asked K, lengthened while confident
        caps = [self._cap(s, k) for s, k in zip(seqs, ks)]
        tokens, q = [], []
        catch_up, lengths = pad_right([s.all_ids[self._len[s.request_id] :] for s in seqs])
        last = (lengths - 1)[:, None]
        logits = self.model.forward(catch_up, self.cache, rows, num_new=lengths, logits_at=last)

        def draw(logits: torch.Tensor, i: int) -> torch.Tensor:
            live = [i < k for k in plan]
            logits = self._processed(logits, seqs, tokens, live)
            q.append(self._distribution(logits, seqs))
            tokens.append(self._sample(q[-1], seqs, live, i))
            self._extend(plan, caps, logits, i)
            return tokens[-1]

        def advance(drawn: torch.Tensor, i: int) -> torch.Tensor:
            return self.model.forward(drawn[:, None], self.cache, rows)[:, 0]

        # asked before each pass: whether any row drafts at the next position
        def done() -> bool:
            return all(k <= len(tokens) for k in plan)

        draft_tokens(logits[:, 0], max(caps), draw, advance, stop=done)
        depth = len(tokens)  # positions drafted (the cache holds all but the last)
        for s, n in zip(seqs, lengths.tolist()):
            self._len[s.request_id] += n + depth - 1
        return Proposal(
            torch.stack(tokens, 1), torch.tensor(plan, dtype=torch.int64), torch.stack(q, 1)
        )

    def _cap(self, seq: Sequence, k: int) -> int:
        """The most tokens a row may draft this round: its asked K where it asked for none or
        confidence does not lengthen drafts, else k_cap, and never past what it may emit."""
        if k == 0 or self.confidence >= 1.0:
            return k
        return max(k, min(self.k_cap, seq.remaining - 1))

    def _extend(self, plan: list[int], caps: list[int], logits: torch.Tensor, i: int) -> None:
        """Lengthen by one the rows whose planned drafts end at position i, that may draft
        more, and whose draft put more than ``confidence`` on its top token there. Which
        positions a row drafts thus depends only on its own drafts and their distributions,
        never on the target: verification stays exact (README, "dynamic draft length")."""
        grow = [b for b, (k, c) in enumerate(zip(plan, caps)) if k == i + 1 and k < c]
        if not grow:
            return
        top = torch.softmax(logits[grow].float(), -1).amax(-1).tolist()
        for b, p in zip(grow, top):
            if p > self.confidence:
                plan[b] += 1

    def accept_outcome(self, seqs, prev_lengths, num_accepted, next_tokens) -> float:
        for s, prev, n in zip(seqs, prev_lengths, num_accepted):
            rid = s.request_id
            good = min(self._len[rid], prev + n)  # pending token + accepted drafts it has seen
            self._len[rid] = good
            self.cache.rollback(self._row[rid], good)
        return 0.0
