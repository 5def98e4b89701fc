"""Matrices stored as GGUF quantized blocks, multiplied in their file layout or in tiles.

A decode step reads every weight byte once, so a Q4_K_M model is multiplied from its 4.5-6.5
bit blocks directly (``gguf_kernels.h``) rather than dequantized to bf16 (3-6x the bytes).
``pack`` keeps the file's bytes as they are. ``repack`` rearranges Q2_K-Q6_K, Q4_0-Q8_0,
IQ4_NL and IQ4_XS into 8-row tiles (the same bytes, in place, once at load: under a second for
a 1.5B model, nothing to cache), in which one instruction multiplies 4 k of 8 weight rows by one
x row: a verify pass of several tokens costs far less than in the file's row-by-row layout.
``linear`` multiplies either layout, by default with x rounded to int8 for integer dot products
(per row and block of 32 k for Q4_0 ... Q8_0, IQ4_NL and IQ4_XS, as llama.cpp's Q8_0
activations, IQ4_XS's 6-bit block scales applied in fp32; for K-quants one step per 256 k
refined per 32 k by an integer factor, see ``quantize_x_reference``), or (file layout only)
with fp32 x against the exact weight values (``int8_x=False``). Both are batch invariant: a
row's output bits do not depend on how many rows share the call.

Where our kernels are off (``SPECDEC_KERNELS=torch``, other CPUs) the same results, up to
float rounding, come from ``gguf.quants.dequantize`` and torch: correct, not fast.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from specdec import kernels, platform

_threads = platform.kernel_threads  # shared by every kernel

Q = gguf.GGMLQuantizationType
SUPPORTED: frozenset[int] = frozenset(  # the file types we multiply
    int(t)
    for t in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
    + (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)
)
FLOATS = frozenset(int(t) for t in (Q.F32, Q.F16, Q.BF16))  # int8_x does not apply to these
# the file's type -> our layout of it in 8-row tiles (``repack``; codes of gguf_kernels.h)
TILED = {int(t): code for t, code in ((Q.Q4_0, 102), (Q.Q4_1, 103), (Q.Q5_0, 106), (Q.Q5_1, 107))}
TILED |= {int(t): code for t, code in ((Q.Q8_0, 108), (Q.Q2_K, 110), (Q.Q3_K, 111))}
TILED |= {int(t): code for t, code in ((Q.Q4_K, 112), (Q.Q5_K, 113), (Q.Q6_K, 114))}
TILED |= {int(t): code for t, code in ((Q.IQ4_NL, 120), (Q.IQ4_XS, 123))}
FILE_TYPE = {tiled: file for file, tiled in TILED.items()}
K_QUANTS = frozenset(int(t) for t in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K))
K_QUANTS |= {t for t, f in FILE_TYPE.items() if f in K_QUANTS}
# where a block's fp16 scales sit (byte offsets, with Q4_1/Q5_1's m and the K-quants' dmin): the
# tests and tools that write random blocks (gguf quantizes neither the K-quants nor the IQ4s)
# keep these finite and small
SCALE_BYTES: dict[int, tuple[int, ...]] = {
    int(t): at
    for t, at in (
        (Q.Q4_0, (0,)),
        (Q.Q4_1, (0, 2)),
        (Q.Q5_0, (0,)),
        (Q.Q5_1, (0, 2)),
        (Q.Q8_0, (0,)),
        (Q.Q2_K, (80, 82)),
        (Q.Q3_K, (108,)),
        (Q.Q4_K, (0, 2)),
        (Q.Q5_K, (0, 2)),
        (Q.Q6_K, (208,)),
        (Q.IQ4_NL, (0,)),
        (Q.IQ4_XS, (0,)),
    )
}


def supported(qtype: int) -> bool:
    return int(qtype) in SUPPORTED


def type_name(qtype: int) -> str:
    qtype = int(qtype)
    if qtype in FILE_TYPE:
        return Q(FILE_TYPE[qtype]).name + " in 8-row tiles"
    try:
        return Q(qtype).name
    except ValueError:
        return f"GGML type {qtype}"


@dataclass(eq=False)
class PackedWeight:
    """A [out_features, in_features] matrix as GGUF blocks: ``data`` uint8 [out, row_bytes]."""

    qtype: int
    out_features: int
    in_features: int
    data: torch.Tensor

    def nbytes(self) -> int:
        return self.data.numel()


def row_bytes(qtype: int, in_features: int) -> int:
    qtype = FILE_TYPE.get(int(qtype), int(qtype))  # tiles hold the same bytes
    block, size = gguf.GGML_QUANT_SIZES[Q(qtype)]
    if in_features % block:
        raise ValueError(
            f"{type_name(qtype)}: {in_features} inputs are not whole blocks of {block}"
        )
    return in_features // block * size


def pack(qtype: int, raw: torch.Tensor, out_features: int, in_features: int) -> PackedWeight:
    """Wrap the file's bytes of a matrix (uint8, any shape holding out_features rows of
    in_features values in the file's block layout). The bytes are used as they are."""
    if not supported(qtype):
        raise ValueError(f"no GGUF kernel for {type_name(qtype)}")
    need = out_features * row_bytes(qtype, in_features)
    if raw.dtype != torch.uint8 or raw.numel() != need:
        raise ValueError(
            f"{type_name(qtype)} [{out_features}, {in_features}] needs {need} uint8 bytes, "
            f"got {raw.numel()} {raw.dtype}"
        )
    data = raw.reshape(out_features, -1).contiguous()
    return PackedWeight(int(qtype), out_features, in_features, data)


