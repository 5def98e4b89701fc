"""The three heavy operations of a decoder step, each with two implementations.

On x86-64 CPUs our kernels (``specdec.kernels``) run them with fp32 activations over fp32,
bf16, int8 or int4 weights, batch-invariantly. Elsewhere (CUDA, other CPUs) plain torch does the
same math in the model's dtype. The model calls only these functions, so it never needs to know.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdec import kernels, platform
from specdec.kernels import gguf as gguf_kernels

set_num_threads = platform.set_kernel_threads  # threads of our kernels (torch's pool: apart)
_threads = platform.kernel_threads


def use_kernels(device: torch.device) -> bool:
    return device.type == "cpu" and kernels.library() is not None


@dataclass
class LinearWeight:
    """y = x @ weight.T * scale + bias, weight [out, in] in its storage dtype, or a GGUF
    matrix in its own quantization (``gguf_kernels.PackedWeight``; ``scale`` unused).

    ``scale`` is set only for quantized weights: int8 ``weight`` [out, in] with an fp32 scale
    per output row, or int4: ``weight`` uint8 [out, ceil(in/128)*64] (two 4-bit values a byte,
    placed as ``int4_nibble_k`` says; rows zero-padded to a multiple of 128 inputs) with an
    fp16 scale per group of 32 inputs, [out, ceil(in/128)*4].

    ``int8_x`` (int4 and GGUF matrices) lets our kernels round x to int8 per row and block
    of inputs, for the CPU's int8 dot-product instructions: about twice as fast, slightly less
    precise. For int4 it is meant for drafters, where any q they really sample from keeps
    decoding exact; a GGUF target uses it by default too (every decoding method then runs the
    same products, so greedy outputs stay identical across methods). Where no such
    kernel runs (other CPUs, torch), int4 keeps x in floating point."""

    weight: torch.Tensor | gguf_kernels.PackedWeight
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    int8_x: bool = False
    _stack: gguf_kernels.Stack | None = field(default=None, repr=False, compare=False)

    def stack(self) -> gguf_kernels.Stack:
        """A GGUF matrix as a one-part ``Stack`` (built once)."""
        if self._stack is None:
            self._stack = gguf_kernels.Stack([self.weight])
        return self._stack

    @property
    def out_features(self) -> int:
        w = self.weight
        return w.out_features if isinstance(w, gguf_kernels.PackedWeight) else w.shape[0]

    def to(self, device: torch.device) -> LinearWeight:
        def move(t):
            return None if t is None else t.to(device)

        return LinearWeight(move(self.weight), move(self.bias), move(self.scale), self.int8_x)


@dataclass
class FusedWeight:
    """Several matrices side by side along the output (q|k|v, gate|up) that cannot be one
    matrix because their formats differ (a Q4_K_M file mixes Q4_K and Q6_K within a layer).
    ``linear`` writes each part's product into its column slice of one output."""

    parts: list[LinearWeight]  # without biases
    bias: torch.Tensor | None = None
    _stack: gguf_kernels.Stack | None = field(default=None, repr=False, compare=False)

    def stack(self) -> gguf_kernels.Stack | None:
        """All parts as one GGUF ``Stack`` (one kernel call), if they all are GGUF matrices
        with the same activation mode."""
        if self._stack is None and all(
            isinstance(p.weight, gguf_kernels.PackedWeight) and p.int8_x == self.parts[0].int8_x
            for p in self.parts
        ):
            self._stack = gguf_kernels.Stack([p.weight for p in self.parts])
        return self._stack

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


INT4_GROUP = 32  # inputs per int4 scale
INT4_BLOCK = 64  # inputs per 32-byte unit of the packed layout
INT4_ROW = 128  # rows are padded to a multiple of this many inputs (AVX-512 reads two units)


