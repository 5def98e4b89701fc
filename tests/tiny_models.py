"""Tiny random Llama-family checkpoints built with transformers, plus a word-level tokenizer.

A tiny vocabulary lets tests enumerate the exact target distribution."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(29)]  # 32 tokens


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = WORDS + [f"x{i}" for i in range(len(WORDS), vocab_size)]
    vocab = {w: i for i, w in enumerate(words[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
            }
        )
    )


def build(
    folder: Path,
    arch: str = "llama",
    vocab_size: int = 32,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    max_pos: int = 512,
    **extra,
) -> Path:
    """Save a tiny random ``arch`` model (llama, qwen2, qwen3, mistral) into ``folder``."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if arch == "qwen3":
        kwargs["head_dim"] = hidden // heads
    kwargs.update(extra)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).float().eval()
    # random init is nearly uniform; scale up so distributions are peaked and different
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(3.0)
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, vocab_size)
    return folder


# JSON pieces (byte-level BPE, no merges): tiny models whose outputs a grammar engine can read
JSON_PIECES = ["<unk>", "<s>", "</s>", "{", "}", "[", "]", ",", ":", '"', "a", "b", "1", "2"]
JSON_PIECES += ["true", "false"]  # 16 tokens


def write_json_tokenizer(folder: Path) -> None:
    """Replace ``folder``'s tokenizer with one whose 16 tokens are JSON pieces (as real
    byte-level tokenizers spell them), so that "[1,2]" is the tokens [ 1 , 2 ]."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(JSON_PIECES)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(w, special=True) for w in JSON_PIECES[:3]])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            }
        )
    )
