"""Read a GGUF file natively: the model config from its metadata, its tensors by role.

Quantized matrices stay in the file's own block layout (``kernels.gguf.PackedWeight``), their
bytes copied once into huge pages (``hugepages``; neighbours of one type, q|k and gate|up, into
one matrix); the embedding table stays in the memory-mapped file. Everything a user can get
wrong (not a GGUF file, truncated data, an architecture or quantization type we cannot run,
shapes that disagree with the metadata) is checked when the file is opened, before any weight
is read, and reported in one line naming the file and the tensor.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from specdec.config import ModelConfig, UnsupportedModelError
from specdec.hugepages import ALIGN, Arena
from specdec.kernels import gguf as gguf_kernels
from specdec.ops import FusedWeight, LinearWeight

T = GGMLQuantizationType
DENSE = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# llama.cpp's converter interleaves the two RoPE halves of each q/k head for these (Mistral
# files use the llama architecture)
PERMUTED_QK = {"llama"}
# a folder in the cache that stands for a GGUF file: tokenizer files, config.json and this
SOURCE_FILE = "gguf.json"


class GGUFError(ValueError):
    """A GGUF file we cannot run (one-line message naming the file)."""


def type_name(qtype: int) -> str:
    try:
        return T(qtype).name
    except ValueError:
        return f"type {qtype}"


def source_of(path: str | Path) -> Path | None:
    """The GGUF file behind ``path``: itself if it is a .gguf file, the file a cache folder
    points at (``SOURCE_FILE``), or None for an HF-format folder."""
    path = Path(path)
    if path.is_file():
        return path
    pointer = path / SOURCE_FILE
    if not pointer.is_file():
        return None
    try:
        src = Path(json.loads(pointer.read_text())["gguf"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise GGUFError(f"corrupt {pointer}: {exc}") from exc
    if not src.is_file():
        raise GGUFError(f"{pointer} points at {src}, which no longer exists: pull it again")
    return src


def transformers_source(path: str | Path) -> tuple[Path, dict]:
    """Where transformers' ``from_pretrained`` reads a model of ours: (folder, extra keywords).
    A GGUF-backed folder holds no weights, so transformers reads (and dequantizes) the file."""
    gguf = source_of(path)
    if gguf is None:
        return Path(path), {}
    return gguf.parent, {"gguf_file": gguf.name}


# GGUF value types -> struct formats (little-endian); 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_SCALARS[12] = "d"
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass
class TensorInfo:
    name: str
    qtype: T
    shape: tuple[int, ...]  # torch order: [out, in] for a matrix (GGUF lists it reversed)
    offset: int  # from the start of the file
    nbytes: int


class GGUFFile:
    """The header of a GGUF file (metadata, tensor directory) and its tensors' bytes, mapped.

    Our own small parser: gguf's ``GGUFReader`` decodes every token string and merge of the
    tokenizer into numpy objects (half a minute and 500 MB for a Qwen file); we skip arrays."""

    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():
            raise GGUFError(f"GGUF file not found: {path}")
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
        self.data = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable views
        # the header is read through a plain buffer: a numpy slice per value cost ~2 us, and a
        # Qwen file's tokenizer arrays hold 300K strings (1.1 s a file, now ~0.1 s)
        self._buf = memoryview(self.data)
        self._pos = 4
        try:
            self._parse()
        except (struct.error, OverflowError, MemoryError):
            raise GGUFError(f"{path}: truncated or corrupt GGUF header") from None
        finally:
            self._buf.release()  # (a live view would keep the mapping alive)

    def _take(self, fmt: str):
        vals = struct.unpack_from("<" + fmt, self._buf, self._pos)
        self._pos += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def _string(self) -> str:
        n = self._take("Q")
        if self._pos + n > len(self._buf):
            raise struct.error("string past the end")
        raw = self._buf[self._pos : self._pos + n].tobytes()
        self._pos += n
        return raw.decode("utf-8", "replace")

    def _skip_strings(self, count: int) -> None:
        """Past ``count`` strings (an array's: the tokens, the merges) without decoding them."""
        length, buf, pos, end = _U64.unpack_from, self._buf, self._pos, len(self._buf)
        for _ in range(count):
            pos += 8 + length(buf, pos)[0]
            if pos > end:
                raise struct.error("string past the end")
        self._pos = pos

    def _value(self, vtype: int):
        if vtype in _SCALARS:
            return self._take(_SCALARS[vtype])
        if vtype == _STRING:
            return self._string()
        if vtype != _ARRAY:
            raise GGUFError(f"{self.path}: corrupt metadata (value type {vtype})")
        item, count = self._take("IQ")
        if item in _SCALARS:  # skipped, not decoded: no array is needed to run the model
            self._pos += count * struct.calcsize(_SCALARS[item])
        elif item == _STRING:
            self._skip_strings(count)
        else:
            for _ in range(count):
                self._value(item)
        if self._pos > len(self._buf):
            raise struct.error("array past the end")
        return None

    def _parse(self) -> None:
        version, n_tensors, n_kv = self._take("IQQ")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        self.meta = {}
        for _ in range(n_kv):
            key = self._string()
            self.meta[key] = self._value(self._take("I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._take("I")
            dims = struct.unpack_from(f"<{n_dims}Q", self.data, self._pos)
            self._pos += 8 * n_dims
            qtype, offset = self._take("IQ")
            infos.append((name, qtype, tuple(int(d) for d in reversed(dims)), offset))
        align = int(self.meta.get("general.alignment") or 32)
        start = -(-self._pos // align) * align
        self.tensors = {n: self._tensor(n, q, shape, start + off) for n, q, shape, off in infos}

    def _tensor(self, name: str, raw_type: int, shape: tuple, offset: int) -> TensorInfo:
        try:
            qtype = T(raw_type)
        except ValueError:
            raise GGUFError(
                f"{self.path}: tensor {name} has unknown GGML type {raw_type}"
            ) from None
        block, size = GGML_QUANT_SIZES[qtype]
        if shape and shape[-1] % block:
            raise GGUFError(
                f"{self.path}: tensor {name} ({qtype.name}) has rows of {shape[-1]} values, "
                f"not a multiple of the type's {block}-value blocks"
            )
        nbytes = int(np.prod(shape, dtype=np.int64)) // block * size
        if offset + nbytes > len(self.data):
            raise GGUFError(
                f"{self.path}: tensor {name} ({qtype.name}) ends at byte {offset + nbytes}, "
                f"past the end of the file ({len(self.data)} bytes): truncated or corrupt"
            )
        return TensorInfo(name, qtype, shape, offset, nbytes)

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Copy a tensor's bytes into ``out`` (uint8, contiguous, its size) by reading the file,
        so that its pages are not mapped into the process (``hugepages``)."""
        t = self.tensors[name]
        view = memoryview(out.numpy()).cast("B")
        if len(view) != t.nbytes:
            raise ValueError(f"{name} has {t.nbytes} bytes, the buffer {len(view)}")
        with open(self.path, "rb", buffering=0) as fh:
            fh.seek(t.offset)
            got = 0
            while got < t.nbytes:
                n = fh.readinto(view[got:])
                if not n:
                    raise GGUFError(f"{self.path}: tensor {name} is cut short: truncated file")
                got += n

    def raw(self, name: str) -> torch.Tensor:
        """A tensor's rows as stored: [rows, row_bytes] uint8, a view of the mapped file."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        return torch.from_numpy(self.data[t.offset : t.offset + t.nbytes].reshape(rows, -1))


class GGUFModel:
    """An opened, checked GGUF model file: ``config`` (ModelConfig), ``hf_config`` (the same as
    a config.json dict) and ``load_weights``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.file = GGUFFile(self.path)
        self.tensors = self.file.tensors
        self.arch = str(self._meta("general.architecture"))
        if self.arch not in ARCHITECTURES:
            raise GGUFError(
                f"{self.path}: unsupported architecture {self.arch!r}; specdec runs GGUF "
                + ", ".join(sorted(ARCHITECTURES))
            )
        self.hf_config = self._read_config()
        try:
            self.config = ModelConfig.from_dict(self.hf_config, source=str(self.path))
        except UnsupportedModelError as exc:
            raise GGUFError(str(exc)) from None
        self._check_tensors()

    # -- metadata ------------------------------------------------------------------------------
    _REQUIRED = object()

    def _meta(self, key: str, default=_REQUIRED):
        value = self.file.meta.get(key)
        if value is None:
            if default is GGUFModel._REQUIRED:
                raise GGUFError(f"{self.path}: metadata lacks {key}")
            return default
        return value

    def _read_config(self) -> dict:
        """The model's hyper-parameters as a Hugging Face config.json would hold them."""
        a = self.arch + "."
        if "token_embd.weight" not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor token_embd.weight (the token embeddings)")
        hidden = int(self._meta(a + "embedding_length"))
        heads = int(self._meta(a + "attention.head_count"))
        cfg = {
            "architectures": [ARCHITECTURES[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.tensors["token_embd.weight"].shape[0],
            "hidden_size": hidden,
            "intermediate_size": int(self._meta(a + "feed_forward_length")),
            "num_hidden_layers": int(self._meta(a + "block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._meta(a + "attention.head_count_kv", heads)),
            "head_dim": int(self._meta(a + "attention.key_length", hidden // heads)),
            "rms_norm_eps": float(self._meta(a + "attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._meta(a + "rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._meta(a + "context_length", 4096)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
        }
        for key in ("bos", "eos"):
            token = self._meta(f"tokenizer.ggml.{key}_token_id", None)
            if token is not None:
                cfg[f"{key}_token_id"] = int(token)
        scaling = self._meta(a + "rope.scaling.type", "none")
        if scaling == "linear":
            factor = float(self._meta(a + "rope.scaling.factor"))
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": factor}
        elif scaling != "none":
            raise GGUFError(f"{self.path}: unsupported RoPE scaling {scaling!r}")
        return cfg

    # -- checks --------------------------------------------------------------------------------
    def _roles(self) -> tuple[dict, dict]:
        """Expected [out, in] shapes: (matrices, vectors), each name -> (shape, required)."""
        c = self.config
        h, inter, d = c.hidden_size, c.intermediate_size, c.head_dim
        q_out, kv_out = c.num_heads * d, c.num_kv_heads * d
        mats = {"token_embd.weight": ((c.vocab_size, h), True)}
        mats["output.weight"] = ((c.vocab_size, h), False)
        vecs = {"output_norm.weight": ((h,), True), "rope_freqs.weight": ((d // 2,), False)}
        for i in range(c.num_layers):
            p = f"blk.{i}."
            for name, shape in (
                ("attn_q", (q_out, h)),
                ("attn_k", (kv_out, h)),
                ("attn_v", (kv_out, h)),
                ("attn_output", (h, q_out)),
                ("ffn_gate", (inter, h)),
                ("ffn_up", (inter, h)),
                ("ffn_down", (h, inter)),
            ):
                mats[p + name + ".weight"] = (shape, True)
            for name, n in (("attn_q", q_out), ("attn_k", kv_out), ("attn_v", kv_out)):
                vecs[p + name + ".bias"] = ((n,), False)
            vecs[p + "attn_output.bias"] = ((h,), False)
            vecs[p + "attn_norm.weight"] = ((h,), True)
            vecs[p + "ffn_norm.weight"] = ((h,), True)
            if c.qk_norm:
                vecs[p + "attn_q_norm.weight"] = ((d,), True)
                vecs[p + "attn_k_norm.weight"] = ((d,), True)
        return mats, vecs

    def _check_tensors(self) -> None:
        mats, vecs = self._roles()
        for name, (shape, required) in {**mats, **vecs}.items():
            t = self.tensors.get(name)
            if t is None:
                if required:
                    raise GGUFError(f"{self.path}: missing tensor {name}")
                continue
            if t.shape != shape:
                raise GGUFError(
                    f"{self.path}: tensor {name} ({t.qtype.name}) has shape {t.shape}, "
                    f"the metadata implies {shape}"
                )
            qtype = t.qtype
            runnable = qtype in DENSE or (name in mats and gguf_kernels.supported(int(qtype)))
            if not runnable:
                kinds = sorted(type_name(q) for q in gguf_kernels.SUPPORTED)
                allowed = "F32, F16, BF16" + (", " + ", ".join(kinds) if name in mats else "")
                raise GGUFError(
                    f"{self.path}: tensor {name} has type {qtype.name}, which specdec cannot "
                    f"run (supported: {allowed})"
                )

    # -- weights -------------------------------------------------------------------------------
    def load_weights(
        self,
        mode,
        device: torch.device,
        head_ids: torch.Tensor | None = None,
        requantize: str | None = None,
    ):
        """Weights by role, laid out as ``weights.load_weights`` does (q|k|v and gate|up fused,
        norms and biases fp32). ``mode``: "native" (matrices in their own quantization, int8
        activations in products), "exact" (the same, exact fp32 activations), or a torch dtype
        (every matrix dequantized to it). ``head_ids``: output rows to keep (the rest of the
        head is never read). ``requantize="q4_0"`` (native modes on a CPU, for drafters):
        matrices wider than 4.5 bits a weight become GGUF Q4_0 of their exact values as they
        are read (``quantize.quantize_q4_0``'s rounding)."""
        return _WeightBuilder(self, mode, device, requantize).build(head_ids)


class _WeightBuilder:
    def __init__(self, model: GGUFModel, mode, device: torch.device, requantize=None):
        self.m = model
        self.cfg = model.config
        self.native = mode in ("native", "exact")
        self.int8_x = mode == "native"
        self.dtype = None if self.native else mode
        self.device = device
        # natively on a CPU, matrices are copied into huge pages (``hugepages``): an upper
        # bound of their bytes, committed only as written
        self.arena = None
        if self.native and device.type == "cpu":
            quantized = [t for t in model.tensors.values() if t.qtype not in DENSE]
            self.arena = Arena(sum(t.nbytes + ALIGN for t in quantized))
        if requantize not in (None, "q4_0"):
            raise ValueError(f"requantize must be None or 'q4_0', got {requantize!r}")
        self.to_q4_0 = requantize == "q4_0" and self.arena is not None
        self.scratch: dict[str, torch.Tensor] = {}

    # -- raw rows -----------------------------------------------------------------------------
    def _rows(self, name: str, select: torch.Tensor | None = None) -> tuple[T, torch.Tensor]:
        """(type, rows as stored) with llama's q/k head permutation undone (block rows are
        independent, so quantized rows reorder without being decoded). Floats come as their
        dtype [rows, in], quantized rows as bytes [rows, row_bytes]."""
        qtype = self.m.tensors[name].qtype
        data = self.m.file.raw(name)
        if qtype in DENSE:
            data = data.view(DENSE[qtype])
        perm = self._qk_permutation(name, data.shape[0])
        if perm is not None:
            data = data[perm]
        if select is not None:
            data = data[select]
        return qtype, data

    def _qk_permutation(self, name: str, rows: int) -> torch.Tensor | None:
        if self.m.arch not in PERMUTED_QK or not name.startswith("blk."):
            return None
        kind = name.split(".")[2]
        if kind not in ("attn_q", "attn_k"):
            return None
        heads = self.cfg.num_heads if kind == "attn_q" else self.cfg.num_kv_heads
        # the file interleaves each head's two RoPE halves: its row 2i+j is our row j*half+i
        return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)

    @staticmethod
    def _dense(qtype: T, data: torch.Tensor) -> torch.Tensor:
        """fp32 values of rows (gguf's reference dequantization, bit for bit)."""
        if qtype in DENSE:
            return data.float()
        return torch.from_numpy(np.ascontiguousarray(gguf_dequantize(data.numpy(), qtype)))

    # -- roles ---------------------------------------------------------------------------------
    def vec(self, name: str) -> torch.Tensor | None:
        if name not in self.m.tensors:
            return None
        qtype, data = self._rows(name)
        return self._dense(qtype, data).reshape(-1).to(self.device).contiguous()

    def linear(
        self, names: list[str], bias=None, select=None, copy: bool = True
    ) -> LinearWeight | FusedWeight:
        """One product over matrices ``names`` stacked along the output. Natively, neighbours
        of one type become one matrix (q|k, gate|up: one call of one kernel) copied into the
        arena; matrices of different types are the parts of a ``FusedWeight``. ``copy=False``
        leaves them in the mapped file (the embedding: a few rows read per token)."""
        if not self.native:
            parts = [self._rows(n, select) for n in names]
            w = torch.cat([self._dense(q, d) for q, d in parts])
            return LinearWeight(w.to(self.device, self.dtype).contiguous(), bias)
        runs: list[list[str]] = []
        for n in names:
            if runs and self._kind(runs[-1][-1]) == self._kind(n):
                runs[-1].append(n)
            else:
                runs.append([n])
        packed = []
        for run in runs:
            if self._kind(run[0]) == "q4_0" and copy:
                packed += self._q4_0(run, select)
            else:
                packed.append(self._native(run, select, copy))
        if len(packed) == 1:
            packed[0].bias = bias
            return packed[0]
        return FusedWeight(packed, bias)

    def _kind(self, name: str):
        """What a matrix becomes: "q4_0" if re-quantized, else its own type."""
        t = self.m.tensors[name]
        block, size = GGML_QUANT_SIZES[t.qtype]
        wide = 8 * size / block > gguf_kernels.Q4_0_BITS
        if self.to_q4_0 and wide and t.shape[-1] % 32 == 0:
            return "q4_0"
        return t.qtype

    def _q4_0(self, names: list[str], select) -> list[LinearWeight]:
        """Matrices of any types, stacked along the output, re-quantized to Q4_0 straight into
        the arena (in tiles with int8 activations: ``pack_parts``). The file's
        bytes and their values pass through two scratch buffers, reused: allocated anew for
        each matrix, the C heap kept them all until the end (+0.5 GB at the peak)."""
        k = self.m.tensors[names[0]].shape[-1]
        counts = [len(select) if select is not None else self.m.tensors[n].shape[0] for n in names]
        out = self.arena.take(sum(counts) * (k // 32 * 18)).view(sum(counts), -1)
        chunk = max(8, (4 << 20) // k)  # rows dequantized at a time: 16 MB of fp32
        at = 0
        for name, n in zip(names, counts):
            t = self.m.tensors[name]
            if select is None and self._qk_permutation(name, n) is None:
                rows = self._scratch("raw", t.nbytes, torch.uint8)
                self.m.file.read_into(name, rows)  # never mapped (``hugepages``)
                rows = rows.view(n, -1)
            else:
                rows = self._rows(name, select)[1]
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                values = self._scratch("fp32", (b - a) * k, torch.float32).view(b - a, k)
                if t.qtype in DENSE:
                    values.copy_(rows[a:b].view(DENSE[t.qtype]))
                else:  # the gguf reference values, bit for bit (our kernels' or gguf's own)
                    w = gguf_kernels.pack(int(t.qtype), rows[a:b], b - a, k)
                    gguf_kernels.dequantize(w, out=values)
                gguf_kernels.quantize_q4_0(values, out=out[at + a : at + b])
            at += n
        parts = gguf_kernels.pack_parts(int(T.Q4_0), out, k, tiles=self.int8_x)
        return [LinearWeight(w, int8_x=self.int8_x) for w in parts]

    def _scratch(self, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        """n elements of a buffer kept for the whole load (grown when too small)."""
        buf = self.scratch.get(name)
        if buf is None or buf.numel() < n:
            self.scratch[name] = buf = torch.empty(n, dtype=dtype)
        return buf[:n]

    def _native(self, names: list[str], select, copy: bool) -> LinearWeight:
        """Matrices of one type, stacked along the output, as one LinearWeight."""
        qtype = self.m.tensors[names[0]].qtype
        if qtype in DENSE:  # our kernels multiply fp32 and bf16; fp16 widens to fp32 exactly
            keep = torch.bfloat16 if qtype == T.BF16 else torch.float32
            return LinearWeight(torch.cat([self._rows(n, select)[1].to(keep) for n in names]))
        copied = self.arena is not None and copy
        if copied:
            rows = self._copied(names, select)
        else:
            rows = torch.cat([self._rows(n, select)[1] for n in names])
        block, size = GGML_QUANT_SIZES[qtype]
        in_features = rows.shape[1] // size * block
        w = gguf_kernels.pack(int(qtype), rows, rows.shape[0], in_features)
        if copied and self.int8_x:  # our copy: Q4_K / Q6_K rearranged into 8-row tiles
            w = gguf_kernels.repack(w, in_place=True)
        return LinearWeight(w, int8_x=self.int8_x)

    def _copied(self, names: list[str], select) -> torch.Tensor:
        """The rows of ``names`` one after another in the arena, [rows, row_bytes]."""
        infos = [self.m.tensors[n] for n in names]
        row_bytes = infos[0].nbytes // int(np.prod(infos[0].shape[:-1], dtype=np.int64))
        counts = [len(select) if select is not None else t.shape[0] for t in infos]
        out = self.arena.take(sum(counts) * row_bytes).view(-1, row_bytes)
        at = 0
        for name, n in zip(names, counts):
            dest = out[at : at + n]
            if select is None and self._qk_permutation(name, n) is None:
                self.m.file.read_into(name, dest)  # straight from the file, never mapped
            else:
                dest.copy_(self._rows(name, select)[1])
            at += n
        return out

    def embedding(self, is_head: bool):
        """The token embeddings; in the mapped file unless they also serve as the head."""
        return self.linear(["token_embd.weight"], copy=is_head).weight

    def concat_bias(self, names: list[str], sizes: list[int]) -> torch.Tensor | None:
        vals = [self.vec(n) for n in names]
        if all(v is None for v in vals):
            return None
        zeros = [torch.zeros(n, device=self.device) for n in sizes]
        return torch.cat([v if v is not None else z for v, z in zip(vals, zeros)])

    def build(self, head_ids: torch.Tensor | None) -> dict:
        c = self.cfg
        d = c.head_dim
        q_out, kv_out = c.num_heads * d, c.num_kv_heads * d
        layers = []
        for i in range(c.num_layers):
            p = f"blk.{i}."
            qkv = [p + n for n in ("attn_q", "attn_k", "attn_v")]
            layer = {
                "attn_norm": self.vec(p + "attn_norm.weight"),
                "qkv": self.linear(
                    [n + ".weight" for n in qkv],
                    self.concat_bias([n + ".bias" for n in qkv], [q_out, kv_out, kv_out]),
                ),
                "o": self.linear([p + "attn_output.weight"], self.vec(p + "attn_output.bias")),
                "mlp_norm": self.vec(p + "ffn_norm.weight"),
                "gate_up": self.linear([p + "ffn_gate.weight", p + "ffn_up.weight"]),
                "down": self.linear([p + "ffn_down.weight"]),
            }
            if c.qk_norm:
                layer["q_norm"] = self.vec(p + "attn_q_norm.weight")
                layer["k_norm"] = self.vec(p + "attn_k_norm.weight")
            layers.append(layer)
        embed = self.embedding(is_head=head_ids is None and c.tie_word_embeddings)
        head_name = "token_embd.weight" if c.tie_word_embeddings else "output.weight"
        if head_ids is None and c.tie_word_embeddings:
            lm_head = LinearWeight(embed, int8_x=self.int8_x)  # one copy serves both
        else:
            lm_head = self.linear([head_name], select=head_ids)
        weights = {"embed": embed, "layers": layers, "norm": self.vec("output_norm.weight")}
        weights["lm_head"] = lm_head
        rope_freqs = self.vec("rope_freqs.weight")
        if rope_freqs is not None:
            weights["rope_freqs"] = rope_freqs.cpu()
        return weights
