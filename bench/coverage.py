"""Empirical coverage of ci.json's nominal 95% intervals: the shipped entries, code path, criterion and units.

Every interval is made by the code that makes ci.json (`replay.table_stats`, and `ci.headline` when a
selector entry is asked for: the selector's own criterion, nested threshold and refits), on the
primary's trajectory block set of a dense log, once per resampling unit (`prompt`, `block`). An
entry that ci.py keeps on the prompt unit under `--unit block` (the trajectory and tokens-per-pass
entries) has no block-unit row. Two studies:

- `sim` [SIM]: campaigns drawn from a SimConfig fitted to the shipped campaign (per-cell acceptance
  from the mean accepted, prompt random effects and the drafters' shared latent from per-prompt
  acceptance rates, confidence signal from the AUC of the first-token confidence, empty-draft rates,
  the manifest's timing; each prompt's output length drawn from its workload's measured lengths).
  Truth: the entry's value on one very large campaign of the same configuration (`--truth-prompts`
  per workload); nothing of the primary's block set has a closed form.
- `subsample` [MEASURED]: `--prompts-per-workload` prompts per workload drawn without replacement
  from the shipped campaign. Truth: the entry's value on the full campaign (same unit). Drawing
  30 of 300 prompts leaves a finite-population factor sqrt(270/299) = 0.95 on the spread, so an
  honest interval covers a little more than 95% here.

A draw counts as covering when lo <= truth <= hi; an undefined interval (NaN) counts as a miss.
Coverage has a Wilson 95% interval over the draws. <run dir>/coverage.json knows its inputs (sha256 of
the logs read), the code version, the settings and the seed; the same seed gives the same file,
whatever `--jobs`. `python bandit/ci.py` warns for every entry whose unit a row here shows
under-covering (`ci.coverage_warnings`).

The simulator fitted to the campaign is bench/coverage_sim.py; the draws, their intervals and the coverage rows
bench/coverage_draws.py; this script reads the campaign, runs the studies and writes the file.

    python bench/coverage.py                      # the full study (many minutes) -> <run dir>/coverage.json
    python bench/coverage.py --quick --out /tmp/coverage.json     # smoke run, under a minute
    python bench/coverage.py --studies subsample --draws 100 --entries per_block_gap,workload_headroom
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bandit import ci, replay
from bandit.logs import outputs, schema
from bandit.logs.errors import UsageError
from bandit.logs.table import BlockTable
from bandit.stats import bootstrap, trajectory
from bench.coverage_draws import LEVEL, STUDIES, Plan, one_thread, rounded, rows_of, run_study, truth_of
from bench.coverage_sim import derive, fit_config, sim_table

RES = outputs.RESAMPLES_HELP
QUICK = {"draws": 16, "resamples": 300, "refit": 16, "truth_prompts": 300}
FULL = {"draws": 200, "resamples": 2000, "refit": ci.N_REFIT, "truth_prompts": 3000}  # ci.json's defaults


# ---------------------------------------------------------------- small pieces


def family(name: str) -> str:
    """An entry's family: its name without the [workload][drafter] suffix."""
    return name.split("[", 1)[0]


def default_entries(t: BlockTable) -> list[str]:
    w, d = t.workloads[0], t.drafters[trajectory.primary(t) if t.dense else 0]
    return [
        "per_block_gap",
        "workload_headroom",
        "trajectory_oracle_gain",
        "greedy_oracle_gain",
        f"mean_accepted[{w}][{d}]",
        f"tokens_per_pass[{w}][{d}]",
        "selector_frontier_area",
        "selector_capture",
    ]


