"""Measure the grammar engines we could build structured output on, on this CPU.

For each engine (llguidance, xgrammar, outlines-core) and each real tokenizer, it reports the
one-off cost of preparing the tokenizer, the cost of compiling a realistic JSON schema, and the
per-token cost of a mask along a valid document (compute the mask for the next token, then
consume the token), and checks what speculation and tool calls need: rollback of consumed
tokens and a context-free (lark / EBNF) grammar. Engines that are not installed are skipped:
only the chosen one stays a dependency (``pip install xgrammar outlines-core`` to compare).

    python scripts/bench_grammar_engines.py [--models qwen2.5-coder-0.5b smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "score", "active", "role", "tags"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace, Countess of Lovelace",
    "age": 36,
    "score": 98.25,
    "active": True,
    "role": "admin",
    "tags": ["mathematics", "analytical engine", "poetry of science"],
}
LARK = 'start: "<call>" NAME "(" NUMBER ("," NUMBER)* ")</call>"\n'
LARK += "NAME: /[a-z_]+/\nNUMBER: /[0-9]+/\n"
LARK_TEXT = "<call>add(12,30)</call>"
# a keyword the engines do not implement: an engine that ignores it would let invalid output
# through, so "strict" means compiling it raises
UNSUPPORTED = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "not": {"required": ["a"]},
}


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


class LLGuidance:
    name = "llguidance"

    def __init__(self, hf, eos: list[int]):
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=eos)
        self.vocab = len(hf)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        error = self.ll.LLMatcher.validate_grammar(grammar, self.tok)
        if error:
            raise ValueError(error)
        return self._matcher(grammar)

    def compile_lark(self, lark):
        return self._matcher(self.ll.LLMatcher.grammar_from_lark(lark))

    def _matcher(self, grammar):
        m = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def new_mask(self):
        return torch.zeros(1, (self.vocab + 31) // 32, dtype=torch.int32)

    def fill(self, m, mask):
        m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def consume(self, m, tok) -> bool:
        return m.consume_token(tok)

    def rollback(self, m, n) -> bool:
        return m.rollback(n)

    def accepting(self, m) -> bool:
        return m.is_accepting()


class XGrammar:
    name = "xgrammar"

    def __init__(self, hf, eos: list[int]):
        import xgrammar

        self.xg = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=eos)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.vocab = len(hf)

    def compile(self, schema):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return self.xg.GrammarMatcher(compiled)

    def compile_lark(self, lark):
        grammar = self.xg.Grammar.from_lark(lark)
        return self.xg.GrammarMatcher(self.compiler.compile_grammar(grammar))

    def new_mask(self):
        return self.xg.allocate_token_bitmask(1, self.vocab)

    def fill(self, m, mask):
        m.fill_next_token_bitmask(mask)

    def consume(self, m, tok) -> bool:
        return m.accept_token(tok)

    def rollback(self, m, n) -> bool:
        m.rollback(n)
        return True

    def accepting(self, m) -> bool:
        return m.is_completed()


class OutlinesCore:
    """Regular expressions only: the schema becomes a regex and its token-level automaton."""

    name = "outlines-core"

    def __init__(self, hf, eos: list[int]):
        import outlines_core

        self.oc = outlines_core
        byte_of = {v: k for k, v in _bytes_to_unicode().items()}
        special = set(hf.all_special_ids)
        vocab = outlines_core.Vocabulary(eos[0], {})
        for piece, i in hf.get_vocab().items():
            if i in special:
                continue
            vocab.insert(bytes(byte_of[c] for c in piece), i)
        self.vocabulary = vocab
        self.vocab = len(hf)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary), max_rollback=64)

    def compile_lark(self, lark):
        raise NotImplementedError("regular expressions only (no context-free grammars)")

    def new_mask(self):
        return torch.zeros(1, (self.vocab + 31) // 32, dtype=torch.int32)

    def fill(self, m, mask):
        m.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())

    def consume(self, m, tok) -> bool:
        m.advance(tok)
        return True

    def rollback(self, m, n) -> bool:
        m.rollback_state(n)
        return True

    def accepting(self, m) -> bool:
        return m.is_finished()


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest are shifted
    past 255 (how GPT-2-style tokenizers spell raw bytes as characters)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def bench(engine_cls, hf, eos, text: str) -> dict:
    row = {"engine": engine_cls.name}
    engine, row["tokenizer_s"] = _timed(lambda: engine_cls(hf, eos))
    m, row["compile_s"] = _timed(lambda: engine.compile(SCHEMA))
    tokens = hf.encode(text, add_special_tokens=False)
    mask = engine.new_mask()
    times = []
    for tok in tokens:
        t = time.perf_counter()
        engine.fill(m, mask)
        times.append(time.perf_counter() - t)
        allowed = bool((mask[0, tok // 32] >> (tok % 32)) & 1)
        if not allowed or not engine.consume(m, tok):
            raise RuntimeError(f"{engine.name} rejected token {tok} ({hf.decode([tok])!r})")
    row["accepting"] = engine.accepting(m)
    row["tokens"] = len(tokens)
    row["mask_ms_mean"] = 1e3 * statistics.fmean(times)
    row["mask_ms_p50"] = 1e3 * statistics.median(times)
    row["mask_ms_max"] = 1e3 * max(times)
    # rollback: back to the start, then the first mask must equal a fresh matcher's
    try:
        ok = engine.rollback(m, len(tokens))
        fresh = engine.new_mask()
        engine.fill(engine.compile(SCHEMA), fresh)
        again = engine.new_mask()
        engine.fill(m, again)
        row["rollback"] = bool(ok) and torch.equal(fresh, again)
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable rollback"
        row["rollback"] = f"no ({type(exc).__name__}: {exc})"[:60]
    try:
        lm = engine.compile_lark(LARK)
        ok = all(engine.consume(lm, t) for t in hf.encode(LARK_TEXT, add_special_tokens=False))
        row["lark"] = ok and engine.accepting(lm)
    except Exception as exc:  # noqa: BLE001
        row["lark"] = f"no ({exc})"[:60]
    try:
        engine.compile(UNSUPPORTED)
        row["strict"] = False
    except Exception:  # noqa: BLE001
        row["strict"] = True
    return row


def main() -> None:
    from specdec.registry import resolve_model
    from specdec.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    text = json.dumps(DOCUMENT)
    engines = []
    candidates = (
        (LLGuidance, "llguidance"),
        (XGrammar, "xgrammar"),
        (OutlinesCore, "outlines_core"),
    )
    for cls, module in candidates:
        try:
            __import__(module)
            engines.append(cls)
        except ImportError:
            print(f"({cls.name} is not installed: skipped)")
    rows = []
    head = (
        f"{'model':<20}{'engine':<15}{'vocab':>8}{'tok prep s':>11}{'compile s':>10}"
        f"{'mask ms mean':>13}{'p50':>7}{'max':>8}  rollback  strict  lark"
    )
    print(head)
    print("-" * len(head))
    for model in args.models:
        tok = Tokenizer(resolve_model(model))
        for cls in engines:
            try:
                r = bench(cls, tok.hf, tok.eos_token_ids, text)
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                print(f"{model:<20}{cls.name:<15} failed: {exc}")
                continue
            r["model"], r["vocab"] = model, len(tok.hf)
            rows.append(r)
            print(
                f"{model:<20}{r['engine']:<15}{r['vocab']:>8}{r['tokenizer_s']:>11.2f}"
                f"{r['compile_s']:>10.3f}{r['mask_ms_mean']:>13.3f}{r['mask_ms_p50']:>7.3f}"
                f"{r['mask_ms_max']:>8.3f}  {str(r['rollback']):<8}  {str(r['strict']):<6}"
                f"  {r['lark']}"
            )
    print(f"(document: {len(text)} characters of JSON; masks on one thread)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
