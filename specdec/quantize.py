"""Making a drafter cheaper without touching exactness.

The verifier only needs the distribution q the drafter really sampled from, so the drafter may
be any approximation of the draft model: its matrices int8 (per-row scales, half the bytes of
bf16, a quarter of fp32), int4 (per-group scales, 0.56 bytes a weight) or GGUF Q4_0 (the same
bytes, in our GGUF kernels' tiles), and its output head limited to part of the vocabulary (q is
then zero elsewhere), and with int4 and Q4_0, its activations rounded to int8 where the CPU has
int8 dot products (VNNI). The target is never changed.
"""

from __future__ import annotations

import gguf
import torch
import torch.nn.functional as F

from specdec.hugepages import ALIGN, Arena
from specdec.kernels import gguf as gguf_kernels
from specdec.kernels.gguf import PackedWeight
from specdec.model import Transformer
from specdec.ops import (
    INT4_BLOCK,
    INT4_GROUP,
    FusedWeight,
    LinearWeight,
    int4_nibble_k,
    int4_padded,
)


def float_weight(lw: LinearWeight | FusedWeight) -> LinearWeight:
    """The matrix as plain floats: a GGUF matrix (or fused parts of several) dequantized to the
    file's exact values; a float matrix as it is."""
    if isinstance(lw, FusedWeight):
        parts = [float_weight(p).weight.float() for p in lw.parts]
        return LinearWeight(torch.cat(parts), lw.bias)
    if isinstance(lw.weight, PackedWeight):
        return LinearWeight(gguf_kernels.dequantize(lw.weight), lw.bias)
    return lw


def quantize_int8(lw: LinearWeight | FusedWeight) -> LinearWeight:
    """Symmetric per-output-row int8: w ~= scale[n] * q[n, k], |q| <= 127."""
    lw = float_weight(lw)
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
    model.weights_changed()


