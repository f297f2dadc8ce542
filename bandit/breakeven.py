"""From the token proxy to wall clock: the verdicts of re-drafting under the cost model of docs/DESIGN.md.

Where the run has a live phase (bandit/live/primary.py attaches it), the primary is the fastest fixed
drafter measured live, and every verdict (best-of-N, each single alternative re-drafted at every
block, the LOWO selector) prices the block set's passes, verified tokens and drafter calls with the
timing model fitted on the live phase (bandit/live/timingmodel.py), beside each alternative's break-even
call time; the rho/alpha model below stays as the what-if, its error against the live phase printed.
The rho/alpha model: costs are in units of one target verification pass. The primary alone pays `c0 = 1 + rho_p` per
block; re-drafting a fraction R of blocks with alternatives A pays
`c = 1 + rho_p + R * (sum_{d in A} rho_d + alpha(|A|))`, where alpha(K) is the extra target cost of
verifying the primary's and K alternatives' drafts together: the manifest's union-verify time of
1 + K drafts over one draft's, minus 1 (so best-of-N over D drafters is charged the union of all
D drafts); K with separate verification passes. Speedup = (1 + g) * c0 / c, g the token gain per
block (tau = accepted + 1, capped at the output's end). Best-of-N is R = 1 with every other drafter.

    python bandit/breakeven.py [PATHS...] [--out F]   # published campaign -> runs/<run>/breakeven.txt, .png, .csv
    specbandit breakeven --gain 0.081 --redraft 0.43 --alternatives 1 --rho 0.02,0.05,0.1 --alpha 0 --json
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/breakeven.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer

from bandit import selector, wallclock
from bandit.live import livelog
from bandit.logs import outputs
from bandit.logs import progress
from bandit.stats import trajectory
from bandit.stats.bootstrap import boot_totals, interval, no_variation
from bandit.breakeven_text import Band, engine_lines, plot_files, render
from bandit.stats.costmodel import (
    Costs,
    breakeven_regime,
    costs_for,
    engine_costs,
    read_engine_timing,
    speedup_equal,
    whatif,
)
from bandit.logs.errors import InputError, UsageError
from bandit.logs.reader import load_logs
from bandit.live.primary import attach, model_check_lines, primary_lines
from bandit.live.timingmodel import TimingModel

RES = outputs.RESAMPLES_HELP
__all__ = ["Band", "BreakevenReport", "cli", "engine_lines", "main", "plot_files", "render", "report_from_table"]


@dataclass(frozen=True)
class BreakevenReport:
    """Break-even of re-drafting on one campaign: best-of-N, each single alternative, the LOWO selector.

    Token gains are measured on the block set (the primary's trajectory starts on dense logs), with
    95% percentile bootstrap CIs over prompt clusters; a speedup is a monotone function of the gain
    at a fixed redraft rate, so its interval is the gain interval mapped through the cost model [MODEL].
    """

    label: str
    block_set: str
    primary: str
    drafters: tuple[str, ...]
    costs: Costs
    bon_gain: Band  # best-of-N over every drafter (R = 1), token gain
    single_gain: dict[str, Band]  # always re-draft with one alternative d (R = 1), token gain
    selector: dict[str, Band]  # LOWO selector (operating point under `costs`): token_gain, redraft_rate, speedup
    ci_how: str
    sources: tuple = ()
    live: dict | None = None  # the live phase's best-of-N entry (bandit/wallclock.py), if the run has one
    engine: Costs | None = None  # costs measured inside a production engine (--engine-timing), if given
    n_workloads: int = 0
    primary_rule: str = ""  # how the primary was chosen (trajectory.rule_name)
    timing: TimingModel | None = None  # the live phase's timing model: the verdicts' cost model where given
    timed: dict = dataclasses.field(default_factory=dict)  # under it: best_of_n, each alternative, break-even ms
    notes: tuple[str, ...] = ()  # the primary's lines (bandit/live/primary.py), where a live phase chose it
    checks: tuple[str, ...] = ()  # the cost models' errors against the live phase
    command: str = ""  # the command that made the report (its first line, bandit/logs/outputs.py)

    @property
    def K(self) -> int:
        return len(self.drafters) - 1

    def bon_speedup(self, rho: float | None = None, alpha: float | None = None) -> Band:
        """Best-of-N speedup: under the measured costs (rho, alpha None) or the equal-rho what-if."""
        p = self.drafters.index(self.primary)
        alts = [j for j in range(len(self.drafters)) if j != p]
        if rho is None:
            f = lambda g: self.costs.speedup(p, alts, 1.0, g)
        else:
            f = lambda g: speedup_equal(g, 1.0, self.K, rho, self.costs.alpha(self.K) if alpha is None else alpha)
        b = self.bon_gain
        return Band(float(f(b.value)), float(f(b.lo)), float(f(b.hi)), "MODEL")


def report_from_table(t, n_resamples: int = 2000, n_refit: int = 200, seed: int = 0) -> BreakevenReport:
    """Best-of-N and single-alternative gains, and their speedups under the live phase's timing model where the
    table carries one, with the primary and its block set re-chosen in every resample by the table's rule (per-prompt
    totals for every candidate primary, as bandit/replay.py does); and the LOWO selector's entries."""
    costs = costs_for(t.drafters, t.manifests[0] if t.manifests else None)
    model = t.timing_model
    D, P = len(t.drafters), t.n_prompts
    strata = np.zeros(P, np.int64)
    strata[t.prompt] = t.workload
    # per prompt and candidate primary q: [tokens of q alone, gain of best-of-N, gain of re-drafting with each d];
    # under a timing model also [blocks, ms of q alone (prefill apart), ms best-of-N adds, ms each d adds]
    per_q, ms_q = np.zeros((P, D, D + 2)), np.zeros((P, D, D + 3))
    starts = trajectory.fixed_starts(t) if t.dense else None
    for q in range(D):
        rows = starts[:, q] if t.dense else t.is_block_start
        tau = trajectory.block_tokens(t, rows).astype(float)
        cols = np.c_[tau[:, q], tau.max(1) - tau[:, q], np.maximum(tau, tau[:, [q]]) - tau[:, [q]]]
        np.add.at(per_q[:, q], t.prompt[rows], cols)
        if model is not None:
            n, L = tau.shape[0], t.draft_len[rows].astype(float)
            base, bon = model.row_costs(q, [j for j in range(D) if j != q], n, L)
            one = [model.row_costs(q, [d] if d != q else [], n, L)[1] for d in range(D)]
            np.add.at(ms_q[:, q], t.prompt[rows], np.column_stack([np.ones(n), base, bon, *one]))
    key = trajectory.proxy_key(t, starts)  # the token proxy; the live sums decide where the table has them
    live = np.c_[t.live_tokens, t.live_ms] if t.live_tokens is not None else np.zeros((P, 2 * D))
    pre = t.prefill_ms if t.prefill_ms is not None else np.zeros(P)
    totals = np.c_[per_q.reshape(P, -1), ms_q.reshape(P, -1), key, live, pre]
    o_ms, o_key = D * (D + 2), D * (D + 2) + D * (D + 3)
    calls = model.call_ms if model is not None else np.zeros(D)

    def stat(T: np.ndarray) -> np.ndarray:
        n, ix = len(T), np.arange(len(T))
        L = T[:, o_key + D : o_key + 3 * D]
        p = trajectory.choose_primary(
            T[:, o_key : o_key + D], *((L[:, :D], L[:, D:]) if t.live_tokens is not None else (None, None))
        )
        q = T[:, :o_ms].reshape(n, D, D + 2)[ix, p]  # (n, D + 2) on p's block set
        m = T[:, o_ms:o_key].reshape(n, D, D + 3)[ix, p]  # (n, D + 3)
        tok0, gains = q[:, :1], q[:, 1:]
        blocks, ms0 = m[:, :1], m[:, 1:2] + T[:, -1:]
        with np.errstate(invalid="ignore", divide="ignore"):
            sp = (tok0 + gains) / (ms0 + m[:, 2:]) * ms0 / tok0  # (n, D + 1): best-of-N, then each d
            # the call time at which always re-drafting with d breaks even: speedup 1 solved for c_d
            be = ((tok0 + gains[:, 1:]) * ms0 / tok0 - ms0 - (m[:, 3:] - blocks * calls)) / blocks
            return np.c_[gains / tok0, sp, be]

    value, boot, _ = boot_totals(totals, stat, strata, n_resamples, seed, jackknife=False)
    p = trajectory.primary(t, starts)
    flat = no_variation(t)

    def band(i: int, label: str) -> Band:
        iv = interval(value[i], boot[:, i], None, "percentile", "prompt", seed)
        if flat:  # every resample is the data: no interval, and saying so beats a zero-width one
            return Band(iv.value, float("nan"), float("nan"), label)
        return Band(iv.value, iv.lo, iv.hi, label)

    others = [(j, d) for j, d in enumerate(t.drafters) if j != p]
    timed = {}
    if model is not None:
        timed = {"best_of_n": band(D + 1, "MODEL")}
        timed |= {d: band(D + 2 + j, "MODEL") for j, d in others}
        timed |= {f"breakeven_call_ms[{d}]": band(2 * D + 2 + j, "MODEL") for j, d in others}
    sel = {}
    if len(t.workloads) >= 2 and D >= 2:
        ents = {e.name: e for e in selector.selector_entries(t, "prompt", n_refit, seed, "percentile")}
        for k in ("selector_token_gain", "selector_redraft_rate", "selector_speedup"):
            e = ents[k]
            sel[k] = Band(e.ci.value, e.ci.lo, e.ci.hi, e.label)
    how = (
        f"95% percentile bootstrap over prompt clusters within workloads, seed {seed}: {n_resamples} resamples "
        f"(token gains; the primary and its block set re-chosen in each), {n_refit} (selector, refitted in each)"
    )
    nb = int(starts[:, p].sum()) if t.dense else int(t.is_block_start.sum())
    return BreakevenReport(
        label=t.label,
        block_set=("the primary's own trajectory starts" if t.dense else "the logged block starts") + f", {nb} blocks",
        primary=t.drafters[p],
        drafters=t.drafters,
        costs=costs,
        bon_gain=band(0, t.label),
        single_gain={d: band(1 + j, t.label) for j, d in others},
        selector=sel,
        ci_how=how,
        sources=t.sources,
        n_workloads=len(t.workloads),
        primary_rule=trajectory.rule_name(t),
        timing=model,
        timed=timed,
        notes=tuple(primary_lines(t, n_resamples, seed) if t.live_tokens is not None else ()),
        checks=tuple(model_check_lines(t)),
    )


