"""From the token proxy to wall clock: the verdicts of re-drafting under the cost model of docs/DESIGN.md.

Where the run has a live phase (bandit/primary.py attaches it), the primary is the fastest fixed
drafter measured live, and every verdict (best-of-N, each single alternative re-drafted at every
block, the LOWO selector) prices the block set's passes, verified tokens and drafter calls with the
timing model fitted on the live phase (bandit/timingmodel.py), beside each alternative's break-even
call time; the rho/alpha model below stays as the what-if, its error against the live phase printed.
The rho/alpha model: costs are in units of one target verification pass. The primary alone pays `c0 = 1 + rho_p` per
block; re-drafting a fraction R of blocks with alternatives A pays
`c = 1 + rho_p + R * (sum_{d in A} rho_d + alpha(|A|))`, where alpha(K) is the extra target cost of
verifying the primary's and K alternatives' drafts together: the manifest's union-verify time of
1 + K drafts over one draft's, minus 1 (so best-of-N over D drafters is charged the union of all
D drafts); K with separate verification passes. Speedup = (1 + g) * c0 / c, g the token gain per
block (tau = accepted + 1, capped at the output's end). Best-of-N is R = 1 with every other drafter.

    python bandit/breakeven.py [PATHS...] [--out F]   # default campaign -> runs/<run>/breakeven.txt, .png, .csv
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

from bandit import livelog, progress, selector, trajectory, wallclock
from bandit.bootstrap import boot_totals, interval, no_variation
from bandit.costmodel import Costs, breakeven_regime, breakeven_rho, costs_for, engine_costs, speedup_equal, whatif
from bandit.costmodel import read_engine_timing
from bandit.errors import InputError
from bandit.logs import default_inputs, load_logs, output_path, run_dir
from bandit.primary import attach, model_check_lines, primary_lines
from bandit.timingmodel import LABEL as TIMING_LABEL
from bandit.timingmodel import TimingModel

from bandit.costmodel import TABLE_RHOS


@dataclass(frozen=True)
class Band:
    """A value with its 95% interval; `label` MEASURED / SIM / MODEL."""

    value: float
    lo: float
    hi: float
    label: str

    def fmt(self, pct: bool = False, nd: int = 3) -> str:
        def f(x):
            if not math.isfinite(x):
                return "undefined"
            return f"{100 * x:+.{max(nd - 2, 1)}f}%" if pct else f"{x:.{nd}f}"

        iv = f"[{f(self.lo)}, {f(self.hi)}]" if math.isfinite(self.lo) and math.isfinite(self.hi) else "(no CI)"
        return f"{f(self.value)} {iv} [{self.label}]"


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
    notes: tuple[str, ...] = ()  # the primary's lines (bandit/primary.py), where a live phase chose it
    checks: tuple[str, ...] = ()  # the cost models' errors against the live phase

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


def engine_lines(r: BreakevenReport) -> list[str]:
    """Best-of-N and each single alternative under the production engine's costs (same token gains and CIs)."""
    e = r.engine
    p = r.drafters.index(r.primary)
    alts = [j for j in range(len(r.drafters)) if j != p]
    out = [f"## under the engine's measured costs: {e.describe()} [MEASURED costs, MODEL speedups]"]

    def band(g: Band, js: list[int]) -> Band:
        f = lambda x: e.speedup(p, js, 1.0, x)
        return Band(float(f(g.value)), float(f(g.lo)), float(f(g.hi)), "MODEL")

    out.append(f"best-of-N (R = 1), alpha {e.alpha(r.K):.3f}: speedup {band(r.bon_gain, alts).fmt()}")
    for d, g in r.single_gain.items():
        j = r.drafters.index(d)
        out.append(f"always re-draft with {d} (R = 1), rho {e.rho[j]:.3f}: speedup {band(g, [j]).fmt()}")
    out.append("(the selector's operating point is fitted under the campaign's own costs above, not refitted here)")
    return out


def _verdict(b: Band) -> str:
    how = "faster than" if b.lo > 1 else "slower than" if b.hi < 1 else "not distinguishable from"
    return f"{how} the primary alone"


