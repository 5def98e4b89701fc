"""Structured output: a grammar as a logits processor, exact under speculation.

A request's constraint is a picklable spec (it crosses into SSD's worker process):

    {"type": "json_schema", "schema": {...}}   output is JSON valid under the schema
    {"type": "json_object"}                    output is a JSON object
    {"type": "grammar", "grammar": "<lark>"}   llguidance's lark dialect: %json {schema} embeds
                                               a schema, <name> (unquoted) is a special token
                                               such as Qwen's <tool_call>
    {"type": "regex", "pattern": "..."}

The grammar engine is llguidance (chosen by scripts/bench_grammar_engines.py: it rejects
schema keywords it cannot enforce instead of ignoring them, speaks lark with special tokens,
and rolls back). ``GrammarConstraint.process`` masks the logits at every row of a verify pass:
row j is the mask after the committed output and drafts d_1..d_j, exactly the mask AR would
use after the same tokens, so p at every verified position is AR's constrained p and every
method stays exactly distributed as AR. The matcher advances through the drafts and rolls
them back before returning. A draft the grammar forbids has p = 0 and is always rejected, so
the rows after it are never used; they allow only EOS (a valid, unused distribution).

When the grammar is complete, only EOS (the model's EOS ids) and the request's stop tokens
are allowed. EOS and stop tokens are never fed to the matcher: once one is in the output (only
with ignore_eos), every later position allows EOS alone.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

CONSTRAINT_TYPES = ("json_schema", "json_object", "grammar", "regex")

# JSON whitespace: flexible (a model may pretty-print) but bounded in every gap, so that a
# model cannot run to max_tokens on whitespace alone: a few spaces, one newline, indentation
JSON_OPTIONS = {"whitespace_pattern": r"[ \t]{0,4}(\n[ \t]{0,40})?"}


def _bad(msg: str):
    raise ValueError(f"invalid constraint: {msg}")


def check_constraint(spec) -> dict:
    """The spec in its canonical form (plain JSON values; shared, do not change it); raises
    ValueError naming the problem: an unknown type, a missing field, a schema that is not
    JSON, a grammar or schema the engine rejects (a syntax error, a keyword it cannot
    enforce)."""
    return _resolve(spec)[0]


def _resolve(spec) -> tuple[dict, str]:
    """(canonical spec, llguidance grammar), checked."""
    if not isinstance(spec, dict):
        _bad(f"must be an object with a 'type', got {spec!r}")
    try:
        key = json.dumps(spec)  # key order kept: a schema's properties come out in its order
    except (TypeError, ValueError) as exc:
        _bad(f"not plain JSON: {exc}")
    return _checked(key)


@lru_cache(maxsize=256)
def _checked(key: str) -> tuple[dict, str]:
    """``_resolve`` of a spec's JSON text; cached, because every copy of a request's
    SamplingParams checks its spec again (errors are not cached: they raise)."""
    from llguidance import LLMatcher

    spec = json.loads(key)
    kind = spec.get("type")
    if kind not in CONSTRAINT_TYPES:
        _bad(f"type must be one of {', '.join(CONSTRAINT_TYPES)}, got {kind!r}")
    if kind == "json_schema":
        schema = spec.get("schema")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                _bad(f"schema is not valid JSON: {exc}")
        if not isinstance(schema, dict | bool):
            _bad(f"json_schema needs a 'schema' object, got {schema!r}")
        out = {"type": kind, "schema": schema}
    elif kind == "json_object":
        out = {"type": kind}
        schema = {"type": "object"}
    else:
        field = "grammar" if kind == "grammar" else "pattern"
        text = spec.get(field)
        if not isinstance(text, str) or not text:
            _bad(f"{kind} needs a non-empty '{field}' string")
        out = {"type": kind, field: text}
    try:
        if kind in ("json_schema", "json_object"):
            grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        elif kind == "grammar":
            grammar = LLMatcher.grammar_from_lark(out["grammar"])
        else:
            grammar = LLMatcher.grammar_from_regex(out["pattern"])
    except ValueError as exc:
        _bad(f"{kind}: {exc}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        _bad(f"{kind}: {messages[0].strip()}")
    return out, grammar


# -- the engine's view of a tokenizer: built once per (tokenizer, EOS ids), ~1-3 s at 151k ----
_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ll_lock = threading.Lock()


def engine_tokenizer(tokenizer, eos_token_ids: Sequence[int]):
    """llguidance's tokenizer for a ``specdec.tokenizer.Tokenizer``, whose stop token is the
    model's EOS ids. Cached on the tokenizer (thread-safe: server requests are built in
    threads)."""
    import llguidance
    import llguidance.hf

    eos = tuple(sorted(set(int(t) for t in eos_token_ids)))
    with _ll_lock:
        per_eos = _ll_tokenizers.setdefault(tokenizer, {})
        if eos not in per_eos:
            hf = tokenizer.hf
            n_vocab = tokenizer.vocab_size
            try:
                per_eos[eos] = llguidance.hf.from_tokenizer(
                    hf, n_vocab=n_vocab, eos_token=list(eos) or None
                )
            except ValueError:  # a decoder llguidance does not know: spell each token out
                per_eos[eos] = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_TokenBytes(hf, n_vocab, eos)),
                    n_vocab=n_vocab,
                    eos_token=list(eos) or None,
                )
        return per_eos[eos]


class _TokenBytes:
    """A tokenizer as llguidance's generic wrapper wants it: each token's bytes (its text
    alone), the special ids, and an encoder."""

    def __init__(self, hf, n_vocab: int, eos: tuple[int, ...]):
        special = set(hf.all_special_ids) | set(eos)
        self.tokens = [
            b"" if i in special else hf.convert_tokens_to_string([t]).encode()
            for i, t in enumerate(hf.convert_ids_to_tokens(list(range(n_vocab))))
        ]
        self.special_token_ids = sorted(special)
        self.eos_token_id = eos[0] if eos else hf.eos_token_id
        self.bos_token_id = hf.bos_token_id
        self._hf = hf

    def __call__(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False)


@lru_cache(maxsize=64)
def _template(ll_tokenizer, grammar: str):
    """A fresh matcher for (tokenizer, grammar); requests start from a deep copy (~10 us
    against ~1-4 ms to build one)."""
    from llguidance import LLMatcher

    m = LLMatcher(ll_tokenizer, grammar, log_level=0)
    if m.is_error():
        _bad(m.get_error().strip())
    return m


def _masked(logits: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    """A copy of ``logits`` with -inf where ``allowed`` is False. On the CPU in numpy: one
    single-threaded pass (a torch op this small pays more for its thread pool than it works)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        x = logits.detach().numpy()
        return torch.from_numpy(np.where(allowed, x, np.array(-np.inf, dtype=x.dtype)))
    return logits.masked_fill(torch.from_numpy(~allowed).to(logits.device), -math.inf)


