"""Structured output (constraints.py): grammar masks are right, roll back, and keep every
decoding method exact: chi-square against the exact constrained target distribution,
greedy token identity with AR.

The tiny models here speak JSON pieces (tiny_models.write_json_tokenizer: [ ] { } , : " a b
1 2 true false), so a JSON schema over them has a language small enough to write by hand."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
import torch
from stats import chi_square_pvalue, seeded
from tiny_models import JSON_PIECES, build, write_json_tokenizer

from specdec import LLM, SamplingParams
from specdec.constraints import GrammarConstraint, check_constraint
from specdec.model import Transformer
from specdec.sampling import probabilities
from specdec.tokenizer import Tokenizer

T = {w: i for i, w in enumerate(JSON_PIECES)}
EOS = T["</s>"]
# a JSON array of 1s and 2s: "[" ("]" | v ("," v)* "]") with v in {1, 2}
ARRAY = {"type": "json_schema", "schema": {"type": "array", "items": {"enum": [1, 2]}}}


def array_allowed(prefix) -> set[int]:
    """The tokens ARRAY allows after ``prefix``, by hand (an empty set: left the language)."""
    state = "start"
    step = {
        ("start", T["["]): "open",
        ("open", T["]"]): "done",
        ("open", T["1"]): "value",
        ("open", T["2"]): "value",
        ("value", T["]"]): "done",
        ("value", T[","]): "comma",
        ("comma", T["1"]): "value",
        ("comma", T["2"]): "value",
    }
    for t in prefix:
        state = step.get((state, t), "dead")
    return {
        "start": {T["["]},
        "open": {T["]"], T["1"], T["2"]},
        "value": {T["]"], T[","]},
        "comma": {T["1"], T["2"]},
        "done": {EOS},
        "dead": set(),
    }[state]


@pytest.fixture(scope="module")
def json_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("json")
    dirs = {
        "target": build(root / "target", "llama", seed=31, vocab_size=16),
        "draft": build(
            root / "draft",
            "llama",
            seed=32,
            vocab_size=16,
            hidden=32,
            layers=1,
            heads=2,
            kv_heads=1,
        ),
    }
    for d in dirs.values():
        write_json_tokenizer(d)
    return dirs


@pytest.fixture(scope="module")
def tok(json_dirs):
    return Tokenizer(json_dirs["target"])


def names(ids) -> list[str]:
    return [JSON_PIECES[i] for i in ids]


# -- masks -----------------------------------------------------------------------------------
def every_prefix(max_len: int):
    for n in range(max_len + 1):
        yield from (list(p) for p in itertools.product(range(16), repeat=n))


def test_masks_equal_the_language_written_by_hand(tok):
    """Row j of process() allows exactly the tokens the language allows after the output and
    the first j drafts, for every split of every 3-token prefix; rows after a draft the
    grammar forbids allow EOS alone (they are never used)."""
    c = GrammarConstraint.from_spec(ARRAY, tok)
    for seq in every_prefix(3):
        for cut in range(len(seq) + 1):
            out, drafts = seq[:cut], seq[cut:]
            if not array_allowed(out):
                continue  # a committed output never leaves the language
            rows = c.allowed(out, drafts, 16)
            for j in range(len(drafts) + 1):
                want = array_allowed(seq[: cut + j])
                if not want:  # the draft before this row was forbidden
                    assert names(rows[j].nonzero().flatten().tolist()) == ["</s>"]
                    break
                got = set(rows[j].nonzero().flatten().tolist())
                assert got == want, (names(out), names(drafts), j)


def test_process_masks_to_minus_infinity_and_keeps_the_rest(tok):
    c = GrammarConstraint.from_spec(ARRAY, tok)
    logits = torch.randn(3, 20)  # 4 model rows beyond the tokenizer: padding, never allowed
    out = c.process(logits, [T["["]], [T["1"], T[","]])
    for j, prefix in enumerate([[T["["]], [T["["], T["1"]], [T["["], T["1"], T[","]]]):
        allowed = sorted(array_allowed(prefix))
        assert torch.equal(out[j, allowed], logits[j, allowed])
        others = [i for i in range(20) if i not in allowed]
        assert torch.isneginf(out[j, others]).all()
    with pytest.raises(ValueError, match="rows"):
        c.process(logits, [], [T["["]])


def test_a_complete_grammar_allows_eos_and_the_stop_tokens(tok):
    c = GrammarConstraint.from_spec(ARRAY, tok, stop_token_ids=[T["a"]])
    assert names(c.allowed([T["["], T["]"]], [], 16)[0].nonzero().flatten().tolist()) == [
        "</s>",
        "a",
    ]
    # a stop token that the grammar does not allow mid-way stays forbidden there
    assert not c.allowed([T["["]], [], 16)[0, T["a"]]
    # after EOS in the output (ignore_eos), EOS only
    assert names(c.allowed([T["["], T["]"], EOS], [], 16)[0].nonzero().flatten().tolist()) == [
        "</s>"
    ]


def test_rollback_leaves_the_matcher_as_it_was(tok):
    """Random outputs and random drafts (valid runs, then anything, EOS included): after
    process() the constraint answers every later call exactly as a fresh one does."""
    rng = random.Random(0)
    c = GrammarConstraint.from_spec(ARRAY, tok)
    for _ in range(300):
        out = []
        for _ in range(rng.randrange(5)):
            out.append(rng.choice(sorted(array_allowed(out) - {EOS}) or [EOS]))
            if out[-1] == EOS:
                break
        drafts = []
        for _ in range(rng.randrange(6)):
            ok = sorted(array_allowed(out + drafts))
            drafts.append(rng.choice(ok) if ok and rng.random() < 0.7 else rng.randrange(16))
        before = c.allowed(out, [], 16)
        c.allowed(out, drafts, 16)
        assert torch.equal(c.allowed(out, [], 16), before)
        assert torch.equal(before, GrammarConstraint.from_spec(ARRAY, tok).allowed(out, [], 16))


def test_process_rows_equal_the_last_row_of_process(tok):
    """A drafter's branches (process_rows: row r after output + extras[r]) are masked as the
    verify call masks the row after the same drafts; then the matcher is as it was."""
    c = GrammarConstraint.from_spec(ARRAY, tok)
    rng = random.Random(2)
    for _ in range(100):
        out = [T["["]] if rng.random() < 0.8 else []
        extras = [[rng.randrange(16) for _ in range(rng.randrange(4))] for _ in range(5)]
        extras += [[T["1"], T[","]], []]
        before = c.allowed(out, [], 16)
        logits = torch.randn(len(extras), 16)
        rows = c.process_rows(logits, out, extras)
        for r, extra in enumerate(extras):
            want = c.process(logits[r : r + 1].expand(len(extra) + 1, -1), out, extra)[-1]
            assert torch.equal(rows[r], want), (names(out), names(extra))
        assert torch.equal(c.allowed(out, [], 16), before)


def test_a_rewritten_history_is_followed(tok):
    """SSD's worker rewrites the tail of a sequence's history: the constraint goes back."""
    c = GrammarConstraint.from_spec(ARRAY, tok)
    c.allowed([T["["], T["1"], T[","]], [], 16)
    got = c.allowed([T["["], T["2"], T["]"]], [], 16)
    assert names(got[0].nonzero().flatten().tolist()) == ["</s>"]
    got = c.allowed([T["["]], [], 16)
    assert set(got[0].nonzero().flatten().tolist()) == array_allowed([T["["]])


# -- specs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, match",
    [
        ({"type": "xml"}, "type must be one of"),
        ({"type": "json_schema"}, "needs a 'schema'"),
        ({"type": "json_schema", "schema": "{oops"}, "not valid JSON"),
        ({"type": "json_schema", "schema": {"type": "strin"}}, "strin"),
        ({"type": "json_schema", "schema": {"not": {"type": "string"}}}, "not"),
        ({"type": "json_schema", "schema": {"type": "string", "format": "x-uri"}}, "x-uri"),
        ({"type": "grammar", "grammar": "start: foo"}, "foo"),
        ({"type": "grammar"}, "needs a non-empty 'grammar'"),
        ("json", "must be an object"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        check_constraint(spec)
    with pytest.raises(ValueError, match=match):
        SamplingParams(constraint=spec)


def test_specs_are_canonical_and_picklable():
    import pickle

    p = SamplingParams(constraint={"type": "json_schema", "schema": '{"type": "integer"}'})
    assert p.constraint == {"type": "json_schema", "schema": {"type": "integer"}}
    assert pickle.loads(pickle.dumps(p)) == p
    assert dataclasses.replace(p, seed=3).constraint == p.constraint


def test_a_lark_grammar_embedding_a_schema(tok):
    """The tools branch's case: a grammar around a JSON schema (%json), from from_spec."""
    lark = 'start: "a" %json {"type": "array", "items": {"enum": [2]}} "b"'
    c = GrammarConstraint.from_spec({"type": "grammar", "grammar": lark}, tok)
    text = [T["a"], T["["], T["2"], T["]"], T["b"]]
    rows = c.allowed([], text, 16)
    assert all(rows[j, t] for j, t in enumerate(text))
    assert names(rows[1].nonzero().flatten().tolist()) == ["["]
    assert names(rows[-1].nonzero().flatten().tolist()) == ["</s>"]


