"""Speculative decoding (draft model and n-gram) end to end on tiny models: the sampled
output follows the target's exact distribution (chi-square, with a power check), greedy output
is token-identical to AR, batches equal single prompts, and stops behave as in AR."""

from __future__ import annotations

from pathlib import Path

import pytest
from stats import chi_square_pvalue, exact_sequence_probs, seeded

from specdec import LLM, SamplingParams

N_SAMPLES = 4000
LENGTH = 4
PROMPT = "w3 w4 w5 w3 w4"  # repeats, so prompt lookup has something to propose


@pytest.fixture
def sd_llm(tiny_dirs):
    # adaptive K; a fresh controller per test starts with its exploration rounds (K = 4, 0, 1, 8),
    # so speculation surely happens even where its timings would later choose K = 0
    return LLM(tiny_dirs["v16"], draft_model=tiny_dirs["v16_draft"], method="sd", dtype="float32")


@pytest.fixture
def sd_ext_llm(tiny_dirs):
    # adaptive K with every draft lengthened to max_speculative_tokens (draft_confidence=0:
    # the draft is always confident enough): the longest drafts the confidence rule can make
    return LLM(
        tiny_dirs["v16"],
        draft_model=tiny_dirs["v16_draft"],
        method="sd",
        dtype="float32",
        draft_confidence=0.0,
        max_speculative_tokens=4,
    )


@pytest.fixture(scope="module")
def sd_k3_llm(tiny_dirs):
    v16, draft = tiny_dirs["v16"], tiny_dirs["v16_draft"]
    return LLM(v16, draft_model=draft, method="sd", num_speculative_tokens=3, dtype="float32")


@pytest.fixture(scope="module")
def ngram_llm(tiny_dirs):
    return LLM(tiny_dirs["v16"], method="ngram", num_speculative_tokens=3, dtype="float32")


@pytest.fixture(scope="module")
def ar_llm(tiny_dirs):
    return LLM(tiny_dirs["v16"], dtype="float32")


# speculative sampling (rejection); the coupled sampler has its own tests in test_coupled.py
SAMPLING = [
    SamplingParams(temperature=1.0, max_tokens=LENGTH, sampler="rejection"),
    SamplingParams(temperature=0.6, max_tokens=LENGTH, sampler="rejection"),
    SamplingParams(temperature=1.0, top_k=4, max_tokens=LENGTH, sampler="rejection"),
    SamplingParams(temperature=1.0, top_p=0.7, max_tokens=LENGTH, sampler="rejection"),
]
SAMPLING_IDS = ["t1", "t0.6", "topk", "topp"]


def samples_of(llm, params, n=N_SAMPLES):
    outs = llm.generate([llm.tokenizer.encode(PROMPT)] * n, seeded(params, n))
    eos = llm.eos_token_ids[0]
    return [tuple(o.token_ids) + ((eos,) if o.finish_reason == "stop" else ()) for o in outs], outs


def exact(tiny_dirs, llm, params):
    prompt = llm.tokenizer.encode(PROMPT)
    return exact_sequence_probs(tiny_dirs["v16"], prompt, params, LENGTH, set(llm.eos_token_ids))


@pytest.mark.parametrize("params", SAMPLING, ids=SAMPLING_IDS)
@pytest.mark.parametrize("which", ["sd_llm", "sd_ext_llm", "sd_k3_llm", "ngram_llm"])
def test_sampled_output_follows_target_distribution(tiny_dirs, request, which, params):
    llm = request.getfixturevalue(which)
    samples, outs = samples_of(llm, params)
    m = llm.metrics()
    assert m["drafted_tokens"] > 500  # speculation really happened ...
    assert 0 < m["accepted_tokens"] < m["drafted_tokens"]  # ... with accepts and rejects
    assert chi_square_pvalue(samples, exact(tiny_dirs, llm, params)) > 1e-3


