"""Counterfactual replay statistics over block logs: the mean accepted table, the oracles and their CIs.

Every statistic follows docs/DESIGN.md's definitions, on a block set (bandit/stats/trajectory.py):
the logged block starts of a sparse log, the primary's own trajectory starts of a dense one;
trajectories are counted in output tokens per target pass. The trajectory oracle is the
shortest path over positions (fewest target passes), not the greedy per-block maximum.
Replaying a policy is bandit/policies/walk.py's job; this module's numbers need no policy.

    python bandit/replay.py [PATHS...]                 # readable tables (default: the published campaign)
    specbandit replay PATHS --json [--drafters a,b]    # one JSON object
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/replay.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer

from bandit.logs import outputs
from bandit.stats import trajectory
from bandit.stats.bootstrap import degenerate, fmt, fmt_ci, no_variation
from bandit.logs.reader import load_logs
from bandit.logs.table import drafter_names
from bandit.logs.observed import is_observed, summarize_observed
from bandit.live.primary import attach, fastest_by_workload, primary_lines
from bandit.replay_stats import accepted_entries, table_stats
from bandit.logs.schema import code_version
from bandit.logs.table import BlockTable
from bandit.stats.trajectory import greedy_oracle_trajectory, trajectory_oracle


# ---------------------------------------------------------------- static statistics


def mean_table(t: BlockTable) -> np.ndarray:
    """(W,D) mean accepted per workload and drafter over the records of `t` (NaN: workload has none).

    Give it a block set (`trajectory.block_set`): over every record of a dense log the mean is
    the length-biased per-position mean."""
    W, D = len(t.workloads), len(t.drafters)
    sums = np.zeros((W, D))
    np.add.at(sums, t.workload, t.accepted)
    n = np.bincount(t.workload, minlength=W).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / n[:, None]


@dataclass(frozen=True)
class ReplaySummary:
    """The replay statistics of one table (docs/DESIGN.md), on its block set B.

    B: sparse logs, the logged block starts; dense logs, the primary's own trajectory starts.
    Accepted-token statistics (table, gap) are over B; on dense logs the headline is tokens per
    target pass along trajectories (`trajectory`), and the workload headroom is counted there.
    """

    drafters: tuple[str, ...]
    workloads: tuple[str, ...]
    label: str  # MEASURED | SIM | UNLABELLED
    block_set: str  # which blocks B is, in words
    table: np.ndarray  # (W,D) mean accepted over B
    n_per_workload: np.ndarray  # (W,) blocks of B per workload
    pooled: np.ndarray  # (D,) mean accepted over B
    best_fixed: int  # index of the primary p
    workload_oracle: float  # sparse: mean accepted, each workload on its own best; dense: tokens per pass
    workload_headroom: float  # workload_oracle / the primary's (same accounting) - 1
    per_block_oracle: float  # mean over B of max_d a_d
    per_block_gap: float  # per_block_oracle / pooled[p] - 1
    n_blocks: int
    n_prompts: int
    trajectory: dict[str, float] | None  # dense: tokens per target pass per fixed drafter, "greedy_oracle", "oracle"
    trajectory_table: np.ndarray | None = None  # dense: (W,D) tokens per target pass per workload and drafter
    per_position: dict[str, float] | None = None  # dense: the length-biased means over every position, named so
    sources: tuple[tuple[str, str], ...] = ()  # (path, sha256) of the logs read
    ci: dict | None = None  # name -> bandit.ci.Interval (95%, prompt clusters), from `with_ci`
    primary_rule: str = ""  # how the primary was chosen (trajectory.rule_name)

    @property
    def best_fixed_name(self) -> str:
        return self.drafters[self.best_fixed]

    primary = best_fixed_name

    def to_json(self) -> dict:
        out = {
            "label": self.label,
            "block_set": self.block_set,
            "table": {
                w: {d: _num(self.table[i, j]) for j, d in enumerate(self.drafters)}
                for i, w in enumerate(self.workloads)
            },
            "pooled": {d: _num(self.pooled[j]) for j, d in enumerate(self.drafters)},
            "best_fixed": self.best_fixed_name,
            "primary": self.best_fixed_name,
            "primary_rule": self.primary_rule,
            "workload_oracle": self.workload_oracle,
            "workload_headroom": self.workload_headroom,
            "per_block_oracle": self.per_block_oracle,
            "per_block_gap": self.per_block_gap,
            "n_blocks": self.n_blocks,
            "n_prompts": self.n_prompts,
            "sources": [{"path": p, "sha256": h} for p, h in self.sources],
        }
        if self.trajectory is not None:
            out["trajectory"] = dict(self.trajectory)
            out["tokens_per_pass"] = {
                w: {d: _num(self.trajectory_table[i, j]) for j, d in enumerate(self.drafters)}
                for i, w in enumerate(self.workloads)
            }
        if self.per_position is not None:
            out["per_position"] = dict(self.per_position)
        if self.ci is not None:
            out["ci"] = {
                k: {
                    "value": c.value,
                    "lo": c.lo,
                    "hi": c.hi,
                    "method": c.method,
                    "unit": c.unit,
                    "n_resamples": c.n_resamples,
                    "seed": c.seed,
                }
                for k, c in self.ci.items()
            }
        return out

    def summary(self) -> str:
        tag = f"[{self.label}]" if self.label != "UNLABELLED" else "[unlabelled]"
        width = max(10, *(len(w) for w in self.workloads)) + 2
        col = [max(10, len(d) + 2) for d in self.drafters]  # a long name stays apart from the one before it
        lines = [f"{tag} block set B: {self.block_set}"]

        def grid(title: str, tab: np.ndarray, extra: np.ndarray | None, pooled: np.ndarray | None) -> None:
            lines.append(title)
            lines.append(
                "workload".ljust(width)
                + "".join(f"{d:>{c}s}" for d, c in zip(self.drafters, col))
                + (f"{'blocks':>8s}" if extra is not None else "")
            )
            for i, w in enumerate(self.workloads):
                row = tab[i]
                star = int(np.nanargmax(row)) if np.isfinite(row).any() else -1  # a workload with no blocks: none
                lines.append(
                    w.ljust(width)
                    + "".join(f"{x:>{col[j] - 1}.3f}{'*' if j == star else ' '}" for j, x in enumerate(row))
                    + (f"{int(extra[i]):>8d}" if extra is not None else "")
                )
            if pooled is not None:
                lines.append("pooled".ljust(width) + "".join(f"{x:>{c - 1}.3f} " for x, c in zip(pooled, col)))

        if self.trajectory is not None:
            tp = np.array([self.trajectory[d] for d in self.drafters])
            grid(
                f"{tag} tokens per target pass along each fixed drafter's own trajectory ({self.n_prompts} prompts)",
                self.trajectory_table,
                None,
                tp,
            )
        grid(
            f"{tag} mean accepted tokens per block over B ({self.n_blocks} blocks, {self.n_prompts} prompts)",
            self.table,
            self.n_per_workload,
            self.pooled,
        )
        p = self.best_fixed_name
        what = "tokens per target pass" if self.trajectory is not None else "mean accepted over B"
        lines += [
            f"{tag} primary: {p}, the {self.primary_rule}",
            f"{tag} workload-level hindsight oracle ({what}): {self.workload_oracle:.3f}, "
            f"headroom {fmt(self.workload_headroom, pct=True)}{self._ci('workload_headroom')}",
            f"{tag} per-block oracle over B: {self.per_block_oracle:.3f} accepted, gap "
            f"{fmt(self.per_block_gap, pct=True)}{self._ci('per_block_gap')}",
        ]
        if self.trajectory is not None:
            lines.append(
                f"{tag} tokens per target pass: "
                + ", ".join(f"{k} {self.trajectory[k]:.3f}" for k in (p, "greedy_oracle", "oracle"))
            )
            lines.append(
                f"{tag} trajectory oracle (shortest path) gain over the primary: "
                f"{fmt(self.trajectory['oracle'] / self.trajectory[p] - 1, pct=True)}"
                f"{self._ci('trajectory_oracle_gain')}"
            )
        if self.per_position is not None:
            pp = self.per_position
            lines.append(
                f"{tag} for contrast, length-biased means over all positions (not block statistics): "
                f"per_block_gap_per_position {fmt(pp['per_block_gap_per_position'], pct=True)}"
                f"{self._ci('per_block_gap_per_position')}, workload_headroom_per_position "
                f"{fmt(pp['workload_headroom_per_position'], pct=True)}{self._ci('workload_headroom_per_position')}"
            )
        if self.ci:
            c = next(iter(self.ci.values()))
            lines.append(
                f"95% CIs: {c.method} bootstrap over {c.unit} clusters within workloads, "
                f"{c.n_resamples} resamples, seed {c.seed}; the primary ({self.primary_rule}) and its block set "
                "are re-chosen in every resample"
            )
        return "\n".join(lines)

    def _ci(self, name: str) -> str:
        c = (self.ci or {}).get(name)
        if c is None:
            return ""
        return (
            f" (95% CI {fmt_ci(c, pct=True)})"
            if np.isfinite(c.lo) and np.isfinite(c.hi)
            else f" ({c.warning or 'no CI'})"
        )


def _num(x: float) -> float | None:
    """A JSON number, or null for NaN / inf (a workload with no blocks has no mean)."""
    return float(x) if np.isfinite(x) else None


def _accepted_stats(b: BlockTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float, float]:
    """(table (W,D), blocks per workload (W,), pooled (D,), p, workload oracle, per-block oracle) over b's rows."""
    a = b.accepted.astype(float)
    table = mean_table(b)
    n_w = np.bincount(b.workload, minlength=len(b.workloads))
    pooled = a.mean(0)
    p = int(np.argmax(pooled))
    present = n_w > 0
    wl = float((n_w[present] * table[present].max(1)).sum() / n_w.sum())
    return table, n_w, pooled, p, wl, float(a.max(1).mean())


