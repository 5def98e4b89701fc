"""GGUF models loaded natively: tiny GGUF files written with gguf's GGUFWriter (llama and qwen2,
every supported quantization type), checked against the same model dequantized, against
transformers' own GGUF loader, across decoding methods, and on every kind of bad file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from specdec import LLM, SamplingParams, fused_layers, kernels, registry
from specdec.gguf_model import SOURCE_FILE, GGUFError, GGUFModel
from specdec.kernels import gguf as gguf_kernels
from specdec.model import Transformer, resolve_dtype
from specdec.ops import FusedWeight
from specdec.quantize import quantize_model_int4

T = GGMLQuantizationType
HIDDEN, INTER, HEADS, KV_HEADS, VOCAB, LAYERS = 256, 512, 4, 2, 64, 2
ROLES = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")
ROLES += ("ffn_down", "output")


def writable_types() -> list[T]:
    """The supported quantization types this test can write."""
    out = []
    for q in sorted(gguf_kernels.SUPPORTED):
        qtype = T(q)
        try:
            quantize(np.zeros((1, 256), np.float32), qtype)
            out.append(qtype)
        except NotImplementedError:
            if qtype in gguf_kernels.SCALE_BYTES:  # random blocks
                out.append(qtype)
    return out


TYPES = writable_types()


def encode(w: np.ndarray, qtype: T, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``w`` in ``qtype``: gguf's quantizer where it has one, otherwise random blocks
    whose scales give values of about w's spread."""
    if qtype in (T.F32, T.F16):
        return w.astype(np.float32 if qtype == T.F32 else np.float16)
    try:
        return quantize(w, qtype)
    except NotImplementedError:
        pass
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // block, size), dtype=np.uint8)
    for scale in (1.0, None):  # first at scale 1, then rescaled to w's spread
        if scale is None:
            spread = dequantize(raw.reshape(w.shape[0], -1), qtype).std()
            scale = float(w.std() / max(spread, 1e-6))
        for off in gguf_kernels.SCALE_BYTES[qtype]:
            raw[:, :, off : off + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return raw.reshape(w.shape[0], -1)


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: interleave the two RoPE halves of each head's rows."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(
    path: Path,
    arch: str = "llama",
    types: dict | None = None,
    seed: int = 0,
    tied: bool = False,
    bias: bool | None = None,
    permute: bool | None = None,
    meta: dict | None = None,
    shapes: dict | None = None,
) -> Path:
    """A tiny random model. ``types``: role -> type (default: each matrix the next supported
    type, so that every type occurs);
    ``permute``: store q/k rows as llama.cpp does (default: for llama); ``meta``/``shapes``:
    overrides, to make bad files."""
    rng = np.random.default_rng(seed)
    d = HIDDEN // HEADS
    permute = arch == "llama" if permute is None else permute
    bias = arch == "qwen2" if bias is None else bias
    turn = iter(TYPES * 4)  # by default every matrix takes the next supported type
    shapes = {
        "token_embd": (VOCAB, HIDDEN),
        "attn_q": (HEADS * d, HIDDEN),
        "attn_k": (KV_HEADS * d, HIDDEN),
        "attn_v": (KV_HEADS * d, HIDDEN),
        "attn_output": (HIDDEN, HEADS * d),
        "ffn_gate": (INTER, HIDDEN),
        "ffn_up": (INTER, HIDDEN),
        "ffn_down": (HIDDEN, INTER),
        "output": (VOCAB, HIDDEN),
        **(shapes or {}),
    }
    w = GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if arch == "llama":
        w.add_rope_dimension_count(d)
    w.add_tokenizer_model("gpt2")
    # byte-level BPE symbols, and the special token transformers would otherwise add
    w.add_token_list(["<|endoftext|>"] + [chr(c) for c in range(33, 32 + VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for key, value in (meta or {}).items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)

    def add(name: str, role: str) -> None:
        m = rng.normal(0, 0.08, shapes[role]).astype(np.float32)
        if permute and role in ("attn_q", "attn_k"):
            m = llama_permute(m, HEADS if role == "attn_q" else KV_HEADS)
        qtype = types[role] if types else next(turn)
        data = encode(m, qtype, rng)
        w.add_tensor(name, data, raw_dtype=None if qtype in (T.F32, T.F16) else qtype)

    def vec(name: str, n: int, center: float) -> None:
        w.add_tensor(name, (center + rng.normal(0, 0.2, n)).astype(np.float32))

    add("token_embd.weight", "token_embd")
    for i in range(LAYERS):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", HIDDEN, 1.0)
        vec(p + "ffn_norm.weight", HIDDEN, 1.0)
        for role in ROLES[1:-1]:
            add(p + role + ".weight", role)
        if bias:
            for role, n in (
                ("attn_q", HEADS * d),
                ("attn_k", KV_HEADS * d),
                ("attn_v", KV_HEADS * d),
            ):
                vec(p + role + ".bias", n, 0.0)
    vec("output_norm.weight", HIDDEN, 1.0)
    if not tied:
        add("output.weight", "output")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def logits_of(model: Transformer, tokens: list[int]) -> torch.Tensor:
    return model.forward(torch.tensor([tokens]), model.new_cache(1, 64))[0]


PROMPT = [5, 9, 17, 3, 40, 22, 8, 61]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        "llama": write_gguf(root / "llama.gguf", "llama", seed=1),
        "qwen2": write_gguf(root / "qwen2.gguf", "qwen2", seed=2),
        "tied": write_gguf(root / "tied.gguf", "llama", seed=3, tied=True),
        "draft": write_gguf(root / "draft.gguf", "llama", seed=4),
    }


@pytest.fixture(params=list(kernels.BUILDS))
def each_build(request, monkeypatch):
    """Every kernel build, the model loaded under it (tiles and pairs are the build's own); a
    build this CPU cannot run is its AVX2 emulation (the same bits, slowly)."""
    lib, why = kernels.load_build_or_emulation(request.param)
    if lib is None:
        pytest.skip(why)
    monkeypatch.setattr(kernels, "library", lambda: lib)
    return request.param


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(h))
    return h


