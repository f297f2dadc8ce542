"""The per-block selector's report: its leave-one-workload-out table, frontier plot and ci.json entries.

The estimator (scores, folds, rules) is bandit/selector_fit.py's; this module resamples it
(bandit/stats/bootstrap.py: every fit, primary, alternatives set and threshold remade in every resample)
and says what it found.

    python bandit/selector.py [PATHS...] [--out-dir DIR]    # LOWO table + DIR/selector_frontier.{png,csv}
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/selector.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer

from bandit.logs import outputs
from bandit.logs import progress
from bandit.stats import trajectory
from bandit.stats.bootstrap import JACK_GROUPS, Entry, Interval, cluster_units, interval, resample_counts
from bandit.logs.reader import load_logs
from bandit.live.primary import attach, model_check_lines
from bandit.logs.schema import code_version
from bandit.selector_fit import SCORES, NestedResult, candidates, frontier_points, nested, primaries, rule_text
from bandit.logs.table import BlockTable
from bandit.live.timingmodel import LABEL as TIMING_LABEL


def selector_entries(t: BlockTable, unit: str, n_refit: int, seed: int, method: str) -> list[Entry]:
    """The LOWO selector's entries: frontier areas of every score (headline) and the logistic score's operating
    point, with every fit, primary, alternatives set and threshold remade in every resample (bandit/selector.py)."""
    W, P = len(t.workloads), t.n_prompts
    point = nested(t, np.ones((1, P)))
    fixed = row_w = None
    if unit == "prompt":
        _, strata = cluster_units(t, "prompt")
        wp = resample_counts(strata, n_refit, seed).astype(float)
    else:  # single blocks of each fold's block set (its primary chosen on its training workloads, then fixed)
        fixed = primaries(t)
        cands = candidates(t, sorted(set(fixed)))
        row_w = {q: resample_counts(cands[q].workload, n_refit, seed).astype(float) for q in set(fixed)}
        wp = np.ones((n_refit, P))
    boot = nested(
        t,
        wp,
        fold_primaries=fixed,
        row_weights=row_w,
        progress=f"selector refits: {wp.shape[0]} resamples, held-out workload",
    )
    jack = None
    if method == "bca":
        if unit == "prompt":
            G = min(P, JACK_GROUPS)
            group = np.arange(P) % G
            jack = nested(t, (group[None, :] != np.arange(G)[:, None]).astype(float))
        else:
            jw = {}
            for q in set(fixed):
                n = cands[q].rows.size
                G = min(n, JACK_GROUPS)
                jw[q] = ((np.arange(n) % G)[None, :] != np.arange(JACK_GROUPS)[:, None]).astype(float)
            jack = nested(t, np.ones((JACK_GROUPS, P)), fold_primaries=fixed, row_weights=jw)
    n_w = [int(point.sums["logistic"][g].w[0]) for g in range(W)]
    c_w = np.bincount(t.workload[trajectory.prompt_rows(t)[0]], minlength=W)
    out: list[Entry] = []

    def add(name: str, v: np.ndarray, bt: np.ndarray, jk: np.ndarray | None, g: int | None, label: str) -> None:
        nb = sum(n_w) if g is None else n_w[g]
        nc = P if g is None else int(c_w[g])
        out.append(Entry(name, interval(float(v[0]), bt, jk, method, unit, seed), nb, nc, label))

    for sc in SCORES:
        pre = "selector_frontier_area" + ("" if sc == "logistic" else f"_{sc}")
        for j in range(W + 1):
            name = pre if j == W else f"{pre}[{t.workloads[j]}]"
            add(
                name,
                point.areas[sc][:, j],
                boot.areas[sc][:, j],
                None if jack is None else jack.areas[sc][:, j],
                None if j == W else j,
                t.label,
            )
    for g in [None, *range(W)]:
        o, ob = point.outcome("logistic", g), boot.outcome("logistic", g)
        oj = None if jack is None else jack.outcome("logistic", g)
        sfx = "" if g is None else f"[{t.workloads[g]}]"
        for key, name in (
            ("capture", "selector_capture"),
            ("redraft_rate", "selector_redraft_rate"),
            ("skill", "selector_skill"),
            ("token_gain", "selector_token_gain"),
            ("speedup", "selector_speedup"),
        ):
            why = None
            if key == "skill" and not 0 < o["redraft_rate"][0] < 1:  # listed with the reason, not dropped
                why = (
                    "undefined: the selector re-drafts "
                    + ("every block" if o["redraft_rate"][0] >= 1 else "no block")
                    + ", so capture per re-draft says nothing about its ranking"
                )
            if key == "capture" and not np.isfinite(o["capture"][0]):
                why = "undefined: the alternatives have no gap to capture on this block set"
            if why is not None:
                nan = float("nan")
                out.append(
                    Entry(
                        f"{name}{sfx}",
                        Interval(nan, nan, nan, method, unit, n_refit, seed, why),
                        0,
                        t.n_prompts,
                        t.label,
                    )
                )
                continue
            add(
                f"{name}{sfx}",
                o[key],
                ob[key],
                None if oj is None else oj[key],
                g,
                "MODEL" if key == "speedup" else t.label,
            )
    return out


def render(t: BlockTable, point: NestedResult, boot: NestedResult | None = None, how: str = "", seed: int = 0) -> str:
    """The LOWO table: frontier areas (headline) and each fold's operating point, with 95% percentile intervals
    from `boot` (the same LOWO under bootstrap weights) where given."""
    tag = "unlabelled" if t.label == "UNLABELLED" else t.label
    W = len(t.workloads)

    def cell(v: np.ndarray, b: np.ndarray | None, fmt: str) -> str:
        x = float(v[0])
        if not np.isfinite(x):
            return "undefined"
        if b is None:
            return format(x, fmt)
        iv = interval(x, b, None, "percentile", "prompt", seed)
        ci = f" [{format(iv.lo, fmt)}, {format(iv.hi, fmt)}]" if np.isfinite(iv.lo) else " [no CI]"
        return format(x, fmt) + ci

    where = "each fold primary's own trajectory starts (dense log)" if t.dense else "the logged block starts"
    timed = getattr(point.costs, "source_kind", "") == "timing"
    sp_label = f"[{TIMING_LABEL}]" if timed else "[MODEL]"
    lines = [
        f"block sets: {where}; each fold's primary: the {trajectory.rule_name(t)}, chosen on its training workloads",
        point.costs.describe(),
        (
            "every speedup below comes from the timing model fitted on the live phase "
            f"[{TIMING_LABEL}], each block priced by its passes, verified tokens and drafter calls"
            if timed
            else "every speedup below is the rho/alpha cost model's [MODEL] (no live phase to fit a timing model on)"
        ),
        f"frontier area (out-of-fold capture vs redraft rate; 0.5 = random) [{tag}]"
        + (f", 95% CI: {how}" if how else "")
        + "; pooled over folds, the logistic score by its rank within its fold (each fold's fit has its own scale)",
        "| score | " + " | ".join(t.workloads) + " | pooled |",
        "|---|" + "---|" * (W + 1),
    ]
    for s in point.areas:
        lines.append(
            f"| {s} | "
            + " | ".join(
                cell(point.areas[s][:, j], None if boot is None else boot.areas[s][:, j], ".3f") for j in range(W + 1)
            )
            + " |"
        )
    lines += [
        "",
        f"operating point per held-out workload (rule chosen on the other workloads by modelled speedup over the "
        f"fold's primary) [{tag}]; speedup {sp_label}; skill only where 0 < redraft < 1",
        "| score | held-out | primary | rule (inner LOWO) | capture | redraft | skill | token gain | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in point.areas:
        for g in [*range(W), None]:
            o = point.outcome(s, g)
            ob = None if boot is None else boot.outcome(s, g)
            R = float(o["redraft_rate"][0])
            if g is None:
                name, prim, rule = "pooled", "-", "-"
            else:
                r = point.rules[s][g][0]
                name, prim, rule = t.workloads[g], t.drafters[r.primary], rule_text(r, s, t.drafters)
                if r.kind == "threshold" and R in (0.0, 1.0):
                    rule += (
                        " (degenerate here: re-drafts no held-out block)"
                        if R == 0
                        else " (degenerate here: re-drafts every held-out block)"
                    )
            c = {
                k: cell(o[k], None if ob is None else ob[k], f)
                for k, f in (("capture", ".3f"), ("redraft_rate", ".3f"), ("token_gain", "+.4f"), ("speedup", ".4f"))
            }
            sk = (
                cell(o["skill"], None if ob is None else ob["skill"], ".2f")
                if np.isfinite(o["skill"][0])
                else "n/a (degenerate)"
            )
            lines.append(
                f"| {s} | {name} | {prim} | {rule} | {c['capture']} | {c['redraft_rate']} | {sk} | "
                f"{c['token_gain']} | {c['speedup']} |"
            )
    return "\n".join(lines) + "\n"


def frontier_files(t: BlockTable, command: str, scores: Sequence[str] = SCORES) -> tuple[str, bytes]:
    """selector_frontier.csv's text (score, redraft_rate, capture, token_gain) and .png's bytes (random diagonal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ["score,redraft_rate,capture,token_gain"]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8, label="random re-draft (area 0.5)")
    for i, s in enumerate(scores):
        R, C, g = frontier_points(t, s)
        step = max(1, R.size // 400)
        keep = np.r_[np.arange(0, R.size, step), R.size - 1] if R.size > 1 else np.arange(R.size)
        keep = np.unique(keep)
        rows += [f"{s},{a:.6f},{b:.6f},{c:.6f}" for a, b, c in zip(R[keep], C[keep], g[keep])]
        ax.plot(R, C, color=f"C{i}", label=f"{s} (out-of-fold)")
    ax.set_xlabel("redraft rate R")
    ax.set_ylabel("capture C of the per-block oracle gap")
    ax.set_title(f"selector frontier, pooled out-of-fold [{t.label}]")
    ax.legend(fontsize=8)
    fig.tight_layout()
    data = outputs.png(fig, command)
    plt.close(fig)
    return "\n".join(rows) + "\n", data


FILES = ("selector.txt", "selector_frontier.csv", "selector_frontier.png")


def main(
    paths: Sequence[str | Path] = (),
    n_resamples: int = 200,
    seed: int = 0,
    out_dir: Path | None = None,
    latest: bool = False,
) -> str:
    """The report; selector.txt and selector_frontier.csv/.png written into OUT_DIR (default, with every option at
    its default: beside the one run read; bandit/logs/outputs.py)."""
    outputs.resamples(n_resamples, allow_zero=True), outputs.seed(seed)
    inp = outputs.resolve(paths, latest)
    opts = [("--resamples", n_resamples, 200), ("--seed", seed, 0)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(
        inp, "selector.txt", None if out_dir is None else Path(out_dir) / FILES[0], differs, "bandit/selector.py"
    )
    if out_dir is not None:
        outputs.guard_out(dest, FILES, inp, FILES, differs)
    cmd = outputs.command("bandit/selector.py", inp, opts)
    t = attach(load_logs(inp.files), inp.dir)
    point = nested(t, np.ones((1, t.n_prompts)))
    boot, how = None, ""
    if n_resamples > 0:
        _, strata = cluster_units(t, "prompt")
        boot = nested(
            t,
            resample_counts(strata, n_resamples, seed).astype(float),
            progress=f"selector: {n_resamples} resamples, held-out workload",
        )
        how = (
            f"percentile bootstrap over prompt clusters within workloads, {n_resamples} resamples (every fit, "
            f"primary, alternatives set and threshold remade in each), seed {seed}"
        )
    text_body = render(t, point, boot, how, seed)
    checks = "".join(x + "\n" for x in model_check_lines(t))
    text = (
        f"{outputs.HEADER}{cmd}\n"
        f"read: {inp.said or inp.named}\n{t.summary()}\n"
        + text_body
        + ("\n" + checks if checks else "")
        + "inputs: "
        + ", ".join(f"{x.path} sha256:{x.sha256[:12]}" for x in t.sources)
        + f"; code {code_version('bandit')}\n"
    )
    if dest is None:
        return text + why + "\n"
    csv, png = frontier_files(t, cmd)
    d = dest.parent
    done = outputs.write_all([(d / FILES[0], text), (d / FILES[1], csv), (d / FILES[2], png)], text)
    return text + outputs.wrote([d / FILES[0], d / FILES[2], d / FILES[1]], done)


def cli(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    resamples: Annotated[
        int,
        typer.Option(help=f"bootstrap resamples for the frontier-area CIs, in [0, {outputs.MAX_RESAMPLES}] (0: no CI)"),
    ] = 200,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    out_dir: Annotated[
        Optional[str],
        typer.Option(
            help="write selector.txt and selector_frontier.png/.csv here (default: beside the one run read, with "
            "every option at its default; else nowhere)"
        ),
    ] = None,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
) -> None:
    """Per-block selector, leave-one-workload-out: frontier areas (0.5 = random) of the logistic score and the
    training-free conf_min / ent_mean / draft_empty scores, and each fold's operating point (primary, alternatives
    and threshold chosen on the training workloads by the modelled speedup: the timing model fitted on the run's live
    phase where it has one, else the rho/alpha model of the manifest's timing, else the what-if of docs/DESIGN.md).
    The primary: the fastest fixed drafter measured live, else the token proxy. Dense logs: every fold on its
    primary's trajectory starts. PATHS default to the published campaign (paper/campaign.txt).
    """
    progress.quiet(quiet)
    typer.echo(main(paths or [], resamples, seed, outputs.path_arg(out_dir, "--out-dir"), latest), nl=False)


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(cli)