def summarize(t: BlockTable) -> ReplaySummary:
    with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 (nothing accepted) is reported as undefined
        return _summarize(t)


def _summarize(t: BlockTable) -> ReplaySummary:
    """Tables, primary, workload and per-block oracles on the block set (and trajectories on dense logs)."""
    if t.n_records == 0:
        raise ValueError("no block starts to replay")
    srcs = tuple((s.path, s.sha256) for s in t.sources)
    if not t.dense:
        b = t.blocks()
        table, n_w, pooled, _, wl, pb = _accepted_stats(b)
        p = trajectory.primary(t)  # the token proxy's argmax of `pooled`, or the fastest measured live
        return ReplaySummary(
            drafters=t.drafters,
            workloads=t.workloads,
            label=t.label,
            block_set=f"the logged behaviour trajectory's {b.n_records} block starts (sparse log)",
            table=table,
            n_per_workload=n_w,
            pooled=pooled,
            best_fixed=p,
            workload_oracle=wl,
            workload_headroom=wl / pooled[p] - 1,
            per_block_oracle=pb,
            per_block_gap=pb / pooled[p] - 1,
            n_blocks=b.n_records,
            n_prompts=len(np.unique(b.prompt)),
            trajectory=None,
            sources=srcs,
            primary_rule=trajectory.rule_name(t),
        )
    starts = trajectory.fixed_starts(t)
    passes = trajectory.fixed_passes(t, starts)  # (P, D)
    tokens = trajectory.output_lengths(t)  # (P,)
    p = trajectory.primary(t, starts)
    b = trajectory.block_set(t, p)
    table, n_w, pooled, _, _, pb = _accepted_stats(b)
    W = len(t.workloads)
    wl_of = t.workload[trajectory.prompt_rows(t)[0]]
    pw = np.zeros((W, len(t.drafters)))
    np.add.at(pw, wl_of, passes)
    tok_w = np.bincount(wl_of, tokens, minlength=W)
    with np.errstate(invalid="ignore", divide="ignore"):
        traj_table = tok_w[:, None] / pw
    traj = {d: float(tokens.sum() / passes[:, j].sum()) for j, d in enumerate(t.drafters)}
    traj["greedy_oracle"] = greedy_oracle_trajectory(t).tokens_per_pass
    traj["oracle"] = trajectory_oracle(t).tokens_per_pass
    wl_oracle = float(tokens.sum() / pw.min(1).sum())
    # the length-biased figures the per-position mean gives, kept only under names that say so
    _, _, pp_pooled, pp_p, pp_wl, pp_pb = _accepted_stats(t)
    per_pos = {
        "per_block_gap_per_position": pp_pb / pp_pooled[pp_p] - 1,
        "workload_headroom_per_position": pp_wl / pp_pooled[pp_p] - 1,
        "best_fixed_per_position": t.drafters[pp_p],
    }
    return ReplaySummary(
        drafters=t.drafters,
        workloads=t.workloads,
        label=t.label,
        block_set=f"the primary {t.drafters[p]}'s own trajectory starts, {b.n_records} blocks "
        f"(dense log of {t.n_records} positions)",
        table=table,
        n_per_workload=n_w,
        pooled=pooled,
        best_fixed=p,
        workload_oracle=wl_oracle,
        workload_headroom=wl_oracle / traj[t.drafters[p]] - 1,
        per_block_oracle=pb,
        per_block_gap=pb / pooled[p] - 1,
        n_blocks=b.n_records,
        n_prompts=t.n_prompts,
        trajectory=traj,
        trajectory_table=traj_table,
        per_position=per_pos,
        sources=srcs,
        primary_rule=trajectory.rule_name(t),
    )


