"""The decoder layers of a forward pass in one kernel call (``decoder_layers`` in cpu.cpp).

``Transformer.forward`` runs nine kernels a layer; called one by one from Python, each costs
~7 us of wrappers, tensor allocation and ctypes, ~1.5 ms a pass: 14% of a draft step of the
0.5B, 5% of a target pass of the 1.5B. Where every matrix of every layer is a GGUF matrix (the
native models), the whole loop runs in C instead: the same kernels in the same order on the
same inputs, so the same bits as the Python loop (tested), which stays the path everywhere else
(torch ops, CUDA, bf16/int4 weights, q/k norms).
"""

from __future__ import annotations

import ctypes

import torch

from specdec import kernels, ops, platform
from specdec.kernels import gguf as gguf_kernels


class _Mats(ctypes.Structure):  # cpu.cpp's Mats: a stack of GGUF matrices
    _fields_ = [
        ("P", ctypes.c_int),
        ("int8x", ctypes.c_int),
        ("qtypes", ctypes.c_void_p),
        ("ws", ctypes.c_void_p),
        ("Ns", ctypes.c_void_p),
        ("N", ctypes.c_long),
        ("bias", ctypes.c_void_p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", _Mats),
        ("o", _Mats),
        ("gate_up", _Mats),
        ("down", _Mats),
        ("attn_norm", ctypes.c_void_p),
        ("mlp_norm", ctypes.c_void_p),
    ]


def _mats(lw) -> _Mats | None:
    """The C view of one layer matrix, or None if it is not (all) GGUF."""
    if isinstance(lw, ops.FusedWeight):
        stack, bias, int8_x = lw.stack(), lw.bias, lw.parts[0].int8_x
    elif isinstance(lw, ops.LinearWeight) and isinstance(lw.weight, gguf_kernels.PackedWeight):
        stack, bias, int8_x = lw.stack(), lw.bias, lw.int8_x
    else:
        return None
    known = gguf_kernels.SUPPORTED | set(gguf_kernels.FILE_TYPE)  # file types and tiles
    if stack is None or not all(w.qtype in known for w in stack.weights):
        return None
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return None
    n, qtypes, ws, ns = stack._args
    return _Mats(
        n,
        int(int8_x),
        ctypes.addressof(qtypes),
        ctypes.addressof(ws),
        ctypes.addressof(ns),
        stack.out_features,
        None if bias is None else bias.data_ptr(),
    )


class LayerPlan:
    """The layers of one model as ``decoder_layers`` reads them; built once, or None (see
    ``plan``). Holds the Python objects whose memory the C structs point into."""

    def __init__(self, layers: list[_Layer], intermediate: int, keep: list):
        self.layers = (_Layer * len(layers))(*layers)
        self.count = len(layers)
        self.intermediate = intermediate  # the MLP's width (every layer's down matrix's inputs)
        self._keep = keep


def plan(model) -> LayerPlan | None:
    """A plan for ``model`` (a Transformer) if every layer can run in C, else None."""
    cfg = model.config
    if cfg.qk_norm or model.device.type != "cpu" or model.act_dtype != torch.float32:
        return None
    layers, keep = [], []
    for layer in model.w["layers"]:
        mats = [_mats(layer[name]) for name in ("qkv", "o", "gate_up", "down")]
        norms = [layer["attn_norm"], layer["mlp_norm"]]
        if any(m is None for m in mats) or any(
            n.dtype != torch.float32 or not n.is_contiguous() or n.device.type != "cpu"
            for n in norms
        ):
            return None
        keep += [layer[name].stack()._args for name in ("qkv", "o", "gate_up", "down")]
        layers.append(_Layer(*mats, norms[0].data_ptr(), norms[1].data_ptr()))
    widths = {layer["down"].stack().in_features for layer in model.w["layers"]}
    return LayerPlan(layers, widths.pop(), keep) if len(widths) == 1 else None


def available() -> bool:
    lib = kernels.library()
    return lib is not None and hasattr(lib, "decoder_layers")


def run(
    p: LayerPlan,
    cfg,
    x: torch.Tensor,
    cache,
    rows: torch.Tensor,
    start: torch.Tensor,
    num_new: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float,
) -> None:
    """The layers over x [B, T, hidden] (fp32, contiguous; the residual stream, in place), as
    ``Transformer.forward``'s loop, writing the new keys and values into ``cache``."""
    bsz, t_len, hidden = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("the fused layer loop needs x as contiguous fp32")
    if cache.k[0].dtype != torch.float32 or not all(t.is_contiguous() for t in cache.k + cache.v):
        raise ValueError("the fused layer loop needs a contiguous fp32 KV cache")
    kcs = (ctypes.c_void_p * p.count)(*[t.data_ptr() for t in cache.k])
    vcs = (ctypes.c_void_p * p.count)(*[t.data_ptr() for t in cache.v])
    pos = positions.contiguous().long()
    mask = None if attn_mask is None else attn_mask.to(torch.uint8).contiguous()
    rows, start, num_new = (t.contiguous() for t in (rows, start, num_new))
    rc = kernels.library().decoder_layers(
        ctypes.addressof(p.layers),
        p.count,
        kcs,
        vcs,
        x.data_ptr(),
        bsz,
        t_len,
        hidden,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        p.intermediate,
        pos.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        rows.data_ptr(),
        start.data_ptr(),
        num_new.data_ptr(),
        None if mask is None else mask.data_ptr(),
        0 if mask is None else mask.shape[-1],
        cache.k[0].shape[2],
        float(scale),
        float(cfg.rms_norm_eps),
        platform.kernel_threads(),
    )
    if rc != 0:
        raise RuntimeError("decoder_layers: a layer matrix has no kernel")
