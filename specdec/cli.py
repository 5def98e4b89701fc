"""The ``specdec`` command line: generate, demo, models, bench, serve."""

from __future__ import annotations

import argparse
import sys
import time


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    from specdec.registry import DEFAULT_TARGET

    g = p.add_argument_group("engine")
    g.add_argument("--model", default=DEFAULT_TARGET, help="alias, HF folder or .gguf file")
    g.add_argument("--draft-model", default=None, help="draft model (sd, ssd)")
    g.add_argument("--method", default="ar", choices=["ar", "sd", "ngram", "ssd"])
    g.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="fixed speculation length K (default: adaptive)",
    )
    g.add_argument("--dtype", default="auto", choices=["auto", "exact", "float32", "bfloat16"])
    g.add_argument("--device", default="cpu")
    g.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    g.add_argument("--cpu-cores", default=None, help="pin to these CPU ids, e.g. 0 or 0,1")
    g.add_argument(
        "--draft-quantization",
        default="auto",
        choices=["auto", "none", "int8", "int4"],
        help="drafter weights (exactness is unaffected; auto: fastest here)",
    )
    g.add_argument(
        "--draft-vocab",
        default="auto",
        help="drafter output head size: an integer, 'auto' or 'full'",
    )
    s = p.add_argument_group("ssd")
    s.add_argument("--draft-device", default=None, help="device of the SSD drafter")
    s.add_argument("--draft-cpu-cores", default=None, help="CPU ids of the SSD drafter")
    s.add_argument(
        "--speculation-budget",
        type=int,
        default=None,
        help="SSD: speculations cached per sequence per round (B)",
    )
    s.add_argument("--fanout", default="geometric", choices=["geometric", "uniform", "pipeline"])
    s.add_argument("--saguaro-c", type=float, default=None, help="SSD: Saguaro C in (0, 1]")
    s.add_argument(
        "--backup",
        default="auto",
        choices=["auto", "neural", "fast"],
        help="SSD: what to draft on a cache miss",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", type=lambda s: [int(x) for x in s.split(",")], default=None)
    g.add_argument("--ignore-eos", action="store_true")


def parse_cores(text: str | None) -> list[int] | None:
    if text is None:
        return None
    cores: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            cores.extend(range(int(a), int(b) + 1))
        elif part.strip():
            cores.append(int(part))
    return cores


def llm_from_args(args: argparse.Namespace, **extra):
    from specdec import LLM

    return LLM(
        model=args.model,
        draft_model=args.draft_model,
        method=args.method,
        num_speculative_tokens=args.num_speculative_tokens,
        dtype=args.dtype,
        device=args.device,
        num_threads=args.threads,
        cpu_cores=parse_cores(args.cpu_cores),
        draft_quantization=args.draft_quantization,
        draft_vocab=args.draft_vocab
        if args.draft_vocab in ("auto", "full")
        else int(args.draft_vocab),
        draft_device=args.draft_device,
        draft_cpu_cores=parse_cores(args.draft_cpu_cores),
        speculation_budget=args.speculation_budget,
        fanout=args.fanout,
        saguaro_c=args.saguaro_c,
        backup=args.backup,
        **extra,
    )


def sampling_from_args(args: argparse.Namespace):
    from specdec import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=args.stop,
        stop_token_ids=args.stop_token_ids,
        ignore_eos=args.ignore_eos,
    )


def format_stats(m: dict) -> str:
    """Metrics of one request as readable lines."""
    lines = [
        f"method            {m['method']}",
        f"tokens            {m['generated_tokens']} generated, {m['prompt_tokens']} prompt",
        f"time              {m['wall_time_s']:.2f} s (first token after "
        f"{(m.get('time_to_first_token_s') or 0):.2f} s)",
        f"speed             {m['tokens_per_s']:.2f} tokens/s overall, "
        f"{m.get('decode_tokens_per_s', 0):.2f} tokens/s decoding",
        f"target passes     {m.get('target_forwards', 0)} ({m.get('rounds', 0)} rounds)",
    ]
    if "acceptance_rate" in m:
        pos = " ".join("-" if a is None else f"{a:.2f}" for a in m["per_position_acceptance"])
        hist = " ".join(f"{k}:{v}" for k, v in m["accepted_length_histogram"].items())
        lines += [
            f"acceptance        {m['acceptance_rate']:.3f} "
            f"({m['accepted_tokens']}/{m['drafted_tokens']} drafted tokens)",
            f"tokens per round  {m['mean_tokens_per_round']:.2f}",
            f"per position      {pos}",
            f"accepted lengths  {hist}",
            f"time split        draft {m['draft_time_s']:.2f} s, verify {m['verify_time_s']:.2f} s,"
            f" other {m['other_time_s']:.2f} s",
        ]
    for key in sorted(k for k in m if k.startswith("ssd_")):
        v = m[key]
        lines.append(f"{key:<17} {v:.3f}" if isinstance(v, float) else f"{key:<17} {v}")
    return "\n".join(lines)


# -- commands ---------------------------------------------------------------------------------
def cmd_generate(args) -> int:
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
            f"[{m['generated_tokens']} tokens in {dt:.2f} s: {m['tokens_per_s']:.2f} tokens/s, "
            f"{m.get('decode_tokens_per_s', 0):.2f} tokens/s decoding]",
            file=sys.stderr,
        )
        if args.stats:
            print(format_stats(m), file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    from specdec import registry

    if args.action == "pull":
        for name in args.names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]:
            print(registry.pull(name))
    elif args.action == "list":
        rows = registry.list_models()
        print(f"{'alias':<22} {'role':<8} {'size':>9}  cached  path / description")
        for r in rows:
            size = f"{r['size'] / 1e6:.0f} MB" if r.get("size") else "-"
            where = r["path"] if r["cached"] else r.get("description", "")
            print(
                f"{r['alias']:<22} {r.get('role', ''):<8} {size:>9}  "
                f"{'yes' if r['cached'] else 'no':<6}  {where}"
            )
    elif args.action == "path":
        if not args.names:
            raise ValueError("specdec models path NAME: name a model")
        print(registry.model_path(args.names[0]))
    return 0


def cmd_demo(args) -> int:
    from specdec.demo import run_demo

    return run_demo(args)


def cmd_bench(args) -> int:
    from specdec.bench.runner import run_bench

    return run_bench(args)


def cmd_serve(args) -> int:
    from specdec.server.app import serve

    return serve(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text, streamed to the terminal")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--stats", action="store_true", help="print the request's metrics")
    _add_engine_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="pull, list and locate models")
    m.add_argument("action", choices=["pull", "list", "path"])
    m.add_argument("names", nargs="*")
    m.set_defaults(func=cmd_models)

    d = sub.add_parser("demo", help="pull the default models and show the speedup")
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument("--threads", type=int, default=None)
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="side-by-side speed benchmark")
    try:
        from specdec.bench.runner import add_bench_args
    except ImportError:
        add_bench_args = None
    if add_bench_args is not None:
        add_bench_args(b)
    b.set_defaults(func=cmd_bench)

    try:
        from specdec.server.app import add_serve_args
    except ImportError:
        add_serve_args = None
    if add_serve_args is not None:
        s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
        add_serve_args(s)
        s.set_defaults(func=cmd_serve)
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


if __name__ == "__main__":
    sys.exit(main())