def test_chi_square_has_power_against_the_draft_distribution(tiny_dirs, sd_llm):
    """The same test rejects samples from the draft model: it can tell the two apart."""
    params = SAMPLING[0]
    draft_ar = LLM(tiny_dirs["v16_draft"], dtype="float32")
    samples, _ = samples_of(draft_ar, params, n=3 * N_SAMPLES)  # power grows with n
    assert chi_square_pvalue(samples, exact(tiny_dirs, sd_llm, params)) < 1e-6


PROMPTS = ["w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]  # in both vocabularies


@pytest.mark.parametrize("which", ["sd_llm", "sd_ext_llm", "sd_k3_llm", "ngram_llm"])
def test_greedy_token_identical_to_ar(ar_llm, request, which):
    llm = request.getfixturevalue(which)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = [o.token_ids for o in ar_llm.generate(PROMPTS, params)]
    got = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in got] == want
    assert llm.metrics()["drafted_tokens"] > 0


def drafted_per_round(llm: LLM, prompts: list[str], params: SamplingParams) -> list[int]:
    """The K of each round's proposal (row 0), as the drafter returned it."""
    drafter, ks = llm.decoder.drafter, []
    propose = drafter.propose

    def spy(seqs, asked):
        proposal = propose(seqs, asked)
        ks.append(int(proposal.k[0]))
        return proposal

    drafter.propose = spy
    llm.generate(prompts, params)
    drafter.propose = propose
    return ks


def test_confident_drafts_lengthen_up_to_the_cap(sd_ext_llm):
    """With draft_confidence=0 the controller asks for one draft and the drafter goes on to
    max_speculative_tokens, never past what the request may still emit."""
    assert sd_ext_llm.decoder.controller.k_plan == 1
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    drafting = [k for k in drafted_per_round(sd_ext_llm, ["w3 w4"], params) if k]
    assert drafting[:-2] and set(drafting[:-2]) == {4}  # the last rounds: what may be emitted


def test_confidence_off_or_fixed_k_drafts_what_is_asked(tiny_dirs):
    """draft_confidence=1 (off) leaves K to the controller; a fixed K is drafted exactly."""
    kw = {"draft_model": tiny_dirs["v16_draft"], "method": "sd", "dtype": "float32"}
    off = LLM(tiny_dirs["v16"], draft_confidence=1.0, **kw)
    assert off.decoder.controller.k_plan == off.decoder.controller.k_max == 8
    fixed = LLM(tiny_dirs["v16"], draft_confidence=0.0, num_speculative_tokens=2, **kw)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    assert set(drafted_per_round(fixed, ["w3 w4"], params)) <= {1, 2}  # 1: the last round


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), "high", True])
def test_bad_draft_confidence(tiny_dirs, value):
    with pytest.raises(ValueError, match="draft_confidence"):
        LLM(
            tiny_dirs["v16"],
            draft_model=tiny_dirs["v16_draft"],
            method="sd",
            draft_confidence=value,
        )


def self_draft(tiny_dirs, k: int, **kw) -> LLM:
    """SD on the tiny llama (float32) with itself as the draft model, K = k."""
    model = tiny_dirs["llama"]
    return LLM(
        model, draft_model=model, method="sd", num_speculative_tokens=k, dtype="float32", **kw
    )


def test_greedy_self_draft_accepts_everything(tiny_dirs, tiny_llm):
    llm = self_draft(tiny_dirs, 4, draft_quantization=None)
    params = SamplingParams(temperature=0, max_tokens=31, ignore_eos=True)
    out = llm.generate(["w3 w4"], params)[0]
    assert out.token_ids == tiny_llm.generate(["w3 w4"], params)[0].token_ids
    m = out.metrics
    assert m["acceptance_rate"] == 1.0
    assert m["mean_tokens_per_round"] == 5.0  # K accepted + 1 bonus every round
    assert m["target_forwards"] == 1 + 30 // 5  # prefill, then 5 tokens per pass


