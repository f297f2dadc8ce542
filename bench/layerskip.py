"""The layer-skip drafter's L: acceptance and cost for a few values, measured on one target (issue 23).

    python bench/layerskip.py [--target DIR] [--models DIR] [--layers 4,8,12,16,20] [--per-workload 2]
        [--workloads humaneval-chat:campaign,...] [--out bench/out/layerskip] [--json FILE]

One sweep (`sweep.py --mode dense --live-prompts P --live-policies ""`) with a `layerskip:layers=L` drafter per
L: the dense phase gives each L's acceptance at every position, the live phase decodes P prompts per workload with
plain decoding and with each L alone (and best-of-N, which the live phase always runs). Printed per L:

- mean accepted tokens per block at k [MEASURED, dense]: blocks at every position of the target's greedy output
  (the dense log's block set, not a trajectory);
- tokens per target pass along the drafter's own trajectory [MEASURED, live]: output tokens / verify passes;
- draft ms per call and its ratio to a plain decoding step [MEASURED, live] (a draft call drafts k tokens
  through L of the target's layers, so the ratio should grow about as k * L / layers);
- speedup over plain decoding [MEASURED, live]: output tokens summed / wall time summed, against plain's.

Small samples on a shared CPU: read the table as the shape of the trade-off, not as intervals (none are
computed here; the campaign's own layer-skip drafter has them in its ci.json). `--out` keeps the sweep's run
(resumable: rerun the same command). `--json FILE` writes the table with the command that made it; the one shipped
is bench/layerskip_smollm2.json (`python bench/layerskip.py --per-workload 1 --json bench/layerskip_smollm2.json`).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError

MAX_LAYERS = 4096
WORKLOADS = "humaneval-chat:campaign,stdlib-edit:campaign,chat-open:campaign,math-word:campaign"


def sweep(a) -> Path:
    """The sweep, run in the repository: a relative --out, --models or --target directory is the current
    directory's, so each is passed absolute (a --target that is no directory here is a name under --models)."""
    out = Path(os.path.abspath(a.out))
    target = os.path.abspath(a.target) if Path(a.target).is_dir() else a.target
    cmd = [sys.executable, str(REPO / "sweep.py"), "--target", target, "--mode", "dense", "--k", str(a.k)]
    cmd += [] if a.models is None else ["--models", os.path.abspath(a.models)]
    for L in a.layers:
        cmd += ["--drafter", f"ls{L}=layerskip:layers={L}"]
    cmd += ["--workloads", a.workloads, "--limit", str(a.per_workload), "--max-new-tokens", str(a.max_new_tokens)]
    cmd += ["--live-prompts", str(a.per_workload), "--live-policies", "", "--out", str(out)]
    cmd += ["--resume"] if out.exists() else []
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=REPO).returncode:
        raise InputError("the sweep failed (it said why above)")
    return out


