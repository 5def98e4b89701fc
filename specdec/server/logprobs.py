"""A request's logprobs in OpenAI's shapes: the legacy one of completions (with the echoed
prompt's) and chat's ``logprobs.content``. The values are the engine's entries
(``specdec.logprobs``); JSON has no -inf, so a token outside a top-k/top-p set reads FLOOR."""

from __future__ import annotations

from specdec.logprobs import TokenLogprob
from specdec.sequence import Sequence
from specdec.server.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from specdec.tokenizer import Tokenizer

FLOOR = -9999.0  # stands for -inf (a token the sampler could not draw)


def _finite(lp: float) -> float:
    return max(lp, FLOOR)


class CompletionReport:
    """Completions: per choice, the echoed prompt (its text and, with logprobs, its tokens'
    entries) and the generated tokens' entries. ``text_offset`` counts characters of the
    choice's text, each token advancing it by the length of its own text."""

    def __init__(self, tokenizer: Tokenizer, seqs: list[Sequence], echo_texts: list[str] | None):
        self.tok = tokenizer
        self.seqs = seqs
        self.echo_texts = echo_texts  # None: no echo
        # where the next streamed generated token starts, per choice
        self._offset = [len(self.echo_text(i)) for i in range(len(seqs))]

    def echo_text(self, index: int) -> str:
        return "" if self.echo_texts is None else self.echo_texts[index]

    def wanted(self, index: int) -> bool:
        return self.seqs[index].params.logprobs is not None

    def prompt(self, index: int) -> CompletionLogprobs | None:
        """The echoed prompt's entries (None without echo or logprobs)."""
        seq = self.seqs[index]
        if self.echo_texts is None or not self.wanted(index):
            return None
        entries = seq.prompt_logprobs or [None] * len(seq.prompt_ids)
        return self._shape(seq.prompt_ids, entries, 0, seq.params.logprobs)

    def generated(self, index: int, entries: list[TokenLogprob]) -> CompletionLogprobs | None:
        """Entries of tokens generated since the last call (a stream's next piece)."""
        if not self.wanted(index):
            return None
        out = self._shape(
            [e.token_id for e in entries], entries, self._offset[index], self._n(index)
        )
        if out.tokens:
            self._offset[index] = out.text_offset[-1] + len(out.tokens[-1])
        return out

    def whole(self, index: int) -> CompletionLogprobs | None:
        """The echoed prompt's entries then all generated ones (a non-streamed answer)."""
        if not self.wanted(index):
            return None
        seq = self.seqs[index]
        entries = seq.logprobs or []
        start = len(self.echo_text(index))
        gen = self._shape([e.token_id for e in entries], entries, start, self._n(index))
        head = self.prompt(index)
        if head is None:
            return gen
        return CompletionLogprobs(
            tokens=head.tokens + gen.tokens,
            token_logprobs=head.token_logprobs + gen.token_logprobs,
            top_logprobs=head.top_logprobs + gen.top_logprobs,
            text_offset=head.text_offset + gen.text_offset,
        )

    def _n(self, index: int) -> int:
        return self.seqs[index].params.logprobs

    def _shape(
        self, ids: list[int], entries: list[TokenLogprob | None], offset: int, n: int
    ) -> CompletionLogprobs:
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token, e in zip(ids, entries):
            text = self.tok.token_text(token)
            out.tokens.append(text)
            out.text_offset.append(offset)
            offset += len(text)
            if e is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_finite(e.logprob))
            top: dict[str, float] = {}
            for t, lp in e.top[:n]:  # the most likely first: a text shared by two keeps its best
                top.setdefault(self.tok.token_text(t), _finite(lp))
            top.setdefault(text, _finite(e.logprob))  # the chosen token is always there
            out.top_logprobs.append(top)
        return out


class ChatReport:
    """Chat: per choice, the generated tokens' entries as ``logprobs.content``."""

    def __init__(self, tokenizer: Tokenizer, seqs: list[Sequence]):
        self.tok = tokenizer
        self.seqs = seqs

    def echo_text(self, index: int) -> str:
        return ""

    def prompt(self, index: int) -> None:
        return None

    def generated(self, index: int, entries: list[TokenLogprob]) -> ChatLogprobs | None:
        params = self.seqs[index].params
        if params.logprobs is None:
            return None
        return ChatLogprobs(content=[self._entry(e, params.logprobs) for e in entries])

    def whole(self, index: int) -> ChatLogprobs | None:
        return self.generated(index, self.seqs[index].logprobs or [])

    def _top(self, token: int, lp: float) -> TopLogprob:
        return TopLogprob(
            token=self.tok.token_text(token),
            logprob=_finite(lp),
            bytes=list(self.tok.token_bytes(token)),
        )

    def _entry(self, e: TokenLogprob, n: int) -> ChatTokenLogprob:
        top = [self._top(t, lp) for t, lp in e.top[:n]]
        return ChatTokenLogprob(**self._top(e.token_id, e.logprob).model_dump(), top_logprobs=top)
