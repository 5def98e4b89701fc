"""Two builds of our kernels taking turns in one process: a change's effect, measured.

This machine drifts by tens of percent within minutes, so a kernel change is judged by the old
and the new library alternating call by call, never by two runs minutes apart. Build the old
one from the previous source (``git show HEAD~1:specdec/kernels/gguf_kernels.h`` beside a copy of
``cpu.cpp``, compiled with the flags of ``specdec.kernels.BUILDS``), then:

    python scripts/ab_kernel_builds.py OLD.so [--rounds 9] [--models]

Prints medians of tiled products (cache-resident and from memory, 1-16 activation rows) and,
with ``--models``, of the default pair's forward passes (needs ``specdec models pull``); checks
that both builds give the same bits. The new build is the one ``specdec.kernels`` loads
(``SPECDEC_KERNELS`` picks it).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import gguf
import torch

from specdec import kernels, ops
from specdec.kernels import gguf as gk

sys.path.insert(0, str(Path(__file__).parent))
from bench_gguf_kernels import random_weight  # noqa: E402

Q = gguf.GGMLQuantizationType
ROWS = (1, 2, 3, 5, 9, 16)


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    for name, argtypes in kernels._SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, kernels._RESTYPES.get(name)
    return lib


def use(lib: ctypes.CDLL) -> None:
    kernels._load = lambda: (lib, "a/b")


def report(title: str, times: dict, sizes, names) -> None:
    print(title)
    for name in names:
        one = statistics.median(times[(name, sizes[0])])
        cells = []
        for s in sizes:
            t = statistics.median(times[(name, s)])
            cells.append(f"{s}: {t * 1e3:.2f} ms ({t / one:.2f}x)")
        print(f"  {name}: " + "  ".join(cells))


def products(libs: dict, rounds: int) -> None:
    ops.set_num_threads(2)
    mats = {  # (weight, calls per timing): ~100-200 MB of weights a timing
        "Q4_K 4096x1536, cached": (random_weight(Q.Q4_K, 4096, 1536), 35),
        "Q6_K 1536x8960, cached": (random_weight(Q.Q6_K, 1536, 8960), 20),
        "Q5_0 4864x896, cached": (random_weight(Q.Q5_0, 4864, 896), 40),
        "Q4_K 143360x1536, from memory": (random_weight(Q.Q4_K, 143360, 1536), 1),
    }
    for title, (w, calls) in mats.items():
        w = gk.repack(w)
        times, outs = {}, {}
        for _ in range(rounds):
            for m in ROWS:
                x = torch.randn(m, w.in_features)
                for name, lib in libs.items():
                    use(lib)
                    outs[name] = gk.linear(x, w)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        gk.linear(x, w)
                    times.setdefault((name, m), []).append(time.perf_counter() - t0)
                if not torch.equal(*outs.values()):
                    raise SystemExit(f"{title}, {m} rows: the builds' bits differ")
        report(title, times, ROWS, libs)


def models(libs: dict, rounds: int) -> None:
    from specdec import LLM
    from specdec.bench.passes import CONTEXT
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    llm = LLM(DEFAULT_TARGET, DEFAULT_DRAFT, "sd", num_threads=2, max_model_len=512)
    for title, model, sizes in (
        ("target pass", llm.target, (1, 2, 3, 5, 9)),
        ("draft pass", llm.decoder.drafter.model, (1, 4)),
    ):
        cache = model.new_cache(1, CONTEXT + 20)
        prompt = torch.randint(0, 1000, (1, CONTEXT))
        model.forward(prompt, cache, logits_at=torch.tensor([[CONTEXT - 1]]))
        times, outs = {}, {}
        for _ in range(rounds):
            for s in sizes:
                tokens = torch.randint(0, 1000, (1, s))
                for name, lib in libs.items():
                    use(lib)
                    cache.rollback(0, CONTEXT)
                    t0 = time.perf_counter()
                    outs[name] = model.forward(tokens, cache)
                    times.setdefault((name, s), []).append(time.perf_counter() - t0)
                if not torch.equal(*outs.values()):
                    raise SystemExit(f"{title}, {s} tokens: the builds' bits differ")
        report(title, times, sizes, libs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the old build's libspecdec_cpu.so")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--models", action="store_true", help="also the default pair's passes")
    args = ap.parse_args()
    new = kernels.library()
    if new is None:
        raise SystemExit(f"no kernels to compare: {kernels.status()}")
    print(f"new: {kernels.status()}; old: {args.old}")
    libs = {"old": load(args.old), "new": new}
    products(libs, args.rounds)
    if args.models:
        models(libs, args.rounds)


if __name__ == "__main__":
    main()
