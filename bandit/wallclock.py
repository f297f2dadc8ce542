"""Wall-clock: a timing model fitted on the live phase, its dense-log predictions checked against it.

A campaign's live phase (`live.jsonl`, harness/decode/livephase.py) decodes a seeded sample of prompts for
real with plain decoding (the target alone), every fixed drafter, best-of-N and every live policy
(bandit/policies/livepolicies.py). The step-time model (docs/DESIGN.md, "Wall clock"):

    wall_ms(prompt) = b_prefill + b_prompt * prompt_len                  (prefill)
                    + sum over passes step(tokens verified)             (target verify + per-step overhead)
                    + sum_d c_d * calls_d                              (each drafter's call time)

step is piecewise linear between knots and non-decreasing (bandit/stats/steps.py); c_d is each drafter's
measured mean time per call plus a fitted extra; the rest is fitted by non-negative least squares on the live
decodes that repeat their dense-log walk, whose pass sizes they take (bandit/live/timingmodel.py).
A configuration's tokens/s is *predicted from the dense log alone*: its output tokens, passes, verified
tokens and drafter calls come from walking the dense log along the configuration's own trajectory (plain: one pass per token; fixed drafter: its own accepted lengths;
best-of-N: the longest accepted at each block start; a policy: its replay over the same prompts in
the live order), with coefficients from the other prompts only (5-fold cross-fitting), and once
more from a fit without any decode of the configuration itself. Measured tokens/s = output tokens
summed / wall time summed over the live decodes. Both are ratios of sums over the sampled prompts,
with 95% percentile bootstrap intervals over prompt clusters resampled within workloads (the
prediction's interval holds the coefficients fixed). For every policy, how far its live choices
differ from the replayed ones; for every fixed drafter and best-of-N, the speedup over the fastest
fixed drafter as measured, as the timing model predicts it and as the rho/alpha cost model
(bandit/stats/costmodel.py) does. `<run dir>/wallclock.json` holds one entry per configuration.
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/wallclock.py`: import our `bandit`, not a namesake
    import pathlib, sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from bandit.logs import outputs
from bandit.stats import resample, steps
from bandit.stats import trajectory
from bandit.stats.costmodel import costs_for
from bandit.live.livelog import LIVE_FILE, Decode, decodes, design, load_live
from bandit.live.timingmodel import fit, term_names
from bandit.logs.reader import LogError, load_logs
from bandit.logs.schema import BEST_OF_N, FIXED, POLICY, code_version
from bandit.logs.table import BlockTable
from bandit.wallclock_text import choices_text, cost_model_text, plot_png, render

__all__ = ["choices_text", "cost_model_text", "evaluate", "main", "plot_png", "render"]

FOLDS = 5


def fold_of(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % FOLDS


@dataclass(frozen=True)
class WallclockResult:
    """Predicted against measured tokens/s per live configuration, and the fitted model."""

    run: str
    label: str
    drafters: tuple[str, ...]
    coef: dict[str, float]  # the model fitted on every live decode (ms per unit)
    entries: list[dict]  # <run dir>/wallclock.json's entries
    n_prompts: int
    same_as_dense: tuple[int, int]  # live decodes whose output equals the dense one, of all
    passes_agree: tuple[int, int]  # live decodes that repeat their dense walk (output, passes, verified, calls)
    ci_how: str
    inputs: list[dict]
    cost_models: dict | None = None  # speedups over the fastest fixed drafter: measured, timing model, rho/alpha
    command: str = ""  # the command that made the report (bandit/logs/outputs.py)

    def to_json(self, code_version: str) -> dict:
        return {
            "what": "predicted (dense log + timing model) against measured (live phase) tokens/s",
            "run": self.run,
            "inputs": self.inputs,
            "code_version": code_version,
            "model": {
                "coef_ms": self.coef,
                "fit": "pass@<Q> = ms of a target pass verifying Q tokens (linear between the knots, non-decreasing); "
                "call:<drafter> = measured mean per call + a fitted extra >= 0; all by NNLS on the live decodes that "
                f"repeat their dense-log walk, whose pass sizes they take; predictions {FOLDS}-fold cross-fitted "
                "over prompts",
                "definition": "docs/DESIGN.md, Wall clock",
            },
            "ci": self.ci_how,
            "same_as_dense": list(self.same_as_dense),
            "passes_agree": list(self.passes_agree),
            "entries": self.entries,
            "cost_models": self.cost_models,
        }


def evaluate(
    t: BlockTable,
    live: list[dict],
    run: str = "",
    n_resamples: int = 2000,
    seed: int = 0,
    live_path: Path | str = LIVE_FILE,
) -> WallclockResult:
    dec = decodes(t, live, live_path)
    per_wl = np.bincount([d.workload for d in dec if d.config == dec[0].config], minlength=len(t.workloads))
    thin = [t.workloads[w] for w in range(len(t.workloads)) if 0 < per_wl[w] < 2]
    if thin:  # one prompt: no interval within its workload, and nothing to fit its prediction on
        raise LogError(
            live_path,
            0,
            "prompts",
            f"the live phase has one prompt in {', '.join(thin)}; the timing "
            "model is fitted on other prompts and the intervals resample prompts within workloads: "
            "it needs at least 2 per workload (sweep.py --live-prompts N)",
        )
    knots = steps.table_knots(t)
    names = term_names(knots, t.drafters)
    X = np.array([design(d) for d in dec])  # the walk's pass sizes: the prediction's rows, and the fit's where
    y = np.array([d.wall_ms for d in dec])  # the live decode repeats its walk (`Decode.agrees`)
    M = np.array([d.draft_ms for d in dec])
    agrees = np.array([d.agrees for d in dec])
    folds = np.array([fold_of(t.prompt_ids[d.cluster]) for d in dec])
    cfg = np.array([d.config for d in dec])

    def crossfit(exclude: str | None = None) -> np.ndarray:
        """Predictions, each from a fit on the other folds' prompts (and without `exclude`'s decodes)."""
        pred = np.zeros(len(dec))
        for f in range(FOLDS):
            test = folds == f
            train = ~test & (cfg != exclude) & agrees
            if test.any():
                pred[test] = X[test] @ fit(X[train], y[train], M[train], len(knots)) if train.any() else np.nan
        return pred

    pred = crossfit()
    configs = list(dict.fromkeys(d.config for d in dec))
    # every configuration predicted again by a fit that never saw one of its decodes: its drafters' call
    # times then come from the other configurations (a fixed drafter's from best-of-N, and back)
    held = {c: crossfit(exclude=c) for c in configs}
    full = fit(X[agrees], y[agrees], M[agrees], len(knots))
    clusters = sorted({d.cluster for d in dec})
    col = {c: i for i, c in enumerate(clusters)}
    strata = np.zeros(len(clusters), np.int64)
    for d in dec:
        strata[col[d.cluster]] = d.workload
    # cluster multiplicities per resample: the bootstrap's own stratified draws (bandit/stats/resample.py)
    draws = np.concatenate(list(resample.count_chunks(strata, n_resamples, seed))).astype(float)

    def cluster_sums(c, p):
        S = np.zeros((len(clusters), 5))  # per cluster: live tokens, measured ms, dense tokens, predicted ms,
        for i, d in enumerate(dec):  # and the dense walk's target passes
            if d.config == c:
                S[col[d.cluster]] += (d.tokens, d.wall_ms, d.dense_tokens, p[i], d.x_dense[2])
        return S, draws @ S

    sums = {c: cluster_sums(c, pred) for c in configs}

    def iv(v):
        v = v[np.isfinite(v)]
        if v.size < 2:
            return [None, None]
        return [round(float(np.percentile(v, 2.5)), 4), round(float(np.percentile(v, 97.5)), 4)]

    def rates(c, sc=None):  # (measured, predicted) tokens/s: point and resamples
        S, B = sc if sc is not None else sums[c]
        with np.errstate(divide="ignore", invalid="ignore"):
            return (
                (1000 * S[:, 0].sum() / S[:, 1].sum(), 1000 * B[:, 0] / B[:, 1]),
                (1000 * S[:, 2].sum() / S[:, 3].sum(), 1000 * B[:, 2] / B[:, 3]),
            )

    fixed = sorted(c for c in configs if c.startswith(FIXED))  # name order: max() keeps the first on ties
    fastest = max(fixed, key=lambda c: rates(c)[0][0]) if fixed else None  # the point estimate's, measured
    # the primary as bandit/live/primary.py chooses it: measured live where every drafter was decoded alone
    if {FIXED + d for d in t.drafters} <= set(fixed):
        primary, rule = fastest, f"{trajectory.MEASURED_RULE}: the highest measured tokens/s pooled over the sample"
    else:
        primary, rule = FIXED + t.drafters[trajectory.primary(t)], trajectory.rule_name(t)
    entries = []
    for c in configs:
        (meas, bm), (prd, bp) = rates(c)
        e = {
            "config": c,
            "predicted_tokens_per_s": round(prd, 4),
            "predicted_ci": iv(bp),
            "measured_tokens_per_s": round(meas, 4),
            "measured_ci": iv(bm),
            "measured_over_predicted": round(meas / prd, 4),
            "ratio_ci": iv(bm / bp),
            "n_prompts": int(sum(d.config == c for d in dec)),
            "label": "MEASURED",
            "predicted_label": "MODEL",
        }
        if primary in sums and c != primary:  # the same resamples for both: a paired interval
            (pm, pbm), (pp, pbp) = rates(primary)
            e["speedup_over_primary"] = {
                "primary": primary,
                "rule": rule,
                "measured": round(meas / pm, 4),
                "measured_ci": iv(bm / pbm),
                "predicted": round(prd / pp, 4),
                "predicted_ci": iv(bp / pbp),
            }
        if c in held and np.isfinite(held[c]).all():  # a fold with no other configuration to fit on: none
            _, (hp, hbp) = rates(c, cluster_sums(c, held[c]))
            e["held_out_configuration"] = {
                "what": "predicted by a fit without any decode of this configuration",
                "predicted_tokens_per_s": round(hp, 4),
                "predicted_ci": iv(hbp),
                "measured_over_predicted": round(meas / hp, 4),
                "ratio_ci": iv(bm / hbp),
            }
        if c.startswith(POLICY):
            e["choices"] = choice_agreement([d for d in dec if d.config == c], t.drafters)
        entries.append(e)
    models = None
    if fixed:
        costs = costs_for(t.drafters, t.manifests[0] if t.manifests else None)
        rho = {FIXED + n: 1 + r for n, r in zip(t.drafters, costs.rho)}  # verify passes per block
        rho[BEST_OF_N] = 1 + costs.rho.sum() + costs.alpha(len(t.drafters) - 1)  # one union verify of all drafts

        def ra(c):  # tokens per verify-pass unit under rho/alpha: point and resamples
            S, B = sums[c]
            return S[:, 2].sum() / S[:, 4].sum() / rho[c], B[:, 2] / B[:, 4] / rho[c]

        (fm, fbm), (fp, fbp) = rates(fastest)
        rows = []
        for c in [c for c in configs if c in rho and c != fastest]:  # the fastest's own row is 1 by definition
            (m, bm), (p, bp) = rates(c)
            (r, br), (rf, brf) = ra(c), ra(fastest)
            rows.append(
                {
                    "config": c,
                    "measured": round(m / fm, 4),
                    "measured_ci": iv(bm / fbm),
                    "timing_model": round(p / fp, 4),
                    "timing_model_ci": iv(bp / fbp),
                    "timing_model_over_measured": round(p / fp / (m / fm), 4),
                    "rho_alpha": round(r / rf, 4),
                    "rho_alpha_ci": iv(br / brf),
                    "rho_alpha_over_measured": round(r / rf / (m / fm), 4),
                }
            )
        models = {
            "what": "speedup over the fastest fixed drafter: measured in the live phase [MEASURED], predicted by the "
            "timing model fitted on it [MODEL] and by the rho/alpha cost model [MODEL] (tokens per target pass of "
            "the dense walk over the live sample over 1 + rho per block; best-of-N 1 + sum rho + alpha(D - 1))",
            "fastest_fixed": fastest,
            "rule": "the highest measured tokens/s pooled over the live sample, held fixed in these intervals",
            "rho_alpha_costs": costs.describe(),
            "rows": rows,
        }
    same = int(sum(d.same_as_dense for d in dec))
    agree = int(agrees.sum())
    how = (
        f"95% percentile bootstrap over prompt clusters resampled within workloads, {n_resamples} resamples, "
        f"seed {seed}; predicted intervals hold the fitted coefficients fixed, and the primary of the speedups "
        "(chosen on the whole data) is held fixed too"
    )
    return WallclockResult(
        run=run,
        label=t.label,
        drafters=t.drafters,
        coef={n: round(float(v), 5) for n, v in zip(names, full)},
        entries=entries,
        n_prompts=len(clusters),
        same_as_dense=(same, len(dec)),
        passes_agree=(agree, len(dec)),
        ci_how=how,
        inputs=[{"path": str(s.path), "sha256": s.sha256} for s in t.sources],
        cost_models=models,
    )


def choice_agreement(dec: list[Decode], drafters: tuple[str, ...]) -> dict:
    """How far a policy's live choices are from its replay on the dense log over the same prompts in the same
    order: the decodes whose passes, verified tokens and calls equal the replay's; per-drafter shares of the
    chosen blocks live and replayed and their total variation distance (live `chosen` needed)."""
    agree = sum(np.array_equal(d.x_live, d.x_dense) for d in dec)
    rep = np.sum([d.chosen_dense for d in dec if d.chosen_dense is not None], 0)
    share = lambda v: {n: round(float(x), 4) for n, x in zip(drafters, v / max(v.sum(), 1))}
    out = {
        "learns_step_times": bool(dec and dec[0].step_times),  # told measured verify ms live, the Timing's in replay
        "decodes_equal_to_replay": [int(agree), len(dec)],
        "replay_chosen_share": share(rep),
    }
    if not dec or any(d.chosen_live is None for d in dec):
        return out | {"live_chosen": "not in live.jsonl (its lines carry no `chosen`)"}
    got = np.sum([d.chosen_live for d in dec], 0)
    tv = 0.5 * np.abs(got / max(got.sum(), 1) - rep / max(rep.sum(), 1)).sum()
    same = sum(np.array_equal(d.chosen_live, d.chosen_dense) for d in dec)
    return out | {
        "live_chosen_share": share(got),
        "total_variation": round(float(tv), 4),
        "chosen_equal_to_replay": [int(same), len(dec)],
    }


def run_dir_of(t: BlockTable) -> Path:
    dirs = sorted({Path(s.path).parent for s in t.sources})
    if len(dirs) != 1:
        raise LogError(
            dirs[0] if dirs else "",
            0,
            "paths",
            "wallclock reads one run directory (its live.jsonl "
            f"beside its dense log); got {len(dirs)}: " + ", ".join(map(str, dirs)),
        )
    return dirs[0]


def cli(
    paths: Annotated[
        Optional[list[str]], typer.Argument(help="a run directory (default: the published campaign)")
    ] = None,
    out: Annotated[
        Optional[str],
        typer.Option(
            help="JSON file (default: <run dir>/wallclock.json beside the run read, with every option at its default)"
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples, {outputs.RESAMPLES_HELP}")] = 2000,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """Predicted (dense log + fitted timing model) against measured (live phase) tokens/s, with 95% CIs.

    Reads one run's dense log and its live.jsonl; writes the JSON, this text (.txt) and a plot (predicted vs
    measured, identity line) beside the run (with every option at its default) or to --out.
    """
    typer.echo(main(paths or [], outputs.path_arg(out, "--out"), resamples, seed, latest), nl=False)


def main(paths=(), out: Path | None = None, n_resamples: int = 2000, seed: int = 0, latest: bool = False) -> str:
    outputs.resamples(n_resamples), outputs.seed(seed)
    inp = outputs.resolve(paths, latest)
    opts = [("--resamples", n_resamples, 2000), ("--seed", seed, 0)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(inp, "wallclock.json", out, differs, "bandit/wallclock.py")
    files = outputs.siblings(dest, (".txt", ".png"))
    if out is not None:
        outputs.guard_out(
            dest, [f.name for f in files], inp, ["wallclock.json", "wallclock.txt", "wallclock.png"], differs
        )
    cmd = outputs.command("bandit/wallclock.py", inp, opts)
    t = load_logs(inp.files)
    run = run_dir_of(t)
    r = evaluate(t, load_live(run, t), run.name, n_resamples, seed, run / LIVE_FILE)
    r = replace(r, command=cmd)
    text = render(r)
    said = "" if inp.said is None else inp.said + "\n"
    if dest is None:
        return said + text + why + "\n"
    obj = r.to_json(code_version("bandit")) | {"command": cmd}
    data = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    done = outputs.write_all(list(zip(files, (data, text, plot_png(r, cmd)))), said + text)
    return said + text + outputs.wrote(files, done)


if __name__ == "__main__":
    from bandit.logs.errors import run as _run

    _run(cli)
