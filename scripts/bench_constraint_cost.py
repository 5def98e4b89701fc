"""What a grammar constraint costs, per decoding method: decode tokens/s of the same request
with and without a JSON-schema constraint (greedy, ignore_eos so both make the same number of
tokens), alternated and repeated, best of the repeats (this machine's load varies). Also the
constraint's own time per position (one mask, masked logits) at the model's vocabulary.

    python scripts/bench_constraint_cost.py [--model smollm2-135m] [--methods ar sd ngram ssd]

sd and ssd draft with the model itself (the point is the constraint's cost, not the draft's).
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec import LLM, SamplingParams
from specdec.constraints import GrammarConstraint
from specdec.registry import resolve_model
from specdec.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "bio": {"type": "string"},
    },
    "required": ["name", "age", "role", "tags", "bio"],
    "additionalProperties": False,
}
PROMPT = "Describe a user of a web shop as JSON with a long bio."
DOCUMENT = (
    '{"name": "Ada Lovelace", "age": 36, "role": "admin", "tags": ["math", "poetry"], '
    '"bio": "Wrote the first program for the Analytical Engine, and saw that it could do '
    'more than arithmetic."}'
)


def mask_cost_ms(tokenizer, drafts: int) -> float:
    """Mean ms of the constraint over the positions of DOCUMENT: process() over a position
    and ``drafts`` drafts after it (a verify pass of K = drafts), as the engine calls it."""
    spec = {"type": "json_schema", "schema": SCHEMA}
    c = GrammarConstraint.from_spec(spec, tokenizer)
    ids = tokenizer.hf.encode(DOCUMENT, add_special_tokens=False)
    logits = torch.randn(drafts + 1, tokenizer.vocab_size)
    c.process(logits, [], ids[:drafts])  # warm
    t = time.perf_counter()
    n = len(ids) - drafts
    for i in range(n):
        c.process(logits, ids[:i], ids[i : i + drafts])
    return 1e3 * (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--methods", nargs="*", default=["ar", "sd", "ngram", "ssd"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mask-models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    args = ap.parse_args()
    path = resolve_model(args.model)
    spec = {"type": "json_schema", "schema": SCHEMA}
    print(f"{'method':<8}{'free tok/s':>12}{'constrained':>13}{'cost':>8}")
    for method in args.methods:
        kw = {"num_speculative_tokens": 3}
        if method in ("sd", "ssd"):
            kw["draft_model"] = path
        with LLM(path, method=method, **kw) as llm:
            prompt = llm.chat_prompt(PROMPT)
            best = {False: 0.0, True: 0.0}
            for _ in range(args.repeats):
                for constrained in (False, True):
                    p = SamplingParams(
                        temperature=0,
                        max_tokens=args.tokens,
                        ignore_eos=True,
                        constraint=spec if constrained else None,
                    )
                    out = llm.generate([prompt], p)[0]
                    best[constrained] = max(best[constrained], out.metrics["decode_tokens_per_s"])
            free, con = best[False], best[True]
            print(f"{method:<8}{free:>12.2f}{con:>13.2f}{100 * (1 - con / free):>7.1f}%")
    for name in args.mask_models:
        tok = Tokenizer(resolve_model(name))
        GrammarConstraint.from_spec({"type": "json_object"}, tok)  # the tokenizer, prepared once
        for k in (0, 3):
            ms = mask_cost_ms(tok, k)
            print(f"{name} ({tok.vocab_size} tokens): constraint per pass of K={k}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
