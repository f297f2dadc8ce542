"""The choice selector: per block, verify one lookup draft or run a model drafter instead, decided from the
lookup drafts already made.

The lookups (n-gram, suffix: bandit.schema.LOOKUP_KINDS) draft before any choice, for next to nothing, so
their draft lengths and FEATURES are known when the block's drafter is chosen. Per drafter d a ridge
regression on them (`design`; no previous-block features: those depend on the policy's own trajectory)
predicts the block's tokens tau_d = min(a_d + 1, tokens left). The block runs

    argmax_d  tau_hat_d - lam * cost_d,   cost_d = verify(1 + draft length of d) + drafter_ms[d] (model drafters)

(the lookups' calls are paid at every block whatever is chosen, so they add the same to every cost). lam,
the operating point, is an exchange rate in tokens per ms: run at lam equal to its own rate, the rule
maximises tokens per ms over the blocks (Dinkelbach), where argmax tau_hat / cost maximises the rate of
each block alone and so favours cheap short blocks. lam is chosen from a grid on the training workloads
only, by the rule's tokens per modelled ms along its own trajectory on the dense log, with out-of-fold
predictions (an inner leave-one-workload-out), as the selector of bandit/selector_fit.py chooses its
operating point. Modelled block time: every lookup's call (when the engine drafts them: k > 0) +
verify(1 + the verified draft's logged length) + the chosen model drafter's call, as harness/decode/engine.py
spends it in `policy:selector`; a fixed drafter pays its own call only.

    python bandit/policies/choice.py [RUN]   # leave-one-workload-out: tokens/s [MODEL] vs the fastest fixed drafter
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/choice.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator

from bandit.stats import trajectory
from bandit.logs.schema import Context, Timing
from bandit.logs.table import BlockTable
from bandit.policies.walk import lookup_flags, lookups_drafted, run_timing

LAM_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0)  # x the fastest fixed drafter's rate


def design(dl: np.ndarray, f: np.ndarray, krow: np.ndarray, k: int) -> np.ndarray:
    """(n, F) features known before choosing: per lookup its draft length / k, empty, reaching k, its FEATURES
    and length x confidence; per pair of lookups the shorter length and the product; the block's k / k.

    dl (n, L) the lookups' draft lengths, f (n, L, 4) their FEATURES, krow (n,) the block's draft length k.
    One function for the fit (every row) and `ChoiceSelector.choose` (one row), so both see the same numbers.
    """
    dl = np.asarray(dl, float)
    f = np.nan_to_num(np.asarray(f, float))
    kr = np.asarray(krow, float)[:, None]
    n = dl / k
    cols = [n, dl == 0, dl >= kr, f[..., 0], f[..., 1], f[..., 2], f[..., 3], n * f[..., 0], n * f[..., 1]]
    cols.append(n * f[..., 3])
    L = dl.shape[1]
    for a in range(L):
        for b in range(a + 1, L):
            cols += [np.minimum(n[:, a : a + 1], n[:, b : b + 1]), n[:, a : a + 1] * n[:, b : b + 1]]
    cols.append(kr / k)
    return np.concatenate([np.asarray(c, float).reshape(len(dl), -1) for c in cols], axis=1)


def design_one(dl: list[float], f: list[list[float]], krow: float, k: int) -> list[float]:
    """`design` of one row in plain floats (a policy's choice costs microseconds): the same columns, the same
    operations, so the same numbers (tests/test_choice.py checks)."""
    f = [[0.0 if v != v else v for v in row] for row in f]  # NaN -> 0, as nan_to_num
    n = [x / k for x in dl]
    cols = [n, [float(x == 0) for x in dl], [float(x >= krow) for x in dl]]
    cols += [[r[j] for r in f] for j in range(4)]
    cols += [[a * r[0] for a, r in zip(n, f)], [a * r[1] for a, r in zip(n, f)], [a * r[3] for a, r in zip(n, f)]]
    out = [v for c in cols for v in c]
    for a in range(len(n)):
        for b in range(a + 1, len(n)):
            out += [min(n[a], n[b]), n[a] * n[b]]
    return out + [krow / k]


@dataclass(frozen=True)
class Prepared:
    """What every fit and walk on one dense table under one Timing reuses (R rows, D drafters)."""

    t: BlockTable
    timing: Timing
    look: np.ndarray  # (D,) bool
    X: np.ndarray  # (R, F) `design`
    tau: np.ndarray  # (R, D) tokens of each drafter's block, to the output's end
    krow: np.ndarray  # (R,) the block's draft length k (the longest model draft; the timing's k without one)
    drafted: np.ndarray  # (R,) bool: the engine drafts the lookups before choosing here
    cost: np.ndarray  # (R, D) modelled ms of the block if d runs: lookups' calls + verify + model call
    fixed_cost: np.ndarray  # (R, D) modelled ms of fixed drafter d's block: verify + its own call
    starts: np.ndarray  # (P,) first row of each prompt
    lengths: np.ndarray  # (P,) output tokens of each prompt
    prompt_workload: np.ndarray  # (P,)

    @staticmethod
    def of(t: BlockTable, timing: Timing | None = None) -> "Prepared":
        trajectory.require_dense(t)
        timing = run_timing(t) if timing is None else timing
        if not timing.measured:
            raise ValueError("the choice selector needs measured verification and drafter times (manifest `timing`)")
        missing = [d for d in t.drafters if d not in timing.drafter_ms]
        if missing:
            raise ValueError(f"the timing has no call time for drafter(s) {', '.join(missing)}")
        look = lookup_flags(t, timing)
        if not look.any():
            raise ValueError("the choice selector needs a lookup drafter (kind ngram or suffix) among the drafters")
        k = max(int(timing.k or t.draft_len.max(initial=1)), 1)
        krow = t.draft_len[:, ~look].max(1) if (~look).any() else np.full(t.n_records, k)
        rem = trajectory.remaining(t)
        ms = np.array([timing.drafter_ms[d] for d in t.drafters])
        drafted = lookups_drafted(t)
        verify = timing.verify(1.0 + t.draft_len)
        own = np.where(look, 0.0, ms)[None, :]
        cost = np.where(drafted, ms[look].sum(), 0.0)[:, None] + verify + own
        starts, lengths = trajectory.prompt_rows(t)
        X = design(t.draft_len[:, look], t.features[:, look], krow, k)
        tau = np.minimum(t.accepted.astype(np.int64) + 1, rem[:, None]).astype(float)
        return Prepared(
            t, timing, look, X, tau, krow, drafted, cost, verify + ms[None, :], starts, lengths, t.workload[starts]
        )

    def walk(self, pick: np.ndarray, prompts: np.ndarray, fixed: bool = False) -> tuple[float, float, np.ndarray]:
        """(tokens, modelled ms, visited rows) of the trajectory running drafter pick[r] at every block start r,
        over `prompts` (indices), vectorised over prompts as trajectory.walk is."""
        adv = self.t.accepted[np.arange(len(pick)), pick].astype(np.int64) + 1
        st, n = self.starts[prompts], self.lengths[prompts]
        pos, out = np.zeros(len(prompts), np.int64), []
        live = pos < n
        while live.any():
            r = st[live] + pos[live]
            out.append(r)
            pos[live] += adv[r]
            live = pos < n
        rows = np.concatenate(out) if out else np.zeros(0, np.int64)
        c = (self.fixed_cost if fixed else self.cost)[rows, pick[rows]]
        return float(n.sum()), float(c.sum()), rows

    def fixed_rates(self, prompts: np.ndarray) -> np.ndarray:
        """(D,) tokens per modelled ms of each fixed drafter over `prompts` (its own call only)."""
        out = []
        for d in range(len(self.t.drafters)):
            tok, ms, _ = self.walk(np.full(self.t.n_records, d), prompts, fixed=True)
            out.append(tok / ms)
        return np.array(out)


class ChoiceSelector(BaseEstimator):
    """The per-block choice between the lookup drafts and the model drafters (see the module's doc).

    scikit-learn style: hyperparameters in `__init__` (no work there), `fit(t, workloads_mask, timing)` on a
    dense BlockTable, fitted attributes with a trailing underscore. Also a `bandit.logs.schema.Policy`
    (bandit feedback, no learning while it runs: `update` does nothing), so that the walk (bandit/policies/walk.py)
    and the live engine run it as any policy.

    ridge: the L2 penalty on standardised features; lam_grid: the operating points tried, in units of the
    fastest fixed drafter's tokens per ms on the training workloads; inner_cv: choose the operating point on
    out-of-fold predictions (leave one training workload out) rather than in-sample ones; random_state: kept
    for the policy protocol (the fit and the choice are deterministic).
    """

    name = "selector"
    full_information = False

    def __init__(self, ridge: float = 1.0, lam_grid: Sequence[float] = LAM_GRID, inner_cv: bool = True, random_state=0):
        self.ridge = ridge
        self.lam_grid = lam_grid
        self.inner_cv = inner_cv
        self.random_state = random_state

    # ---------------------------------------------------------------- fit

    def fit(self, t: BlockTable | Prepared, workloads_mask: np.ndarray | None = None, timing: Timing | None = None):
        """Fit on the records of the workloads with workloads_mask[w] (None: all) of dense log t under `timing`
        (None: the run's manifest timing). `t` may be a `Prepared` table (its own timing then)."""
        prep = t if isinstance(t, Prepared) else Prepared.of(t, timing)
        tab = prep.t
        W = len(tab.workloads)
        wm = np.ones(W, bool) if workloads_mask is None else np.asarray(workloads_mask, bool)
        if wm.shape != (W,) or not wm.any():
            raise ValueError(f"workloads_mask must be (W,) = ({W},) bool with a training workload")
        self.drafters_, self.workloads_ = tab.drafters, tab.workloads
        self.train_workloads_ = tuple(w for w, m in zip(tab.workloads, wm) if m)
        self.timing_ = prep.timing
        self.k_ = max(int(prep.timing.k or tab.draft_len.max(initial=1)), 1)
        self.lookup_ = prep.look
        self.cap_ = np.where(prep.look, self.k_, tab.draft_len[wm[tab.workload]].max(0, initial=0))
        rows = wm[tab.workload]
        self.mean_, self.scale_, self.coef_, self.intercept_ = _ridge(prep.X[rows], prep.tau[rows], self.ridge)
        # the operating point, on the training workloads only: out-of-fold predictions when there are >= 2
        P = np.zeros_like(prep.tau)
        train = np.flatnonzero(wm)
        if self.inner_cv and len(train) >= 2:
            for g in train:
                fit_rows, pred_rows = rows & (tab.workload != g), tab.workload == g
                P[pred_rows] = _predict(prep.X[pred_rows], *_ridge(prep.X[fit_rows], prep.tau[fit_rows], self.ridge))
        else:
            P[rows] = _predict(prep.X[rows], self.mean_, self.scale_, self.coef_, self.intercept_)
        prompts = np.flatnonzero(wm[prep.prompt_workload])
        self.lam_ref_ = float(prep.fixed_rates(prompts).max())
        self._costs(prep.timing)
        self.grid_ = []
        for g in self.lam_grid:
            self.lam_ = g * self.lam_ref_
            tok, ms, _ = prep.walk(self.decide_rows(prep, P), prompts)
            self.grid_.append((float(g), tok / ms))
        g_best = max(self.grid_, key=lambda x: x[1])[0]  # first of the best on ties
        self.lam_ = g_best * self.lam_ref_
        self._ready(prep.timing)
        return self

    def _costs(self, timing: Timing) -> None:
        """Decision costs: verify(n) for n = 1..k+1 and each drafter's call (0 for a lookup: paid anyway)."""
        self.verify_ = timing.verify(np.arange(self.k_ + 2, dtype=float))
        self.call_ = np.array(
            [0.0 if lk else float(timing.drafter_ms[d]) for d, lk in zip(self.drafters_, self.lookup_)]
        )

    # ---------------------------------------------------------------- predict and decide

    def predict_tokens(self, X: np.ndarray, dl: np.ndarray, krow: np.ndarray) -> np.ndarray:
        """(n, D) predicted tokens of each drafter's block, within [1, its draft length + 1]."""
        P = _predict(X, self.mean_, self.scale_, self.coef_, self.intercept_)
        return self._clip(P, dl, krow)

    def _clip(self, P: np.ndarray, dl: np.ndarray, krow: np.ndarray) -> np.ndarray:
        n = self._lengths(dl, krow)
        return np.clip(P, 1.0, n + 1.0)

    def _lengths(self, dl: np.ndarray, krow: np.ndarray) -> np.ndarray:
        """(n, D) draft length each drafter's block is expected to verify: a lookup's own (known), a model
        drafter's longest seen in training, within the block's k."""
        return np.where(self.lookup_, dl, np.minimum(self.cap_, np.asarray(krow)[:, None]))

    def decide(self, P: np.ndarray, dl: np.ndarray, krow: np.ndarray) -> np.ndarray:
        """(n,) drafter per row: argmax of predicted tokens P (n, D) - lam * decision cost (first on ties)."""
        n = self._lengths(dl, krow).astype(np.int64)
        cost = self.verify_[n + 1] + self.call_
        return np.argmax(self._clip(P, dl, krow) - self.lam_ * cost, axis=1)

    def decide_rows(self, prep: Prepared, P: np.ndarray | None = None) -> np.ndarray:
        """(R,) the rule's drafter at every row of a prepared table (P: raw predictions, default the model's)."""
        if P is None:
            P = _predict(prep.X, self.mean_, self.scale_, self.coef_, self.intercept_)
        return self.decide(P, prep.t.draft_len, prep.krow)

    # ---------------------------------------------------------------- the Policy protocol

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: Timing | None = None) -> None:
        if tuple(drafters) != tuple(self.drafters_):
            raise ValueError(f"the selector was fitted for drafters {list(self.drafters_)}, not {list(drafters)}")
        self._ready(timing if timing is not None and timing.measured else self.timing_)

    def _ready(self, timing: Timing) -> None:
        """The decision costs under `timing` and the plain-float copies `choose` reads."""
        self._costs(timing)
        self.look_list_ = np.flatnonzero(self.lookup_).tolist()
        self.model_list_ = np.flatnonzero(~self.lookup_).tolist()
        self.lookup_list_, self.cap_list_ = self.lookup_.tolist(), self.cap_.astype(float).tolist()
        self.call_list_, self.verify_list_ = self.call_.tolist(), self.verify_.tolist()

    def choose(self, ctx: Context) -> int:
        # `design` and `decide` for one row in plain floats (the same operations in the same order, so the
        # same numbers): ~25 us a block, where the array versions on one row take ~40 us (numpy's per-call cost)
        dl = ctx.draft_len.tolist()
        krow = max(dl[j] for j in self.model_list_) if self.model_list_ else float(self.k_)
        f = None if ctx.draft_features is None else ctx.draft_features.tolist()
        x = design_one(
            [dl[j] for j in self.look_list_], [f[j] if f else [0.0] * 4 for j in self.look_list_], krow, self.k_
        )
        P = ((np.array(x)[None] - self.mean_) / self.scale_ @ self.coef_ + self.intercept_)[0].tolist()
        lam, best, arg = self.lam_, -math.inf, 0
        for d, (p, lk, cap, call) in enumerate(zip(P, self.lookup_list_, self.cap_list_, self.call_list_)):
            n = dl[d] if lk else min(cap, krow)
            v = min(max(p, 1.0), n + 1.0) - lam * (self.verify_list_[int(n) + 1] + call)
            if v > best:
                best, arg = v, d
        return arg

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass  # fitted once, offline: what it learned is in coef_ and lam_


def _ridge(X: np.ndarray, Y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mean, scale, coef (F, D), intercept (D,)) of ridge regressions of every column of Y on standardised X,
    the intercept unpenalised (X and Y centred)."""
    mean = X.mean(0)
    scale = X.std(0)
    scale = np.where(scale > 1e-12, scale, 1.0)  # a constant feature: coefficient 0 under the penalty
    Z = (X - mean) / scale
    ym = Y.mean(0)
    coef = np.linalg.solve(Z.T @ Z + lam * np.eye(Z.shape[1]), Z.T @ (Y - ym))
    return mean, scale, coef, ym


def _predict(X, mean, scale, coef, intercept) -> np.ndarray:
    return ((X - mean) / scale) @ coef + intercept


# ---------------------------------------------------------------- leave one workload out, and the routed policy


def fit_lowo(t: BlockTable | Prepared, timing: Timing | None = None, **params) -> dict[str, ChoiceSelector]:
    """For every workload w of dense log t, the selector fitted on the other workloads (`params` its
    hyperparameters). A table of one workload has no other: its rule is then fitted on that workload."""
    prep = t if isinstance(t, Prepared) else Prepared.of(t, timing)
    W = len(prep.t.workloads)
    out = {}
    for w, name in enumerate(prep.t.workloads):
        mask = np.arange(W) != w if W > 1 else np.ones(1, bool)
        out[name] = ChoiceSelector(**params).fit(prep, mask)
    return out


class RoutedSelector:
    """A Policy running, on each block, the rule fitted without the block's workload (by workload NAME);
    `fallback` (fitted on every workload) for a workload no rule was fitted for."""

    name = "selector"
    full_information = False

    def __init__(self, rules: Mapping[str, ChoiceSelector], fallback: ChoiceSelector | None = None):
        self.rules, self.fallback = dict(rules), fallback

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: Timing | None = None) -> None:
        for r in {id(r): r for r in [*self.rules.values(), self.fallback] if r is not None}.values():
            r.reset(drafters, workloads, timing)
        self.route_ = [self.rules.get(w, self.fallback) for w in workloads]

    def rule_for(self, workload: int) -> ChoiceSelector:
        r = self.route_[workload] if 0 <= workload < len(self.route_) else self.fallback
        if r is None:
            raise ValueError(f"no selector rule for workload index {workload} and no fallback")
        return r

    def choose(self, ctx: Context) -> int:
        return self.rule_for(ctx.workload).choose(ctx)

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


def routed(t: BlockTable | Prepared, timing: Timing | None = None, **params) -> RoutedSelector:
    """The live selector of dense log t: leave-one-workload-out rules, and one on every workload as fallback."""
    prep = t if isinstance(t, Prepared) else Prepared.of(t, timing)
    return RoutedSelector(fit_lowo(prep, **params), ChoiceSelector(**params).fit(prep))


# ---------------------------------------------------------------- the report


def report(t: BlockTable, timing: Timing, params: Mapping | None = None) -> str:
    """Per held-out workload and pooled: the selector (the rule fitted without that workload, replayed with the
    live feedback rules along its own trajectory) against the fastest fixed drafter, in modelled tokens/s."""
    from bandit.policies.walk import arms_table, live_walk

    t = arms_table(t)  # the drafters it may choose: a tree is no policy's arm (schema.ArmsOnly)
    prep = Prepared.of(t, timing)
    rules = fit_lowo(prep, **(params or {}))
    D = len(t.drafters)
    lines = [
        f"[MODEL] choice selector, leave-one-workload-out, on {t.summary()}",
        "modelled ms per block: verify(1 + verified draft) + the calls made (the selector: every lookup + the chosen"
        " model drafter; a fixed drafter: its own)",
        f"{'workload':10s} {'selector':>9s} {'fastest fixed':>22s} {'gain':>7s} {'hindsight':>9s}  lam  choice mix",
    ]
    tot = np.zeros(2)
    fixed_tot = np.zeros((D, 2))
    ceil_tot = np.zeros(2)
    mix_all = np.zeros(D)
    for w, name in enumerate(t.workloads):
        prompts = np.flatnonzero(prep.prompt_workload == w)
        rule = rules[name]
        rows, chosen, _, _ = live_walk(t, rule, prompts, timing)
        tok, ms = float(prep.lengths[prompts].sum()), float(prep.cost[rows, chosen].sum())
        fr = prep.fixed_rates(prompts)
        b = int(np.argmax(fr))
        ctok, cms, crow = prep.walk(rule.decide(prep.tau, t.draft_len, prep.krow), prompts)
        mix = np.bincount(chosen, minlength=D)
        tot += (tok, ms)
        ceil_tot += (ctok, cms)
        fixed_tot += np.c_[np.full(D, tok), tok / fr]
        mix_all += mix
        lines.append(
            f"{name:10s} {1000 * tok / ms:9.1f} {t.drafters[b]:>12s} {1000 * fr[b]:9.1f} {tok / ms / fr[b] - 1:+7.1%} "
            f"{1000 * ctok / cms:9.1f}  {rule.lam_:.2f} {_mix(t.drafters, mix)}"
        )
    fr = fixed_tot[:, 0] / fixed_tot[:, 1]
    b = int(np.argmax(fr))
    rate = tot[0] / tot[1]
    lines.append(
        f"{'pooled':10s} {1000 * rate:9.1f} {t.drafters[b]:>12s} {1000 * fr[b]:9.1f} {rate / fr[b] - 1:+7.1%} "
        f"{1000 * ceil_tot[0] / ceil_tot[1]:9.1f}       {_mix(t.drafters, mix_all)}"
    )
    best_w = sum(  # each workload on its own fastest fixed drafter (hindsight per workload)
        1.0
        / prep.fixed_rates(np.flatnonzero(prep.prompt_workload == w)).max()
        * prep.lengths[prep.prompt_workload == w].sum()
        for w in range(len(t.workloads))
    )
    lines.append(
        f"each workload on its own fastest fixed drafter: {1000 * tot[0] / best_w:.1f} tokens/s; "
        "hindsight: the same rule (its lam) told the true tokens of every block, the ceiling of these features' use"
    )
    return "\n".join(lines) + "\n"


def _mix(names: Sequence[str], counts: np.ndarray) -> str:
    n = counts.sum()
    return ", ".join(f"{d} {c / n:.0%}" for d, c in zip(names, counts) if c) if n else "-"


if __name__ == "__main__":
    import time

    from bandit.logs.errors import InputError
    from bandit.logs.reader import demo, load_logs, read_manifest
    from bandit.policies.walk import policies_timing

    def body(files, said: str) -> None:
        t = load_logs(files)
        if not t.dense:
            raise InputError(f"{said}: the choice selector is fitted and walked on a dense log; this one is sparse")
        timing = policies_timing(read_manifest(files[0]), t.drafters, int(t.draft_len.max(initial=1)))
        t0 = time.perf_counter()
        routed(t, timing)
        fit_s = time.perf_counter() - t0
        print(report(t, timing), end="")
        print(
            f"fitting the live selector (4 + 1 rules, bandit/policies/livepolicies.py make('selector')): {fit_s:.1f} s"
        )

    demo(body, "The choice selector (which drafter runs, from the lookup drafts), leave-one-workload-out.")
