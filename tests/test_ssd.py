"""SSD on tiny models: exactness (greedy token-identical to AR with hits and misses, sampled
output distributed as the target's under Saguaro sampling and both backups), the speculation
cache's keys, fan-out plans, and fault tolerance (a SIGKILLed worker)."""

from __future__ import annotations

import os
import pickle
import signal
import time

import numpy as np
import psutil
import pytest
import torch
from stats import chi_square_pvalue, exact_sequence_probs, seeded

from specdec import LLM, SamplingParams
from specdec.sampling import SamplingParams as SP
from specdec.ssd.cache import Speculation
from specdec.ssd.fanout import plan_fanout
from specdec.ssd.protocol import (
    MESSAGES,
    Draft,
    Drafts,
    DraftSeq,
    Message,
    Outcome,
    OutcomeSeq,
    Prefill,
    PrefillSeq,
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
from specdec.ssd.worker import DraftWorker

PROMPTS = ["w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def workers_of_this_process() -> list[psutil.Process]:
    children = psutil.Process().children(recursive=True)
    return [p for p in children if "specdec.ssd.worker" in " ".join(p.cmdline())]


@pytest.fixture(scope="module")
def ar_v16(tiny_dirs):
    return LLM(tiny_dirs["v16"], dtype="float32")


def ssd(tiny_dirs, **kw):
    kw.setdefault("draft_model", tiny_dirs["v16"])
    kw.setdefault("draft_vocab", 12)  # a self-draft that cannot say 4 of the 16 tokens: misses
    # a fixed K, so that the cache is really used (the adaptive K is timing dependent, and
    # tiny models make drafting look too dear to pay); scripted K changes are tested below
    kw.setdefault("num_speculative_tokens", 4)
    return LLM(tiny_dirs["v16"], method="ssd", dtype="float32", **kw)


def paced_target(llm: LLM, seconds: float = 0.01) -> None:
    """Make each target pass last at least ``seconds``. A real target's verify pass outlasts
    the worker's tree, which is what has a speculation ready when the outcome comes (a hit);
    the tiny target's takes well under a millisecond, and once the channel's round trip fell
    to 0.3 ms the outcome often came before the tree's first pass: no hit in a whole test
    about one run in six."""
    target = llm.decoder.target
    forward = target.forward

    def paced(*args, **kw):
        t0 = time.perf_counter()
        out = forward(*args, **kw)
        time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))
        return out

    target.forward = paced


@pytest.mark.parametrize("backup", ["neural", "fast"])
def test_greedy_ssd_token_identical_to_ar_with_hits_and_misses(tiny_dirs, ar_v16, backup):
    want = [o.token_ids for o in ar_v16.generate(PROMPTS, GREEDY)]
    with ssd(tiny_dirs, backup=backup) as llm:
        paced_target(llm)
        single = [llm.generate([p], GREEDY)[0] for p in PROMPTS]  # batch 1
        batched = llm.generate(PROMPTS, GREEDY)  # batch 4
    for outs in (single, batched):
        assert [o.token_ids for o in outs] == want
        hits = sum(o.metrics["ssd_hit_rate"] * o.metrics["ssd_lookups"] for o in outs)
        lookups = sum(o.metrics["ssd_lookups"] for o in outs)
        assert 0 < hits < lookups, "both cache hits and misses must happen"


@pytest.mark.parametrize("backup", ["neural", "fast"])
def test_changing_k_between_rounds_stays_exact_and_in_sync(tiny_dirs, ar_v16, backup):
    """The adaptive K in SSD: rounds without drafts (K = 0) leave the worker behind and the
    ready speculation stale, shorter K truncate speculations and shorten the worker's
    drafting depth. Scripted choices cover every change; output equals AR, the worker never
    desynchronizes (no failure, no fallback), and the cache still hits."""
    script = [4, 0, 1, 0, 0, 2, 4, 3, 1, 4, 0, 4]
    with ssd(tiny_dirs, num_speculative_tokens=None, backup=backup) as llm:
        paced_target(llm)
        ctl = llm.decoder.controller
        assert ctl.fixed_k is None and ctl.k_max == 4
        turn = iter(range(1 << 30))

        def choose_k(seqs):
            k = script[next(turn) % len(script)]
            ctl.next_k = k  # the worker's depth lags the script by a round: longer and
            return k  # shorter speculations than the K asked for both happen

        ctl.choose_k = choose_k
        want = [o.token_ids for o in ar_v16.generate(PROMPTS, GREEDY)]
        single = [llm.generate([p], GREEDY)[0] for p in PROMPTS]
        batched = llm.generate(PROMPTS, GREEDY)
    for outs in (single, batched):
        assert [o.token_ids for o in outs] == want
        assert all(o.metrics["ssd_worker_failures"] == 0 for o in outs)
        hits = sum(o.metrics["ssd_hit_rate"] * o.metrics["ssd_lookups"] for o in outs)
        assert hits > 0