class GrammarConstraint:
    """A request's grammar: masks logits so that only tokens continuing a valid output (or
    EOS once it is complete) can be sampled. A LogitsProcessor (processors.py's contract)."""

    def __init__(
        self,
        spec: dict,
        tokenizer,
        eos_token_ids: Sequence[int],
        stop_token_ids: Sequence[int] = (),
    ):
        self.spec, grammar = _resolve(spec)
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        self.stop_ids = set(self.eos_token_ids) | set(int(t) for t in stop_token_ids)
        ll_tok = engine_tokenizer(tokenizer, self.eos_token_ids)
        self.matcher = _template(ll_tok, grammar).deep_copy()
        self.n_vocab = ll_tok.vocab_size
        self._words = (self.n_vocab + 31) // 32
        self._consumed: list[int] = []  # the committed output seen so far
        self._fed = 0  # how much of it the matcher consumed (all of it, unless ended / stuck)
        self._ended = False  # an EOS / stop token is in the output (ignore_eos)
        self._stuck = False  # the output left the grammar (cannot happen when masked)

    @classmethod
    def from_spec(
        cls,
        spec: dict,
        tokenizer,
        eos_token_ids: Sequence[int] | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> GrammarConstraint:
        """From a spec and a ``specdec.tokenizer.Tokenizer``; EOS: the tokenizer's unless the
        model's are given (LLM.eos_token_ids)."""
        eos = tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids
        return cls(spec, tokenizer, eos, stop_token_ids)

    @classmethod
    def from_params(cls, params, vocab) -> GrammarConstraint | None:
        """The constraint of a request's SamplingParams (None without one); ``vocab``: a
        processors.TokenVocabulary that carries the tokenizer."""
        if getattr(params, "constraint", None) is None:
            return None
        if vocab is None or vocab.tokenizer is None:
            raise ValueError("a grammar constraint needs the tokenizer")
        eos = vocab.eos_token_ids or vocab.tokenizer.eos_token_ids
        return cls(params.constraint, vocab.tokenizer, eos, params.stop_token_ids or ())

    # -- the contract -----------------------------------------------------------------------
    def process(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        """Row j of ``logits`` [len(drafts) + 1, V] masked for the position after output +
        drafts[:j]."""
        if logits.shape[0] != len(drafts) + 1:
            raise ValueError(f"{logits.shape[0]} logit rows for {len(drafts)} drafts")
        return _masked(logits, self._allowed(output, drafts, logits.shape[-1]))

    def process_rows(
        self, logits: torch.Tensor, output: Sequence[int], extras: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Row r of ``logits`` [R, V] masked for the position after output + extras[r] (a
        drafter's next token, for each of its branches)."""
        return _masked(logits, self._rows_allowed(output, extras, logits.shape[-1]))

    # -- masks --------------------------------------------------------------------------------
    def allowed(self, output: Sequence[int], drafts: Sequence[int], width: int) -> torch.Tensor:
        """bool [len(drafts) + 1, width]: the tokens allowed after output + drafts[:j]. The
        matcher ends where it started (drafts rolled back)."""
        return torch.from_numpy(self._allowed(output, drafts, width))

    # numpy throughout: single-threaded, no thread-pool handoff per small operation
    def _allowed(self, output, drafts, width: int) -> np.ndarray:
        self._sync(output)
        n = len(drafts) + 1
        bits = np.zeros((n, self._words), dtype=np.int32)
        accepting = np.zeros(n, dtype=bool)
        eos_only = np.zeros(n, dtype=bool)  # rows past a draft that ends or leaves the grammar
        m = self.matcher
        taken = 0
        for j in range(n):
            if j > 0:  # advance through d_j if row j - 1 allows it (and it does not stop)
                d = int(drafts[j - 1])
                ok = d < self.n_vocab and bool((int(bits[j - 1, d // 32]) >> (d % 32)) & 1)
                if d in self.stop_ids or not ok or not m.consume_token(d):
                    eos_only[j:] = True
                    break
                taken += 1
            if self._ended or self._stuck:
                eos_only[j:] = True
                break
            m.unsafe_compute_mask_ptr(bits[j].ctypes.data, self._words * 4)
            accepting[j] = m.is_accepting()
        self._rollback(taken)
        return self._unpack(bits, accepting, eos_only, width)

    def _rows_allowed(self, output, extras, width: int) -> np.ndarray:
        self._sync(output)
        n = len(extras)
        bits = np.zeros((n, self._words), dtype=np.int32)
        accepting = np.zeros(n, dtype=bool)
        eos_only = np.zeros(n, dtype=bool)
        m = self.matcher
        for r, extra in enumerate(extras):
            taken, ok = 0, not (self._ended or self._stuck)
            for d in extra if ok else ():
                d = int(d)
                ok = d not in self.stop_ids and d < self.n_vocab and m.validate_tokens([d]) == 1
                if not ok or not m.consume_token(d):
                    ok = False
                    break
                taken += 1
            if ok:
                m.unsafe_compute_mask_ptr(bits[r].ctypes.data, self._words * 4)
                accepting[r] = m.is_accepting()
            else:
                eos_only[r] = True
            self._rollback(taken)
        return self._unpack(bits, accepting, eos_only, width)

    def _rollback(self, taken: int) -> None:
        if taken and not self.matcher.rollback(taken):
            raise RuntimeError(f"grammar matcher could not roll back {taken} tokens")

    def _sync(self, output: Sequence[int]) -> None:
        """Advance the matcher through the output committed since the last call (first going
        back to where the history was rewritten, as SSD's worker does)."""
        output = list(output)
        if output[: len(self._consumed)] != self._consumed:
            common = 0
            for a, b in zip(output, self._consumed):
                if a != b:
                    break
                common += 1
            self._rewind(common)
        for t in output[len(self._consumed) :]:
            self._consumed.append(t)
            if self._ended or self._stuck:
                continue
            if t in self.stop_ids:
                self._ended = True
            elif self.matcher.consume_token(t):
                self._fed += 1
            else:
                self._stuck = True

    def _rewind(self, length: int) -> None:
        """Forget the output from index ``length`` on. The matcher consumed _consumed[:_fed];
        the token at _fed, if any, ended the output or left the grammar (and then put the
        matcher in an error state, which does not roll back: start over)."""
        if length > self._fed:
            del self._consumed[length:]
            return
        if self._stuck or not self.matcher.rollback(self._fed - length):
            self.matcher.reset()
            length = 0
        self._fed = length
        self._ended = self._stuck = False
        del self._consumed[length:]

    def _unpack(self, bits, accepting, eos_only, width: int) -> np.ndarray:
        """bool [rows, width] from the engine's bitmasks: stop tokens join a complete grammar's
        EOS; an empty row (a dead end, or past an ending draft) allows EOS alone."""
        cols = min(width, self.n_vocab)
        flat = np.unpackbits(bits.view(np.uint8), axis=1, count=cols, bitorder="little")
        out = flat.view(bool)
        if width > cols:  # model rows beyond the tokenizer: padding, never allowed
            out = np.concatenate([out, np.zeros((out.shape[0], width - cols), bool)], axis=1)
        stops = [t for t in self.stop_ids if t < width]
        if stops and accepting.any():
            out[np.ix_(accepting.nonzero()[0], stops)] = True
        eos = [t for t in self.eos_token_ids if t < width]
        empty = eos_only | ~out.any(1)
        if eos and empty.any():
            rows = empty.nonzero()[0]
            out[rows] = False
            out[np.ix_(rows, eos)] = True
        return out