def dense_acceptance(run: Path) -> dict[str, float]:
    """Mean accepted tokens per block over every logged position, per drafter."""
    acc: dict[str, list[int]] = defaultdict(list)
    for f in sorted(run.glob("blocks_dense*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            for line in fh:
                for name, d in json.loads(line)["drafts"].items():
                    acc[name].append(d["accepted"])
    return {n: sum(v) / len(v) for n, v in acc.items() if v}


def live_figures(run: Path) -> dict[str, dict[str, float]]:
    """Per configuration: output tokens, wall ms, passes, draft calls and their ms, summed over its decodes."""
    tot: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in (run / "live.jsonl").read_text().splitlines():
        r = json.loads(line)
        t = tot[r["config"]]
        t["tokens"] += r["tokens"]
        t["wall_ms"] += r["wall_ms"]
        t["passes"] += r["passes"]
        t["verify_ms"] += r["verify_ms"]
        t["calls"] += sum(r["calls"].values())
        t["draft_ms"] += sum(r["draft_ms"].values())
    return tot


def table(run: Path, layers: list[int]) -> list[dict]:
    acc, live = dense_acceptance(run), live_figures(run)
    plain = live["plain"]
    step_ms = plain["verify_ms"] / plain["passes"]  # one plain decoding step: a one-token target forward
    plain_tps = plain["tokens"] / plain["wall_ms"]
    rows = []
    for L in layers:
        f = live[f"fixed:ls{L}"]
        call_ms = f["draft_ms"] / f["calls"] if f["calls"] else float("nan")
        rows.append(
            dict(
                layers=L,
                mean_accepted=acc[f"ls{L}"],
                tokens_per_pass=f["tokens"] / f["passes"],
                draft_ms_per_call=call_ms,
                call_over_plain_step=call_ms / step_ms,
                speedup_over_plain=(f["tokens"] / f["wall_ms"]) / plain_tps,
            )
        )
    return rows


def layers(text: str) -> list[int]:
    """--layers: distinct layer counts >= 1, comma-separated."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--layers {text!r}: expected comma-separated layer counts") from None
    if not out or min(out) < 1 or max(out) > MAX_LAYERS or len(set(out)) != len(out):
        raise UsageError(f"--layers {text!r}: expected distinct layer counts in 1..{MAX_LAYERS}")
    return out


def check(a) -> None:
    """Every option in its range, the paths not empty, --json's folder there, before the sweep."""
    a.layers = layers(a.layers)
    limits.integer("--per-workload", a.per_workload, 1, 100_000)
    limits.integer("--k", a.k, 1, 4095)
    limits.integer("--max-new-tokens", a.max_new_tokens, 1, 1 << 20)
    for flag in ("--target", "--models"):
        limits.path_value(flag, getattr(a, flag[2:]))
    limits.out_dir("--out", a.out)
    a.json = limits.out_file("--json", a.json)


def main(argv=None) -> int:
    ap = limits.Parser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--target", default="smollm2-135m-instruct", help="the target (a directory, or a name under --models)"
    )
    ap.add_argument("--models", default=str(REPO / "models"), help="models root, as the sweep's --models")
    ap.add_argument("--layers", default="4,8,12,16,20", help=f"layer counts L, comma-separated, in 1..{MAX_LAYERS}")
    ap.add_argument("--workloads", default=WORKLOADS)
    ap.add_argument("--per-workload", type=int, default=2, help="prompts per workload, dense and live: 1..100000")
    ap.add_argument("--k", type=int, default=4, help="1..4095")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="1..2^20 (and the target's positions: the sweep)")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "layerskip"), help="the sweep's run directory")
    ap.add_argument("--json", default=None, help="also write the table here (its folder must exist)")
    a = ap.parse_args(argv)
    check(a)
    run = sweep(a)
    rows = table(run, a.layers)
    m = json.loads((run / "manifest.json").read_text())
    print(f"\nlayer-skip drafter on {m['target']['name']} ({m['hardware'].get('cpu', '?')}), k={a.k}, "
          f"{a.per_workload} prompts per workload of {a.workloads} [MEASURED; small sample, no intervals]")  # fmt: skip
    print("| L | mean accepted per block (dense) | tokens per pass (live) | draft ms per call | call / plain step "
          "| speedup over plain (live) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layers']} | {r['mean_accepted']:.3f} | {r['tokens_per_pass']:.3f} | {r['draft_ms_per_call']:.2f} "
              f"| {r['call_over_plain_step']:.2f} | {r['speedup_over_plain']:.3f} |")  # fmt: skip
    if a.json:
        doc = {
            "label": "MEASURED (small sample, no intervals)",
            "command": " ".join(["python bench/layerskip.py", *(argv if argv is not None else sys.argv[1:])]),
            "target": m["target"]["name"],
            "cpu": m["hardware"].get("cpu"),
            "k": a.k,
            "workloads": a.workloads,
            "per_workload": a.per_workload,
            "run": os.path.relpath(run, REPO),
            "rows": rows,
        }
        limits.write_json(a.json, doc)
    return 0


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