def test_pipelining_only_variant_is_exact(tiny_dirs, ar_v16):
    want = [o.token_ids for o in ar_v16.generate(PROMPTS, GREEDY)]
    with ssd(tiny_dirs, fanout="pipeline", speculation_budget=1) as llm:
        outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == want
    assert all(set(o.metrics["ssd_hit_rate_by_k"]) for o in outs)


LENGTH = 4
N = 2000
BATCH = 250


@pytest.mark.parametrize(
    "kw",
    [
        {"saguaro_c": 1.0, "backup": "neural"},
        {"saguaro_c": 0.5, "backup": "neural"},
        {"saguaro_c": 0.5, "backup": "fast"},
        {"saguaro_c": 0.7, "backup": "neural", "fanout": "pipeline", "speculation_budget": 1},
    ],
    ids=["c1-neural", "c0.5-neural", "c0.5-fast", "forced-misses"],
)
def test_sampled_ssd_follows_target_distribution(tiny_dirs, kw):
    params = SamplingParams(temperature=1.0, max_tokens=LENGTH, sampler="rejection")
    # K = 1 so that 4 tokens take several rounds: speculation-cache lookups really happen
    draft = {"draft_model": tiny_dirs["v16_draft"], "draft_vocab": None}
    # batches of 250: with all 2000 at once the worker's trees (per-sequence work) outlasted
    # the target's batched verify pass on a Zen 2 every round, so with the fast backup no
    # speculation was ever ready (0 hits in every run); at 250 ~17% of lookups hit there
    with ssd(tiny_dirs, num_speculative_tokens=1, **draft, **kw) as llm:
        prompt = llm.tokenizer.encode("w3 w4 w5 w3 w4")
        each = seeded(params, N)
        outs, m = [], {"drafted_tokens": 0, "accepted_tokens": 0}
        for i in range(0, N, BATCH):
            outs += llm.generate([prompt] * len(each[i : i + BATCH]), each[i : i + BATCH])
            for key in m:  # metrics() covers the last call: summed over all N
                m[key] += llm.metrics()[key]
        eos = llm.eos_token_ids[0]
    samples = [tuple(o.token_ids) + ((eos,) if o.finish_reason == "stop" else ()) for o in outs]
    exact = exact_sequence_probs(tiny_dirs["v16"], prompt, params, LENGTH, {eos})
    assert m["drafted_tokens"] > 500 and 0 < m["accepted_tokens"] < m["drafted_tokens"]
    lookups = sum(o.metrics["ssd_lookups"] for o in outs)
    hits = sum(o.metrics["ssd_hit_rate"] * o.metrics["ssd_lookups"] for o in outs)
    assert 0 < hits < lookups
    assert chi_square_pvalue(samples, exact) > 1e-3


# -- the cache's keys ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_worker(tiny_dirs):
    """The worker's logic in this process (no subprocess): for looking inside its cache."""
    return DraftWorker(worker_config(str(tiny_dirs["v16_draft"])))


def worker_config(draft_path: str) -> WorkerConfig:
    return WorkerConfig(
        draft_path=draft_path,
        dtype="float32",
        device="cpu",
        quantization=None,
        head_ids=None,
        tokenizer_vocab=16,
        target_vocab=16,
        max_rows=2,
        max_len=64,
        k=3,
        budget=6,
        saguaro_c=1.0,
        sparse_q=8,
        cpu_cores=None,
        num_threads=None,
        host="",
        port=0,
    )


def prefill(w: DraftWorker, sid: str, tokens: list[int]) -> None:
    """A greedy sequence of ``tokens`` (all but its pending token) in the worker."""
    w.prefill(Prefill([PrefillSeq(sid, tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0)]))


def round_(w: DraftWorker, sid: str, start: int, trunk: list[int], fanout: list[int]) -> None:
    w.round(Round(depth=3, seqs=[RoundSeq(sid, start, [], trunk, fanout)]))


