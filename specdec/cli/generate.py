"""``specdec generate``: one prompt, its text streamed to the terminal (metrics on stderr)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict

from specdec.cli.args import add_engine_args, add_sampling_args, llm_from_args, sampling_from_args
from specdec.metrics import RequestMetrics


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text, streamed to the terminal")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--stats", action="store_true", help="print the request's metrics")
    add_engine_args(g)
    add_sampling_args(g)
    g.set_defaults(func=generate)


def format_stats(m: RequestMetrics) -> str:
    """Metrics of one request as readable lines."""
    lines = [
        f"method            {m.method}",
        f"tokens            {m.generated_tokens} generated, {m.prompt_tokens} prompt",
        f"time              {m.wall_time_s:.2f} s (first token after "
        f"{m.time_to_first_token_s or 0:.2f} s)",
        f"speed             {m.tokens_per_s:.2f} tokens/s overall, "
        f"{m.decode_tokens_per_s or 0:.2f} tokens/s decoding",
        f"target passes     {m.target_forwards} ({m.rounds} rounds)",
    ]
    s = m.speculation
    if s is not None:
        pos = " ".join("-" if a is None else f"{a:.2f}" for a in s.per_position_acceptance)
        hist = " ".join(f"{k}:{v}" for k, v in s.accepted_length_histogram.items())
        lines += [
            f"acceptance        {s.acceptance_rate:.3f} "
            f"({s.accepted_tokens}/{s.drafted_tokens} drafted tokens)",
            f"tokens per round  {s.mean_tokens_per_round:.2f}",
            f"per position      {pos}",
            f"accepted lengths  {hist}",
            f"time split        draft {s.draft_time_s:.2f} s, verify {s.verify_time_s:.2f} s,"
            f" other {s.other_time_s:.2f} s",
        ]
    if m.ssd is not None:
        for key, v in asdict(m.ssd).items():
            if v is not None:
                name = f"ssd_{key}"
                lines.append(f"{name:<17} {v:.3f}" if isinstance(v, float) else f"{name:<17} {v}")
    return "\n".join(lines)


def generate(args: argparse.Namespace) -> int:
    params = sampling_from_args(args)
    with llm_from_args(args) as llm:
        prompt = llm.chat_prompt(args.prompt) if args.chat else args.prompt
        t0 = time.perf_counter()
        for piece in llm.generate_stream(prompt, params):
            sys.stdout.write(piece)
            sys.stdout.flush()
        dt = time.perf_counter() - t0
        m = llm.last_output.metrics
        sys.stdout.write("\n")
        print(
            f"[{m.generated_tokens} tokens in {dt:.2f} s: {m.tokens_per_s:.2f} tokens/s, "
            f"{m.decode_tokens_per_s or 0:.2f} tokens/s decoding]",
            file=sys.stderr,
        )
        if args.stats:
            print(format_stats(m), file=sys.stderr)
    return 0
