"""STAND-IN for the GGUF kernel API (dequantize with the gguf package, multiply with torch).

Same functions and semantics as the real module being written in parallel; ``int8_x`` is
ignored (products are exact). ``linear`` keeps the dequantized matrix after its first use (to
keep tests quick; the real kernels multiply the blocks as stored). The merger replaces this
file with the real one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

_T = GGMLQuantizationType
SUPPORTED: frozenset[int] = frozenset(
    int(t) for t in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0, _T.Q4_K, _T.Q5_K, _T.Q6_K)
)


def supported(qtype: int) -> bool:
    return int(qtype) in SUPPORTED


@dataclass
class PackedWeight:
    qtype: int
    out_features: int
    in_features: int
    raw: torch.Tensor  # uint8 [out, row_bytes], the file's block layout
    _dense: torch.Tensor | None = None

    def nbytes(self) -> int:
        return self.raw.numel()


def pack(qtype: int, raw: torch.Tensor, out_features: int, in_features: int) -> PackedWeight:
    if not supported(qtype):
        raise ValueError(f"unsupported GGUF type {qtype}")
    block, size = GGML_QUANT_SIZES[_T(qtype)]
    if in_features % block or tuple(raw.shape) != (out_features, in_features // block * size):
        raise ValueError(f"raw bytes {tuple(raw.shape)} do not fit [{out_features}, {in_features}]")
    return PackedWeight(int(qtype), out_features, in_features, raw.contiguous())


def _dequant(qtype: int, raw: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(_gguf_dequantize(raw.numpy(), _T(qtype))))


def dequantize(w: PackedWeight) -> torch.Tensor:
    return _dequant(w.qtype, w.raw).reshape(w.out_features, w.in_features)


def dequantize_rows(w: PackedWeight, rows: torch.Tensor) -> torch.Tensor:
    return _dequant(w.qtype, w.raw[rows.long()]).reshape(len(rows), w.in_features)


def linear(x, w: PackedWeight, bias=None, out=None, int8_x=True) -> torch.Tensor:
    if w._dense is None:
        w._dense = dequantize(w)
    y = F.linear(x.float(), w._dense, None if bias is None else bias.float())
    if out is None:
        return y
    out.copy_(y)
    return out