def _live_line(r: BreakevenReport) -> list[str]:
    if r.live and "unavailable" in r.live:
        return [f"best-of-N decoded live: not evaluated ({r.live['unavailable']})"]
    sp = (r.live or {}).get("speedup_over_primary")
    if sp is None:
        return []
    lo, hi = sp["measured_ci"]
    verdict = "faster than" if lo > 1 else "slower than" if hi < 1 else "not distinguishable from"
    pred = "n/a" if sp["predicted"] is None or not math.isfinite(sp["predicted"]) else f"{sp['predicted']:.3f}"
    return [
        f"best-of-N decoded live ({r.live['n_prompts']} prompts of the live phase, against "
        f"{sp['primary']} on the same prompts): speedup {sp['measured']:.3f} [{lo:.3f}, {hi:.3f}] "
        f"[MEASURED]: {verdict} the primary alone (timing model's prediction along best-of-N's own trajectory "
        f"{pred}; bandit/wallclock.py)"
    ]


def _selector_lines(r: BreakevenReport, model: str) -> list[str]:
    if not r.selector:
        return [
            "LOWO selector: undefined: it is evaluated leave-one-workload-out between drafters, and these "
            f"logs have {r.n_workloads} workload(s) and {len(r.drafters)} drafter(s) (it needs 2 of each)"
        ]
    s = r.selector
    sp = s["selector_speedup"]
    return [
        f"LOWO selector (primary by its rule, alternatives and threshold chosen inside each fold by {model}): "
        f"token gain {s['selector_token_gain'].fmt(pct=True)}, redraft rate "
        f"{s['selector_redraft_rate'].fmt()}, speedup {sp.fmt()}: {_verdict(sp)} [MODEL]"
    ]


def _timing_lines(r: BreakevenReport) -> list[str]:
    """The verdicts under the live phase's timing model: every block priced by its passes, verified tokens and
    drafter calls, summed over the block set (prefill included), against the primary alone on the same blocks."""
    m, K = r.timing, r.K
    out = [
        f"## under the timing model fitted on the live phase [{TIMING_LABEL}]: speedup over the primary alone",
        "every speedup in this section comes from the timing model fitted on the live phase (bandit/timingmodel.py), "
        "applied to the logs' blocks; it is the cost model of these verdicts",
        m.describe(),
        f"best-of-N ({K} alternatives, R = 1, one forward verifying all {K + 1} drafts): token gain "
        f"{r.bon_gain.fmt(pct=True)}; speedup {r.timed['best_of_n'].fmt()}: {_verdict(r.timed['best_of_n'])}",
        *_live_line(r),
    ]
    for d, g in r.single_gain.items():
        j = r.drafters.index(d)
        sp, be = r.timed[d], r.timed[f"breakeven_call_ms[{d}]"]
        out.append(
            f"always re-draft with {d} (R = 1): token gain {g.fmt(pct=True)}; speedup {sp.fmt()}: {_verdict(sp)}; "
            f"break-even call time (ms) {be.fmt(nd=3)} (measured {m.call_ms[j]:.3f} ms)"
        )
    return out + _selector_lines(r, "the timing model") + (["", *r.checks] if r.checks else [])


def _rho_alpha_lines(r: BreakevenReport, tag: str, what_if_only: bool) -> list[str]:
    c, K = r.costs, r.K
    p = r.drafters.index(r.primary)
    src = "measured costs" if c.source == "measured" else "what-if costs"
    head = (
        "## the rho/alpha cost model (the what-if for users without timings; its error against the live phase is "
        "above): speedup over the primary alone, and the alpha charged [MODEL]"
        if what_if_only
        else f"## under the {src}: speedup over the primary alone, and the alpha charged"
    )
    out = [head, c.describe() + (f" [{tag}]" if c.source == "measured" else " [what-if]")]
    out.append(
        f"best-of-N ({K} alternatives, R = 1): token gain {r.bon_gain.fmt(pct=True)}; union verification of "
        f"{K + 1} drafts alpha {c.alpha(K):.3f}: speedup {r.bon_speedup().fmt()}"
    )
    if not what_if_only:
        out += _live_line(r)
    for d, g in r.single_gain.items():
        j = r.drafters.index(d)
        f = lambda x: c.speedup(p, [j], 1.0, x)
        band = Band(float(f(g.value)), float(f(g.lo)), float(f(g.hi)), "MODEL")
        out.append(
            f"always re-draft with {d} (R = 1): token gain {g.fmt(pct=True)}; alpha {c.alpha(1):.3f}, "
            f"rho {c.rho[j]:.3f}: speedup {band.fmt()}"
        )
    if what_if_only:
        return out + ["(the selector's operating point is fitted under the timing model above, not refitted here)"]
    return out + _selector_lines(r, "this cost model")


