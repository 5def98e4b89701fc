"""The engine arguments of ``generate`` and ``serve``, the sampling arguments of ``generate``,
and the ``LLM`` and ``SamplingParams`` they describe."""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, fields

from specdec.config import DraftConfig, EngineConfig, SSDConfig, engine_options, keyword_of
from specdec.sampling import SAMPLERS


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """One flag per ``EngineConfig`` option (``specdec.config``): its default, choices and help
    come from there. List options (CPU ids) take "0,1" or "0-3"."""
    groups = {
        EngineConfig: p.add_argument_group("engine"),
        DraftConfig: p.add_argument_group("drafter (exactness does not depend on these)"),
        SSDConfig: p.add_argument_group("ssd"),
    }
    for cls, group in groups.items():
        for f in fields(cls):
            if not f.metadata:
                continue
            keyword = keyword_of(f)
            flags = f.metadata["flags"] or ["--" + keyword.replace("_", "-")]
            default = f.default if f.default is not MISSING else None
            group.add_argument(
                *flags,
                dest=keyword,
                default=default,
                type=_parser_of(f),
                choices=f.metadata["choices"],
                help=f.metadata["help"],
            )


def _parser_of(f):
    """How a flag's text becomes the option's value (from the field's annotation). Every
    integer option counts something (threads, tokens, requests): it must be >= 1."""
    kind = str(f.type).removesuffix(" | None")
    parsers = {"int": int_at_least(1), "float": finite_float, "list[int]": parse_cores}
    return parsers.get(kind)  # None: the text itself (str, and "int | str" options)


def int_at_least(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high], refused at parsing with the flag's name."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def finite_float(text: str) -> float:
    """An argparse type: a finite number (the option's own check says which range)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a duration in seconds, > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=finite_float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int_at_least(0), default=0, help="0 = off (default)")
    g.add_argument("--top-p", type=finite_float, default=1.0)
    g.add_argument("--max-tokens", type=int_at_least(1), default=128)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="auto",
        help="coupled: a seed gives the same text with every method; rejection: speculative "
        "sampling, the best acceptance; auto (default): coupled with a seed, else rejection",
    )
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--stop-token-ids", type=lambda s: [int(x) for x in s.split(",")], default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument(
        "--presence-penalty", type=float, default=None, help="[-2, 2], over the output so far"
    )
    g.add_argument("--frequency-penalty", type=float, default=None, help="[-2, 2]")
    g.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="> 0 (1 = off): seen tokens' positive logits divided, negative ones multiplied",
    )
    g.add_argument(
        "--logit-bias",
        type=parse_logit_bias,
        default=None,
        help='added to token ids\' logits: "ID:BIAS,ID:BIAS", each bias in [-100, 100]',
    )


def parse_logit_bias(text: str) -> dict[int, float]:
    """{token id: bias} from "5:1.5,7:-100"."""
    out = {}
    for part in text.split(","):
        token, sep, bias = part.partition(":")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID:BIAS pairs, got {part!r}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"expected ID:BIAS pairs, got {part!r}")
    return out


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
    """The ``LLM`` that the engine flags describe (``extra`` overrides or adds keywords)."""
    from specdec import LLM

    options = {keyword: getattr(args, keyword) for _, keyword in engine_options()}
    return LLM(**{**options, **extra})


def sampling_from_args(args: argparse.Namespace):
    from specdec import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        sampler=args.sampler,
        stop=args.stop,
        stop_token_ids=args.stop_token_ids,
        ignore_eos=args.ignore_eos,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        logit_bias=args.logit_bias,
    )
