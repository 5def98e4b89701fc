"""``specdec bench`` end to end on the tiny random checkpoints, in --quick mode."""

import json

import pytest

from specdec.bench.runner import METHODS, load_prompts, select_methods, unavailable_reason
from specdec.cli import build_parser

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench_args(tiny_dirs, out, methods, *extra):
    argv = ["bench", "--quick", "--model", str(tiny_dirs["llama"])]
    argv += ["--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32", "--threads", "2"]
    argv += ["--max-tokens", "12", "--methods", methods, "--out", str(out), *extra]
    return build_parser().parse_args(argv)


def test_quick_bench_reports_every_method(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "results"
    args = bench_args(tiny_dirs, out, "hf,ar,hf-assisted")
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "latest.json").read_text())
    assert list(report["methods"]) == ["ar", "hf", "hf-assisted"]  # ar first: the reference
    assert len(list(out.glob("bench-*.json"))) == 1
    for label, res in report["methods"].items():
        assert label in printed
        assert set(res["types"]) == {"code", "prose", "chat", "all"}
        for p in res["prompts"]:
            assert p["generated_tokens"] == 12  # exactly max_tokens, EOS ignored
            assert p["decode_tokens_per_s"] > 0 and p["e2e_tokens_per_s"] > 0
        assert res["types"]["all"]["decode_tokens_per_s"] > 0
    assert report["methods"]["ar"]["types"]["all"]["speedup_vs_ar"] == pytest.approx(1.0)
    # fp32 on both sides: transformers' greedy output is token-identical to ours
    assert report["methods"]["ar"]["types"]["all"]["same_as_ar"] is True
    assert report["methods"]["hf"]["types"]["all"]["same_as_ar"] is True
    assert report["methods"]["hf-assisted"]["types"]["all"]["mean_tokens_per_round"] >= 1
    assert report["machine"]["threads"] == 2 and report["machine"]["kernels"]
    assert "cpu_core" in report["machine"] and "cpu_family" in report["machine"]
    assert (out / "latest.png").read_bytes()[:8] == PNG_MAGIC


def test_speculative_rows_report_acceptance_and_match_ar(tiny_dirs, tmp_path):
    """Our speculative rows (those implemented so far) on the tiny fp32 pair: greedy output
    equals greedy AR, and a draft model's acceptance and tokens per round are recorded."""
    model = str(tiny_dirs["llama"])
    rows = [m for m in METHODS if m.kind == "ours" and m.label != "ar" and m.group == "main"]
    rows = [m for m in rows if unavailable_reason(m, model) is None]
    if not rows:
        pytest.skip("no speculative method implemented yet")
    out = tmp_path / "results"
    args = bench_args(tiny_dirs, out, ",".join(["ar", *(m.label for m in rows)]), "--types", "code")
    assert args.func(args) == 0
    report = json.loads((out / "latest.json").read_text())
    for m in rows:
        total = report["methods"][m.label]["types"]["all"]
        assert total["same_as_ar"] is True, m.label
        assert total["speedup_vs_ar"] > 0
        if "draft_model" in m.kwargs:  # a model drafter always drafts (n-gram lookup may not)
            assert 0 <= total["acceptance_rate"] <= 1 and total["mean_tokens_per_round"] >= 1


def test_sampled_bench_compares_the_samplers(tiny_dirs, tmp_path, capsys):
    """At temperature > 0 with a seed, the coupled rows give AR's very text, the rejection rows
    are not compared, and both report their acceptance side by side."""
    out = tmp_path / "results"
    extra = ("--types", "code", "--temperature", "0.8", "--seed", "3")
    args = bench_args(tiny_dirs, out, "ar,samplers", *extra)
    assert args.func(args) == 0
    report = json.loads((out / "latest.json").read_text())
    rows = report["methods"]
    assert list(rows) == ["ar", "sd-coupled", "sd-rejection", "ssd-coupled", "ssd-rejection"]
    assert report["config"]["temperature"] == 0.8
    for label, res in rows.items():
        total = res["types"]["all"]
        assert total["same_as_ar"] is (None if label.endswith("rejection") else True), label
        if label != "ar":
            assert 0 <= total["acceptance_rate"] <= 1, label
    assert "sd-rejection" in capsys.readouterr().out


def test_unknown_method_lists_available_ones(tiny_dirs):
    with pytest.raises(ValueError, match=r"unknown method 'nope'.*available here: ar, .*hf"):
        select_methods("ar,nope", str(tiny_dirs["llama"]))


def test_method_rows_are_filtered_by_availability(tiny_dirs):
    from specdec.config import METHODS as ENGINE_METHODS

    labels = [m.label for m in select_methods(None, str(tiny_dirs["llama"]))]
    assert labels[0] == "ar" and "hf" in labels
    for m in METHODS:
        if m.kind == "ours" and m.group == "main":
            assert m.kwargs["method"] in ENGINE_METHODS and m.label in labels
        if m.group != "main":
            assert m.label not in labels  # the SSD study rows run only when asked for
    study = [m.label for m in select_methods("ar,ssd-study", str(tiny_dirs["llama"]))]
    assert "ssd-uniform" in study and "sd-1core" in study and study[0] == "ar"
    assert "llamacpp" not in labels  # an HF folder has no GGUF file behind it


