"""LLM.score on tiny models: per-token logprobs equal a float64 reference computed by
transformers from the same checkpoint, batched equals one at a time (and chunked equals one
pass), continuations are the tail of the whole text, sampling parameters give the sampled
distribution's logprobs, and bad input is refused."""

from __future__ import annotations

import math

import pytest
import torch

from specdec import LLM, SamplingParams, scoring
from specdec.sampling import probabilities

TEXTS = ["w3 w4 w5 w6 w7", "w10 w11", "w7 w7 w7 w7 w8 w9 w20 w21 w3", "w20 w1", "w5"]
TOL = 1e-4


@pytest.fixture(scope="module")
def llm(tiny_dirs):
    return LLM(tiny_dirs["llama"], dtype="float32")


def reference_logp(folder, ids: list[int]) -> torch.Tensor:
    """[len(ids)-1, V] float64 log-softmax of transformers' logits (row j predicts ids[j+1])."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_scores_equal_a_float64_reference(tiny_dirs, family):
    llm = LLM(tiny_dirs[family], dtype="float32")
    outs = llm.score(TEXTS, top_logprobs=4)
    for text, out in zip(TEXTS, outs):
        ids = llm.tokenizer.encode(text)
        assert out.prompt_token_ids == ids and out.token_ids == ids
        assert out.tokens == [llm.tokenizer.token_text(t) for t in ids]
        assert out.logprobs[0] is None and out.top_logprobs[0] is None
        if len(ids) == 1:
            assert out.logprobs == [None] and out.total == 0
            continue
        ref = reference_logp(tiny_dirs[family], ids)
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        got = torch.tensor(out.logprobs[1:], dtype=torch.float64)
        assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()
        assert out.total == pytest.approx(float(want.sum()), abs=TOL * len(ids))
        for j, top in enumerate(out.top_logprobs[1:]):
            vals, idx = ref[j].topk(4)
            assert [t for t, _ in top] == idx.tolist()
            assert torch.allclose(torch.tensor([v for _, v in top]).double(), vals, atol=TOL)
        best = [t for ((t, _), *_) in out.top_logprobs[1:]]
        assert out.is_greedy == (best == ids[1:])


def test_batched_scores_equal_one_at_a_time(llm):
    together = llm.score(TEXTS, top_logprobs=3)
    for text, out in zip(TEXTS, together):
        (alone,) = llm.score(text, top_logprobs=3)
        assert alone == out  # batch-invariant kernels: equal to the last bit


def test_texts_over_the_pass_budget_go_in_chunks_with_the_same_scores(llm, monkeypatch):
    want = llm.score(TEXTS, top_logprobs=2)
    monkeypatch.setattr(scoring, "TOKENS_PER_PASS", 3)  # the long texts go alone, in chunks
    got = llm.score(TEXTS, top_logprobs=2)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert a.logprobs[0] is None
        assert torch.allclose(torch.tensor(a.logprobs[1:]), torch.tensor(b.logprobs[1:]), atol=1e-5)


def test_a_continuation_is_scored_as_the_tail_of_the_whole_text(llm):
    prompts = ["w3 w4", "w10", "w7 w7 w7"]
    conts = [" w5 w6 w7", " w11", " w8 w9 w20 w21 w3"]
    outs = llm.score(prompts, conts, top_logprobs=2)
    for p, c, out in zip(prompts, conts, outs):
        p_ids, whole = llm.tokenizer.encode(p), llm.tokenizer.encode(p + c)
        assert out.prompt_token_ids == p_ids and out.token_ids == whole[len(p_ids) :]
        (full,) = llm.score([whole], top_logprobs=2)
        assert out.logprobs == full.logprobs[len(p_ids) :]
        assert out.top_logprobs == full.top_logprobs[len(p_ids) :]
        # token ids in either place score the same
        (by_ids,) = llm.score([p_ids], [out.token_ids], top_logprobs=2)
        assert by_ids.logprobs == out.logprobs


def test_is_greedy_says_whether_the_continuation_is_the_greedy_one(llm):
    greedy = llm.generate(["w3 w4"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    ids = greedy[0].token_ids
    (out,) = llm.score(["w3 w4"], [ids], top_logprobs=2)
    assert out.is_greedy
    assert [top[0][0] for top in out.top_logprobs] == ids
    runner_up = out.top_logprobs[0][1][0]
    (off,) = llm.score(["w3 w4"], [[runner_up] + ids[1:]])
    assert not off.is_greedy


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=0.9, top_p=0.6),
        SamplingParams(temperature=0.8, top_k=6, top_p=0.9),
    ],
    ids=["temperature", "top_k", "top_p", "all"],
)
def test_sampling_params_score_the_sampled_distribution(llm, tiny_dirs, params):
    """With sampling parameters a logprob is log p~ of the distribution such a request draws
    from: tokens the sampler cannot draw get -inf, the others sum to one."""
    text = TEXTS[2]
    ids = llm.tokenizer.encode(text)
    (out,) = llm.score([ids[:2]], [ids[2:]], top_logprobs=20, sampling_params=params)
    ref = reference_logp(tiny_dirs["llama"], ids)[1:]  # rows predicting ids[2:]
    p = probabilities(ref, [params] * len(ref))  # fp64 reference of the sampled distribution
    for j, tok in enumerate(ids[2:]):
        want = math.log(p[j, tok]) if p[j, tok] > 0 else -math.inf
        assert out.logprobs[j] == pytest.approx(want, abs=TOL)
        kept = {t: lp for t, lp in out.top_logprobs[j] if lp > -math.inf}
        support = set(p[j].nonzero().flatten().tolist())
        if len(support) <= 20:
            assert set(kept) == support
            assert sum(math.exp(v) for v in kept.values()) == pytest.approx(1.0, abs=1e-5)
        else:
            assert len(kept) == 20 and set(kept) <= support
    # greedy parameters are the untempered model distribution, as without parameters
    (raw,) = llm.score([ids[:2]], [ids[2:]])
    (greedy,) = llm.score([ids[:2]], [ids[2:]], sampling_params=SamplingParams(temperature=0))
    assert greedy.logprobs == raw.logprobs


@pytest.mark.parametrize(
    "args, kw, msg",
    [
        (([],), {}, "no prompts"),
        (("",), {}, "prompt 0 is empty"),
        (([[1, 99]],), {}, "outside the vocabulary"),
        ((["w3"], ["w4", "w5"]), {}, "2 continuations for 1 prompts"),
        ((["w3"], [[]]), {}, "continuation 0 is empty"),
        ((["w3"],), {"top_logprobs": 21}, "top_logprobs"),
        ((["w3"],), {"top_logprobs": True}, "top_logprobs"),
        ((" ".join(["w3"] * 600),), {}, "context"),
    ],
)
def test_bad_input_is_refused(llm, args, kw, msg):
    with pytest.raises(ValueError, match=msg):
        llm.score(*args, **kw)
