"""The SSD drafter process.

It holds the draft model and one KV cache row per sequence (``state.py``), and answers the
target's messages (``protocol.py``) one at a time; the target never waits for a reply it does
not need. While the target verifies a round, the worker runs the round's trunk, picks the
likely outcomes' next tokens, and drafts a speculation for each, all branches at once in the
sequence's own row (``tree.py``). When the outcome comes, it returns the cached speculation
(a hit) or drafts one just in time (a miss, if asked to).

The tree is drafted "anytime": the worker stops it as soon as the outcome has arrived (one
step deeper would make the target wait for the whole tree's pass), so a speculation holds as
many tokens as the verify pass left time for, at most K.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.coupling import PositionNoise
from specdec.decoders.base import pad_right
from specdec.drafters.draft_loop import draft_tokens
from specdec.drafters.draft_model import (
    draft_distribution,
    load_draft_model,
    process_draft_logits,
)
from specdec.platform import pin_cpu_cores
from specdec.processors import TokenVocabulary, build_processors
from specdec.sampling import sample
from specdec.ssd.cache import Speculation
from specdec.ssd.channel import Channel, ChannelError, Inbox
from specdec.ssd.protocol import (
    Draft,
    Drafts,
    Outcome,
    OutcomeSeq,
    Prefill,
    Ready,
    Release,
    Resize,
    Resized,
    Round,
    RoundSeq,
    StartFailed,
    Stop,
    WorkerConfig,
)
from specdec.ssd.state import Ahead, Branch, SequenceState
from specdec.ssd.tree import TreeLayout, step_inputs


def saguaro(q: torch.Tensor, fanout: int, c: float, sparse: int):
    """q' for one position: q's top-``fanout`` probabilities times C, kept on q's top-``sparse``
    tokens, renormalized. Returns (ids [N], probs [N]); q' is zero elsewhere. The draft samples
    from q' and the verifier uses the same q', so any C keeps the output exact; C < 1 pushes
    the verifier's residual max(0, p - q') towards the cached candidates."""
    n = min(sparse, int((q > 0).sum()))
    probs, ids = q.topk(max(n, 1))
    probs = probs.double().clone()
    if c != 1.0 and fanout > 0:
        probs[:fanout] *= c
    probs /= probs.sum()
    return ids, probs


@dataclass
class _Drafted:
    """One row's (or tree branch's) drafts so far: each token with the q' it was drawn from
    and the draft's top tokens at its position."""

    tokens: list[int] = field(default_factory=list)
    q_ids: list[torch.Tensor] = field(default_factory=list)
    q_probs: list[torch.Tensor] = field(default_factory=list)
    tops: list[list[int]] = field(default_factory=list)

    def add(self, token: int, ids: torch.Tensor, probs: torch.Tensor, top: list[int]) -> None:
        self.tokens.append(token)
        self.q_ids.append(ids)
        self.q_probs.append(probs)
        self.tops.append(top)

    def speculation(self) -> Speculation:
        n = max(len(x) for x in self.q_ids)
        q_ids = np.zeros((len(self.tokens), n), dtype=np.int64)
        q_probs = np.zeros((len(self.tokens), n), dtype=np.float64)
        for i, (ids, probs) in enumerate(zip(self.q_ids, self.q_probs)):
            q_ids[i, : len(ids)] = ids.numpy()
            q_probs[i, : len(probs)] = probs.numpy()
        return Speculation(list(self.tokens), q_ids, q_probs)


def _candidates(trunk: list[int], fanout: list[int], tops: list[list[int]]):
    """The tree's branches: for each number k of accepted drafts, up to fanout[k] of the
    draft's top tokens at that position, without d_{k+1} (a rejected token is never the
    replacement). Returns each branch's k and its root token."""
    branch_k, roots = [], []
    for k, fan in enumerate(fanout[: len(trunk)]):
        if fan <= 0:
            continue
        excluded = trunk[k + 1] if k + 1 < len(trunk) else None
        picks = [t for t in tops[k][: fan + 1] if t != excluded][:fan]
        branch_k += [k] * len(picks)
        roots += picks
    return branch_k, roots