@pytest.mark.parametrize("quant", ["int8", "int4", "q4_0"])
def test_greedy_sd_with_a_requantized_draft_equals_ar(tiny_dirs, tiny_llm, quant):
    """Any cheaper drafter keeps greedy SD token-identical to AR; an HF draft asked for Q4_0
    gets GGUF Q4_0 matrices (in our tiles where our kernels run)."""
    from specdec.kernels import gguf as gk

    llm = self_draft(tiny_dirs, 3, draft_quantization=quant)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["w3 w4", "w10 w11 w10"]
    want = [o.token_ids for o in tiny_llm.generate(prompts, params)]
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    if quant == "q4_0":
        w = llm.decoder.drafter.model.w["layers"][0]["gate_up"].weight
        assert isinstance(w, gk.PackedWeight) and gk.FILE_TYPE.get(w.qtype, w.qtype) == 2


@pytest.mark.parametrize("which", ["sd_llm", "sd_ext_llm", "sd_k3_llm", "ngram_llm"])
def test_batched_equals_single(request, which):
    llm = request.getfixturevalue(which)
    for params in (
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=20, seed=3, ignore_eos=True),
        SamplingParams(
            temperature=1.0, max_tokens=20, seed=3, ignore_eos=True, sampler="rejection"
        ),
    ):
        if which in ("sd_llm", "sd_ext_llm") and params.sampler == "rejection":
            continue  # adaptive K depends on timing: rejection sampling's text needs a fixed K
        batched = llm.generate(PROMPTS, params)
        for prompt, out in zip(PROMPTS, batched):
            assert llm.generate([prompt], params)[0].token_ids == out.token_ids


def test_max_tokens_exact_when_many_are_accepted(tiny_dirs, tiny_llm):
    llm = self_draft(tiny_dirs, 6)
    for n in (1, 2, 5, 7, 13):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        out = llm.generate(["w3"], params)[0]
        assert len(out.token_ids) == n and out.finish_reason == "length"
        assert out.token_ids == tiny_llm.generate(["w3"], params)[0].token_ids


def test_stops_inside_an_accepted_run(tiny_dirs, tiny_llm):
    """Stop strings, stop tokens and EOS cut the output exactly where AR stops, even when the
    stopping token arrives in the middle of a run of accepted drafts."""
    llm = self_draft(tiny_dirs, 6)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = tiny_llm.generate(["w3"], greedy)[0]
    word = full.text.split()[4]
    tok = full.token_ids[4]
    for params in (
        SamplingParams(temperature=0, max_tokens=20, stop=[word], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tok], ignore_eos=True),
    ):
        want = tiny_llm.generate(["w3"], params)[0]
        got = llm.generate(["w3"], params)[0]
        got_end = (got.token_ids, got.text, got.finish_reason)
        assert got_end == (want.token_ids, want.text, want.finish_reason)
        assert got.finish_reason == "stop"


def test_eos_inside_an_accepted_run(tiny_dirs):
    """Sampled with a seed and a fixed K, EOS ends the output in SD as in AR, and nothing
    after it is kept; with ignore_eos the EOS token is kept."""
    llm = self_draft(tiny_dirs, 4, draft_quantization=None)
    eos = llm.eos_token_ids[0]
    params = [SamplingParams(temperature=1.5, max_tokens=20, seed=s) for s in range(200)]
    outs = llm.generate(["w3"] * 200, params)
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert stopped and all(eos not in o.token_ids for o in stopped)
    kept_params = SamplingParams(temperature=1.5, max_tokens=20, ignore_eos=True)
    kept = llm.generate(["w3"] * 50, kept_params)
    assert all(len(o.token_ids) == 20 for o in kept)
    assert any(eos in o.token_ids for o in kept)


