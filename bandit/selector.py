"""The per-block selector: re-draft or not, from the primary draft's own confidence.

Primary p = best fixed drafter (highest pooled mean accepted), alternatives A = the others
(or `--alternatives`). A score of the primary draft's features (conf_mean, conf_min,
conf_first, ent_mean) decides r(b) = score >= threshold; outcome a_sel = max over {p} U A when
r = 1, else a_p. Scores: `logistic` (scikit-learn LogisticRegression on the standardised
features, label = some alternative accepts more than the primary), and the training-free
stopping rules of prior work, `conf_min` (re-draft when conf_min is low) and `ent_mean`
(re-draft when the mean entropy is high).

LOWO: each workload is held out in turn; `NestedSelector.fit` sees the training workloads
only, fits the score there and picks the threshold by an inner leave-one-workload-out loop
over those same workloads (criterion: modelled speedup at rho 0.10, alpha 0 by default;
`skill` = capture / redraft rate; `net` = capture - redraft rate). The held-out rows reach
only `predict`, so no path leads from test data to the threshold.

    python bandit/selector.py [PATHS...]    # LOWO table + runs/selector_frontier.{png,csv}
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/selector.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Optional, Sequence

import numpy as np
import sklearn
import typer
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from bandit.breakeven import REF_ALPHA, REF_RHO, breakeven_regime, breakeven_rho, speedup_equal
from bandit.logs import FEATURES, BlockTable

SCORES = ("logistic", "conf_min", "ent_mean")
CRITERIA = ("speedup", "skill", "net")
LEVELS = np.round(np.linspace(0.02, 0.98, 49), 2)  # probability thresholds (logistic), quantile levels (baselines)
STAT_NAMES = ("breakeven_rho", "selector_capture", "selector_redraft_rate", "selector_skill", "token_gain")


# ---------------------------------------------------------------- outcomes of a decision rule

@dataclass(frozen=True)
class Outcome:
    """What re-drafting on a set of blocks achieves (weighted means over blocks)."""
    capture: float       # C = (mean a_sel - mean a_p) / (mean a_best - mean a_p)
    redraft_rate: float  # R = mean r
    skill: float         # C / R; 1.0 = re-drafting at random
    token_gain: float    # g = mean (a_sel + 1) / mean (a_p + 1) - 1

    @property
    def net(self) -> float:
        return self.capture - self.redraft_rate


def curve(scores: np.ndarray, thresholds: np.ndarray, a_p: np.ndarray, a_best: np.ndarray,
          w: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Capture, redraft rate, skill, token gain (each (T,)) of `scores >= threshold` for every threshold."""
    w = np.ones(scores.size) if w is None else w
    r = (scores[None, :] >= np.asarray(thresholds, float)[:, None]).astype(float)   # (T, B)
    up = w * (a_best - a_p)
    with np.errstate(invalid="ignore", divide="ignore"):
        R = r @ w / w.sum()
        C = r @ up / up.sum()
        return {"capture": C, "redraft_rate": R, "skill": C / R, "token_gain": (r @ up) / (w @ (a_p + 1.0))}


def outcome(r: np.ndarray, a_p: np.ndarray, a_best: np.ndarray, w: np.ndarray | None = None) -> Outcome:
    c = curve(r.astype(float), np.array([0.5]), a_p, a_best, w)
    return Outcome(*(float(c[k][0]) for k in ("capture", "redraft_rate", "skill", "token_gain")))


def criterion_value(c: dict[str, np.ndarray], criterion: str, n_alternatives: int,
                    rho: float = REF_RHO, alpha: float = REF_ALPHA) -> np.ndarray:
    """(T,) the value each threshold is chosen by (higher is better; NaN never wins)."""
    if criterion == "speedup":
        v = speedup_equal(c["token_gain"], c["redraft_rate"], n_alternatives, rho, alpha)
    elif criterion == "skill":
        v = c["skill"]
    elif criterion == "net":
        v = c["capture"] - c["redraft_rate"]
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    return np.where(np.isfinite(v), v, -np.inf)


# ---------------------------------------------------------------- the estimator

