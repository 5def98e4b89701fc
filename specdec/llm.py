"""LLM: the public Python API. Loads the models, builds the decoder for ``method``, and runs
requests through the engine."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from pathlib import Path

import psutil
import torch

from specdec import ops
from specdec.config import ModelConfig
from specdec.controller import SpeculationController
from specdec.decoders.autoregressive import AutoregressiveDecoder
from specdec.decoders.base import Decoder
from specdec.decoders.speculative import SpeculativeDecoder
from specdec.drafters.draft_model import DraftModelDrafter, load_draft_model
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import Engine
from specdec.model import Transformer, resolve_dtype
from specdec.outputs import RequestOutput, aggregate_metrics, to_output
from specdec.quantize import frequent_token_ids
from specdec.sampling import SamplingParams
from specdec.sequence import Sequence
from specdec.tokenizer import Tokenizer, check_draft_compatible

METHODS = ("ar", "sd", "ngram", "ssd")
IMPLEMENTED = ("ar", "sd", "ngram", "ssd")


def available_methods() -> tuple[str, ...]:
    return IMPLEMENTED


DEFAULT_KV_BUDGET = 0.25  # fraction of RAM the KV caches may take


def machine_cores() -> list[int] | None:
    """The CPUs this process could use when specdec was imported (pinning narrows it later)."""
    return list(_MACHINE_CORES) if _MACHINE_CORES is not None else None


_MACHINE_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pin_cpu_cores(cores: Seq[int] | None, num_threads: int | None) -> int:
    """Pin this process to ``cores`` (one thread each) and set torch's and our thread count."""
    if cores is not None:
        cores = sorted(set(int(c) for c in cores))
        if not cores:
            raise ValueError("cpu_cores is empty")
        try:
            os.sched_setaffinity(0, cores)
        except (OSError, AttributeError) as exc:
            raise ValueError(f"cannot run on CPU cores {cores}: {exc}") from exc
        num_threads = num_threads or len(cores)
    n = num_threads or torch.get_num_threads()
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    ops.set_num_threads(n)
    return n


AUTO_DRAFT_VOCAB = 32768  # "auto" draft head: the 32K most frequent tokens of a large vocabulary
DRAFT_QUANTIZATIONS = ("int8", "int4")


def resolve_draft_quantization(quant, device: torch.device) -> str | None:
    """'auto': the cheapest drafter our CPU kernels run (exactness does not depend on it);
    on other devices the draft model stays as loaded."""
    if quant == "auto":
        return AUTO_DRAFT_QUANTIZATION if ops.use_kernels(device) else None
    if quant in (None, "none"):
        return None
    if quant not in DRAFT_QUANTIZATIONS:
        choices = ", ".join(repr(q) for q in ("auto", "none", *DRAFT_QUANTIZATIONS))
        raise ValueError(f"draft_quantization must be one of {choices}; got {quant!r}")
    return quant


AUTO_DRAFT_QUANTIZATION = "int4"


def split_cores(cpu_cores, draft_cpu_cores, device: str, draft_device: str | None):
    """SSD gives the drafter hardware of its own. On the CPU: by default the drafter takes the
    last available core and the target the others (2 cores: target 0, drafter 1)."""
    if (draft_device or device) != "cpu":
        return cpu_cores, draft_cpu_cores
    available = machine_cores()
    if draft_cpu_cores is None:
        pool = sorted(cpu_cores) if cpu_cores is not None else available
        if not pool or len(pool) < 2:
            raise ValueError("SSD on the CPU needs at least 2 cores (one for the drafter); "
                             "pass draft_cpu_cores to share")  # fmt: skip
        draft_cpu_cores = [pool[-1]]
        if cpu_cores is None:
            cpu_cores = pool[:-1]
    elif cpu_cores is None and available is not None:
        rest = [c for c in available if c not in set(draft_cpu_cores)]
        cpu_cores = rest or available
    if available is not None and not set(draft_cpu_cores) <= set(available):
        raise ValueError(f"draft_cpu_cores {list(draft_cpu_cores)} not all available "
                         f"(this process may use {available})")  # fmt: skip
    return cpu_cores, list(draft_cpu_cores)


