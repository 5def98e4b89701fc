"""The fused layer loop (one kernel call a pass) against the Python loop, in one process.

Times the default pair's forward passes of 1 and 5 new tokens after 128 cached ones, the two
loops taking turns pass by pass (this machine drifts by tens of percent within minutes), and
prints the medians and the time saved. Needs the default models (``specdec models pull``).

    python scripts/bench_fused_layers.py [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec import LLM
from specdec.bench.passes import CONTEXT
from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(DEFAULT_TARGET, DEFAULT_DRAFT, "sd", num_threads=args.threads, max_model_len=512)
    for name, model in (("target", llm.target), ("draft", llm.decoder.drafter.model)):
        cache = model.new_cache(1, CONTEXT + 20)
        prompt = torch.randint(0, 1000, (1, CONTEXT))
        model.forward(prompt, cache, logits_at=torch.tensor([[CONTEXT - 1]]))
        times: dict[tuple[bool, int], list[float]] = {}
        for _ in range(args.rounds):
            for fused in (True, False):
                model.fuse_layers = fused
                for size in (1, 5):
                    tokens = torch.randint(0, 1000, (1, size))
                    cache.rollback(0, CONTEXT)
                    t0 = time.perf_counter()
                    model.forward(tokens, cache)
                    times.setdefault((fused, size), []).append(time.perf_counter() - t0)
        model.fuse_layers = True
        for size in (1, 5):
            f = statistics.median(times[(True, size)]) * 1e3
            p = statistics.median(times[(False, size)]) * 1e3
            print(
                f"{name} {size}-token pass: fused {f:.2f} ms, Python loop {p:.2f} ms, "
                f"{p - f:.2f} ms saved ({(p - f) / p:.1%})"
            )


if __name__ == "__main__":
    main()