class NestedSelector:
    """Score + threshold, both fitted on training workloads only (scikit-learn style).

    fit(X (n,4), a_p (n,), a_best (n,), groups (n,) workload, sample_weight (n,)) fits the score
    on all rows and picks `threshold_` by an inner leave-one-group-out loop over `groups`
    (with a single group the threshold is chosen in-sample on it). predict(X) -> (n,) bool re-draft.
    """

    def __init__(self, score: str = "logistic", criterion: str = "speedup", n_alternatives: int = 1,
                 rho: float = REF_RHO, alpha: float = REF_ALPHA, C: float = 1.0, random_state: int = 0,
                 fit_memo: dict | None = None):
        self.score, self.criterion, self.n_alternatives = score, criterion, n_alternatives
        self.rho, self.alpha, self.C, self.random_state = rho, alpha, C, random_state
        self.fit_memo = fit_memo  # shared by the folds of one LOWO: a fit is keyed by the training groups it saw

    def _fit_score(self, X, y, w, groups):
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {self.score!r}")
        if self.score != "logistic":
            return None
        key = tuple(np.unique(groups[w > 0]).tolist())
        if self.fit_memo is not None and key in self.fit_memo:
            return self.fit_memo[key]
        model = self._fit_logistic(X, y, w)
        if self.fit_memo is not None:
            self.fit_memo[key] = model
        return model

    def _fit_logistic(self, X, y, w):
        keep = w > 0
        X, y, w = X[keep], y[keep], w[keep]
        classes = np.unique(y[w > 0])
        if classes.size < 2:   # nothing to separate: a constant score equal to the only class
            return float(classes[0]) if classes.size else 0.0
        m = Pipeline([("scale", StandardScaler()),
                      ("lr", LogisticRegression(C=self.C, solver="newton-cholesky", random_state=self.random_state))])
        with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
            m.fit(X, y, scale__sample_weight=w, lr__sample_weight=w)
        sc, lr = m.named_steps["scale"], m.named_steps["lr"]
        # the fitted pipeline as (mean, scale, coef, intercept): scoring by hand skips sklearn's per-call validation
        return m, sc.mean_, sc.scale_, lr.coef_[0], float(lr.intercept_[0])

    def _score(self, model, X) -> np.ndarray:
        if self.score == "conf_min":
            return -X[:, FEATURES.index("conf_min")]   # low confidence -> re-draft
        if self.score == "ent_mean":
            return X[:, FEATURES.index("ent_mean")]
        if isinstance(model, float):
            return np.full(X.shape[0], model)
        _, mean, scale, coef, icpt = model
        return expit((X - mean) / scale @ coef + icpt)

    def _grid(self, scores: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.score == "logistic":
            return LEVELS.astype(float)
        o = np.argsort(scores, kind="stable")          # weighted quantiles of the training scores
        cw = np.cumsum(w[o]) / w.sum()
        return np.unique(scores[o][np.minimum(np.searchsorted(cw, LEVELS), o.size - 1)])

    def fit(self, X, a_p, a_best, groups, sample_weight=None) -> "NestedSelector":
        X, a_p, a_best, groups = np.asarray(X, float), np.asarray(a_p, float), np.asarray(a_best, float), np.asarray(groups)
        w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, float)
        y = (a_best > a_p).astype(int)
        self.model_ = self._fit_score(X, y, w, groups)
        gs = np.unique(groups[w > 0])
        oof = self._score(self.model_, X)
        if gs.size >= 2:
            for g in gs:
                tr, te = (groups != g) & (w > 0), groups == g
                oof[te] = self._score(self._fit_score(X[tr], y[tr], w[tr], groups[tr]), X[te])
        grid = self._grid(oof, w)
        self.inner_curve_ = curve(oof, grid, a_p, a_best, w)
        crit = criterion_value(self.inner_curve_, self.criterion, self.n_alternatives, self.rho, self.alpha)
        self.thresholds_ = grid
        self.threshold_ = float(grid[int(np.argmax(crit))])
        self.inner_groups_ = gs
        return self

    def decision_function(self, X) -> np.ndarray:
        return self._score(self.model_, np.asarray(X, float))

    def predict(self, X) -> np.ndarray:
        return self.decision_function(X) >= self.threshold_

    def threshold_text(self) -> str:
        if self.score == "conf_min":
            return f"conf_min<={-self.threshold_:.3f}"
        if self.score == "ent_mean":
            return f"ent_mean>={self.threshold_:.3f}"
        return f"{self.threshold_:.2f}"


