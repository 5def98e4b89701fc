"""The side-by-side benchmark: every method decodes the same prompts on the same cores.

Rows are ``MethodSpec``s in ``METHODS``; a row runs when its method is available here (ours: in
``specdec.config.METHODS``). Adding one is one line, e.g.::

    MethodSpec("sd-k8", "ours", {"method": "sd", "draft_model": DRAFT, "num_speculative_tokens": 8})

Three kinds of row:

- ``ours``: our engine, ``LLM(model, dtype=..., num_threads=..., **kwargs)``;
- ``hf``: transformers ``generate`` on the same HF-format folder, dtype and thread count
  (``assistant_model`` in kwargs makes it assisted generation with the draft);
- ``llamacpp``: llama-cpp-python's autoregressive decoding of the model's GGUF file. Only when
  ``import llama_cpp`` works; install it with ``pip install llama-cpp-python`` (a source build:
  about 5 minutes with gcc and cmake).

Fairness. Every method starts from the same prompt token ids (tokenized once with our tokenizer,
chat template applied where the prompt asks for it) and generates exactly ``--max-tokens`` new
tokens, ignoring EOS: ours via ``SamplingParams(ignore_eos=True)``, transformers with
``eos_token_id=None`` in its generation config (and repetition penalty 1), llama.cpp through
``Llama.generate``, which never stops by itself (repeat penalty 1). Each repeat loads every
method in turn (in alternating order, so that a machine drifting in speed during the run weighs
on all methods alike), warms it up with one short generation that is not measured, runs every
prompt once, and unloads it.

Decode tokens/s excludes the prefill the same way for every method: the tokens that arrive after
the first emitted chunk, divided by the time from that first emission to the last token. Ours
report it as ``metrics["decode_tokens_per_s"]`` ((n-1) / (finish - first token)); the peers are
timed with a streamer (transformers) or at each yielded token (llama.cpp). End-to-end tokens/s
is n / (whole generate call, prefill included). Per prompt we take the median over repeats, per
prompt type the median over prompts. Speculative rows also record acceptance and tokens per
round (ours from their metrics; ``hf-assisted`` only tokens per target pass, from the streamer).

"same as AR" compares a method's token ids with our AR's for the same prompt (for ``ar``
itself: whether its repeats agree); it needs ``ar`` in the run. Greedy, every row is compared
(small differences are expected where the arithmetic differs: transformers in bf16). With
``--temperature`` > 0 every row of ours samples with ``--seed``, so the coupled rows (the default
for a seeded request) must give AR's very text; rejection-sampling rows (``sd-rejection``,
``ssd-rejection`` of the ``samplers`` group) and the peers are not compared.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from specdec.bench.prompts import PROMPT_TYPES, encode_prompts, load_prompts
from specdec.bench.table import aligned_table
from specdec.config import DTYPES

DRAFT = "<draft>"  # placeholder in a row's kwargs, replaced by --draft-model
QUICK = {"max_tokens": 8, "repeats": 1, "prompts_per_type": 1}
DEFAULTS = {"max_tokens": 128, "repeats": 3, "prompts_per_type": 2}
WARMUP_PROMPT_TOKENS = 16
WARMUP_NEW_TOKENS = 2


@dataclass(frozen=True)
class MethodSpec:
    """One row of the benchmark: a label, the kind of engine, and its keyword arguments (for
    ``ours`` exactly the ``LLM`` kwargs; ``DRAFT`` stands for the ``--draft-model``)."""

    label: str
    kind: str  # "ours" | "hf" | "llamacpp"
    kwargs: dict = field(default_factory=dict)
    note: str = ""
    group: str = "main"  # "main" rows run by default; "ssd-study" (core layouts, ablations) asked


STUDY = "ssd-study"  # the group of rows that compare SSD's core layouts and ablations
SAMPLER_ROWS = "samplers"  # coupled vs rejection sampling for sd and ssd (--temperature > 0)


def _ssd(label: str, note: str, **kw) -> MethodSpec:
    return MethodSpec(label, "ours", {"method": "ssd", "draft_model": DRAFT, **kw}, note, STUDY)


METHODS: tuple[MethodSpec, ...] = (
    MethodSpec("ar", "ours", {"method": "ar"}, "our engine, autoregressive"),
    MethodSpec("sd", "ours", {"method": "sd", "draft_model": DRAFT}, "speculative, adaptive K"),
    MethodSpec(
        "sd-k4",
        "ours",
        {"method": "sd", "draft_model": DRAFT, "num_speculative_tokens": 4},
        "speculative, K=4",
    ),
    MethodSpec("ngram", "ours", {"method": "ngram"}, "prompt-lookup drafting"),
    MethodSpec(
        "ssd",
        "ours",
        {"method": "ssd", "draft_model": DRAFT},
        "speculative speculative: target core 0, drafter core 1",
    ),
    MethodSpec("hf", "hf", {}, "transformers generate"),
    MethodSpec("hf-assisted", "hf", {"assistant_model": DRAFT}, "transformers assisted generation"),
    MethodSpec("llamacpp", "llamacpp", {}, "llama-cpp-python on the GGUF file"),
    MethodSpec(
        "llamacpp-sd",
        "llamacpp",
        {"draft_model": DRAFT, "num_draft_tokens": 4},
        "llama-cpp-python, greedy draft-model speculation (K=4) with the GGUF draft",
    ),
    # SSD comparisons: core layouts (``cpu_cores`` pins a row; it then uses one thread per core)
    MethodSpec("ar-1core", "ours", {"method": "ar", "cpu_cores": [0]}, "AR on core 0", STUDY),
    MethodSpec(
        "sd-1core",
        "ours",
        {"method": "sd", "draft_model": DRAFT, "cpu_cores": [0]},
        "SD, target and drafter on core 0 (the paper's SD baseline)",
        STUDY,
    ),
    # SSD ablations (C only matters when sampling: run those with --temperature > 0)
    _ssd("ssd-uniform", "uniform fan-out", fanout="uniform"),
    _ssd(
        "ssd-pipeline",
        "pipelining only: cache k=K with its top-1 token",
        fanout="pipeline",
        speculation_budget=1,
    ),
    _ssd("ssd-k4", "fixed K=4 (no adaptive K)", num_speculative_tokens=4),
    _ssd("ssd-fast", "fast backup (prompt lookup) on a miss", backup="fast"),
    _ssd("ssd-neural", "neural backup on a miss", backup="neural"),
    _ssd("ssd-b1", "speculation budget B=1", speculation_budget=1),
    _ssd("ssd-b2", "speculation budget B=2", speculation_budget=2),
    _ssd("ssd-b8", "speculation budget B=8", speculation_budget=8),
    _ssd("ssd-c0.5", "Saguaro C=0.5", saguaro_c=0.5),
    _ssd("ssd-c0.8", "Saguaro C=0.8", saguaro_c=0.8),
    # the two samplers at temperature > 0 (``sampler`` goes to SamplingParams, not to LLM)
    *(
        MethodSpec(
            f"{method}-{sampler}",
            "ours",
            {"method": method, "draft_model": DRAFT, "sampler": sampler},
            f"{method}, {sampler} sampling",
            SAMPLER_ROWS,
        )
        for method in ("sd", "ssd")
        for sampler in ("coupled", "rejection")
    ),
)


# ----------------------------------------------------------------------------- arguments


def add_bench_args(p: argparse.ArgumentParser) -> None:
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    labels = ", ".join(m.label for m in METHODS)
    p.add_argument("--model", default=DEFAULT_TARGET, help="target: alias, HF folder or .gguf")
    p.add_argument("--draft-model", default=DEFAULT_DRAFT, help="draft for the speculative rows")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="our rows' weights (auto: GGUF natively; see LLM's dtype); transformers runs bf16 "
        "for auto",
    )
    p.add_argument("--threads", type=int, default=2, help="threads for every method (default 2)")
    p.add_argument(
        "--max-tokens", type=int, default=None, help="new tokens per run (default 128; quick 8)"
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="runs per prompt, median kept (default 3)"
    )
    p.add_argument("--types", default=",".join(PROMPT_TYPES), help="prompt types, comma list")
    p.add_argument(
        "--prompts-per-type", type=int, default=None, help="prompts of each type (default 2)"
    )
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma list of {labels}; 'main', 'ssd-study' or 'samplers' name a group "
        "(default: the available main rows)",
    )
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG")
    p.add_argument(
        "--quick", action="store_true", help="smoke test: 8 tokens, 1 prompt per type, 1 repeat"
    )
    p.add_argument(
        "--pass-dtypes",
        default="auto,bfloat16",
        help="weight formats of the per-pass table (pass times by size, GB/s), comma list; "
        "'none' skips it",
    )
    p.add_argument(
        "--fidelity",
        action="store_true",
        help="only report each weight format's teacher-forced agreement with the fp32 model",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="seed when temperature > 0")


def _settle(args: argparse.Namespace) -> None:
    """Fill the size settings the user left unset (quick or full defaults) and check them."""
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("max_tokens", "repeats", "prompts_per_type", "threads"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")


# ----------------------------------------------------------------------------- method rows


def unavailable_reason(spec: MethodSpec, model: str) -> str | None:
    """Why ``spec`` cannot run here, or None."""
    if spec.kind == "llamacpp":
        if importlib.util.find_spec("llama_cpp") is None:
            return "llama-cpp-python is not installed (./scripts/setup.sh --peers)"
        from specdec.registry import gguf_path

        try:
            path = gguf_path(model)
        except ValueError as exc:
            return str(exc)
        if path is None:
            return f"no GGUF file behind {model} (give an alias or a .gguf file)"
    return None


# A llama.cpp build can crash the process on some CPUs (its AMX backend on a Sapphire Rapids:
# SIGSEGV in ggml_backend_amx_mul_mat on Q4_K_M, llama.cpp issue 20824). llama.cpp rows run in
# the bench's own process, so the rows are first tried in a child: a crash there costs a few
# seconds and a clear message instead of every row measured before it.
LLAMACPP_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False)
for i, _ in enumerate(llm.generate([1, 2, 3, 4], temp=0.0, top_k=1, repeat_penalty=1.0)):
    if i == 1:
        break
"""


