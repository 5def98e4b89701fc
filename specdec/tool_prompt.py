"""Tools for chat templates that know nothing of them (SmolLM2's, for one).

Such a template renders only each message's role and content, so the tools and the
conversation's calls are written into the messages themselves, in the Hermes format that the
server's parser reads (``server/tool_calls.py``): the tools go into the system message as JSON
lines between ``<tools>`` tags, an earlier call becomes the assistant's text between
``<tool_call>`` tags, and a tool's result a user message between ``<tool_response>`` tags.
"""

from __future__ import annotations

import json

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def knows_tools(template: str | None) -> bool:
    """Whether a chat template renders tools itself (it reads a ``tools`` variable)."""
    return bool(template) and "tools" in template


def needs_tools(messages: list[dict], tools: list[dict] | None) -> bool:
    """Whether a conversation has anything a tool-blind template would drop or garble."""
    return bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def tools_text(tools: list[dict]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    example = json.dumps({"name": "the function's name", "arguments": {"argument": "value"}})
    return (
        "You can use the functions described below, one JSON object per line:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "To use one, answer with a JSON object that names the function and gives its "
        f"arguments, between {OPEN} and {CLOSE}, like this:\n{OPEN}\n{example}\n{CLOSE}"
    )


def call_text(call: dict) -> str:
    fn = call.get("function", call)
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def plain_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """``messages`` with roles and contents only, the tools and calls written into them."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            result = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_results"):  # results of one turn share a message
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_results": True})
        elif m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            parts += [call_text(c) for c in m["tool_calls"]]
            out.append({"role": m["role"], "content": "\n".join(parts)})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    out = [{k: v for k, v in m.items() if k != "_results"} for m in out]
    if tools:
        text = tools_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out
