"""The SSD drafter process.

It holds the draft model and one KV cache row per sequence, and answers the target's
messages one at a time (the target never waits for a reply it does not need):

  prefill  {sid, tokens, params, seed}          cache the sequence (all but its pending token)
  round    {k, seqs:[{sid, start, catch_up,     while the target verifies: trunk pass over
            trunk, fanout}]}                      [b_prev, d_1..d_K], pick candidates, draft
                                                  every branch k tokens (tree), cache them
  outcome  {backup, k, seqs:[{sid, k, token}]} -> for each: the cached speculation (hit), or,
                                                  with backup, one drafted just in time (miss)
  draft    {k, seqs:[{sid, start, catch_up}]} ->  speculations drafted just in time
  release  {sids}                                forget sequences
  stop                                           exit

A message's top-level k is the drafting depth (the target's current K, at most the configured
K); a sequence's k in an outcome is the number of drafts it accepted.

Invariant, as in the target: a sequence's cache row holds every token but the pending one,
and possibly more: the speculation it just returned was drafted through the pending token and
d_1..d_{K-1}, so it keeps those keys/values ("ahead", moved out of the tree on a hit) with the
draft's top tokens after each. The next round's trunk [pending, d_1..d_K] then needs a pass
over d_K alone instead of all K+1 tokens (the target does not know; the start it sends is
still "all but the pending token").
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

from specdec.decoders.base import pad_right
from specdec.drafters.draft_model import draft_distribution, load_draft_model
from specdec.sampling import SamplingParams, sample
from specdec.ssd.cache import Speculation, SpeculationCache
from specdec.ssd.channel import Channel, ChannelError
from specdec.ssd.tree import TreeLayout, step_inputs


@dataclass
class WorkerConfig:
    draft_path: str
    dtype: str
    device: str
    quantization: str | None
    head_ids: list[int] | None
    tokenizer_vocab: int
    target_vocab: int
    max_rows: int
    max_len: int  # longest sequence
    k: int  # speculation length K
    budget: int  # B: branches per sequence per round
    saguaro_c: float  # top-F draft probabilities are scaled by C (Saguaro sampling)
    sparse_q: int  # q' is kept on its top-N tokens (it is then the exact proposal)
    cpu_cores: list[int] | None
    num_threads: int | None
    host: str
    port: int
    connect_timeout_s: float = 120.0
    parent_pid: int = 0


@dataclass
class _Seq:
    row: int
    params: SamplingParams
    rng: random.Random
    length: int = 0  # tokens held in the cache row
    fanout: list[int] = field(default_factory=list)
    trunk_start: int = 0
    trunk: list[int] = field(default_factory=list)
    specs: SpeculationCache = field(default_factory=SpeculationCache)
    # held past the pending token: [pending, d_1..] from slot ahead_pos, and the draft's top
    # tokens after each of them (the trunk's candidates next round)
    ahead: list[int] = field(default_factory=list)
    ahead_pos: int = -1
    ahead_tops: list[list[int]] = field(default_factory=list)
    # (k, token) -> the tree branch's slots (root, d_1..d_{K-1}) and top tokens after each
    branches: dict = field(default_factory=dict)


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


class DraftWorker:
    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.model = load_draft_model(
            cfg.draft_path, cfg.dtype, cfg.device, cfg.quantization, cfg.head_ids
        )
        self.tree_slack = (cfg.k + 2) * (cfg.budget + 2) + 8
        self.cache = self.model.new_cache(cfg.max_rows, cfg.max_len + self.tree_slack)
        self.seqs: dict[str, _Seq] = {}
        self.busy_s = 0.0

    # -- helpers -----------------------------------------------------------------------------
    def _seq(self, sid: str) -> _Seq:
        if sid not in self.seqs:
            raise KeyError(f"unknown sequence {sid}")
        return self.seqs[sid]

    def _rows(self, states: list[_Seq]) -> torch.Tensor:
        return torch.tensor([s.row for s in states], dtype=torch.int64)

    def _rewind(self, st: _Seq, length: int) -> None:
        if length > st.length:
            raise ValueError(f"worker holds {st.length} tokens, asked to start at {length}")
        self.cache.rollback(st.row, length)
        st.length = length

    def _q(self, logits: torch.Tensor, states: list[_Seq]) -> torch.Tensor:
        cfg = self.cfg
        return draft_distribution(logits, [s.params for s in states], self.model,
                                  cfg.tokenizer_vocab, cfg.target_vocab)  # fmt: skip

    def _tops(self, logits: torch.Tensor, n: int) -> list[list[int]]:
        """The draft's n most likely next tokens (real tokens only, in the target's ids) for
        each row of logits [R, V]."""
        head_ids = getattr(self.model, "head_ids", None)
        scores = logits.clone()
        if head_ids is not None:
            scores[:, head_ids >= self.cfg.tokenizer_vocab] = float("-inf")
            return head_ids[scores.topk(n, dim=-1).indices].tolist()
        scores[:, self.cfg.tokenizer_vocab :] = float("-inf")
        return scores.topk(n, dim=-1).indices.tolist()

    @property
    def _n_tops(self) -> int:
        """Top tokens kept per drafted position: enough for any fan-out plus the excluded d."""
        return self.cfg.budget + 1

    def _next(self, logits: torch.Tensor, states: list[_Seq], position: int,
              tops: list[list[int]]) -> list[tuple]:  # fmt: skip
        """(token, q' ids, q' probs) for each row, given the rows' top tokens (``_tops``).
        Greedy rows skip the full-vocabulary transform: their q' is the point mass on the
        argmax (over real tokens)."""
        if all(st.params.greedy for st in states):
            return [(top[0], torch.tensor([top[0]]), torch.ones(1, dtype=torch.float64))
                    for top in tops]  # fmt: skip
        q = self._q(logits, states)
        return [self._draw(q[i], st, position) for i, st in enumerate(states)]

    def _draw(self, q_row: torch.Tensor, st: _Seq, position: int):
        """Sample one draft token from Saguaro's q' at draft position ``position`` (0-based)."""
        fan = st.fanout[position] if position < len(st.fanout) else 0
        ids, probs = saguaro(q_row, fan, self.cfg.saguaro_c, self.cfg.sparse_q)
        u = 0.0 if st.params.greedy else st.rng.random()
        j = int(sample(probs[None], [u])[0])
        return int(ids[j]), ids, probs

    # -- operations --------------------------------------------------------------------------
    def prefill(self, msg: dict) -> None:
        for item in msg["seqs"]:
            sid = item["sid"]
            if sid in self.seqs:
                self.release({"sids": [sid]})
            # the drafter's own stream: derived from the request's seed (reproducible) but
            # never the target's own draws, which decide acceptance and must be independent
            rng = random.Random(f"specdec-ssd-drafter:{item['seed']}")
            st = _Seq(self.cache.allocate(), SamplingParams(**item["params"]), rng)
            st.fanout = item.get("fanout", [])
            self.seqs[sid] = st
        states = [self.seqs[i["sid"]] for i in msg["seqs"]]
        tokens, lengths = pad_right([i["tokens"] for i in msg["seqs"]])
        self.model.forward(tokens, self.cache, self._rows(states), num_new=lengths,
                           logits_at=(lengths - 1)[:, None])  # fmt: skip
        for st, n in zip(states, lengths.tolist()):
            st.length = n

    def round(self, msg: dict) -> None:
        """Trunk pass, candidate selection, and tree drafting of every branch."""
        items = msg["seqs"]
        states = [self._seq(i["sid"]) for i in items]
        feeds, known = [], []  # tokens to run; top tokens already known for leading positions
        for st, item in zip(states, items):
            m = self._held(st, item)
            if m:
                self.cache.rollback(st.row, item["start"] + m)
                st.length = item["start"] + m
                feeds.append(item["trunk"][m:])
                known.append(st.ahead_tops[:m])
            else:
                self._rewind(st, item["start"])
                feeds.append(item["catch_up"] + item["trunk"])
                known.append([])
            st.ahead, st.ahead_tops = [], []
            st.specs.clear()
            st.branches.clear()
            st.fanout = item["fanout"]
        # 1. one pass over what is not held of catch-up + trunk [b_prev, d_1..d_K]; the draft's
        #    top tokens after each trunk token
        tops = [list(kn) for kn in known]
        run = [i for i, f in enumerate(feeds) if f]
        if run:
            tokens, lengths = pad_right([feeds[i] for i in run])
            n_trunk = torch.tensor([len(items[i]["trunk"]) - len(known[i]) for i in run])
            at = (lengths - n_trunk)[:, None] + torch.arange(int(n_trunk.max()))[None, :]
            at = torch.minimum(at, (lengths - 1)[:, None])
            logits = self.model.forward(tokens, self.cache, self._rows([states[i] for i in run]),
                                        num_new=lengths, logits_at=at)  # fmt: skip
            for r, i in enumerate(run):
                tops[i] += self._tops(logits[r, : int(n_trunk[r])], self._n_tops)
        layouts, roots = [], []
        for i, (st, item) in enumerate(zip(states, items)):
            trunk = item["trunk"]
            # the catch-up (tokens emitted in rounds without drafts) precedes the trunk
            st.trunk_start = item["start"] + len(item["catch_up"])
            st.trunk = trunk
            st.length = st.trunk_start + len(trunk)
            # 2. candidates for the token after k accepted drafts: the draft's top tokens at
            #    that position, without d_{k+1} (a rejected token is never the replacement)
            branch_k, branch_tok = [], []
            for k, fan in enumerate(st.fanout[: len(trunk)]):
                if fan <= 0:
                    continue
                excluded = trunk[k + 1] if k + 1 < len(trunk) else None
                picks = [t for t in tops[i][k][: fan + 1] if t != excluded][:fan]
                branch_k += [k] * len(picks)
                branch_tok += picks
            layouts.append(TreeLayout(st.trunk_start, len(trunk) - 1, branch_k))
            roots.append(branch_tok)
        # 3. draft K tokens for all branches at once, one forward per step
        self._draft_tree(states, layouts, roots, self._depth(msg))

    def _held(self, st: _Seq, item: dict) -> int:
        """How many leading trunk tokens the row already holds (ahead of the pending one)."""
        if not st.ahead or item["catch_up"] or item["start"] != st.ahead_pos:
            return 0
        m = 0
        for a, t in zip(st.ahead, item["trunk"]):
            if a != t:
                break
            m += 1
        return min(m, len(st.ahead_tops))

    def _depth(self, msg: dict) -> int:
        """Tokens per speculation this time: the target's current K, at most the configured."""
        return max(1, min(self.cfg.k, int(msg.get("k", self.cfg.k))))

    def _draft_tree(self, states: list[_Seq], layouts: list[TreeLayout], roots: list[list[int]],
                    k_len: int):  # fmt: skip
        live = [i for i, lay in enumerate(layouts) if lay.width]
        if not live:
            return
        states = [states[i] for i in live]
        layouts = [layouts[i] for i in live]
        roots = [roots[i] for i in live]
        rows = self._rows(states)
        width = max(lay.width for lay in layouts)
        drafted = [[[] for _ in lay.branch_k] for lay in layouts]
        q_ids = [[[] for _ in lay.branch_k] for lay in layouts]
        q_probs = [[[] for _ in lay.branch_k] for lay in layouts]
        tops = [[[] for _ in lay.branch_k] for lay in layouts]
        current = [list(r) for r in roots]
        for step in range(k_len):
            tokens = torch.zeros(len(states), width, dtype=torch.int64)
            for i, cur in enumerate(current):
                tokens[i, : len(cur)] = torch.tensor(cur, dtype=torch.int64)
            positions, mask, _ = step_inputs(layouts, step)
            num_new = torch.tensor([lay.width for lay in layouts])
            logits = self.model.forward(tokens, self.cache, rows, num_new=num_new,
                                        positions=positions, attn_mask=mask)  # fmt: skip
            for i, (st, lay) in enumerate(zip(states, layouts)):
                step_tops = self._tops(logits[i, : lay.width], self._n_tops)
                draws = self._next(logits[i, : lay.width], [st] * lay.width, step, step_tops)
                for j in range(lay.width):
                    tok, ids, probs = draws[j]
                    drafted[i][j].append(tok)
                    q_ids[i][j].append(ids)
                    q_probs[i][j].append(probs)
                    tops[i][j].append(step_tops[j])
                    current[i][j] = tok
        for i, (st, lay) in enumerate(zip(states, layouts)):
            for j, k in enumerate(lay.branch_k):
                st.specs.store(k, roots[i][j], _speculation(drafted[i][j], q_ids[i][j],
                                                            q_probs[i][j]))  # fmt: skip
                slots = [lay.slot(step, j) for step in range(k_len)]
                st.branches[(k, roots[i][j])] = (slots, tops[i][j])

    def outcome(self, msg: dict) -> dict:
        """Look up each sequence's outcome; on a miss, draft just in time if asked to."""
        results, missed = [], []
        for item in msg["seqs"]:
            st = self._seq(item["sid"])
            # keep b_prev and the accepted drafts; the emitted token becomes pending
            self._rewind(st, st.trunk_start + 1 + item["k"])
            spec = st.specs.lookup(item["k"], item["token"])
            results.append(spec)
            if spec is None:
                missed.append((len(results) - 1, item["sid"], item["token"]))
            else:  # keep the branch's keys/values: the next trunk starts with them
                slots, tops = st.branches[(item["k"], item["token"])]
                self.cache.move_slots(st.row, slots, st.length)
                st.ahead = [item["token"]] + spec.tokens[: len(slots) - 1]
                st.ahead_pos, st.ahead_tops = st.length, tops
                st.length += len(slots)
            st.specs.clear()
            st.branches.clear()
        hits = [r is not None for r in results]
        if missed and msg.get("backup"):
            specs = self._draft_now([sid for _, sid, _ in missed], [[t] for _, _, t in missed],
                                    self._depth(msg))  # fmt: skip
            for (idx, _, _), spec in zip(missed, specs):
                results[idx] = spec
        return {"specs": results, "hits": hits}

    def draft(self, msg: dict) -> dict:
        """Speculations drafted just in time (new sequences, or after a fallback)."""
        items = msg["seqs"]
        for item in items:
            st = self._seq(item["sid"])
            self._rewind(st, item["start"])
            st.ahead, st.ahead_tops = [], []
        specs = self._draft_now([i["sid"] for i in items], [i["catch_up"] for i in items],
                                self._depth(msg))  # fmt: skip
        return {"specs": specs, "hits": [False] * len(items)}

    def _draft_now(self, sids: list[str], catch_ups: list[list[int]], k_len: int
                   ) -> list[Speculation]:  # fmt: skip
        """Feed each sequence's catch-up (ending with its pending token) and draft K tokens.
        The row keeps the pending token and d_1..d_{K-1} ahead (see the module's invariant)."""
        states = [self._seq(s) for s in sids]
        rows = self._rows(states)
        tokens, lengths = pad_right(catch_ups)
        pending_at = [st.length + n - 1 for st, n in zip(states, lengths.tolist())]
        logits = self.model.forward(tokens, self.cache, rows, num_new=lengths,
                                    logits_at=(lengths - 1)[:, None])[:, 0]  # fmt: skip
        out = [([], [], []) for _ in states]
        tops = [[] for _ in states]
        for step in range(k_len):
            nxt = []
            step_tops = self._tops(logits, self._n_tops)
            for (toks, q_ids, q_probs), (tok, ids, probs), top, row_tops in zip(
                out, self._next(logits, states, step, step_tops), tops, step_tops
            ):
                toks.append(tok)
                q_ids.append(ids)
                q_probs.append(probs)
                nxt.append(tok)
                top.append(row_tops)
            if step + 1 < k_len:
                logits = self.model.forward(torch.tensor(nxt)[:, None], self.cache, rows)[:, 0]
        for st, pos, catch_up, o, top in zip(states, pending_at, catch_ups, out, tops):
            st.ahead = [catch_up[-1]] + o[0][: k_len - 1]
            st.ahead_pos, st.ahead_tops = pos, top
            st.length = pos + k_len
        return [_speculation(*o) for o in out]

    def capacity(self, msg: dict) -> dict:
        """Reallocate the cache for more or longer sequences (only when none is held)."""
        for sid in list(self.seqs):
            self.release({"sids": [sid]})
        self.cfg.max_rows, self.cfg.max_len = msg["rows"], msg["max_len"]
        self.cache = None
        self.cache = self.model.new_cache(self.cfg.max_rows, self.cfg.max_len + self.tree_slack)
        return {"ok": True}

    def release(self, msg: dict) -> None:
        for sid in msg["sids"]:
            st = self.seqs.pop(sid, None)
            if st is not None:
                self.cache.free(st.row)

    # -- the loop ----------------------------------------------------------------------------
    def serve(self, channel: Channel) -> None:
        handlers = {"prefill": self.prefill, "round": self.round, "outcome": self.outcome,
                    "draft": self.draft, "release": self.release,
                    "capacity": self.capacity}  # fmt: skip
        while True:
            msg = channel.recv()
            op = msg["op"]
            if op == "stop":
                return
            t = time.perf_counter()
            reply = handlers[op](msg)
            self.busy_s += time.perf_counter() - t
            if reply is not None:
                reply["busy_s"] = self.busy_s
                channel.send(reply)