def resolve(patterns: Sequence[str], names: Sequence[str]) -> list[str]:
    """Entry names matching the patterns (names; `*` and `?` are wildcards), in the patterns' order."""
    out: list[str] = []
    for p in patterns:
        rx = re.compile(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."))  # brackets are literal
        hit = [n for n in names if rx.fullmatch(n)]
        if not hit:
            print(f"note: no entry of ci.json matches {p!r}; skipped", file=sys.stderr)
        out += [n for n in hit if n not in out]
    return out


def all_names(t: BlockTable, refit: bool) -> list[str]:
    es = (
        ci.headline(t, "prompt", "percentile", 4, 0, 2)
        if refit
        else replay.table_stats(t, "prompt", 4, 0, "percentile")
    )
    return [e.name for e in es]


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def render(rows: list[dict]) -> str:
    head = (
        f"{'study':<10}{'entry':<34}{'unit':<7}{'coverage':>9}  {'Wilson 95%':<16}{'draws':>6}"
        f"{'mean width':>12}{'truth':>10}  miss lo/hi  label"
    )
    lines = [head]
    for r in rows:
        cv = "n/a" if r["coverage"] is None else f"{100 * r['coverage']:.1f}%"
        cc = (
            "n/a" if r["coverage_ci"] is None else f"[{100 * r['coverage_ci'][0]:.1f}, {100 * r['coverage_ci'][1]:.1f}]"
        )
        mw = "n/a" if r["mean_width"] is None else f"{r['mean_width']:.4f}"
        lines.append(
            f"{r['study']:<10}{r['entry']:<34}{r['unit']:<7}{cv:>9}  {cc:<16}{r['draws']:>6}{mw:>12}"
            f"{_f(r['truth']):>10}  {r['miss_below']:>4}/{r['miss_above']:<5} [{r['label']}]"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="logs (default: the published campaign, paper/campaign.txt)")
    ap.add_argument("--latest", action="store_true", help=outputs.LATEST_HELP)
    ap.add_argument("--quick", action="store_true", help=f"smoke run (< 1 min): defaults {QUICK}")
    ap.add_argument(
        "--draws", type=int, help=f"draws per study, in [1, 100000] (default {FULL['draws']}; quick {QUICK['draws']})"
    )
    ap.add_argument(
        "--resamples", type=int, help=f"bootstrap resamples, {RES} (default {FULL['resamples']}, ci.json's)"
    )
    ap.add_argument("--refit", type=int, help=f"selector refit resamples, {RES} (default {FULL['refit']}, ci.json's)")
    ap.add_argument(
        "--prompts-per-workload",
        type=int,
        default=30,
        help="prompts per workload of a draw, in [1, 100000] (default 30)",
    )
    ap.add_argument(
        "--truth-prompts",
        type=int,
        help=f"per workload, the large [SIM] campaign of the truth, in [1, 100000] (default {FULL['truth_prompts']})",
    )
    ap.add_argument("--entries", help="comma-separated entry names or globs (default: a representative subset)")
    ap.add_argument("--studies", default=",".join(STUDIES), help="sim,subsample (default both)")
    ap.add_argument("--units", default=",".join(bootstrap.UNITS), help="prompt,block (default both)")
    ap.add_argument("--method", default="percentile", choices=bootstrap.METHODS)
    ap.add_argument("--seed", type=int, default=0, help=outputs.SEED_HELP)
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="worker processes (no effect on results), in [1, 256]",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="output (default: <run dir>/coverage.json beside the one run read, with every option at its default)",
    )
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    studies = [s for s in args.studies.split(",") if s]
    units = [u for u in args.units.split(",") if u]
    if set(studies) - set(STUDIES) or set(units) - set(bootstrap.UNITS):
        ap.error(f"--studies from {STUDIES}, --units from {bootstrap.UNITS}")
    for k, hi in (("draws", 100_000), ("prompts_per_workload", 100_000), ("truth_prompts", 100_000), ("jobs", 256)):
        outputs.bounded("--" + k.replace("_", "-"), getattr(args, k), 1, hi)
    outputs.resamples(args.resamples), outputs.resamples(args.refit, "--refit"), outputs.seed(args.seed)
    t0 = time.perf_counter()

    from bandit.logs.reader import load_logs

    inp = outputs.resolve(args.paths, args.latest)
    said = inp.said or inp.named
    opts = [("--quick", args.quick, False), *((f"--{k.replace('_', '-')}", getattr(args, k), base[k]) for k in base)]
    opts += [("--prompts-per-workload", args.prompts_per_workload, 30), ("--entries", args.entries, None)]
    opts += [("--studies", args.studies, ",".join(STUDIES)), ("--units", args.units, ",".join(bootstrap.UNITS))]
    opts += [("--method", args.method, "percentile"), ("--seed", args.seed, 0)]
    differs = outputs.changed(opts)
    args.out, why = outputs.destination(
        inp, "coverage.json", outputs.path_arg(args.out, "--out"), differs, "bench/coverage.py"
    )
    if args.out is None:  # nothing computed for nothing: the study takes minutes
        raise UsageError(why.replace("not written", "refused", 1))
    outputs.guard_out(args.out, [args.out.name], inp, ["coverage.json"], differs)
    if args.out.is_symlink():  # refused now, not after the study's minutes
        raise UsageError(f"{args.out}: a symlink stands there: not written through")
    args.command = outputs.command("bench/coverage.py", inp, opts)
    paths = inp.files
    from bandit.live.primary import attach_own

    t = attach_own(load_logs(paths))  # the run's live phase: the primary by measured speed, as ci.json's
    print(f"read: {said}\n{t.summary()}")
    return study(t, studies, units, args, t0)