def quantize_int4(lw: LinearWeight, int8_x: bool = False) -> LinearWeight:
    """Symmetric int4 per group of 32 inputs, fp16 scales: w ~= scale[n, g] * q, q in [-8, 7].
    As in llama.cpp's Q4_0, a group's largest-magnitude weight maps to -8 (the scale takes its
    sign), which uses all 16 levels. Rows are zero-padded to a multiple of 128 inputs.
    ``int8_x``: the product may round x to int8 (see ``LinearWeight``)."""
    lw = float_weight(lw)
    w = lw.weight.float()
    n, k = w.shape
    kp = int4_padded(k)
    groups = F.pad(w, (0, kp - k)).reshape(n, kp // INT4_GROUP, INT4_GROUP)
    extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True))
    scale = (extreme / -8).to(torch.float16)  # quantize against the scale actually stored
    s = scale.float()
    q = torch.where(s != 0, torch.round(groups / s), 0).clamp(-8, 7)
    nib = (q + 8).to(torch.uint8).reshape(n, kp // INT4_BLOCK, INT4_BLOCK)
    k_lo, k_hi = int4_nibble_k()
    packed = (nib[..., k_lo] | (nib[..., k_hi] << 4)).reshape(n, kp // 2)
    return LinearWeight(packed.contiguous(), lw.bias, scale.reshape(n, -1).contiguous(), int8_x)


def quantize_model_int4(model: Transformer, int8_x: bool = True) -> None:
    """Every matrix of every layer, and the output head, to int4 (embeddings stay as is), with
    int8 activations where the kernels have them (twice as fast for drafting several tokens at
    once: 9 tokens through a 0.5B's matrices on one core took 58 ms, now 28)."""
    for layer in model.w["layers"]:
        for name in ("qkv", "o", "gate_up", "down"):
            layer[name] = quantize_int4(layer[name], int8_x)
    model.w["lm_head"] = quantize_int4(model.w["lm_head"], int8_x)
    model.weights_changed()


def _bits_per_weight(w) -> float:
    if isinstance(w, PackedWeight):
        return 8 * w.data.numel() / (w.out_features * w.in_features)
    return 8 * w.element_size()


def _in_features(lw: LinearWeight) -> int | None:
    """None for int4 (its rows are padded)."""
    w = lw.weight
    if isinstance(w, PackedWeight):
        return w.in_features
    return None if w.dtype == torch.uint8 else w.shape[1]


def _wider_than_q4_0(lw: LinearWeight | FusedWeight) -> bool:
    """Whether Q4_0 holds the matrix in fewer bits (and can: inputs a multiple of 32)."""
    parts = lw.parts if isinstance(lw, FusedWeight) else [lw]
    k = _in_features(parts[0])
    if k is None or k % 32:
        return False
    limit = gguf_kernels.Q4_0_BITS
    return any(p.scale is not None or _bits_per_weight(p.weight) > limit for p in parts)


def _take(arena: Arena | None, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8) if arena is None else arena.take(nbytes)


def quantize_q4_0(lw: LinearWeight | FusedWeight, arena: Arena | None = None):
    """GGUF Q4_0 from the matrix's exact values (an fp16 step per 32 inputs, 4.5 bits a
    weight; ggml's rounding), in our kernels' tiles (in ``arena`` if given), with int8
    activations. A matrix already in as few bits (Q4_K, Q4_0, ...) stays as it is."""
    if not _wider_than_q4_0(lw):
        return lw
    exact = float_weight(lw)
    n, k = exact.weight.shape
    rows = _take(arena, n * (k // 32 * 18)).view(n, -1)
    gguf_kernels.quantize_q4_0(exact.weight, out=rows)
    q4_0 = int(gguf.GGMLQuantizationType.Q4_0)
    parts = [LinearWeight(w, int8_x=True) for w in gguf_kernels.pack_parts(q4_0, rows, k, True)]
    if len(parts) > 1:
        return FusedWeight(parts, exact.bias)
    parts[0].bias = exact.bias
    return parts[0]


def _moved(lw: LinearWeight | FusedWeight, arena: Arena) -> LinearWeight | FusedWeight:
    """The same matrix with its GGUF blocks copied into ``arena``."""
    if isinstance(lw, FusedWeight):
        return FusedWeight([_moved(p, arena) for p in lw.parts], lw.bias)
    w = lw.weight
    if not isinstance(w, PackedWeight):
        return lw
    data = arena.take(w.data.numel()).view(w.data.shape).copy_(w.data)
    packed = PackedWeight(w.qtype, w.out_features, w.in_features, data)
    return LinearWeight(packed, lw.bias, lw.scale, lw.int8_x)


def quantize_model_q4_0(model: Transformer) -> None:
    """Every matrix of every layer wider than 4.5 bits a weight, and the output head, to Q4_0
    (embeddings stay as is). The default draft's file holds Q5_0, Q6_K and a Q8_0 head beside
    Q4_K: a step then streams 22% fewer bytes (278 -> 218 MB with the 32K head), and q|k|v,
    Q5_0 with a Q8_0 v in half the layers, becomes one matrix. On a CPU the new matrices and
    the ones kept go into a new arena of huge pages (``hugepages``), so the loaded one is
    freed whole."""
    names = ("qkv", "o", "gate_up", "down")
    slots = [(layer, name) for layer in model.w["layers"] for name in names]
    slots.append((model.w, "lm_head"))
    wide = [_wider_than_q4_0(holder[name]) for holder, name in slots]
    if not any(wide):
        return  # nothing to do (a GGUF draft re-quantized as it was read)
    arena = None
    if model.device.type == "cpu":
        nbytes = 0
        for (holder, name), to_q4_0 in zip(slots, wide):
            lw = holder[name]
            parts = lw.parts if isinstance(lw, FusedWeight) else [lw]
            if to_q4_0:
                nbytes += lw.out_features * (_in_features(parts[0]) // 32 * 18) + 2 * ALIGN
            else:
                packed = [p.weight for p in parts if isinstance(p.weight, PackedWeight)]
                nbytes += sum(w.nbytes() + ALIGN for w in packed)
        arena = Arena(nbytes)
    for (holder, name), to_q4_0 in zip(slots, wide):
        if to_q4_0:
            holder[name] = quantize_q4_0(holder[name], arena)
        elif arena is not None:
            holder[name] = _moved(holder[name], arena)
    model.weights_changed()


def restrict_head(model: Transformer, keep: torch.Tensor) -> None:
    """Keep only the output rows ``keep`` (sorted token ids): the model then returns logits for
    those tokens only, in that order. ``expand_logits`` puts them back in place."""
    lw = model.w["lm_head"]
    model.w["lm_head"] = LinearWeight(
        lw.weight[keep].contiguous(),
        None if lw.bias is None else lw.bias[keep].contiguous(),
        None if lw.scale is None else lw.scale[keep].contiguous(),
        lw.int8_x,
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