def render(r: BreakevenReport) -> str:
    tag = "unlabelled" if r.label == "UNLABELLED" else r.label
    c, K = r.costs, r.K
    timed = r.timing is not None
    lines = [
        "# break-even of re-drafting (cost model of docs/DESIGN.md: "
        + ("the timing model fitted on the live phase)" if timed else "rho/alpha)"),
        "inputs: " + ", ".join(f"{s.path} sha256:{s.sha256[:12]}" for s in r.sources),
        f"block set: {r.block_set}; primary {r.primary} (the {r.primary_rule}); CIs: {r.ci_how}",
        *r.notes,
        "",
    ]
    if timed:
        lines += [*_timing_lines(r), ""]
    lines += _rho_alpha_lines(r, tag, timed)
    if r.engine is not None:
        lines += ["", *engine_lines(r)]
    src = "measured costs" if c.source == "measured" else "what-if costs"
    lines += [
        "",
        "## what-if: every drafter at the same rho (speedup of best-of-N over the primary alone) [MODEL]",
        f"| rho | alpha 0 (free union) | alpha {c.alpha(K):.3f} (union of {K + 1}, {src}) | separate passes (alpha {K}) |",
        "|---|---|---|---|",
    ]
    for rho in TABLE_RHOS:
        cells = [r.bon_speedup(rho, a).fmt(nd=3) for a in (0.0, None, float(K))]
        lines.append(f"| {rho:.2f} | " + " | ".join(cells) + " |")
    g = r.bon_gain
    roots = [breakeven_rho(x, 1.0, K, 0.0) for x in (g.value, g.lo, g.hi)]
    if all(x is not None for x in roots):
        lines.append(
            f"best-of-N break-even rho at alpha 0: {roots[0]:.4f} [{roots[1]:.4f}, {roots[2]:.4f}] [MODEL] "
            "(it wins while every drafter costs less than this fraction of a verify pass)"
        )
    if timed:
        lines.append(
            f"the speedups labelled [MODEL] are models applied to the logs' token gains [{tag}]: the verdicts "
            f"use the timing model fitted on the live phase [{TIMING_LABEL}], the rho/alpha lines are the "
            "what-if; only a configuration decoded in the live phase has a measured speedup."
        )
    elif c.source != "measured":
        lines.append(f"{c.why}: the costs above are the what-if of docs/DESIGN.md; no wall-clock speedup is claimed.")
    else:
        lines.append(
            f"the speedups labelled [MODEL] are the cost model applied to the logs' token gains [{tag}] and "
            "the manifest's costs, not wall-clock measurements; only a configuration decoded in the live "
            "phase has a measured speedup."
        )
    return "\n".join(lines) + "\n"