def repack(w: PackedWeight, in_place: bool = False) -> PackedWeight:
    """``w`` rearranged into 8-row tiles where that pays (every quantized type, with a
    multiple of 8 rows, our kernels loaded), else ``w`` itself. A tile holds 8 rows group by
    group so that one instruction multiplies 4 k of all 8 rows by one x row: products of several
    x rows (a verify pass) cost far less than with the file's row-by-row layout, and one x row
    no more.
    The same bytes, so the same memory; ``in_place`` rearranges ``w.data`` itself (the loader's
    copy of the file). The AVX-512 VNNI build interleaves the tiles of Q4_0-Q8_0, IQ4_NL, Q4_K
    and Q6_K in pairs (16 rows per 512-bit instruction), so tiles are read only by the build
    that made them.
    Tiles multiply with int8 x only (``linear(..., int8_x=True)``)."""
    lib = kernels.library()
    if lib is None or w.qtype not in TILED or w.out_features % 8:
        return w
    data = w.data if in_place else w.data.clone()
    tiled = lib.gguf_repack(w.qtype, data.data_ptr(), w.out_features, w.in_features, _threads())
    if tiled < 0:
        raise ValueError(f"cannot tile {type_name(w.qtype)} [{w.out_features}, {w.in_features}]")
    return PackedWeight(tiled, w.out_features, w.in_features, data)


Q4_0_BITS = 8 * 18 / 32  # bits a weight of Q4_0 (an fp16 step per 32 4-bit values): 4.5


def pack_parts(qtype: int, rows: torch.Tensor, in_features: int, tiles: bool) -> list:
    """Rows of one type (uint8 [N, row_bytes], contiguous) as GGUF matrices, tiled in place
    (``repack``) if ``tiles``. Tiles take 8 rows at a time, so the rows past the last full
    tile (a restricted head's special tokens) are a matrix of their own, in the file's
    layout."""
    n = rows.shape[0]
    tiled = n // 8 * 8 if tiles else n
    bounds = [(0, tiled), (tiled, n)] if 0 < tiled < n else [(0, n)]
    parts = [pack(qtype, rows[a:b], b - a, in_features) for a, b in bounds]
    return [repack(w, in_place=True) for w in parts] if tiles else parts


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(x: torch.Tensor, w: PackedWeight, bias, out) -> None:
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(f"x must be [M, {w.in_features}], got {tuple(x.shape)}")
    m, n = x.shape[0], w.out_features
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,)):
        raise ValueError(f"bias must be float32 [{n}], got {bias.dtype} {tuple(bias.shape)}")
    if out is not None:
        if out.dtype != torch.float32 or out.device.type != "cpu":
            raise ValueError(f"out must be a CPU float32 tensor, got {out.dtype} on {out.device}")
        if out.shape != (m, n) or out.stride(1) != 1 or (m > 1 and out.stride(0) < n):
            raise ValueError(f"out must be [{m}, {n}] with unit column stride, got {out.shape}")


