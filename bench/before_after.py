"""Before / after a change of the forward: every live configuration's measured tokens/s and speedup over plain
decoding, from a run's ci.json at an earlier commit and now, and every live verdict that changed.

    python bench/before_after.py RUN --before REV [--out FILE]

Both sides are the run's own `ci.json` (bandit/live/verdicts.py entries [MEASURED], 95% CIs over the live prompts);
the earlier one is read from git (`git show REV:RUN/ci.json`), so nothing is typed. A verdict is the live
headline's "choosing paid?" per workload, or the fastest fixed drafter; a changed one is listed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs.errors import InputError, guarded
from bandit.logs.safeio import write_text


def entries(text: str, where: str) -> dict[str, dict]:
    try:
        return {e["name"]: e for e in json.loads(text)}
    except (ValueError, TypeError, KeyError) as e:
        raise InputError(f"{where}: not a ci.json ({type(e).__name__})") from None


def cell(e: dict | None) -> str:
    if e is None or e.get("value") is None:
        return "-"
    lo, hi = e["ci"]
    return f"{e['value']:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{e['value']:.3f}"


def table(old: dict, new: dict) -> list[str]:
    configs = sorted({e["config"] for n, e in new.items() if n.startswith("live_tokens_per_s[") and "config" in e})
    rows = [
        "| configuration | tokens/s before | tokens/s after | speedup over plain before | after |",
        "|---|---|---|---|---|",
    ]
    for c in configs:
        tps, sp = f"live_tokens_per_s[{c}]", f"live_speedup_over_plain[{c}]"
        rows.append(
            f"| {c} | {cell(old.get(tps))} | {cell(new.get(tps))} | {cell(old.get(sp))} | {cell(new.get(sp))} |"
        )
    return rows


def verdicts(old: dict, new: dict) -> list[str]:
    out = []
    for n in sorted(new):
        e, o = new[n], old.get(n)
        if n.startswith("choosing_pays") and o is not None and o.get("verdict") != e.get("verdict"):
            out.append(f"- `{n}`: {o.get('verdict')} ({o.get('config')}) -> {e.get('verdict')} ({e.get('config')})")
        if n.startswith("live_fastest_fixed_over_plain") and o is not None:
            if o.get("fastest_fixed") != e.get("fastest_fixed"):
                out.append(f"- `{n}`: fastest fixed {o.get('fastest_fixed')} -> {e.get('fastest_fixed')}")
    gone = sorted(n for n in old if n.startswith("choosing_pays") and n not in new)
    out += [f"- `{n}`: {old[n].get('verdict')} before, no longer computed" for n in gone]
    return out or ["- none: every live verdict stands"]


def host(m: dict) -> str:
    """A manifest's host and forward as one phrase: CPU, threads, kernel path, and which forward ran them (a run
    from before the lean forward records none: transformers' own)."""
    hw, k = m.get("hardware") or {}, m.get("kernels") or {}
    forward = "the lean forward" if k.get("forward") == "lean" else "transformers' forward"
    return f"{hw.get('cpu', '?')}, {hw.get('threads') or 1} thread(s), {k.get('kernels', 'aten')} linears, {forward}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run directory under the repository")
    ap.add_argument("--before", required=True, help="the git revision whose ci.json is the 'before'")
    ap.add_argument("--out", help="write the table here (markdown) as well")
    a = ap.parse_args(argv)
    run = Path(a.run)
    if not a.run.strip() or not (run / "ci.json").is_file():
        raise InputError(f"{a.run}: no ci.json (python bandit/ci.py {a.run})")
    if not run.resolve().is_relative_to(REPO):
        raise InputError(f"{a.run}: not a run directory of this repository (its before side is read from git)")
    rel = run.resolve().relative_to(REPO).as_posix()
    rev = subprocess.run(
        ["git", "rev-parse", "--verify", "--end-of-options", f"{a.before}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if rev.returncode:
        raise InputError(f"--before {a.before!r}: not a commit of this repository")
    sha = rev.stdout.strip()
    got = subprocess.run(["git", "show", f"{sha}:{rel}/ci.json"], cwd=REPO, capture_output=True, text=True)
    if got.returncode:
        raise InputError(f"--before {a.before}: git has no {rel}/ci.json there ({got.stderr.strip()[:120]})")
    old, new = (
        entries(got.stdout, f"{a.before}:{rel}/ci.json"),
        entries((run / "ci.json").read_text(), f"{rel}/ci.json"),
    )
    was = subprocess.run(["git", "show", f"{sha}:{rel}/manifest.json"], cwd=REPO, capture_output=True, text=True)
    hosts = [
        host({} if was.returncode else json.loads(was.stdout)),
        host(json.loads((run / "manifest.json").read_text())),
    ]
    text = "\n".join(
        [
            f"# made by: python bench/before_after.py {rel} --before {a.before}",
            f"Live configurations of {rel} before ({a.before}) and after the forward fix [MEASURED], 95% CIs. Before: "
            f"{hosts[0]}; after: {hosts[1]}. Two runs: compare the speedups over plain (each a ratio measured in one "
            "run), not the tokens/s.",
            "",
            *table(old, new),
            "",
            "Verdicts that changed:",
            *verdicts(old, new),
        ]
    )
    print(text)
    if a.out:
        write_text(a.out, text + "\n")
    return 0


if __name__ == "__main__":
    guarded(main)