def child_crash(code: str, *argv: str, timeout_s: float = 300.0) -> str | None:
    """Runs ``code`` in a fresh Python with ``argv``; None if it exits 0, else what went wrong
    (the signal that killed it, its exit status or the timeout, with its stderr's last line)."""
    import signal
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = f": {lines[-1].strip()}" if lines else ""
    if done.returncode < 0:
        sig = signal.Signals(-done.returncode)
        return f"killed by {sig.name} (signal {sig.value}){last}"
    return f"exit status {done.returncode}{last}"


def llamacpp_crash(model: str, threads: int) -> str | None:
    """None if llama.cpp decodes ``model``'s GGUF file here in a child process, else why not."""
    from specdec.registry import gguf_path

    return _llamacpp_probe(str(gguf_path(model)), threads)


@functools.cache  # one probe per file and thread count in a process
def _llamacpp_probe(path: str, threads: int) -> str | None:
    why = child_crash(LLAMACPP_PROBE, path, str(threads))
    if why is None:
        return None
    return (
        f"llama.cpp crashed decoding {Path(path).name} in a probe run ({why}); on a CPU with "
        "AMX its AMX backend does this (llama.cpp issue 20824): ./scripts/setup.sh --peers "
        "builds it without AMX"
    )


def select_methods(text: str | None, model: str) -> list[MethodSpec]:
    """The rows to run, our ``ar`` first (it is the reference for "same as AR")."""
    by_label = {m.label: m for m in METHODS}
    why = {m.label: unavailable_reason(m, model) for m in METHODS}
    available = [m.label for m in METHODS if why[m.label] is None]
    group = {m.label: m.group for m in METHODS}
    if text is None:
        chosen = [label for label in available if group[label] == "main"]
    else:
        chosen = []
        for item in (s.strip() for s in text.split(",")):
            if item in ("main", STUDY, SAMPLER_ROWS):  # a whole group
                chosen += [label for label in available if group[label] == item]
            elif item:
                chosen.append(item)
        if not chosen:
            raise ValueError(f"--methods is empty; available: {', '.join(available)}")
        for label in chosen:
            if label not in by_label:
                raise ValueError(
                    f"unknown method {label!r}: available here: {', '.join(available)}"
                    f" (all rows: {', '.join(by_label)})"
                )
            if why[label] is not None:
                raise ValueError(
                    f"method {label!r} cannot run here: {why[label]}; "
                    f"available: {', '.join(available)}"
                )
        chosen = list(dict.fromkeys(chosen))
    chosen.sort(key=lambda label: label != "ar")
    return [by_label[label] for label in chosen]


