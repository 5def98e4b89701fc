"""Tokenizer (Hugging Face tokenizers via transformers) and incremental detokenization."""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path

from specdec.config import ModelConfig
from specdec.tool_prompt import knows_tools, needs_tools, plain_messages


class InvalidText(ValueError):
    """Text that is not valid Unicode: no tokenizer can encode it."""


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a lone UTF-16 surrogate (JSON's "\\ud800" decodes to one), or None.
    Such a string is not Unicode text: it cannot be encoded, tokenized or answered."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_text(text: str, what: str) -> None:
    """Raise ``InvalidText`` naming ``what`` if ``text`` holds a lone surrogate."""
    at = lone_surrogate(text)
    if at is not None:
        raise InvalidText(
            f"{what} is not valid Unicode text: it holds a lone UTF-16 surrogate "
            f"(U+{ord(text[at]):04X}) at character {at}"
        )


class Tokenizer:
    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        folder = Path(folder)
        self.folder = folder
        if not (folder / "tokenizer.json").exists() and not (folder / "tokenizer.model").exists():
            raise ValueError(f"no tokenizer in {folder} (tokenizer.json or tokenizer.model)")
        try:
            self.hf = AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:  # noqa: BLE001 - any failure here is a bad folder
            raise ValueError(f"could not load the tokenizer in {folder}: {exc}") from exc
        self.vocab_size = len(self.hf)
        self.eos_token_ids = self._eos_ids(folder)

    def _eos_ids(self, folder: Path) -> list[int]:
        ids = set()
        if self.hf.eos_token_id is not None:
            ids.add(self.hf.eos_token_id)
        for name in ("generation_config.json", "config.json"):
            f = folder / name
            if f.exists():
                eos = json.loads(f.read_text()).get("eos_token_id")
                ids.update([eos] if isinstance(eos, int) else (eos or []))
        return sorted(ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (part of a character shows as U+FFFD)."""
        return self.hf.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: exact for byte-level BPE and byte-fallback tokens
        (a token may hold part of a UTF-8 character), else its text in UTF-8."""
        piece = self.hf.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if self._byte_level and all(c in _BYTE_OF for c in piece):
                return bytes(_BYTE_OF[c] for c in piece)
            m = _BYTE_TOKEN.fullmatch(piece)
            if m:
                return bytes([int(m.group(1), 16)])
        return self.token_text(token_id).encode()

    @cached_property
    def _byte_level(self) -> bool:
        """Whether the tokenizer's decoder maps GPT-2's byte alphabet back to bytes."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return False
        return '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("decoder"))

    def chat_template(self, tools: bool = False) -> str | None:
        """The template's source (its tool-use variant, when it has one and tools are asked)."""
        template = getattr(self.hf, "chat_template", None)
        if isinstance(template, dict):
            return template.get("tool_use" if tools and "tool_use" in template else "default")
        return template

    def apply_chat_template(
        self, prompt: str | list[dict], tools: list[dict] | None = None
    ) -> list[int]:
        """The prompt's ids under the chat template, ``tools`` offered to the model. A
        template that does not render tools gets them (and the calls) written into the
        messages (tool_prompt.py)."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        template = self.chat_template(bool(tools))
        if not template:
            raise ValueError("this model's tokenizer has no chat template")
        for i, message in enumerate(messages):
            for key, value in message.items():
                if isinstance(value, str):
                    check_text(value, f"messages[{i}].{key}")
        if needs_tools(messages, tools) and not knows_tools(template):
            messages, tools = plain_messages(messages, tools), None
        out = self.hf.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_alphabet()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


class Detokenizer:
    """Turns a growing list of token ids into text deltas that never split a character.

    Decodes a short window (from ``prefix`` to the end) and emits only what extends the
    already-emitted decoding of ``prefix..read``; a trailing U+FFFD means an incomplete UTF-8
    sequence, so it waits for the next token."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read])
        full_text = self.tok.decode(self.ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """What is left at the end (an incomplete character shows as U+FFFD)."""
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read])
        full_text = self.tok.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


# the files that define a tokenizer's vocabulary (its tokens, their ids, the added ones)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)


def _same_tokenizer_files(a: Path, b: Path) -> bool:
    """Whether two folders hold byte-identical tokenizer files (a family's models usually do):
    then their vocabularies are the same without loading the second tokenizer (~1 s)."""
    for name in TOKENIZER_FILES:
        fa, fb = a / name, b / name
        if fa.exists() != fb.exists():
            return False
        if fa.exists() and (
            fa.stat().st_size != fb.stat().st_size or fa.read_bytes() != fb.read_bytes()
        ):
            return False
    return True


def check_draft_compatible(
    target_tok: Tokenizer, target_cfg: ModelConfig, draft_folder: Path, draft_cfg: ModelConfig
) -> None:
    """A draft must speak the target's vocabulary: the same tokens with the same ids. Model
    rows beyond the tokenizer (padding) are fine: they are masked in both distributions."""
    has_tokenizer = any((draft_folder / f).exists() for f in ("tokenizer.json", "tokenizer.model"))
    if has_tokenizer and not _same_tokenizer_files(target_tok.folder, draft_folder):
        draft_tok = Tokenizer(draft_folder)
        mine, theirs = target_tok.hf.get_vocab(), draft_tok.hf.get_vocab()
        if mine != theirs:
            diff = len(set(mine.items()) ^ set(theirs.items()))
            raise ValueError(
                f"the draft's tokenizer differs from the target's ({len(theirs)} vs {len(mine)} "
                f"tokens, {diff} entries differ): speculative decoding needs a shared vocabulary"
            )
    for cfg, name in ((target_cfg, "target"), (draft_cfg, "draft")):
        if cfg.vocab_size < target_tok.vocab_size:
            raise ValueError(
                f"the {name} model has {cfg.vocab_size} output rows, fewer than the "
                f"tokenizer's {target_tok.vocab_size} tokens: not the same vocabulary"
            )