# ---------------------------------------------------------------- LOWO on arrays

@dataclass(frozen=True)
class SelectorData:
    """The selector's view of the block starts for one primary. B blocks."""
    X: np.ndarray          # (B, 4) primary draft features
    a_p: np.ndarray        # (B,) primary accepted
    a_best: np.ndarray     # (B,) max over {p} U A
    workload: np.ndarray   # (B,) int
    primary: str
    alternatives: tuple[str, ...]


def selector_data(b: BlockTable, alternatives: Sequence[str] | None = None, w: np.ndarray | None = None) -> SelectorData:
    """Primary = the best fixed drafter under weights w (remade per bootstrap resample)."""
    w = np.ones(b.n_records) if w is None else w
    p = int(np.argmax(w @ b.accepted.astype(float)))
    alts = [d for d in (alternatives or b.drafters) if d != b.drafters[p]]
    if not alts:
        raise ValueError(f"no alternative drafter left besides the primary {b.drafters[p]}")
    j = [b.drafters.index(d) for d in alts]
    a = b.accepted.astype(float)
    return SelectorData(X=b.features[:, p, :], a_p=a[:, p], a_best=np.maximum(a[:, p], a[:, j].max(1)),
                        workload=b.workload, primary=b.drafters[p], alternatives=tuple(alts))


def lowo_arrays(s: SelectorData, w: np.ndarray, score: str, criterion: str, random_state: int = 0
                ) -> tuple[np.ndarray, np.ndarray, dict[int, NestedSelector]]:
    """Out-of-fold (scores (B,), re-draft decisions (B,) bool, fitted estimator per held-out workload)."""
    scores, redraft, fits, memo = np.zeros(s.a_p.size), np.zeros(s.a_p.size, bool), {}, {}
    for g in np.unique(s.workload[w > 0]):
        tr = (s.workload != g) & (w > 0)
        te = s.workload == g
        est = NestedSelector(score, criterion, len(s.alternatives), random_state=random_state, fit_memo=memo)
        est.fit(s.X[tr], s.a_p[tr], s.a_best[tr], s.workload[tr], w[tr])   # the held-out rows are not passed
        scores[te], redraft[te], fits[int(g)] = est.decision_function(s.X[te]), est.predict(s.X[te]), est
    return scores, redraft, fits