def outcome(w: DraftWorker, sid: str, accepted: int, token: int, backup: bool):
    return w.outcome(Outcome(depth=3, backup=backup, seqs=[OutcomeSeq(sid, accepted, token)]))


def speculations(w: DraftWorker, sid: str) -> dict[tuple[int, int], list[int]]:
    """The tokens of every speculation the worker holds for ``sid``, by outcome."""
    specs = w.seqs[sid].specs
    return {key: specs.lookup(*key).tokens for key in specs.outcomes()}


def test_rejected_token_never_hits_and_known_outcomes_hit(local_worker):
    w = local_worker
    prefill(w, "a", [3, 4, 5, 6])
    trunk = [7, 8, 9, 10]  # b_prev, d_1..d_3
    fan = [2, 2, 1, 1]
    round_(w, "a", 4, trunk, fan)
    keys = w.seqs["a"].specs.outcomes()
    assert len(keys) == sum(fan)
    for k, tok in keys:
        if k + 1 < len(trunk):
            assert tok != trunk[k + 1], "a rejected draft can never be the replacement"
    k, tok = keys[0]
    reply = outcome(w, "a", k, tok, backup=False)
    assert reply.hits == [True] and len(reply.specs[0].tokens) == 3
    # the cache holds b_prev and the k accepted drafts, then ahead of them the emitted token
    # (pending) and the drafts the speculation was drafted through
    st = w.seqs["a"]
    assert st.ahead.start == 4 + 1 + k and st.ahead.tokens == [tok] + reply.specs[0].tokens[:2]
    assert st.length == st.ahead.start + 3
    round_(w, "a", 4 + 1 + k, [tok] + reply.specs[0].tokens, fan)
    rejected = (0, w.seqs["a"].trunk[1])  # "0 accepted, then d_1" cannot happen
    reply = outcome(w, "a", *rejected, backup=False)
    assert reply.hits == [False] and reply.specs == [None]
    w.release(Release(["a"]))


def test_tree_drafts_equal_separate_drafting(local_worker):
    """Each branch drafted in the shared tree equals drafting that branch on its own."""
    w = local_worker
    prompt, trunk, fan = [3, 4, 5], [6, 7, 8, 9], [1, 1, 1, 2]
    prefill(w, "t", prompt)
    round_(w, "t", 3, trunk, fan)
    specs = {key: w.seqs["t"].specs.lookup(*key) for key in w.seqs["t"].specs.outcomes()}
    w.release(Release(["t"]))
    for (k, tok), spec in specs.items():
        prefill(w, "s", prompt)
        alone = w.draft(Draft(depth=3, seqs=[DraftSeq("s", 3, trunk[: k + 1] + [tok])]))
        assert alone.specs[0].tokens == spec.tokens
        w.release(Release(["s"]))


@pytest.mark.parametrize("hit", [True, False])
def test_trunk_reusing_held_drafts_equals_a_fresh_trunk(local_worker, hit):
    """After an outcome the row keeps the drafts its speculation came from (moved out of the
    tree on a hit, left in place by a just-in-time backup on a miss); the next round, which
    runs only the trunk's last token, prepares the same speculations as a worker that runs
    the whole trunk."""
    w = local_worker
    prompt, trunk, fan = [3, 4, 5, 6], [7, 8, 9, 10], [2, 2, 1, 1]
    prefill(w, "a", prompt)
    round_(w, "a", 4, trunk, fan)
    k, tok = w.seqs["a"].specs.outcomes()[0] if hit else (1, 15)
    reply = outcome(w, "a", k, tok, backup=True)
    assert reply.hits == [hit]
    spec = reply.specs[0].tokens
    start = len(prompt) + 1 + k
    # the pending token, d_1, d_2: only d_3 runs
    assert w.seqs["a"].held_trunk(start, [], [tok] + spec) == 3
    round_(w, "a", start, [tok] + spec, fan)
    held = {key: w.seqs["a"].specs.lookup(*key).tokens for key in w.seqs["a"].specs.outcomes()}
    prefill(w, "b", prompt + trunk[: k + 1])
    round_(w, "b", start, [tok] + spec, fan)
    fresh = {key: w.seqs["b"].specs.lookup(*key).tokens for key in w.seqs["b"].specs.outcomes()}
    assert held == fresh and len(held) == sum(fan)
    w.release(Release(["a", "b"]))


