"""What a grammar constraint costs, per decoding method: decode tokens/s of one request (greedy,
ignore_eos: always --tokens tokens) free, under a constraint that allows any text (the same
tokens, so the difference is the constraint's own work: masks, rollbacks, the drafter's
masked q) and under a JSON schema (other tokens: a different text, so acceptance changes too);
alternated and repeated, best of the repeats (this machine's load varies); and the share of
the decode time spent inside the constraint (in this process: SSD's worker masks its own q in
parallel), which the load distorts less. Also the constraint's own time per verify pass at
each model's vocabulary.

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
PROMPT = "Write a long story about a lighthouse keeper, then describe its hero as JSON."
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


class Stopwatch:
    """Time spent in GrammarConstraint's calls (wraps the class's methods)."""

    def __init__(self):
        self.seconds = 0.0
        for name in ("process", "process_rows"):
            setattr(GrammarConstraint, name, self._timed(getattr(GrammarConstraint, name)))

    def _timed(self, fn):
        def run(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - t

        return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--methods", nargs="*", default=["ar", "sd", "ngram", "ssd"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mask-models", nargs="*", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    args = ap.parse_args()
    path = resolve_model(args.model)
    spec = {"type": "json_schema", "schema": SCHEMA}
    anything = {"type": "regex", "pattern": "(.|\\n)*"}
    watch = Stopwatch()
    head = (
        f"{'method':<8}{'free tok/s':>12}{'any text':>10}{'same':>6}{'json':>8}"
        f"{'share any':>11}{'share json':>12}"
    )
    print(head)
    print("-" * len(head))
    for method in args.methods:
        kw = {"num_speculative_tokens": 3}
        if method in ("sd", "ssd"):
            kw["draft_model"] = path
        with LLM(path, method=method, **kw) as llm:
            prompt = llm.chat_prompt(PROMPT)
            best, tokens, share = {}, {}, {}
            for _ in range(args.repeats):
                for name, c in (("free", None), ("any", anything), ("json", spec)):
                    p = SamplingParams(
                        temperature=0, max_tokens=args.tokens, ignore_eos=True, constraint=c
                    )
                    watch.seconds = 0.0
                    out = llm.generate([prompt], p)[0]
                    tps = out.metrics["decode_tokens_per_s"]
                    decode_s = len(out.token_ids) / tps
                    best[name] = max(best.get(name, 0.0), tps)
                    share.setdefault(name, []).append(watch.seconds / decode_s)
                    tokens[name] = out.token_ids
            same = "yes" if tokens["any"] == tokens["free"] else "no"
            any_share, json_share = (
                100 * sorted(share[k])[len(share[k]) // 2] for k in ("any", "json")
            )
            print(
                f"{method:<8}{best['free']:>12.2f}{best['any']:>10.2f}{same:>6}{best['json']:>8.2f}"
                f"{any_share:>10.1f}%{json_share:>11.1f}%"
            )
    for name in args.mask_models:
        tok = Tokenizer(resolve_model(name))
        GrammarConstraint.from_spec({"type": "json_object"}, tok)  # the tokenizer, prepared once
        for k in (0, 3):
            ms = mask_cost_ms(tok, k)
            print(f"{name} ({tok.vocab_size} tokens): constraint per pass of K={k}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