def int4_padded(in_features: int) -> int:
    """Inputs an int4 row is stored with (and x is packed to): a multiple of INT4_ROW."""
    return -(-in_features // INT4_ROW) * INT4_ROW


def int4_nibble_k() -> tuple[torch.Tensor, torch.Tensor]:
    """Where each byte of a 32-byte int4 block gets its two values: (k of the low nibble, k of
    the high nibble), both [32], k within the 64-input block. The kernel reads the block as 8
    uint32 lanes j of 8 nibbles p, nibble p of lane j being k = 32*(j%2) + 4*p + j//2, so that
    lane j holds group j%2 only (see I4 in cpu.cpp)."""
    byte = torch.arange(32)
    lane, p_lo = byte // 4, 2 * (byte % 4)
    k_lo = 32 * (lane % 2) + 4 * p_lo + lane // 2
    return k_lo, k_lo + 4


def int4_dequantize(lw: LinearWeight, in_features: int) -> torch.Tensor:
    """The fp32 [out, in] matrix an int4 LinearWeight stands for."""
    packed = lw.weight.reshape(lw.weight.shape[0], -1, 32)  # [N, blocks, 32 bytes]
    k_lo, k_hi = (k.to(packed.device) for k in int4_nibble_k())
    q = torch.empty(*packed.shape[:2], INT4_BLOCK, dtype=torch.float32, device=packed.device)
    q[..., k_lo] = (packed & 15).float() - 8
    q[..., k_hi] = (packed >> 4).float() - 8
    q = q.reshape(packed.shape[0], -1) * lw.scale.float().repeat_interleave(INT4_GROUP, dim=1)
    return q[:, :in_features]


def int8_dot(lib) -> bool:
    """Whether a kernel build has the int4 x int8 product (``LinearWeight.int8_x``)."""
    return lib is not None and hasattr(lib, "linear_i4q")


def quantize_x_int8(x: torch.Tensor) -> torch.Tensor:
    """What an ``int8_x`` kernel multiplies in place of x [M, K]: x rounded to int8 steps of
    max|x| / 127 per row and block of 128 inputs (float64, for references and tests)."""
    m, k = x.shape
    kp = int4_padded(k)
    blocks = F.pad(x.float(), (0, kp - k)).reshape(m, -1, INT4_ROW)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # fp32, as the kernel
    q = torch.round(blocks * inv).clamp(-127, 127).double()
    return (q * (amax / 127.0).double()).reshape(m, kp)[:, :k]


def _linear_packed(x: torch.Tensor, lw: LinearWeight, out: torch.Tensor | None = None):
    """A GGUF matrix (the GGUF kernels fall back to torch by themselves where ours are off).
    ``out``: a column slice of a wider output to write into."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).float()
    if out is not None:
        return gguf_kernels.linear(x2.contiguous(), lw.weight, lw.bias, out=out, int8_x=lw.int8_x)
    y = gguf_kernels.linear_stack(x2, lw.stack(), lw.bias, lw.int8_x)
    return y.view(*shape[:-1], lw.weight.out_features)


def _linear_fused(x: torch.Tensor, fw: FusedWeight) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    stack = fw.stack()
    if stack is not None:  # GGUF parts: one call
        y = gguf_kernels.linear_stack(x2.float(), stack, fw.bias, fw.parts[0].int8_x)
        return y.view(*shape[:-1], fw.out_features)
    y = torch.empty(x2.shape[0], fw.out_features, dtype=torch.float32, device=x.device)
    col = 0
    for part in fw.parts:
        n = part.out_features
        if isinstance(part.weight, gguf_kernels.PackedWeight):
            _linear_packed(x2, part, out=y[:, col : col + n])
        else:
            y[:, col : col + n] = linear(x2, part)
        col += n
    if fw.bias is not None:
        y += fw.bias
    return y.view(*shape[:-1], fw.out_features)


def linear(x: torch.Tensor, lw: LinearWeight | FusedWeight) -> torch.Tensor:
    if isinstance(lw, FusedWeight):
        return _linear_fused(x, lw)
    if isinstance(lw.weight, gguf_kernels.PackedWeight):
        return _linear_packed(x, lw)
    lib = kernels.library() if x.device.type == "cpu" else None
    w = lw.weight
    if lib is None:
        if w.dtype == torch.int8:
            w = w.to(x.dtype) * lw.scale.to(x.dtype)[:, None]
        elif w.dtype == torch.uint8:
            w = int4_dequantize(lw, x.shape[-1]).to(x.dtype)
        dt = torch.promote_types(x.dtype, w.dtype)  # fp32 x keeps its precision on bf16 w
        b = None if lw.bias is None else lw.bias.to(dt)
        return F.linear(x.to(dt), w.to(dt), b).to(x.dtype)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous().float()
    m, k = x2.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    args = (_ptr(x2), _ptr(w))
    if w.dtype == torch.bfloat16:
        lib.linear_bf16(*args, _ptr(lw.bias), _ptr(y), m, n, k, _threads())
    elif w.dtype == torch.float32:
        lib.linear_f32(*args, _ptr(lw.bias), _ptr(y), m, n, k, _threads())
    elif w.dtype == torch.int8:
        lib.linear_i8(*args, _ptr(lw.scale), _ptr(lw.bias), _ptr(y), m, n, k, _threads())
    elif w.dtype == torch.uint8:
        blocks = int4_padded(k) // INT4_BLOCK
        if w.shape[1] != blocks * 32 or lw.scale.shape[1] != 2 * blocks:
            raise ValueError(f"int4 weight {tuple(w.shape)} does not fit {k} inputs")
        if lw.scale.dtype != torch.float16 or not (w.is_contiguous() and lw.scale.is_contiguous()):
            raise TypeError("int4 weights need contiguous uint8 data and fp16 group scales")
        fn = lib.linear_i4q if lw.int8_x and int8_dot(lib) else lib.linear_i4
        fn(*args, _ptr(lw.scale), _ptr(lw.bias), _ptr(y), m, n, k, _threads())
    else:
        raise TypeError(f"unsupported weight dtype {w.dtype}")
    return y.view(*shape[:-1], n)


def embed(table: torch.Tensor | gguf_kernels.PackedWeight, tokens: torch.Tensor):
    """Rows ``tokens`` [B,T] of the embedding table; a GGUF table stays quantized and only
    the rows asked for are dequantized."""
    if isinstance(table, gguf_kernels.PackedWeight):
        flat = tokens.reshape(-1).cpu().long()
        rows = gguf_kernels.dequantize_rows(table, flat)
        return rows.view(*tokens.shape, table.in_features)
    return table[tokens.to(table.device)]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    lib = kernels.library() if x.device.type == "cpu" else None
    if lib is None:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (weight.float() * xf).to(x.dtype)
    x2 = x.contiguous().float()
    y = torch.empty_like(x2)
    d = x2.shape[-1]
    lib.rmsnorm(_ptr(x2), _ptr(weight), _ptr(y), x2.numel() // d, d, float(eps), _threads())
    return y


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """x += delta in place (the residual stream), then rmsnorm(x): one pass on our kernels."""
    lib = kernels.library() if x.device.type == "cpu" else None
    if (
        lib is None
        or x.dtype != torch.float32
        or not x.is_contiguous()
        or delta.shape != x.shape
        or weight.dtype != torch.float32
    ):
        x.add_(delta)
        return rmsnorm(x, weight, eps)
    d = x.shape[-1]
    delta = delta.contiguous().float()
    y = torch.empty_like(x)
    lib.add_rmsnorm(
        _ptr(x), _ptr(delta), _ptr(weight), _ptr(y), x.numel() // d, d, float(eps), _threads()
    )
    return y


def attend(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    start: torch.Tensor,
    num_new: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Append the new keys/values to the cache, then attend.

    q [B,T,H,D], k_new/v_new [B,T,KVH,D], caches [R,KVH,S,D]; rows/start/num_new [B] (int64,
    on the CPU). Query t of entry b sees cache slots <= start[b] + min(t, num_new[b]-1), or,
    with ``mask`` [B,T,MS] (bool), exactly the slots where the mask is True.
    Returns [B,T,H,D].
    """
    bsz, t_len, n_heads, d = q.shape
    n_kv = k_new.shape[2]
    s_max = k_cache.shape[2]
    lib = kernels.library() if q.device.type == "cpu" else None
    if lib is not None:
        q, k_new, v_new = (t.contiguous().float() for t in (q, k_new, v_new))
        out = torch.empty_like(q)
        m = None if mask is None else mask.to(torch.uint8).contiguous()
        lib.attend(
            _ptr(q),
            _ptr(k_new),
            _ptr(v_new),
            _ptr(k_cache),
            _ptr(v_cache),
            _ptr(rows),
            _ptr(start),
            _ptr(num_new),
            _ptr(m),
            0 if m is None else m.shape[-1],
            _ptr(out),
            bsz,
            t_len,
            n_heads,
            n_kv,
            d,
            s_max,
            float(scale),
            _threads(),
        )
        return out
    return _attend_torch(q, k_new, v_new, k_cache, v_cache, rows, start, num_new, mask, scale)


def _attend_torch(q, k_new, v_new, k_cache, v_cache, rows, start, num_new, mask, scale):
    dev = q.device
    bsz, t_len, n_heads, d = q.shape
    ar = torch.arange(t_len)
    valid = ar[None, :] < num_new[:, None]  # [B,T]
    b_idx, t_idx = valid.nonzero(as_tuple=True)
    slots = start[b_idx] + t_idx
    r_idx = rows[b_idx]
    k_cache[r_idx.to(dev), :, slots.to(dev)] = k_new[b_idx.to(dev), t_idx.to(dev)].to(k_cache.dtype)
    v_cache[r_idx.to(dev), :, slots.to(dev)] = v_new[b_idx.to(dev), t_idx.to(dev)].to(v_cache.dtype)
    if mask is None:
        s_used = int((start + num_new).max())
        last = start[:, None] + torch.minimum(ar[None, :], (num_new - 1)[:, None])  # [B,T]
        mask = torch.arange(s_used)[None, None, :] <= last[:, :, None]
    else:
        s_used = mask.shape[-1]
    keys = k_cache[rows.to(dev), :, :s_used]  # [B,KVH,S,D]
    vals = v_cache[rows.to(dev), :, :s_used]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).to(keys.dtype),
        keys,
        vals,
        attn_mask=mask.to(dev)[:, None],
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2).to(q.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up for gate_up = [gate | up] along the last dimension."""
    inter = gate_up.shape[-1] // 2
    lib = kernels.library() if gate_up.device.type == "cpu" else None
    if lib is None:
        gate, up = gate_up.split(inter, dim=-1)
        return F.silu(gate) * up
    gu = gate_up.contiguous().float()
    out = torch.empty(*gu.shape[:-1], inter, dtype=torch.float32)
    lib.silu_mul(_ptr(gu), _ptr(out), gu.numel() // (2 * inter), inter, _threads())
    return out


def rope_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused q|k|v output [B,T,(H+2*KVH)*D] into q [B,T,H,D], k, v [B,T,KVH,D], with
    rotary embedding applied to q and k (as ``rope``): on our kernels one pass that writes q
    and k contiguous, instead of two copies and two calls."""
    b, t, _ = qkv.shape
    q_w, kv_w = heads * head_dim, kv_heads * head_dim
    v = qkv[..., q_w + kv_w :].reshape(b, t, kv_heads, head_dim)
    lib = kernels.library() if qkv.device.type == "cpu" else None
    if lib is None or qkv.dtype != torch.float32 or qkv.stride(-1) != 1:
        q, k = qkv[..., :q_w], qkv[..., q_w : q_w + kv_w]
        q = rope(q.reshape(b, t, heads, head_dim), positions, cos, sin)
        return q, rope(k.reshape(b, t, kv_heads, head_dim), positions, cos, sin), v
    flat = qkv.reshape(b * t, -1)
    qk = torch.empty(b * t * (q_w + kv_w), dtype=torch.float32)
    q, k = qk[: b * t * q_w], qk[b * t * q_w :]
    pos = positions.contiguous().long()
    lib.rope_qk(
        _ptr(flat),
        flat.stride(0),
        _ptr(pos),
        _ptr(cos),
        _ptr(sin),
        b * t,
        heads,
        kv_heads,
        head_dim,
        _ptr(q),
        _ptr(k),
        _threads(),
    )
    return q.view(b, t, heads, head_dim), k.view(b, t, kv_heads, head_dim), v


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding of x [B,T,H,D] at positions [B,T] from tables [P,D] (rotate-half
    convention: the first and second halves of each head form the pairs)."""
    lib = kernels.library() if x.device.type == "cpu" else None
    if lib is None:
        pos = positions.to(x.device)
        c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * c + rotated * s
    out = x.float()
    out = out.contiguous() if not out.is_contiguous() else out.clone()  # rotated in place
    pos = positions.contiguous().long()
    b, t, h, d = out.shape
    lib.rope(_ptr(out), _ptr(pos), _ptr(cos), _ptr(sin), b * t, h, d, _threads())
    return out