def nested_stat(b: BlockTable, score: str = "logistic", criterion: str = "speedup",
                alternatives: Sequence[str] | None = None, random_state: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """stat(weights (B,)) -> STAT_NAMES then skill per workload, everything refitted under the weights."""
    W = len(b.workloads)

    def stat(w: np.ndarray) -> np.ndarray:
        s = selector_data(b, alternatives, w)
        _, r, _ = lowo_arrays(s, w, score, criterion, random_state)
        o = outcome(r, s.a_p, s.a_best, w)
        be = breakeven_rho(o.token_gain, o.redraft_rate, len(s.alternatives), 0.0)
        if be is None:  # no root on rho >= 0: 0 if it never wins, inf if it always does
            be = np.inf if breakeven_regime(o.token_gain, o.redraft_rate, len(s.alternatives), 0.0) == "always" else 0.0
        per = [outcome(r, s.a_p, s.a_best, w * (s.workload == g)).skill for g in range(W)]
        return np.array([be, o.capture, o.redraft_rate, o.skill, o.token_gain, *per])
    return stat


# ---------------------------------------------------------------- LOWO on a table, with CIs

@dataclass(frozen=True)
class Fold:
    workload: str
    threshold: str       # chosen by the inner LOWO over the other workloads
    outcome: Outcome
    skill_ci: tuple[float, float] | None

    @property
    def verdict(self) -> str:
        return "never re-drafts" if self.outcome.redraft_rate == 0 else verdict(self.skill_ci)


def verdict(ci: tuple[float, float] | None) -> str:
    if ci is None or not np.all(np.isfinite(ci)):
        return "no CI"
    return "beats random" if ci[0] > 1 else "worse than random" if ci[1] < 1 else "no measurable benefit"


@dataclass(frozen=True)
class LOWOResult:
    """LOWO evaluation of one score on one campaign (B block starts)."""
    score: str
    criterion: str
    label: str
    primary: str
    alternatives: tuple[str, ...]
    folds: tuple[Fold, ...]
    pooled: Outcome
    pooled_skill_ci: tuple[float, float] | None
    oof_score: np.ndarray   # (B,) out-of-fold score
    data: SelectorData
    ci_method: str = ""     # e.g. "percentile, prompt clusters, 200 resamples, seed 0"

    @property
    def bon_gain(self) -> float:
        return float((self.data.a_best - self.data.a_p).sum() / (self.data.a_p + 1).sum())


def lowo(t: BlockTable, score: str = "logistic", criterion: str = "speedup", alternatives: Sequence[str] | None = None,
         random_state: int = 0, n_resamples: int = 0, unit: str = "prompt", seed: int = 0,
         method: str = "percentile") -> LOWOResult:
    """LOWO over the workloads of t's block starts; with n_resamples > 0 skill CIs from the nested bootstrap."""
    b = t.blocks()
    if len(b.workloads) < 2:
        raise ValueError(f"LOWO needs at least two workloads; the logs have {list(b.workloads)}")
    w = np.ones(b.n_records)
    s = selector_data(b, alternatives, w)
    scores, r, fits = lowo_arrays(s, w, score, criterion, random_state)
    cis, pooled_ci, how = {}, None, ""
    if n_resamples > 0:
        from bandit import ci
        units, strata = ci._units(b, unit)
        value, boot, jack = ci.boot_weights(nested_stat(b, score, criterion, alternatives, random_state), units, strata,
                                            n_resamples, seed, jackknife=method == "bca")
        ivs = [ci.interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, unit, seed)
               for i in range(value.size)]
        pooled_ci = (ivs[3].lo, ivs[3].hi)
        cis = {g: (ivs[len(STAT_NAMES) + g].lo, ivs[len(STAT_NAMES) + g].hi) for g in range(len(b.workloads))}
        how = f"{method}, {unit} unit, {n_resamples} resamples, seed {seed}"
    folds = tuple(Fold(b.workloads[g], fits[g].threshold_text(), outcome(r, s.a_p, s.a_best, w * (s.workload == g)),
                       cis.get(g)) for g in sorted(fits))
    return LOWOResult(score, criterion, b.label, s.primary, s.alternatives, folds, outcome(r, s.a_p, s.a_best, w),
                      pooled_ci, scores, s, how)


