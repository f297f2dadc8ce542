"""The headline report: every headline number of a campaign with a 95% bootstrap CI -> <run dir>/ci.json.

The numbers come from the modules below it (docs/DESIGN.md, "Layout"): the replay statistics of
bandit/replay.py (gap, headroom, mean table, trajectory gains, on the campaign's block set) and
the leave-one-workload-out selector of bandit/selector.py (frontier areas and its operating
point), each with its interval from bandit/stats/bootstrap.py. Every data-dependent choice is remade
inside every resample: the primary and its block set, and for the selector its model fit, its
alternatives and its threshold. Refit statistics use `n_refit` resamples (default N_REFIT,
recorded as the entry's `n_resamples`), the first `n_refit` of the same stream. Where the run has a
live phase, the live verdicts of bandit/live/verdicts.py (`live_tokens_per_s`, `live_speedup_over_plain`,
`live_speedup_over_fastest_fixed`, `choosing_pays`: measured, per workload and pooled) come too, and the
printed report opens with their one table; where it has none, one line says so.

    python bandit/ci.py                          # the published campaign -> runs/<run>/ci.json
    specbandit ci PATHS --out F --resamples N --seed S --unit prompt|block --method percentile|bca [--latest]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/ci.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer

from bandit import selector
from bandit.logs import outputs
from bandit.logs import progress
from bandit.stats import trajectory
from bandit.live import verdicts
from bandit.stats.bootstrap import LEVEL, METHODS, UNITS, Entry, Interval, degenerate, fmt, fmt_ci, no_variation
from bandit.logs.reader import load_logs
from bandit.live.primary import attach
from bandit.replay import table_stats
from bandit.logs.schema import code_version
from bandit.logs.table import BlockTable

N_REFIT = 200  # resamples for the nested selector refits
RES = outputs.RESAMPLES_HELP
SELECTOR_HEADLINE = (
    "selector_capture",
    "selector_frontier_area",
    "selector_redraft_rate",
    "selector_skill",
    "selector_speedup",
    "selector_token_gain",
)


def headline(
    t: BlockTable,
    unit: str = "prompt",
    method: str = "percentile",
    n_resamples: int = 2000,
    seed: int = 0,
    n_refit: int = N_REFIT,
    live: bool = True,
) -> list[Entry]:
    """Every headline entry of ci.json for one campaign's table; `live=False`: without the live verdicts (a table
    of a subset of the campaign's prompts, as bench/coverage.py draws, is not the one its live phase sampled)."""
    b = trajectory.block_set(t)
    entries = table_stats(t, unit, n_resamples, seed, method)
    if len(b.workloads) >= 2 and len(b.drafters) >= 2:
        entries += selector.selector_entries(t, unit, min(n_refit, n_resamples), seed, method)
    else:  # listed with the reason, not dropped
        why = (
            f"undefined: the selector is evaluated leave-one-workload-out between drafters, and this table has "
            f"{len(b.workloads)} workload(s) and {len(b.drafters)} drafter(s) (it needs 2 of each)"
        )
        nan = float("nan")
        entries += [
            Entry(n, Interval(nan, nan, nan, method, unit, 0, seed, why), 0, t.n_prompts, t.label)
            for n in SELECTOR_HEADLINE
        ]
    flat = no_variation(t, unit)
    entries = [degenerate(e, flat) for e in entries]
    # the live phase's verdicts: always over prompt clusters (a decode is a whole prompt), same seed and resamples
    if live:
        entries += verdicts.run_entries(t, n_resamples, seed, method)
    return sorted(entries, key=lambda e: e.name)


def coverage_warnings(entries: Sequence[Entry], path: Path) -> list[str]:
    """A warning line for every entry whose unit bench/coverage.py's study shows under-covering: a row for that
    entry, or else for its family (the name without [..]), on the entry's unit whose coverage CI lies wholly
    below LEVEL (the row of lowest upper bound is quoted). Empty when the file is missing or unreadable."""
    try:
        bad = []
        for r in json.loads(Path(path).read_text())["rows"]:
            name, cc = r.get("entry", r.get("statistic")), r.get("coverage_ci", r.get("coverage_ci95"))
            if isinstance(name, str) and cc and cc[1] is not None and float(cc[1]) < LEVEL:
                bad.append((name, r["unit"], float(r["coverage"]), float(cc[0]), float(cc[1]), r.get("study")))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return []
    found: dict[tuple, list[str]] = {}  # the quoted study row -> the entries it applies to
    for e in entries:
        hits = [b for b in bad if b[1] == e.ci.unit and b[0] == e.name] or [
            b for b in bad if b[1] == e.ci.unit and b[0].split("[", 1)[0] == e.name.split("[", 1)[0]
        ]
        if hits:
            found.setdefault(min(hits, key=lambda b: b[4]), []).append(e.name)
    out = []
    for (name, unit, cov, lo, hi, study), names in found.items():
        more = f" (and {len(names) - 1} more of its family, by that row)" if len(names) > 1 else ""
        row = f"; row {name}" if name != names[0] else ""
        out.append(
            f"warning: unit {unit} under-covers for {names[0]}{more} in {path}: {100 * cov:.0f}% "
            f"[{100 * lo:.0f}, {100 * hi:.0f}]" + (f" (study {study}{row})" if study else "")
        )
    return out


