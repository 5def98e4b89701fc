"""Tool calls out of a model's text, as it streams.

Models trained for tools write a call as tagged JSON, e.g. Qwen2.5's (the Hermes format)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``ToolCallParser`` reads the text piece by piece and says, as soon as it can, what is content
and what is a call: a call's start (its id and name) once the JSON has named the function,
then the arguments as they arrive. OpenAI streams calls the same way (``delta.tool_calls``:
index, id and name first, then argument fragments), and the non-streamed answer is the same
parser run over the whole text, so the streamed deltas always reassemble to it.

A call's ``arguments`` string is the model's own JSON text of the arguments object. Text
that merely looks like a call (a tag followed by something else) stays content. Some models
(Qwen2.5-Coder's small ones) answer with the call's JSON alone, without the tags: given the
offered functions' names, an answer that opens with such a call is read as one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

_WS = " \t\r\n"


@dataclass(frozen=True)
class ToolCallFormat:
    """How a model family writes a call: the tags around it and the JSON keys inside."""

    open: str = "<tool_call>"
    close: str = "</tool_call>"
    name_key: str = "name"
    args_key: str = "arguments"


HERMES = ToolCallFormat()  # Qwen2.5, Hermes, and our own prompt for templates without tools
FORMATS = (HERMES,)


def format_for_template(template: str | None) -> ToolCallFormat:
    """The format a chat template teaches its model (Hermes when it names none we know)."""
    for fmt in FORMATS:
        if template and fmt.open in template:
            return fmt
    return HERMES


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# -- what the parser emits ---------------------------------------------------------------------
@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


Piece = Content | CallStart | CallArgs


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


def _scan_header(body: str, fmt: ToolCallFormat) -> tuple[str, str | None, int]:
    """Match ``{"<name_key>": "<name>", "<args_key>":`` at the start of ``body``.
    Returns ("ok", name, end), ("more", None, 0) when ``body`` may still become one, or
    ("bad", None, 0) when it cannot."""
    pos = 0
    name: str | None = None

    def skip_ws() -> None:
        nonlocal pos
        while pos < len(body) and body[pos] in _WS:
            pos += 1

    def literal(lit: str) -> str:
        nonlocal pos
        got = body[pos : pos + len(lit)]
        if got == lit:
            pos += len(lit)
            return "ok"
        return "more" if lit.startswith(got) and pos + len(got) == len(body) else "bad"

    steps: list[str | None] = [
        "{",
        json.dumps(fmt.name_key),
        ":",
        None,
        ",",
        json.dumps(fmt.args_key),
        ":",
    ]
    for step in steps:
        skip_ws()
        if pos == len(body):
            return "more", None, 0
        if step is not None:
            got = literal(step)
            if got != "ok":
                return got, None, 0
            continue
        # the function's name: a JSON string
        if body[pos] != '"':
            return "bad", None, 0
        end, escaped = pos + 1, False
        while end < len(body):
            ch = body[end]
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                break
            elif ch == "\n":
                return "bad", None, 0
            end += 1
        if end == len(body):
            return "more", None, 0
        try:
            name = json.loads(body[pos : end + 1])
        except ValueError:
            return "bad", None, 0
        pos = end + 1
    return "ok", name, pos


@dataclass
class _ArgsScanner:
    """Finds where one JSON value ends in a stream of characters (structure only: an object
    or array by its brackets, a string by its quotes, a number or literal by a delimiter)."""

    kind: str = ""  # "", "container", "string", "scalar"
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    done: bool = False

    def step(self, ch: str) -> bool:
        """Consume ``ch``; False when ``ch`` is not part of the value (it ended before)."""
        if not self.kind:
            if ch in "{[":
                self.kind, self.depth = "container", 1
            elif ch == '"':
                self.kind, self.in_string = "string", True
            else:
                self.kind = "scalar"
            return True
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                self.done = self.kind == "string"
            return True
        if self.kind == "scalar":
            if ch in ",}]" or ch in _WS:
                self.done = True
                return False
            return True
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return True


@dataclass
class ToolCallParser:
    """One choice's text, turned into content and tool calls as it arrives (see module)."""

    fmt: ToolCallFormat = HERMES
    new_id: Callable[[], str] = new_call_id
    # the offered functions: a call of one of them written without the tags, as the whole
    # answer (Qwen2.5-Coder's small models answer so), is read as a call too
    names: frozenset[str] = frozenset()
    calls: int = 0  # calls started so far
    _state: str = ""  # start, text, header, args, trailer, whole, bare_end
    _bare: bool = False  # the call being read has no tags
    _buf: str = ""  # text not yet decided
    _held_ws: str = ""  # whitespace withheld in text: dropped if a call follows
    _tag_ws: str = ""  # the whitespace dropped before the open tag (back if no call)
    _skip_ws: bool = False  # right after a call: its trailing whitespace is not content
    _after_ws: str = ""  # that whitespace: it separates the content around the call
    _had_content: bool = False
    _scan: _ArgsScanner = field(default_factory=_ArgsScanner)

    def __post_init__(self):
        self._state = self._state or ("start" if self.names else "text")

    def feed(self, text: str) -> list[Piece]:
        """The pieces that ``text`` (the next part of the output) decides."""
        self._buf += text
        out: list[Piece] = []
        self._run(out, final=False)
        return _merge(out)

    def finish(self) -> list[Piece]:
        """What is left once the output is complete."""
        out: list[Piece] = []
        self._run(out, final=True)
        if self._state == "text":
            if self._held_ws + self._buf:
                out.append(Content(self._held_ws + self._buf))
        elif self._state in ("header", "whole"):  # an unfinished tag: it was text after all
            out.append(Content(self._tag_ws + self.fmt.open + self._buf))
        self._buf, self._held_ws, self._state = "", "", "text"
        return _merge(out)

    def _run(self, out: list[Piece], final: bool) -> None:
        while True:
            before = (self._state, len(self._buf))
            getattr(self, f"_{self._state}")(out, final)
            if (self._state, len(self._buf)) == before:
                return

    # -- states ------------------------------------------------------------------------------
    def _start(self, out: list[Piece], final: bool) -> None:
        """The answer's beginning (or the end of an untagged call): another untagged call?"""
        stripped = self._buf.lstrip(_WS)
        if not stripped and not final:
            return
        if stripped.startswith("{"):
            status, name, end = _scan_header(stripped, self.fmt)
            if status == "more" and not final:
                return
            if status == "ok" and name in self.names:
                out.append(CallStart(self.calls, self.new_id(), name))
                self.calls += 1
                self._buf, self._skip_ws = stripped[end:], False
                self._scan, self._bare, self._state = _ArgsScanner(), True, "args"
                return
        self._state = "text"

    def _bare_end(self, out: list[Piece], final: bool) -> None:
        """After an untagged call's arguments: its closing brace."""
        stripped = self._buf.lstrip(_WS)
        if not stripped and not final:
            self._buf = ""
            return
        self._buf = stripped[1:] if stripped.startswith("}") else stripped
        self._bare = False
        self._state, self._skip_ws, self._after_ws = "start", True, ""

    def _text(self, out: list[Piece], final: bool) -> None:
        if self._skip_ws:
            stripped = self._buf.lstrip(_WS)
            self._after_ws += self._buf[: len(self._buf) - len(stripped)]
            if not stripped:
                self._buf = ""
                return
            # content resumes: one separator between it and the content before the call
            sep = self._tag_ws or self._after_ws
            self._buf, self._skip_ws, self._after_ws = stripped, False, ""
            self._held_ws = sep if self._had_content else ""
        at = self._buf.find(self.fmt.open)
        if at >= 0:
            before = self._buf[:at]
            body = before.rstrip(_WS)
            if body:
                out.append(Content(self._held_ws + body))
                self._held_ws, self._had_content = "", True
            self._tag_ws = self._held_ws + before[len(body) :]
            self._held_ws = ""
            self._buf = self._buf[at + len(self.fmt.open) :]
            self._state = "header"
            return
        if final:
            return  # finish() hands the rest over as content
        keep = _partial_suffix(self._buf, self.fmt.open)
        ready, rest = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        body = ready.rstrip(_WS)
        if body:
            out.append(Content(self._held_ws + body))
            self._held_ws, self._had_content = "", True
        self._held_ws += ready[len(body) :]
        self._buf = rest

    def _header(self, out: list[Piece], final: bool) -> None:
        status, name, end = _scan_header(self._buf, self.fmt)
        if status == "more":
            return
        if status == "bad":  # not the streamable shape: read the whole call first
            self._state = "whole"
            return
        out.append(CallStart(self.calls, self.new_id(), name))
        self.calls += 1
        self._buf = self._buf[end:]
        self._scan = _ArgsScanner()
        self._state = "args"

    def _args(self, out: list[Piece], final: bool) -> None:
        scan, buf, close = self._scan, self._buf, self.fmt.close
        start = 0 if scan.kind else len(buf) - len(buf.lstrip(_WS))
        i = start
        while i < len(buf) and not scan.done:
            ch = buf[i]
            if ch == close[0] and not scan.in_string:
                rest = buf[i : i + len(close)]
                if rest == close:
                    break  # the call ended before its arguments did
                if not final and i + len(rest) == len(buf) and close.startswith(rest):
                    break  # maybe the closing tag: wait for more
            if not scan.step(ch):
                break
            i += 1
        if i > start:
            out.append(CallArgs(self.calls - 1, buf[start:i]))
        self._buf = buf[i:]
        if self._bare and scan.done:
            self._state = "bare_end"
        elif scan.done or self._buf.startswith(close):
            self._state = "trailer"

    def _trailer(self, out: list[Piece], final: bool) -> None:
        at = self._buf.find(self.fmt.close)
        if at < 0:  # the rest of the call's JSON (its closing brace): not content
            keep = 0 if final else _partial_suffix(self._buf, self.fmt.close)
            self._buf = self._buf[len(self._buf) - keep :] if keep else ""
            return
        self._buf = self._buf[at + len(self.fmt.close) :]
        self._state, self._skip_ws, self._after_ws = "text", True, ""

    def _whole(self, out: list[Piece], final: bool) -> None:
        at = self._buf.find(self.fmt.close)
        if at < 0:
            return
        body, self._buf = self._buf[:at], self._buf[at + len(self.fmt.close) :]
        call = _loose_call(body, self.fmt)
        if call is None:
            out.append(Content(self._tag_ws + self.fmt.open + body + self.fmt.close))
            self._state = "text"
            return
        name, args = call
        out.append(CallStart(self.calls, self.new_id(), name))
        out.append(CallArgs(self.calls, args))
        self.calls += 1
        self._state, self._skip_ws, self._after_ws = "text", True, ""


def _loose_call(body: str, fmt: ToolCallFormat) -> tuple[str, str] | None:
    """A call written in another key order (or with "parameters"): its name and arguments."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get(fmt.name_key), str):
        return None
    args = obj.get(fmt.args_key, obj.get("parameters", {}))
    if isinstance(args, str):
        return obj[fmt.name_key], args
    return obj[fmt.name_key], json.dumps(args, ensure_ascii=False)


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Adjacent content, or adjacent fragments of one call's arguments, as one piece."""
    out: list[Piece] = []
    for p in pieces:
        last = out[-1] if out else None
        if isinstance(p, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + p.text)
        elif isinstance(p, CallArgs) and isinstance(last, CallArgs) and last.index == p.index:
            out[-1] = CallArgs(p.index, last.text + p.text)
        elif not (isinstance(p, (Content, CallArgs)) and not p.text):
            out.append(p)
    return out


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str


def parse_output(
    text: str,
    fmt: ToolCallFormat = HERMES,
    new_id: Callable[[], str] = new_call_id,
    names: frozenset[str] = frozenset(),
) -> tuple[str, list[ParsedCall]]:
    """A whole output's content and calls: the streamed pieces, put together."""
    parser = ToolCallParser(fmt, new_id, names)
    content, calls = "", []
    for p in parser.feed(text) + parser.finish():
        if isinstance(p, Content):
            content += p.text
        elif isinstance(p, CallStart):
            calls.append([p.id, p.name, ""])
        else:
            calls[p.index][2] += p.text
    return content, [ParsedCall(*c) for c in calls]


def finish_reason(reason: str | None, calls: int) -> str | None:
    """OpenAI's "tool_calls" for an answer that ended by itself after calling."""
    return "tool_calls" if calls and reason == "stop" else reason