# -- every method stays exact ----------------------------------------------------------------
LENGTH = 5
PROMPT = "[1,2,1,1,2]"  # repeats, so prompt lookup has something to propose


def exact_constrained(folder, prompt, params, length, allowed) -> dict[tuple, float]:
    """P(first ``length`` tokens) of the target under the constraint, by enumeration: at
    every prefix, p over the tokens ``allowed(prefix)`` renormalized (fp64)."""
    model = Transformer.from_folder(folder)
    out, live = {}, [((), 1.0)]
    for step in range(length):
        n = len(live)
        cache = model.new_cache(n, len(prompt) + length + 2)
        tokens = torch.tensor([list(prompt) + list(s) for s, _ in live])
        logits = model.forward(tokens, cache, logits_at=torch.full((n, 1), tokens.shape[1] - 1))
        logits = logits[:, 0].double()
        for i, (s, _) in enumerate(live):
            mask = torch.ones(logits.shape[1], dtype=torch.bool)
            mask[sorted(allowed(s))] = False
            logits[i, mask] = float("-inf")
        probs = probabilities(logits, [params] * n)
        nxt = []
        for (s, m), row in zip(live, probs):
            for t in row.nonzero().flatten().tolist():
                seq, mass = s + (t,), m * float(row[t])
                if t == EOS or step == length - 1:
                    out[seq] = out.get(seq, 0.0) + mass
                else:
                    nxt.append((seq, mass))
        live = nxt
    return out


