"""A run's manifest re-stamped with its models' identities (harness/models/identity.py), the numbers untouched.

The identity of a model was once a hash of its files, config.json included, and so changed with the transformers
version that wrote them (docs/DESIGN.md, "A model's identity"). This rewrites the `sha256` of the target (and its
`converted_from.weights_sha256`), of every drafter with weights (`settings.path`), and of a layer-skip drafter (its
kind, layer count and the target's identity, as harness/drafters/layerskip.py records it), from the model
directories themselves. The target must be found and be the run's (a conversion of the same GGUF, else the same
files by the earlier identity), else nothing is written; a drafter whose weights are gone, or replaced by other
weights, keeps its recorded hash, marked `"identity": "files-v0"`, and a note says so. A manifest whose identities
are already these is left byte for byte (a run made since the change records them itself).

    python -m harness.campaign.rehash RUN [--models DIR]    # DIR stands for the recorded paths' `models/`
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from bandit.logs.safeio import write_text
from harness.models.gguf import conversion_source
from harness.models.identity import legacy_sha256, model_sha256
from harness.models.lm import HarnessError, models_root

REPO = Path(__file__).resolve().parents[2]
SCHEME = "specbandit-model-identity-v1"
LEGACY = "files-v0"  # a drafter's hash of its files, recorded before the identity (its weights not at hand since)


def _find(recorded: str, models: Path | None) -> Path | None:
    rel = Path(recorded)
    tried = [rel] if rel.is_absolute() else [REPO / rel]
    if models is not None and not rel.is_absolute():
        tried += [models / rel.relative_to("models")] if rel.parts[:1] == ("models",) else [models / rel]
    return next((p for p in tried if p.is_dir()), None)


def _same_target(t: dict, d: Path) -> bool:
    """Whether directory d holds the target the manifest recorded: a conversion of the same GGUF (sha256), else the
    same files by the earlier identity."""
    src = (t.get("converted_from") or {}).get("sha256")
    if src is not None:
        return ((conversion_source(d) or {}).get("sha256")) == src
    return t.get("sha256") in (legacy_sha256(d), model_sha256(d))


def rehash(manifest: dict, models: Path | None) -> tuple[dict, list[str]]:
    """The manifest with every model identity recomputed (module docstring), and a line for each drafter whose
    weights are not at hand (absent, or other weights than the run's): it keeps its recorded hash, marked so."""
    m = json.loads(json.dumps(manifest))
    target = _find(m["target"]["path"], models)
    if target is None or not _same_target(m["target"], target):
        where = "not found (give --models DIR)" if target is None else f"{target} holds another model"
        raise HarnessError(f"target {m['target']['path']!r}: {where}; nothing written")
    tid = model_sha256(target)
    m["target"]["sha256"] = tid
    if isinstance(m["target"].get("converted_from"), dict):
        m["target"]["converted_from"]["weights_sha256"] = tid
    kept = []
    for name, d in m["drafters"].items():
        path = (d.get("settings") or {}).get("path")
        if d.get("kind") == "layerskip" and d.get("sha256"):
            text = f"layerskip:layers={d['settings']['layers']}:{tid}"
            d["sha256"] = hashlib.sha256(text.encode()).hexdigest()
        elif path and d.get("sha256") and d.get("identity") != LEGACY:
            found = _find(path, models)
            if found is not None and d["sha256"] in (legacy_sha256(found), model_sha256(found)):
                d["sha256"] = model_sha256(found)
            else:
                d["identity"] = LEGACY  # its weights are gone: the recorded hash stands, of the earlier scheme
                why = "not found" if found is None else f"{found} holds other weights"
                kept.append(f"drafter {name}: {path} {why}; its sha256 stays the earlier scheme's ({LEGACY})")
    return m, kept


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.campaign.rehash", description=__doc__.splitlines()[0])
    ap.add_argument("run", help="the run directory whose manifest.json to re-stamp")
    ap.add_argument("--models", help="models root (else $MACH_MODELS, else $SPECBANDIT_MODELS)")
    a = ap.parse_args(argv)
    if not a.run.strip():
        ap.error("RUN '': an empty path names no run")
    path = Path(a.run) / "manifest.json"
    if path.is_symlink() or not path.is_file():
        raise HarnessError(f"{path}: no manifest (or a symlink: not written through)")
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path}: not a JSON manifest ({e})") from None
    new, kept = rehash(m, models_root(a.models))
    for line in kept:
        print(f"note: {line}", file=sys.stderr)
    if new == m:
        print(f"{path}: every identity already {SCHEME}'s; nothing done")
        return
    write_text(path, json.dumps(new, indent=2) + "\n")
    print(f"{path}: target {new['target']['sha256'][:12]} ({SCHEME})")


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