def _check_tiles(weights: list[PackedWeight], int8_x: bool) -> None:
    if not int8_x and any(w.qtype in FILE_TYPE for w in weights):
        raise ValueError("weights in 8-row tiles multiply with int8 x only (int8_x=True)")


def linear(
    x: torch.Tensor,
    w: PackedWeight,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    int8_x: bool = True,
) -> torch.Tensor:
    """y = x @ W.T + bias for x fp32 [M, in]: fp32 [M, out], written into ``out`` if given (a
    [M, out] view with unit column stride, e.g. a column slice of a wider tensor)."""
    _check(x, w, bias, out)
    _check_tiles([w], int8_x)
    m, n = x.shape[0], w.out_features
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    lib = kernels.library()
    if lib is None or m == 0:
        xs = quantize_x_reference(x, w.qtype).float() if int8_x else x.float()
        out.copy_(F.linear(xs, dequantize(w), bias))
        return out
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.contiguous().float()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    ldy = out.stride(0) if m > 1 else n
    k, x_ptr, b_ptr, y_ptr = w.in_features, x.data_ptr(), _ptr(bias), out.data_ptr()
    rc = lib.gguf_linear(
        w.qtype,
        x_ptr,
        w.data.data_ptr(),
        b_ptr,
        y_ptr,
        ldy,
        m,
        n,
        k,
        int8_x,
        _threads(),
    )
    if rc != 0:
        raise ValueError(f"no GGUF kernel for {type_name(w.qtype)}")
    return out


class Stack:
    """Matrices of any supported types with the same inputs, stacked along the output (q|k|v
    of a Q4_K_M layer: Q4_K and Q6_K): ``linear_stack`` multiplies them in one kernel call,
    x rounded once. The call's arguments are built here once, not per token."""

    def __init__(self, weights: list[PackedWeight]):
        if not 1 <= len(weights) <= 8 or len({w.in_features for w in weights}) != 1:
            raise ValueError("a stack is 1 to 8 matrices with the same number of inputs")
        self.weights = weights
        self.in_features = weights[0].in_features
        self.out_features = sum(w.out_features for w in weights)
        n = len(weights)
        self._args = (
            n,
            (ctypes.c_int * n)(*[w.qtype for w in weights]),
            (ctypes.c_void_p * n)(*[w.data.data_ptr() for w in weights]),
            (ctypes.c_long * n)(*[w.out_features for w in weights]),
        )


def linear_stack(
    x: torch.Tensor, stack: Stack, bias: torch.Tensor | None = None, int8_x: bool = True
) -> torch.Tensor:
    """y = x @ [W_0; W_1; ...].T + bias for x fp32 [M, in], contiguous: fp32 [M, out]."""
    _check_tiles(stack.weights, int8_x)
    m, n = x.shape[0], stack.out_features
    lib = kernels.library()
    if lib is None or m == 0:
        out = torch.empty(m, n, dtype=torch.float32)
        col = 0
        for w in stack.weights:
            linear(x, w, out=out[:, col : col + w.out_features], int8_x=int8_x)
            col += w.out_features
        return out if bias is None else out.add_(bias)
    if x.dim() != 2 or x.shape[1] != stack.in_features or x.dtype != torch.float32:
        raise ValueError(f"x must be float32 [M, {stack.in_features}], got {x.dtype} {x.shape}")
    out = torch.empty(m, n, dtype=torch.float32)
    x = x.contiguous()
    b_ptr = None if bias is None else bias.data_ptr()
    rc = lib.gguf_linear_parts(
        *stack._args,
        x.data_ptr(),
        b_ptr,
        out.data_ptr(),
        n,
        m,
        stack.in_features,
        int8_x,
        _threads(),
    )
    if rc != 0:
        raise ValueError(
            "no GGUF kernel for " + ", ".join(type_name(w.qtype) for w in stack.weights)
        )
    return out


def _dequantize_rows_torch(w: PackedWeight, rows: torch.Tensor | None) -> torch.Tensor:
    if w.qtype in FILE_TYPE:  # only our kernels make tiles, so only they read them
        raise RuntimeError(f"{type_name(w.qtype)}: the kernel library is not loaded")
    raw = w.data if rows is None else w.data[rows]
    values = gguf.quants.dequantize(raw.numpy(), Q(w.qtype))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(
        -1, w.in_features
    )