def _fill_draft(kwargs: dict, draft: str) -> dict:
    return {k: (draft if v == DRAFT else v) for k, v in kwargs.items()}


# ----------------------------------------------------------------------------- prompts


# ----------------------------------------------------------------------------- engines


@dataclass
class RunResult:
    token_ids: list[int]
    decode_tokens_per_s: float | None
    e2e_tokens_per_s: float
    ttft_s: float | None
    extra: dict = field(default_factory=dict)  # acceptance_rate, mean_tokens_per_round


def _decode_rate(t_start: float, chunks: list[tuple[float, int]]) -> tuple[float | None, ...]:
    """(decode tokens/s, time to first token) from (timestamp, tokens) of each emitted chunk."""
    if not chunks:
        return None, None
    ttft = chunks[0][0] - t_start
    later = sum(n for _, n in chunks[1:])
    span = chunks[-1][0] - chunks[0][0]
    return (later / span if later and span > 0 else None), ttft


class OursEngine:
    def __init__(self, spec: MethodSpec, args, max_len: int):
        from specdec import LLM

        kwargs = _fill_draft(spec.kwargs, args.draft_model)
        self.sampler = kwargs.pop("sampler", "auto")
        if "cpu_cores" not in kwargs and kwargs["method"] != "ssd":
            kwargs["num_threads"] = args.threads  # pinned rows use one thread per core
        self.llm = LLM(model=args.model, dtype=args.dtype, max_model_len=max_len, **kwargs)

    def run(self, ids: list[int], n: int, temperature: float, seed: int) -> RunResult:
        from specdec import SamplingParams

        params = SamplingParams(
            temperature=temperature,
            max_tokens=n,
            ignore_eos=True,
            seed=seed if temperature else None,
            sampler=self.sampler,
        )
        t0 = time.perf_counter()
        (out,) = self.llm.generate(ids, params)
        wall = time.perf_counter() - t0
        m = out.metrics
        return RunResult(
            out.token_ids,
            m.decode_tokens_per_s,
            len(out.token_ids) / wall,
            m.time_to_first_token_s,
            speculation_figures(m),
        )

    def close(self) -> None:
        self.llm.close()


