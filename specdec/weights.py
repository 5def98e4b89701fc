"""Read a Hugging Face-format checkpoint folder into the tensors our decoder uses.

Checks what a user can get wrong (missing folder, no weights, corrupt or truncated
safetensors, tensors missing or of the wrong shape) and says so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specdec.config import ModelConfig
from specdec.ops import LinearWeight


class CheckpointError(ValueError):
    pass


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"corrupt shard index {index}: {exc}") from exc
        files = [folder / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"shards listed in {index} are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no weights in {folder}: expected model.safetensors or sharded *.safetensors"
        )
    return files


class _Reader:
    """Tensors by name across all shards, opened lazily."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, Path] = {}
        self._open = {}
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt")
                keys = list(handle.keys())
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"corrupt safetensors file {f}: {exc}") from exc
            self._open[f] = handle
            for k in keys:
                self._where[k] = f

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self._where:
            raise CheckpointError(f"checkpoint lacks tensor {name!r}")
        f = self._where[name]
        try:
            t = self._open[f].get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"corrupt safetensors file {f} (tensor {name}): {exc}") from exc
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(
                f"tensor {name} has shape {tuple(t.shape)}, config.json implies {tuple(shape)}"
            )
        if not torch.isfinite(t[:1].float()).all():
            raise CheckpointError(f"tensor {name} in {f} holds NaN/inf: corrupt checkpoint")
        return t


def load_weights(folder: Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> dict:
    """Weights by role, with q|k|v and gate|up fused into one matrix each (fewer, larger
    products per layer). Matrices keep ``dtype``; norms and biases are fp32."""
    reader = _Reader(checkpoint_files(folder))
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d

    def mat(name, shape):
        return reader.get(name, shape).to(device=device, dtype=dtype)

    def vec(name, n):
        return reader.get(name, (n,)).to(device=device, dtype=torch.float32)

    def maybe_vec(name, n):
        return vec(name, n) if name in reader else None

    embed = mat("model.embed_tokens.weight", (cfg.vocab_size, h))
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        qkv = torch.cat(
            [
                mat(a + "q_proj.weight", (q_out, h)),
                mat(a + "k_proj.weight", (kv_out, h)),
                mat(a + "v_proj.weight", (kv_out, h)),
            ]
        )
        biases = [
            maybe_vec(a + f"{n}_proj.bias", o)
            for n, o in (("q", q_out), ("k", kv_out), ("v", kv_out))
        ]
        qkv_bias = None
        if any(b is not None for b in biases):
            sizes = (q_out, kv_out, kv_out)
            qkv_bias = torch.cat(
                [
                    b if b is not None else torch.zeros(n, device=device)
                    for b, n in zip(biases, sizes)
                ]
            )
        gate_up = torch.cat(
            [mat(p + "mlp.gate_proj.weight", (inter, h)), mat(p + "mlp.up_proj.weight", (inter, h))]
        )
        gu_bias = None
        if p + "mlp.gate_proj.bias" in reader:
            gu_bias = torch.cat(
                [vec(p + "mlp.gate_proj.bias", inter), vec(p + "mlp.up_proj.bias", inter)]
            )
        layer = {
            "attn_norm": vec(p + "input_layernorm.weight", h),
            "qkv": LinearWeight(qkv, qkv_bias),
            "o": LinearWeight(
                mat(a + "o_proj.weight", (h, q_out)), maybe_vec(a + "o_proj.bias", h)
            ),
            "mlp_norm": vec(p + "post_attention_layernorm.weight", h),
            "gate_up": LinearWeight(gate_up, gu_bias),
            "down": LinearWeight(
                mat(p + "mlp.down_proj.weight", (h, inter)), maybe_vec(p + "mlp.down_proj.bias", h)
            ),
        }
        if cfg.qk_norm:
            layer["q_norm"] = vec(a + "q_norm.weight", d)
            layer["k_norm"] = vec(a + "k_norm.weight", d)
        layers.append(layer)
    tied = cfg.tie_word_embeddings
    lm_head = embed if tied else mat("lm_head.weight", (cfg.vocab_size, h))
    return {
        "embed": embed,
        "layers": layers,
        "norm": vec("model.norm.weight", h),
        "lm_head": LinearWeight(lm_head),
    }
