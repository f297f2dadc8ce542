"""The headline report: every headline number of a campaign with a 95% bootstrap CI -> <run dir>/ci.json.

The numbers come from the modules below it (docs/DESIGN.md, "Layout"): the replay statistics of
bandit/replay.py (gap, headroom, mean table, trajectory gains, on the campaign's block set) and
the leave-one-workload-out selector of bandit/selector.py (frontier areas and its operating
point), each with its interval from bandit/bootstrap.py. Every data-dependent choice is remade
inside every resample: the primary and its block set, and for the selector its model fit, its
alternatives and its threshold. Refit statistics use `n_refit` resamples (default N_REFIT,
recorded as the entry's `n_resamples`), the first `n_refit` of the same stream. Where the run has a
live phase, the live verdicts of bandit/verdicts.py (`live_tokens_per_s`, `live_speedup_over_plain`,
`live_speedup_over_fastest_fixed`, `choosing_pays`: measured, per workload and pooled) come too, and the
printed report opens with their one table; where it has none, one line says so.

    python bandit/ci.py                          # the default campaign under runs/ -> runs/<run>/ci.json
    specbandit ci PATHS --out F --resamples N --seed S --unit prompt|block --method percentile|bca
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

from bandit import progress, selector, trajectory, verdicts
from bandit.bootstrap import (
    LEVEL,
    METHODS,
    UNITS,
    Entry,
    Interval,
    degenerate,
    fmt,
    fmt_ci,
    no_variation,
)
from bandit.logs import default_inputs, load_logs, output_path, run_dir
from bandit.primary import attach
from bandit.replay import table_stats
from bandit.schema import code_version
from bandit.table import BlockTable

N_REFIT = 200  # resamples for the nested selector refits
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
) -> list[Entry]:
    """Every headline entry of ci.json for one campaign's table."""
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


def write_ci(entries: Sequence[Entry], t: BlockTable, out: Path) -> str:
    """Write ci.json (a list of entries, sorted keys, fixed float formatting); return the text."""
    inputs = [{"path": s.path, "sha256": s.sha256} for s in t.sources]
    cv = code_version("bandit")
    text = json.dumps([e.to_json(inputs, cv) for e in entries], sort_keys=True, indent=1) + "\n"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


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
    paths: Sequence[Path] = (),
    out: Path | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    unit: str = "prompt",
    method: str = "percentile",
    n_refit: int = N_REFIT,
) -> str:
    """Compute every entry; write OUT (default: ci.json next to the campaign it describes, `<run dir>/ci.json`,
    when the logs are one run; nothing for several runs pooled unless `out` is given)."""
    said = f"read: {', '.join(str(p) for p in paths)}"
    if not paths:
        paths, said = default_inputs()
        said = f"read: {said}"
    out = output_path(paths, "ci.json", out)
    # the run's live phase on the table: the primary is then the fastest fixed drafter measured live (bandit/primary.py)
    t = attach(load_logs(paths), run_dir(paths))
    entries = headline(t, unit, method, n_resamples, seed, n_refit)
    tail = "not written (several runs pooled: pass --out FILE to write ci.json)\n"
    if out is not None:
        write_ci(entries, t, out)
        tail = f"wrote {out}\n"
    cov = out.parent / "coverage.json" if out is not None else None
    warns = "".join(w + "\n" for w in coverage_warnings(entries, cov)) if cov is not None else ""
    return f"{said}\n{t.summary()}\n" + live_report(t, entries) + render(entries) + warns + tail


def live_report(t: BlockTable, entries: Sequence[Entry]) -> str:
    """The report's opening: the live verdicts' one table and their full tables, and a line on what is absent."""
    by = {e.name: e.to_json([], "") for e in entries if isinstance(e, verdicts.LiveEntry)}
    text = "\n\n".join(x for x in (verdicts.report(by), verdicts.note(t, by)) if x)
    return text + f"\n\nthe primary: {t.drafters[trajectory.primary(t)]}, {trajectory.rule_name(t)}\nEvery entry:\n"


def cli(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories")] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="ci.json to write (default: <run dir>/ci.json beside the "
            "one run read; nothing for several runs pooled)"
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples of the ratio statistics")] = 2000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
    unit: Annotated[str, typer.Option(help="resampling unit: prompt (clusters, default) or block")] = "prompt",
    method: Annotated[str, typer.Option(help="percentile (default) or bca")] = "percentile",
    refit_resamples: Annotated[int, typer.Option(min=1, help="resamples of the nested selector refits")] = N_REFIT,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
) -> None:
    """Every headline number with a 95% bootstrap CI -> OUT (ci.json) and a table on stdout.

    Block sets: sparse logs, the logged block starts; dense logs, the primary's own trajectory starts (the
    primary: the fixed drafter fastest measured live where the run has a live phase, else most output tokens per
    target pass along its own trajectory), re-chosen in every resample. With a live phase the report opens with the
    live verdicts (bandit/verdicts.py): does choosing pay, measured?
    Trajectories are counted in tokens per target pass (nothing past an output's end). PATHS: logs (default: the default campaign under runs/). --unit prompt (clusters, default) or block;
    --method percentile (default) or bca; --refit-resamples: resamples of the nested selector refits
    (at most --resamples). The selector's operating point is chosen inside every fold by the modelled speedup
    (the timing model fitted on the live phase where there is one, else the rho/alpha cost model).
    """
    progress.quiet(quiet)
    if unit not in UNITS or method not in METHODS:
        raise typer.BadParameter(f"--unit must be one of {UNITS} and --method one of {METHODS}")
    typer.echo(main(paths or [], out, resamples, seed, unit, method, refit_resamples), nl=False)


if __name__ == "__main__":
    from bandit.errors import run

    run(cli)
