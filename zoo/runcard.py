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
from harness.models import lm
from harness.models.identity import legacy_sha256
from zoo.heads import portable
from zoo import distill_train
from zoo.heads_eval import write_card

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
        raise CardError(f"{run}: no outputs.jsonl (a run of the sweep writes one; see harness/campaign/outputs.py)")
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
    k = m.get("kernels") or {}
    if k.get("verify_pad"):  # the live phase's verifies ran padded: its speeds are those of the padded forwards
        pads = ", ".join(f"{q} as {p}" for q, p in sorted(k["verify_pad"].items(), key=lambda x: int(x[0])))
        times = ", ".join(f"{q}: {ms}" for q, ms in sorted((k.get("pass_ms") or {}).items(), key=lambda x: int(x[0])))
        lines.append(
            f"- live verify forwards padded (`sweep.py --verify-pad`): {pads} tokens"
            + (f"; one forward's ms by tokens, timed at start-up: {times}" if times else "")
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
    identity (a card whose weights no drafter of the run used is refused); then every card RUN/cards holds (those
    copied earlier too, whose weights may be gone) written again as the run shows it (`run_copy`), and a line each."""
    by_sha: dict[str, str] = {}
    for n, d in m["drafters"].items():  # drafters sharing weights (eagle3, eagle3_stop): the card is the first's
        if d.get("sha256"):
            by_sha.setdefault(d["sha256"], n)
    dest = run / "cards"
    for h in heads:
        ident = lm.weights_sha256(h)  # the weights' identity now (harness/models/identity.py), not as recorded
        name = by_sha.get(ident) or by_sha.get(legacy_sha256(h))  # a drafter whose manifest kept files-v0
        if name is None:
            raise CardError(f"{h}: its weights are not any drafter's of the run (sha256 differs from the manifest's)")
        dest.mkdir(exist_ok=True)
        info = _json(h / "training_info.json")
        _card(h, run_copy(info, ident, m), dest / f"{name}.json", dest / f"{name}.md")
    lines = []
    for f in sorted(dest.glob("*.json")) if dest.is_dir() else []:
        name, info = f.stem, _json(f)
        if name not in m["drafters"]:
            raise CardError(f"{f}: names no drafter of the run")
        info = run_copy(info, m["drafters"][name].get("sha256"), m)
        if m["drafters"][name].get("identity"):  # the recorded hash is of another scheme: the card says which
            info["identity"] = m["drafters"][name]["identity"]
        _card(dest, info, f, f.with_suffix(".md"))
        same = [n for n, d in m["drafters"].items() if n != name and d.get("sha256") == info["sha256"]["weights"]]
        also = f" (also the weights of {', '.join(f'`{n}`' for n in same)})" if same else ""
        if "card" in info:  # a card of the self-distillation trainers
            what, mean, prompts = distill_train.summary(info, 4)
            lines.append(
                f"- `{name}` ({info['kind']}, {what}): trained {_trained(info)} on "
                f"{info['data']['generated_tokens']:,} generated tokens ({info['data']['sequences']:,} sequences, "
                f"zoo.distill); held-out mean accepted length at k=4: "
                + (f"{mean:.3f}" if mean is not None else "-")
                + f" over {prompts} prompts [MEASURED]; card `cards/{name}.md`{also}"
            )
            continue
        acc = info["heldout_acceptance"]
        lines.append(
            f"- `{name}` ({info['kind']}): trained "
            f"{_trained(info)} on {info['data']['train_prompts']} prompts "
            f"({info['data']['train_tokens']:,} tokens); held-out mean accepted length at k={acc['k']}: "
            + (f"{acc['mean']:.3f}" if acc["mean"] is not None else "-")
            + f" over {acc['prompts']} prompts [MEASURED]; card `cards/{name}.md`{also}"
        )
    return lines


def _trained(info: dict) -> str:
    """Training time as a card records it; a card whose last run only resumed a finished training (`--stage eval`)
    records no time: its steps instead of "0 s"."""
    if info["train_wall_s"] or not info.get("steps") or info.get("resumed_at") != info["steps"]:
        return f"{info['train_wall_s']:.0f} s"
    return f"{info['steps']} steps (time not recorded: the card's run resumed a finished training)"


def _card(d: Path, info: dict, json_file: Path, md_file: Path) -> None:
    if "card" in info:  # trained on zoo.distill's data: the card is zoo/distill_train.py's
        c = info["card"]
        distill_train.write_card(d, info, c["title"], c["about"], c["published"], json_file, md_file)
    else:
        write_card(d, info["kind"], info, json_file, md_file)


def run_copy(info: dict, ident: str | None, m: dict) -> dict:
    """The head's card as the run shows it: its weights and target named by their identities as the run's manifest
    records them, and every path relative to the models root ($SPECBANDIT_MODELS) or the repository, never the
    machine's that trained it (a card made before paths were recorded so keeps its numbers, not their paths)."""
    out = json.loads(json.dumps(info))
    trained = Path(info["target"]["path"])  # where the trainer's models root was: the target lies in it
    command = out["command"]
    if trained.is_absolute():
        command = command.replace(str(trained.parent), "$SPECBANDIT_MODELS")
    out["command"] = portable(command, None)
    out["path"] = portable(out.get("path") or _out_of(out["command"]) + "/" + out["kind"], None)
    out["sha256"]["weights"] = ident
    out["target"]["sha256"] = m["target"]["sha256"]
    out["target"]["path"] = m["target"]["path"]
    return out


def _out_of(command: str) -> str:
    """The --out directory a zoo.heads command names (where it wrote each head's directory)."""
    words = command.split()
    return words[words.index("--out") + 1] if "--out" in words[:-1] else "."


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