def frontier(res: LOWOResult, n_points: int = 201) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Redraft rate, capture, token gain ((T,) each, R ascending to 1) over every threshold of the out-of-fold score."""
    d = res.data
    o = np.argsort(-res.oof_score, kind="stable")
    up = (d.a_best - d.a_p)[o]
    cut = np.r_[np.flatnonzero(np.diff(res.oof_score[o]) != 0), o.size - 1]   # a threshold between distinct scores
    cut = cut[np.unique(np.linspace(0, cut.size - 1, min(n_points, cut.size)).round().astype(int))]
    R = np.r_[0.0, (cut + 1) / o.size]
    C = np.r_[0.0, np.cumsum(up)[cut] / up.sum()]
    g = np.r_[0.0, np.cumsum(up)[cut] / (d.a_p + 1).sum()]
    return R, C, g


def render(results: Sequence[LOWOResult]) -> str:
    r0 = results[0]
    tag = "unlabelled" if r0.label == "UNLABELLED" else r0.label
    lines = [f"primary {r0.primary}; alternatives {', '.join(r0.alternatives)}; threshold criterion {r0.criterion} "
             f"(rho {REF_RHO}, alpha {REF_ALPHA}); CIs: {r0.ci_method or 'none'} [{tag}]",
             "| score | held-out | threshold (inner CV) | capture | redraft | skill | 95% CI | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for res in results:
        for f in res.folds:
            ci = "-" if f.skill_ci is None else f"[{f.skill_ci[0]:.2f}, {f.skill_ci[1]:.2f}]"
            o = f.outcome
            lines.append(f"| {res.score} | {f.workload} | {f.threshold} | {o.capture:.3f} | {o.redraft_rate:.3f} | "
                         f"{o.skill:.2f}x | {ci} | {f.verdict} |")
        o, ci = res.pooled, res.pooled_skill_ci
        cis = "-" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        lines.append(f"| {res.score} | pooled | - | {o.capture:.3f} | {o.redraft_rate:.3f} | {o.skill:.2f}x | {cis} | "
                     f"{verdict(ci)} |")
    lines.append(f"token gain of the logistic selector {results[0].pooled.token_gain:+.4f}, best-of-N "
                 f"{results[0].bon_gain:+.4f} [{tag}]")
    return "\n".join(lines) + "\n"


def write_frontier(results: Sequence[LOWOResult], out_dir: Path) -> tuple[Path, Path]:
    """runs/selector_frontier.csv (score, redraft_rate, capture, token_gain) and .png with the random diagonal."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, png = out_dir / "selector_frontier.csv", out_dir / "selector_frontier.png"
    rows = ["score,redraft_rate,capture,token_gain"]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8, label="random re-draft")
    for i, res in enumerate(results):
        R, C, g = frontier(res)
        rows += [f"{res.score},{a:.6f},{b:.6f},{c:.6f}" for a, b, c in zip(R, C, g)]
        ax.plot(R, C, color=f"C{i}", label=f"{res.score} (out-of-fold)")
        ax.plot(res.pooled.redraft_rate, res.pooled.capture, "o", color=f"C{i}")
    ax.set_xlabel("redraft rate R")
    ax.set_ylabel("capture C")
    ax.set_title(f"selector threshold frontier [{results[0].label}]")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120, metadata={"Software": None})
    plt.close(fig)
    csv.write_text("\n".join(rows) + "\n")
    return csv, png


def main(paths: Sequence[Path] = (), criterion: str = "speedup", alternatives: Sequence[str] | None = None,
         n_resamples: int = 200, unit: str = "prompt", seed: int = 0, out_dir: Path = Path("runs")) -> str:
    from bandit.logs import default_inputs, load_logs
    said = f"read: {', '.join(str(p) for p in paths)}"
    if not paths:
        paths, said = default_inputs()
        said = f"read: {said}"
    t = load_logs(paths)
    results = [lowo(t, s, criterion, alternatives, seed, n_resamples, unit, seed) for s in SCORES]
    csv, png = write_frontier(results, Path(out_dir))
    return f"{said}\n{t.summary()}\n" + render(results) + f"wrote {png} and {csv}\n"


def cli(paths: Annotated[Optional[list[Path]], typer.Argument()] = None, criterion: str = "speedup",
        alternatives: str = "", resamples: int = 200, unit: str = "prompt", seed: int = 0,
        out_dir: Path = Path("runs")) -> None:
    """Per-block selector: LOWO table (nested inner-LOWO threshold, skill CI, verdict) for the logistic model and the
    conf_min / ent_mean baselines, and the threshold frontier (OUT_DIR/selector_frontier.png and .csv).

    --criterion speedup (modelled at rho 0.10, alpha 0) | skill | net; --alternatives a,b (default: all but the primary);
    --resamples: nested bootstrap resamples for the skill CIs; --unit prompt|block.
    """
    if criterion not in CRITERIA:
        raise typer.BadParameter(f"--criterion must be one of {CRITERIA}")
    alts = [a for a in alternatives.split(",") if a] or None
    typer.echo(main(paths or [], criterion, alts, resamples, unit, seed, out_dir), nl=False)


if __name__ == "__main__":
    typer.run(cli)