def study(t: BlockTable, studies: Sequence[str], units: Sequence[str], args, t0: float | None = None) -> dict:
    """Run the studies on campaign t with argparse-like settings; write and return the results object."""
    t0 = time.perf_counter() if t0 is None else t0
    one_thread()
    pats = args.entries.split(",") if args.entries else default_entries(t)
    need_sel = any(p.startswith("selector") for p in pats)
    names = tuple(resolve(pats, all_names(t, need_sel)))
    if not names:
        raise SystemExit("no entries to study")
    rows, truths, fit_json = [], {}, None
    for s in studies:
        if s == "subsample":
            src, label = t, t.label
            truths[s] = truth_of(t, names, units, args.method)
        else:
            src, label = fit_config(t, args.prompts_per_workload, args.seed), "SIM"
            fit_json = src.to_json()
            big = sim_table(src, args.truth_prompts, derive(args.seed, 99))
            truths[s] = truth_of(big, names, units, args.method)
            full = truth_of(t, names, units[:1], args.method)[units[0]]
            print(
                f"[SIM] fitted config: shared {src.cfg.shared}, prompt_sd {src.cfg.prompt_sd}, prompt_drafter_sd "
                f"{src.cfg.prompt_drafter_sd}, signal {src.cfg.signal}; truth from {big.n_prompts} prompts "
                f"({big.n_records} records)"
            )
            for n in names:
                if n in truths[s][units[0]]:
                    print(
                        f"  {n:<34} truth [SIM] {truths[s][units[0]][n]:9.4f}   campaign [{t.label}] "
                        f"{full.get(n, float('nan')):9.4f}   ({units[0]} unit)"
                    )
        plan = Plan(
            s, src, names, tuple(units), args.prompts_per_workload, args.resamples, args.refit, args.method, args.seed
        )
        rows += rows_of(s, label, run_study(plan, args.draws, args.jobs), truths[s])
    rows.sort(key=lambda r: (r["study"], r["entry"], bootstrap.UNITS.index(r["unit"])))
    res = {
        "what": "empirical coverage of ci.json's nominal 95% intervals (bench/coverage.py)",
        "inputs": [{"path": s.path, "sha256": s.sha256} for s in t.sources],
        "code_version": schema.code_version("bandit"),
        "seed": args.seed,
        "settings": {
            "draws": args.draws,
            "resamples": args.resamples,
            "refit": args.refit,
            "prompts_per_workload": args.prompts_per_workload,
            "truth_prompts": args.truth_prompts,
            "method": args.method,
            "level": LEVEL,
            "studies": list(studies),
            "units": list(units),
            "entries": list(names),
            "quick": bool(args.quick),
        },
        "sim": fit_json,
        "truth": {s: {u: {k: rounded(v) for k, v in tv.items()} for u, tv in d.items()} for s, d in truths.items()},
        "rows": rows,
    }
    print(render(rows))
    if getattr(args, "command", None):
        res["command"] = args.command
    out = pathlib.Path(args.out)
    done = outputs.write_all([(out, json.dumps(res, indent=1, sort_keys=True, allow_nan=False) + "\n")])
    print(f"{outputs.wrote([out], done).strip()} ({time.perf_counter() - t0:.0f} s)")
    return res


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