def speculation_figures(m) -> dict:
    """What the table and the JSON show of a speculative row's metrics."""
    out = {"rounds": m.rounds}
    if m.speculation is not None:
        s = m.speculation
        out.update(
            acceptance_rate=s.acceptance_rate,
            mean_tokens_per_round=s.mean_tokens_per_round,
            verify_time_s=s.verify_time_s,
            draft_time_s=s.draft_time_s,
        )
    if m.ssd is not None:
        d = m.ssd
        out.update(
            ssd_hit_rate=d.hit_rate,
            ssd_target_idle_s=d.target_idle_s,
            ssd_backup_rounds=d.backup_rounds,
            ssd_model_tokens_per_s=d.model_tokens_per_s,
            ssd_model_t_verify_s=d.model_t_verify_s,
            ssd_model_t_backup_s=d.model_t_backup_s,
        )
    return {k: v for k, v in out.items() if v is not None}


class _ChunkClock:
    """A transformers streamer that only timestamps what ``generate`` emits (the first
    ``put`` is the prompt itself)."""

    def __init__(self):
        self.chunks: list[tuple[float, int]] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.chunks.append((now, int(value.numel())))

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _quiet_hf_loading():
    """No "Loading weights" bars from transformers under our own progress bar."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


class HFEngine:
    def __init__(self, spec: MethodSpec, args, max_len: int):
        import torch
        from transformers import AutoModelForCausalLM

        from specdec.gguf_model import transformers_source
        from specdec.model import resolve_dtype
        from specdec.registry import resolve_model

        torch.set_num_threads(args.threads)
        dtype = resolve_dtype(args.dtype, torch.device("cpu"))
        kwargs = _fill_draft(spec.kwargs, args.draft_model)
        draft = kwargs.get("assistant_model")

        def load(name):
            where, extra = transformers_source(resolve_model(name))
            return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **extra)

        with _quiet_hf_loading():
            self.model = load(args.model)
            self.assistant = load(draft) if draft else None
        self.model.eval()
        if self.assistant is not None:
            self.assistant.eval()

    def _config(self, n: int, temperature: float):
        cfg = self.model.generation_config.__class__(**self.model.generation_config.to_dict())
        cfg.eos_token_id = None  # generate exactly n tokens
        cfg.max_new_tokens, cfg.min_new_tokens, cfg.max_length = n, None, None
        cfg.repetition_penalty, cfg.no_repeat_ngram_size = 1.0, 0
        cfg.do_sample = temperature > 0
        cfg.temperature = temperature if temperature > 0 else None
        cfg.top_k, cfg.top_p = None, None
        if cfg.pad_token_id is None:
            cfg.pad_token_id = 0
        return cfg

    def run(self, ids: list[int], n: int, temperature: float, seed: int) -> RunResult:
        import torch

        if temperature:
            torch.manual_seed(seed)
        clock = _ChunkClock()
        x = torch.tensor([ids])
        extra_kwargs = {"assistant_model": self.assistant} if self.assistant is not None else {}
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                generation_config=self._config(n, temperature),
                streamer=clock,
                **extra_kwargs,
            )
        wall = time.perf_counter() - t0
        new = out[0, len(ids) :].tolist()
        decode, ttft = _decode_rate(t0, clock.chunks)
        extra = {}
        if self.assistant is not None and clock.chunks:
            extra["mean_tokens_per_round"] = len(new) / len(clock.chunks)
        return RunResult(new, decode, len(new) / wall, ttft, extra)

    def close(self) -> None:
        self.model = self.assistant = None


class LlamaCppEngine:
    """llama-cpp-python (``pip install llama-cpp-python``): decoding of the GGUF file behind
    ``--model``, fed our prompt token ids, greedy at temperature 0. With ``draft_model`` in the
    row's kwargs, its own speculative loop (``Llama(draft_model=...)``: the target checks the
    drafted tokens in one batch and keeps the prefix it agrees with) with a second ``Llama`` on
    the draft's GGUF file drafting ``num_draft_tokens`` greedily (``LlamaCppDrafter``)."""

    def __init__(self, spec: MethodSpec, args, max_len: int):
        from llama_cpp import Llama

        from specdec.registry import gguf_path

        kwargs = dict(spec.kwargs)
        self.drafter = None
        if "draft_model" in kwargs:
            kwargs = _fill_draft(kwargs, args.draft_model)
            draft = kwargs.pop("draft_model")
            path = gguf_path(draft)
            if path is None:
                raise ValueError(f"llamacpp-sd: no GGUF file behind the draft {draft}")
            k = kwargs.pop("num_draft_tokens")
            self.drafter = LlamaCppDrafter(path, k, max_len, args.threads)
            kwargs["draft_model"] = self.drafter
        self.llm = Llama(
            model_path=str(gguf_path(args.model)),
            n_ctx=max_len,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            seed=args.seed,
            verbose=False,
            **kwargs,
        )

    def run(self, ids: list[int], n: int, temperature: float, seed: int) -> RunResult:
        self.llm.reset()  # no reuse of the previous run's KV cache: every run pays its prefill
        if self.drafter is not None:
            self.drafter.llm.reset()
        tokens: list[int] = []
        chunks: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        gen = self.llm.generate(
            ids,
            temp=temperature,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            reset=True,
        )
        for tok in gen:  # Llama.generate never stops at EOS: we stop after n tokens
            tokens.append(int(tok))
            chunks.append((time.perf_counter(), 1))
            if len(tokens) == n:
                break
        gen.close()
        wall = time.perf_counter() - t0
        decode, ttft = _decode_rate(t0, chunks)
        return RunResult(tokens, decode, len(tokens) / wall, ttft)

    def close(self) -> None:
        self.llm = self.drafter = None


