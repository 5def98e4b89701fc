"""``specdec bench``: our decoding methods side by side with transformers and llama.cpp, on the
project's own prompts (``prompts.json``), with a JSON report, a printed table and a chart."""

from specdec.bench.runner import METHODS, MethodSpec, add_bench_args, run_bench

__all__ = ["METHODS", "MethodSpec", "add_bench_args", "run_bench"]
