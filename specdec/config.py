"""Configuration: the model's hyper-parameters (``ModelConfig``, from a Hugging Face
config.json) and the engine's options (``EngineConfig`` with its ``DraftConfig`` and
``SSDConfig``).

The engine's options are defined once, here: each field's default, allowed values, help text and
validation. ``LLM(...)`` builds an ``EngineConfig`` from its keywords, the command line derives its
flags from the fields (``specdec.cli.args``), and the SSD setup reads its part of it."""

from __future__ import annotations

import json
import math
from dataclasses import Field, dataclass, field, fields
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE
    rope_scaling: dict = field(default_factory=dict)
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            named = ", ".join(archs) or raw.get("model_type", "unknown")
            raise UnsupportedModelError(
                f"unsupported architecture {named!r} in {source}; specdec supports "
                + ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in ("default", "llama3", "linear"):
            raise UnsupportedModelError(f"unsupported RoPE scaling {rope_type!r} in {source}")
        rope["rope_type"] = rope_type
        n_heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        max_pos = raw.get("max_position_embeddings", 4096)
        window = raw.get("sliding_window")
        if window and raw.get("use_sliding_window", family == "mistral"):
            max_pos = min(max_pos, int(window))  # we attend to the whole context: stay inside
        eos = raw.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=n_heads,
            num_kv_heads=raw.get("num_key_value_heads") or n_heads,
            head_dim=raw.get("head_dim") or hidden // n_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            rope_scaling=rope,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )

    def rope_inv_freq(self) -> torch.Tensor:
        """Inverse RoPE frequencies with Llama-3/linear scaling, in fp32 exactly as the
        reference implementation computes them (so long-context angles match it too)."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        kind = self.rope_scaling.get("rope_type", "default")
        if kind == "linear":
            inv = inv / float(self.rope_scaling["factor"])
        elif kind == "llama3":
            factor = float(self.rope_scaling["factor"])
            low = float(self.rope_scaling.get("low_freq_factor", 1.0))
            high = float(self.rope_scaling.get("high_freq_factor", 4.0))
            old_ctx = float(self.rope_scaling.get("original_max_position_embeddings", 8192))
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
            smooth = (old_ctx / wavelen - low) / (high - low)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
            inv = torch.where(is_mid, mid, scaled)
        return inv


# -- the engine's options -----------------------------------------------------------------------
METHODS = ("ar", "sd", "ngram", "ssd")
# the default pair (registry aliases; specdec.registry re-exports them) and the draft that sd
# and ssd take for a registry target when none is given (here, not in specdec.registry, which
# imports this module through the GGUF loader)
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
DRAFT_PARTNERS = {DEFAULT_TARGET: DEFAULT_DRAFT}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# auto: a GGUF file natively (its own quantization, int8 activations in the products), an HF
# folder in bf16 where our kernels or the hardware handle it; exact: a GGUF file natively with
# fp32 activations, an HF folder in fp32; a dtype name: weights in that dtype (GGUF dequantized)
DTYPES = ("auto", "exact", *TORCH_DTYPES)
DRAFT_QUANTIZATIONS = ("auto", "none", "int8", "int4", "q4_0")
FANOUTS = ("geometric", "uniform", "pipeline")
BACKUPS = ("auto", "neural", "fast")
KV_BUDGET = 0.25  # fraction of RAM the KV caches may take
AUTO_DRAFT_VOCAB = 32768  # "auto" draft head: the 32K most frequent tokens of a large vocabulary


def option(default, help: str, choices=None, keyword: str | None = None, flags=None):
    """A configuration field. ``keyword``: its name among ``LLM``'s keywords when it differs from
    the field's; ``flags``: its command-line flags when they differ from ``--the-keyword``."""
    meta = {"help": help, "choices": choices, "keyword": keyword, "flags": flags}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        allowed = ", ".join(str(c) for c in choices)
        raise ValueError(f"unknown {name} {value!r}: choose one of {allowed}")


def _check_int(name: str, value, low: int = 1, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_fraction(name: str, value, open_low: bool = False) -> float:
    """A number in [0, 1] ((0, 1] where ``open_low``), as a float."""
    span = "(0, 1]" if open_low else "[0, 1]"
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (0 < value <= 1 if open_low else 0 <= value <= 1):
        raise ValueError(f"{name} must be in {span}, got {value!r}")
    return float(value)


def _check_cores(name: str, cores) -> None:
    if cores is None:
        return
    if not cores or not all(isinstance(c, int) and not isinstance(c, bool) for c in cores):
        raise ValueError(f"{name} must be a non-empty list of CPU ids, got {cores!r}")


@dataclass
class DraftConfig:
    """How the draft model is made cheaper (none of it changes the output: the verifier uses the
    q the drafter really sampled from)."""

    quantization: str = option(
        "auto",
        "drafter matrices: 'auto' (on our CPU kernels a GGUF draft's wider matrices become "
        "Q4_0, other weights int4; as loaded elsewhere), 'none', 'int8', 'int4', 'q4_0'",
        DRAFT_QUANTIZATIONS,
        keyword="draft_quantization",
    )
    vocab: int | str = option(
        "auto",
        "drafter output head size: an integer, 'auto' (32K most frequent tokens of a large "
        "vocabulary) or 'full'",
        keyword="draft_vocab",
    )
    # 0.9 from a teacher-forced study of the bench's 18 prompts (README, "dynamic draft
    # length"): against the best fixed K, +4-5% tokens/s modelled on code, +1-4% on prose and
    # chat, with a Zen 2's pass costs and a Zen 5's
    confidence: float = option(
        0.9,
        "sd with adaptive K: the draft goes on past its first token while its top "
        "probability at the last drafted position is above this, up to 6 tokens (and "
        "max_speculative_tokens); 1: off, the controller picks K",
        keyword="draft_confidence",
    )

    def validate(self) -> None:
        self.confidence = _check_fraction("draft_confidence", self.confidence)
        if self.quantization is None:
            self.quantization = "none"
        _check_choice("draft_quantization", self.quantization, DRAFT_QUANTIZATIONS)
        if self.vocab is None:
            self.vocab = "full"
        if isinstance(self.vocab, str) and self.vocab.isdigit():
            self.vocab = int(self.vocab)
        if self.vocab not in ("auto", "full"):
            _check_int("draft_vocab (or 'auto', 'full')", self.vocab, optional=False)

    def head_size(self, vocab_size: int) -> int | None:
        """Tokens the draft's output head covers, or None for the whole vocabulary."""
        if self.vocab == "auto":
            return AUTO_DRAFT_VOCAB if vocab_size > 2 * AUTO_DRAFT_VOCAB else None
        if self.vocab == "full" or self.vocab >= vocab_size:
            return None
        return self.vocab


@dataclass
class SSDConfig:
    """Speculative speculative decoding: the drafter in a worker process of its own."""

    draft_device: str | None = option(None, "device of the SSD drafter (default: the target's)")
    draft_cpu_cores: list[int] | None = option(
        None, "CPU ids of the SSD drafter (default: the last core)"
    )
    # B = 4 measured best of 1, 2, 4, 8 on a 2-core CPU with the AVX-512 kernels (README); with
    # AVX2 only, where a pass over several branches cost ~3x a one-token pass, B = 2 was
    budget: int = option(
        4,
        "speculations cached per sequence per round (B)",
        keyword="speculation_budget",
    )
    fanout: str = option("geometric", "how the budget is spread over outcomes", FANOUTS)
    saguaro_c: float = option(1.0, "Saguaro C in (0, 1]: top-F draft probabilities times C")
    backup: str = option("auto", "what to draft on a cache miss", BACKUPS)
    timeout_s: float = option(
        30.0, "seconds to wait for the worker before drafting without it", keyword="ssd_timeout_s"
    )
    max_k: int = 4  # speculation length the worker drafts at most (the adaptive K's ceiling)

    def validate(self) -> None:
        if self.budget is None:
            self.budget = SSDConfig.budget
        if self.saguaro_c is None:
            self.saguaro_c = SSDConfig.saguaro_c
        _check_int("speculation_budget", self.budget, optional=False)
        self.saguaro_c = _check_fraction("saguaro_c", self.saguaro_c, open_low=True)
        _check_choice("fanout", self.fanout, FANOUTS)
        _check_choice("backup", self.backup, BACKUPS)
        _check_cores("draft_cpu_cores", self.draft_cpu_cores)
        if not self.timeout_s > 0:
            raise ValueError(f"ssd_timeout_s must be > 0, got {self.timeout_s!r}")


@dataclass
class EngineConfig:
    """Everything ``LLM`` needs to know: which models, which method, and on which hardware."""

    model: str = option(DEFAULT_TARGET, "alias, HF folder or .gguf file")
    draft_model: str | None = option(
        None, "draft model (sd, ssd; default for a registry target: its registry partner)"
    )
    method: str = option("ar", "decoding method", METHODS)
    num_speculative_tokens: int | None = option(
        None,
        "fixed speculation length K (default: adaptive)",
        flags=("-k", "--num-speculative-tokens"),
    )
    max_speculative_tokens: int = option(8, "the adaptive K's ceiling (sd, ngram)")
    dtype: str = option(
        "auto",
        "weights: auto (GGUF: natively quantized; HF: bf16), exact (GGUF: native with fp32 "
        "activations; HF: fp32), or a dtype (GGUF dequantized at load)",
        DTYPES,
    )
    device: str = option("cpu", "cpu or cuda")
    num_threads: int | None = option(None, "threads (default: all cores)", flags=("--threads",))
    cpu_cores: list[int] | None = option(None, "pin to these CPU ids, e.g. 0 or 0,1")
    max_model_len: int | None = option(None, "longest sequence (default: the model's context)")
    max_num_seqs: int | None = option(None, "requests decoded together (default: all given)")
    ngram_max: int = option(3, "prompt lookup: longest n-gram matched")
    ngram_min: int = option(1, "prompt lookup: shortest n-gram matched")
    draft: DraftConfig = field(default_factory=DraftConfig)
    ssd: SSDConfig = field(default_factory=SSDConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check_choice("method", self.method, METHODS)
        if not isinstance(self.dtype, torch.dtype):
            _check_choice("dtype", self.dtype, DTYPES)
        _check_int("num_speculative_tokens", self.num_speculative_tokens)
        _check_int("max_speculative_tokens", self.max_speculative_tokens, optional=False)
        _check_int("num_threads", self.num_threads)
        _check_int("max_model_len", self.max_model_len)
        _check_int("max_num_seqs", self.max_num_seqs)
        _check_int("ngram_max", self.ngram_max, optional=False)
        _check_int("ngram_min", self.ngram_min, optional=False)
        _check_cores("cpu_cores", self.cpu_cores)
        if self.method == "ar" and self.draft_model is not None:
            raise ValueError("method 'ar' takes no draft_model (did you mean method='sd'?)")
        if self.method == "ngram" and self.draft_model is not None:
            raise ValueError("method 'ngram' drafts by prompt lookup and takes no draft_model")
        if self.method in ("sd", "ssd") and self.draft_model is None:
            self.draft_model = DRAFT_PARTNERS.get(str(self.model))
            if self.draft_model is None:
                pairs = ", ".join(f"{t} -> {d}" for t, d in DRAFT_PARTNERS.items())
                raise ValueError(
                    f"method {self.method!r} needs a draft_model (only a registry target has "
                    f"one by default: {pairs})"
                )
        if self.method != "ssd" and self.ssd.draft_cpu_cores is not None:
            raise ValueError("draft_cpu_cores applies to method='ssd' only")
        self.draft.validate()
        self.ssd.validate()

    @classmethod
    def from_keywords(cls, **kw) -> EngineConfig:
        """The configuration ``LLM(**kw)`` describes (its flat keywords, e.g.
        ``speculation_budget=2``, go to the part they belong to)."""
        parts = {}
        for part_name, part_cls in (("draft", DraftConfig), ("ssd", SSDConfig)):
            names = {keyword_of(f): f.name for f in fields(part_cls) if f.metadata}
            parts[part_name] = part_cls(**{names[k]: kw.pop(k) for k in list(kw) if k in names})
        own = {keyword_of(f): f.name for f in fields(cls) if f.metadata}
        unknown = sorted(set(kw) - set(own))
        if unknown:
            raise TypeError(f"unknown LLM option(s): {', '.join(unknown)}")
        return cls(**{own[k]: v for k, v in kw.items()}, **parts)


def keyword_of(f) -> str:
    """A configuration field's name among ``LLM``'s keywords."""
    return f.metadata.get("keyword") or f.name


def engine_options() -> list[tuple[Field, str]]:
    """Every user-facing option as (field, keyword), in the order the CLI lists them."""
    out = []
    for cls in (EngineConfig, DraftConfig, SSDConfig):
        out += [(f, keyword_of(f)) for f in fields(cls) if f.metadata]
    return out


@dataclass(frozen=True)
class DraftSpec:
    """The draft model as resolved for loading: its folder, matrices' quantization (None: as
    loaded), output head (token ids, None: the whole vocabulary) and dtype."""

    path: Path
    quantization: str | None
    head_ids: torch.Tensor | None
    dtype: str | torch.dtype  # the weights policy (``EngineConfig.dtype``) or a torch dtype
