"""Sampling parameters and the one transform from logits to the distribution we sample.

Every decoding method (AR, the SD verifier, every drafter) turns logits into probabilities
with ``probabilities`` below, so the target's p and the draft's q are always defined the same
way: temperature, then top-k, then top-p. Temperature 0 is greedy: the distribution is a point
mass on the argmax, and the SD rejection rule then reduces to "accept while equal".
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.constraints import check_constraint
from specdec.coupling import PositionNoise
from specdec.processors import check_penalty
from specdec.tokenizer import lone_surrogate

# how a sampled (temperature > 0) request draws its tokens under speculation; greedy requests
# give the same text either way. "coupled": the same seed gives the same text with every method
# (coupling.py); "rejection": speculative sampling (verify.py), the best acceptance; "auto":
# coupled when the request has a seed, rejection when it does not.
SAMPLERS = ("auto", "coupled", "rejection")
MAX_LOGPROBS = 20  # the most alternatives a request may ask for at each position (logprobs.py)


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    sampler: str = "auto"
    # None: off; N >= 0: each generated token's logprob (logprobs.py) with the N most likely
    # alternatives at its position
    logprobs: int | None = None
    # the same for the prompt's tokens (the first has none); max_tokens=0 then only scores
    prompt_logprobs: int | None = None
    # logits processors (processors.py), applied before temperature/top-k/top-p; None = off.
    # OpenAI's presence/frequency penalties (in [-2, 2], over the output so far), logit_bias
    # ({token id: bias in [-100, 100]}, ids as ints or OpenAI's strings), and the repetition
    # penalty (> 0, 1 = off; over prompt and output, as HF/vLLM define it)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    # structured output (constraints.py): a picklable spec such as {"type": "json_schema",
    # "schema": {...}}, {"type": "json_object"} or {"type": "grammar", "grammar": "<lark>"};
    # only tokens that keep the output valid are sampled. None: unconstrained
    constraint: dict | None = None
    stop_strings: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self):
        def bad(msg: str):
            raise ValueError(f"invalid sampling parameter: {msg}")

        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            bad(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            bad(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            bad(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            bad(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not (0 < self.top_p <= 1):
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            bad(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if self.max_tokens < 0:
            bad(f"max_tokens must be >= 0 (0: only score the prompt), got {self.max_tokens}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            bad(f"seed must be an integer, got {self.seed!r}")
        if self.sampler not in SAMPLERS:
            bad(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (
                isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LOGPROBS
            ):
                bad(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {n!r}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            bad(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if any(lone_surrogate(s) is not None for s in stops):
            bad(f"stop must be valid Unicode text (no lone UTF-16 surrogates), got {self.stop!r}")
        self.stop_strings = tuple(stops)
        ids = list(self.stop_token_ids or [])
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            bad(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids
        for name, low, high in (
            ("presence_penalty", -2.0, 2.0),
            ("frequency_penalty", -2.0, 2.0),
            ("repetition_penalty", 0.0, None),
        ):
            value = getattr(self, name)
            problem = None if value is None else check_penalty(name, value, low, high)
            if problem:
                bad(problem)
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias, bad)
        if self.constraint is not None:  # raises ValueError naming what the engine rejects
            self.constraint = check_constraint(self.constraint)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def coupled(self) -> bool:
        """Draw from position-keyed noise (coupling.py): sampled requests whose sampler is
        "coupled", or "auto" with a seed."""
        if self.greedy:
            return False
        return self.sampler == "coupled" or (self.sampler == "auto" and self.seed is not None)


def _logit_bias(bias, bad) -> dict[int, float]:
    """{token id: bias} from ints or OpenAI's strings of ids, each bias in [-100, 100]."""
    if not isinstance(bias, dict):
        bad(f"logit_bias must be a map of token ids to numbers, got {bias!r}")
    out = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            bad(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
        problem = check_penalty(f"logit_bias[{key!r}]", value, -100.0, 100.0)
        if problem:
            bad("logit_bias values must " + problem.split(" must ", 1)[1] + f" (token {key!r})")
        out[token] = float(value)
    return out


class SequenceRNG:
    """A request's own randomness: its seed alone decides its samples, whatever else is in
    the batch. Unseeded requests draw a seed from the OS. Rejection sampling reads a stream of
    uniforms in call order; coupled sampling reads noise keyed by position (``noise``)."""

    def __init__(self, seed: int | None):
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self._rng = random.Random(self.seed)
        self.noise = PositionNoise(self.seed)

    def uniform(self) -> float:
        return self._rng.random()

    def uniforms(self, n: int) -> list[float]:
        r = self._rng.random
        return [r() for _ in range(n)]


def _param_tensors(params: Sequence[SamplingParams], device) -> tuple[torch.Tensor, ...]:
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    return temp, top_k, top_p


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of the (first) largest entry along the last dimension, as ``argmax(-1)``.
    On the CPU through numpy: torch's argmax over a 152K vocabulary takes ~130 us here,
    numpy's ~11, and a greedy SD round takes a dozen (NaN: the first NaN, in both)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.ascontiguousarray(x.numpy()).argmax(-1))
    return x.argmax(-1)


def point_masses(probs: torch.Tensor) -> torch.Tensor | None:
    """[...] the token of each row of probs [..., V] if every row is a point mass (greedy
    rows, their residuals), else None: sampling such a row needs no CDF."""
    if probs.device.type != "cpu" or probs.dtype not in (torch.float32, torch.float64):
        return None
    a = np.ascontiguousarray(probs.numpy())
    if a.size == 0 or not (np.count_nonzero(a, axis=-1) == 1).all():
        return None
    return torch.from_numpy(a.argmax(-1))


def probabilities(
    logits: torch.Tensor, params: Sequence[SamplingParams], vocab_size: int | None = None
) -> torch.Tensor:
    """The sampling distribution for each row of ``logits`` [N, ..., V] under ``params`` (one
    per row N). Entries >= ``vocab_size`` (padding rows beyond the tokenizer) get 0.

    Greedy rows are a point mass on the (first) argmax. Top-k keeps every token whose
    probability reaches the k-th largest (ties kept); top-p keeps the most probable tokens
    until their mass reaches top_p (always at least one; ties at the cut kept).
    Returns fp32 (fp64 for fp64 input) probabilities of the same shape.
    """
    shape = logits.shape
    n = shape[0]
    x = logits.reshape(n, -1, shape[-1])
    if not x.is_floating_point() or x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if vocab_size is not None and vocab_size < x.shape[-1]:
        x = x.clone()
        x[..., vocab_size:] = -math.inf
    temp, top_k, top_p = _param_tensors(params, x.device)
    greedy = temp == 0
    if greedy.all():  # the common case, without masked copies
        return _one_hot_argmax(x).reshape(shape)
    out = torch.empty_like(x)
    if greedy.any():
        out[greedy] = _one_hot_argmax(x[greedy])
    if (~greedy).any():
        s = ~greedy
        out[s] = _tempered(x[s], temp[s], top_k[s], top_p[s])
    return out.reshape(shape)


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    """Greedy rows: a point mass on the first argmax of each row of x [..., V]."""
    return torch.zeros_like(x).scatter_(-1, first_argmax(x)[..., None].to(x.device), 1.0)


def _tempered(x, temp, top_k, top_p):
    """Temperature, top-k, top-p for non-greedy rows. x [n, P, V]."""
    x = x / temp[:, None, None].to(x.dtype)
    vocab = x.shape[-1]
    if (top_k > 0).any():
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
        kmax = int(k.max())
        kth = x.topk(kmax, dim=-1).values.gather(
            -1, (k - 1)[:, None, None].expand(-1, x.shape[1], 1)
        )
        x = x.masked_fill(x < kth, -math.inf)
    probs = torch.softmax(x, dim=-1)
    if (top_p < 1).any():
        sorted_p = probs.sort(dim=-1, descending=True).values
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
        keep = before < top_p[:, None, None].to(probs.dtype)
        n_keep = keep.sum(-1, keepdim=True).clamp(min=1)
        cut = sorted_p.gather(-1, n_keep - 1)
        probs = torch.where(probs >= cut, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, uniforms: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row of ``probs`` [N, V] from one uniform in [0, 1)
    per row. Never returns a token of probability 0."""
    point = point_masses(probs)
    if point is not None:  # what the CDF would give for any uniform
        return point.to(probs.device)
    cdf = probs.double().cumsum(-1)
    u = torch.as_tensor(uniforms, dtype=torch.float64, device=probs.device)
    target = (u * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    idx = idx.clamp(max=probs.shape[-1] - 1)
    # rounding at the very top of the CDF can land past the last non-zero entry: step back
    zero = probs.gather(-1, idx[:, None]).squeeze(-1) <= 0
    if zero.any():
        last_nonzero = (probs > 0).cumsum(-1).argmax(-1)
        idx = torch.where(zero, last_nonzero, idx)
    return idx
