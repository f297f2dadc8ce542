"""Drafter-selection policies behind one interface (the `Policy` protocol of bandit/replay.py).

A policy sees a `Context` before drafting at a block start (workload, prompt, position, the
previous block's acceptance and draft features, the draft lengths lookup drafters know), picks
a drafter (or a drafter and a cut length L: a draft cut to L accepts min(accepted, L)), and
then learns from what the verification revealed: `accepted (D,)` with NaN where unobserved.
The replay enforces the feedback model: a bandit policy (`full_information = False`) sees only
the drafter it chose; a full-information one sees every drafter (panoramic feedback).

Rewards are accepted tokens; learners that need rewards in [0, 1] divide by the longest draft
seen so far (k in practice). Every class is sklearn-style: hyperparameters in `__init__`, all
state created in `reset`, `random_state` seeds the only source of randomness.

    python bandit/policies.py      # each policy on a synthetic two-workload stream with a ranking flip
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

LOOKUP_KINDS = ("ngram", "lookup", "prompt_lookup", "copy", "suffix")


class _Policy:
    """Shared plumbing: names, the seeded generator, the reward scale (longest draft seen)."""
    name = "policy"
    full_information = False

    def __init__(self, random_state: int | None = 0):
        self.random_state = random_state

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: dict | None = None) -> None:
        self.drafters_, self.workloads_ = tuple(drafters), tuple(workloads)
        self.n_arms_ = len(self.drafters_)
        self.rng_ = np.random.default_rng(self.random_state)
        self.scale_ = 1.0
        self.t_ = 0

    def _note_scale(self, ctx) -> None:
        m = float(np.max(ctx.draft_len)) if len(ctx.draft_len) else 0.0
        if m > self.scale_:
            self.scale_ = m

    def _sample(self, p: np.ndarray) -> int:
        # inverse-CDF with one uniform: cheaper than rng.choice and identical across numpy versions
        c = np.cumsum(p)
        return int(min(np.searchsorted(c, self.rng_.random() * c[-1], side="right"), len(p) - 1))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("_"))
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------- baselines

class Random(_Policy):
    """Uniform random drafter at every block: the floor every learner must clear."""
    name = "random"

    def choose(self, ctx) -> int:
        return int(self.rng_.integers(self.n_arms_))

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


class Fixed(_Policy):
    """Always the same drafter, or one drafter per workload (`arms` indexed by workload).

    With the arm picked in hindsight this is DESIGN.md's best fixed drafter (one arm) or the
    workload-level hindsight oracle (one arm per workload); core.py fits them from the table.
    """
    name = "fixed"

    def __init__(self, arms: int | Sequence[int] = 0, name: str = "fixed", random_state: int | None = 0):
        super().__init__(random_state)
        self.arms, self.name = arms, name

    def choose(self, ctx) -> int:
        return int(self.arms) if np.ndim(self.arms) == 0 else int(self.arms[ctx.workload])

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


# ---------------------------------------------------------------- non-contextual prior art

class UCB1(_Policy):
    """UCB1 over drafters (Auer et al. 2002), the rule of BanditSpec's UCBSpec (ICML'25).

    Bandit feedback: the mean normalised acceptance of each drafter plus sqrt(2 ln t / n)
    exploration bonus (times `c`); every drafter is tried once first. Converges to the best
    fixed drafter, which is also its ceiling when rankings flip between workloads.
    """
    name = "ucb"

    def __init__(self, c: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.c = c

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.n_ = np.zeros(self.n_arms_)
        self.sum_ = np.zeros(self.n_arms_)

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        untried = np.flatnonzero(self.n_ == 0)
        if untried.size:
            return int(untried[0])
        t = self.n_.sum()
        ucb = self.sum_ / self.n_ / self.scale_ + self.c * np.sqrt(2.0 * math.log(t) / self.n_)
        return int(np.argmax(ucb))

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.n_[chosen] += 1
        self.sum_[chosen] += accepted[chosen]


class EXP3(_Policy):
    """EXP3 (Auer et al. 2002), the adversarial bandit of BanditSpec's EXP3Spec.

    Exponential weights on importance-weighted reward estimates mixed with uniform
    exploration; anytime rate gamma_t = min(1, sqrt(K ln K / ((e - 1) t))) because the
    horizon is not known in advance. Bandit feedback only.
    """
    name = "exp3"

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.s_ = np.zeros(self.n_arms_)   # cumulative importance-weighted rewards in [0, 1] units
        self.p_ = np.full(self.n_arms_, 1.0 / self.n_arms_)

    def _gamma(self) -> float:
        K = self.n_arms_
        return min(1.0, math.sqrt(K * math.log(max(K, 2)) / ((math.e - 1) * (self.t_ + 1))))

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        g, K = self._gamma(), self.n_arms_
        z = (g / K) * self.s_
        w = np.exp(z - z.max())
        self.p_ = (1 - g) * w / w.sum() + g / K
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_[chosen] += (accepted[chosen] / self.scale_) / self.p_[chosen]


class Hedge(_Policy):
    """Hedge / exponential weights with full information ("Not-a-Bandit", HedgeSpec).

    Once the target has verified every draft of a block, every drafter's acceptance is known
    (panoramic feedback), so the learner updates every weight; anytime learning rate
    eta_t = sqrt(8 ln K / t) on rewards in [0, 1] gives O(sqrt(T ln K)) regret against the
    best fixed drafter. Samples its choice from the weights with `random_state`.
    """
    name = "hedge"
    full_information = True

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.s_ = np.zeros(self.n_arms_)

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        eta = math.sqrt(8.0 * math.log(max(self.n_arms_, 2)) / (self.t_ + 1))
        z = eta * self.s_
        return self._sample(np.exp(z - z.max()))

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_ += np.where(observed, np.nan_to_num(accepted), 0.0) / self.scale_


class NormalHedge(_Policy):
    """NormalHedge (Chaudhuri, Freund & Hsu 2009): parameter-free full-information learner.

    Weights w_i ~ ([R_i]_+ / c) exp([R_i]_+^2 / 2c) on cumulative regrets R_i against its own
    expected reward, with c solving mean_i exp([R_i]_+^2 / 2c) = e (solved on a vectorised
    geometric grid, two passes, instead of a scalar bisection: same answer to ~0.1%, 20x faster).
    No learning rate to tune; a fallback of uniform weights while no regret is positive.
    """
    name = "normalhedge"
    full_information = True
    _GRID = np.geomspace(1e-6, 1e12, 64)

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.R_ = np.zeros(self.n_arms_)
        self.p_ = np.full(self.n_arms_, 1.0 / self.n_arms_)

    def _weights(self) -> np.ndarray:
        r = np.maximum(self.R_, 0.0)
        if not r.any():
            return np.full(self.n_arms_, 1.0 / self.n_arms_)
        r2 = (r * r)[:, None]
        # mean exp(r^2/2c) decreases in c: find the smallest grid c with value <= e, then refine
        def ok(cs):
            return np.mean(np.exp(np.minimum(r2 / (2.0 * cs[None, :]), 700.0)), axis=0) <= math.e
        g = self._GRID
        i = int(np.argmax(ok(g)))
        fine = np.geomspace(g[max(i - 1, 0)], g[i], 64)
        c = fine[int(np.argmax(ok(fine)))]
        w = (r / c) * np.exp(np.minimum(r * r / (2.0 * c), 700.0))
        return w / w.sum()

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        self.p_ = self._weights()
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        x = np.where(observed, np.nan_to_num(accepted), 0.0) / self.scale_
        self.R_ += x - float(self.p_ @ x)


# ---------------------------------------------------------------- contextual

class ThompsonCtx(_Policy):
    """Thompson sampling per workload with a Gaussian posterior on each drafter's mean accepted length.

    The research README's contextual policy: a separate bandit per workload, so it can follow
    a drafter ranking that flips between workloads. Posterior N(mean, s^2 / (n + n0)) with the
    sample variance s^2 (Welford) and a weak prior (n0 pseudo-blocks at k/2, variance (k/2)^2);
    draw one mean per drafter, pick the largest. Bandit feedback only.
    """
    name = "thompson_ctx"

    def __init__(self, prior_n: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.prior_n = prior_n

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        shape = (max(len(self.workloads_), 1), self.n_arms_)
        self.n_, self.mean_, self.m2_ = np.zeros(shape), np.zeros(shape), np.zeros(shape)

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        w, half = ctx.workload, self.scale_ / 2.0
        n, n0 = self.n_[w], self.prior_n
        mu = (n * self.mean_[w] + n0 * half) / (n + n0)
        var = (self.m2_[w] + n0 * half * half) / (n + n0)   # prior variance acts as n0 pseudo-observations
        draw = mu + np.sqrt(var / (n + n0)) * self.rng_.standard_normal(self.n_arms_)
        return int(np.argmax(draw))

    def update(self, ctx, chosen, accepted, observed) -> None:
        w, x = ctx.workload, float(accepted[chosen])
        self.n_[w, chosen] += 1
        d = x - self.mean_[w, chosen]
        self.mean_[w, chosen] += d / self.n_[w, chosen]
        self.m2_[w, chosen] += d * (x - self.mean_[w, chosen])


class HedgeCtx(Hedge):
    """Hedge per workload (full information): one independent `Hedge` learner per workload.

    The research README's contextual Hedge. Each workload's own clock sets its learning rate,
    so a rare workload is not starved by a frequent one.
    """
    name = "hedge_ctx"

    def reset(self, drafters, workloads, timing=None) -> None:
        _Policy.reset(self, drafters, workloads, timing)
        W = max(len(self.workloads_), 1)
        self.S_, self.T_ = np.zeros((W, self.n_arms_)), np.zeros(W)

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        w = ctx.workload
        eta = math.sqrt(8.0 * math.log(max(self.n_arms_, 2)) / (self.T_[w] + 1))
        z = eta * self.S_[w]
        return self._sample(np.exp(z - z.max()))

    def update(self, ctx, chosen, accepted, observed) -> None:
        w = ctx.workload
        self.T_[w] += 1
        self.S_[w] += np.where(observed, np.nan_to_num(accepted), 0.0) / self.scale_


class LinUCB(_Policy):
    """Disjoint LinUCB (Li et al. 2010) on a per-block context vector, bandit feedback.

    Context x = [workload one-hot, previous block's draft features (D x 4, NaN -> 0),
    previous block's acceptance / k (NaN -> 0), an observed flag per drafter]: what is known
    before drafting. One ridge regression per drafter (`ridge` prior), inverse kept by
    Sherman-Morrison updates; choose argmax theta.x + alpha sqrt(x A^-1 x).
    """
    name = "linucb"

    def __init__(self, alpha: float = 0.5, ridge: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.alpha, self.ridge = alpha, ridge

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        D, W = self.n_arms_, max(len(self.workloads_), 1)
        self.dim_ = W + 4 * D + 2 * D
        self.Ainv_ = np.repeat(np.eye(self.dim_)[None] / self.ridge, D, axis=0)   # (D, dim, dim)
        self.b_ = np.zeros((D, self.dim_))
        self.x_ = np.zeros(self.dim_)

    def _x(self, ctx) -> np.ndarray:
        D, W = self.n_arms_, self.dim_ - 6 * self.n_arms_
        x = np.zeros(self.dim_)
        x[ctx.workload] = 1.0
        f = np.asarray(ctx.prev_features, float).reshape(-1)
        a = np.asarray(ctx.prev_accepted, float)
        seen = ~np.isnan(a)
        x[W:W + 4 * D] = np.nan_to_num(f)
        x[W + 4 * D:W + 5 * D] = np.where(seen, np.nan_to_num(a) / self.scale_, 0.0)
        x[W + 5 * D:] = seen
        return x

    def choose(self, ctx) -> int:
        self._note_scale(ctx)
        x = self.x_ = self._x(ctx)
        Ax = self.Ainv_ @ x                                   # (D, dim)
        score = np.einsum("dk,dk->d", self.b_, Ax) + self.alpha * np.sqrt(np.maximum(Ax @ x, 0.0))
        return int(np.argmax(score))

    def update(self, ctx, chosen, accepted, observed) -> None:
        x, A = self.x_, self.Ainv_[chosen]
        Ax = A @ x
        A -= np.outer(Ax, Ax) / (1.0 + x @ Ax)
        self.b_[chosen] += (accepted[chosen] / self.scale_) * x


# ---------------------------------------------------------------- spec-select

@dataclass(frozen=True)
class StepTime:
    """Step time model: target verify time as a function of verified tokens, plus drafter calls.

    `verify_tokens`/`verify_ms` interpolate (linear, flat outside) one verification pass;
    `drafter_ms` is each drafter's call time. From the manifest's `timing` (docs/manifest.md)
    or, when absent, `StepTime.default`: verify 1 ms + 2% per extra token, lookup drafters
    0.01 ms, model drafters 0.1 ms (rho = 0.1, the research README's mid-range case).
    """
    verify_tokens: np.ndarray
    verify_ms: np.ndarray
    drafter_ms: np.ndarray        # (D,)
    measured: bool

    def verify(self, n_tokens) -> np.ndarray:
        return np.interp(n_tokens, self.verify_tokens, self.verify_ms)

    @staticmethod
    def from_timing(drafters: Sequence[str], lookup: np.ndarray, timing: dict | None) -> "StepTime":
        default = np.where(lookup, 0.01, 0.1)
        if not timing or "verify_ms" not in timing:
            return StepTime(np.array([1.0, 65.0]), np.array([1.0, 1.0 + 0.02 * 64]), default, False)
        v = timing["verify_ms"]
        tok, ms = np.asarray(v["tokens"], float), np.asarray(v["ms"], float)
        o = np.argsort(tok)
        dm = timing.get("drafter_ms") or {}
        d_ms = np.array([float(dm[d]) if d in dm else default[i] * ms[o][-1] for i, d in enumerate(drafters)])
        return StepTime(tok[o], ms[o], d_ms, True)


def expected_tokens(p: np.ndarray) -> np.ndarray:
    """(n,) per-position conditional acceptance -> (n + 1,) expected tokens of a draft cut to L = 0..n.

    A draft cut to L accepts min(accepted, L); tokens = accepted + the bonus token, and
    E[min(A, L)] = sum_{j <= L} P(A >= j) = sum_{j <= L} prod_{i < j} p_i.
    """
    return 1.0 + np.r_[0.0, np.cumsum(np.cumprod(p))]


def best_cut(tokens: np.ndarray, step_ms: np.ndarray) -> tuple[int, float]:
    """The cut L maximising log(expected tokens / step time); both (n + 1,) indexed by L = 0..n."""
    v = np.log(tokens) - np.log(step_ms)
    L = int(np.argmax(v))
    return L, float(v[L])


class SpecSelect(_Policy):
    """The spec-select rule (production PR in seeds/spec-select-pr.txt) adapted to block logs.

    Learns each drafter's acceptance per draft position (decayed hits and trials per position
    bucket), per prompt as the PR does per slot (a new prompt starts from the pooled estimate,
    `prior` pseudo-trials), from the drafts used, from lookup drafts not used and from the
    cut-off part of a used lookup draft (lookup drafts are compared with the text that follows
    at no cost, so their full acceptance is always seen; an unused model drafter is never
    called, so it is never seen: the class is full-information only for lookup drafters).
    Options: each lookup draft cut to its best length L (its length is known before choosing),
    each model drafter's full draft (assumed k long), or no draft. It maximises
    log(expected tokens / step time) under `StepTime` (manifest timing or stated defaults).
    `choose_batch` is the multi-sequence rule: maximise the sum of log(tokens / step time)
    over the step's sequences, no sequence more than `max_slowdown` slower than with every
    sequence on the model drafter.
    """
    name = "spec_select"
    full_information = True   # the replay must show lookup drafters; update() ignores unused model drafters

    def __init__(self, decay: float = 0.98, prior: float = 4.0, lookup: Sequence[str] | None = None,
                 max_slowdown: float = 0.10, pass_per_length: bool = True, random_state: int | None = 0):
        super().__init__(random_state)
        self.decay, self.prior, self.lookup = decay, prior, lookup
        self.max_slowdown, self.pass_per_length = max_slowdown, pass_per_length

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        names = self.lookup if self.lookup is not None else (timing or {}).get("lookup")
        if names is None:
            names = [d for d in self.drafters_ if any(k in d.lower() for k in LOOKUP_KINDS)]
        self.is_lookup_ = np.array([d in set(names) for d in self.drafters_])
        self.time_ = StepTime.from_timing(self.drafters_, self.is_lookup_, timing)
        self.k_ = int((timing or {}).get("k", 0))
        self.B_ = 64
        self.gH_, self.gT_ = np.zeros((self.n_arms_, self.B_)), np.zeros((self.n_arms_, self.B_))
        self.state_: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.last_value_ = np.zeros(0)

    def _p(self, prompt: int, d: int, n: int) -> np.ndarray:
        """(n,) per-position acceptance of drafter d for this prompt, shrunk to the pooled estimate."""
        g = (self.gH_[d, :n] + 1.0) / (self.gT_[d, :n] + 2.0)
        s = self.state_.get(prompt)
        if s is None:
            return g
        H, T = s
        return (H[d, :n] + self.prior * g) / (T[d, :n] + self.prior)

    def options(self, ctx) -> list[tuple[int, int, np.ndarray]]:
        """[(drafter, L, expected tokens per L)]: candidate drafts with their value curves."""
        k = max(self.k_, int(np.max(ctx.draft_len)) if len(ctx.draft_len) else 0, 1)
        self.k_ = k
        out = []
        for d in range(self.n_arms_):
            n = int(ctx.draft_len[d]) if self.is_lookup_[d] else k
            out.append((d, n, expected_tokens(self._p(ctx.prompt, d, n))))
        return out

    def _step_ms(self, d: int, n_verified: np.ndarray) -> np.ndarray:
        t = self.time_
        lookup_ms = float(t.drafter_ms[self.is_lookup_].sum())   # lookup drafts are always computed
        return t.verify(n_verified) + lookup_ms + (0.0 if self.is_lookup_[d] else t.drafter_ms[d])

    def choose(self, ctx):
        best = (-np.inf, 0, 0)
        for d, n, et in self.options(ctx):
            L = np.arange(n + 1)
            if self.is_lookup_[d]:
                Lb, v = best_cut(et, self._step_ms(d, L + 1))
            else:   # a model draft is verified whole (or not drafted at all: L = 0 via a lookup option)
                Lb, v = n, float(np.log(et[n]) - np.log(self._step_ms(d, np.array([n + 1]))[0]))
            if v > best[0]:
                best = (v, d, Lb)
        _, d, L = best
        return (d, L) if self.is_lookup_[d] else d

    def update(self, ctx, chosen, accepted, observed) -> None:
        seen = observed & (self.is_lookup_ | (np.arange(self.n_arms_) == chosen))
        s = self.state_.get(ctx.prompt)
        if s is None:
            s = self.state_[ctx.prompt] = (np.zeros((self.n_arms_, self.B_)), np.zeros((self.n_arms_, self.B_)))
        for d in np.flatnonzero(seen):
            a, n = int(accepted[d]), min(int(ctx.draft_len[d]), self.B_)
            if n == 0:
                continue
            m = min(a, n - 1)     # positions 0..a-1 accepted, position a (if drafted) rejected
            for H, T in (s, (self.gH_, self.gT_)):
                H[d] *= self.decay
                T[d] *= self.decay
                H[d, :min(a, n)] += 1.0
                T[d, :m + 1] += 1.0

    # ---------------------------------------------------------------- several sequences per step

    def batch_step_ms(self, choices: Sequence[tuple[int, int]]) -> float:
        """Step time of one batch: (drafter, verified draft tokens) per sequence.

        One verify pass per distinct verified length when `pass_per_length` (ubatches of a
        hybrid/recurrent target, the PR's case), else one pass at the longest; each model
        drafter called by any sequence once (batched), lookup drafters always.
        """
        t = self.time_
        lens = sorted({L + 1 for _, L in choices})
        verify = sum(float(t.verify(n)) for n in lens) if self.pass_per_length else float(t.verify(lens[-1]))
        models = {d for d, L in choices if not self.is_lookup_[d] and L > 0}
        return verify + float(t.drafter_ms[self.is_lookup_].sum()) + sum(float(t.drafter_ms[d]) for d in models)

    def choose_batch(self, ctxs: Sequence) -> list:
        """Joint choice for S sequences in one step (brute force over each one's best options)."""
        import itertools
        per_seq, model_ref = [], []
        for ctx in ctxs:
            opts = self.options(ctx)
            cands = {}
            for d, n, et in opts:
                if self.is_lookup_[d]:
                    # best cut ignoring batch effects, plus "no draft": the batch may prefer either
                    v = np.log(et) - np.log(self._step_ms(d, np.arange(n + 1) + 1))
                    cands[(d, int(np.argmax(v)))] = float(et[int(np.argmax(v))])
                    cands[(d, 0)] = float(et[0])
                else:
                    cands[(d, n)] = float(et[n])
            per_seq.append(cands)
            models = [(d, n, float(et[n])) for d, n, et in opts if not self.is_lookup_[d]]
            model_ref.append(max(models, key=lambda x: x[2]) if models else (0, 0, 1.0))
        base = [(d, n) for d, n, _ in model_ref]
        base_ms = self.batch_step_ms(base)
        floor = np.array([e for _, _, e in model_ref]) / base_ms * (1.0 - self.max_slowdown)
        best, best_v = base, -np.inf
        for combo in itertools.product(*[list(c.items()) for c in per_seq]):
            ms = self.batch_step_ms([c for c, _ in combo])
            rates = np.array([e for _, e in combo]) / ms
            if np.all(rates >= floor - 1e-12):
                v = float(np.log(rates).sum())
                if v > best_v:
                    best, best_v = [c for c, _ in combo], v
        return [(d, L) if self.is_lookup_[d] else d for d, L in best]


ALL = (UCB1, EXP3, Hedge, NormalHedge, ThompsonCtx, HedgeCtx, LinUCB, SpecSelect, Random)


def make_policies(random_state: int = 0) -> list[_Policy]:
    """One instance of every learning policy (baselines needing hindsight are built in core.py)."""
    return [cls(random_state=random_state) for cls in ALL]
