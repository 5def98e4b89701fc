import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_sessionstart(session):
    """On an AVX2-only CPU the kernel tests run the AVX-512 builds emulated (SIMDe), which
    take ~100 s to compile: started here, beside the first tests, the fixtures find them built."""
    from specdec import kernels

    if kernels.supported_builds() == ["avx2"]:
        for name in ("avx512vnni", "avx512"):
            threading.Thread(
                target=kernels.load_build_or_emulation, args=(name,), daemon=True
            ).start()


@pytest.fixture(scope="session")
def smollm2_path():
    """HF-format folder of the small real model, pulled into the user's normal cache
    ($SPECDEC_HOME or ~/.cache/specdec) on first use and reused afterwards."""
    from specdec.registry import SMALL_MODEL, resolve_model

    return resolve_model(SMALL_MODEL)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Tiny random checkpoints (32-token vocabulary) of each supported family."""
    from tiny_models import build

    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build(root / "llama", "llama", seed=1),
        "qwen2": build(root / "qwen2", "qwen2", seed=2),
        "qwen3": build(root / "qwen3", "qwen3", seed=3),
        "mistral": build(root / "mistral", "mistral", seed=4),
        "llama3": build(
            root / "llama3",
            "llama",
            seed=5,
            attention_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        # a deliberately different model with the same tokenizer: the draft in SD tests
        "draft": build(root / "draft", "llama", seed=11, hidden=32, layers=1, heads=2, kv_heads=1),
        # 16-token vocabularies: exact enumeration of 4-token continuations stays small
        "v16": build(root / "v16", "llama", seed=21, vocab_size=16),
        "v16_draft": build(
            root / "v16_draft",
            "llama",
            seed=22,
            vocab_size=16,
            hidden=32,
            layers=1,
            heads=2,
            kv_heads=1,
        ),
    }


@pytest.fixture(scope="session")
def tiny_llm(tiny_dirs):
    from specdec import LLM

    return LLM(tiny_dirs["llama"], dtype="float32")


@pytest.fixture
def torch_ops(monkeypatch):
    """Force the plain-torch implementations of the heavy ops (as on CUDA or non-x86 CPUs)."""
    from specdec import kernels

    monkeypatch.setattr(kernels, "library", lambda: None)