def _speculation(tokens, ids, probs) -> Speculation:
    n = max(len(x) for x in ids)
    q_ids = np.zeros((len(tokens), n), dtype=np.int64)
    q_probs = np.zeros((len(tokens), n), dtype=np.float64)
    for i, (a, b) in enumerate(zip(ids, probs)):
        q_ids[i, : len(a)] = a.numpy()
        q_probs[i, : len(b)] = b.numpy()
    return Speculation(list(tokens), q_ids, q_probs)


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
    from specdec.llm import pin_cpu_cores

    pin_cpu_cores(cfg.cpu_cores, cfg.num_threads)
    channel = Channel.connect(cfg.host, cfg.port, cfg.connect_timeout_s)
    try:
        worker = DraftWorker(cfg)
    except Exception as exc:  # noqa: BLE001 - tell the target why, then exit
        channel.send({"op": "error", "message": f"could not load the draft model: {exc}"})
        raise
    channel.send({"op": "ready"})
    try:
        worker.serve(channel)
    except ChannelError:
        pass  # the target went away or gave up on us: nothing left to do
    except Exception as exc:  # noqa: BLE001 - report, then die: the target falls back
        print(f"specdec SSD worker failed: {exc!r}", file=sys.stderr, flush=True)
        raise


if __name__ == "__main__":  # started by specdec.ssd.client with the config on stdin
    import json

    main(WorkerConfig(**json.loads(sys.stdin.read())))
