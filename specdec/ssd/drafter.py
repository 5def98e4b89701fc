"""SSDDrafter: the speculative round's view of the SSD worker.

  propose          the speculation prepared last round for the outcome that happened (a hit),
                   or a backup: "neural" (the worker drafts just in time), "fast" (prompt
                   lookup on the target, near free), "auto" (neural for small batches, fast
                   when one miss would stall many sequences)
  on_verify_start  tell the worker the round's trunk: it drafts next round's speculations for
                   the likely outcomes while the target verifies
  accept_outcome   send the outcome (k accepted, token), receive next round's speculation;
                   returns how long the target waited for it

If the worker dies or stops answering, every sequence continues on the target alone with prompt
lookup drafting (no token is lost, duplicated or changed: speculations only propose), the
worker restarts in the background, and sequences resynchronize when it is back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.config import BACKUPS
from specdec.controller import SpeculationController
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.ngram import NgramDrafter
from specdec.processors import processor_fields
from specdec.sequence import Sequence
from specdec.ssd.cache import Speculation
from specdec.ssd.channel import ChannelError
from specdec.ssd.client import WorkerHandle
from specdec.ssd.fanout import plan_fanout
from specdec.ssd.protocol import (
    Draft,
    Drafts,
    DraftSeq,
    Outcome,
    OutcomeSeq,
    Prefill,
    PrefillSeq,
    Release,
    Resize,
    Round,
    RoundSeq,
)
from specdec.ssd.stats import SSDCounters


@dataclass
class _State:
    worker_len: int = 0  # tokens of the sequence in the worker's cache (0: not there)
    generation: int = -1  # worker generation that holds it
    ready: Speculation | None = None  # speculation for this round, from last round's outcome
    ready_for: int = -1  # the sequence length (pending token included) it continues
    in_round: bool = False
    stats: SSDCounters = field(default_factory=SSDCounters)


class SSDDrafter(Drafter):
    name = "ssd"

    def __init__(
        self,
        handle: WorkerHandle,
        k: int,
        budget: int,
        fanout: str,
        backup: str,
        vocab: int,
        fallback: NgramDrafter,
        controller: SpeculationController,
        fanout_r: float = 1.0,
    ):
        if backup not in BACKUPS:
            raise ValueError(f"backup must be one of {', '.join(BACKUPS)}, got {backup!r}")
        self.handle = handle
        self.k, self.budget, self.fanout, self.fanout_r = k, budget, fanout, fanout_r
        self.backup = backup
        self.vocab = vocab
        self.fallback = fallback
        self.controller = controller
        self.states: dict[str, _State] = {}
        self._busy_seen = 0.0
        self.events: list[str] = []  # failures and restarts, for metrics and the log

    # -- bookkeeping -------------------------------------------------------------------------
    def allocate(self, seq: Sequence) -> None:
        self.states[seq.request_id] = _State()
        seq.stats.drafter = self.states[seq.request_id].stats

    def release(self, seq: Sequence) -> None:
        st = self.states.pop(seq.request_id, None)
        if st is not None and st.generation == self.handle.generation and self.handle.up:
            try:
                self.handle.notify(Release([seq.request_id]))
            except ChannelError:
                self._lost("release")

    def close(self) -> None:
        self.handle.stop()

    def resize(self, rows: int, max_len: int) -> None:
        """Match the target's cache (called when no sequence is running)."""
        cfg = self.handle.config
        if cfg.max_rows >= rows and cfg.max_len >= max_len:
            return
        cfg.max_rows, cfg.max_len = max(rows, cfg.max_rows), max(max_len, cfg.max_len)
        if self.handle.up:  # a restart would also pick the new size up from the config
            try:
                self.handle.request(Resize(cfg.max_rows, cfg.max_len))
            except ChannelError:
                self._lost("resize")

    def _lost(self, where: str) -> None:
        self.events.append(f"worker lost during {where}")
        for st in self.states.values():
            st.ready, st.in_round, st.generation = None, False, -1
            st.stats.failures += 1

    def depth(self) -> int:
        """How many tokens the worker drafts per speculation for the next round: the K the
        controller has chosen for it (it decides one round ahead: ``lookahead``), so that
        neither the tree nor a just-in-time backup drafts tokens the next round will not
        verify, and a probe's longer K is drafted. The full K until it has chosen."""
        if self.controller.fixed_k is not None:
            return self.k
        chosen = self.controller.next_k
        return self.k if chosen is None else min(self.k, max(1, chosen))

    def _plan(self, seq: Sequence, k_eff: int) -> list[int]:
        alpha = self.controller.alpha(seq)
        return plan_fanout(self.budget, k_eff, alpha, self.fanout, self.fanout_r)

    def _sync(self, seqs: list[Sequence]) -> None:
        """Give a (re)started worker the sequences it does not hold yet."""
        gen = self.handle.generation
        todo = [s for s in seqs if self.states[s.request_id].generation != gen]
        if not todo or not self.handle.up:
            return
        # everything but the pending token (right after the target's prefill: the prompt)
        cached = {s.request_id: s.all_ids[:-1] if s.output_ids else s.all_ids for s in todo}
        try:
            self.handle.notify(Prefill([self._prefill_item(s, cached[s.request_id]) for s in todo]))
        except ChannelError:
            self._lost("prefill")
            return
        for s in todo:
            st = self.states[s.request_id]
            st.generation, st.worker_len = gen, len(cached[s.request_id])
            st.ready = None

    def _prefill_item(self, seq: Sequence, tokens: list[int]) -> PrefillSeq:
        p = seq.params
        return PrefillSeq(
            sid=seq.request_id,
            tokens=tokens,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            seed=seq.rng.seed,
            fanout=self._plan(seq, self.k),
            coupled=p.coupled,
            prompt_len=len(seq.prompt_ids),
            processing=processor_fields(p),
        )

    def before_prefill(self, seqs: list[Sequence]) -> None:
        # the worker prefills the prompts on its own core while the target prefills them on
        # its: sent after the target's prefill, the worker's (0.45-0.62 s for a code prompt on
        # a Zen 3) had been the first round's wait, a request's decoding time
        self._sync(seqs)

    def after_prefill(self, seqs: list[Sequence]) -> None:
        self._sync(seqs)  # (a worker restarted during the target's prefill)

    # -- the round ---------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        self._sync(seqs)
        # a speculation continues the sequence as it was at the last outcome; rounds without
        # drafts (K = 0) since then have moved past it
        specs: list[Speculation | None] = [
            st.ready if st.ready_for == s.num_tokens else None
            for s, st in ((s, self.states[s.request_id]) for s in seqs)
        ]
        need = [i for i, sp in enumerate(specs) if sp is None and ks[i] > 0]
        if need:
            t = time.perf_counter()
            if self._use_neural(len(seqs)):  # drafted for this round: its K
                got = self._draft_now([seqs[i] for i in need], max(ks[i] for i in need))
                for i, sp in zip(need, got):
                    specs[i] = sp
            for i in need:
                st = self.states[seqs[i].request_id].stats
                if specs[i] is not None:
                    st.backup_rounds += 1
                else:
                    st.fallback_rounds += 1
                st.backup_s += time.perf_counter() - t
        return self._assemble(seqs, ks, specs)

    def _use_neural(self, batch: int) -> bool:
        if not self.handle.up:
            return False
        if self.backup == "auto":
            # a neural backup makes the whole batch wait for the misses: with batch b that
            # happens with probability 1 - hit^b; past even odds, the fast backup is better
            return 1.0 - self._hit_rate() ** batch < 0.5
        return self.backup == "neural"

    def _hit_rate(self) -> float:
        """Running hit rate over all sequences, with a prior of 0.7 worth 8 lookups."""
        hits = sum(st.stats.hits for st in self.states.values())
        looks = sum(st.stats.lookups for st in self.states.values())
        return (hits + 0.7 * 8) / (looks + 8)

    def _draft_now(self, seqs: list[Sequence], depth: int) -> list[Speculation | None]:
        items = []
        for s in seqs:
            start = self.states[s.request_id].worker_len
            items.append(DraftSeq(s.request_id, start, s.all_ids[start:]))
        t = time.perf_counter()
        try:
            reply: Drafts = self.handle.request(Draft(min(self.k, depth), items))
        except ChannelError:
            self._lost("draft")
            return [None] * len(seqs)
        wait = time.perf_counter() - t
        for s in seqs:
            st = self.states[s.request_id]
            st.worker_len = s.num_tokens - 1
            st.stats.idle_s += wait
        self._note_busy(reply, seqs)
        return reply.specs

    def _assemble(self, seqs, ks, specs) -> Proposal:
        bsz = len(seqs)
        rows_tokens: list[list[int]] = []
        fallback_rows = [i for i, sp in enumerate(specs) if sp is None and ks[i] > 0]
        fb = None
        if fallback_rows:
            fb = self.fallback.propose(
                [seqs[i] for i in fallback_rows], [ks[i] for i in fallback_rows]
            )
        kmax = max(ks)
        tokens = torch.zeros(bsz, kmax, dtype=torch.int64)
        q = torch.zeros(bsz, kmax, self.vocab)
        k = torch.zeros(bsz, dtype=torch.int64)
        for i, sp in enumerate(specs):
            if ks[i] == 0:
                rows_tokens.append([])
                continue
            if sp is None:
                j = fallback_rows.index(i)
                n = int(fb.k[j])
                tokens[i, :n] = fb.tokens[j, :n]
                q[i, :n] = fb.q[j, :n]
                k[i] = n
                continue
            n = min(ks[i], len(sp.tokens))
            tokens[i, :n] = torch.tensor(sp.tokens[:n], dtype=torch.int64)
            for pos in range(n):
                ids = torch.from_numpy(sp.q_ids[pos])
                q[i, pos].index_add_(0, ids, torch.from_numpy(sp.q_probs[pos]).float())
            k[i] = n
        return Proposal(tokens, k, q)

    def on_verify_start(self, seqs: list[Sequence], proposal: Proposal) -> None:
        if not self.handle.up:
            return
        gen = self.handle.generation
        items, members = [], []
        for i, s in enumerate(seqs):
            st = self.states[s.request_id]
            st.ready = None
            if st.generation != gen:
                continue
            kb = int(proposal.k[i])
            b_prev = s.num_tokens - 1
            catch_up = s.all_ids[st.worker_len : b_prev]
            trunk = [s.all_ids[b_prev]] + proposal.tokens[i, :kb].tolist()
            items.append(RoundSeq(s.request_id, st.worker_len, catch_up, trunk, self._plan(s, kb)))
            members.append(st)
        if not items:
            return
        try:
            self.handle.notify(Round(self.depth(), items))
        except ChannelError:
            self._lost("round")
            return
        for st in members:
            st.in_round = True

    def accept_outcome(self, seqs, prev_lengths, num_accepted, next_tokens) -> float:
        """Send each sequence's outcome; keep the speculation the worker answers with for the
        next round. Returns the seconds the target waited for the answer."""
        live = []
        for s, prev, n, t in zip(seqs, prev_lengths, num_accepted, next_tokens):
            st = self.states[s.request_id]
            if st.in_round:
                st.in_round = False
                live.append((s, prev, n, t))
        # sequences that finished this round need no speculation
        ask = [(s, prev, n, t) for s, prev, n, t in live if not s.finished]
        if not ask or not self.handle.up:
            return 0.0
        items = [OutcomeSeq(s.request_id, n, t) for s, _, n, t in ask]
        msg = Outcome(self.depth(), self._use_neural(len(seqs)), items)
        t0 = time.perf_counter()
        try:
            reply: Drafts = self.handle.request(msg)
        except ChannelError:
            self._lost("outcome")
            return time.perf_counter() - t0
        wait_s = time.perf_counter() - t0
        for (s, prev, n, _), spec, hit in zip(ask, reply.specs, reply.hits):
            st = self.states[s.request_id]
            st.worker_len = prev + n  # b_prev and the accepted drafts; the token is pending
            st.ready, st.ready_for = spec, s.num_tokens
            st.stats.count_lookup(n, hit, spec is not None, wait_s)
        self._note_busy(reply, [s for s, *_ in ask])
        return wait_s

    def _note_busy(self, reply: Drafts, seqs: list[Sequence]) -> None:
        busy = reply.busy_s
        delta = max(0.0, busy - self._busy_seen)
        self._busy_seen = busy
        for s in seqs:
            self.states[s.request_id].stats.worker_busy_s += delta