# ----------------------------------------------------------------------------- the loader


@pytest.mark.parametrize("name", ["llama", "qwen2", "tied"])
def test_native_exact_equals_dequantized(files, name):
    native = Transformer.from_path(files[name], "exact")
    dense = Transformer.from_path(files[name], "float32")
    assert native.native and native.dtype == "exact" and dense.dtype == torch.float32
    got, want = logits_of(native, PROMPT), logits_of(dense, PROMPT)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_every_supported_type_is_exercised(files):
    for name in ("llama", "qwen2"):
        tensors = GGUFModel(files[name]).tensors.values()
        assert set(TYPES) <= {t.qtype for t in tensors if len(t.shape) == 2}
    assert len(TYPES) >= 5


def test_native_weights_stay_quantized(tmp_path):
    """A Q4_K_M-like mix (v and down in Q6_K, the rest Q4_K): every matrix stays in its own
    type, q|k become one matrix and v a second part of one fused product, gate|up one matrix,
    and the model holds about the file's bytes (no dequantized copy)."""
    types = {r: T.Q4_K for r in ROLES} | {"attn_v": T.Q6_K, "ffn_down": T.Q6_K, "output": T.Q6_K}
    if not {int(T.Q4_K), int(T.Q6_K)} <= gguf_kernels.SUPPORTED:
        pytest.skip("needs Q4_K and Q6_K kernels")
    path = write_gguf(tmp_path / "q4km.gguf", "qwen2", types)
    model = Transformer.from_path(path, "auto")
    assert model.dtype == "native" and model.act_dtype == torch.float32
    embed, layer = model.w["embed"], model.w["layers"][0]
    assert isinstance(embed, gguf_kernels.PackedWeight) and embed.qtype == T.Q4_K
    assert isinstance(layer["qkv"], FusedWeight) and len(layer["qkv"].parts) == 2
    # the copied matrices in 8-row tiles where our kernels run (the same bytes)
    tiles = kernels.library() is not None
    tiled = {int(q): (gguf_kernels.TILED[int(q)] if tiles else int(q)) for q in (T.Q4_K, T.Q6_K)}
    assert [p.weight.qtype for p in layer["qkv"].parts] == [tiled[T.Q4_K], tiled[T.Q6_K]]
    q_k = layer["qkv"].parts[0].weight
    cfg = model.config
    assert q_k.out_features == (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim
    assert layer["gate_up"].weight.qtype == tiled[T.Q4_K]  # one matrix
    assert layer["gate_up"].weight.out_features == 2 * model.config.intermediate_size
    assert layer["qkv"].bias is not None and layer["down"].weight.qtype == tiled[T.Q6_K]
    assert all(p.int8_x for p in layer["qkv"].parts)  # the default mode: int8 activations
    exact = Transformer.from_path(path, "exact")  # exact x: the file's layout
    assert not any(p.int8_x for p in exact.w["layers"][0]["qkv"].parts)
    assert exact.w["layers"][0]["gate_up"].weight.qtype == T.Q4_K
    held = sum(w.nbytes() for w in _packed(model))
    held += sum(t.numel() * t.element_size() for t in _tensors(model))
    assert held <= 1.05 * os.path.getsize(path)


def test_matrices_live_in_huge_pages_and_the_embedding_in_the_file(tmp_path):
    """Natively, every matrix is copied into one arena advised for 2 MB pages (read from the
    file, not through its mapping); the embedding table, read a few rows a token, stays in the
    mapped file; a tied embedding, read whole as the head every token, is copied too."""
    types = {r: T.Q4_K for r in ROLES} | {"attn_v": T.Q6_K, "ffn_down": T.Q6_K, "output": T.Q6_K}
    path = write_gguf(tmp_path / "q4km.gguf", "qwen2", types)
    model = Transformer.from_path(path, "auto")
    file = np.memmap(path, dtype=np.uint8, mode="r")
    on_file = GGUFModel(path).tensors

    def inside(w, lo, n):
        return lo <= w.data.data_ptr() and w.data.data_ptr() + w.nbytes() <= lo + n

    mats = [p.weight for p in _parts(model)]
    assert all(w.data.data_ptr() % 64 == 0 for w in mats)  # each on a cache line
    lo = min(w.data.data_ptr() for w in mats)
    hi = max(w.data.data_ptr() + w.nbytes() for w in mats)
    assert hi - lo < sum(w.nbytes() for w in mats) + 64 * len(mats)  # back to back: one arena
    embed = model.w["embed"]  # a view of the mapped file: where the mapping starts follows
    mapped = embed.data.data_ptr() - on_file["token_embd.weight"].offset
    assert all(not (mapped <= w.data.data_ptr() < mapped + len(file)) for w in mats)
    # the values are the file's: the first layer's down matrix, the same bytes in tiles
    t = on_file["blk.0.ffn_down.weight"]
    down = model.w["layers"][0]["down"].weight
    raw = torch.from_numpy(np.array(file[t.offset : t.offset + t.nbytes]))
    as_filed = gguf_kernels.pack(int(t.qtype), raw, *t.shape)
    assert torch.equal(gguf_kernels.dequantize(down), gguf_kernels.dequantize(as_filed))
    assert down.nbytes() == t.nbytes
    tied = Transformer.from_path(write_gguf(tmp_path / "tied.gguf", "qwen2", types, tied=True))
    head = tied.w["lm_head"].weight
    assert head is tied.w["embed"] and head.data.data_ptr() % 64 == 0


def _parts(model):
    lws = [model.w["lm_head"]]
    for layer in model.w["layers"]:
        lws += [layer[k] for k in ("qkv", "o", "gate_up", "down")]
    out = []
    for lw in lws:
        out += lw.parts if isinstance(lw, FusedWeight) else [lw]
    return out


def _packed(model):
    ws = [model.w["embed"]] + [p.weight for p in _parts(model)]
    seen = {}
    for w in ws:
        if isinstance(w, gguf_kernels.PackedWeight):
            seen[id(w)] = w
    return list(seen.values())


def _tensors(model):
    ts = [p.weight for p in _parts(model) if isinstance(p.weight, torch.Tensor)]
    for layer in model.w["layers"]:
        ts += [layer["attn_norm"], layer["mlp_norm"]]
    return ts + [model.w["norm"]]


def test_tied_head_is_the_embedding(files):
    model = Transformer.from_path(files["tied"], "auto")
    assert model.config.tie_word_embeddings
    assert model.w["lm_head"].weight is model.w["embed"]
    assert not GGUFModel(files["llama"]).config.tie_word_embeddings


def agreement(fast: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(relative RMS difference, fraction of positions with the same top-1)."""
    rel = float((fast - exact).norm() / exact.norm())
    return rel, float((fast.argmax(-1) == exact.argmax(-1)).float().mean())


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_default_mode_agrees_with_exact(files, name):
    exact = logits_of(Transformer.from_path(files[name], "exact"), PROMPT)
    fast = logits_of(Transformer.from_path(files[name], "auto"), PROMPT)
    # int8 activations (~0.5% error per product, as llama.cpp's): close, not equal
    rel, same_top1 = agreement(fast, exact)
    assert rel <= 0.15 and same_top1 >= 0.75


def test_config_from_metadata(files):
    cfg = GGUFModel(files["qwen2"]).config
    assert cfg.architecture == "Qwen2ForCausalLM" and cfg.vocab_size == VOCAB
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (HIDDEN, INTER, LAYERS)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (HEADS, KV_HEADS, HIDDEN // HEADS)
    assert cfg.rms_norm_eps == pytest.approx(1e-5) and cfg.rope_theta == 10000.0
    assert cfg.max_position_embeddings == 256 and cfg.eos_token_ids == [2]


def test_qk_unpermutation(tmp_path):
    """The same weights stored as llama (q/k rows permuted as llama.cpp does) and as qwen2 (as
    is) give the same model; a llama file stored unpermuted gives another one (the heads'
    halves differ, so skipping the un-permutation would show)."""
    types = {r: T.Q8_0 for r in ROLES}
    llama = write_gguf(tmp_path / "l.gguf", "llama", types, seed=7, bias=False)
    qwen2 = write_gguf(tmp_path / "q.gguf", "qwen2", types, seed=7, bias=False)
    wrong = write_gguf(tmp_path / "w.gguf", "llama", types, seed=7, bias=False, permute=False)
    a = logits_of(Transformer.from_path(llama, "exact"), PROMPT)
    b = logits_of(Transformer.from_path(qwen2, "exact"), PROMPT)
    c = logits_of(Transformer.from_path(wrong, "exact"), PROMPT)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 0.1 * a.std()


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_dequantized_matches_transformers(files, name):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    path = files[name]
    hf_logging.set_verbosity_error()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0]
    got = logits_of(Transformer.from_path(path, "float32"), PROMPT)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_restricted_head_selects_rows(files):
    from specdec.drafters.draft_model import load_draft_model

    keep = torch.tensor([0, 2, 5, 9, 33, 63])
    for name in ("llama", "tied"):
        full = logits_of(Transformer.from_path(files[name], "exact"), PROMPT)
        draft = load_draft_model(files[name], "exact", "cpu", None, keep)
        assert draft.native and torch.equal(draft.head_ids, keep)
        assert draft.w["lm_head"].out_features == len(keep)
        torch.testing.assert_close(logits_of(draft, PROMPT), full[:, keep], rtol=1e-5, atol=1e-5)


def test_int4_drafter_is_requantized_from_the_files_values(files):
    """A GGUF draft asked for int4 gets int4 matrices quantized from the file's exact values
    (the head too, restricted first), and its logits stay near the file's model."""
    from specdec.drafters.draft_model import load_draft_model
    from specdec.ops import int4_dequantize
    from specdec.quantize import float_weight

    keep = torch.tensor([0, 2, 5, 9, 33, 63])
    exact = Transformer.from_path(files["llama"], "exact", head_ids=keep)
    draft = load_draft_model(files["llama"], "exact", "cpu", "int4", keep)
    assert torch.equal(draft.head_ids, keep)
    for name in ("qkv", "o", "gate_up", "down"):
        lw, ref = draft.w["layers"][0][name], float_weight(exact.w["layers"][0][name]).weight
        assert lw.weight.dtype == torch.uint8  # int4, two values a byte
        err = (int4_dequantize(lw, ref.shape[1]) - ref).abs().max()
        assert err <= ref.abs().max() / 7, name  # within one int4 step of the file's values
    head = draft.w["lm_head"]
    assert head.weight.dtype == torch.uint8 and head.out_features == len(keep)


def test_q4_0_drafter_is_requantized_from_the_files_values(tmp_path):
    """A GGUF draft's matrices wider than 4.5 bits a weight (Q5_0, Q6_K, Q8_0, fused q|k|v of
    mixed types) become exactly gguf's Q4_0 of the file's values, the restricted head too
    (its rows past the last full tile in a part of their own); Q4_K stays as the file holds it."""
    from specdec.drafters.draft_model import load_draft_model
    from specdec.quantize import float_weight

    types = {**Q4_K_M, "attn_q": T.Q5_0, "attn_k": T.Q5_0, "attn_v": T.Q8_0}
    types |= {"ffn_gate": T.Q5_0, "ffn_up": T.Q5_0, "ffn_down": T.Q6_K, "attn_output": T.Q4_K}
    types |= {"token_embd": T.Q8_0, "output": T.Q8_0}
    path = write_gguf(tmp_path / "d.gguf", "llama", types)
    keep = torch.tensor([0, 2, 5, 9, 11, 17, 33, 40, 63])  # 9 rows: a tile and one row
    exact = Transformer.from_path(path, "auto", head_ids=keep)
    draft = load_draft_model(path, "auto", "cpu", "q4_0", keep)

    def as_q4_0(lw):
        return torch.from_numpy(
            dequantize(quantize(float_weight(lw).weight.numpy(), T.Q4_0), T.Q4_0)
        )

    for name in ("qkv", "gate_up", "down"):
        got, ref = draft.w["layers"][0][name], exact.w["layers"][0][name]
        assert got.weight.qtype == gguf_kernels.TILED[int(T.Q4_0)], name
        assert torch.equal(gguf_kernels.dequantize(got.weight), as_q4_0(ref)), name
    kept, ref = draft.w["layers"][0]["o"].weight, exact.w["layers"][0]["o"].weight
    assert kept.qtype == ref.qtype and torch.equal(kept.data, ref.data)  # moved, not changed
    head = draft.w["lm_head"]
    assert [p.weight.out_features for p in head.parts] == [8, 1]
    got = torch.cat([gguf_kernels.dequantize(p.weight) for p in head.parts])
    assert torch.equal(got, as_q4_0(exact.w["lm_head"]))


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("dtype,draft", [("auto", "draft"), ("exact", "llama")])
def test_greedy_sd_equals_ar(files, each_build, home, dtype, draft):
    """Token identity in the default (int8 activations) and exact modes, with another tiny
    model as the draft and with the target itself (every draft accepted)."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:3]]
    ar = LLM(str(files["llama"]), dtype=dtype)
    assert ar.target.native
    want = [o.token_ids for o in ar.generate(prompts, params)]
    sd = LLM(str(files["llama"]), method="sd", draft_model=str(files[draft]), dtype=dtype,
             num_speculative_tokens=3)  # fmt: skip
    assert sd.decoder.drafter.model.native
    if dtype == "auto":  # the file's blocks, those wider than 4.5 bits re-quantized to Q4_0
        assert sd.draft.quantization == ("q4_0" if kernels.library() is not None else None)
    assert [o.token_ids for o in sd.generate(prompts, params)] == want
    assert len(want[0]) == 10 and len(set(want[0])) > 1


# every matrix quantized (the fused layer loop's condition): a Q4_K_M-like mix (tiles) and
# the other types (file layouts)
Q4_K_M = {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "attn_output": T.Q4_K}
Q4_K_M |= {"ffn_gate": T.Q4_K, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K}
OTHERS = {"attn_q": T.Q5_0, "attn_k": T.Q8_0, "attn_v": T.Q4_1, "attn_output": T.Q5_1}
OTHERS |= {"ffn_gate": T.Q3_K, "ffn_up": T.Q2_K, "ffn_down": T.Q5_K}


@pytest.mark.parametrize(
    "arch,types,dtype",
    [("llama", Q4_K_M, "auto"), ("qwen2", Q4_K_M, "auto"), ("qwen2", OTHERS, "auto"),
     ("llama", OTHERS, "exact"), ("qwen2", Q4_K_M, "exact")],
)  # fmt: skip
def test_fused_layer_loop_gives_the_python_loops_bits(tmp_path, each_build, arch, types, dtype):
    """``decoder_layers`` (the layer loop in one kernel call) against the Python loop: the
    same logits and the same KV cache, bit for bit, for a prefill, a one-token step, a batch
    with padded rows, a tree mask and positions of their own (the shapes SD and SSD run)."""
    if not fused_layers.available():
        pytest.skip("no kernel library on this machine")
    types = {**types, "token_embd": T.Q8_0, "output": T.Q6_K}
    model = Transformer.from_path(write_gguf(tmp_path / "m.gguf", arch, types, seed=5), dtype)
    assert fused_layers.plan(model) is not None  # every layer matrix is GGUF here

    def run(fused: bool):
        model.fuse_layers = fused
        cache, out = model.new_cache(3, 64), []
        rows = torch.tensor([0, 2])
        out.append(model.forward(torch.tensor([PROMPT, PROMPT[::-1]]), cache, rows=rows))
        out.append(model.forward(torch.tensor([[7], [11]]), cache, rows=rows))
        padded = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
        out.append(model.forward(padded, cache, rows=rows, num_new=torch.tensor([4, 2])))
        # a tree of 3 tokens after row 0's 13: slots 0..12 and the token's own branch
        seen = torch.zeros(1, 3, 16, dtype=torch.bool)
        seen[0, :, :13] = True
        seen[0, 0, 13], seen[0, 1, [13, 14]], seen[0, 2, [13, 15]] = True, True, True
        pos = torch.tensor([[13, 14, 14]])
        out.append(model.forward(torch.tensor([[9, 10, 12]]), cache, rows=rows[:1],
                                 positions=pos, attn_mask=seen))  # fmt: skip
        return out, [t.clone() for t in cache.k + cache.v], cache.lengths.clone()

    fused, python = run(True), run(False)
    assert model._plan  # the fused run really used the plan
    for a, b in zip(fused[0], python[0]):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(fused[1], python[1]))
    assert torch.equal(fused[2], python[2])


def test_fused_layer_loop_large_prefill(tmp_path):
    """A pass too large for the kept workspace (here 20 x 60 tokens) takes a buffer of its own:
    the same bits as the Python loop, and the next small pass is still right."""
    if not fused_layers.available():
        pytest.skip("no kernel library on this machine")
    types = {**Q4_K_M, "token_embd": T.Q8_0, "output": T.Q6_K}
    model = Transformer.from_path(write_gguf(tmp_path / "m.gguf", "qwen2", types), "auto")
    tokens = torch.randint(0, VOCAB, (20, 60), generator=torch.Generator().manual_seed(0))
    got = {}
    for fused in (True, False):
        model.fuse_layers = fused
        cache = model.new_cache(20, 64)
        big = model.forward(tokens, cache)
        got[fused] = (big, model.forward(tokens[:, :1], cache))
    assert model._plan
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])


def test_fused_layer_loop_follows_replaced_weights(tmp_path):
    """Requantizing a model's layers (the int4 drafter) drops the plan: the Python loop runs
    the new matrices, and the result is what the int4 model computes."""
    types = {**Q4_K_M, "token_embd": T.Q8_0, "output": T.Q6_K}
    model = Transformer.from_path(write_gguf(tmp_path / "m.gguf", "llama", types), "auto")
    logits_of(model, PROMPT)
    assert model._plan
    quantize_model_int4(model)
    assert model._layer_plan() is None  # int4 matrices: not GGUF
    model.fuse_layers = False
    want = logits_of(model, PROMPT)
    model.fuse_layers = True
    assert torch.equal(logits_of(model, PROMPT), want)


def test_registry_writes_tokenizer_and_config_only(files, home):
    out = registry.resolve_model(str(files["qwen2"]), progress=False)
    assert out.parent == home / "converted"
    names = sorted(p.name for p in out.iterdir())
    assert SOURCE_FILE in names and "config.json" in names and "tokenizer.json" in names
    assert not any(n.endswith((".safetensors", ".bin", ".gguf")) for n in names)
    assert json.loads((out / SOURCE_FILE).read_text())["gguf"] == str(files["qwen2"].resolve())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["vocab_size"] == VOCAB
    assert registry.resolve_model(str(files["qwen2"]), progress=False) == out  # reused
    assert registry.resolve_model(str(out)) == out  # the folder itself is a model too
    a = logits_of(Transformer.from_path(out, "exact"), PROMPT)
    assert torch.equal(a, logits_of(Transformer.from_path(files["qwen2"], "exact"), PROMPT))


def test_dtype_policy():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu, gguf=True) == "native"
    assert resolve_dtype("exact", cpu, gguf=True) == "exact"
    assert resolve_dtype("auto", cuda, gguf=True) == torch.bfloat16
    assert resolve_dtype("float32", cpu, gguf=True) == torch.float32
    assert resolve_dtype("bfloat16", cpu, gguf=True) == torch.bfloat16
    assert resolve_dtype("exact", cpu) == torch.float32
    from specdec import ops

    if ops.use_kernels(cpu):  # our kernels widen bf16 in registers: half fp32's bytes
        assert resolve_dtype("auto", cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        resolve_dtype("int3", cpu)


def test_draft_quantization_policy():
    """'auto': on our kernels a natively loaded GGUF draft's wider matrices become Q4_0, other
    drafts int4; elsewhere the draft stays as loaded."""
    from specdec import ops
    from specdec.llm import resolve_draft_quantization

    cpu = torch.device("cpu")
    kernels = ops.use_kernels(cpu)
    assert resolve_draft_quantization("auto", cpu, native_gguf=True) == (
        "q4_0" if kernels else None
    )
    assert resolve_draft_quantization("auto", cpu) == ("int4" if kernels else None)
    assert resolve_draft_quantization("auto", torch.device("cuda")) is None
    assert resolve_draft_quantization("int4", cpu, native_gguf=True) == "int4"
    assert resolve_draft_quantization("none", cpu) is None
    assert resolve_draft_quantization("q4_0", cpu) == "q4_0"
    with pytest.raises(ValueError, match="'q4_0' runs on our CPU kernels only, not on cuda"):
        resolve_draft_quantization("q4_0", torch.device("cuda"))


def test_dequantized_on_torch_path(files, torch_ops):
    """Without our kernels (as on CUDA or other CPUs) native weights still run."""
    got = logits_of(Transformer.from_path(files["llama"], "exact"), PROMPT)
    want = logits_of(Transformer.from_path(files["llama"], "float32"), PROMPT)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- bad input


def one_line(exc: pytest.ExceptionInfo, *parts: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def test_unsupported_type(tmp_path, home):
    bad = next(q for q in (T.IQ2_XXS, T.IQ3_S, T.Q2_K, T.TQ1_0) if int(q) not in TYPES)
    types = {r: T.Q8_0 for r in ROLES}
    types["ffn_up"] = bad
    path = tmp_path / "iq.gguf"
    _write_raw_type(path, types)
    with pytest.raises(GGUFError) as ei:
        GGUFModel(path)
    one_line(ei, str(path), "blk.0.ffn_up.weight", bad.name, "supported")
    with pytest.raises(registry.ConversionError) as ei:
        registry.resolve_model(str(path), progress=False)
    one_line(ei, str(path), "blk.0.ffn_up.weight", bad.name)
    assert not home.exists() or list(home.iterdir()) == []


def _write_raw_type(path: Path, types: dict) -> None:
    """Like write_gguf, with random bytes for types gguf can neither quantize nor we fake."""
    orig = globals()["encode"]

    def encode_any(w, qtype, rng):
        block, size = GGML_QUANT_SIZES[qtype]
        if qtype == T.Q8_0:
            return orig(w, qtype, rng)
        return rng.integers(0, 256, (w.shape[0], w.shape[1] // block * size), dtype=np.uint8)

    globals()["encode"] = encode_any
    try:
        write_gguf(path, "llama", types)
    finally:
        globals()["encode"] = orig


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tmp_path / "g.gguf", "gemma", {r: T.Q8_0 for r in ROLES})
    with pytest.raises(GGUFError) as ei:
        GGUFModel(path)
    one_line(ei, str(path), "unsupported architecture 'gemma'", "qwen2")


def test_truncated_file(tmp_path, files):
    data = files["llama"].read_bytes()
    for cut, what in ((len(data) - 1000, "output.weight"), (200, "truncated or corrupt")):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as ei:
            GGUFModel(path)
        one_line(ei, str(path), what)
    with pytest.raises(GGUFError) as ei:
        GGUFModel(tmp_path / f"cut{len(data) - 1000}.gguf")
    head_type = GGUFModel(files["llama"]).tensors["output.weight"].qtype.name
    one_line(ei, "past the end of the file", head_type)


def test_a_cut_or_corrupt_string_array_is_a_corrupt_header(tmp_path, files):
    """The tokenizer's string arrays are skipped by their lengths, unread: a file cut inside
    one, or one of its lengths pointing past the end, is still a one-line error."""
    data = files["llama"].read_bytes()
    first = data.index(b"<|endoftext|>")  # the token list's first string, after its length
    cut = tmp_path / "cut_in_tokens.gguf"
    cut.write_bytes(data[: first + 40])
    long = bytearray(data)
    long[first - 8 : first] = (len(data) * 2).to_bytes(8, "little")
    bad = tmp_path / "long_string.gguf"
    bad.write_bytes(bytes(long))
    for path in (cut, bad):
        with pytest.raises(GGUFError) as ei:
            GGUFModel(path)
        one_line(ei, str(path), "truncated or corrupt GGUF header")


def test_shapes_disagree_with_metadata(tmp_path):
    path = write_gguf(tmp_path / "s.gguf", "qwen2", {r: T.Q8_0 for r in ROLES},
                      shapes={"ffn_down": (HIDDEN, INTER + 256)})  # fmt: skip
    with pytest.raises(GGUFError) as ei:
        GGUFModel(path)
    one_line(ei, str(path), "blk.0.ffn_down.weight", "Q8_0", f"({HIDDEN}, {INTER + 256})")


def test_missing_tensor(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "qwen2", {r: T.Q8_0 for r in ROLES}, bias=False)
    data = path.read_bytes().replace(b"blk.1.ffn_norm.weight", b"blk.1.ffn_xorm.weight")
    path.write_bytes(data)
    with pytest.raises(GGUFError) as ei:
        GGUFModel(path)
    one_line(ei, str(path), "missing tensor blk.1.ffn_norm.weight")


def test_not_a_gguf_file_leaves_nothing(tmp_path, home):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(registry.ConversionError) as ei:
        registry.resolve_model(str(bad), progress=False)
    one_line(ei, str(bad), "not a GGUF file")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        Transformer.from_path(bad)
    assert not home.exists() or list(home.iterdir()) == []


# ----------------------------------------------------------------------------- real model


@pytest.mark.real
def test_real_smollm2_native_matches_dequantized(smollm2_path):
    """SmolLM2-135M (Q4_1, llama architecture): the native model in exact mode against the
    same file dequantized to fp32; the default mode (int8 activations) agrees on the top-1."""
    from specdec.tokenizer import Tokenizer

    assert (Path(smollm2_path) / SOURCE_FILE).is_file()
    ids = Tokenizer(smollm2_path).encode("def fibonacci(n):\n    ")
    dense = logits_of(Transformer.from_path(smollm2_path, "float32"), ids)
    exact = logits_of(Transformer.from_path(smollm2_path, "exact"), ids)
    fast = logits_of(Transformer.from_path(smollm2_path, "auto"), ids)
    torch.testing.assert_close(exact, dense, rtol=1e-3, atol=1e-3)
    assert (exact.argmax(-1) == dense.argmax(-1)).all()
    rel, same_top1 = agreement(fast, dense)
    assert rel <= 0.1 and same_top1 >= 0.8