class LLM:
    def __init__(
        self,
        model: str = "qwen2.5-coder-1.5b",
        draft_model: str | None = None,
        method: str = "ar",
        num_speculative_tokens: int | None = None,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        num_threads: int | None = None,
        cpu_cores: Seq[int] | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_speculative_tokens: int = 8,
        ngram_max: int = 3,
        ngram_min: int = 1,
        draft_quantization: str | None = "auto",
        draft_vocab: int | str | None = "auto",
        draft_device: str | None = None,
        draft_cpu_cores: Seq[int] | None = None,
        speculation_budget: int | None = None,
        fanout: str = "geometric",
        saguaro_c: float | None = None,
        backup: str = "auto",
        ssd_timeout_s: float = 30.0,
    ):
        from specdec.registry import resolve_model

        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
        if method not in IMPLEMENTED:
            raise NotImplementedError(
                f"method {method!r} is not available yet (available: {', '.join(IMPLEMENTED)})"
            )
        self.method = method
        self.device = torch.device(device)
        if method == "ssd":
            cpu_cores, draft_cpu_cores = split_cores(cpu_cores, draft_cpu_cores, device,
                                                     draft_device)  # fmt: skip
        elif draft_cpu_cores is not None:
            raise ValueError("draft_cpu_cores applies to method='ssd' only")
        self.cpu_cores = cpu_cores
        self._affinity_before = (
            os.sched_getaffinity(0) if cpu_cores is not None and hasattr(os, "sched_getaffinity")
            else None
        )  # fmt: skip
        self.num_threads = pin_cpu_cores(cpu_cores, num_threads)
        resolve_dtype(dtype, self.device)  # a bad name fails before any loading
        self.dtype = dtype  # the weights' policy: each model resolves it for its own format
        self.model_path = Path(resolve_model(model))
        self.tokenizer = Tokenizer(self.model_path)
        self.target = Transformer.from_path(self.model_path, dtype, device)
        cfg = self.target.config
        self.max_model_len = min(
            max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.eos_token_ids = sorted(set(self.tokenizer.eos_token_ids) | set(cfg.eos_token_ids))
        self.draft_path: Path | None = None
        self.draft_options = {"quantization": draft_quantization, "vocab": draft_vocab}
        self.ssd_options = {
            "draft_device": draft_device or device,
            "draft_cpu_cores": draft_cpu_cores,
            "budget": speculation_budget,
            "fanout": fanout,
            "saguaro_c": saguaro_c,
            "backup": backup,
            "timeout_s": ssd_timeout_s,
        }
        self.decoder: Decoder = self._build_decoder(
            method,
            draft_model,
            num_speculative_tokens,
            max_speculative_tokens,
            ngram_max,
            ngram_min,
        )
        self.max_num_seqs = max_num_seqs
        self.engine = Engine(self.decoder)
        self._last_metrics: dict = {}

    def _build_decoder(self, method, draft_model, num_spec, k_max, ngram_max, ngram_min):

        vocab = self.tokenizer.vocab_size
        if method == "ar":
            if draft_model is not None:
                raise ValueError("method 'ar' takes no draft_model (did you mean method='sd'?)")
            return AutoregressiveDecoder(self.target, vocab)
        if num_spec is not None and (
            isinstance(num_spec, bool) or not isinstance(num_spec, int) or num_spec < 1
        ):
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {num_spec!r}")
        if not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"max_speculative_tokens must be an integer >= 1, got {k_max!r}")
        controller = SpeculationController(k_max=k_max, fixed_k=num_spec)
        if method == "ngram":
            if draft_model is not None:
                raise ValueError("method 'ngram' drafts by prompt lookup and takes no draft_model")
            drafter = NgramDrafter(self.target.config.vocab_size, ngram_max, ngram_min)
            return SpeculativeDecoder(self.target, vocab, drafter, controller, method="ngram")
        if draft_model is None:
            raise ValueError(f"method {method!r} needs a draft_model")
        spec = self._draft_spec(draft_model)
        if method == "ssd":
            from specdec.ssd.setup import build_ssd_decoder

            return build_ssd_decoder(self, spec, num_spec, self.ssd_options)
        draft = load_draft_model(spec["path"], self.dtype, str(self.device),
                                 spec["quantization"], spec["head_ids"])  # fmt: skip
        drafter = DraftModelDrafter(draft, self.target.config.vocab_size, vocab)
        return SpeculativeDecoder(self.target, vocab, drafter, controller, method=method)

    def _draft_spec(self, draft_model: str) -> dict:
        """Validated description of the drafter: its folder, quantization and output head."""
        from specdec.registry import resolve_model

        quant = resolve_draft_quantization(self.draft_options["quantization"], self.device)
        vocab_limit = self.draft_options["vocab"]
        if vocab_limit == "auto":
            vocab_limit = (
                AUTO_DRAFT_VOCAB if self.tokenizer.vocab_size > 2 * AUTO_DRAFT_VOCAB else None
            )
        elif vocab_limit == "full":
            vocab_limit = None
        if vocab_limit is not None and (
            isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int) or vocab_limit < 1
        ):
            raise ValueError(
                f"draft_vocab must be a positive integer, 'auto' or 'full', got {vocab_limit!r}"
            )
        self.draft_path = Path(resolve_model(draft_model))
        draft_cfg = ModelConfig.from_json(self.draft_path / "config.json")
        check_draft_compatible(self.tokenizer, self.target.config, self.draft_path, draft_cfg)
        head_ids = None
        if vocab_limit is not None and vocab_limit < self.tokenizer.vocab_size:
            special = list(self.tokenizer.hf.added_tokens_decoder) + self.eos_token_ids
            head_ids = frequent_token_ids(vocab_limit, special, self.tokenizer.vocab_size)
        return {"path": self.draft_path, "quantization": quant, "head_ids": head_ids}

    # -- requests ----------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | list[int], index: int) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"prompt {index} is empty")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
        else:
            raise ValueError(f"prompt {index} must be a string or a list of token ids")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        bad = [t for t in ids if not 0 <= t < self.target.config.vocab_size]
        if bad:
            raise ValueError(f"prompt {index} has token ids outside the vocabulary: {bad[:5]}")
        return ids

    def _make_sequences(self, prompts, sampling_params) -> list[Sequence]:
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{i}] is not a SamplingParams")
            ids = self._prompt_ids(prompt, i)
            if len(ids) + p.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens; with max_tokens={p.max_tokens} that "
                    f"exceeds the model's context of {self.max_model_len} tokens"
                )
            seqs.append(Sequence(ids, p, self.tokenizer, self.eos_token_ids))
        return seqs

    def make_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Sequence:
        """A validated request, ready for ``engine.add`` (for servers driving the engine)."""
        (seq,) = self._make_sequences([prompt], params)
        if request_id is not None:
            seq.request_id = request_id
        return seq

    def reserve(self, max_num_seqs: int, max_len: int | None = None) -> None:
        """Allocate caches for ``max_num_seqs`` concurrent requests of up to ``max_len`` tokens
        (default: the model's context), as a server does once at start."""
        self.decoder.ensure_capacity(
            max_num_seqs, min(max_len or self.max_model_len, self.max_model_len)
        )

    def _reserve(self, seqs: list[Sequence]) -> None:
        if self.engine.has_work():
            return
        need_len = max(len(s.prompt_ids) + s.params.max_tokens for s in seqs)
        per_row = need_len * self.decoder.bytes_per_token()
        budget = int(psutil.virtual_memory().total * DEFAULT_KV_BUDGET)
        rows = max(1, min(len(seqs), budget // max(per_row, 1)))
        if self.max_num_seqs:
            rows = min(rows, self.max_num_seqs)
        self.decoder.ensure_capacity(rows, need_len)

    def generate(
        self,
        prompts: str | list[str] | list[int] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (batched); outputs come back in prompt order."""
        seqs = self._make_sequences(prompts, sampling_params)
        self._reserve(seqs)
        t0 = time.perf_counter()
        for s in seqs:
            self.engine.add(s)
        while self.engine.has_work():
            self.engine.step()
        outs = [to_output(s, self.method) for s in seqs]
        self._last_metrics = aggregate_metrics(outs, time.perf_counter() - t0, self.method)
        return outs

    def generate_stream(
        self, prompt: str | list[int], sampling_params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Yield the text of one request piece by piece as it is generated."""
        (seq,) = self._make_sequences([prompt], sampling_params)
        self._reserve([seq])
        t0 = time.perf_counter()
        self.engine.add(seq)
        try:
            while self.engine.has_work():
                self.engine.step()
                piece = seq.take_new_text()
                if piece:
                    yield piece
            piece = seq.take_new_text()
            if piece:
                yield piece
        finally:
            if not seq.finished:  # the consumer stopped early: free the request
                self.engine.abort(seq.request_id)
                while self.engine.has_work():
                    self.engine.step()
        self.last_output = to_output(seq, self.method)
        self._last_metrics = aggregate_metrics(
            [self.last_output], time.perf_counter() - t0, self.method
        )

    def chat_prompt(self, message: str | list[dict]) -> list[int]:
        """Token ids of a chat conversation under the model's chat template."""
        return self.tokenizer.apply_chat_template(message)

    def metrics(self) -> dict:
        """Aggregate metrics of the last ``generate``/``generate_stream`` call."""
        return dict(self._last_metrics)

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop worker processes and give the process its CPU cores back."""
        closer = getattr(self.decoder, "close", None)
        if closer is not None:
            closer()
        if self._affinity_before is not None:
            os.sched_setaffinity(0, self._affinity_before)
            self._affinity_before = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
