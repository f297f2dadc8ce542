"""The per-block selector's estimator: re-draft or not, from the primary draft's own confidence.

Judged by its ranking, deployed by measured costs (docs/DESIGN.md, "Selector"):

- A *score* of the primary draft ranks blocks by how likely an alternative beats it:
  `logistic` (an L2 logistic regression on the standardised conf_mean, conf_min, conf_first,
  ent_mean; label = some other drafter produces more tokens than the primary), and the
  training-free `conf_min` (low first), `ent_mean` (high first) and `draft_empty` (the primary
  proposed nothing).
- Headline: the area under the out-of-fold capture-vs-redraft frontier (0.5 = random ranking),
  per held-out workload and pooled. Capture is of the gap to the best of all drafters. Pooled, the
  logistic score (refitted per fold, so each fold's probabilities are on their own scale) enters by
  its weighted mid-rank within its fold (`fold_rank`); the training-free scores are one function
  of the draft in every fold and are pooled as they are.
- Operating point: inside each leave-one-workload-out fold, on the training workloads only,
  the primary (by the table's rule, `trajectory.rule_name`: the fastest fixed drafter measured on
  the training workloads' live prompts where a live phase is attached, else most tokens per target
  pass there), and by an inner leave-one-workload-out loop the alternatives set (each single other
  drafter, each pair, or all of them) and the threshold that maximise the modelled speedup: every
  block priced by the live phase's timing model where one is attached (bandit/live/timingmodel.py:
  prefill, passes, verified tokens of every draft verified, drafter calls), else by the rho/alpha
  model (bandit/stats/costmodel.py: the manifest's measured costs, else its documented what-if). The
  held-out workload then meets that rule unchanged. An operating point that never (or always)
  re-drafts is reported as such; skill = capture / redraft rate only where it re-drafts at all.

On dense logs every fold works on the block set of its primary (its own trajectory starts);
token counts are tau = accepted + 1 capped at the output's end. Refits are batched over
bootstrap resamples (bandit/stats/logistic.py), so `nested(t, counts)` evaluates all resamples at once.
The report (tables, frontier plot, CIs) is bandit/selector.py's.

    python bandit/selector_fit.py [PATHS...]    # the point estimate of every score's frontier area, no CIs
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/selector_fit.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

from bandit.stats import logistic
from bandit.stats import trajectory
from bandit.logs import progress as _progress
from bandit.logs.schema import FEATURES
from bandit.logs.table import BlockTable
from bandit.live.timingmodel import pricer, rows_share

SCORES = ("logistic", "conf_min", "ent_mean", "draft_empty")
FITTED = ("logistic",)  # scores refitted per fold: each fold's probabilities are on their own scale
MAX_SUBSET = 2  # alternatives sets searched: every single drafter, every pair, and all of them
C_REG = 1.0  # inverse L2 strength of the logistic score (scikit-learn's C)
EMPTY_ENT = 1e9  # ent_mean score of an empty draft: above any entropy (finite, so a threshold can sit on it)


# ---------------------------------------------------------------- the data of one candidate primary


@dataclass(frozen=True)
class Candidate:
    """The selector's view of the block set of one candidate primary q (B blocks)."""

    q: int
    rows: np.ndarray  # (B,) record index in the table
    X: np.ndarray  # (B, 4) q's draft features
    empty: np.ndarray  # (B,) bool: q proposed nothing
    tau: np.ndarray  # (B, D) tokens each drafter's block would produce (capped at the output's end)
    workload: np.ndarray  # (B,) int
    prompt: np.ndarray  # (B,) int
    dlen: np.ndarray  # (B, D) each drafter's draft length (the verified tokens a timing model prices)
    prefill: np.ndarray  # (B,) each block's share of its prompt's prefill ms (0 without a timing model)


