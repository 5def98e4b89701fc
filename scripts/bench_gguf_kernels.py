"""GB/s of weight bytes our GGUF kernels stream, and what a verify pass of M rows costs.

For the big matrices of Qwen2.5-Coder-1.5B Q4_K_M (and the 0.5B draft's types), prints per
type and shape: M = 1 time and GB/s, the time ratios M = 5, 9, 16 over M = 1, with 1 and 2
threads, and the bf16 kernel (``linear_bf16``) on the same shape; for the types the loader
puts in 8-row tiles, a row for the tiles and one for the file's layout. Weights are random
valid blocks (speed does not depend on the values).

    python scripts/bench_gguf_kernels.py [--threads 1 2] [--reps 30] [--only Q4_K Q6_K]
        [--rows 1024]   # cut every matrix to 1024 rows: weights in L3, the compute cost alone
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np
import torch

from specdec import kernels, ops
from specdec.kernels import gguf as gk

Q = gguf.GGMLQuantizationType
# (type, out_features, in_features, what)
SHAPES = [
    (Q.Q4_K, 17920, 1536, "1.5B gate|up"),
    (Q.Q4_K, 1536, 8960, "1.5B down"),
    (Q.Q6_K, 1536, 8960, "1.5B down"),
    (Q.Q6_K, 151936, 1536, "1.5B head"),
    (Q.Q5_0, 9728, 896, "0.5B gate|up"),
    (Q.Q8_0, 151936, 896, "0.5B head"),
    (Q.Q4_0, 4096, 1536, "Q4_0"),
    (Q.Q4_1, 4096, 1536, "Q4_1"),
    (Q.Q4_0, 17920, 1536, "gate|up as Q4_0"),
    (Q.IQ4_NL, 17920, 1536, "gate|up as IQ4_NL"),
    (Q.IQ4_XS, 17920, 1536, "gate|up as IQ4_XS"),
]


def random_weight(qtype, n: int, k: int) -> gk.PackedWeight:
    rng = np.random.default_rng(0)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for at in gk.SCALE_BYTES[qtype]:  # small and finite
        scale = (rng.random((n, k // block, 1)) * 1e-3).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8)
    return gk.pack(int(qtype), torch.from_numpy(raw.reshape(n, -1)), n, k)


def timed(fn, reps: int) -> float:
    """The fastest of reps calls: on a shared machine, the one least disturbed by others."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench(qtype, n: int, k: int, what: str, threads: int, reps: int) -> None:
    w = random_weight(qtype, n, k)
    tiled = gk.repack(w)
    if tiled is not w:  # the loader's layout first, then the file's
        bench_layout(tiled, n, k, what, threads, reps)
    bench_layout(w, n, k, what, threads, reps)


def bench_layout(w: gk.PackedWeight, n: int, k: int, what: str, threads: int, reps: int):
    wb = ops.LinearWeight(torch.randn(n, k).bfloat16())
    ops.set_num_threads(threads)
    times, btimes = {}, {}
    for m in (1, 5, 9, 16):
        x = torch.randn(m, k)
        times[m] = timed(lambda x=x: gk.linear(x, w), reps)
        btimes[m] = timed(lambda x=x: ops.linear(x, wb), reps)
    gbs = w.nbytes() / times[1] / 1e9
    per_group = times[1] / (n * k / 256) * 1e9
    bgbs = n * k * 2 / btimes[1] / 1e9
    ratios = " ".join(f"{times[m] / times[1]:4.2f}" for m in (5, 9, 16))
    bratios = " ".join(f"{btimes[m] / btimes[1]:4.2f}" for m in (5, 9, 16))
    layout = "tiles" if w.qtype in gk.FILE_TYPE else "file"
    name = Q(gk.FILE_TYPE.get(w.qtype, w.qtype)).name
    print(
        f"{name:5} {layout:5} {what:13} {n:6}x{k:<5} t={threads} | M=1 {times[1] * 1e3:6.2f} ms "
        f"{gbs:5.1f} GB/s {per_group:5.1f} ns/256w | M5/9/16 {ratios} | "
        f"bf16 M=1 {btimes[1] * 1e3:6.2f} ms {bgbs:5.1f} GB/s, M5/9/16 {bratios}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", nargs="*", default=None, help="type names, e.g. Q4_K Q6_K")
    ap.add_argument("--rows", type=int, default=0, help="cut each matrix to this many rows")
    args = ap.parse_args()
    print(kernels.status())
    for qtype, n, k, what in SHAPES:
        if args.only and Q(qtype).name not in args.only:
            continue
        for t in args.threads:
            bench(qtype, min(n, args.rows or n), k, what, t, args.reps)


if __name__ == "__main__":
    main()
