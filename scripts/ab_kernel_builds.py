"""Two builds of our kernels taking turns in one process: a change's effect, measured.

This machine drifts by tens of percent within minutes, so a kernel change is judged by the old
and the new library alternating call by call, never by two runs minutes apart. Their order
alternates too, round by round (ABBA): with the old build always first, two copies of the same
build differed by 3.3% on the target's 1-token pass after 2000 tokens (the second slower), by
0.5-1.1% in ABBA order. Build the old one from the previous source (``git show
HEAD~1:specdec/kernels/gguf_kernels.h`` beside a copy of ``cpu.cpp``, compiled with the flags
of ``specdec.kernels.BUILDS``), then:

    python scripts/ab_kernel_builds.py OLD.so [--rounds 9] [--models] [--context 2000]
        [--new NEW.so] [--other-bits]

Prints medians of tiled products (cache-resident and from memory, 1-16 activation rows) and,
with ``--models``, of the default pair's forward passes after ``--context`` cached tokens
(needs ``specdec models pull``); checks that both builds give the same bits unless
``--other-bits`` says the change alters them on purpose. The new build is the one
``specdec.kernels`` loads (``SPECDEC_KERNELS`` picks it), or ``--new``'s.
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
from specdec.bench.passes import CONTEXT
from specdec.kernels import gguf as gk

sys.path.insert(0, str(Path(__file__).parent))
from bench_gguf_kernels import random_weight  # noqa: E402

Q = gguf.GGMLQuantizationType
ROWS = (1, 2, 3, 5, 9, 16)


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    abi = lib.specdec_abi_version()
    if abi not in (kernels.ABI_VERSION, 9):
        raise SystemExit(f"{path}: ABI {abi}, this script knows {kernels.ABI_VERSION} and 9")
    for name, argtypes in kernels._SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, kernels._RESTYPES.get(name)
    if abi == 9:  # gguf_dequantize had no N (the matrix's rows) before the tile pairs
        old = lib.gguf_dequantize
        old.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_long] * 2
        old.argtypes += [ctypes.c_void_p, ctypes.c_int]
        lib.gguf_dequantize = lambda q, w, ids, r, n, k, out, nt: old(q, w, ids, r, k, out, nt)
    return lib


def use(lib: ctypes.CDLL) -> None:
    kernels._load = lambda: (lib, "a/b")


def turns(libs: dict, r: int) -> list:
    """The builds in round r's order: as given in even rounds, reversed in odd ones."""
    order = list(libs.items())
    return order if r % 2 == 0 else order[::-1]


def report(title: str, times: dict, sizes, names) -> None:
    print(title)
    for name in names:
        one = statistics.median(times[(name, sizes[0])])
        cells = []
        for s in sizes:
            t = statistics.median(times[(name, s)])
            cells.append(f"{s}: {t * 1e3:.2f} ms ({t / one:.2f}x)")
        print(f"  {name}: " + "  ".join(cells))


def products(libs: dict, rounds: int, same_bits: bool) -> None:
    ops.set_num_threads(2)
    mats = {  # (weight, calls per timing): ~100-200 MB of weights a timing
        "Q4_K 4096x1536, cached": (random_weight(Q.Q4_K, 4096, 1536), 35),
        "Q6_K 1536x8960, cached": (random_weight(Q.Q6_K, 1536, 8960), 20),
        "Q5_0 4864x896, cached": (random_weight(Q.Q5_0, 4864, 896), 40),
        "Q4_0 4864x896, cached": (random_weight(Q.Q4_0, 4864, 896), 40),
        "Q8_0 4864x896, cached": (random_weight(Q.Q8_0, 4864, 896), 25),
        "IQ4_NL 4864x1536, cached": (random_weight(Q.IQ4_NL, 4864, 1536), 25),
        "IQ4_XS 4864x1536, cached": (random_weight(Q.IQ4_XS, 4864, 1536), 25),
        "Q4_K 143360x1536, from memory": (random_weight(Q.Q4_K, 143360, 1536), 1),
    }
    for title, (w, calls) in mats.items():
        tiled = {}  # each build tiles the matrix its own way (the tile pairs' order may differ)
        for name, lib in libs.items():
            use(lib)
            try:
                tiled[name] = gk.repack(w)
            except ValueError:  # a build from before the type had tiles: its file layout
                tiled[name] = w
            try:
                gk.linear(torch.zeros(1, w.in_features), tiled[name])
            except ValueError:  # a build from before the type
                print(f"{title}: build {name} has no kernel for it, skipped")
                break
        else:
            time_products(libs, title, w, calls, tiled, rounds, same_bits)


def time_products(libs, title, w, calls, tiled, rounds, same_bits) -> None:
    """The builds take turns on each count of x rows, round by round."""
    times, outs = {}, {}
    for r in range(rounds):
        for m in ROWS:
            x = torch.randn(m, w.in_features)
            for name, lib in turns(libs, r):
                use(lib)
                outs[name] = gk.linear(x, tiled[name])
                t0 = time.perf_counter()
                for _ in range(calls):
                    gk.linear(x, tiled[name])
                times.setdefault((name, m), []).append(time.perf_counter() - t0)
            if same_bits and not torch.equal(*outs.values()):
                raise SystemExit(f"{title}, {m} rows: the builds' bits differ")
    report(title, times, ROWS, libs)


def models(libs: dict, rounds: int, context: int, same_bits: bool) -> None:
    from specdec import LLM
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET

    llms = {}  # one copy of the pair per build: each tiles the weights at load its own way
    for name, lib in libs.items():
        use(lib)
        llms[name] = LLM(
            DEFAULT_TARGET, DEFAULT_DRAFT, "sd", num_threads=2, max_model_len=context + 64
        )
    for title, sizes in (("target pass", (1, 2, 3, 5, 9)), ("draft pass", (1, 4))):
        models, caches = {}, {}
        prompt = torch.randint(0, 1000, (1, context))
        for name, llm in llms.items():
            use(libs[name])
            models[name] = llm.target if title == "target pass" else llm.decoder.drafter.model
            caches[name] = models[name].new_cache(1, context + 20)
            models[name].forward(prompt, caches[name], logits_at=torch.tensor([[context - 1]]))
        times, outs = {}, {}
        for r in range(rounds):
            for s in sizes:
                tokens = torch.randint(0, 1000, (1, s))
                for name, lib in turns(libs, r):
                    use(lib)
                    model, cache = models[name], caches[name]
                    cache.rollback(0, context)
                    t0 = time.perf_counter()
                    outs[name] = model.forward(tokens, cache)
                    times.setdefault((name, s), []).append(time.perf_counter() - t0)
                if same_bits and not torch.equal(*outs.values()):
                    raise SystemExit(f"{title}, {s} tokens: the builds' bits differ")
        report(title, times, sizes, libs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the old build's libspecdec_cpu.so")
    ap.add_argument("--new", help="another build to compare instead of the one specdec loads")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--models", action="store_true", help="also the default pair's passes")
    ap.add_argument("--context", type=int, default=CONTEXT, help="cached tokens before a pass")
    ap.add_argument(
        "--other-bits", action="store_true", help="the change alters the bits: do not check them"
    )
    args = ap.parse_args()
    new = load(args.new) if args.new else kernels.library()
    if new is None:
        raise SystemExit(f"no kernels to compare: {kernels.status()}")
    print(f"new: {args.new or kernels.status()}; old: {args.old}")
    libs = {"old": load(args.old), "new": new}
    products(libs, args.rounds, not args.other_bits)
    if args.models:
        models(libs, args.rounds, args.context, not args.other_bits)


if __name__ == "__main__":
    main()