class OutcomeAfter:
    """In the worker's place of its inbox: the outcome "arrives" once the draft model has run
    ``passes`` forward passes (counted from the round's start), for a tree cut at a known
    step instead of at a time that depends on the machine."""

    def __init__(self, worker: DraftWorker, monkeypatch, passes: int):
        self.passes, self.done = passes, 0
        forward = worker.model.forward

        def counted(*args, **kwargs):
            self.done += 1
            return forward(*args, **kwargs)

        monkeypatch.setattr(worker.model, "forward", counted)
        monkeypatch.setattr(worker, "inbox", self)

    def arrived(self) -> bool:
        return self.done >= self.passes


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_tree_stops_when_the_outcome_arrives(tiny_dirs, monkeypatch, passes):
    """The tree is anytime: an outcome that arrives during the trunk pass leaves no tree (the
    backup drafts the one speculation needed), one that arrives during tree step s leaves
    speculations of s + 1 tokens, the first of the full ones; a hit on a cut tree keeps its
    drafts ahead correctly (the next round's speculations equal a fresh worker's)."""
    prompt, trunk, fan = [3, 4, 5, 6], [7, 8, 9, 10], [2, 2, 1, 1]
    full = DraftWorker(worker_config(str(tiny_dirs["v16_draft"])))
    prefill(full, "a", prompt)
    round_(full, "a", 4, trunk, fan)
    want = speculations(full, "a")

    w = DraftWorker(worker_config(str(tiny_dirs["v16_draft"])))
    prefill(w, "a", prompt)
    OutcomeAfter(w, monkeypatch, passes)  # the trunk is pass 1, the tree's steps 2, 3, ...
    round_(w, "a", 4, trunk, fan)
    got = speculations(w, "a")
    if passes == 1:
        assert got == {}
    else:
        assert got.keys() == want.keys()
        assert all(got[key] == want[key][: passes - 1] for key in want)
    k, tok = next(iter(want))
    reply = outcome(w, "a", k, tok, backup=True)
    assert reply.hits == [passes > 1]
    spec = reply.specs[0].tokens
    assert spec == want[(k, tok)][: len(spec)] and len(spec) == (3 if passes == 1 else passes - 1)
    monkeypatch.setattr(w, "inbox", None)
    start = len(prompt) + 1 + k
    round_(w, "a", start, [tok] + spec, fan)
    held = speculations(w, "a")
    prefill(full, "b", prompt + trunk[: k + 1])
    round_(full, "b", start, [tok] + spec, fan)
    assert held == speculations(full, "b") and len(held) == sum(fan[: len(spec) + 1])


def test_fanout_plans():
    geo = plan_fanout(8, 4, alpha=0.9, kind="geometric")
    assert sum(geo) == 8 and geo[4] == max(geo) and geo[0] >= geo[3]
    assert plan_fanout(10, 4, alpha=0.5, kind="uniform") == [2, 2, 2, 2, 2]
    assert plan_fanout(5, 3, alpha=0.9, kind="pipeline") == [0, 0, 0, 1]
    assert plan_fanout(1, 4, alpha=0.2, kind="geometric")[4] == 1  # all-accepted always covered
    with pytest.raises(ValueError, match="fanout"):
        plan_fanout(4, 2, 0.5, kind="wide")


# -- the wire protocol ---------------------------------------------------------------------------
def example_messages() -> list[Message]:
    spec = Speculation(
        [5, 6], np.array([[5, 1], [6, 0]], dtype=np.int64), np.array([[0.75, 0.25], [1.0, 0.0]])
    )
    return [
        Prefill([PrefillSeq("a", [1, 2], 0.7, 4, 0.9, seed=11, fanout=[2, 1])]),
        Prefill([PrefillSeq("b", [3], 0.0, 0, 1.0, seed=0)]),
        Round(3, [RoundSeq("a", 2, [9], [4, 5, 6, 7], [2, 1, 1, 1])]),
        Outcome(3, True, [OutcomeSeq("a", 2, 8), OutcomeSeq("b", 0, 3)]),
        Draft(2, [DraftSeq("b", 1, [3, 4])]),
        Release(["a", "b"]),
        Resize(4, 512),
        Stop(),
        Ready(),
        StartFailed("could not load the draft model: no such file"),
        Drafts([spec, None], [True, False], busy_s=1.5),
        Resized(busy_s=2.0),
    ]


