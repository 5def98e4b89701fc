"""Scores with the real SmolLM2-135M (``real``): LLM.score against transformers' logprobs,
and lm-evaluation-harness against a real specdec server on a small task shipped as local files
(tests/data/lm_eval: a loglikelihood task and a generate_until task): the loglikelihoods it
logs equal LLM.score's, and its generations equal our greedy ones, as ``local-completions``
and as ``local-chat-completions``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from server_utils import ServerThread

from specdec import LLM, SamplingParams
from specdec.server.app import create_app

TEXTS = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "日本の首都は東京です。",
]
TASKS = Path(__file__).parent / "data" / "lm_eval"
MODEL = "smollm2-135m"
TOL = 1e-4


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return LLM(smollm2_path, dtype="float32")


@pytest.mark.real
def test_smollm2_scores_equal_transformers_logprobs(smollm2, smollm2_path):
    import transformers

    from specdec.gguf_model import transformers_source

    where, kw = transformers_source(smollm2_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw)
    outs = smollm2.score(TEXTS, top_logprobs=5)
    for text, out in zip(TEXTS, outs):
        ids = out.token_ids
        assert ids == smollm2.tokenizer.encode(text)
        with torch.no_grad():
            logits = model.eval()(torch.tensor([ids])).logits[0, :-1].double()
        ref = torch.log_softmax(logits, dim=-1)
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        got = torch.tensor(out.logprobs[1:], dtype=torch.float64)
        assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()
        for j, top in enumerate(out.top_logprobs[1:]):
            vals, idx = ref[j].topk(5)
            assert [t for t, _ in top][:2] == idx.tolist()[:2]  # near-ties may swap further down
            assert [v for _, v in top] == pytest.approx(vals.tolist(), abs=TOL)
    # a token may be part of a character: its bytes, not its text, join into the text
    jp = outs[2]
    assert b"".join(smollm2.tokenizer.token_bytes(t) for t in jp.token_ids) == TEXTS[2].encode()
    assert "\ufffd" in "".join(jp.tokens)


# -- lm-evaluation-harness -------------------------------------------------------------------
def lm_eval(model: str, url: str, tasks: str, out: Path, *extra: str, **args: str) -> dict:
    """Run the harness's command line on the shipped tasks (from their folder: the YAML names
    its data by a relative path) and return {task: [logged samples]}."""
    model_args = ",".join(f"{k}={v}" for k, v in {"model": MODEL, "base_url": url, **args}.items())
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="0")
    env["HF_DATASETS_CACHE"] = str(out / "datasets")
    cmd = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args]
    cmd += ["--tasks", tasks, "--include_path", str(TASKS), "--output_path", str(out)]
    cmd += ["--log_samples", *extra]
    run = subprocess.run(cmd, cwd=TASKS, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    samples = {}
    for f in out.rglob("samples_*.jsonl"):
        task = f.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in f.read_text().splitlines()]
    return samples


def gen_params(gen_args: dict) -> SamplingParams:
    return SamplingParams(
        temperature=0, max_tokens=gen_args["max_gen_toks"], stop=gen_args["until"]
    )


@pytest.mark.real
def test_lm_eval_harness_against_specdec_serve(smollm2, smollm2_path, tmp_path):
    llm = smollm2
    with ServerThread(create_app(llm, MODEL, max_num_seqs=8)) as srv:
        completions = lm_eval(
            "local-completions",
            f"{srv.url}/v1/completions",
            "specdec_capitals_ll,specdec_capitals_gen",
            tmp_path / "completions",
            "--batch_size",
            "8",  # several prompts in one request: scored together
            tokenizer_backend="huggingface",
            tokenizer=str(smollm2_path),
        )
        chat = lm_eval(
            "local-chat-completions",
            f"{srv.url}/v1/chat/completions",
            "specdec_capitals_gen",
            tmp_path / "chat",
            "--apply_chat_template",
        )
    # loglikelihood: every choice's logged log-likelihood and is_greedy are LLM.score's
    pairs, logged = [], []
    for sample in completions["specdec_capitals_ll"]:
        for k, arg in enumerate(sample["arguments"].values()):
            pairs.append((arg["arg_0"], arg["arg_1"]))
            ll, greedy = sample["resps"][k][0]
            logged.append((float(ll), greedy == "True"))
    assert len(pairs) == 24
    scores = llm.score([c for c, _ in pairs], [x for _, x in pairs])
    for (ll, greedy), score in zip(logged, scores):
        assert ll == pytest.approx(score.total, abs=TOL * len(score.token_ids))
        assert greedy == score.is_greedy
    assert len({round(ll, 3) for ll, _ in logged}) > 12  # distinct texts, distinct scores
    # generate_until: lm-eval's generations are our greedy ones, through either route
    for sample in completions["specdec_capitals_gen"]:
        ((context, gen_args),) = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        want = llm.generate([context], gen_params(gen_args))[0].text
        assert sample["resps"][0][0] == want
    texts = []
    for sample in chat["specdec_capitals_gen"]:
        ((messages, gen_args),) = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        ids = llm.chat_prompt(json.loads(messages[0]))
        want = llm.generate([ids], gen_params(gen_args))[0].text
        assert sample["resps"][0][0] == want
        texts.append(want)
    assert all(texts)  # the model answered something in every case