class LlamaCppDrafter:
    """A draft model for llama-cpp-python's speculative loop, which ships only prompt lookup:
    called with the sequence so far, it returns the draft's next ``k`` greedy tokens. Its
    ``generate`` keeps the KV cache of the longest prefix it has seen, so each call only
    evaluates the tokens that changed since the last."""

    def __init__(self, path, k: int, max_len: int, threads: int):
        from llama_cpp import Llama

        self.k = k
        self.llm = Llama(
            model_path=str(path),
            n_ctx=max_len + k + 1,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def __call__(self, input_ids, **kwargs):
        import numpy as np

        out: list[int] = []
        gen = self.llm.generate(list(input_ids), temp=0.0, top_k=1, repeat_penalty=1.0)
        for tok in gen:
            out.append(int(tok))
            if len(out) == self.k:
                break
        gen.close()
        return np.array(out, dtype=np.intc)


ENGINES = {"ours": OursEngine, "hf": HFEngine, "llamacpp": LlamaCppEngine}


# ----------------------------------------------------------------------------- statistics


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize_prompt(prompt: dict, n_prompt: int, runs: list[RunResult], ref: list[int] | None):
    """Median over repeats for one prompt, and its agreement with our AR's tokens."""
    first = runs[0].token_ids
    diffs = [_first_diff(r.token_ids, ref) for r in runs] if ref is not None else []
    extra_keys = sorted({k for r in runs for k in r.extra})
    return {
        "id": prompt["id"],
        "type": prompt["type"],
        "chat": prompt["chat"],
        "prompt_tokens": n_prompt,
        "generated_tokens": len(first),
        "decode_tokens_per_s": _median(r.decode_tokens_per_s for r in runs),
        "e2e_tokens_per_s": _median(r.e2e_tokens_per_s for r in runs),
        "ttft_s": _median(r.ttft_s for r in runs),
        **{k: _median(r.extra.get(k) for r in runs) for k in extra_keys},
        "same_as_ar": all(d is None for d in diffs) if ref is not None else None,
        "first_diff_from_ar": next((d for d in diffs if d is not None), None),
        "runs": [
            {
                "decode_tokens_per_s": r.decode_tokens_per_s,
                "e2e_tokens_per_s": r.e2e_tokens_per_s,
                "ttft_s": r.ttft_s,
                **r.extra,
            }
            for r in runs
        ],
        "token_ids": first,
    }


def summarize_types(per_prompt: list[dict], types: list[str]) -> dict:
    """Median over the prompts of each type, and over all of them ("all")."""
    out = {}
    for t in [*types, "all"]:
        rows = [p for p in per_prompt if t in ("all", p["type"])]
        if not rows:
            continue
        same = [p["same_as_ar"] for p in rows if p["same_as_ar"] is not None]
        out[t] = {
            "prompts": len(rows),
            "decode_tokens_per_s": _median(p["decode_tokens_per_s"] for p in rows),
            "e2e_tokens_per_s": _median(p["e2e_tokens_per_s"] for p in rows),
            "ttft_s": _median(p["ttft_s"] for p in rows),
            "acceptance_rate": _median(p.get("acceptance_rate") for p in rows),
            "mean_tokens_per_round": _median(p.get("mean_tokens_per_round") for p in rows),
            "ssd_hit_rate": _median(p.get("ssd_hit_rate") for p in rows),
            "ssd_model_tokens_per_s": _median(p.get("ssd_model_tokens_per_s") for p in rows),
            "same_as_ar": all(same) if same else None,
            "same_as_ar_prompts": sum(same),
        }
    return out


def add_speedups(methods: dict) -> None:
    """speedup_vs_ar = decode tokens/s over our AR's, per prompt type."""
    ar = methods.get("ar")
    for res in methods.values():
        for t, row in res["types"].items():
            base = ar["types"].get(t, {}).get("decode_tokens_per_s") if ar else None
            mine = row["decode_tokens_per_s"]
            row["speedup_vs_ar"] = mine / base if base and mine else None


# ----------------------------------------------------------------------------- report


def machine_info(args) -> dict:
    import torch

    from specdec import __version__, kernels
    from specdec.platform import cpu_flags, cpu_identity

    ident, flags = cpu_identity(), cpu_flags()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "llama_cpp"):
        if importlib.util.find_spec(name) is not None:
            versions[name] = getattr(__import__(name), "__version__", "?")
    return {
        "cpu": ident.get("name") or platform.processor() or platform.machine(),
        # the model name alone ("AMD EPYC") may not say which core ran: family and model do
        "cpu_core": ident.get("core"),
        "cpu_family": ident.get("family"),
        "cpu_model": ident.get("model"),
        "cpu_flags": sorted(
            flags & {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"}
        ),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": args.threads,
        "dtype": args.dtype,
        "kernels": kernels.status(),
        "specdec": __version__,
        "versions": versions,
        "platform": platform.platform(),
        # other work on the same cores skews every number: keep the load in the record
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(report: dict) -> str:
    """Decode tokens/s per method and prompt type (with the speedup over our AR), end-to-end
    tokens/s, acceptance, tokens per round and agreement with AR."""
    types = [t for t in report["config"]["types"]] + ["all"]
    head = (
        ["method"]
        + [f"{t} tok/s" for t in types]
        + ["e2e tok/s", "accept", "tok/round", "hit", "model tok/s", "same as AR"]
    )
    rows = [head]
    for label, res in report["methods"].items():
        cells = [label]
        for t in types:
            row = res["types"].get(t)
            if row is None:
                cells.append("-")
                continue
            sp = row.get("speedup_vs_ar")
            cells.append(_fmt(row["decode_tokens_per_s"]) + (f" ({sp:.2f}x)" if sp else ""))
        total = res["types"]["all"]
        same = total["same_as_ar"]
        cells += [
            _fmt(total["e2e_tokens_per_s"]),
            _fmt(total["acceptance_rate"], ".3f"),
            _fmt(total["mean_tokens_per_round"]),
            _fmt(total.get("ssd_hit_rate"), ".2f"),
            _fmt(total.get("ssd_model_tokens_per_s")),
            "-"
            if same is None
            else f"{'yes' if same else 'no'} ({total['same_as_ar_prompts']}/{total['prompts']})",
        ]
        rows.append(cells)
    table = aligned_table(rows)
    for label, why in report.get("skipped", {}).items():
        table += f"\n{label}: not measured: {why}"
    return table


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path, Path]:
    from specdec.bench.chart import plot

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    text = json.dumps(report, indent=2) + "\n"
    stamped = out_dir / f"bench-{stamp}.json"
    stamped.write_text(text)
    latest = out_dir / "latest.json"
    latest.write_text(text)
    png = out_dir / "latest.png"
    plot(report, png)
    return stamped, latest, png


# ----------------------------------------------------------------------------- main


def bench_pass(spec, args, prompt_ids, max_len, bar) -> tuple[float, list[RunResult]]:
    """Load one method's models, warm up, run every prompt once, unload (freeing its memory
    before the next method loads). Returns the load time and one run per prompt."""
    bar.set_description(f"{spec.label} (loading)")
    t0 = time.perf_counter()
    engine = ENGINES[spec.kind](spec, args, max_len)
    load_s = time.perf_counter() - t0
    bar.set_description(spec.label)
    try:
        warm = prompt_ids[0][:WARMUP_PROMPT_TOKENS]
        engine.run(warm, WARMUP_NEW_TOKENS, args.temperature, args.seed)
        runs = []
        for ids in prompt_ids:
            runs.append(engine.run(ids, args.max_tokens, args.temperature, args.seed))
            bar.update()
    finally:
        engine.close()
        del engine
        gc.collect()
    return load_s, runs


def same_text_as_ar(spec: MethodSpec, temperature: float) -> bool:
    """Whether a row must give our AR's tokens: every row of ours when greedy; when sampling
    (with the bench's seed), the rows of ours that use the coupled sampler (the default for a
    seeded request)."""
    if spec.kind != "ours" or temperature == 0:
        return spec.kind == "ours" or temperature == 0
    return spec.kwargs.get("sampler", "auto") != "rejection"


def summarize_method(spec, args, prompts, prompt_ids, runs, load_s, ref) -> dict:
    """Medians over one method's repeats per prompt. Our greedy ``ar`` is its own reference:
    its repeats must agree."""
    self_ref = spec.label == "ar" and args.temperature == 0
    per_prompt = []
    for p, ids, prompt_runs in zip(prompts, prompt_ids, runs):
        want = prompt_runs[0].token_ids if self_ref else ref.get(p["id"])
        if not same_text_as_ar(spec, args.temperature):
            want = None
        per_prompt.append(summarize_prompt(p, len(ids), prompt_runs, want))
    return {
        "kind": spec.kind,
        "kwargs": _fill_draft(spec.kwargs, args.draft_model),
        "note": spec.note,
        "load_s": _median(load_s),
        "prompts": per_prompt,
    }


def run_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specdec.registry import resolve_model

    _settle(args)
    if args.fidelity:
        return run_fidelity(args)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    methods = select_methods(args.methods, args.model)
    methods, skipped = drop_crashing_peers(methods, args)
    prompts = load_prompts(types, args.prompts_per_type)
    prompt_ids = encode_prompts(prompts, resolve_model(args.model))
    max_len = max(len(ids) for ids in prompt_ids) + args.max_tokens + 8
    report = {
        "machine": machine_info(args),
        "config": {
            "model": str(args.model),
            "draft_model": str(args.draft_model),
            "dtype": args.dtype,
            "threads": args.threads,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "types": types,
            "prompts_per_type": args.prompts_per_type,
            "temperature": args.temperature,
            "methods": [m.label for m in methods],
            "quick": args.quick,
        },
        "prompts": [
            {"id": p["id"], "type": p["type"], "chat": p["chat"], "prompt_tokens": len(ids)}
            for p, ids in zip(prompts, prompt_ids)
        ],
        "methods": {},
        "skipped": skipped,
        "passes": pass_rows(args),
    }
    # Repeats are the outer loop and every repeat runs the methods in the opposite order to
    # the one before: a machine that speeds up or slows down during the run (other tenants,
    # thermals) then weighs on every method alike instead of on whichever ran last.
    runs = {m.label: [[] for _ in prompts] for m in methods}
    loads: dict[str, list[float]] = {m.label: [] for m in methods}
    total = len(methods) * len(prompts) * args.repeats
    with tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        for r in range(args.repeats):
            for spec in methods if r % 2 == 0 else methods[::-1]:
                load_s, got = bench_pass(spec, args, prompt_ids, max_len, bar)
                loads[spec.label].append(load_s)
                for per_prompt, run in zip(runs[spec.label], got):
                    per_prompt.append(run)
    ref: dict[str, list[int]] = {}
    if "ar" in runs:  # greedy, or sampled with the seed (coupled rows give the same text)
        ref = {p["id"]: rs[0].token_ids for p, rs in zip(prompts, runs["ar"])}
    for spec in methods:
        got = runs[spec.label], loads[spec.label]
        res = summarize_method(spec, args, prompts, prompt_ids, *got, ref)
        res["types"] = summarize_types(res["prompts"], types)
        report["methods"][spec.label] = res
    add_speedups(report["methods"])
    stamped, latest, png = write_report(report, Path(args.out))
    if report["passes"]:
        from specdec.bench.passes import format_pass_table

        print(format_pass_table(report["passes"]) + "\n")
    print(format_table(report))
    print(f"\nwrote {stamped}, {latest} and {png}")
    return 0


def drop_crashing_peers(methods: list[MethodSpec], args) -> tuple[list[MethodSpec], dict]:
    """The rows without the llama.cpp ones when llama.cpp crashes here (``llamacpp_crash``),
    and {label: why} of those dropped; a row named in ``--methods`` is an error instead."""
    peers = [m for m in methods if m.kind == "llamacpp"]
    why = llamacpp_crash(args.model, args.threads) if peers else None
    if why is None:
        return methods, {}
    named = {item.strip() for item in (args.methods or "").split(",")}
    if named & {m.label for m in peers}:
        raise ValueError(f"method {peers[0].label!r} cannot run here: {why}")
    print(f"warning: leaving out {', '.join(m.label for m in peers)}: {why}", file=sys.stderr)
    return [m for m in methods if m.kind != "llamacpp"], {m.label: why for m in peers}


def pass_rows(args: argparse.Namespace) -> list[dict]:
    """The per-pass table's rows: for each weight format, the target's passes and the draft's
    step as SD drafts with it (its quantization and output head)."""
    from specdec import LLM
    from specdec.bench.passes import pass_row

    formats = [d.strip() for d in args.pass_dtypes.split(",") if d.strip() not in ("", "none")]
    rows = []
    for dtype in formats:
        print(f"timing forward passes ({dtype} weights)...", file=sys.stderr, flush=True)
        pair = {"model": args.model, "draft_model": args.draft_model, "method": "sd"}
        with LLM(**pair, dtype=dtype, num_threads=args.threads, max_model_len=512) as llm:
            rows.append(pass_row(dtype, llm.target, llm.decoder.drafter.model))
    return rows


def run_fidelity(args: argparse.Namespace) -> int:
    from specdec.bench.fidelity import fidelity_report, format_fidelity

    rows = fidelity_report(args.model, threads=args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(args), "model": str(args.model), "fidelity": rows}
    path = out / f"fidelity-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(format_fidelity(rows))
    print(f"\nwrote {path}")
    return 0
