"""Coupled sampling (same seed, same text) on tiny models: the position-keyed noise, the exact
sample it draws, every method's output token-identical to AR's for a seed (fixed and adaptive K,
alone, batched, streamed), sampled output distributed exactly as the target's (chi-square,
with power checks against two wrong samplers), and the policy that picks the sampler."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy import stats as sps
from stats import chi_square_pvalue, exact_sequence_probs, seeded

from specdec import LLM, SamplingParams, coupling
from specdec.coupling import PositionNoise, coupled_choice, race_weights

LENGTH = 4
N_SAMPLES = 4000
PROMPT = "w3 w4 w5 w3 w4"  # repeats, so prompt lookup has something to propose
PROMPTS = ["w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]

SETTINGS = {
    "t1": dict(temperature=1.0),
    "t0.6": dict(temperature=0.6),
    "topk": dict(temperature=1.0, top_k=4),
    "topp": dict(temperature=1.0, top_p=0.7),
    "all": dict(temperature=0.8, top_k=6, top_p=0.9),
}


def coupled(setting: str, **kw) -> SamplingParams:
    return SamplingParams(**SETTINGS[setting], sampler="coupled", **kw)


# -- the noise and the choice ----------------------------------------------------------------
def test_noise_is_keyed_by_seed_and_position_alone():
    w = race_weights(5, 3, 300)
    assert torch.equal(race_weights(5, 3, 100), w[:100])  # a prefix: padding rows don't matter
    assert torch.equal(race_weights(5, 3, 300), w)
    assert not torch.equal(race_weights(5, 4, 300), w)
    assert not torch.equal(race_weights(6, 3, 300), w)
    assert torch.equal(race_weights(-1, 3, 50), race_weights(2**64 - 1, 3, 50))  # mod 2^64
    noise = PositionNoise(5)
    assert torch.equal(noise.weights([7, 3], 300), torch.stack([race_weights(5, 7, 300), w]))
    noise.forget_before(5)
    assert torch.equal(noise.weights([3], 300)[0], w)  # recomputed: the same


def test_noise_is_exponential_and_independent_across_positions():
    e = 1.0 / torch.stack([race_weights(1, t, 20_000) for t in range(5)]).numpy()
    assert sps.kstest(e.ravel(), "expon").pvalue > 1e-3
    corr = np.corrcoef(e)
    assert np.abs(corr - np.eye(5)).max() < 0.05


def test_coupled_choice_is_an_exact_sample():
    p = torch.tensor([0.5, 0.0, 0.25, 0.125, 0.0625, 0.0625, 0.0, 0.0])
    n = 20_000
    w = torch.stack([race_weights(9, t, 8) for t in range(n)])
    picks = coupled_choice(p.expand(n, -1), w)
    counts = torch.bincount(picks, minlength=8)
    assert counts[p == 0].sum() == 0
    assert sps.chisquare(counts[p > 0].numpy(), (p[p > 0] * n).numpy()).pvalue > 1e-3
    # weights of 1: the argmax (greedy rows are judged by the same function)
    assert coupled_choice(p[None], torch.ones(1, 8)).item() == 0


def test_sampler_policy():
    assert SamplingParams(temperature=1.0, seed=1).coupled
    assert not SamplingParams(temperature=1.0).coupled
    assert SamplingParams(temperature=1.0, sampler="coupled").coupled
    assert not SamplingParams(temperature=1.0, seed=1, sampler="rejection").coupled
    assert not SamplingParams(temperature=0, seed=1, sampler="coupled").coupled  # greedy
    with pytest.raises(ValueError, match="sampler must be one of auto, coupled, rejection"):
        SamplingParams(sampler="gumbel")


# -- same seed, same text --------------------------------------------------------------------
@pytest.fixture(scope="module")
def ar(tiny_dirs):
    return LLM(tiny_dirs["v16"], dtype="float32")


@pytest.fixture(scope="module")
def methods(tiny_dirs):
    v16, draft = tiny_dirs["v16"], tiny_dirs["v16_draft"]
    kw = dict(dtype="float32")
    llms = {
        "sd-k3": LLM(v16, draft_model=draft, method="sd", num_speculative_tokens=3, **kw),
        "sd-adaptive": LLM(v16, draft_model=draft, method="sd", **kw),
        "ngram": LLM(v16, method="ngram", num_speculative_tokens=3, **kw),
        # K = 2 so that cache lookups and misses both happen
        "ssd": LLM(v16, draft_model=draft, method="ssd", num_speculative_tokens=2, **kw),
        "ssd-adaptive": LLM(v16, draft_model=draft, method="ssd", **kw),
    }
    yield llms
    for llm in llms.values():
        llm.close()


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_method_gives_the_ar_text_for_a_seed(ar, methods, setting):
    """Seeds 0..11 over four prompts, batched together with a greedy and a rejection-sampled
    request (the coupled rows must not notice them), then one request alone and streamed."""
    params = [coupled(setting, max_tokens=24, seed=s, ignore_eos=True) for s in range(12)]
    prompts = [PROMPTS[s % 4] for s in range(12)]
    others = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=24, seed=1, sampler="rejection"),
    ]
    want = [o.token_ids for o in ar.generate(prompts, params)]
    assert len(set(map(tuple, want))) > 6  # the seeds really give different texts
    alone = ar.generate([PROMPTS[1]], params[5])[0]
    assert alone.token_ids == want[5]  # alone or batched: the same text
    for name, llm in methods.items():
        outs = llm.generate(prompts + PROMPTS[:2], params + others)
        assert [o.token_ids for o in outs[:12]] == want, name
        assert llm.generate([PROMPTS[1]], params[5])[0].token_ids == want[5], name
        streamed = "".join(llm.generate_stream(PROMPTS[1], params[5]))
        assert streamed == alone.text, name
        if name != "sd-adaptive":  # it may rightly stop drafting: these tiny models cost alike
            assert sum(o.metrics["accepted_tokens"] for o in outs[:12]) > 0, name


def test_auto_sampler_is_coupled_with_a_seed(ar, tiny_dirs):
    """A fresh adaptive decoder explores K = 4 first, so drafts are verified by coupling."""
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=3, ignore_eos=True)
    want = ar.generate(PROMPTS * 3, params)
    llm = LLM(tiny_dirs["v16"], draft_model=tiny_dirs["v16_draft"], method="sd", dtype="float32")
    got = llm.generate(PROMPTS * 3, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics["accepted_tokens"] for o in got) > 0


def test_unseeded_requests_draw_fresh_seeds_and_report_them(ar, methods):
    """A request without a seed gets a fresh one, reported on its output: passed back, it
    gives the same text with any method."""
    params = SamplingParams(temperature=1.0, max_tokens=24, sampler="coupled", ignore_eos=True)
    outs = ar.generate([PROMPTS[0]] * 8, params)
    assert len({tuple(o.token_ids) for o in outs}) > 4
    assert len({o.seed for o in outs}) == 8
    again = dataclasses.replace(params, seed=outs[0].seed)
    assert methods["sd-adaptive"].generate([PROMPTS[0]], again)[0].token_ids == outs[0].token_ids
    greedy = SamplingParams(temperature=0, max_tokens=2)
    assert ar.generate([PROMPTS[0]], greedy)[0].seed is None


# -- exactness -------------------------------------------------------------------------------
def samples_of(llm, params, n=N_SAMPLES):
    outs = llm.generate([llm.tokenizer.encode(PROMPT)] * n, seeded(params, n))
    eos = llm.eos_token_ids[0]
    return [tuple(o.token_ids) + ((eos,) if o.finish_reason == "stop" else ()) for o in outs]


def exact(tiny_dirs, llm, params):
    prompt = llm.tokenizer.encode(PROMPT)
    return exact_sequence_probs(tiny_dirs["v16"], prompt, params, LENGTH, set(llm.eos_token_ids))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_coupled_ar_follows_target_distribution(tiny_dirs, ar, setting):
    params = coupled(setting, max_tokens=LENGTH)
    assert chi_square_pvalue(samples_of(ar, params), exact(tiny_dirs, ar, params)) > 1e-3


@pytest.mark.parametrize("setting", ["t1", "all"])
@pytest.mark.parametrize("which", ["sd-k3", "ngram", "ssd"])
def test_coupled_speculation_follows_target_distribution(tiny_dirs, methods, which, setting):
    llm = methods[which]
    params = coupled(setting, max_tokens=LENGTH)
    samples = samples_of(llm, params)
    m = llm.metrics()
    assert m["drafted_tokens"] > 500 and 0 < m["accepted_tokens"] < m["drafted_tokens"]
    assert chi_square_pvalue(samples, exact(tiny_dirs, llm, params)) > 1e-3


def _noise_without_position(seed, position, vocab):
    return _race_weights(seed, 0, vocab)


def _sharpened_race(seed, position, vocab):  # argmax p * E^-1/4 = argmax p^4 / E: samples p^4
    return _race_weights(seed, position, vocab).pow(0.25)


_race_weights = coupling.race_weights


@pytest.mark.parametrize("wrong", [_noise_without_position, _sharpened_race])
def test_chi_square_rejects_a_wrong_coupled_sampler(tiny_dirs, ar, monkeypatch, wrong):
    """Power: the same test fails for noise that forgets the position (each token is then a
    sample of its own distribution, but the tokens of a sequence are dependent), and for
    weights that are not an exponential race."""
    params = coupled("t1", max_tokens=LENGTH)
    monkeypatch.setattr(coupling, "race_weights", wrong)
    samples = samples_of(ar, params)
    assert chi_square_pvalue(samples, exact(tiny_dirs, ar, params)) < 1e-6


def test_rejection_sampler_is_unchanged(tiny_dirs, ar):
    """sampler="rejection" with a seed draws from the request's uniform stream, as before."""
    params = dataclasses.replace(coupled("t1", max_tokens=LENGTH), sampler="rejection")
    a = samples_of(ar, params, n=200)
    b = samples_of(ar, dataclasses.replace(params, sampler="coupled"), n=200)
    assert a != b
    assert a == samples_of(ar, params, n=200)