def candidates(t: BlockTable, only: Sequence[int] | None = None) -> list[Candidate | None]:
    """One Candidate per drafter (dense logs: its own trajectory starts; sparse: the logged block starts);
    with `only`, None for the drafters not in it."""
    starts = trajectory.fixed_starts(t) if t.dense else None
    base = None if t.dense else np.flatnonzero(t.is_block_start)
    out: list[Candidate | None] = []
    for q in range(len(t.drafters)):
        if only is not None and q not in only:
            out.append(None)
            continue
        rows = np.flatnonzero(starts[:, q]) if t.dense else base
        b = t.take(rows)
        out.append(
            Candidate(
                q,
                rows,
                b.features[:, q, :],
                b.draft_len[:, q] == 0,
                trajectory.block_tokens(t, rows),
                b.workload.astype(np.int64),
                b.prompt.astype(np.int64),
                b.draft_len.astype(float),
                rows_share(b.prompt, t.prefill_ms),
            )
        )
    return out


def primaries(t: BlockTable) -> list[int]:
    """(W,) each fold's primary on the data as they are (chosen on the other workloads)."""
    W = len(t.workloads)
    cands = candidates(t, [] if t.dense else [0])  # a dense log's primary needs trajectories only
    wp = np.ones((1, t.n_prompts))
    return [int(fold_primary(t, cands, wp, np.arange(W) != g, None)[0]) for g in range(W)]


def fold_primary(
    t: BlockTable, cands: list[Candidate | None], wp: np.ndarray, train: np.ndarray, fixed: int | None
) -> np.ndarray:
    """(m,) primary per resample on the training workloads under prompt weights wp (m, P), by t's rule
    (`trajectory.rule_name`): the fastest fixed drafter measured on the training workloads' live prompts where a
    live phase is attached, else most tokens per pass (dense) or highest mean accepted over the block starts
    (sparse); `fixed` overrides."""
    m = wp.shape[0]
    if fixed is not None:
        return np.full(m, fixed)
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    w = wp * train[wl_of]
    if t.dense:
        key = -trajectory.fixed_passes(t).astype(float)  # (P, D)
    else:
        c = next(x for x in cands if x is not None)  # a sparse log: every candidate shares the logged block starts
        key = np.zeros((t.n_prompts, len(t.drafters)))
        np.add.at(key, c.prompt, t.accepted[c.rows].astype(float))
    return trajectory.choose_primary(w @ key, *trajectory.live_sums(t, w))


# ---------------------------------------------------------------- scores


def _raw_score(c: Candidate, score: str) -> np.ndarray | None:
    if score == "conf_min":
        return -c.X[:, FEATURES.index("conf_min")]
    if score == "ent_mean":
        # an empty draft has no entropy to show (its features are zeros): it ranks first, as the least sure
        return np.where(c.empty, EMPTY_ENT, c.X[:, FEATURES.index("ent_mean")])
    if score == "draft_empty":
        return c.empty.astype(float)
    if score == "logistic":
        return None
    raise ValueError(f"score must be one of {SCORES}, got {score!r}")


class _Fits:
    """Batched logistic fits of one candidate, memoised by the set of training workloads."""

    def __init__(self, c: Candidate, w: np.ndarray):
        self.c, self.w, self.memo = c, w, {}
        best_other = np.delete(c.tau, c.q, axis=1).max(1) if c.tau.shape[1] > 1 else c.tau[:, c.q]
        self.y = (best_other > c.tau[:, c.q]).astype(float)

    def scores(self, train: frozenset, rows: np.ndarray) -> np.ndarray:
        """(m, len(rows)) P(some alternative beats the primary) from the model fitted on `train` workloads."""
        if train not in self.memo:
            keep = np.isin(self.c.workload, sorted(train))
            self.memo[train] = logistic.fit_batched(self.c.X[keep], self.y[keep], self.w[:, keep], C=C_REG)
        return self.memo[train].predict_proba(self.c.X[rows])