def quantize_q4_0(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 rows [R, K] (K a multiple of 32) as Q4_0 rows [R, K / 32 * 18] (uint8, into
    ``out`` if given), bit for bit as ``gguf.quants.quantize`` (ggml's reference rounding)."""
    if x.dim() != 2 or x.shape[1] % 32:
        raise ValueError(f"Q4_0 needs rows of a multiple of 32 values, got {tuple(x.shape)}")
    shape = (x.shape[0], x.shape[1] // 32 * 18)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8)
    elif out.shape != shape or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous uint8 {shape}, got {tuple(out.shape)}")
    x = x.float().contiguous()
    lib = kernels.library()
    if lib is None:
        q = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q4_0)
        return out.copy_(torch.from_numpy(np.ascontiguousarray(q)))
    lib.gguf_quantize_q4_0(_ptr(x), x.numel() // 32, _ptr(out), _threads())
    return out


def dequantize_rows(w: PackedWeight, rows: torch.Tensor) -> torch.Tensor:
    """fp32 [len(rows), in] for rows (int64 ids, e.g. tokens of an embedding matrix)."""
    rows = rows.reshape(-1).to(torch.int64).contiguous()
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= w.out_features):
        raise ValueError(f"row ids must be in [0, {w.out_features})")
    lib = kernels.library()
    if lib is None:
        return _dequantize_rows_torch(w, rows)
    out = torch.empty(rows.numel(), w.in_features, dtype=torch.float32)
    lib.gguf_dequantize(
        w.qtype,
        _ptr(w.data),
        _ptr(rows),
        rows.numel(),
        w.out_features,
        w.in_features,
        _ptr(out),
        _threads(),
    )
    return out


def dequantize(w: PackedWeight, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 [out, in] matrix (into ``out`` if given), bit for bit as
    ``gguf.quants.dequantize`` gives it."""
    shape = (w.out_features, w.in_features)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif out.shape != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 {shape}, got {tuple(out.shape)}")
    lib = kernels.library()
    if lib is None:
        return out.copy_(_dequantize_rows_torch(w, None))
    lib.gguf_dequantize(
        w.qtype,
        _ptr(w.data),
        None,
        w.out_features,
        w.out_features,
        w.in_features,
        _ptr(out),
        _threads(),
    )
    return out


def x_block(qtype: int) -> int:
    """k per int8 step of x in the int8_x mode (0: floats, x is not rounded)."""
    qtype = int(qtype)
    return 0 if qtype in FLOATS else 256 if qtype in K_QUANTS else 32


def quantize_x_reference(x: torch.Tensor, qtype: int) -> torch.Tensor:
    """float64 x [M, K] as the int8_x mode rounds it for weights of ``qtype``, in fp32 steps as
    the kernel takes them. 32-blocks: per row and block of 32 k, round_even(x * (127 / amax))
    * (amax / 127). K-quants: per group of 256 k with largest |x| amax and block j of 32 k with
    largest |x| a_j, e_j = ceil(32 a_j / amax) in 1..32 and x ~ round_even(x * 4064 / (amax *
    e_j)) * (amax / 4064) * e_j: a step per block at most amax / 4064 above its own a_j / 127,
    while the kernel's sums stay integer (e_j scales the weights' integer scales).
    Float weight types take x as it is."""
    block = x_block(qtype)
    if block == 0:
        return x.double()
    m, k = x.shape
    if block == 256:
        blocks = x.float().reshape(m, -1, 8, 32)
        a_j = blocks.abs().amax(-1, keepdim=True)
        amax = a_j.amax(-2, keepdim=True)
        live = amax > 0
        safe = torch.where(live, amax, torch.ones_like(amax))
        e = torch.where(live, torch.ceil(32 * a_j / safe).clamp(1, 32), torch.ones_like(a_j))
        inv = torch.where(live, 4064.0 / (safe * e), torch.zeros_like(e))
        q = torch.round(blocks * inv).clamp(-127, 127).double()
        base = (amax / 4064.0).double()
        return (q * base * e.double()).reshape(m, k)
    kp = -(-k // block) * block
    blocks = F.pad(x.float(), (0, kp - k)).reshape(m, -1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv).clamp(-127, 127).double()
    return (q * (amax / 127.0).double()).reshape(m, kp)[:, :k]
