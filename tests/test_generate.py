"""Autoregressive generation through the public API on tiny models: exactness against
transformers and against the target's exact distribution, batching, seeds, stop rules,
streaming, and bad input."""

from __future__ import annotations

import pytest
import torch
import transformers
from stats import chi_square_pvalue, exact_sequence_probs, seeded

from specdec import LLM, SamplingParams

PROMPTS = ["w3 w4 w5", "w10 w11", "w7 w7 w7 w7 w8 w9", "w20"]


def hf_greedy(folder, prompt_ids: list[int], n: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # generate exactly n tokens, like ignore_eos
    ids = torch.tensor([prompt_ids])
    mask = torch.ones_like(ids)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0
    )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_token_identical_to_transformers(tiny_dirs, arch):
    llm = LLM(tiny_dirs[arch], dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        want = hf_greedy(tiny_dirs[arch], llm.tokenizer.encode(prompt), 40)
        assert out.token_ids == want
        assert out.finish_reason == "length"


def test_batched_equals_single(tiny_llm):
    for params in (
        SamplingParams(temperature=0, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=25, seed=5, ignore_eos=True),
    ):
        batched = tiny_llm.generate(PROMPTS, params)
        for prompt, out in zip(PROMPTS, batched):
            (single,) = tiny_llm.generate([prompt], params)
            assert single.token_ids == out.token_ids


def test_seeded_sampling_reproducible_and_seeds_differ(tiny_llm):
    def run(seed):
        p = SamplingParams(temperature=1.0, max_tokens=30, seed=seed, ignore_eos=True)
        return tiny_llm.generate(["w3 w4"], p)[0].token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_tokens=2, sampler="rejection"),
        SamplingParams(temperature=0.6, top_k=5, max_tokens=2, sampler="rejection"),
        SamplingParams(temperature=1.3, top_p=0.8, max_tokens=2, sampler="rejection"),
    ],
    ids=["t1", "topk", "topp"],
)
def test_ar_samples_follow_the_exact_target_distribution(tiny_dirs, tiny_llm, params):
    prompt = tiny_llm.tokenizer.encode("w3 w4 w5")
    eos = set(tiny_llm.eos_token_ids)
    exact = exact_sequence_probs(tiny_dirs["llama"], prompt, params, 2, eos)
    n = 3000
    outs = tiny_llm.generate([prompt] * n, seeded(params, n))
    samples = [tuple(o.token_ids) + ((2,) if o.finish_reason == "stop" else ()) for o in outs]
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_stop_string_never_appears_and_text_is_cut(tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    full = tiny_llm.generate(["w3 w4 w5"], greedy)[0]
    word = full.text.split()[3]
    first = full.text.split().index(word)
    out = tiny_llm.generate(
        ["w3 w4 w5"], SamplingParams(temperature=0, max_tokens=12, stop=[word], ignore_eos=True)
    )[0]
    assert out.finish_reason == "stop"
    assert word not in out.text
    assert out.text == full.text[: full.text.index(word)]
    assert out.token_ids == full.token_ids[: first + 1]  # up to the token completing the stop


def test_stop_token_ids_and_max_tokens_exact(tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    full = tiny_llm.generate(["w10 w11"], greedy)[0]
    assert len(full.token_ids) == 9 and full.finish_reason == "length"
    stop_tok = full.token_ids[4]
    first = full.token_ids.index(stop_tok)
    p = SamplingParams(temperature=0, max_tokens=9, stop_token_ids=[stop_tok], ignore_eos=True)
    out = tiny_llm.generate(["w10 w11"], p)[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[:first]


def test_eos_stops_and_ignore_eos_keeps_it(tiny_llm):
    eos = tiny_llm.eos_token_ids[0]
    n = 300
    params = [
        SamplingParams(temperature=1.5, max_tokens=20, seed=s, ignore_eos=False) for s in range(n)
    ]
    outs = tiny_llm.generate(["w3"] * n, params)
    stopped = [(s, o) for s, o in enumerate(outs) if o.finish_reason == "stop"]
    assert stopped, "no sample hit EOS; the test model should emit it sometimes"
    seed, out = stopped[0]
    assert eos not in out.token_ids
    again = tiny_llm.generate(
        ["w3"], SamplingParams(temperature=1.5, max_tokens=20, seed=seed, ignore_eos=True)
    )[0]
    k = len(out.token_ids)
    assert again.token_ids[:k] == out.token_ids and again.token_ids[k] == eos
    assert len(again.token_ids) == 20 and again.finish_reason == "length"


def test_stream_pieces_join_to_the_generated_text(tiny_llm):
    p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    pieces = list(tiny_llm.generate_stream("w7 w8", p))
    assert len(pieces) > 5
    assert "".join(pieces) == tiny_llm.generate(["w7 w8"], p)[0].text


def test_stream_holds_back_partial_stop_strings(tiny_llm):
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    text = tiny_llm.generate(["w3 w4 w5"], p)[0].text
    stop = text.split()[5][:2] + "~never"  # a prefix of the stop string shows up, then diverges
    with_stop = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop])
    streamed = "".join(tiny_llm.generate_stream("w3 w4 w5", with_stop))
    assert streamed == text


def test_metrics_report_tokens_and_speed(tiny_llm):
    out = tiny_llm.generate(["w3"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    m = out[0].metrics
    assert m["generated_tokens"] == 10 and m["prompt_tokens"] == 1
    assert m["wall_time_s"] > 0 and m["tokens_per_s"] == pytest.approx(10 / m["wall_time_s"])
    assert m["target_forwards"] == 10  # one prefill + 9 single-token passes
    assert tiny_llm.metrics()["generated_tokens"] == 10


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt, msg",
    [("", "empty"), ([], "empty"), ([5, 999], "outside the vocabulary"), (3.5, "prompt")],
)
def test_bad_prompts(tiny_llm, prompt, msg):
    with pytest.raises(ValueError, match=msg):
        tiny_llm.generate([prompt], SamplingParams(max_tokens=3))


def test_prompt_plus_max_tokens_beyond_context(tiny_llm):
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        tiny_llm.generate(["w3 w4"], SamplingParams(max_tokens=511))


def test_unknown_or_unavailable_method(tiny_dirs):
    with pytest.raises(ValueError, match="unknown method"):
        LLM(tiny_dirs["llama"], method="beam")


def test_engine_keeps_working_after_bad_input(tiny_llm):
    with pytest.raises(ValueError):
        tiny_llm.generate(["w3", ""], SamplingParams(max_tokens=3))
    out = tiny_llm.generate(["w3"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
