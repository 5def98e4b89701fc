"""Generation logprobs on tiny models: under every method (ar, sd with fixed and adaptive K,
ngram, ssd) each generated token's logprob and alternatives equal LLM.score of the same text
under the request's distribution (greedy: the untempered model; sampled: log p~ after
temperature, top-k, top-p), i.e. the target's rows, never the drafter's; prompt logprobs and
max_tokens=0 scoring; requests without logprobs beside them pay nothing."""

from __future__ import annotations

import dataclasses
import math

import pytest

from specdec import LLM, SamplingParams

PROMPTS = ["w3 w4 w5 w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]
SETTINGS = {
    "greedy": dict(temperature=0),
    "coupled": dict(temperature=0.8, top_k=6, sampler="coupled"),
    "rejection": dict(temperature=1.2, top_p=0.8, sampler="rejection"),
}
TOL = 1e-4


@pytest.fixture(scope="module")
def ar(tiny_dirs):
    return LLM(tiny_dirs["v16"], dtype="float32")


@pytest.fixture(scope="module")
def methods(tiny_dirs, ar):
    v16, draft = tiny_dirs["v16"], tiny_dirs["v16_draft"]
    kw = dict(dtype="float32")
    llms = {
        "ar": ar,
        "sd-k3": LLM(v16, draft_model=draft, method="sd", num_speculative_tokens=3, **kw),
        "sd-adaptive": LLM(v16, draft_model=draft, method="sd", **kw),
        "ngram": LLM(v16, method="ngram", num_speculative_tokens=3, **kw),
        "ssd": LLM(v16, draft_model=draft, method="ssd", num_speculative_tokens=2, **kw),
    }
    yield llms
    for name, llm in llms.items():
        if name != "ar":
            llm.close()


def params(setting: str, **kw) -> SamplingParams:
    kw.setdefault("max_tokens", 24)
    kw.setdefault("ignore_eos", True)
    return SamplingParams(**SETTINGS[setting], **kw)


def assert_entries_equal_scores(llm, out, p: SamplingParams) -> None:
    assert [e.token_id for e in out.logprobs] == out.token_ids
    (score,) = llm.score(
        [out.prompt_token_ids], [out.token_ids], top_logprobs=p.logprobs, sampling_params=p
    )
    for e, lp, top in zip(out.logprobs, score.logprobs, score.top_logprobs or []):
        assert math.isfinite(e.logprob)  # a drawn token is always in the sampled set
        assert e.logprob == pytest.approx(lp, abs=TOL)
        assert [t for t, _ in e.top] == [t for t, _ in top]
        assert [v for _, v in e.top] == pytest.approx([v for _, v in top], abs=TOL)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_method_reports_the_target_logprobs_of_its_tokens(methods, setting):
    """Batched with a request that asks for none (it gets None and the same tokens as alone)."""
    ps = [params(setting, logprobs=3, seed=s) for s in range(len(PROMPTS))]
    plain = params(setting, seed=0)
    for name, llm in methods.items():
        outs = llm.generate(PROMPTS + PROMPTS[:1], ps + [plain])
        for out, p in zip(outs, ps):
            assert_entries_equal_scores(llm, out, p)
        assert outs[-1].logprobs is None and outs[-1].prompt_logprobs is None
        if name != "ar":  # drafted tokens were accepted: their entries are verify-pass rows
            assert sum(o.metrics["accepted_tokens"] for o in outs) > 0, name
        if setting != "rejection":  # the same tokens as without logprobs
            assert outs[-1].token_ids == outs[0].token_ids, name


def test_greedy_logprobs_are_the_untempered_model_distribution(ar):
    out = ar.generate([PROMPTS[0]], params("greedy", logprobs=2, top_k=3, top_p=0.5))[0]
    (raw,) = ar.score([out.prompt_token_ids], [out.token_ids], top_logprobs=2)
    assert [e.logprob for e in out.logprobs] == pytest.approx(raw.logprobs, abs=TOL)
    assert all(e.top[0][0] == e.token_id for e in out.logprobs)  # the argmax, every time
    assert all(e.logprob < 0 for e in out.logprobs)  # not a point mass


def test_sampled_logprobs_are_tempered(ar):
    p = params("coupled", logprobs=0, seed=4)
    out = ar.generate([PROMPTS[1]], p)[0]
    (raw,) = ar.score([out.prompt_token_ids], [out.token_ids])
    got = [e.logprob for e in out.logprobs]
    assert all(e.top == [] for e in out.logprobs)  # logprobs=0: no alternatives
    assert max(abs(a - b) for a, b in zip(got, raw.logprobs)) > 0.01


def test_stop_strings_keep_one_entry_per_token(ar):
    free = ar.generate([PROMPTS[0]], params("greedy"))[0]
    stop = free.text.split()[3]
    out = ar.generate([PROMPTS[0]], params("greedy", logprobs=1, stop=stop))[0]
    assert out.finish_reason == "stop" and len(out.logprobs) == len(out.token_ids)
    assert_entries_equal_scores(ar, out, params("greedy", logprobs=1))


@pytest.mark.parametrize("method", ["ar", "sd-k3", "ssd"])
def test_prompt_logprobs_and_scoring_only_requests(methods, method):
    llm = methods[method]
    p = params("coupled", logprobs=1, prompt_logprobs=2, seed=1)
    zero = SamplingParams(max_tokens=0, prompt_logprobs=0)
    outs = llm.generate(PROMPTS + PROMPTS[:2], [p] * len(PROMPTS) + [zero, zero])
    for out in outs:
        n = 2 if out.token_ids else 0
        pp = p if out.token_ids else zero
        (score,) = llm.score([out.prompt_token_ids], top_logprobs=n, sampling_params=pp)
        assert out.prompt_logprobs[0] is None
        assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
        got = [e.logprob for e in out.prompt_logprobs[1:]]
        assert got == pytest.approx(score.logprobs[1:], abs=TOL)
        assert [e.token_id for e in out.prompt_logprobs[1:]] == out.prompt_token_ids[1:]
        tops = score.top_logprobs[1:] if n else [[]] * len(got)
        for e, top in zip(out.prompt_logprobs[1:], tops):
            assert [t for t, _ in e.top] == [t for t, _ in top]
            assert [v for _, v in e.top] == pytest.approx([v for _, v in top], abs=TOL)
    for out in outs[-2:]:  # only scored: no tokens, no cache row taken
        assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"
        assert out.logprobs is None
    assert llm.decoder.cache.free_rows == llm.decoder.cache.max_rows


@pytest.mark.parametrize("setting", ["greedy", "coupled"])
def test_logprobs_describe_the_penalized_distribution_under_every_method(methods, setting):
    """With logits processors (penalties, logit_bias) the logprobs are those of the processed
    distribution the tokens were drawn from: every method reports AR's, token for token, and
    they differ from the unprocessed model's."""
    p = params(
        setting, seed=3, logprobs=2, presence_penalty=1.5, frequency_penalty=0.5,
        logit_bias={5: 3.0}, max_tokens=16,
    )  # fmt: skip
    want = methods["ar"].generate([PROMPTS[0]], p)[0]
    for name, llm in methods.items():
        got = llm.generate([PROMPTS[0]], p)[0]
        assert got.token_ids == want.token_ids, name
        for e, w in zip(got.logprobs, want.logprobs):
            assert e.logprob == pytest.approx(w.logprob, abs=TOL), name
            assert [t for t, _ in e.top] == [t for t, _ in w.top], name
    (raw,) = methods["ar"].score(
        [want.prompt_token_ids], [want.token_ids], sampling_params=dataclasses.replace(
            p, presence_penalty=None, frequency_penalty=None, logit_bias=None
        )
    )  # fmt: skip
    assert any(abs(e.logprob - r) > 1e-3 for e, r in zip(want.logprobs, raw.logprobs))
