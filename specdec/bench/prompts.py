"""The bench's prompts (``prompts.json``): code, prose and chat requests, tokenized once."""

from __future__ import annotations

import json
from pathlib import Path

PROMPTS_FILE = Path(__file__).with_name("prompts.json")
PROMPT_TYPES = ("code", "prose", "chat")


def load_prompts(types: list[str], per_type: int) -> list[dict]:
    """The first ``per_type`` prompts of each type, each with an id like ``code-0``."""
    entries = json.loads(PROMPTS_FILE.read_text())
    known = sorted({e["type"] for e in entries})
    out = []
    for t in types:
        if t not in known:
            raise ValueError(f"unknown prompt type {t!r}: choose from {', '.join(known)}")
        of_type = [e for e in entries if e["type"] == t][:per_type]
        out += [dict(e, id=f"{t}-{i}") for i, e in enumerate(of_type)]
    return out


def encode_prompts(prompts: list[dict], folder: Path) -> list[list[int]]:
    from specdec.tokenizer import Tokenizer

    tok = Tokenizer(folder)
    encode = tok.apply_chat_template, tok.encode
    return [encode[0](p["prompt"]) if p["chat"] else encode[1](p["prompt"]) for p in prompts]