def test_prompt_set_has_every_type():
    prompts = load_prompts(["code", "prose", "chat"], 100)
    for t in ("code", "prose", "chat"):
        assert sum(p["type"] == t for p in prompts) >= 5
    assert all(isinstance(p["chat"], bool) and len(p["prompt"]) > 80 for p in prompts)
    with pytest.raises(ValueError, match="unknown prompt type"):
        load_prompts(["poetry"], 1)


def test_llamacpp_row_feeds_prompt_ids_and_stops_after_max_tokens(monkeypatch, tmp_path):
    """The llama.cpp glue, against a stand-in for llama_cpp.Llama (the real package is an
    optional source build): same prompt ids in, exactly n tokens out, EOS not a stop."""
    import sys
    import types
    from argparse import Namespace

    from specdec.bench import runner

    calls = {}

    class FakeLlama:
        def __init__(self, model_path, **kwargs):
            calls["init"] = dict(kwargs, model_path=model_path)

        def reset(self):
            calls["reset"] = calls.get("reset", 0) + 1

        def generate(self, tokens, **kwargs):
            calls["generate"] = (list(tokens), kwargs)
            while True:  # like llama.cpp: an endless stream, EOS (2) included
                yield 2

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    monkeypatch.setattr("specdec.registry.gguf_path", lambda name: gguf)
    spec = next(m for m in runner.METHODS if m.label == "llamacpp")
    args = Namespace(model="m", threads=2, seed=0)
    engine = runner.LlamaCppEngine(spec, args, max_len=64)
    res = engine.run([5, 6, 7], 10, 0.0, 0)
    assert res.token_ids == [2] * 10
    assert calls["generate"][0] == [5, 6, 7]
    assert calls["generate"][1]["temp"] == 0.0 and calls["generate"][1]["repeat_penalty"] == 1.0
    assert calls["init"]["n_threads"] == 2 and calls["init"]["model_path"] == str(gguf)
    assert calls["reset"] == 1 and res.decode_tokens_per_s > 0
    engine.close()


def test_child_crash_names_the_signal_or_the_error():
    """The probe that keeps a crashing llama.cpp from taking the bench's process down with it:
    a real child process, killed by a signal, failing, or fine."""
    from specdec.bench.runner import child_crash

    segv = "import os, signal, sys; print('dying', file=sys.stderr); os.kill(os.getpid(), 11)"
    assert child_crash(segv) == "killed by SIGSEGV (signal 11): dying"
    assert child_crash("raise ValueError('bad file')") == "exit status 1: ValueError: bad file"
    assert child_crash("import sys; assert sys.argv[1:] == ['a', '2']", "a", "2") is None
    assert child_crash("import time; time.sleep(30)", timeout_s=1) == "no answer within 1 s"


def test_a_crashing_llamacpp_is_left_out_or_refused(monkeypatch):
    """Picked by default, the llama.cpp rows are left out with the reason recorded; named in
    --methods, they are an error before anything is measured."""
    from argparse import Namespace

    from specdec.bench import runner

    why = "llama.cpp crashed decoding m.gguf in a probe run (killed by SIGSEGV (signal 11))"
    monkeypatch.setattr(runner, "llamacpp_crash", lambda model, threads: why)
    rows = [m for m in METHODS if m.label in ("ar", "sd", "llamacpp", "llamacpp-sd")]
    kept, skipped = runner.drop_crashing_peers(rows, Namespace(model="m", threads=2, methods=None))
    assert [m.label for m in kept] == ["ar", "sd"]
    assert skipped == {"llamacpp": why, "llamacpp-sd": why}
    named = Namespace(model="m", threads=2, methods="ar,llamacpp")
    with pytest.raises(ValueError, match="'llamacpp' cannot run here: llama.cpp crashed"):
        runner.drop_crashing_peers(rows[:1] + rows[2:3], named)
    fine = Namespace(model="m", threads=2, methods=None)
    monkeypatch.setattr(runner, "llamacpp_crash", lambda model, threads: None)
    assert runner.drop_crashing_peers(rows, fine) == (rows, {})


@pytest.mark.parametrize(
    "vendor, family, flags, core",
    [
        ("AuthenticAMD", "26", "avx2 avx512f", "Zen 5"),
        ("AuthenticAMD", "25", "avx2 avx512f", "Zen 4"),
        ("AuthenticAMD", "25", "avx2", "Zen 3"),
        ("GenuineIntel", "6", "avx2 avx512f amx_tile amx_int8", "Sapphire Rapids or newer (AMX)"),
    ],
)
def test_machine_record_names_the_core(monkeypatch, vendor, family, flags, core):
    """A cloud CPU's model name may be a bare "AMD EPYC": the record names the core from the
    family (and AVX-512 for family 25), which is what decides our kernels' speed; an Intel
    with AMX, whose model number a VM may change, from its flags."""
    from specdec import platform

    text = (
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 2\n"
        f"model name\t: AMD EPYC\nflags\t\t: fpu {flags}\n\nprocessor\t: 1\n"
    )
    monkeypatch.setattr(platform.Path, "read_text", lambda self: text)
    monkeypatch.setattr(platform, "cpu_flags", platform.cpu_flags.__wrapped__)
    ident = platform.cpu_identity.__wrapped__()
    assert ident == {
        "name": "AMD EPYC",
        "vendor": vendor,
        "family": int(family),
        "model": 2,
        "core": core,
    }
