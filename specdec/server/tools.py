"""A chat request's tools: ``tools`` and ``tool_choice`` checked, and the conversation (with
its earlier calls and their results) turned into what chat templates read.

OpenAI's shapes: ``tools: [{"type": "function", "function": {"name", "description",
"parameters"}}]``; an assistant message may carry ``tool_calls`` (each with an ``id`` and a
JSON string of arguments) and no content; a ``tool`` message answers one of those calls by its
``tool_call_id``. Templates expect the arguments as an object, so they are parsed here. Every
mistake is a 400 naming the offending field, e.g. ``tools[1].function.name``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specdec.server.errors import APIError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("auto", "none", "required")


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


@dataclass(frozen=True)
class ToolRequest:
    """The request's tools and what it asks of the model about them."""

    tools: list[dict]  # as the client sent them (templates render them as they are)
    choice: str  # "auto", "none", "required", or "function" (the one named in ``function``)
    function: str | None = None
    parallel: bool = True  # more than one call per answer

    @property
    def offered(self) -> list[dict] | None:
        """The tools the model is shown (none under tool_choice "none")."""
        return self.tools if self.tools and self.choice != "none" else None

    @property
    def enforced(self) -> bool:
        """Whether the answer must be a call ("required" or a named function)."""
        return bool(self.offered) and self.choice in ("required", "function")

    def functions(self) -> list[dict]:
        """The ``function`` objects a call may name (just the named one, when one is)."""
        fns = [t["function"] for t in self.tools]
        return [f for f in fns if self.function is None or f["name"] == self.function]


def tool_request(tools: list | None, tool_choice: Any, parallel: bool | None) -> ToolRequest:
    checked = check_tools(tools)
    names = {t["function"]["name"] for t in checked}
    if tool_choice is None:
        return ToolRequest(checked, "auto" if checked else "none", parallel=parallel is not False)
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise _bad(
                "tool_choice",
                f"tool_choice must be one of {', '.join(CHOICES)} or a function, "
                f"got {tool_choice!r}",
            )
        if tool_choice != "none" and not checked:
            raise _bad("tool_choice", f'tool_choice "{tool_choice}" needs tools')
        return ToolRequest(checked, tool_choice, parallel=parallel is not False)
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise _bad(
            "tool_choice",
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}',
        )
    if name not in names:
        offered = ", ".join(sorted(names)) or "none"
        raise _bad(
            "tool_choice.function.name",
            f"tool_choice names the function {name!r}, which is not among the tools "
            f"(offered: {offered})",
        )
    return ToolRequest(checked, "function", name, parallel=parallel is not False)


def check_tools(tools: list | None) -> list[dict]:
    """The tools, each a function with a valid name and an object schema for its
    parameters; names unique."""
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, f"{where} must be an object")
        if tool.get("type") != "function":
            raise _bad(f"{where}.type", f'{where}.type must be "function"')
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{where}.function", f"{where}.function must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(
                f"{where}.function.name",
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
            )
        if name in seen:
            raise _bad(
                f"{where}.function.name",
                f"{where}.function.name {name!r} is also the name of tools[{seen[name]}]",
            )
        seen[name] = i
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise _bad(
                f"{where}.function.description", f"{where}.function.description must be a string"
            )
        _check_parameters(fn.get("parameters"), f"{where}.function.parameters")
    return list(tools or [])


def _check_parameters(schema: Any, where: str) -> None:
    if schema is None:
        return
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise _bad(where, f'{where} must be a JSON schema of an object ({{"type": "object"}})')
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise _bad(where, f"{where} is not a valid JSON schema: {exc.message}") from exc


def template_messages(messages: list) -> list[dict]:
    """The conversation as chat templates read it: content as one string, each earlier call's
    arguments as an object, and each ``tool`` message tied to a call made before it."""
    out: list[dict] = []
    calls: dict[str, str] = {}  # id -> function name of the calls made so far
    for i, m in enumerate(messages):
        msg = m.as_template_input()
        where = f"messages[{i}]"
        if m.tool_calls is not None:
            if m.role != "assistant":
                raise _bad(
                    f"{where}.tool_calls", f"{where}: only assistant messages make tool calls"
                )
            msg["tool_calls"] = [
                _template_call(c, f"{where}.tool_calls[{j}]", calls)
                for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool":
            if not m.tool_call_id:
                raise _bad(f"{where}.tool_call_id", f"{where}: a tool message needs tool_call_id")
            if m.tool_call_id not in calls:
                raise _bad(
                    f"{where}.tool_call_id",
                    f"{where}.tool_call_id {m.tool_call_id!r} answers no tool call made before it",
                )
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = calls[m.tool_call_id]
        out.append(msg)
    return out


def _template_call(call: Any, where: str, calls: dict[str, str]) -> dict:
    if not isinstance(call, dict):
        raise _bad(where, f"{where} must be an object")
    cid, fn = call.get("id"), call.get("function")
    if not isinstance(cid, str) or not cid:
        raise _bad(f"{where}.id", f"{where}.id must be a non-empty string")
    if call.get("type", "function") != "function":
        raise _bad(f"{where}.type", f'{where}.type must be "function"')
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _bad(f"{where}.function.name", f"{where}.function.name must be a string")
    args = fn.get("arguments")
    try:
        parsed = json.loads(args) if isinstance(args, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _bad(
            f"{where}.function.arguments",
            f"{where}.function.arguments must be a JSON object in a string, got {args!r}"[:300],
        )
    calls[cid] = fn["name"]
    return {"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": parsed}}
