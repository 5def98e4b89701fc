"""The ``specdec`` command line: generate, demo, models, bench, serve."""

from __future__ import annotations

import argparse
import sys

from specdec.cli import generate, models
from specdec.cli.args import int_at_least, llm_from_args, parse_cores, sampling_from_args
from specdec.cli.generate import format_stats

__all__ = [
    "build_parser",
    "format_stats",
    "llm_from_args",
    "main",
    "parse_cores",
    "sampling_from_args",
]


def _demo(args) -> int:
    from specdec.demo import run_demo

    return run_demo(args)


def _bench(args) -> int:
    from specdec.bench.runner import run_bench

    return run_bench(args)


def _add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="pull the default models and show the speedup")
    d.add_argument("--max-tokens", type=int_at_least(1), default=128)
    d.add_argument("--threads", type=int_at_least(1), default=None)
    d.set_defaults(func=_demo)


def _add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="side-by-side speed benchmark")
    from specdec.bench.runner import add_bench_args

    add_bench_args(b)
    b.set_defaults(func=_bench)


def _add_serve_parser(sub) -> None:
    from specdec.cli import serve

    serve.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    models.add_parser(sub)
    _add_demo_parser(sub)
    _add_bench_parser(sub)
    _add_serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, NotImplementedError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