# -- validation --------------------------------------------------------------------------------
def test_draft_with_a_different_tokenizer_is_refused(tiny_dirs, tmp_path):
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_dirs["draft"], other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["w3"], vocab["w4"] = vocab["w4"], vocab["w3"]  # same size, different ids
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="tokenizer differs"):
        LLM(tiny_dirs["llama"], draft_model=other, method="sd", dtype="float32")


def test_a_draft_with_the_targets_tokenizer_files_skips_loading_them(
    tiny_dirs, tmp_path, monkeypatch
):
    """Byte-identical tokenizer files mean the same vocabulary: the check loads no second
    tokenizer. Any file that differs (here one more file) sends it to the full
    comparison of the vocabularies, which this draft passes."""
    import shutil

    from specdec import tokenizer

    loaded = []
    real_init = tokenizer.Tokenizer.__init__

    def counting_init(self, folder):
        loaded.append(Path(folder))
        real_init(self, folder)

    monkeypatch.setattr(tokenizer.Tokenizer, "__init__", counting_init)
    same = tmp_path / "same"
    shutil.copytree(tiny_dirs["draft"], same)
    for name in tokenizer.TOKENIZER_FILES:
        if (tiny_dirs["llama"] / name).exists():
            shutil.copy(tiny_dirs["llama"] / name, same / name)
    LLM(tiny_dirs["llama"], draft_model=same, method="sd", dtype="float32")
    assert loaded == [Path(tiny_dirs["llama"])]
    loaded.clear()
    (same / "special_tokens_map.json").write_text("{}")  # one more file: compared in full
    LLM(tiny_dirs["llama"], draft_model=same, method="sd", dtype="float32")
    assert loaded == [Path(tiny_dirs["llama"]), same]


def test_draft_with_padded_vocabulary_is_fine(tiny_dirs, tiny_llm, tmp_path):
    from tiny_models import build

    shape = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "vocab_size": 48}
    padded = build(tmp_path / "padded", "llama", seed=11, **shape)
    from tiny_models import write_tokenizer

    write_tokenizer(padded, 32)  # same 32-token tokenizer, 16 padding rows in the model
    llm = LLM(tiny_dirs["llama"], draft_model=padded, method="sd", dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    assert (
        llm.generate(PROMPTS, params)[0].token_ids
        == tiny_llm.generate(PROMPTS, params)[0].token_ids
    )


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"method": "sd"}, "needs a draft_model"),
        ({"method": "sd", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "ngram_max": 0}, "ngram"),
        ({"method": "ar", "draft_model": "x"}, "takes no draft_model"),
    ],
)
def test_bad_speculation_options(tiny_dirs, kwargs, msg):
    if kwargs.get("method") == "sd" and "num_speculative_tokens" in kwargs:
        kwargs = {**kwargs, "draft_model": tiny_dirs["draft"]}
    with pytest.raises(ValueError, match=msg):
        LLM(tiny_dirs["llama"], dtype="float32", **kwargs)


@pytest.mark.parametrize("method", ["sd", "ssd"])
def test_a_registry_target_takes_its_draft_partner_by_default(method):
    """`specdec generate --method sd` with the default target and no --draft-model drafts with
    the registry's pair instead of failing; an explicit draft is kept, and a target outside
    the registry still has to name one (the message lists the pairs)."""
    from specdec.config import DRAFT_PARTNERS, EngineConfig
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY

    assert all(t in REGISTRY and d in REGISTRY for t, d in DRAFT_PARTNERS.items())

    assert EngineConfig(model=DEFAULT_TARGET, method=method).draft_model == DEFAULT_DRAFT
    assert EngineConfig(model=DEFAULT_TARGET, method=method, draft_model="d").draft_model == "d"
    assert EngineConfig(model=DEFAULT_TARGET, method="ar").draft_model is None
    pair = f"needs a draft_model .*{DEFAULT_TARGET} -> {DEFAULT_DRAFT}"
    with pytest.raises(ValueError, match=pair):
        EngineConfig(model="some/folder", method=method)
