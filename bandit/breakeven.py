"""From the token proxy to wall clock: the cost model of DESIGN.md and its break-even condition.

Costs are in units of one target verification pass. The baseline (primary drafter only) pays
`c0 = 1 + rho_p` per block; the selector pays `c = 1 + rho_p + R * (sum_{d in A} rho_d + alpha)`,
where R is its re-draft rate and alpha the extra target cost a re-draft charges (0 with
union/tree verification, 1 with a separate second verification). Speedup = (1 + g) * c0 / c,
g the token gain per block (bonus token included). Best-of-N is the selector with R = 1.

    python bandit/breakeven.py [PATHS...]       # from logs -> runs/breakeven.txt + runs/breakeven.png
    specbandit breakeven --gain 0.081 --redraft 0.43 --alternatives 1 --rho 0.02,0.05,0.1 --alpha 0 --json
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/breakeven.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer

REF_RHO = 0.10                      # the selector's default threshold criterion is speedup at this rho...
REF_ALPHA = 0.0                     # ...with union verification
TABLE_RHOS = (0.02, 0.05, 0.10, 0.15, 0.20)
PLOT_ALPHAS = (0.0, 0.25)


def speedup(gain, redraft_rate, rho_p, rho_alts: Sequence[float] | float, alpha):
    """Speedup of the selector over the primary alone (DESIGN.md); broadcasts over numpy arrays.

    rho_alts: the alternatives' rho (a sequence; or one float meaning a single alternative).
    """
    alts = np.sum(np.asarray(rho_alts, float), axis=-1) if np.ndim(rho_alts) else rho_alts
    c0 = 1.0 + np.asarray(rho_p, float)
    c = c0 + np.asarray(redraft_rate, float) * (alts + np.asarray(alpha, float))
    out = (1.0 + np.asarray(gain, float)) * c0 / c
    return float(out) if np.ndim(out) == 0 else out


def speedup_equal(gain, redraft_rate, n_alternatives: int, rho, alpha):
    """What-if form: every drafter costs the same rho, K alternatives: c = 1 + rho + R (K rho + alpha)."""
    rho = np.asarray(rho, float)
    out = (1.0 + gain) * (1.0 + rho) / (1.0 + rho + redraft_rate * (n_alternatives * rho + alpha))
    return float(out) if out.ndim == 0 else out


def breakeven_rho(gain: float, redraft_rate: float, n_alternatives: int, alpha: float) -> float | None:
    """The rho at which speedup_equal = 1, or None when no rho >= 0 separates winning from losing.

    speedup > 1  <=>  f(rho) = g (1 + rho) - R (K rho + alpha) > 0, linear in rho:
    root rho* = (g - R alpha) / (R K - g). Returns rho* when it is >= 0 (the selector wins below it
    when f(0) > 0, above it otherwise); None when the sign of f never changes on rho >= 0: "never"
    if f(0) <= 0 (loses at every drafter cost), "always" otherwise; `breakeven_regime` says which.
    """
    slope = gain - redraft_rate * n_alternatives
    f0 = gain - redraft_rate * alpha
    if slope == 0.0:
        return None
    root = -f0 / slope
    return float(root) if root >= 0.0 and not (f0 == 0.0 and slope < 0) else None


def breakeven_regime(gain: float, redraft_rate: float, n_alternatives: int, alpha: float) -> str:
    """'below' (wins for rho < rho*), 'above' (wins for rho > rho*), 'never' or 'always' (on rho >= 0)."""
    root = breakeven_rho(gain, redraft_rate, n_alternatives, alpha)
    f0 = gain - redraft_rate * alpha
    if root is None:
        return "always" if f0 > 0 else "never"
    return "below" if gain - redraft_rate * n_alternatives < 0 else "above"


def whatif(gain: float, redraft_rate: float, n_alternatives: int, rhos: Sequence[float], alpha: float) -> dict:
    """The what-if answer: {"speedup": {rho: value}, "breakeven_rho": value or None}."""
    return {"speedup": {_fmt_rho(r): round(speedup_equal(gain, redraft_rate, n_alternatives, r, alpha), 6) for r in rhos},
            "breakeven_rho": _round(breakeven_rho(gain, redraft_rate, n_alternatives, alpha))}


def _fmt_rho(r: float) -> str:
    return f"{r:g}"


def _round(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


# ---------------------------------------------------------------- measured rho and alpha

def rho_alpha_from_manifest(manifest: dict | None) -> tuple[dict[str, float], float] | None:
    """(rho per drafter, alpha of union verification) from a manifest's `timing`, or None if unmeasured.

    rho_d = drafter_ms[d] / verify_ms(k + 1); alpha = verify_batch_ms(2) / verify_batch_ms(1) - 1
    (docs/manifest.md); both curves are interpolated linearly between their measured points.
    """
    timing = (manifest or {}).get("timing")
    if not timing:
        return None
    where = f"manifest {manifest.get('run', '?')}: timing"
    try:
        k = int(manifest["k"])
        v = timing["verify_ms"]
        verify = float(np.interp(k + 1, np.asarray(v["tokens"], float), np.asarray(v["ms"], float)))
        b = timing["verify_batch_ms"]
        nb, mb = np.asarray(b["drafts"], float), np.asarray(b["ms"], float)
        alpha = float(np.interp(2, nb, mb) / np.interp(1, nb, mb) - 1.0)
        rho = {str(d): float(ms) / verify for d, ms in timing["drafter_ms"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: incomplete or malformed ({type(e).__name__}: {e}); see docs/manifest.md") from None
    if verify <= 0 or not all(math.isfinite(r) and r >= 0 for r in rho.values()):
        raise ValueError(f"{where}: verify_ms must be > 0 and drafter_ms >= 0")
    return rho, max(alpha, 0.0)


# ---------------------------------------------------------------- from logs

@dataclass(frozen=True)
class BreakevenReport:
    """The break-even analysis of one campaign's logs (selector operating point from LOWO)."""
    label: str                   # label of the token numbers (MEASURED / SIM / UNLABELLED)
    primary: str
    alternatives: tuple[str, ...]
    gain: float                  # LOWO selector token gain g
    redraft_rate: float          # LOWO selector R
    bon_gain: float              # best-of-N token gain (R = 1)
    frontier_R: np.ndarray       # (T,) redraft rate over the out-of-fold threshold sweep
    frontier_g: np.ndarray       # (T,) token gain at each threshold
    measured: tuple[dict[str, float], float] | None  # (rho per drafter, alpha_union) when timed
    sources: tuple = ()

    @property
    def K(self) -> int:
        return len(self.alternatives)

    def best_selector(self, rho: float, alpha: float) -> float:
        """Best speedup over the frontier (max over thresholds, best-of-N included) at equal rho."""
        s = speedup_equal(self.frontier_g, self.frontier_R, self.K, rho, alpha)
        return float(max(np.max(s), 1.0))


