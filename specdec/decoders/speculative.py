"""Speculative decoding (SD): the drafter proposes, the target scores all proposals in one
pass, the verifier keeps what the target agrees with. Works with any drafter (a draft model,
prompt lookup, SSD's speculation cache) and any batch, each sequence accepting its own
number of tokens.

One round, for every running sequence (cache invariant: all tokens but the pending one):
  1. K      = the controller's choice, capped by what the sequence may still emit
  2. d, q   = drafter.propose(sequence, K)                   d_i ~ q_i
              (a draft model may go on past K while it is confident: draft_confidence)
  3. p      = target([pending, d_1..d_K])                    p_1..p_{K+1}, one pass
              (row j through the sequence's processors as if d_1..d_j were output)
  4. n, t   = verify(p, q, d)                                accept d_1..d_n, then t
              (coupled rows: verify_coupled, with the request's position-keyed noise)
  5. roll the target cache back to pending + d_1..d_n; t becomes the pending token;
     append d_1..d_n, t to the sequence one by one (stops, EOS and max_tokens apply)
"""

from __future__ import annotations

import time

import torch

from specdec.controller import SpeculationController
from specdec.decoders.base import Decoder, RoundTimer
from specdec.drafters.base import Drafter
from specdec.model import Transformer
from specdec.processors import process_verify_rows
from specdec.sampling import probabilities
from specdec.sequence import Sequence
from specdec.verify import verify_rows


def draw_uniforms(seqs: list[Sequence], k: list[int], kmax: int):
    """Accept-test uniforms (k_b per row) and one for the emitted token; greedy and coupled
    rows need none (their verdicts are functions of p and the drafts, and of the noise)."""
    u_acc = torch.zeros(len(seqs), kmax, dtype=torch.float64)
    u_next = torch.zeros(len(seqs), dtype=torch.float64)
    for i, (s, kb) in enumerate(zip(seqs, k)):
        if not s.params.greedy and not s.params.coupled:
            if kb:
                u_acc[i, :kb] = torch.tensor(s.rng.uniforms(kb), dtype=torch.float64)
            u_next[i] = s.rng.uniform()
    return u_acc, u_next


def coupled_weights(seqs: list[Sequence], k: list[int], kmax: int, vocab: int):
    """For the coupled rows, the noise at the K+1 verified positions (the token after the
    pending one and j drafts sits at index num_tokens + j); ones past a row's own k_b + 1,
    where no token is chosen. None when no row is coupled."""
    coupled = [s for s in seqs if s.params.coupled]
    if not coupled:
        return None
    w = torch.ones(len(coupled), kmax + 1, vocab, dtype=torch.float64)
    for i, (s, kb) in enumerate((s, kb) for s, kb in zip(seqs, k) if s.params.coupled):
        n = s.num_tokens
        w[i, : kb + 1] = s.rng.noise.weights(list(range(n, n + kb + 1)), vocab)
    return w


class SpeculativeDecoder(Decoder):
    method = "sd"

    def __init__(
        self,
        target: Transformer,
        vocab_size: int,
        drafter: Drafter,
        controller: SpeculationController,
        method: str = "sd",
    ):
        super().__init__(target, vocab_size)
        self.drafter = drafter
        self.controller = controller
        self.method = method
        self.cache_slack = controller.k_max + 2

    # -- sequences come and go together in target and drafter ---------------------------------
    def ensure_capacity(self, rows: int, max_len: int) -> None:
        super().ensure_capacity(rows, max_len)
        self.drafter.ensure_capacity(rows, max_len + self.cache_slack)

    def allocate(self, seq: Sequence) -> None:
        super().allocate(seq)
        self.drafter.allocate(seq)

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        self.drafter.release(seq)

    def before_prefill(self, seqs: list[Sequence]) -> None:
        self.drafter.before_prefill(seqs)

    def after_prefill(self, seqs: list[Sequence]) -> None:
        self.drafter.after_prefill(seqs)

    def close(self) -> None:
        self.drafter.close()

    # -- the round ---------------------------------------------------------------------------
    def round(self, seqs: list[Sequence]) -> None:
        first = any(s.stats.rounds == 0 for s in seqs)  # (the controller's sample, below)
        timer = RoundTimer(seqs)
        k_round = self.controller.choose_k(seqs)
        ks = [max(0, min(k_round, s.remaining - 1)) for s in seqs]

        t = time.perf_counter()
        proposal = self.drafter.propose(seqs, ks) if max(ks) else None
        draft_s = time.perf_counter() - t
        timer.phase("draft", draft_s)
        bsz = len(seqs)
        if proposal is None:
            drafts, k = torch.zeros(bsz, 0, dtype=torch.int64), torch.zeros(bsz, dtype=torch.int64)
            q = torch.zeros(bsz, 0, 1)
        else:
            drafts, k, q = proposal.tokens, proposal.k, proposal.q

        if proposal is not None:
            self.drafter.on_verify_start(seqs, proposal)
        t = time.perf_counter()
        pending = torch.tensor([[s.output_ids[-1]] for s in seqs], dtype=torch.int64)
        logits = self.target.forward(
            torch.cat([pending, drafts], 1), self.cache, self.rows_of(seqs), num_new=k + 1
        )
        verify_s = time.perf_counter() - t
        timer.phase("verify", verify_s)

        # row j of a sequence follows its drafts d_1..d_j: processed as AR would after them
        logits = process_verify_rows(logits, seqs, drafts, k)
        p = probabilities(logits, [s.params for s in seqs], self.vocab_size)
        kmax = drafts.shape[1]
        u_acc, u_next = draw_uniforms(seqs, k.tolist(), kmax)
        weights = coupled_weights(seqs, k.tolist(), kmax, p.shape[-1])
        coupled = [s.params.coupled for s in seqs]
        verdict = verify_rows(p, q, drafts, k, coupled, u_acc, u_next, weights)

        prev_lengths = [s.num_tokens for s in seqs]
        n_acc = verdict.num_accepted.tolist()
        nxt = verdict.next_token.tolist()
        emitted = [d[:n] + [t] for d, n, t in zip(drafts.tolist(), n_acc, nxt)]
        # logprobs from the logits p was made of: the target's rows, never the drafter's q
        lps = self.logprobs_of(logits, seqs, emitted)
        for s, prev, n, kb, row, row_lps in zip(
            seqs, prev_lengths, n_acc, k.tolist(), emitted, lps
        ):
            self.cache.rollback(s.row, prev + n)  # pending + accepted drafts stay cached
            self._record(s, kb, n)
            for tok, lp in zip(row, row_lps):
                if s.append(tok, lp):
                    break
            s.rng.noise.forget_before(s.num_tokens)
        # a parallel drafter may make the target wait here for next round's drafts (SSD's
        # just-in-time backup on a miss): drafting time, as the controller must see it
        wait_s = self.drafter.accept_outcome(seqs, prev_lengths, n_acc, nxt)
        timer.phase("draft", wait_s)
        draft_s += wait_s
        total = timer.done()
        self.controller.observe_round(
            bsz, int(k.max()) if bsz else 0, draft_s, verify_s, total - draft_s - verify_s, first
        )

    @staticmethod
    def _record(seq: Sequence, k: int, n: int) -> None:
        st = seq.stats
        st.target_forwards += 1
        if k == 0:
            return
        st.drafted += k
        st.accepted += n
        st.judged += n + (n < k)
        st.accepted_lengths.append(n)
        for i in range(k):
            if len(st.position_proposed) <= i:
                st.position_proposed.append(0)
                st.position_accepted.append(0)
            st.position_proposed[i] += 1
            st.position_accepted[i] += i < n