def same_wire(a, b) -> bool:
    """Equal wire forms: same plain values, numpy arrays equal in dtype and contents."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_wire(a[k], b[k]) for k in a)
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_wire, a, b))
    return type(a) is type(b) and a == b


def test_every_message_round_trips_through_its_wire_form():
    examples = example_messages()
    assert {type(m) for m in examples} == set(MESSAGES.values()), "an example of every type"
    for msg in examples:
        wire = msg.to_wire()
        data = pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)
        assert b"specdec" not in data, f"{msg.op}: the wire form must be plain data"
        back = Message.from_wire(pickle.loads(data))
        assert type(back) is type(msg) and same_wire(back.to_wire(), wire)
        if not isinstance(msg, Drafts):  # (a Speculation's arrays do not compare with ==)
            assert back == msg
    drafts = Message.from_wire(examples[-2].to_wire())
    assert isinstance(drafts.specs[0], Speculation) and drafts.specs[1] is None
    assert drafts.specs[0].tokens == [5, 6] and drafts.specs[0].q_probs[0, 1] == 0.25
    with pytest.raises(ValueError, match="unknown SSD message 'hello'"):
        Message.from_wire({"op": "hello"})


def test_worker_config_round_trips_through_json(tiny_dirs):
    cfg = worker_config(str(tiny_dirs["v16_draft"]))
    cfg.cpu_cores, cfg.head_ids = [1], [0, 2, 5]
    assert WorkerConfig.from_json(cfg.to_json()) == cfg


# -- faults ------------------------------------------------------------------------------------
def test_sigkilled_worker_request_completes_identically(tiny_dirs, ar_v16):
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    want = ar_v16.generate(["w3 w4 w5"], params)[0]
    llm = ssd(tiny_dirs, ssd_timeout_s=10)
    try:
        pid = llm.decoder.drafter.handle.pid
        pieces = []
        for i, piece in enumerate(llm.generate_stream("w3 w4 w5", params)):
            pieces.append(piece)
            if i == 3:
                os.kill(pid, signal.SIGKILL)
        assert "".join(pieces) == want.text
        out = llm.last_output
        assert out.token_ids == want.token_ids
        assert out.metrics["ssd_worker_failures"] >= 1
        assert llm.decoder.drafter.handle.failures
        # the next request works, on the restarted worker once it is up
        deadline = time.time() + 60
        while not llm.decoder.drafter.handle.up and time.time() < deadline:
            time.sleep(0.2)
        assert llm.decoder.drafter.handle.up and llm.decoder.drafter.handle.pid != pid
        again = llm.generate(["w3 w4 w5"], params)[0]
        assert again.token_ids == want.token_ids
        assert again.metrics["ssd_lookups"] > 0
    finally:
        llm.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert workers_of_this_process() == []


def test_silent_worker_times_out_and_generation_continues(tiny_dirs, ar_v16):
    """A worker that stops answering (SIGSTOP) is declared lost after the timeout; the request
    completes identically on the target alone, and the stopped worker is killed."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = ar_v16.generate(["w10 w11"], params)[0]
    llm = ssd(tiny_dirs, ssd_timeout_s=2, backup="neural")
    try:
        pid = llm.decoder.drafter.handle.pid
        pieces = []
        t0 = time.time()
        for i, piece in enumerate(llm.generate_stream("w10 w11", params)):
            pieces.append(piece)
            if i == 2:
                os.kill(pid, signal.SIGSTOP)
        assert time.time() - t0 < 30  # never hangs: the 2 s timeout fired
        assert "".join(pieces) == want.text
        assert llm.last_output.metrics["ssd_worker_failures"] >= 1
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        llm.close()
    assert workers_of_this_process() == []


def test_close_leaves_no_process_behind(tiny_dirs):
    with ssd(tiny_dirs) as llm:
        pid = llm.decoder.drafter.handle.pid
        assert psutil.pid_exists(pid)
        llm.generate(["w3"], SamplingParams(temperature=0, max_tokens=5))
    time.sleep(0.2)
    assert workers_of_this_process() == []