ENGINE_TIMING = Path(__file__).resolve().parents[1] / "bench" / "vllm_timing.json"


def default_engine_timing(t) -> Path | None:
    """The campaign's default --engine-timing: bench/vllm_timing.json where it exists and timed this campaign's
    target (its `target` the manifest's target path, its `k` the manifest's), else none."""
    m = t.manifests[0] if t.manifests else {}
    if not ENGINE_TIMING.is_file() or not isinstance(m.get("target"), dict):
        return None
    e = read_engine_timing(ENGINE_TIMING)
    target = m["target"].get("path")
    return ENGINE_TIMING if target is not None and e.get("target") == target and e.get("k") == m.get("k") else None


# What-if inputs a block of drafts can mean: a token gain of -99% (the alternative's tokens a hundredth of the
# primary's) to 64x (a draft of k <= 64 tokens over a primary's one), and drafter or re-draft costs of at most 100
# target passes. Past these the cost model prints numbers no engine can reach.
GAIN_MIN, GAIN_MAX, COST_MAX = -0.99, 64.0, 100.0


def cli(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    gain: Annotated[
        Optional[float], typer.Option(help=f"what-if: token gain as a fraction (0.081), in [{GAIN_MIN}, {GAIN_MAX}]")
    ] = None,
    redraft: Annotated[Optional[float], typer.Option(help="what-if: redraft rate R, in [0, 1]")] = None,
    alternatives: Annotated[int, typer.Option(help="what-if: alternatives re-drafted (K), in [1, 64]")] = 1,
    rho: Annotated[str, typer.Option(help=f"what-if: comma-separated drafter costs, each in [0, {COST_MAX}]")] = (
        "0.02,0.05,0.1,0.15,0.2"
    ),
    alpha: Annotated[float, typer.Option(help=f"what-if: extra target cost of a re-draft, in [0, {COST_MAX}]")] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="what-if: print one JSON object")] = False,
    out: Annotated[
        Optional[str],
        typer.Option(
            help="report file (default: <run dir>/breakeven.txt beside the one run read, with every option at its "
            "default; else nothing)"
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples for the token gains, {RES}")] = 2000,
    refit_resamples: Annotated[int, typer.Option(help=f"bootstrap resamples for the selector refits, {RES}")] = 200,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    engine_timing: Annotated[
        Optional[str],
        typer.Option(
            help="a production engine's timing in the manifest's form with its 'engine' named (e.g. "
            "bench/vllm_timing.json from bench/vllm_crosscheck.py): the verdicts also under its costs; default: "
            "bench/vllm_timing.json where it timed the campaign's target; 'none': no engine section"
        ),
    ] = None,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """Wall-clock break-even of re-drafting (docs/DESIGN.md cost model), every number with a 95% CI.

    What-if mode (--gain G --redraft R [--alternatives K --rho a,b --alpha A] [--json]): prints speedup per rho and
    the break-even rho (null: no break-even on rho >= 0). Otherwise reads PATHS (default: the published campaign,
    paper/campaign.txt): best-of-N, each single alternative and the LOWO selector over the primary (the fastest fixed
    drafter measured live where the run has a live phase), under the timing model fitted on the live phase (else the
    manifest's rho/alpha costs, else the what-if), the rho/alpha model's error beside it, and an equal-rho table;
    with every option at its default (or with --out) writes the report, its plot and the plot's data.
    --engine-timing FILE adds best-of-N and each alternative under a production engine's measured costs.
    """
    progress.quiet(quiet)
    if gain is not None or redraft is not None:
        typer.echo(whatif_text(gain, redraft, alternatives, rho, alpha, json_out), nl=False)
        return
    eng = (
        None
        if engine_timing is None
        else engine_timing
        if engine_timing == "none"
        else outputs.path_arg(engine_timing, "--engine-timing")
    )
    typer.echo(
        main(paths or [], outputs.path_arg(out, "--out"), resamples, refit_resamples, seed, eng, latest), nl=False
    )


def whatif_text(gain, redraft, alternatives: int, rho: str, alpha: float, json_out: bool) -> str:
    """The what-if answer from explicit numbers, every input checked (finite, in range)."""
    if gain is None or redraft is None:
        raise UsageError("what-if mode needs both --gain and --redraft")
    outputs.finite("--gain", gain, GAIN_MIN, GAIN_MAX), outputs.finite("--redraft", redraft, 0.0, 1.0)
    outputs.finite("--alpha", alpha, 0.0, COST_MAX), outputs.bounded("--alternatives", alternatives, 1, 64)
    try:
        rhos = [float(x) for x in rho.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--rho {rho!r}: expected comma-separated numbers, e.g. 0.02,0.05") from None
    if not rhos or not all(math.isfinite(r) and 0 <= r <= COST_MAX for r in rhos):
        raise UsageError(f"--rho {rho!r}: expected numbers in [0, {COST_MAX}]")
    ans = whatif(gain, redraft, alternatives, rhos, alpha)
    if json_out:
        return json.dumps(ans, sort_keys=True, allow_nan=False) + "\n"
    regime = breakeven_regime(gain, redraft, alternatives, alpha)
    lines = [f"rho {k}: speedup {v:.4f} [MODEL]" for k, v in ans["speedup"].items()]
    return "\n".join([*lines, f"break-even rho: {ans['breakeven_rho']} ({regime}) [MODEL]"]) + "\n"


def _live_entry(t, run: Path | None, seed: int) -> dict | None:
    """best-of-N's entry of the run's live phase, when the logs are one run that has one."""
    if run is None or not (run / livelog.LIVE_FILE).is_file() or not t.dense:
        return None
    try:
        res = wallclock.evaluate(t, livelog.load_live(run, t), seed=seed, live_path=run / livelog.LIVE_FILE)
    except InputError as e:  # the live phase cannot be evaluated: said, and the rest of the report stands
        return {"unavailable": str(e)}
    return next((e for e in res.entries if e["config"] == "best_of_n"), None)


def main(
    paths: Sequence[str | Path] = (),
    out: Path | None = None,
    n_resamples: int = 2000,
    n_refit: int = 200,
    seed: int = 0,
    engine_timing: Path | str | None = None,
    latest: bool = False,
) -> str:
    """The report; written with its plot and the plot's data to OUT (default, with every option at its default:
    <run dir>/breakeven.txt, .png, .csv beside the one run read; bandit/logs/outputs.py). engine_timing: None for the
    campaign's default (`default_engine_timing`), 'none' for no engine section, else a timing file."""
    outputs.resamples(n_resamples), outputs.resamples(n_refit, "--refit-resamples"), outputs.seed(seed)
    inp = outputs.resolve(paths, latest)
    t = attach(load_logs(inp.files), inp.dir)
    default = default_engine_timing(t)
    engine = default if engine_timing is None else None if engine_timing == "none" else Path(engine_timing)
    same = engine == default or (engine is not None and default is not None and engine.resolve() == default.resolve())
    eng_opt = None if same else outputs.show(engine) if engine is not None else "none"
    opts = [("--resamples", n_resamples, 2000), ("--refit-resamples", n_refit, 200), ("--seed", seed, 0)]
    opts += [("--engine-timing", eng_opt, None)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(inp, "breakeven.txt", out, differs, "bandit/breakeven.py")
    files = outputs.siblings(dest, (".png", ".csv"))
    if out is not None:
        outputs.guard_out(
            dest, [f.name for f in files], inp, ["breakeven.txt", "breakeven.png", "breakeven.csv"], differs
        )
    cmd = outputs.command("bandit/breakeven.py", inp, opts)
    r = report_from_table(t, n_resamples, n_refit, seed)
    r = dataclasses.replace(r, live=_live_entry(t, inp.dir, seed), command=cmd)
    if engine is not None:
        m = t.manifests[0] if t.manifests else None
        r = dataclasses.replace(r, engine=engine_costs(t.drafters, m, read_engine_timing(engine)))
    text = render(r)
    said = "" if inp.said is None else inp.said + "\n"
    if dest is None:
        return said + text + why + "\n"
    csv, png = plot_files(r, cmd)
    done = outputs.write_all(list(zip(files, (text, png, csv))), said + text)
    return said + text + outputs.wrote(files, done)


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(cli)