def report_from_table(t, criterion: str = "speedup", seed: int = 0) -> BreakevenReport:
    from bandit import selector
    res = selector.lowo(t, criterion=criterion, random_state=seed)
    R, C, g = selector.frontier(res)
    m = next((rho_alpha_from_manifest(x) for x in t.manifests if x.get("timing")), None)
    return BreakevenReport(label=t.label, primary=res.primary, alternatives=res.alternatives,
                           gain=res.pooled.token_gain, redraft_rate=res.pooled.redraft_rate,
                           bon_gain=float(g[0]) if R[0] == 1.0 else res.bon_gain, frontier_R=R, frontier_g=g,
                           measured=m, sources=t.sources)


def render(r: BreakevenReport) -> str:
    tag = "unlabelled" if r.label == "UNLABELLED" else r.label
    lines = [f"# break-even of the per-block selector (cost model of DESIGN.md)",
             f"inputs: " + ", ".join(f"{s.path} sha256:{s.sha256[:12]}" for s in r.sources),
             f"primary {r.primary}; alternatives {', '.join(r.alternatives)} (K = {r.K})",
             f"selector (LOWO, nested threshold): token gain g = {r.gain:+.4f}, redraft rate R = {r.redraft_rate:.4f} [{tag}]",
             f"best-of-N (R = 1): token gain = {r.bon_gain:+.4f} [{tag}]", ""]
    for alpha in (0.0, 0.25, 1.0):
        if r.redraft_rate == 0:
            lines.append(f"alpha = {alpha:.2f}: the selector re-drafts no block (its thresholds, chosen on training "
                         "workloads, exceed every held-out score): it is the primary alone [MODEL]")
            continue
        be = breakeven_rho(r.gain, r.redraft_rate, r.K, alpha)
        regime = breakeven_regime(r.gain, r.redraft_rate, r.K, alpha)
        say = {"below": f"wins while rho < {be or 0:.4f}", "above": f"wins only while rho > {be or 0:.4f}",
               "never": "never wins, at any drafter cost", "always": "wins at every drafter cost"}[regime]
        lines.append(f"alpha = {alpha:.2f}: selector {say} [MODEL]")
    lines += ["", "does selection beat always re-drafting? (equal rho for every drafter, alpha 0) [MODEL]",
              "| rho | best-of-N | best selector | selector margin |", "|---|---|---|---|"]
    for rho in TABLE_RHOS:
        bon = speedup_equal(r.bon_gain, 1.0, r.K, rho, 0.0)
        sel = r.best_selector(rho, 0.0)
        lines.append(f"| {rho:.2f} | {bon:.3f} | {sel:.3f} | {100 * (sel / bon - 1):+.1f}% |")
    lines.append("best selector: the best threshold in hindsight over the out-of-fold frontier (R = 0, the primary "
                 "alone, included), an upper bound for any threshold rule on these scores")
    lines.append("")
    if r.measured is None:
        lines.append("rho was not measured (no `timing` in the manifest): the condition above is the claim [MODEL]; "
                     "no wall-clock speedup is claimed.")
    else:
        rho, alpha_u = r.measured
        src = {"MEASURED": "measured", "SIM": "simulated"}.get(r.label, "unlabelled")
        missing = [d for d in (r.primary, *r.alternatives) if d not in rho]
        if missing:
            lines.append(f"timing present but lacks drafters {', '.join(missing)}: rho was not measured for them [MODEL]")
        else:
            rp, ra = rho[r.primary], [rho[a] for a in r.alternatives]
            lines.append(f"rho from the manifest's {src} timing: " + ", ".join(f"{d} {rho[d]:.4f}" for d in (r.primary, *r.alternatives))
                         + f"; alpha (union verification) {alpha_u:.4f} [{tag}]")
            for name, a in (("union verification", alpha_u), ("separate verification", 1.0)):
                s_sel = speedup(r.gain, r.redraft_rate, rp, ra, a)
                s_bon = speedup(r.bon_gain, 1.0, rp, ra, a)
                verdict = "faster" if s_sel > 1 else "slower" if s_sel < 1 else "no faster, no slower"
                lines.append(f"{src} wall-clock verdict, {name} (alpha {a:.3f}): selector {s_sel:.3f}x ({verdict} than the "
                             f"primary alone), best-of-N {s_bon:.3f}x [{tag}]")
    return "\n".join(lines) + "\n"


