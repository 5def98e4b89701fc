"""Real models. ``real``: SmolLM2-135M (93 MB, pulled on first use) against transformers.
``heavy``: the 1.5 GB default pair (run with ``./test.sh -m heavy``): every decoding method
is token-identical to AR in fp32, and the pair loads and agrees with transformers."""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams

CODE = "Write a Python function that checks whether a string is a palindrome."
PROSE = "Describe a walk through a forest in autumn."


def hf_model(folder, dtype=torch.float32):
    """transformers' model of a pulled folder (its weights read from the GGUF file, in
    Python: load it once per test)."""
    import transformers

    from specdec.gguf_model import transformers_source

    where, kw = transformers_source(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw).eval()
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():  # an explicit mask: chat prompts contain the pad id (<|im_end|>)
        mask = torch.ones_like(x)
        out = model.generate(x, attention_mask=mask, max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.real
def test_smollm2_greedy_token_identical_to_transformers(smollm2_path):
    llm = LLM(smollm2_path, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    reference = hf_model(smollm2_path)
    for text in (CODE, PROSE):
        ids = llm.chat_prompt(text)
        ours = llm.generate([ids], params)[0].token_ids
        assert ours == hf_greedy(reference, ids, 48)


@pytest.mark.real
def test_smollm2_speculative_methods_equal_ar(smollm2_path):
    """SmolLM2 has no same-tokenizer partner on PyPI: it drafts for itself (int8, a third of
    its vocabulary) and by prompt lookup."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [CODE, PROSE]
    ar = LLM(smollm2_path, dtype="float32")
    ids = [ar.chat_prompt(t) for t in prompts]
    want = [o.token_ids for o in ar.generate(ids, params)]
    int8_drafter = {"draft_quantization": "int8", "draft_vocab": 16384}
    for kw in ({"method": "ngram"}, {"method": "sd", "draft_model": smollm2_path, **int8_drafter}):
        llm = LLM(smollm2_path, dtype="float32", **kw)
        assert [o.token_ids for o in llm.generate(ids, params)] == want, kw


# -- the default pair --------------------------------------------------------------------------
PAIR = {"model": "qwen2.5-coder-1.5b", "draft_model": "qwen2.5-coder-0.5b"}


@pytest.fixture(scope="module")
def ar_fp32():
    return LLM(PAIR["model"], dtype="float32")


@pytest.fixture(scope="module")
def want(ar_fp32):
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ids = [ar_fp32.chat_prompt(t) for t in (CODE, PROSE)]
    return ids, [o.token_ids for o in ar_fp32.generate(ids, params)], params


SEEDED = [  # same seed, same text (the coupled sampler): every method gives AR's sample
    SamplingParams(temperature=t, top_p=p, max_tokens=48, seed=s, ignore_eos=True)
    for t, p, s in ((0.7, 1.0, 1), (1.0, 0.95, 2))
]


@pytest.fixture(scope="module")
def want_seeded(ar_fp32, want):
    ids = want[0] * len(SEEDED)
    params = [p for p in SEEDED for _ in want[0]]
    return ids, [o.token_ids for o in ar_fp32.generate(ids, params)], params


@pytest.mark.heavy
def test_default_pair_ar_matches_transformers(want):
    from specdec.registry import resolve_model

    ids, tokens, _ = want
    assert tokens[0][:32] == hf_greedy(hf_model(resolve_model(PAIR["model"])), ids[0], 32)


@pytest.mark.heavy
@pytest.mark.parametrize(
    "kw",
    [
        {"method": "sd", "draft_model": PAIR["draft_model"]},
        {"method": "sd", "draft_model": PAIR["draft_model"], "num_speculative_tokens": 6},
        {"method": "ngram"},
        {"method": "ssd", "draft_model": PAIR["draft_model"]},
    ],
    ids=["sd", "sd-k6", "ngram", "ssd"],
)
def test_default_pair_greedy_and_seeded_identical_to_ar(want, want_seeded, kw):
    with LLM(PAIR["model"], dtype="float32", **kw) as llm:
        for ids, tokens, params in (want, want_seeded):
            outs = llm.generate(ids, params)
            assert [o.token_ids for o in outs] == tokens
        assert llm.metrics()["drafted_tokens"] > 0


@pytest.mark.heavy
def test_default_pair_bf16_sd_identical_to_bf16_ar():
    """In bf16 too: our kernels are batch-invariant, so verification passes compute the same
    logits as single-token decoding."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    ar = LLM(PAIR["model"], dtype="bfloat16")
    ids = ar.chat_prompt(CODE)
    want_ids = ar.generate([ids], params)[0].token_ids
    del ar
    sd = LLM(PAIR["model"], dtype="bfloat16", method="sd", draft_model=PAIR["draft_model"])
    assert sd.generate([ids], params)[0].token_ids == want_ids


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["auto", "exact"])
def test_default_pair_native_every_method_identical_to_ar(dtype):
    """The GGUF files run natively (default mode: int8 activations; exact: fp32 activations):
    every method reproduces AR's tokens, because every kernel is batch invariant."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    with LLM(PAIR["model"], dtype=dtype) as ar:
        assert ar.target.native
        ids = [ar.chat_prompt(t) for t in (CODE, PROSE)]
        want_ids = [o.token_ids for o in ar.generate(ids, params)]
    for kw in (
        {"method": "sd", "draft_model": PAIR["draft_model"]},
        {"method": "sd", "draft_model": PAIR["draft_model"], "draft_quantization": "none"},
        {"method": "ngram"},
        {"method": "ssd", "draft_model": PAIR["draft_model"]},
    ):
        with LLM(PAIR["model"], dtype=dtype, **kw) as llm:
            assert [o.token_ids for o in llm.generate(ids, params)] == want_ids, kw
