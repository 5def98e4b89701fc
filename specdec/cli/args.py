"""The engine arguments of ``generate`` and ``serve``, the sampling arguments of ``generate``,
and the ``LLM`` and ``SamplingParams`` they describe."""

from __future__ import annotations

import argparse


def add_engine_args(p: argparse.ArgumentParser) -> None:
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
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
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


def add_sampling_args(p: argparse.ArgumentParser) -> None:
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
    """CPU ids from "0,2" or "0-3" (ranges inclusive); None stays None (no pinning)."""
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