def oof_scores(
    c: Candidate, w: np.ndarray, score: str, train: Sequence[int], held: int, fits: _Fits | None
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold scores, (m, n_held) on the held-out workload and (m, n_train) on the training rows from the
    inner leave-one-workload-out loop (each training workload scored by a model that never saw it)."""
    m = w.shape[0]
    held_rows = np.flatnonzero(c.workload == held)
    tr_rows = np.flatnonzero(np.isin(c.workload, list(train)))
    raw = _raw_score(c, score)
    if raw is not None:
        return np.broadcast_to(raw[held_rows], (m, held_rows.size)), np.broadcast_to(raw[tr_rows], (m, tr_rows.size))
    s_held = fits.scores(frozenset(train), held_rows)
    s_tr = np.empty((m, tr_rows.size))
    for h in train:
        inner = [g for g in train if g != h]
        at = c.workload[tr_rows] == h
        s_tr[:, at] = fits.scores(frozenset(inner), tr_rows[at]) if inner else 0.5
    return s_held, s_tr


# ---------------------------------------------------------------- frontier and operating point


def _steps(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, ends): s sorted decreasing (stable), and the index in that order where each run of tied scores ends
    (re-drafting down to a threshold takes whole ties: a threshold sits between distinct scores)."""
    o = np.argsort(-s, kind="stable")
    so = s[o]
    return o, np.r_[np.flatnonzero(so[1:] != so[:-1]), so.size - 1]


def fold_rank(s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each score's weighted mid-rank within its fold, in [0, 1]: the fold's weight strictly below it plus half its
    tie's, over the fold's weight. Monotone in s within the fold (ties stay ties), so the fold's own frontier is
    unchanged; and a weight-c block ranks as c copies of it would."""
    tot = float(w.sum())
    if tot <= 0:
        return np.zeros(s.size)
    u, inv = np.unique(s, return_inverse=True)
    wt = np.bincount(inv, w, minlength=u.size)
    below = np.cumsum(wt) - wt
    return ((below + wt / 2) / tot)[inv]


def frontier_area(s: np.ndarray, w: np.ndarray, up: np.ndarray) -> float:
    """Area under capture (of sum w*up) vs redraft rate (of sum w) re-drafting in decreasing score order.

    Tied scores are one step (its points joined linearly: random order within a tie). 0.5 = random;
    NaN when there is nothing to capture."""
    tot_w, tot_u = float(w.sum()), float((w * up).sum())
    if tot_w <= 0 or tot_u <= 0:
        return float("nan")
    o, ends = _steps(s)
    R = np.r_[0.0, np.cumsum(w[o])[ends] / tot_w]
    C = np.r_[0.0, np.cumsum((w * up)[o])[ends] / tot_u]
    return float(np.sum(np.diff(R) * (C[1:] + C[:-1]) / 2))


def alternative_sets(D: int, p: int) -> list[tuple[int, ...]]:
    others = [d for d in range(D) if d != p]
    sets = [c for k in range(1, min(MAX_SUBSET, len(others)) + 1) for c in combinations(others, k)]
    if len(others) > MAX_SUBSET:
        sets.append(tuple(others))
    return sets


@dataclass(frozen=True)
class Rule:
    """An operating point chosen on training workloads: re-draft with `alts` when score >= threshold."""

    primary: int
    alts: tuple[int, ...]
    threshold: float  # +inf: never re-draft; -inf: always
    speedup: float  # modelled speedup on the training workloads' inner out-of-fold scores

    @property
    def kind(self) -> str:
        return "never" if self.threshold == np.inf else "always" if self.threshold == -np.inf else "threshold"


class RowPrices:
    """The cost of a fixed set of blocks under one cost model for primary p: `base` (n,) alone, `extra(alts)` (n,)
    added by re-drafting with alts (memoised: the prices do not depend on the resample's weights)."""

    def __init__(self, costs, p: int, n: int, dlen: np.ndarray | None = None, prefill: np.ndarray | None = None):
        self.costs, self.p, self.n, self.dlen, self.prefill = costs, p, n, dlen, prefill
        self.base = costs.row_costs(p, (), n, dlen, prefill)[0]
        self.memo: dict[tuple[int, ...], np.ndarray] = {}

    def extra(self, alts: tuple[int, ...]) -> np.ndarray:
        if alts not in self.memo:
            self.memo[alts] = self.costs.row_costs(self.p, alts, self.n, self.dlen, self.prefill)[1]
        return self.memo[alts]


def choose_rule(
    s: np.ndarray, w: np.ndarray, tau: np.ndarray, p: int, costs=None, prices: RowPrices | None = None
) -> Rule:
    """The (alternatives set, threshold) of highest modelled speedup over the inner out-of-fold scores s (n,).

    Speedup = (tokens / cost) of the rule over (tokens / cost) of the primary alone, costs summed over the blocks
    (`prices`, else `costs` without draft lengths: the rho/alpha model): re-drafting the blocks of score >= the
    threshold adds each one's `extra`."""
    best = Rule(p, (), np.inf, 1.0)
    keep = w > 0
    if not keep.any():
        return best
    prices = prices or RowPrices(costs, p, s.size)
    s, w, tau = s[keep], w[keep], tau[keep]
    o, ends = _steps(s)
    base = float(w @ tau[:, p])
    c0 = float(w @ prices.base[keep])
    for alts in alternative_sets(tau.shape[1], p):
        up = tau[:, list(alts) + [p]].max(1) - tau[:, p]
        tok = base + np.cumsum((w * up)[o])[ends]
        cost = c0 + np.cumsum((w * prices.extra(alts)[keep])[o])[ends]
        sp = (tok / cost) * (c0 / base)
        i = int(np.argmax(sp))
        if sp[i] > best.speedup + 1e-12:
            thr = -np.inf if i == ends.size - 1 else float(s[o[ends[i]]])
            best = Rule(p, alts, thr, float(sp[i]))
    return best


# ---------------------------------------------------------------- LOWO, batched over resamples


@dataclass(frozen=True)
class FoldSums:
    """Weighted sums of one held-out workload's blocks under its fold's rule, (m,) each."""

    w: np.ndarray  # total block weight
    r: np.ndarray  # weight re-drafted
    gain: np.ndarray  # tokens gained by re-drafting (tau_sel - tau_p)
    room: np.ndarray  # tokens re-drafting every block with the rule's alternatives would gain
    base: np.ndarray  # tokens of the primary alone
    c0: np.ndarray  # cost of the primary alone (the cost model's unit: verify passes, or ms for the timing model)
    cx: np.ndarray  # cost the rule's re-drafts add


@dataclass(frozen=True)
class NestedResult:
    """LOWO of every score over m weightings (m = 1: the data as they are; else bootstrap resamples)."""

    workloads: tuple[str, ...]
    drafters: tuple[str, ...]
    areas: dict[str, np.ndarray]  # score -> (m, W + 1): frontier area per held-out workload, then pooled
    sums: dict[str, list[FoldSums]]  # score -> W folds of the operating point
    rules: dict[str, list[list[Rule]]]  # score -> W folds -> m rules
    costs: object  # the cost model: costmodel.Costs, or timingmodel.TimingModel (bandit/live/timingmodel.py)

    def outcome(self, score: str, fold: int | None = None) -> dict[str, np.ndarray]:
        """capture, redraft_rate, skill, token_gain, speedup [MODEL], each (m,), for one fold or pooled.

        Pooled, capture and skill count only the folds whose rule re-drafts with some alternatives (a fold that
        never re-drafts has no gap of its own to capture); the redraft rate and token gain count every block.
        Skill is NaN unless 0 < R < 1 among those folds' blocks (never and always are degenerate)."""
        folds = range(len(self.workloads)) if fold is None else [fold]
        fs = [self.sums[score][f] for f in folds]
        act = [np.array([bool(r.alts) for r in self.rules[score][f]]) for f in folds]  # (m,) per fold
        tot = {k: np.sum([getattr(f, k) for f in fs], 0) for k in ("w", "r", "gain", "base")}
        room = np.sum([f.room * a for f, a in zip(fs, act)], 0)
        gain_a = np.sum([f.gain * a for f, a in zip(fs, act)], 0)
        w_a = np.sum([f.w * a for f, a in zip(fs, act)], 0)
        r_a = np.sum([f.r * a for f, a in zip(fs, act)], 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            R = tot["r"] / tot["w"]
            C = np.where(room > 0, gain_a / room, np.nan)
            Ra = r_a / w_a
            skill = np.where((Ra > 0) & (Ra < 1), C / Ra, np.nan)
            g = tot["gain"] / tot["base"]
        return {"capture": C, "redraft_rate": R, "skill": skill, "token_gain": g, "speedup": self._speedup(score, fold)}

    def _speedup(self, score: str, fold: int | None) -> np.ndarray:
        # each fold under its own rule's costs; pooled as (tokens / cost) over the primary alone's (tokens / cost)
        fs = [self.sums[score][f] for f in (range(len(self.workloads)) if fold is None else [fold])]
        tok, cost = sum(f.base + f.gain for f in fs), sum(f.c0 + f.cx for f in fs)
        base_tok, base_cost = sum(f.base for f in fs), sum(f.c0 for f in fs)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (tok / cost) / (base_tok / base_cost)


def nested(
    t: BlockTable,
    wp: np.ndarray,
    costs=None,
    scores: Sequence[str] = SCORES,
    fold_primaries: Sequence[int] | None = None,
    row_weights: dict[int, np.ndarray] | None = None,
    progress: str | None = None,
) -> NestedResult:
    """Leave-one-workload-out evaluation of every score under m weightings at once.

    wp (m, P) prompt weights (bootstrap draw counts; ones for the data as they are). The block resampling
    unit passes `fold_primaries` (W,), each fold's primary as chosen on its training workloads in the full
    data (`primaries`), and `row_weights` {q: (m, B_q)} weighting each such block set's rows directly.
    `progress`: a progress bar's description (one step per held-out workload), or None for none.
    """
    W, D = len(t.workloads), len(t.drafters)
    if W < 2:
        raise ValueError(f"LOWO needs at least two workloads; the logs have {list(t.workloads)}")
    if D < 2:
        raise ValueError("the selector needs at least two drafters")
    costs = costs or pricer(t)  # the live phase's timing model where attached, else the rho/alpha model
    cands = candidates(t, None if fold_primaries is None else sorted(set(fold_primaries)))
    m = wp.shape[0]
    prim = {
        g: fold_primary(t, cands, wp, np.arange(W) != g, None if fold_primaries is None else fold_primaries[g])
        for g in range(W)
    }
    weights = {}
    for q in set(np.concatenate(list(prim.values())).tolist()):
        c = cands[q]
        weights[q] = row_weights[q] if row_weights is not None else np.take(wp, c.prompt, axis=1)
    fits = {q: _Fits(cands[q], weights[q]) for q in weights} if "logistic" in scores else {}
    areas = {s: np.full((m, W + 1), np.nan) for s in scores}
    sums = {s: [] for s in scores}
    rules = {s: [] for s in scores}
    pooled = {s: [[] for _ in range(m)] for s in scores}  # per resample: (score, w, up) of every fold
    pbar = _progress.bar(W, progress) if progress else None
    for g in range(W):
        if pbar is not None and g:
            pbar.update(1)  # the previous held-out workload is done
        train = [h for h in range(W) if h != g]
        acc = {s: {k: np.zeros(m) for k in ("w", "r", "gain", "room", "base", "c0", "cx")} for s in scores}
        fold_rules = {s: [None] * m for s in scores}
        for q in np.unique(prim[g]).tolist():
            c, wq = cands[q], weights[q]
            ms = np.flatnonzero(prim[g] == q)
            held = np.flatnonzero(c.workload == g)
            tr = np.flatnonzero(c.workload != g)
            up_h = (c.tau.max(1) - c.tau[:, q])[held]  # the gap to the best of all drafters, held-out rows
            tau_h, tau_tr = c.tau[held], c.tau[tr]
            pr_h = RowPrices(costs, q, held.size, c.dlen[held], c.prefill[held])
            pr_tr = RowPrices(costs, q, tr.size, c.dlen[tr], c.prefill[tr])
            for s in scores:
                sh, st = oof_scores(c, wq, s, train, g, fits.get(q))
                for i in ms.tolist():
                    wh, wt = wq[i, held], wq[i, tr]
                    areas[s][i, g] = frontier_area(sh[i], wh, up_h)
                    # the fitted score's scale is its fold's own: pooled by within-fold rank (module docstring)
                    pooled[s][i].append((fold_rank(sh[i], wh) if s in FITTED else sh[i], wh, up_h))
                    rule = choose_rule(st[i], wt, tau_tr, q, prices=pr_tr)
                    fold_rules[s][i] = rule
                    up = tau_h[:, list(rule.alts) + [q]].max(1) - tau_h[:, q] if rule.alts else np.zeros(held.size)
                    r = sh[i] >= rule.threshold
                    a = acc[s]
                    a["w"][i], a["r"][i] = wh.sum(), wh @ r
                    a["gain"][i], a["room"][i], a["base"][i] = (wh * r) @ up, wh @ up, wh @ tau_h[:, q]
                    a["c0"][i] = wh @ pr_h.base
                    a["cx"][i] = (wh * r) @ pr_h.extra(rule.alts) if rule.alts else 0.0
        for s in scores:
            sums[s].append(FoldSums(**acc[s]))
            rules[s].append(fold_rules[s])
    for s in scores:
        for i in range(m):
            sc, ww, uu = (np.concatenate(x) for x in zip(*pooled[s][i]))
            areas[s][i, W] = frontier_area(sc, ww, uu)
    if pbar is not None:
        pbar.update(1)
        pbar.close()
    return NestedResult(t.workloads, t.drafters, areas, sums, rules, costs)


# ---------------------------------------------------------------- the report


def rule_text(r: Rule, score: str, drafters: Sequence[str]) -> str:
    if r.kind == "never":
        return "never re-drafts"
    alts = "+".join(drafters[j] for j in r.alts)
    if r.kind == "always":
        return f"always re-drafts with {alts}"
    thr = {
        "conf_min": f"conf_min <= {-r.threshold:.3f}",
        "ent_mean": f"ent_mean >= {r.threshold:.3f}",
        "draft_empty": "the primary's draft is empty",
    }.get(score, f"p >= {r.threshold:.3f}")
    return f"re-draft with {alts} when {thr}"


def frontier_points(t: BlockTable, score: str = "logistic") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled out-of-fold frontier of one score on the data as they are: (R, C, g), each (T,), R ascending."""
    W = len(t.workloads)
    cands = candidates(t)
    wp = np.ones((1, t.n_prompts))
    S, U, Bs = [], [], []
    fits = {}
    for g in range(W):
        q = int(fold_primary(t, cands, wp, np.arange(W) != g, None)[0])
        c = cands[q]
        fits.setdefault(q, _Fits(c, wp[:, c.prompt]))
        held = np.flatnonzero(c.workload == g)
        sh, _ = oof_scores(c, wp[:, c.prompt], score, [h for h in range(W) if h != g], g, fits[q])
        S.append(fold_rank(sh[0], np.ones(held.size)) if score in FITTED else sh[0])
        U.append(c.tau[held].max(1) - c.tau[held, q])
        Bs.append(c.tau[held, q])
    s, up, base = np.concatenate(S), np.concatenate(U), np.concatenate(Bs)
    o, ends = _steps(s)
    R = np.r_[0.0, (ends + 1) / s.size]
    C = np.r_[0.0, np.cumsum(up[o])[ends] / max(up.sum(), 1e-300)]
    gg = np.r_[0.0, np.cumsum(up[o])[ends] / base.sum()]
    return R, C, gg


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs
    from bandit.live.primary import attach_own

    def body(files, said: str) -> None:
        t = attach_own(load_logs(files))
        point = nested(t, np.ones((1, t.n_prompts)))
        print(said)
        print(
            f"[{t.label}] frontier area (out-of-fold capture vs redraft rate; 0.5 = random), pooled over held-out "
            "workloads, point estimates (CIs: python bandit/selector.py):"
        )
        for s in point.areas:
            print(f"  {s}: {float(point.areas[s][0, -1]):.3f}")

    demo(body, "The selector's frontier areas, point estimates.")
