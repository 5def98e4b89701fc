"""Forward-pass costs: what a speculative round is made of, per weight format.

A decode step reads every weight once, so on a CPU its time is bytes / memory bandwidth; a
verification pass of K+1 tokens should cost little more than a 1-token pass as long as the
kernels decode each weight block once for all rows. This table shows whether they do: the
target's pass time for 1, 2, 5, 9 and 16 tokens after a prompt, the draft model's 1-token step
(as SD drafts with it), and the weight bytes streamed per second of a 1-token pass, for each
weight format asked (``--pass-dtypes``).
"""

from __future__ import annotations

import statistics
import time

import torch

from specdec.bench.table import aligned_table

PASS_SIZES = (1, 2, 5, 9, 16)
CONTEXT = 128  # tokens in the cache before each timed pass


def weight_bytes(model) -> int:
    """Bytes of the matrices a pass reads (the embedding is only looked up, not streamed)."""
    w = model.w
    mats = [layer[n] for layer in w["layers"] for n in ("qkv", "o", "gate_up", "down")]
    return sum(_nbytes(m) for m in [*mats, w["lm_head"]])


def _nbytes(obj) -> int:
    if hasattr(obj, "nbytes") and callable(obj.nbytes):
        return obj.nbytes()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    parts = getattr(obj, "parts", None)
    if parts is not None:
        return sum(_nbytes(p) for p in parts)
    return sum(
        _nbytes(t)
        for t in (getattr(obj, "weight", None), getattr(obj, "scale", None))
        if t is not None
    )


def time_passes(model, sizes=PASS_SIZES, repeats: int = 5) -> dict[int, float]:
    """Median seconds of a pass over ``size`` new tokens after CONTEXT cached ones. The sizes
    take turns, repeat by repeat, so that a slow spell of a shared machine weighs on all of
    them alike instead of on one size's runs."""
    cache = model.new_cache(1, CONTEXT + max(sizes) + 1)
    vocab = min(model.config.vocab_size, 1000)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, CONTEXT), generator=gen)
    model.forward(prompt, cache, logits_at=torch.tensor([[CONTEXT - 1]]))
    tokens = {size: torch.randint(0, vocab, (1, size), generator=gen) for size in sizes}
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for rep in range(repeats + 1):  # the first round warms caches and is dropped
        for size in sizes:
            cache.rollback(0, CONTEXT)
            t0 = time.perf_counter()
            model.forward(tokens[size], cache)
            if rep:
                times[size].append(time.perf_counter() - t0)
    return {size: statistics.median(t) for size, t in times.items()}


def pass_row(label: str, target, draft, repeats: int = 9) -> dict:
    """One weight format's figures: target passes by size, draft step, GB/s, and ratios."""
    t = time_passes(target, PASS_SIZES, repeats)
    d = time_passes(draft, (1,), repeats)[1] if draft is not None else None
    nbytes = weight_bytes(target)
    return {
        "label": label,
        "target_pass_s": {str(k): v for k, v in t.items()},
        "target_weight_bytes": nbytes,
        "target_gb_per_s": nbytes / t[1] / 1e9,
        "pass5_over_pass1": t[5] / t[1],
        "draft_step_s": d,
        "draft_weight_bytes": weight_bytes(draft) if draft is not None else None,
    }


def format_pass_table(rows: list[dict]) -> str:
    head = ["weights", *[f"{n} tok ms" for n in PASS_SIZES], "5/1", "GB/s", "GB", "draft ms"]
    lines = [head]
    for r in rows:
        t = r["target_pass_s"]
        draft = r["draft_step_s"]
        lines.append(
            [
                r["label"],
                *[f"{t[str(n)] * 1e3:.1f}" for n in PASS_SIZES],
                f"{r['pass5_over_pass1']:.2f}",
                f"{r['target_gb_per_s']:.1f}",
                f"{r['target_weight_bytes'] / 1e9:.2f}",
                "-" if draft is None else f"{draft * 1e3:.1f}",
            ]
        )
    return aligned_table(lines)
