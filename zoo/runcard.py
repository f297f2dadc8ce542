"""A campaign's card, written beside its logs: what was measured, on which models, and whether the outputs are
ones a researcher would read.

    python -m zoo.runcard RUN [--heads DIR ...]

RUN/CARD.md holds
- the target: its name, weights sha256 and, for a converted GGUF, the source file, package and sha256;
- the output gates [MEASURED] on `outputs.jsonl` (every part's): at least 16 output tokens on 95% of each
  workload's prompts, fewer than 10% of all outputs ending in a short loop (zoo/cards.py's definitions, the
  zoo's own card gates);
- every drafter: name, kind, settings and sha256 (the manifest's record);
- each trained head's card (`--heads DIR`: a directory `python -m zoo.heads` wrote, with README.md and
  training_info.json), copied into RUN/cards/<name>.md and .json, so that the run keeps the heads' training
  time, data size and held-out acceptance when the weights (not committed) are gone.

Everything is read from RUN and the heads' cards; nothing is typed. Exit 1 when an output gate fails (the card is
still written: it says which gate and by how much).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bandit.logs.safeio import write_text

from .cards import count_output, output_gates, output_table

CARD = "CARD.md"


class CardError(Exception):
    """Bad input: one line naming where."""


def _json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CardError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CardError(f"{path}: not a JSON object")
    return obj


def output_stats(run: Path) -> dict[str, dict[str, int]]:
    """Per workload (in order of first appearance) over every outputs*.jsonl of the run: n, ge16, loop, tokens."""
    files = sorted(run.glob("outputs*.jsonl"))
    if not files:
        raise CardError(f"{run}: no outputs.jsonl (a run of the sweep writes one; see harness/outputs.py)")
    stats: dict[str, dict[str, int]] = {}
    for f in files:
        for lineno, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                wl, out = rec["workload"], rec["output_ids"]
            except (ValueError, KeyError, TypeError):
                raise CardError(f"{f}:{lineno}: not an outputs line (workload, output_ids)") from None
            if not isinstance(wl, str) or not isinstance(out, list):
                raise CardError(f"{f}:{lineno}: workload must be a string and output_ids a list")
            count_output(stats.setdefault(wl, dict(n=0, ge16=0, loop=0, tokens=0)), out)
    return stats


def target_lines(m: dict) -> list[str]:
    t = m["target"]
    lines = [f"- name: `{t['name']}`, path `{t['path']}`", f"- weights sha256 `{t.get('sha256')}`"]
    src = t.get("converted_from")
    if src:
        lines.append(
            f"- converted from `{src['file']}` (package `{src.get('package')}` {src.get('version')}), sha256 "
            f"`{src['sha256']}` (`python -m harness.gguf`, dequantized to {src.get('dtype', 'float32')})"
        )
    return lines


def gates_lines(stats: dict) -> tuple[list[str], bool]:
    rows = output_table(stats).splitlines()
    gates = output_gates(stats)
    rows += [""] + [f"- {'PASS' if ok else 'FAIL'}: {name} ({detail})" for name, ok, detail in gates]
    return rows, all(ok for _, ok, _ in gates)


def drafter_lines(m: dict) -> list[str]:
    rows = ["| drafter | kind | settings | sha256 |", "|---|---|---|---|"]
    for name, d in m["drafters"].items():
        settings = ", ".join(f"{k}={v}" for k, v in sorted(d.get("settings", {}).items())) or "-"
        sha = f"`{d['sha256']}`" if d.get("sha256") else "- (no weights)"
        rows.append(f"| {name} | {d['kind']} | {settings} | {sha} |")
    return rows


def copy_heads(run: Path, heads: list[Path], m: dict) -> list[str]:
    """Each head card into RUN/cards/<drafter name>.{md,json}, matched to the manifest's drafter by the weights'
    sha256 (a card whose weights no drafter of the run used is refused)."""
    by_sha = {d.get("sha256"): n for n, d in m["drafters"].items() if d.get("sha256")}
    lines = []
    for h in heads:
        info = _json(h / "training_info.json")
        name = by_sha.get((info.get("sha256") or {}).get("weights"))
        if name is None:
            raise CardError(f"{h}: its weights are not any drafter's of the run (sha256 differs from the manifest's)")
        dest = run / "cards"
        dest.mkdir(exist_ok=True)
        for src, suffix in ((h / "README.md", ".md"), (h / "training_info.json", ".json")):
            write_text(dest / f"{name}{suffix}", src.read_text(encoding="utf-8"))
        acc = info["heldout_acceptance"]
        lines.append(
            f"- `{name}` ({info['kind'] if 'kind' in info else m['drafters'][name]['kind']}): trained "
            f"{info['train_wall_s']:.0f} s on {info['data']['train_prompts']} prompts "
            f"({info['data']['train_tokens']:,} tokens); held-out mean accepted length at k={acc['k']}: "
            + (f"{acc['mean']:.3f}" if acc["mean"] is not None else "-")
            + f" over {acc['prompts']} prompts [MEASURED]; card `cards/{name}.md`"
        )
    return lines


def _shown(p: Path) -> str:
    """A path as the card prints it: relative to the working directory where it lies below it (no home or
    machine-specific prefix in a committed card)."""
    try:
        return Path(p).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return Path(p).as_posix()


def write(run: Path, heads: list[Path]) -> bool:
    run = Path(run)
    m = _json(run / "manifest.json")
    if m.get("label") != "MEASURED" or "drafters" not in m or "target" not in m:
        raise CardError(f"{run}: manifest.json is not a measured run's (no label MEASURED, target or drafters)")
    stats = output_stats(run)
    gates, ok = gates_lines(stats)
    heads_part = copy_heads(run, heads, m)
    text = [
        f"# Campaign card: {run.name}",
        "",
        f"Made by `python -m zoo.runcard {_shown(run)}"
        + "".join(f" --heads {_shown(h)}" for h in heads)
        + "` from the run's manifest, outputs and the heads' cards.",
        "",
        "## Target",
        "",
        *target_lines(m),
        "",
        f"## Outputs [MEASURED] (`outputs.jsonl`: {sum(s['n'] for s in stats.values())} prompts, greedy)",
        "",
        *gates,
        "",
        "## Drafters",
        "",
        *drafter_lines(m),
    ]
    if heads_part:
        text += ["", "## Heads trained on this target", "", *heads_part]
    write_text(run / CARD, "\n".join(text) + "\n")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.runcard", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory of the sweep")
    ap.add_argument("--heads", type=Path, action="append", default=[], help="a head directory zoo.heads wrote")
    a = ap.parse_args(argv)
    try:
        ok = write(a.run, a.heads)
    except CardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.run / CARD}" + ("" if ok else " (an output gate FAILS: see the card)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
