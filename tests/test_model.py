"""Our decoder against transformers' (fp32): prefill, cached decode, multi-token passes after
the cache, rollback, ragged batches; and the batch invariance exactness relies on."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from specdec.config import ModelConfig, UnsupportedModelError
from specdec.model import Transformer
from specdec.weights import CheckpointError

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "llama3"]
TOL = 2e-5


def reference_logits(folder, tokens):
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(tokens).logits


@pytest.mark.parametrize("kernels_on", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_transformers(tiny_dirs, arch, kernels_on, request):
    if not kernels_on:
        request.getfixturevalue("torch_ops")
    folder = tiny_dirs[arch]
    torch.manual_seed(0)
    tokens = torch.randint(0, 32, (2, 40))
    ref = reference_logits(folder, tokens)
    model = Transformer.from_folder(folder)
    cache = model.new_cache(2, 64)

    prefill = model.forward(tokens[:, :20], cache)  # prefill
    torch.testing.assert_close(prefill, ref[:, :20], atol=TOL, rtol=0)
    step = torch.cat([model.forward(tokens[:, t : t + 1], cache) for t in range(20, 26)], 1)
    torch.testing.assert_close(step, ref[:, 20:26], atol=TOL, rtol=0)  # decode with the cache
    multi = model.forward(tokens[:, 26:31], cache)  # a 5-token pass after the cache
    torch.testing.assert_close(multi, ref[:, 26:31], atol=TOL, rtol=0)
    for row in (0, 1):
        cache.rollback(row, 23)  # drop 8 tokens, then continue from there
    after = model.forward(tokens[:, 23:40], cache)
    torch.testing.assert_close(after, ref[:, 23:40], atol=TOL, rtol=0)
    assert cache.length(0) == cache.length(1) == 40


def test_ragged_batch_matches_single_sequences(tiny_dirs):
    model = Transformer.from_folder(tiny_dirs["qwen2"])
    torch.manual_seed(1)
    prompts = [torch.randint(0, 32, (n,)).tolist() for n in (5, 11, 8)]
    singles = []
    for p in prompts:
        c = model.new_cache(1, 32)
        singles.append(model.forward(torch.tensor([p]), c)[0, -1])
    cache = model.new_cache(3, 32)
    padded = torch.zeros(3, 11, dtype=torch.int64)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in prompts])
    last = model.forward(padded, cache, num_new=lengths, logits_at=(lengths - 1)[:, None])[:, 0]
    assert cache.lengths[:3].tolist() == [5, 11, 8]
    for i in range(3):
        torch.testing.assert_close(last[i], singles[i], atol=TOL, rtol=0)


def test_cache_rows_are_independent(tiny_dirs):
    """Sequences in non-adjacent cache rows, run in any order, see only their own keys."""
    model = Transformer.from_folder(tiny_dirs["llama"])
    cache = model.new_cache(4, 32)
    a, b = [3, 4, 5, 6], [7, 8, 9]
    ref_a = model.forward(torch.tensor([a]), model.new_cache(1, 32))[0, -1]
    model.forward(torch.tensor([b]), cache, rows=torch.tensor([3]))
    out = model.forward(torch.tensor([a]), cache, rows=torch.tensor([1]))[0, -1]
    torch.testing.assert_close(out, ref_a, atol=TOL, rtol=0)


def test_kernels_are_batch_invariant(tiny_dirs):
    """A token's logits are bit-identical decoded alone, inside a multi-token pass, or next
    to other sequences: what lets greedy speculation equal greedy AR exactly."""
    from specdec import kernels

    if kernels.library() is None:
        pytest.skip(f"our CPU kernels are not in use here: {kernels.status()}")
    model = Transformer.from_folder(tiny_dirs["qwen3"])
    torch.manual_seed(2)
    seq = torch.randint(0, 32, (1, 30))
    one = model.new_cache(1, 64)
    model.forward(seq[:, :20], one)
    alone = torch.cat([model.forward(seq[:, t : t + 1], one) for t in range(20, 30)], 1)
    multi_cache = model.new_cache(3, 64)
    batch = torch.cat([torch.randint(0, 32, (1, 30)), seq, torch.randint(0, 32, (1, 30))])
    model.forward(batch[:, :20], multi_cache)
    together = model.forward(batch[:, 20:30], multi_cache)[1:2]
    assert torch.equal(alone, together)


def test_explicit_mask_and_positions_match_causal(tiny_dirs):
    """A tree-style pass (explicit positions and mask) reproduces the causal result: two
    branches sharing a prefix in one row equal two separate sequences."""
    model = Transformer.from_folder(tiny_dirs["llama"])
    prefix, br1, br2 = [3, 4, 5], [6, 7], [8, 9]
    ref1 = model.forward(torch.tensor([prefix + br1]), model.new_cache(1, 16))[0, -2:]
    ref2 = model.forward(torch.tensor([prefix + br2]), model.new_cache(1, 16))[0, -2:]
    cache = model.new_cache(1, 16)
    model.forward(torch.tensor([prefix]), cache)
    # slots 3,4 = branch 1; slots 5,6 = branch 2; both at positions 3,4
    tokens = torch.tensor([br1 + br2])
    positions = torch.tensor([[3, 4, 3, 4]])
    mask = torch.zeros(1, 4, 7, dtype=torch.bool)
    mask[0, :, :3] = True
    mask[0, 0, 3] = mask[0, 1, 3] = mask[0, 1, 4] = True
    mask[0, 2, 5] = mask[0, 3, 5] = mask[0, 3, 6] = True
    out = model.forward(tokens, cache, positions=positions, attn_mask=mask)[0]
    torch.testing.assert_close(out[:2], ref1, atol=TOL, rtol=0)
    torch.testing.assert_close(out[2:], ref2, atol=TOL, rtol=0)


def test_bfloat16_weights_close_to_fp32(tiny_dirs):
    folder = tiny_dirs["llama"]
    tokens = torch.randint(0, 32, (1, 12))
    f32 = Transformer.from_folder(folder, dtype=torch.float32)
    b16 = Transformer.from_folder(folder, dtype=torch.bfloat16)
    a = f32.forward(tokens, f32.new_cache(1, 16))
    b = b16.forward(tokens, b16.new_cache(1, 16))
    assert b16.w["layers"][0]["qkv"].weight.dtype == torch.bfloat16
    assert (a - b).abs().max() < 0.1 * a.abs().max()


# -- bad checkpoints ------------------------------------------------------------------------
def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        ModelConfig.from_json(tmp_path / "config.json")


def test_folder_without_weights(tiny_dirs, tmp_path):
    (tmp_path / "config.json").write_text((tiny_dirs["llama"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights"):
        Transformer.from_folder(tmp_path)


def test_corrupt_safetensors(tiny_dirs, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated download
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        Transformer.from_folder(folder)


def test_checkpoint_shape_mismatch(tiny_dirs, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 100
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        Transformer.from_folder(folder)
