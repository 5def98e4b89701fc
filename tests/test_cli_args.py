"""The command line refuses numbers no option can take (0 threads, a negative queue, a port
past 65535, a timeout of 0 or nan) while parsing, naming the flag: before any model loads."""

from __future__ import annotations

import pytest

from specdec.cli import build_parser, main
from specdec.config import EngineConfig, engine_options

BAD = [
    # (argv, the flag, what argparse says about it)
    (["generate", "x", "--threads", "0"], "--threads", "must be an integer >= 1, got 0"),
    (["generate", "x", "--threads", "-4"], "--threads", "must be an integer >= 1, got -4"),
    (["generate", "x", "--threads", "two"], "--threads", "must be an integer, got 'two'"),
    (["serve", "--threads", "0"], "--threads", ">= 1"),
    (["demo", "--threads", "0"], "--threads", ">= 1"),
    (["demo", "--max-tokens", "0"], "--max-tokens", ">= 1"),
    (["generate", "x", "--max-model-len", "0"], "--max-model-len", ">= 1"),
    (["generate", "x", "--max-num-seqs", "-1"], "--max-num-seqs", ">= 1"),
    (["generate", "x", "-k", "0"], "-k/--num-speculative-tokens", ">= 1"),
    (["generate", "x", "--speculation-budget", "0"], "--speculation-budget", ">= 1"),
    (["generate", "x", "--ngram-min", "0"], "--ngram-min", ">= 1"),
    (["generate", "x", "--saguaro-c", "nan"], "--saguaro-c", "must be a finite number"),
    (["generate", "x", "--ssd-timeout-s", "inf"], "--ssd-timeout-s", "must be a finite number"),
    (["generate", "x", "--max-tokens", "0"], "--max-tokens", ">= 1"),
    (["generate", "x", "--top-k", "-1"], "--top-k", "must be an integer >= 0, got -1"),
    (["generate", "x", "--temperature", "nan"], "--temperature", "must be a finite number"),
    (["serve", "--port", "70000"], "--port", "must be an integer in [0, 65535], got 70000"),
    (["serve", "--port", "-1"], "--port", "in [0, 65535]"),
    (["serve", "--max-waiting", "-1"], "--max-waiting", "must be an integer >= 0, got -1"),
    (["serve", "--max-body-bytes", "0"], "--max-body-bytes", "must be an integer >= 1, got 0"),
    (["serve", "--header-timeout", "0"], "--header-timeout", "seconds > 0, got '0'"),
    (["serve", "--header-timeout", "-5"], "--header-timeout", "seconds > 0"),
    (["serve", "--body-timeout", "nan"], "--body-timeout", "must be a finite number"),
]


@pytest.mark.parametrize("argv,flag,says", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_numbers_are_refused_while_parsing(capsys, argv, flag, says):
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "error: argument" in ln)
    assert f"argument {flag}: " in line and says in line, err


@pytest.mark.parametrize(
    "argv,dest,value",
    [
        (["generate", "x", "--threads", "1"], "num_threads", 1),
        (["serve", "--port", "0"], "port", 0),  # 0: any free port
        (["serve", "--max-waiting", "0"], "max_waiting", 0),  # 0: no queue, 429 at once
        (["serve", "--header-timeout", "2.5"], "header_timeout", 2.5),
        (["generate", "x", "--top-k", "0"], "top_k", 0),
        (["generate", "x", "--saguaro-c", "0.5"], "saguaro_c", 0.5),
    ],
)
def test_edge_values_are_accepted(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_parsing_bound_is_the_configs_own():
    """Every integer engine option is refused at 0 by the flag and by EngineConfig alike
    (so the flag's bound is no stricter than what LLM(...) accepts, and no looser)."""
    ints = [(f, kw) for f, kw in engine_options() if str(f.type).removesuffix(" | None") == "int"]
    assert {kw for _, kw in ints} >= {"num_threads", "max_model_len", "num_speculative_tokens"}
    parser = build_parser()
    for f, keyword in ints:
        flag = (f.metadata["flags"] or ["--" + keyword.replace("_", "-")])[-1]
        with pytest.raises(SystemExit):
            parser.parse_args(["generate", "x", flag, "0"])
        assert parser.parse_args(["generate", "x", flag, "1"]).__dict__[keyword] == 1
        with pytest.raises(ValueError, match=keyword):
            EngineConfig.from_keywords(**{keyword: 0})
