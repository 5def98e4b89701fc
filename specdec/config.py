"""ModelConfig: the decoder hyper-parameters we need, read from a Hugging Face config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE
    rope_scaling: dict = field(default_factory=dict)
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            named = ", ".join(archs) or raw.get("model_type", "unknown")
            raise UnsupportedModelError(
                f"unsupported architecture {named!r} in {source}; specdec supports "
                + ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in ("default", "llama3", "linear"):
            raise UnsupportedModelError(f"unsupported RoPE scaling {rope_type!r} in {source}")
        rope["rope_type"] = rope_type
        n_heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        max_pos = raw.get("max_position_embeddings", 4096)
        window = raw.get("sliding_window")
        if window and raw.get("use_sliding_window", family == "mistral"):
            max_pos = min(max_pos, int(window))  # we attend to the whole context: stay inside
        eos = raw.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=n_heads,
            num_kv_heads=raw.get("num_key_value_heads") or n_heads,
            head_dim=raw.get("head_dim") or hidden // n_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            rope_scaling=rope,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )

    def rope_inv_freq(self) -> torch.Tensor:
        """Inverse RoPE frequencies with Llama-3/linear scaling, in fp32 exactly as the
        reference implementation computes them (so long-context angles match it too)."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        kind = self.rope_scaling.get("rope_type", "default")
        if kind == "linear":
            inv = inv / float(self.rope_scaling["factor"])
        elif kind == "llama3":
            factor = float(self.rope_scaling["factor"])
            low = float(self.rope_scaling.get("low_freq_factor", 1.0))
            high = float(self.rope_scaling.get("high_freq_factor", 4.0))
            old_ctx = float(self.rope_scaling.get("original_max_position_embeddings", 8192))
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
            smooth = (old_ctx / wavelen - low) / (high - low)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
            inv = torch.where(is_mid, mid, scaled)
        return inv