def make_llm(json_dirs, method, **kw):
    d = json_dirs
    if method == "sd":
        return LLM(d["target"], draft_model=d["draft"], method="sd", dtype="float32", **kw)
    if method == "ngram":
        return LLM(d["target"], method="ngram", dtype="float32", **kw)
    if method == "ssd":
        return LLM(d["target"], draft_model=d["draft"], method="ssd", dtype="float32", **kw)
    return LLM(d["target"], dtype="float32", **kw)


N_SAMPLES = {"ar": 2000, "sd": 2000, "ngram": 2000, "ssd": 1500}


@pytest.mark.parametrize("method", ["ar", "sd", "ngram", "ssd"])
def test_sampled_output_follows_the_exact_constrained_distribution(json_dirs, method):
    params = SamplingParams(
        temperature=1.0, max_tokens=LENGTH, sampler="rejection", constraint=ARRAY
    )
    n = N_SAMPLES[method]
    with make_llm(json_dirs, method, num_speculative_tokens=2) as llm:
        prompt = llm.tokenizer.encode(PROMPT)
        outs = llm.generate([prompt] * n, seeded(params, n))
        m = llm.metrics()
    samples = [tuple(o.token_ids) + ((EOS,) if o.finish_reason == "stop" else ()) for o in outs]
    exact = exact_constrained(json_dirs["target"], prompt, params, LENGTH, array_allowed)
    if method != "ar":
        assert m["drafted_tokens"] > 500 and 0 < m["accepted_tokens"] < m["drafted_tokens"]
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_the_chi_square_tells_another_grammar_apart(json_dirs):
    """Power: the same test rejects samples under a grammar that differs in one value."""
    params = SamplingParams(temperature=1.0, max_tokens=LENGTH, sampler="rejection")
    other = {"type": "json_schema", "schema": {"type": "array", "items": {"enum": [1]}}}
    with make_llm(json_dirs, "ar") as llm:
        prompt = llm.tokenizer.encode(PROMPT)
        p = dataclasses.replace(params, constraint=other)
        outs = llm.generate([prompt] * 2000, seeded(p, 2000))
    samples = [tuple(o.token_ids) + ((EOS,) if o.finish_reason == "stop" else ()) for o in outs]
    exact = exact_constrained(json_dirs["target"], prompt, params, LENGTH, array_allowed)
    assert chi_square_pvalue(samples, exact) < 1e-6


