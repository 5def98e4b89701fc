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

from specdec import fused_layers, gguf_model, ops, platform
from specdec.config import DTYPES, TORCH_DTYPES, ModelConfig
from specdec.kv_cache import KVCache
from specdec.weights import load_weights


def cpu_has_native_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & platform.cpu_flags())


NATIVE = ("native", "exact")  # GGUF matrices in their own quantization (see resolve_dtype)


def resolve_dtype(
    dtype: str | torch.dtype, device: torch.device, gguf: bool = False
) -> torch.dtype | str:
    """The weights' format for a model: a torch dtype, or for a GGUF file on a CPU "native"
    (the file's own quantization, int8 activations in products) or "exact" (the same with
    exact fp32 activations).

    "auto": a GGUF file runs natively (on CUDA: dequantized to bf16); an HF folder keeps bf16
    where our CPU kernels run (they widen bf16 to fp32 in registers: half fp32's bytes) or the
    hardware computes in bf16 (CUDA, avx512_bf16/AMX), fp32 elsewhere. "exact": a GGUF file
    natively with exact activations, an HF folder in fp32. A dtype name dequantizes a GGUF
    file to that dtype at load."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in ("auto", "exact") and gguf:
        if device.type != "cpu":
            return torch.bfloat16
        return "native" if dtype == "auto" else "exact"
    if dtype == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.bfloat16 if ops.use_kernels(device) else torch.float32
    if dtype == "exact":
        return torch.float32
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return TORCH_DTYPES[dtype]


class Transformer:
    def __init__(
        self, cfg: ModelConfig, weights: dict, device: torch.device, dtype: torch.dtype | str
    ):
        self.config = cfg
        self.device = device
        self.dtype = dtype  # weights' storage dtype, or "native"/"exact" (resolve_dtype)
        self.native = dtype in NATIVE
        # our CPU kernels compute in fp32 whatever the weights' format; torch uses the dtype
        native_or_kernels = self.native or ops.use_kernels(device)
        self.act_dtype = torch.float32 if native_or_kernels else dtype
        self.w = weights
        self.head_ids: torch.Tensor | None = None  # the output rows kept, if not all
        self._inv_freq = cfg.rope_inv_freq().float()
        if "rope_freqs" in weights:  # per-frequency factors stored in a GGUF file (Llama 3)
            self._inv_freq = self._inv_freq / weights["rope_freqs"]
        self._cos = self._sin = torch.empty(0)
        # run the layer loop in one kernel call where every matrix is GGUF (fused_layers);
        # False: always the Python loop (tests compare the two)
        self.fuse_layers = True
        self._plan: fused_layers.LayerPlan | bool | None = None  # None: not built yet

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        head_ids: torch.Tensor | None = None,
        requantize: str | None = None,
    ) -> Transformer:
        """Load an HF-format folder, a .gguf file, or a cache folder standing for one (see
        ``registry``). ``dtype``: see ``resolve_dtype``. ``head_ids`` (GGUF only): the output
        rows to keep; the rest of the head is never read (``model.head_ids`` says if applied).
        ``requantize`` (GGUF only): see ``GGUFModel.load_weights``."""
        dev = torch.device(device)
        source = gguf_model.source_of(path)
        if source is None:
            path = Path(path)
            cfg = ModelConfig.from_json(path / "config.json")
            dt = resolve_dtype(dtype, dev)
            return cls(cfg, load_weights(path, cfg, dt, dev), dev, dt)
        return cls.from_gguf(source, dtype, device, head_ids, requantize)

    @classmethod
    def from_gguf(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        head_ids: torch.Tensor | None = None,
        requantize: str | None = None,
    ) -> Transformer:
        dev = torch.device(device)
        mode = resolve_dtype(dtype, dev, gguf=True)
        file = gguf_model.GGUFModel(path)  # checks everything before reading any weight
        weights = file.load_weights(mode, dev, head_ids, requantize)
        model = cls(file.config, weights, dev, mode)
        model.head_ids = head_ids
        return model

    @classmethod
    def from_folder(
        cls, folder: str | Path, dtype: str | torch.dtype = torch.float32, device: str = "cpu"
    ) -> Transformer:
        return cls.from_path(folder, dtype, device)

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
        scale = cfg.head_dim**-0.5

        x = ops.embed(w["embed"], tokens).to(self.act_dtype)  # a new tensor: added into below
        args = (x, cache, rows, start, num_new, positions, cos, sin, attn_mask, scale)
        plan = self._layer_plan()
        if plan is not None:  # the same loop in one kernel call (native GGUF)
            fused_layers.run(plan, cfg, *args)
        else:
            self._layers(*args)
        cache.lengths[rows] = start + num_new

        if logits_at is not None:
            idx = logits_at.to(self.device).long()
            x = x.gather(1, idx[:, :, None].expand(-1, -1, x.shape[-1]))
        x = ops.rmsnorm(x, w["norm"], cfg.rms_norm_eps)
        return ops.linear(x, w["lm_head"]).float()

    def _layer_plan(self) -> fused_layers.LayerPlan | None:
        """The fused layer loop's plan, where it applies (built on first use)."""
        if not self.fuse_layers or not fused_layers.available():
            return None
        if self._plan is None:
            self._plan = fused_layers.plan(self) or False
        return self._plan or None

    def weights_changed(self) -> None:
        """Call after replacing layer matrices (quantize.py): the plan points at the old ones."""
        self._plan = None

    def _layers(self, x, cache, rows, start, num_new, positions, cos, sin, attn_mask, scale):
        """The decoder layers over x [B,T,hidden] (the residual stream, in place)."""
        cfg, layers = self.config, self.w["layers"]
        bsz, t_len = x.shape[:2]
        h_q, h_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h = ops.rmsnorm(x, layers[0]["attn_norm"], cfg.rms_norm_eps)
        for i, layer in enumerate(layers):
            qkv = ops.linear(h, layer["qkv"])
            if cfg.qk_norm:
                q, k, v = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
                q = ops.rmsnorm(q.reshape(bsz, t_len, h_q, d), layer["q_norm"], cfg.rms_norm_eps)
                k = ops.rmsnorm(k.reshape(bsz, t_len, h_kv, d), layer["k_norm"], cfg.rms_norm_eps)
                q, k = ops.rope(q, positions, cos, sin), ops.rope(k, positions, cos, sin)
                v = v.reshape(bsz, t_len, h_kv, d)
            else:
                q, k, v = ops.rope_qkv(qkv, positions, cos, sin, h_q, h_kv, d)
            attn = ops.attend(
                q, k, v, cache.k[i], cache.v[i], rows, start, num_new, attn_mask, scale
            )
            o = ops.linear(attn.reshape(bsz, t_len, h_q * d), layer["o"])
            h = ops.add_rmsnorm(x, o, layer["mlp_norm"], cfg.rms_norm_eps)  # x += o
            mlp = ops.linear(ops.silu_mul(ops.linear(h, layer["gate_up"])), layer["down"])
            if i + 1 < len(layers):  # x += mlp, and the next layer's norm of it
                h = ops.add_rmsnorm(x, mlp, layers[i + 1]["attn_norm"], cfg.rms_norm_eps)
            else:
                x.add_(mlp)