class DraftWorker:
    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.model = load_draft_model(
            cfg.draft_path, cfg.dtype, cfg.device, cfg.quantization, cfg.head_ids
        )
        self.tree_slack = (cfg.k + 2) * (cfg.budget + 2) + 8
        self.cache = self.model.new_cache(cfg.max_rows, cfg.max_len + self.tree_slack)
        self.seqs: dict[str, SequenceState] = {}
        self.busy_s = 0.0
        self.inbox: Inbox | None = None  # set by serve; None: nothing can stop the tree early
        self._tokenizer = None  # loaded for the first request with a grammar constraint

    def _vocabulary(self, params) -> TokenVocabulary:
        """What the request's processors need of the tokenizer: the tokenizer itself only for
        a grammar constraint (constraints.py), whose masks read token text."""
        if getattr(params, "constraint", None) is None or not self.cfg.tokenizer_path:
            return TokenVocabulary(self.cfg.tokenizer_vocab)
        if self._tokenizer is None:
            from specdec.tokenizer import Tokenizer

            self._tokenizer = Tokenizer(self.cfg.tokenizer_path)
        eos = tuple(self.cfg.eos_token_ids)
        return TokenVocabulary(self.cfg.tokenizer_vocab, eos, self._tokenizer)

    # -- helpers -----------------------------------------------------------------------------
    def _seq(self, sid: str) -> SequenceState:
        if sid not in self.seqs:
            raise KeyError(f"unknown sequence {sid}")
        return self.seqs[sid]

    def _rows(self, states: list[SequenceState]) -> torch.Tensor:
        return torch.tensor([s.row for s in states], dtype=torch.int64)

    def _rewind(self, st: SequenceState, length: int) -> None:
        if length > st.length:
            raise ValueError(f"worker holds {st.length} tokens, asked to start at {length}")
        self.cache.rollback(st.row, length)
        st.length = length

    def _depth(self, depth: int) -> int:
        """Tokens per speculation this time: the target's current K, at most the configured."""
        return max(1, min(self.cfg.k, depth))

    def _tops(
        self,
        logits: torch.Tensor,
        n: int,
        states: list[SequenceState],
        at: list[int],
        q: torch.Tensor | None = None,
    ) -> list[list[int]]:
        """The draft's n best guesses (real tokens only, in the target's ids) for the token at
        index at[r] of the sequence row r of logits [R, V] continues: its most likely tokens,
        or for a coupled sequence the highest q~ * w at[r] (coupling.py), whose first is the
        draft's own coupled draw. ``q``: the rows' draft distributions, if already computed."""
        head_ids = getattr(self.model, "head_ids", None)
        scores = logits.clone()
        if head_ids is not None:
            scores[:, head_ids >= self.cfg.tokenizer_vocab] = float("-inf")
            tops = head_ids[scores.topk(n, dim=-1).indices].tolist()
        else:
            scores[:, self.cfg.tokenizer_vocab :] = float("-inf")
            tops = scores.topk(n, dim=-1).indices.tolist()
        coupled = [r for r, st in enumerate(states) if st.noise is not None]
        if coupled:
            q = self._q(logits[coupled], [states[r] for r in coupled]) if q is None else q[coupled]
            w = torch.cat([states[r].noise.weights([at[r]], q.shape[-1]) for r in coupled])
            ranked = (q.double() * w).topk(n, dim=-1).indices.tolist()
            for r, ids in zip(coupled, ranked):
                tops[r] = ids
        return tops

    @property
    def _n_tops(self) -> int:
        """Top tokens kept per drafted position: enough for any fan-out plus the excluded d."""
        return self.cfg.budget + 1

    # -- drawing draft tokens ----------------------------------------------------------------
    def _draw_into(
        self,
        drafted: list[_Drafted],
        logits: torch.Tensor,
        states: list[SequenceState],
        position: int,
        at: list[int],
        drafts,
    ) -> list[int]:
        """Draw one token per row of logits [R, V] (row r continues states[r]) at draft
        position ``position`` (0-based; index at[r] of the sequence), record it in drafted[r],
        and return the tokens. Greedy rows skip the full-vocabulary transform: their q' is the
        point mass on the argmax over real tokens (the first top token); so are coupled rows,
        on their coupled draw (the verifier judges them by equality, not by q').
        ``drafts(r)``: the tokens row r follows after the sequence's pending one (for its
        processors; called only for sequences that have some)."""
        logits = self._processed(logits, states, drafts)
        one = torch.ones(1, dtype=torch.float64)
        if all(st.params.greedy for st in states):
            tops = self._tops(logits, self._n_tops, states, at)
            draws = [(top[0], torch.tensor([top[0]]), one) for top in tops]
        else:
            q = self._q(logits, states)
            tops = self._tops(logits, self._n_tops, states, at, q)
            draws = [
                (tops[i][0], torch.tensor([tops[i][0]]), one)
                if st.noise is not None
                else self._draw(q[i], st, position)
                for i, st in enumerate(states)
            ]
        for d, (token, ids, probs), top in zip(drafted, draws, tops):
            d.add(token, ids, probs, top)
        return [token for token, _, _ in draws]

    def _processed(self, logits: torch.Tensor, states: list[SequenceState], drafts):
        """Rows of draft logits [R, V] through their sequence's processors, row r at the
        position after the sequence's pending token and drafts(r): the same processing as
        the target's p, so that q and the top tokens (candidates, greedy draws) follow it."""
        if not any(st.processors for st in states):
            return logits
        outputs = {id(st): st.output for st in states if st.processors}
        rows = [
            (st.processors, outputs[id(st)], drafts(r)) if st.processors else None
            for r, st in enumerate(states)
        ]
        return process_draft_logits(logits, self.model, rows)

    def _q(self, logits: torch.Tensor, states: list[SequenceState]) -> torch.Tensor:
        cfg = self.cfg
        params = [s.params for s in states]
        return draft_distribution(logits, params, self.model, cfg.tokenizer_vocab, cfg.target_vocab)

    def _draw(self, q_row: torch.Tensor, st: SequenceState, position: int):
        """Sample one draft token from Saguaro's q' at draft position ``position``."""
        fan = st.fanout[position] if position < len(st.fanout) else 0
        ids, probs = saguaro(q_row, fan, self.cfg.saguaro_c, self.cfg.sparse_q)
        u = 0.0 if st.params.greedy else st.rng.random()
        j = int(sample(probs[None], [u])[0])
        return int(ids[j]), ids, probs

    # -- operations --------------------------------------------------------------------------
    def prefill(self, msg: Prefill) -> None:
        for item in msg.seqs:
            self._forget(item.sid)
            # the drafter's own stream: derived from the request's seed (reproducible) but
            # never the target's own draws, which decide acceptance and must be independent
            rng = random.Random(f"specdec-ssd-drafter:{item.seed}")
            st = SequenceState(self.cache.allocate(), item.sampling(), rng)
            if item.coupled and not st.params.greedy:
                st.noise = PositionNoise(item.seed)
            st.fanout = item.fanout
            st.processors = build_processors(
                st.params, item.tokens[: item.prompt_len], self._vocabulary(st.params)
            )
            st.prompt_len = item.prompt_len
            st.commit(0, list(item.tokens))
            self.seqs[item.sid] = st
        states = [self.seqs[item.sid] for item in msg.seqs]
        tokens, lengths = pad_right([item.tokens for item in msg.seqs])
        last = (lengths - 1)[:, None]
        self.model.forward(tokens, self.cache, self._rows(states), num_new=lengths, logits_at=last)
        for st, n in zip(states, lengths.tolist()):
            st.length = n

    def round(self, msg: Round) -> None:
        """Trunk pass, candidate selection, and tree drafting of every branch."""
        states = [self._seq(item.sid) for item in msg.seqs]
        for st, item in zip(states, msg.seqs):  # b_prev is final, the drafts are not
            st.commit(item.start, item.catch_up + item.trunk[:1])
        # 1. one pass over what the rows do not hold of catch-up + trunk [b_prev, d_1..d_K],
        #    for the draft's top tokens after each trunk token
        tops = self._trunk_pass(states, msg.seqs)
        layouts, roots = [], []
        for st, item, trunk_tops in zip(states, msg.seqs, tops):
            # the catch-up (tokens emitted in rounds without drafts) precedes the trunk
            st.trunk_start = item.start + len(item.catch_up)
            if st.noise is not None:  # b_prev and everything before it are final
                st.noise.forget_before(st.trunk_start + 1)
            st.trunk = item.trunk
            st.length = st.trunk_start + len(item.trunk)
            # 2. candidates for the token after each number of accepted drafts
            branch_k, branch_roots = _candidates(item.trunk, st.fanout, trunk_tops)
            layouts.append(TreeLayout(st.trunk_start, len(item.trunk) - 1, branch_k))
            roots.append(branch_roots)
        # 3. draft K tokens for all branches at once, one forward per step
        self._draft_tree(states, layouts, roots, self._depth(msg.depth))

    def _trunk_pass(self, states: list[SequenceState], items: list[RoundSeq]):
        """Run each trunk past the tokens its row already holds ahead (reusing their top
        tokens); returns each trunk's top tokens, one list per trunk token."""
        feeds, tops = [], []
        for st, item in zip(states, items):
            m = st.held_trunk(item.start, item.catch_up, item.trunk)
            if m:
                self.cache.rollback(st.row, item.start + m)
                st.length = item.start + m
                feeds.append(item.trunk[m:])
                tops.append(list(st.ahead.tops[:m]))
            else:
                self._rewind(st, item.start)
                feeds.append(item.catch_up + item.trunk)
                tops.append([])
            st.forget_ahead()
            st.forget_speculations()
            st.fanout = item.fanout
        run = [i for i, f in enumerate(feeds) if f]
        if not run:
            return tops
        tokens, lengths = pad_right([feeds[i] for i in run])
        n_trunk = torch.tensor([len(items[i].trunk) - len(tops[i]) for i in run])
        at = (lengths - n_trunk)[:, None] + torch.arange(int(n_trunk.max()))[None, :]
        at = torch.minimum(at, (lengths - 1)[:, None])
        rows = self._rows([states[i] for i in run])
        logits = self.model.forward(tokens, self.cache, rows, num_new=lengths, logits_at=at)
        for r, i in enumerate(run):
            # trunk token j predicts the token at index trunk start + j + 1
            first = items[i].start + len(items[i].catch_up) + len(tops[i]) + 1
            n = int(n_trunk[r])
            at = list(range(first, first + n))
            held, trunk = len(tops[i]), items[i].trunk

            def drafts(t, held=held, trunk=trunk):  # row t follows b_prev, d_1..d_{held+t}
                return trunk[1 : held + t + 1]

            rows = self._processed(logits[r, :n], [states[i]] * n, drafts)
            tops[i] += self._tops(rows, self._n_tops, [states[i]] * n, at)
        return tops

    def _outcome_arrived(self) -> bool:
        return self.inbox is not None and self.inbox.arrived()

    def _draft_tree(
        self,
        states: list[SequenceState],
        layouts: list[TreeLayout],
        roots: list[list[int]],
        depth: int,
    ) -> None:
        live = [i for i, lay in enumerate(layouts) if lay.width]
        if not live or self._outcome_arrived():  # too late: the backup drafts the one needed
            return
        states = [states[i] for i in live]
        layouts = [layouts[i] for i in live]
        roots = [roots[i] for i in live]
        rows = self._rows(states)
        width = max(lay.width for lay in layouts)
        drafted = [[_Drafted() for _ in lay.branch_k] for lay in layouts]

        def step_tokens(per_seq: list[list[int]]) -> torch.Tensor:
            tokens = torch.zeros(len(states), width, dtype=torch.int64)
            for i, toks in enumerate(per_seq):
                tokens[i, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
            return tokens

        def draw(logits: torch.Tensor, step: int) -> torch.Tensor:
            drawn = []
            for i, (st, lay) in enumerate(zip(states, layouts)):
                branch_logits = logits[i, : lay.width]
                # a branch after k accepted drafts has its root at index trunk_start + 1 + k
                at = [st.trunk_start + k + 2 + step for k in lay.branch_k]

                def drafts(j, st=st, lay=lay, i=i):  # d_1..d_k, the root, its drafts so far
                    k = lay.branch_k[j]
                    return st.trunk[1 : k + 1] + [roots[i][j]] + drafted[i][j].tokens

                drafted_now = self._draw_into(
                    drafted[i], branch_logits, [st] * lay.width, step, at, drafts
                )
                drawn.append(drafted_now)
            return step_tokens(drawn)

        def advance(tokens: torch.Tensor, step: int) -> torch.Tensor:
            return self._tree_pass(tokens, rows, layouts, step + 1)

        first = self._tree_pass(step_tokens(roots), rows, layouts, 0)
        depth = len(draft_tokens(first, depth, draw, advance, stop=self._outcome_arrived))
        for st, lay, branch_roots, branches in zip(states, layouts, roots, drafted):
            for j, (k, root) in enumerate(zip(lay.branch_k, branch_roots)):
                st.specs.store(k, root, branches[j].speculation())
                slots = [lay.slot(step, j) for step in range(depth)]
                st.branches[(k, root)] = Branch(slots, branches[j].tops)

    def _tree_pass(self, tokens, rows, layouts: list[TreeLayout], step: int) -> torch.Tensor:
        """One forward over every branch's token at tree step ``step`` (logits [N, Bmax, V])."""
        positions, mask, _ = step_inputs(layouts, step)
        num_new = torch.tensor([lay.width for lay in layouts])
        return self.model.forward(
            tokens, self.cache, rows, num_new=num_new, positions=positions, attn_mask=mask
        )

    def outcome(self, msg: Outcome) -> Drafts:
        """Look up each sequence's outcome; on a miss, draft just in time if asked to."""
        specs, missed = [], []
        for item in msg.seqs:
            st = self._seq(item.sid)
            # keep b_prev and the accepted drafts; the emitted token becomes pending
            self._rewind(st, st.trunk_start + 1 + item.accepted)
            st.commit(st.trunk_start + 1, st.trunk[1 : 1 + item.accepted] + [item.token])
            spec = st.specs.lookup(item.accepted, item.token)
            specs.append(spec)
            if spec is None:
                missed.append(len(specs) - 1)
            else:
                self._keep_branch(st, item, spec)
            st.forget_speculations()
        hits = [spec is not None for spec in specs]
        if missed and msg.backup:
            items = [msg.seqs[i] for i in missed]
            sids, catch_ups = [item.sid for item in items], [[item.token] for item in items]
            for i, spec in zip(missed, self._draft_now(sids, catch_ups, self._depth(msg.depth))):
                specs[i] = spec
        return Drafts(specs, hits)

    def _keep_branch(self, st: SequenceState, item: OutcomeSeq, spec: Speculation) -> None:
        """A hit: move the branch's keys/values after the accepted prefix, where the next
        trunk [token, d_1..] will look for them."""
        branch = st.branches[(item.accepted, item.token)]
        self.cache.move_slots(st.row, branch.slots, st.length)
        held = [item.token] + spec.tokens[: len(branch.slots) - 1]
        st.ahead = Ahead(st.length, held, branch.tops)
        st.length += len(branch.slots)

    def draft(self, msg: Draft) -> Drafts:
        """Speculations drafted just in time (new sequences, or after a fallback)."""
        for item in msg.seqs:
            st = self._seq(item.sid)
            self._rewind(st, item.start)
            st.commit(item.start, item.catch_up)
            st.forget_ahead()
        sids, catch_ups = [item.sid for item in msg.seqs], [item.catch_up for item in msg.seqs]
        specs = self._draft_now(sids, catch_ups, self._depth(msg.depth))
        return Drafts(specs, [False] * len(msg.seqs))

    def _draft_now(self, sids: list[str], catch_ups: list[list[int]], depth: int):
        """Feed each sequence's catch-up (ending with its pending token) and draft ``depth``
        tokens. The row keeps the pending token and d_1..d_{K-1} ahead (``state.py``)."""
        states = [self._seq(s) for s in sids]
        rows = self._rows(states)
        tokens, lengths = pad_right(catch_ups)
        pending_at = [st.length + n - 1 for st, n in zip(states, lengths.tolist())]
        last = (lengths - 1)[:, None]
        logits = self.model.forward(tokens, self.cache, rows, num_new=lengths, logits_at=last)
        drafted = [_Drafted() for _ in states]

        def draw(logits: torch.Tensor, step: int) -> torch.Tensor:
            at = [pos + 1 + step for pos in pending_at]
            drawn = self._draw_into(drafted, logits, states, step, at, lambda r: drafted[r].tokens)
            return torch.tensor(drawn)

        def advance(tokens: torch.Tensor, step: int) -> torch.Tensor:
            return self.model.forward(tokens[:, None], self.cache, rows)[:, 0]

        draft_tokens(logits[:, 0], depth, draw, advance)
        for st, pos, catch_up, d in zip(states, pending_at, catch_ups, drafted):
            st.ahead = Ahead(pos, [catch_up[-1]] + d.tokens[: depth - 1], d.tops)
            st.length = pos + depth
        return [d.speculation() for d in drafted]

    def resize(self, msg: Resize) -> Resized:
        """Reallocate the cache for more or longer sequences (only when none is held)."""
        for sid in list(self.seqs):
            self._forget(sid)
        self.cfg.max_rows, self.cfg.max_len = msg.rows, msg.max_len
        self.cache = None
        self.cache = self.model.new_cache(self.cfg.max_rows, self.cfg.max_len + self.tree_slack)
        return Resized()

    def release(self, msg: Release) -> None:
        for sid in msg.sids:
            self._forget(sid)

    def _forget(self, sid: str) -> None:
        st = self.seqs.pop(sid, None)
        if st is not None:
            self.cache.free(st.row)

    # -- the loop ----------------------------------------------------------------------------
    def serve(self, channel: Channel) -> None:
        self.inbox = Inbox(channel, Stop)
        handlers = {
            Prefill: self.prefill,
            Round: self.round,
            Outcome: self.outcome,
            Draft: self.draft,
            Release: self.release,
            Resize: self.resize,
        }
        while True:
            msg = self.inbox.get()
            if isinstance(msg, Stop):
                return
            t = time.perf_counter()
            reply = handlers[type(msg)](msg)
            self.busy_s += time.perf_counter() - t
            if reply is not None:
                reply.busy_s = self.busy_s
                channel.send(reply)


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the target: a watchdog thread exits as soon as the parent is gone (a
    broken channel ends the loop too). Not PR_SET_PDEATHSIG: it fires when the *thread* that
    started us exits, and restarts are started from helper threads."""

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.25)

    threading.Thread(target=watch, daemon=True).start()


def main(cfg: WorkerConfig) -> None:
    """Entry point of the drafter process."""
    _die_with_parent(cfg.parent_pid)
    pin_cpu_cores(cfg.cpu_cores, cfg.num_threads)
    channel = Channel.connect(cfg.host, cfg.port, cfg.key, cfg.connect_timeout_s)
    try:
        worker = DraftWorker(cfg)
    except Exception as exc:  # noqa: BLE001 - tell the target why, then exit
        channel.send(StartFailed(f"could not load the draft model: {exc}"))
        raise
    channel.send(Ready())
    try:
        worker.serve(channel)
    except ChannelError:
        pass  # the target went away or gave up on us: nothing left to do
    except Exception as exc:  # noqa: BLE001 - report, then die: the target falls back
        print(f"specdec SSD worker failed: {exc!r}", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":  # started by specdec.ssd.client with the config on stdin
    main(WorkerConfig.from_json(sys.stdin.read()))