def with_ci(s: ReplaySummary, t: BlockTable, n_resamples: int = 2000, seed: int = 0) -> ReplaySummary:
    """`s` with 95% bootstrap CIs (bandit/stats/bootstrap.py: prompt clusters within workloads, percentile) of the
    headroom, the per-block gap and, on dense logs, the trajectory oracle gain."""
    keep = ("per_block_gap", "workload_headroom", "trajectory_oracle_gain")
    entries = [e for e in table_stats(t, "prompt", n_resamples, seed, "percentile") if e.name in keep]
    flat = no_variation(t, "prompt")
    cis = {e.name: degenerate(e, flat).ci for e in entries}
    if t.dense:  # the length-biased per-position figures, for contrast: every position treated as a block
        for e in accepted_entries(t, "prompt", n_resamples, seed, "percentile", rechoose=True)[:2]:
            cis[f"{e.name}_per_position"] = degenerate(e, flat).ci
    return replace(s, ci=cis)


# ---------------------------------------------------------------- entry points


def cli(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    drafters: Annotated[Optional[str], typer.Option(help="comma-separated subset of drafters")] = None,
    resamples: Annotated[
        int, typer.Option(help=f"bootstrap resamples for the 95% CIs, in [0, {outputs.MAX_RESAMPLES}] (0: no CI)")
    ] = 2000,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    out: Annotated[
        Optional[str],
        typer.Option(help="report file (default: <run dir>/replay.txt, with every option at its default)"),
    ] = None,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """Counterfactual replay on the block set: mean accepted table, primary, workload and per-block oracles,
    trajectories in tokens per target pass.

    Block set: sparse logs, the logged block starts; dense logs, the primary's own trajectory starts (the primary:
    the fastest fixed drafter measured in the run's live phase where it has one, else most output tokens per target
    pass along its own trajectory; `block` marks are ignored). Length-biased means
    over every position of a dense log appear only under `per_position` names.
    PATHS default to the published campaign (paper/campaign.txt; --latest: the newest complete run). When the logs
    are one run and every option is at its default, the tables are also written beside it (<run dir>/replay.txt;
    else only to --out). --json prints one JSON object (keys: label, block_set, table, pooled, primary,
    workload_headroom, per_block_gap, n_blocks, trajectory and tokens_per_pass and per_position on dense logs, ci);
    --drafters a,b restricts the drafters.
    """
    if paths and all(is_observed(p) for p in paths):  # an engine's own counters: only what they observed
        for p in paths:
            summarize_observed(p)
        return
    typer.echo(main(paths or [], json_out, drafters, resamples, seed, outputs.path_arg(out, "--out"), latest), nl=False)


def main(
    paths: Sequence[str | Path] = (),
    json_out: bool = False,
    drafters: str | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    out: Path | None = None,
    latest: bool = False,
) -> str:
    """The report (or with `json_out` the JSON object); written to OUT (default, with every option at its default:
    <run dir>/replay.txt beside the one run read; bandit/logs/outputs.py)."""
    outputs.resamples(n_resamples, allow_zero=True), outputs.seed(seed)
    inp = outputs.resolve(paths, latest)
    names = drafter_names(drafters)
    t = attach(load_logs(inp.files, names), inp.dir)  # the primary by measured speed (bandit/live/primary.py)
    s = summarize(t)
    if n_resamples > 0:
        s = with_ci(s, t, n_resamples, seed)
    if json_out:
        fast = {w: {"drafter": d, "tokens_per_s": v} for w, (d, v) in fastest_by_workload(t).items()}
        return json.dumps(s.to_json() | ({"fastest_fixed_live": fast} if fast else {}), sort_keys=True) + "\n"
    opts = [("--drafters", drafters, None), ("--resamples", n_resamples, 2000), ("--seed", seed, 0)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(inp, "replay.txt", out, differs, "bandit/replay.py")
    if out is not None:
        outputs.guard_out(dest, [dest.name], inp, ["replay.txt"], differs)
    cmd = outputs.command("bandit/replay.py", inp, opts)
    live = "\n".join(primary_lines(t, max(n_resamples, 1), seed)) + "\n" if t.live_tokens is not None else ""
    said = inp.said or f"[{t.label}] logs {inp.named}"
    text = (
        f"{outputs.HEADER}{cmd}\n{said}\n{t.summary()}\n{s.summary()}\n{live}inputs: "
        + ", ".join(f"{p} sha256:{h[:12]}" for p, h in s.sources)
        + f"; code {code_version('bandit')}\n"
    )
    if dest is None:
        return text + why + "\n"
    return text + outputs.wrote([dest], outputs.write_all([(dest, text)], text))


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(cli)