def plot(r: BreakevenReport, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rho = np.linspace(0.0, 0.4, 81)
    rows = ["alpha,rho,best_of_n,selector"]   # the plotted curves, as data
    for alpha in PLOT_ALPHAS:
        bon = speedup_equal(r.bon_gain, 1.0, r.K, rho, alpha)
        sel = speedup_equal(r.gain, r.redraft_rate, r.K, rho, alpha)
        rows += [f"{alpha:g},{x:.3f},{b:.6f},{s:.6f}" for x, b, s in zip(rho, bon, sel)]
    path.with_suffix(".csv").write_text("\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for alpha, ls in zip(PLOT_ALPHAS, ("-", "--")):
        ax.plot(rho, speedup_equal(r.bon_gain, 1.0, r.K, rho, alpha), ls=ls, color="C0", label=f"best-of-N, alpha {alpha}")
        ax.plot(rho, speedup_equal(r.gain, r.redraft_rate, r.K, rho, alpha), ls=ls, color="C1",
                label=f"selector (LOWO), alpha {alpha}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("rho = drafter cost / target verify cost")
    ax.set_ylabel("speedup over the primary alone [MODEL]")
    ax.set_title(f"break-even [MODEL from {r.label.lower()} token gains]")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def cli(paths: Annotated[Optional[list[Path]], typer.Argument()] = None, gain: Optional[float] = None,
        redraft: Optional[float] = None, alternatives: int = 1, rho: str = "0.02,0.05,0.1,0.15,0.2", alpha: float = 0.0,
        json_out: Annotated[bool, typer.Option("--json")] = False,
        out: Path = Path("runs/breakeven.txt"), criterion: str = "speedup", seed: int = 0) -> None:
    """Wall-clock break-even of selective re-drafting (DESIGN.md cost model).

    What-if mode (--gain G --redraft R [--alternatives K --rho a,b --alpha A] [--json]): G is the token gain as a
    fraction (0.081), R the redraft rate, K the number of alternatives re-drafted; prints speedup per rho and the
    break-even rho (null: no break-even on rho >= 0, see breakeven_regime). Otherwise reads PATHS (default: the
    default campaign under runs/), writes OUT and a speedup-vs-rho plot next to it.
    """
    if gain is not None or redraft is not None:
        if gain is None or redraft is None:
            raise typer.BadParameter("what-if mode needs both --gain and --redraft")
        rhos = [float(x) for x in rho.split(",") if x.strip()]
        ans = whatif(gain, redraft, alternatives, rhos, alpha)
        if json_out:
            typer.echo(json.dumps(ans, sort_keys=True))
        else:
            for k, v in ans["speedup"].items():
                typer.echo(f"rho {k}: speedup {v:.4f} [MODEL]")
            regime = breakeven_regime(gain, redraft, alternatives, alpha)
            typer.echo(f"break-even rho: {ans['breakeven_rho']} ({regime}) [MODEL]")
        return
    typer.echo(main(paths or [], out, criterion, seed), nl=False)


def main(paths: Sequence[Path] = (), out: Path = Path("runs/breakeven.txt"), criterion: str = "speedup", seed: int = 0) -> str:
    from bandit.logs import default_inputs, load_logs
    said = ""
    if not paths:
        paths, said = default_inputs()
    t = load_logs(paths)
    r = report_from_table(t, criterion, seed)
    text = render(r)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    plot(r, out.with_suffix(".png"))
    return (said + "\n" if said else "") + text + f"wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.csv')}\n"


if __name__ == "__main__":
    import sys
    print(main([Path(p) for p in sys.argv[1:]]), end="")
