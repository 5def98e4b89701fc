"""Making a drafter cheaper without touching exactness.

The verifier only needs the distribution q the drafter really sampled from, so the drafter may
be any approximation of the draft model: its matrices int8 (per-row scales, half the bytes of
bf16, a quarter of fp32), and its output head limited to part of the vocabulary (q is then
zero elsewhere). The target is never changed.
"""

from __future__ import annotations

import torch

from specdec.model import Transformer
from specdec.ops import LinearWeight


def quantize_int8(lw: LinearWeight) -> LinearWeight:
    """Symmetric per-output-row int8: w ~= scale[n] * q[n, k], |q| <= 127."""
    w = lw.weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return LinearWeight(q, lw.bias, scale)


def quantize_model_int8(model: Transformer) -> None:
    """Every matrix of every layer, and the output head, to int8 (embeddings stay as is)."""
    for layer in model.w["layers"]:
        for name in ("qkv", "o", "gate_up", "down"):
            layer[name] = quantize_int8(layer[name])
    model.w["lm_head"] = quantize_int8(model.w["lm_head"])


def restrict_head(model: Transformer, keep: torch.Tensor) -> None:
    """Keep only the output rows ``keep`` (sorted token ids): the model then returns logits for
    those tokens only, in that order. ``expand_logits`` puts them back in place."""
    lw = model.w["lm_head"]
    model.w["lm_head"] = LinearWeight(
        lw.weight[keep].contiguous(),
        None if lw.bias is None else lw.bias[keep].contiguous(),
        None if lw.scale is None else lw.scale[keep].contiguous(),
    )
    model.head_ids = keep


def expand_logits(logits: torch.Tensor, keep: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over ``keep`` back onto the full vocabulary; the rest get -inf (probability 0)."""
    full = torch.full((*logits.shape[:-1], vocab), float("-inf"), dtype=logits.dtype)
    full[..., keep] = logits
    return full


def frequent_token_ids(vocab_limit: int, special_ids: list[int], vocab: int) -> torch.Tensor:
    """The first ``vocab_limit`` ids plus the special tokens. Byte-level BPE vocabularies number
    tokens in merge order, so low ids are the frequent ones."""
    ids = set(range(min(vocab_limit, vocab))) | {i for i in special_ids if 0 <= i < vocab}
    return torch.tensor(sorted(ids), dtype=torch.int64)