GREEDY_PROMPTS = ["[1,2,1,1,2]", "[2,2", "{", "[1,1,1,1,1,1"]


@pytest.mark.parametrize("method", ["sd", "ngram", "ssd"])
def test_greedy_output_is_token_identical_to_ar(json_dirs, method):
    """Greedy and coupled-seeded outputs under a JSON-object schema: every method gives AR's
    tokens, and the output is in the language."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"enum": [1, 2]}}, "b": {"enum": [True]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    spec = {"type": "json_schema", "schema": schema}
    params = [
        SamplingParams(temperature=0, max_tokens=30, constraint=spec),
        SamplingParams(temperature=0.8, max_tokens=30, seed=5, constraint=spec),
        SamplingParams(temperature=0, max_tokens=12, constraint=ARRAY),
    ]
    with make_llm(json_dirs, "ar") as ar:
        prompts = [ar.tokenizer.encode(p) for p in GREEDY_PROMPTS]
        want = [[o.token_ids for o in ar.generate(prompts, p)] for p in params]
    with make_llm(json_dirs, method, num_speculative_tokens=3) as llm:
        got = [[o.token_ids for o in llm.generate(prompts, p)] for p in params]
        single = [llm.generate([prompts[0]], p)[0].token_ids for p in params]
        assert llm.metrics()["drafted_tokens"] > 0
    assert got == want
    assert single == [w[0] for w in want]
    assert all(len(t) > 5 for t in want[0])  # the schema's forced prefix at least
    assert all(names(t[:4]) == ["{", '"', "a", '"'] for t in want[0])


# -- the server ------------------------------------------------------------------------------
OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3}},
    "required": ["a"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def json_server(json_dirs):
    from server_utils import ServerThread

    from specdec.server.app import create_app

    llm = LLM(json_dirs["target"], dtype="float32")
    with ServerThread(create_app(llm, "tiny-json", max_num_seqs=4)) as srv:
        yield llm, srv


def openai_client(srv):
    import openai

    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30)


def test_server_response_format_json_schema_and_json_object(json_server):
    """Chat and completions honour response_format: the text parses and validates against
    the schema, and equals the Python API's output under the same constraint."""
    import json

    import jsonschema

    llm, srv = json_server
    c = openai_client(srv)
    spec = {"type": "json_schema", "schema": OBJECT_SCHEMA}
    want = llm.generate(
        [llm.tokenizer.encode("{")], SamplingParams(temperature=0, max_tokens=40, constraint=spec)
    )[0].text
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": OBJECT_SCHEMA}}
    fmt["json_schema"]["strict"] = True
    r = c.chat.completions.create(
        model="tiny-json",
        messages=[{"role": "user", "content": "{"}],
        max_tokens=40,
        temperature=0,
        response_format=fmt,
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and text == want
    jsonschema.validate(json.loads(text), OBJECT_SCHEMA)
    r = c.completions.create(
        model="tiny-json",
        prompt="[1,2",
        max_tokens=40,
        temperature=0.9,
        seed=3,
        n=4,
        extra_body={"response_format": fmt},
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), OBJECT_SCHEMA)
    r = c.chat.completions.create(
        model="tiny-json",
        messages=[{"role": "user", "content": "{"}],
        max_tokens=60,
        temperature=0.9,
        seed=1,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


BAD_TYPE = {"type": "strin"}
UNSUPPORTED = {"type": "object", "not": {"required": ["a"]}}  # llguidance cannot enforce "not"


@pytest.mark.parametrize(
    "fmt, match",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "strin",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"not": {"type": "null"}}},
            },
            "not",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
        ({"type": "yaml"}, "yaml"),
        ({"type": "grammar", "grammar": "start: ("}, "grammar"),
        ({"type": "grammar", "grammar": 'start: <tool_call> "a"'}, "tool_call"),  # no such token
    ],
)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_server_bad_response_format_is_a_400_and_the_server_keeps_serving(
    json_server, fmt, match, route
):
    import httpx

    _, srv = json_server
    body = {"model": "tiny-json", "max_tokens": 4, "response_format": fmt}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "["}]
    else:
        body["prompt"] = "["
    path = "chat/completions" if route == "chat" else "completions"
    r = httpx.post(f"{srv.url}/v1/{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format" and match in err["message"]
    r = openai_client(srv).completions.create(
        model="tiny-json", prompt="[", max_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_properties_come_in_the_schema_order(tok):
    schema = {
        "type": "object",
        "properties": {"b": {"enum": [1]}, "a": {"enum": [2]}},
        "required": ["b", "a"],
        "additionalProperties": False,
    }
    c = GrammarConstraint.from_spec({"type": "json_schema", "schema": schema}, tok)
    assert names(c.allowed([T["{"], T['"']], [], 16)[0].nonzero().flatten().tolist()) == ["b"]


# -- a real model ----------------------------------------------------------------------------
PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
    "additionalProperties": False,
}


@pytest.mark.real
@pytest.mark.parametrize("method", ["ar", "sd", "ngram", "ssd"])
def test_real_model_output_validates_against_the_schema(smollm2_path, method):
    """SmolLM2 asked for a user profile: every output, greedy and over seeds, parses and
    validates against the schema (jsonschema), with every method; properties in order."""
    import json

    import jsonschema

    kw = {"num_speculative_tokens": 3}
    if method in ("sd", "ssd"):
        kw["draft_model"] = smollm2_path  # a self-draft: the point here is the constraint
    spec = {"type": "json_schema", "schema": PROFILE}
    params = [SamplingParams(temperature=0, max_tokens=160, constraint=spec)]
    params += [
        SamplingParams(temperature=0.9, seed=s, max_tokens=160, constraint=spec) for s in range(5)
    ]
    with LLM(smollm2_path, method=method, **kw) as llm:
        prompt = llm.chat_prompt("Describe a user of a web shop as JSON.")
        outs = llm.generate([prompt] * len(params), params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        value = json.loads(o.text)
        jsonschema.validate(value, PROFILE)
        assert list(value) == list(PROFILE["properties"])


@pytest.mark.real
def test_rollback_on_a_real_vocabulary(smollm2_path):
    """SmolLM2's 49k tokens and the profile schema (strings, numbers, an enum, an array):
    along a random valid output, process() over random drafts (valid runs, then anything,
    EOS included) leaves the matcher as it was, and its masks equal a fresh matcher's."""
    tok = Tokenizer(smollm2_path)
    spec = {"type": "json_schema", "schema": PROFILE}
    c, walker = (GrammarConstraint.from_spec(spec, tok) for _ in range(2))
    vocab, eos = tok.vocab_size, set(tok.eos_token_ids)
    rng = random.Random(1)
    out: list[int] = []
    for step in range(200):
        before = c.allowed(out, [], vocab)
        if step % 10 == 0:
            fresh = GrammarConstraint.from_spec(spec, tok)
            assert torch.equal(before, fresh.allowed(out, [], vocab))
        drafts: list[int] = []
        for _ in range(rng.randrange(1, 6)):
            ok = walker.allowed(out + drafts, [], vocab)[0].nonzero().flatten().tolist()
            valid = rng.random() < 0.8 and ok
            drafts.append(rng.choice(ok) if valid else rng.randrange(vocab))
        rows = c.process(torch.zeros(len(drafts) + 1, vocab), out, drafts)
        assert torch.equal(torch.isfinite(rows[0]), before[0])
        branches = c.process_rows(torch.zeros(2, vocab), out, [drafts[:1], drafts])
        assert torch.equal(branches, rows[[1, -1]])  # a drafter's branches, masked alike
        assert torch.equal(c.allowed(out, [], vocab), before)
        choices = [t for t in before[0].nonzero().flatten().tolist() if t not in eos]
        if not choices:
            break
        out.append(rng.choice(choices))
    assert set(before[0].nonzero().flatten().tolist()) <= eos, "the walk reached the end"
    import json

    import jsonschema

    jsonschema.validate(json.loads(tok.decode(out)), PROFILE)
