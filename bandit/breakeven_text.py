"""The break-even report's text and plot (bandit/breakeven.py computes the report; this module says it).

Every number keeps its label: [MEASURED] / [SIM] token gains, [MODEL] speedups under the timing model fitted on the
live phase or the rho/alpha cost model (docs/DESIGN.md), and a production engine's measured costs where given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bandit.logs import outputs
from bandit.stats.costmodel import TABLE_RHOS, breakeven_rho
from bandit.live.timingmodel import LABEL as TIMING_LABEL


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


def engine_lines(r) -> list[str]:
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


def _live_line(r) -> list[str]:
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


def _selector_lines(r, model: str) -> list[str]:
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


def _timing_lines(r) -> list[str]:
    """The verdicts under the live phase's timing model: every block priced by its passes, verified tokens and
    drafter calls, summed over the block set (prefill included), against the primary alone on the same blocks."""
    m, K = r.timing, r.K
    out = [
        f"## under the timing model fitted on the live phase [{TIMING_LABEL}]: speedup over the primary alone",
        "every speedup in this section comes from the timing model fitted on the live phase (bandit/live/timingmodel.py), "
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


def _rho_alpha_lines(r, tag: str, what_if_only: bool) -> list[str]:
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


def render(r) -> str:
    tag = "unlabelled" if r.label == "UNLABELLED" else r.label
    c, K = r.costs, r.K
    timed = r.timing is not None
    lines = [
        *([outputs.HEADER + r.command] if r.command else []),
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


def plot_files(r, command: str) -> tuple[str, bytes]:
    """breakeven.csv's text (the plotted curves, as data) and breakeven.png's bytes (its command recorded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = np.linspace(0.0, 0.4, 81)
    rows = ["alpha,rho,best_of_n,best_of_n_lo,best_of_n_hi"]
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
    data = outputs.png(fig, command)
    plt.close(fig)
    return "\n".join(rows) + "\n", data
