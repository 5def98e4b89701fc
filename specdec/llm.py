"""LLM: the public Python API. Loads the models, builds the decoder for ``method``, and runs
requests through the engine."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from specdec import gguf_model, ops
from specdec.config import DraftSpec, EngineConfig, ModelConfig
from specdec.controller import SpeculationController
from specdec.decoders.autoregressive import AutoregressiveDecoder
from specdec.decoders.base import Decoder
from specdec.decoders.speculative import SpeculativeDecoder
from specdec.drafters.draft_model import DraftModelDrafter, load_draft_model
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import Engine
from specdec.kv_cache import kv_budget_bytes
from specdec.metrics import RequestMetrics, aggregate
from specdec.model import Transformer, resolve_dtype
from specdec.outputs import RequestOutput, to_output
from specdec.platform import pin_cpu_cores, split_cores
from specdec.quantize import frequent_token_ids
from specdec.sampling import MAX_LOGPROBS, SamplingParams
from specdec.scoring import RAW, ScoreOutput, score_ids, score_output
from specdec.sequence import Sequence
from specdec.tokenizer import Tokenizer, check_draft_compatible, check_text


def resolve_draft_quantization(
    quant: str, device: torch.device, native_gguf: bool = False
) -> str | None:
    """'auto': the cheapest drafter our CPU kernels run (exactness does not depend on it): a
    GGUF draft loaded natively has its matrices wider than 4.5 bits re-quantized to Q4_0 in
    our tiles (the default draft: a step 16-21% cheaper for 1-4 tokens, acceptance ~1 point
    lower, SD 1-13% faster in A/Bs on a Zen 4), other weights become int4; on other devices
    the draft model stays as loaded."""
    if quant == "auto":
        if not ops.use_kernels(device):
            return None
        return "q4_0" if native_gguf else "int4"
    if quant == "q4_0" and device.type != "cpu":
        raise ValueError(
            f"draft_quantization='q4_0' runs on our CPU kernels only, not on {device.type}: "
            "use 'auto', 'int8' or 'none'"
        )
    return None if quant == "none" else quant


class LLM:
    """Loads the models, builds the decoder for the method, and runs requests.

    ``LLM(model, draft_model=None, method="ar", **options)``: every option is a field of
    ``EngineConfig`` (``specdec.config``), which says its default, allowed values and meaning;
    ``LLM.from_config(config)`` takes one built already."""

    def __init__(
        self,
        model: str = EngineConfig.model,
        draft_model: str | None = None,
        method: str = "ar",
        **options,
    ):
        config = EngineConfig.from_keywords(
            model=model, draft_model=draft_model, method=method, **options
        )
        self._start(config)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        config.validate()
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        from specdec.registry import resolve_model

        self.config = config
        self.method = config.method
        self.device = torch.device(config.device)
        self.last_output: RequestOutput | None = None
        self._last_metrics: RequestMetrics | None = None
        if config.method == "ssd":
            config.cpu_cores, config.ssd.draft_cpu_cores = split_cores(
                config.cpu_cores, config.ssd.draft_cpu_cores, config.device, config.ssd.draft_device
            )
        self.cpu_cores = config.cpu_cores
        self._affinity_before = None
        if config.cpu_cores is not None and hasattr(os, "sched_getaffinity"):
            self._affinity_before = os.sched_getaffinity(0)
        self.num_threads = pin_cpu_cores(config.cpu_cores, config.num_threads)
        resolve_dtype(config.dtype, self.device)  # a bad name fails before any loading
        self.dtype = config.dtype  # the weights' policy: each model resolves it for its format
        self.model_path = Path(resolve_model(config.model))
        self.tokenizer = Tokenizer(self.model_path)
        self.target = Transformer.from_path(self.model_path, self.dtype, config.device)
        cfg = self.target.config
        self.max_model_len = min(
            config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.eos_token_ids = sorted(set(self.tokenizer.eos_token_ids) | set(cfg.eos_token_ids))
        self.max_num_seqs = config.max_num_seqs
        self.draft: DraftSpec | None = None
        self.decoder: Decoder = self._build_decoder()
        self.engine = Engine(self.decoder)

    def _build_decoder(self) -> Decoder:
        config, vocab = self.config, self.tokenizer.vocab_size
        if config.method == "ar":
            return AutoregressiveDecoder(self.target, vocab)
        # a draft model's confident drafts lengthen themselves, unless K is fixed
        extend = (
            config.method == "sd"
            and config.num_speculative_tokens is None
            and config.draft.confidence < 1.0
        )
        controller = SpeculationController(
            k_max=config.max_speculative_tokens,
            fixed_k=config.num_speculative_tokens,
            k_plan=1 if extend else None,
        )
        if config.method == "ngram":
            drafter = NgramDrafter(
                self.target.config.vocab_size, config.ngram_max, config.ngram_min
            )
            return SpeculativeDecoder(self.target, vocab, drafter, controller, method="ngram")
        self.draft = self._draft_spec()
        if config.method == "ssd":
            from specdec.ssd.setup import build_ssd_decoder

            return build_ssd_decoder(config, self.draft, self.target, self.tokenizer)
        d = self.draft
        model = load_draft_model(d.path, self.dtype, config.device, d.quantization, d.head_ids)
        drafter = DraftModelDrafter(
            model,
            self.target.config.vocab_size,
            vocab,
            confidence=config.draft.confidence if extend else 1.0,
            k_cap=controller.k_max,
        )
        return SpeculativeDecoder(self.target, vocab, drafter, controller, method=config.method)

    def _draft_spec(self) -> DraftSpec:
        """The drafter's folder, quantization and output head, checked against the target."""
        from specdec.registry import resolve_model

        path = Path(resolve_model(self.config.draft_model))
        draft_cfg = ModelConfig.from_json(path / "config.json")
        check_draft_compatible(self.tokenizer, self.target.config, path, draft_cfg)
        head_ids = None
        head_size = self.config.draft.head_size(self.tokenizer.vocab_size)
        if head_size is not None:
            special = list(self.tokenizer.hf.added_tokens_decoder) + self.eos_token_ids
            head_ids = frequent_token_ids(head_size, special, self.tokenizer.vocab_size)
        native = self.dtype == "auto" and gguf_model.source_of(path) is not None
        quantization = resolve_draft_quantization(
            self.config.draft.quantization, self.device, native
        )
        return DraftSpec(path, quantization, head_ids, self.dtype)

    @property
    def draft_path(self) -> Path | None:
        return None if self.draft is None else self.draft.path

    # -- requests ----------------------------------------------------------------------------
    def _prompt_ids(
        self, prompt: str | list[int], index: int, what: str = "prompt", special: bool = True
    ) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"{what} {index} is empty")
            check_text(prompt, f"{what} {index}")
            ids = self.tokenizer.encode(prompt, add_special_tokens=special)
        elif isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
        else:
            raise ValueError(f"{what} {index} must be a string or a list of token ids")
        if not ids:
            raise ValueError(f"{what} {index} is empty")
        bad = [t for t in ids if not 0 <= t < self.target.config.vocab_size]
        if bad:
            raise ValueError(f"{what} {index} has token ids outside the vocabulary: {bad[:5]}")
        return ids

    @staticmethod
    def _as_list(prompts) -> list:
        """One prompt (a string or a token list) or a list of them, as a list."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int)
        ):
            return [prompts]
        return list(prompts)

    def _make_sequences(self, prompts, sampling_params) -> list[Sequence]:
        prompts = self._as_list(prompts)
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

    def fitting_model_len(self, rows: int) -> int:
        """The longest context whose caches for ``rows`` requests fit the KV budget."""
        per_row = kv_budget_bytes() // max(1, rows * self.decoder.bytes_per_token())
        return min(self.max_model_len, per_row - self.decoder.cache_slack)

    def _reserve(self, seqs: list[Sequence]) -> None:
        if self.engine.has_work():
            return
        need_len = max(len(s.prompt_ids) + s.params.max_tokens for s in seqs)
        fits = kv_budget_bytes() // max(need_len * self.decoder.bytes_per_token(), 1)
        rows = max(1, min(len(seqs), fits, self.max_num_seqs or len(seqs)))
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
        wall = time.perf_counter() - t0
        self._last_metrics = aggregate([o.metrics for o in outs], wall, self.method)
        return outs

    def generate_stream(
        self, prompt: str | list[int], sampling_params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Yield the text of one request piece by piece as it is generated; afterwards
        ``last_output`` holds its RequestOutput."""
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
        wall = time.perf_counter() - t0
        self._last_metrics = aggregate([self.last_output.metrics], wall, self.method)

    def score(
        self,
        prompts: str | list[str] | list[int] | list[list[int]],
        continuations: str | list[str] | list[int] | list[list[int]] | None = None,
        top_logprobs: int = 0,
        sampling_params: SamplingParams | None = None,
    ) -> list[ScoreOutput]:
        """The target's logprob of every token given the tokens before it, batched.

        Without ``continuations``: every token of each prompt (the first has none). With
        them: every token of continuation i given prompt i and the continuation before it; a
        string continuation after a string prompt is tokenized as part of the whole text
        (the tokens of prompt + continuation past the prompt's), as evaluation harnesses do.
        ``top_logprobs``: also the N most likely tokens at each position. Logprobs are of the
        raw model distribution, log_softmax(logits) in fp32, or with ``sampling_params`` of
        the distribution such a request samples from (``specdec.logprobs``). Runs the target
        in passes of its own: do not call it while another thread drives this LLM's engine."""
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
            raise ValueError(f"top_logprobs must be an integer, got {top_logprobs!r}")
        if not 0 <= top_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top_logprobs}")
        params = RAW if sampling_params is None else sampling_params
        prompts = self._as_list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        conts = None if continuations is None else self._as_list(continuations)
        if conts is not None and len(conts) != len(prompts):
            raise ValueError(f"{len(conts)} continuations for {len(prompts)} prompts")
        texts, starts = [], []
        for i, prompt in enumerate(prompts):
            ids = self._prompt_ids(prompt, i)
            starts.append(1 if conts is None else len(ids))
            if conts is not None:
                ids = ids + self._continuation_ids(prompt, ids, conts[i], i)
            if len(ids) > self.max_model_len:
                raise ValueError(
                    f"text {i} has {len(ids)} tokens, more than the model's context of "
                    f"{self.max_model_len}"
                )
            texts.append(ids)
        n = max(1, top_logprobs)  # one alternative always: it says whether a token was greedy
        entries = score_ids(
            self.target, texts, starts, [params] * len(texts), [n] * len(texts), self.vocab_size
        )
        return [
            score_output(self.tokenizer, t[:s], t[s:], e, False, top_logprobs)
            if conts
            else score_output(self.tokenizer, t, t, e, True, top_logprobs)
            for t, s, e in zip(texts, starts, entries)
        ]

    def _continuation_ids(self, prompt, prompt_ids: list[int], cont, i: int) -> list[int]:
        if isinstance(prompt, str) and isinstance(cont, str) and cont:
            whole = self.tokenizer.encode(prompt + cont)
            n = len(prompt_ids)
            if len(whole) > n and whole[:n] == prompt_ids:
                return whole[n:]
        return self._prompt_ids(cont, i, "continuation", special=False)

    @property
    def vocab_size(self) -> int:
        """The tokenizer's: model rows beyond it are padding, never scored or sampled."""
        return self.tokenizer.vocab_size

    def chat_prompt(self, message: str | list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a chat conversation under the model's chat template, with ``tools``
        (OpenAI's function definitions) offered to the model."""
        return self.tokenizer.apply_chat_template(message, tools)

    def metrics(self) -> dict:
        """Aggregate metrics of the last ``generate``/``generate_stream`` call (flat form;
        ``last_metrics`` has the typed one)."""
        return {} if self._last_metrics is None else self._last_metrics.as_dict()

    @property
    def last_metrics(self) -> RequestMetrics | None:
        return self._last_metrics

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