def ci_text(entries: Sequence[Entry], t: BlockTable, command: str) -> str:
    """ci.json's text: a list of entries (sorted keys, fixed float formatting), each naming the command that made it."""
    inputs = [{"path": s.path, "sha256": s.sha256} for s in t.sources]
    cv = code_version("bandit")
    rows = [e.to_json(inputs, cv) | {"command": command} for e in entries]
    return json.dumps(rows, sort_keys=True, indent=1, allow_nan=False) + "\n"


def render(entries: Sequence[Entry]) -> str:
    lines = [f"{'name':<36} {'value':>9}  95% CI                 label       method/unit/resamples"]
    for e in entries:
        c = e.ci
        tag = "unlabelled" if e.label == "UNLABELLED" else e.label
        lines.append(
            f"{e.name:<36} {fmt(c.value):>9}  {fmt_ci(c)}".ljust(70)
            + f" [{tag}]".ljust(13)
            + f"{c.method}/{c.unit}/{c.n_resamples}, seed {c.seed}"
        )
    by: dict[str, list[str]] = {}
    for e in entries:
        if e.ci.warning:
            by.setdefault(e.ci.warning, []).append(e.name)
    warns = [
        f"warning: {names[0]}: {w}"
        if len(names) == 1
        else f"warning: {names[0]} and {len(names) - 1} more entries: {w}"
        for w, names in by.items()
    ]
    return "\n".join(lines + warns) + "\n"


def main(
    paths: Sequence[str | Path] = (),
    out: Path | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    unit: str = "prompt",
    method: str = "percentile",
    n_refit: int = N_REFIT,
    latest: bool = False,
) -> str:
    """Compute every entry; write OUT (default, with every option at its default: ci.json beside the one run read,
    `<run dir>/ci.json`; else nothing unless `out` is given: bandit/logs/outputs.py)."""
    outputs.resamples(n_resamples), outputs.resamples(n_refit, "--refit-resamples"), outputs.seed(seed)
    outputs.choice("--unit", unit, UNITS), outputs.choice("--method", method, METHODS)
    inp = outputs.resolve(paths, latest)
    opts = [("--resamples", n_resamples, 2000), ("--seed", seed, 0), ("--unit", unit, "prompt")]
    opts += [("--method", method, "percentile"), ("--refit-resamples", n_refit, N_REFIT)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(inp, "ci.json", out, differs, "bandit/ci.py")
    if out is not None:
        outputs.guard_out(dest, [dest.name], inp, ["ci.json"], differs)
    cmd = outputs.command("bandit/ci.py", inp, opts)
    # the run's live phase on the table: the primary is then the fastest fixed drafter measured live (bandit/live/primary.py)
    t = attach(load_logs(inp.files), inp.dir)
    entries = headline(t, unit, method, n_resamples, seed, n_refit)
    where = dest.parent if dest is not None else inp.dir  # coverage.json beside the output, else the run's
    warns = "".join(w + "\n" for w in coverage_warnings(entries, where / "coverage.json")) if where else ""
    text = f"read: {inp.said or inp.named}\n{t.summary()}\n" + live_report(t, entries) + render(entries) + warns
    if dest is None:
        return text + why + "\n"
    data = ci_text(entries, t, cmd)
    return text + outputs.wrote([dest], outputs.write_all([(dest, data)], text))


def live_report(t: BlockTable, entries: Sequence[Entry]) -> str:
    """The report's opening: the live verdicts' one table and their full tables, and a line on what is absent."""
    by = {e.name: e.to_json([], "") for e in entries if isinstance(e, verdicts.LiveEntry)}
    text = "\n\n".join(x for x in (verdicts.report(by), verdicts.note(t, by)) if x)
    return text + f"\n\nthe primary: {t.drafters[trajectory.primary(t)]}, {trajectory.rule_name(t)}\nEvery entry:\n"


def cli(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    out: Annotated[
        Optional[str],
        typer.Option(
            help="ci.json to write (default: <run dir>/ci.json beside the one run read, with every option at its "
            "default; else nothing)"
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples of the ratio statistics, {RES}")] = 2000,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    unit: Annotated[str, typer.Option(help="resampling unit: prompt (clusters, default) or block")] = "prompt",
    method: Annotated[str, typer.Option(help="percentile (default) or bca")] = "percentile",
    refit_resamples: Annotated[int, typer.Option(help=f"resamples of the nested selector refits, {RES}")] = N_REFIT,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
) -> None:
    """Every headline number with a 95% bootstrap CI -> OUT (ci.json) and a table on stdout.

    Block sets: sparse logs, the logged block starts; dense logs, the primary's own trajectory starts (the
    primary: the fixed drafter fastest measured live where the run has a live phase, else most output tokens per
    target pass along its own trajectory), re-chosen in every resample. With a live phase the report opens with the
    live verdicts (bandit/live/verdicts.py): does choosing pay, measured?
    Trajectories are counted in tokens per target pass (nothing past an output's end). PATHS: logs (default: the
    published campaign, paper/campaign.txt). --unit prompt (clusters, default) or block;
    --method percentile (default) or bca; --refit-resamples: resamples of the nested selector refits
    (at most --resamples). The selector's operating point is chosen inside every fold by the modelled speedup
    (the timing model fitted on the live phase where there is one, else the rho/alpha cost model). With any option
    not at its default, <run dir>/ci.json is not written (only --out is).
    """
    progress.quiet(quiet)
    out_path = outputs.path_arg(out, "--out")
    typer.echo(main(paths or [], out_path, resamples, seed, unit, method, refit_resamples, latest), nl=False)


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(cli)