def plot(r: BreakevenReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = np.linspace(0.0, 0.4, 81)
    rows = ["alpha,rho,best_of_n,best_of_n_lo,best_of_n_hi"]  # the plotted curves, as data
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, a) in enumerate((("alpha 0", 0.0), (f"alpha {r.costs.alpha(r.K):.2f} (union)", None))):
        bands = [r.bon_speedup(x, a) for x in rho]
        v, lo, hi = (np.array([getattr(b, k) for b in bands]) for k in ("value", "lo", "hi"))
        al = 0.0 if a is not None else r.costs.alpha(r.K)
        cell = lambda z: f"{z:.6f}" if np.isfinite(z) else ""
        rows += [f"{al:.6g},{x:.3f},{y:.6f},{cell(l)},{cell(h)}" for x, y, l, h in zip(rho, v, lo, hi)]
        ax.plot(rho, v, color=f"C{i}", label=f"best-of-N, {name}")
        ax.fill_between(rho, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("rho = drafter cost / target verify cost (every drafter)")
    ax.set_ylabel("speedup over the primary alone [MODEL]")
    ax.set_title(f"best-of-N break-even, 95% CI [MODEL from {r.label.lower()} token gains]")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    path.with_suffix(".csv").write_text("\n".join(rows) + "\n")


def cli(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories")] = None,
    gain: Annotated[Optional[float], typer.Option(help="what-if: token gain as a fraction (0.081)")] = None,
    redraft: Annotated[
        Optional[float], typer.Option(min=0.0, max=1.0, help="what-if: redraft rate R in [0, 1]")
    ] = None,
    alternatives: Annotated[int, typer.Option(min=1, help="what-if: alternatives re-drafted (K)")] = 1,
    rho: Annotated[str, typer.Option(help="what-if: comma-separated drafter costs")] = "0.02,0.05,0.1,0.15,0.2",
    alpha: Annotated[float, typer.Option(help="what-if: extra target cost of a re-draft")] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="what-if: print one JSON object")] = False,
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="report file (default: <run dir>/breakeven.txt beside the one run read; none for several runs pooled)"
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples for the token gains")] = 2000,
    refit_resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples for the selector refits")] = 200,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    engine_timing: Annotated[
        Optional[Path],
        typer.Option(
            help="a production engine's timing in the manifest's form with its 'engine' named (e.g. "
            "bench/vllm_timing.json from bench/vllm_crosscheck.py): the verdicts also under its costs"
        ),
    ] = None,
) -> None:
    """Wall-clock break-even of re-drafting (docs/DESIGN.md cost model), every number with a 95% CI.

    What-if mode (--gain G --redraft R [--alternatives K --rho a,b --alpha A] [--json]): prints speedup per rho and
    the break-even rho (null: no break-even on rho >= 0). Otherwise reads PATHS (default: the default campaign under
    runs/): best-of-N, each single alternative and the LOWO selector over the primary (the fastest fixed drafter
    measured live where the run has a live phase), under the timing model fitted on the live phase (else the
    manifest's rho/alpha costs, else the what-if), the rho/alpha model's error beside it, and an equal-rho table; with --out (or for the default campaign) writes the report and a plot.
    --engine-timing FILE adds best-of-N and each alternative under a production engine's measured costs.
    """
    progress.quiet(quiet)
    if gain is not None or redraft is not None:
        if gain is None or redraft is None:
            raise typer.BadParameter("what-if mode needs both --gain and --redraft")
        try:
            rhos = [float(x) for x in rho.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"--rho {rho!r}: expected comma-separated numbers, e.g. 0.02,0.05") from None
        if not rhos or not all(math.isfinite(r) and r >= 0 for r in rhos):
            raise typer.BadParameter(f"--rho {rho!r}: expected finite numbers >= 0")
        ans = whatif(gain, redraft, alternatives, rhos, alpha)
        if json_out:
            typer.echo(json.dumps(ans, sort_keys=True))
        else:
            for k, v in ans["speedup"].items():
                typer.echo(f"rho {k}: speedup {v:.4f} [MODEL]")
            regime = breakeven_regime(gain, redraft, alternatives, alpha)
            typer.echo(f"break-even rho: {ans['breakeven_rho']} ({regime}) [MODEL]")
        return
    typer.echo(main(paths or [], out, resamples, refit_resamples, seed, engine_timing), nl=False)


def _live_entry(t, seed: int) -> dict | None:
    """best-of-N's entry of the run's live phase, when the logs are one run that has one."""
    dirs = {Path(s.path).parent for s in t.sources}
    if len(dirs) != 1 or not (next(iter(dirs)) / livelog.LIVE_FILE).is_file() or not t.dense:
        return None
    run = next(iter(dirs))
    try:
        res = wallclock.evaluate(t, livelog.read_live(run), seed=seed, live_path=run / livelog.LIVE_FILE)
    except InputError as e:  # the live phase cannot be evaluated: said, and the rest of the report stands
        return {"unavailable": str(e)}
    return next((e for e in res.entries if e["config"] == "best_of_n"), None)


def main(
    paths: Sequence[Path] = (),
    out: Path | None = None,
    n_resamples: int = 2000,
    n_refit: int = 200,
    seed: int = 0,
    engine_timing: Path | None = None,
) -> str:
    said = ""
    if not paths:
        paths, said = default_inputs()
    out = output_path(paths, "breakeven.txt", out)
    t = attach(load_logs(paths), run_dir(paths))
    r = report_from_table(t, n_resamples, n_refit, seed)
    r = dataclasses.replace(r, live=_live_entry(t, seed))
    if engine_timing is not None:
        m = t.manifests[0] if t.manifests else None
        r = dataclasses.replace(r, engine=engine_costs(t.drafters, m, read_engine_timing(engine_timing)))
    text = render(r)
    tail = ""
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        plot(r, out.with_suffix(".png"))
        tail = f"wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.csv')}\n"
    return (said + "\n" if said else "") + text + tail


if __name__ == "__main__":
    from bandit.errors import run

    run(cli)
