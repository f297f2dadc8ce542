"""`specbandit convert-checkpoint SRC DST`: pickled head weights (`.bin`, `.pt`, `.pth`) to safetensors, once.

This is the only place the project unpickles, and it does so with `torch.load(weights_only=True)`, which
reads tensors and plain containers and refuses pickled code. Everything else (the sweep, the head loaders in
harness/models/heads.py) reads safetensors only and names this command when it meets a pickle-only directory.

SRC is one weight file or a directory of them; each becomes a safetensors file in the directory DST, named
the way the loaders look for it (`pytorch_model.bin` -> `model.safetensors`, as transformers does;
`medusa_lm_head.pt` -> `medusa_lm_head.safetensors`; otherwise the same stem), and SRC's `config.json` is
copied beside them. Nothing is overwritten: an existing output is an error. DST may be SRC's own directory
(the weights are then written next to the pickles, and config.json is already there).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Annotated

import torch
import typer
from safetensors.torch import save

from bandit.logs.safeio import write_file

from .head_formats import PICKLED
from .lm import HarnessError


def output_name(src: Path) -> str:
    """The safetensors name the loaders expect for a pickled weight file."""
    stem = src.stem
    if stem == "pytorch_model" or stem.startswith("pytorch_model-"):  # transformers' own pairing
        stem = "model" + stem[len("pytorch_model") :]
    return stem + ".safetensors"


def _sources(src: Path) -> list[Path]:
    if src.is_file():
        if src.suffix not in PICKLED:
            raise HarnessError(f"{src}: not a pickled weight file (expected {', '.join(PICKLED)})")
        return [src]
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such file or directory")
    found = sorted(p for p in src.iterdir() if p.is_file() and p.suffix in PICKLED)
    if not found:
        raise HarnessError(f"{src}: no {', '.join(PICKLED)} weight files to convert")
    return found


def read_pickled(path: Path) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} state dict, unpickled with weights_only=True, on the CPU."""
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HarnessError(f"{path}: cannot be read with torch.load(weights_only=True): {first}") from None
    if not isinstance(obj, dict) or not obj:
        raise HarnessError(f"{path}: holds a {type(obj).__name__}, expected a state dict {{name: tensor}}")
    bad = [str(k) for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        raise HarnessError(
            f"{path}: entries that are not name -> tensor: {', '.join(bad[:6])}"
            " (a nested checkpoint? save its state dict alone)"
        )
    # clone: safetensors refuses tensors that share storage (medusa-llm's repeated ResBlock saves one
    # module under several keys) and views that are not contiguous
    return {k: v.detach().clone().contiguous() for k, v in obj.items()}


def convert_checkpoint(src: str | Path, dst: str | Path) -> list[Path]:
    """Convert SRC (a file or a directory of pickled weights) into DST; returns the files written."""
    src, dst = Path(src), Path(dst)
    files = _sources(src)
    src_dir = src if src.is_dir() else src.parent
    outs = [dst / output_name(f) for f in files]
    cfg = src_dir / "config.json"
    copy_cfg = cfg.is_file() and (dst.resolve() != src_dir.resolve())
    if os.path.islink(dst):
        raise HarnessError(f"{dst}: is a symlink: convert-checkpoint never writes through one (choose another DST)")
    # lexists: a dangling symlink is taken too (writing there would create its target elsewhere)
    taken = [p for p in outs + ([dst / "config.json"] if copy_cfg else []) if os.path.lexists(p)]
    if taken:
        raise HarnessError(f"{taken[0]}: already exists; convert-checkpoint never overwrites (choose another DST)")
    if len(set(outs)) != len(outs):
        raise HarnessError(f"{src}: two weight files map to one output name ({', '.join(o.name for o in outs)})")
    states = [read_pickled(f) for f in files]  # every input read before anything is written
    dst.mkdir(parents=True, exist_ok=True)
    try:
        for f, out, state in zip(files, outs, states):
            blob = save(state, metadata={"format": "pt", "converted_from": f.name})
            write_file(out, lambda fh, b=blob: fh.write(b), replace_different=False)
        if copy_cfg:
            write_file(dst / "config.json", lambda fh: fh.write(cfg.read_bytes()), replace_different=False)
            outs.append(dst / "config.json")
    except FileExistsError as e:  # a file or symlink put there meanwhile
        raise HarnessError(f"{e.filename}: {e.strerror}; convert-checkpoint never overwrites") from None
    return outs


def cli(
    src: Annotated[Path, typer.Argument(help="a .bin/.pt/.pth weight file, or a directory of them")],
    dst: Annotated[Path, typer.Argument(help="the directory to write the safetensors (and config.json) into")],
) -> None:
    """Convert pickled head weights (EAGLE's pytorch_model.bin, Medusa's medusa_lm_head.pt) to safetensors, once.

    The one step that unpickles (torch.load with weights_only=True); the sweep reads safetensors only. SRC's
    config.json is copied to DST; nothing is overwritten. Then pass DST as the drafter's path=.
    """
    for out in convert_checkpoint(src, dst):
        typer.echo(f"wrote {out}")
