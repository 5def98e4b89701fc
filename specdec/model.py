"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2) and its forward pass.

One ``forward`` serves every decoding method: it takes any number of new tokens per sequence
after the cached ones (1 for plain decoding, K+1 for verification, a ragged batch padded on
the right), optional explicit RoPE positions and an optional attention mask over cache slots
(for trees of speculative branches), and returns logits only where they are asked for.
The model knows nothing of speculation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec import kernels, ops
from specdec.config import ModelConfig
from specdec.kv_cache import KVCache
from specdec.weights import load_weights

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def cpu_has_native_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & kernels.cpu_flags())


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is bf16 where the hardware computes in bf16 natively (CUDA, avx512_bf16/AMX
    CPUs) and fp32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto, float32 or bfloat16")
    return DTYPES[dtype]


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict, device: torch.device, dtype: torch.dtype):
        self.config = cfg
        self.device = device
        self.dtype = dtype  # weights' storage dtype
        # our CPU kernels compute in fp32 whatever the weights' dtype; torch uses the dtype
        self.act_dtype = torch.float32 if ops.use_kernels(device) else dtype
        self.w = weights
        self._inv_freq = cfg.rope_inv_freq().float()
        self._cos = self._sin = torch.empty(0)

    @classmethod
    def from_folder(
        cls, folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> Transformer:
        folder = Path(folder)
        cfg = ModelConfig.from_json(folder / "config.json")
        dev = torch.device(device)
        return cls(cfg, load_weights(folder, cfg, dtype, dev), dev, dtype)

    # -- pieces ------------------------------------------------------------------------------
    def new_cache(self, max_rows: int, max_len: int) -> KVCache:
        return KVCache(self.config, max_rows, max_len, self.device, self.act_dtype)

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables [P, head_dim] covering ``positions`` (grown on demand)."""
        need = int(positions.max()) + 1
        if need > self._cos.shape[0]:
            n = max(need, 2 * self._cos.shape[0], 1024)
            angles = torch.arange(n, dtype=torch.float32)[:, None] * self._inv_freq[None, :]
            angles = torch.cat([angles, angles], dim=-1)
            self._cos = angles.cos().to(self.device, self.act_dtype)
            self._sin = angles.sin().to(self.device, self.act_dtype)
        return self._cos, self._sin

    # -- the forward pass ---------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor | None = None,
        num_new: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``tokens`` [B,T] after what cache rows ``rows`` [B] already hold.

        num_new [B]: how many of each row's T tokens are real (the rest is right padding);
            the cache length of each row advances by it. Default: all T.
        positions [B,T]: RoPE positions; default: the cache slot each token is written to.
        attn_mask [B,T,S] (bool): which cache slots each new token sees; default causal.
        logits_at [B,P]: indices into T whose logits to return; default all T.
        Returns fp32 logits [B,P,V].
        """
        cfg, w = self.config, self.w
        bsz, t_len = tokens.shape
        rows = torch.arange(bsz) if rows is None else rows.cpu().long()
        num_new = torch.full((bsz,), t_len) if num_new is None else num_new.cpu().long()
        start = cache.lengths[rows].clone()
        cache.check_room(rows, t_len)
        if positions is None:
            positions = start[:, None] + torch.arange(t_len)[None, :]
        cos, sin = self._rope_tables(positions)
        h_q, h_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        scale = d**-0.5

        x = w["embed"][tokens.to(self.device)].to(self.act_dtype)
        for i, layer in enumerate(w["layers"]):
            h = ops.rmsnorm(x, layer["attn_norm"], cfg.rms_norm_eps)
            qkv = ops.linear(h, layer["qkv"])
            q, k, v = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
            q = q.reshape(bsz, t_len, h_q, d)
            k = k.reshape(bsz, t_len, h_kv, d)
            v = v.reshape(bsz, t_len, h_kv, d)
            if cfg.qk_norm:
                q = ops.rmsnorm(q, layer["q_norm"], cfg.rms_norm_eps)
                k = ops.rmsnorm(k, layer["k_norm"], cfg.rms_norm_eps)
            q, k = ops.rope(q, positions, cos, sin), ops.rope(k, positions, cos, sin)
            attn = ops.attend(
                q, k, v, cache.k[i], cache.v[i], rows, start, num_new, attn_mask, scale
            )
            x = x + ops.linear(attn.reshape(bsz, t_len, h_q * d), layer["o"])
            h = ops.rmsnorm(x, layer["mlp_norm"], cfg.rms_norm_eps)
            x = x + ops.linear(ops.silu_mul(ops.linear(h, layer["gate_up"])), layer["down"])
        cache.lengths[rows] = start + num_new

        if logits_at is not None:
            idx = logits_at.to(self.device).long()
            x = x.gather(1, idx[:, :, None].expand(-1, -1, x.shape[-1]))
        x = ops.rmsnorm(x, w["norm"], cfg.rms_norm_eps)
        return ops.linear(x, w["lm_head"]).float()
