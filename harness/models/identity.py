"""A model's identity: one sha256 of what it computes, the same whatever tool or version wrote its files.

Hashed, in this order: each tensor of the directory's safetensors files, by name (sorted over all files), as
`name`, `dtype`, `shape` and its raw bytes; then the config's architecture fields (`arch_fields`) as canonical JSON.
Left out: the files' names and how tensors are split over them, the header's metadata and key order, and every
config field that records a tool rather than the computation (`transformers_version`, a checkpoint's name, the
dtype the tensors already carry, generation token ids, training-only settings). Two transformers versions that
spell the same rotary embedding differently (`rope_theta` beside `rope_scaling`, or one `rope_parameters`) or leave
a derived `head_dim` out give the same hash. A directory without a config.json hashes its tensors alone.

    python -m harness.models.identity DIR [DIR ...]     # each directory's identity
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

# config fields that name a tool, a file or a training setting, never what a forward computes
NOT_ARCHITECTURE = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "_model_name_or_path",
        "_commit_hash",
        "dtype",
        "torch_dtype",
        "use_cache",
        "initializer_range",
        "attention_dropout",
        "hidden_dropout",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
    }
)
CHUNK = 1 << 24  # bytes hashed at a time: a large tensor is never copied whole


def arch_fields(config: dict) -> dict:
    """The config's fields that change the computation, in one spelling (module docstring)."""
    out = {k: v for k, v in config.items() if k not in NOT_ARCHITECTURE}
    rp = out.pop("rope_parameters", None)
    if isinstance(rp, dict):  # transformers >= 5 folds rope_theta and rope_scaling into one dict
        rp = dict(rp)
        if "rope_theta" in rp:
            out.setdefault("rope_theta", rp.pop("rope_theta"))
        if rp.get("rope_type", "default") == "default" and set(rp) <= {"rope_type"}:
            rp = None
        if rp is not None:
            out.setdefault("rope_scaling", rp)
    if out.get("rope_scaling") is None:
        out.pop("rope_scaling", None)
    heads, hidden = out.get("num_attention_heads"), out.get("hidden_size")
    if out.get("head_dim") is None and isinstance(heads, int) and heads > 0 and isinstance(hidden, int):
        out["head_dim"] = hidden // heads  # written by some versions, derived by others
    if isinstance(out.get("layer_types"), list) and set(out["layer_types"]) <= {"full_attention"}:
        del out["layer_types"]  # every layer full attention: the default that older versions do not write
    return {k: arch_fields(v) if isinstance(v, dict) else v for k, v in out.items()}


def _tensors(path: Path) -> list[tuple[str, Path]]:
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                names = list(st.keys())
        except Exception as e:  # safetensors' own error type: a damaged or foreign file
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        for name in names:
            if name in found:
                raise ValueError(f"{f}: tensor {name!r} is also in {found[name].name}")
            found[name] = f
    return sorted(found.items())


def model_sha256(path: Path | str) -> str:
    """The identity of the model in directory `path` (module docstring): sha256 hex."""
    import torch
    from safetensors import safe_open

    path = Path(path)
    h = hashlib.sha256(b"specbandit-model-identity-v1\n")
    opened: dict[Path, object] = {}
    try:
        for name, f in _tensors(path):
            if f not in opened:
                opened[f] = safe_open(str(f), framework="pt").__enter__()
            t = opened[f].get_tensor(name).contiguous()
            h.update(json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)]).encode() + b"\n")
            data = t.reshape(-1).view(torch.uint8).numpy()  # raw bytes, bfloat16 included (numpy has none)
            for i in range(0, data.size, CHUNK):
                h.update(data[i : i + CHUNK].tobytes())
    finally:
        for st in opened.values():
            st.__exit__(None, None, None)
    cfg = path / "config.json"
    if cfg.is_file():
        h.update(b"config\n" + json.dumps(arch_fields(json.loads(cfg.read_text())), sort_keys=True).encode())
    return h.hexdigest()


def legacy_sha256(path: Path | str) -> str:
    """The earlier identity (a hash of the safetensors files and config.json as bytes), kept only to recognise a
    model a manifest recorded by it (harness/campaign/rehash.py): it changed with the tool that wrote config.json."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("config.json")):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-1].strip())
        sys.exit(0 if len(sys.argv) > 1 else 2)
    bad = 0
    for d in sys.argv[1:]:
        try:
            print(f"{model_sha256(Path(d))}  {d}")
        except (OSError, ValueError) as e:
            print(f"error: {d}: {e}", file=sys.stderr)
            bad = 1
    sys.exit(bad)
