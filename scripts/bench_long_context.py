"""Prefill and decode speed after a long prompt: our engine against llama.cpp on the same file.

The bench's prompts are ~90 tokens; here the prompt is CONTEXT tokens of the bench prompts'
text repeated, then 64 tokens are generated greedily. Prints prefill tokens/s (the prompt over
the time to the first token) and decode tokens/s for each method, one process per call:

    python scripts/bench_long_context.py ar 2000
    python scripts/bench_long_context.py llamacpp 2000   # needs ./scripts/setup.sh --peers
    python scripts/bench_long_context.py sd 2000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

NEW_TOKENS = 64


def prompt_text() -> str:
    prompts = json.loads((Path(__file__).parents[1] / "specdec/bench/prompts.json").read_text())
    return " ".join(p["prompt"] for p in prompts) * 40


def run_llamacpp(context: int, threads: int) -> tuple[float, float]:
    from llama_cpp import Llama

    from specdec.registry import DEFAULT_TARGET, gguf_path

    llm = Llama(
        str(gguf_path(DEFAULT_TARGET)), n_ctx=context + 128, n_threads=threads, verbose=False
    )
    ids = llm.tokenize(prompt_text().encode())[:context]
    t0 = time.perf_counter()
    t1 = None
    for n, _ in enumerate(llm.generate(ids, temp=0.0, top_k=1), 1):
        if n == 1:
            t1 = time.perf_counter()  # the prompt evaluated, the first token sampled
        if n == NEW_TOKENS + 1:
            break
    t2 = time.perf_counter()
    llm.close()  # now, not at interpreter exit (where its destructor fails noisily)
    return context / (t1 - t0), NEW_TOKENS / (t2 - t1)


def run_ours(method: str, context: int, threads: int) -> tuple[float, float]:
    from specdec import LLM, SamplingParams
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    draft = None if method == "ar" else DEFAULT_DRAFT
    with LLM(
        DEFAULT_TARGET, draft, method, num_threads=threads, max_model_len=context + 128
    ) as llm:
        ids = llm.tokenizer.encode(prompt_text())[:context]
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        m = llm.generate([ids], params)[0].metrics
    return context / m["time_to_first_token_s"], m["decode_tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("method", choices=["ar", "sd", "llamacpp"])
    ap.add_argument("context", type=int, help="prompt tokens")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.method == "llamacpp":
        prefill, decode = run_llamacpp(args.context, args.threads)
    else:
        prefill, decode = run_ours(args.method, args.context, args.threads)
    print(
        f"{args.method}: {args.context}-token prompt, prefill {prefill:.0f} tokens/s, "
        f"decode {decode:.1f} tokens/s ({args.threads} threads)"
    )


if __name__ == "__main__":
    main()