def test_worker_prefills_while_the_target_does(tiny_dirs):
    """The worker gets the prompt before the target's prefill pass starts (it prefills on its
    own core meanwhile); sent after it, the worker's prefill was the first round's wait."""
    with ssd(tiny_dirs) as llm:
        events = []
        handle, target = llm.decoder.drafter.handle, llm.decoder.target
        notify, forward = handle.notify, target.forward

        def logged_notify(msg):
            events.append(type(msg).__name__)
            return notify(msg)

        def logged_forward(*args, **kw):
            events.append("target")
            return forward(*args, **kw)

        handle.notify, target.forward = logged_notify, logged_forward
        llm.generate(["w3 w4 w5"], SamplingParams(temperature=0, max_tokens=3))
    assert "Prefill" in events
    assert events.index("Prefill") < events.index("target")


# -- the channel -----------------------------------------------------------------------------
def test_channel_takes_only_the_keyed_worker_and_never_hangs():
    """A connection without the key is dropped (nothing it sends is read as a message); the
    keyed one gets through; a receive times out, and a closed peer raises ChannelError."""
    import socket
    import threading

    from specdec.ssd.channel import Channel, ChannelError

    rendezvous = Channel.listen()
    stranger = socket.create_connection(("127.0.0.1", rendezvous.port))
    stranger.sendall(b"x" * 64)
    worker: dict = {}

    def connect():
        worker["channel"] = Channel.connect("127.0.0.1", rendezvous.port, rendezvous.key, 10)

    thread = threading.Thread(target=connect)
    thread.start()
    target = rendezvous.accept(10, 5)
    thread.join()
    rendezvous.close()
    try:  # closed by the target (a reset: it left the stranger's bytes unread)
        closed = stranger.recv(1) == b""
    except ConnectionResetError:
        closed = True
    assert closed
    worker["channel"].send(Release(["a", "b"]))
    assert target.recv() == Release(["a", "b"])
    target.send(Stop())
    assert worker["channel"].recv() == Stop()
    t0 = time.monotonic()
    with pytest.raises(ChannelError, match="timed out"):
        target.recv(0.2)
    assert time.monotonic() - t0 < 2
    worker["channel"].close()
    with pytest.raises(ChannelError, match="closed"):
        target.recv(5)
    target.close()
    stranger.close()


def test_channel_accept_times_out_without_a_worker():
    from specdec.ssd.channel import Channel, ChannelError

    rendezvous = Channel.listen()
    t0 = time.monotonic()
    with pytest.raises(ChannelError):
        rendezvous.accept(0.3, 5)
    assert time.monotonic() - t0 < 2
    rendezvous.close()


def test_move_slots_moves_every_layers_keys_and_values():
    """A hit's branch becomes the row's continuation: slots (in order, overlapping the
    destination) copied in every layer's K and V, other rows untouched, the row ending there."""
    from types import SimpleNamespace

    from specdec.kv_cache import KVCache

    cfg = SimpleNamespace(num_kv_heads=2, head_dim=4, num_layers=3)
    cache = KVCache(cfg, max_rows=2, max_len=16)
    torch.manual_seed(0)
    for t in cache.k + cache.v:
        t.normal_()
    before = [t.clone() for t in cache.k + cache.v]
    cache.lengths[1] = 9
    cache.move_slots(1, [5, 3, 8], 4)
    for t, old in zip(cache.k + cache.v, before):
        assert torch.equal(t[1, :, 4:7], old[1, :, [5, 3, 8]])
        assert torch.equal(t[1, :, :4], old[1, :, :4])
        assert torch.equal(t[0], old[0])
    assert cache.length(1) == 7


def test_bad_ssd_options(tiny_dirs):
    for kw, msg in [
        ({"saguaro_c": 0.0}, "saguaro_c"),
        ({"speculation_budget": 0}, "budget"),
        ({"fanout": "wide"}, "fanout"),
        ({"backup": "maybe"}, "backup"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ssd(tiny_dirs, **kw)
    assert workers_of_this_process() == []


def test_saguaro_distribution_is_exact_proposal():
    """q' keeps q's top tokens with the top-F scaled by C: a proper distribution whose
    support is what the worker reports (so the verifier's q' is the sampled one)."""
    from specdec.ssd.worker import saguaro

    q = torch.softmax(torch.randn(50, dtype=torch.float64), -1)
    ids, probs = saguaro(q, fanout=3, c=0.5, sparse=10)
    assert len(ids) == 10 and abs(float(probs.sum()) - 1) < 1e-12
    top = q.topk(10).values
    ratio = probs / top
    assert torch.allclose(ratio[:3] / ratio[3], torch.full((3,), 0.5, dtype=torch.float64))
    assert SP(temperature=0).greedy
