"""The policies' shared base and the classic bandits: Random, Fixed, UCB1, EXP3, Hedge, NormalHedge.

A policy (the `bandit.logs.schema.Policy` protocol) sees a `Context` before drafting at a block start
(workload, prompt, position, the previous block's acceptance and draft features, the draft lengths
lookup drafters know), picks a drafter (or a drafter and a cut length L: a draft cut to L accepts
min(accepted, L)), and then learns from what the verification revealed: `accepted (D,)` with NaN
where unobserved. The walk (bandit/policies/walk.py) enforces the feedback model: a bandit policy
(`full_information = False`) sees only the drafter it chose; a full-information one sees every
drafter (panoramic feedback).

Rewards are accepted tokens; learners that need rewards in [0, 1] divide by k (the `Timing`
given to `reset`, else the longest draft at the first block). Every class is sklearn-style:
hyperparameters in `__init__` (`get_params`, `clone`), all state created in `reset` (attributes
with a trailing underscore), `random_state` seeds the only randomness. The published per-request
rules are in bandit/policies/published.py, spec-select in bandit/policies/specselect.py, and bandit/policies/registry.py
lists them all.

    python bandit/policies/bandits.py      # the classic bandits on a small simulated campaign with ranking flips [SIM]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/bandits.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import inspect
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bandit.logs.schema import Timing, lookup_drafters


class BasePolicy:
    """Shared plumbing: names, the seeded generator, the reward scale k.

    The per-block loops run 100k+ times per replay, so learners keep their D-sized state in
    Python lists: for D ~ 4 that is several times faster than numpy calls on tiny arrays.
    """

    name = "policy"
    full_information = False

    def __init__(self, random_state: int | None = 0):
        self.random_state = random_state

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: Timing | None = None) -> None:
        self.drafters_, self.workloads_ = tuple(drafters), tuple(workloads)
        self.n_arms_ = len(self.drafters_)
        self.rng_ = np.random.default_rng(self.random_state)
        self.scale_ = float(timing.k if timing is not None else 0)  # 0: learn k from the first draft lengths seen
        self.t_ = 0

    def _scale(self, ctx) -> float:
        if self.scale_ <= 0:
            self.scale_ = float(max(int(np.max(ctx.draft_len)), 1)) if len(ctx.draft_len) else 1.0
        return self.scale_

    def _sample(self, w: list[float]) -> int:
        # inverse CDF with one uniform: cheaper than rng.choice and stable across numpy versions
        u = self.rng_.random() * sum(w)
        c = 0.0
        for i, x in enumerate(w):
            c += x
            if u < c:
                return i
        return len(w) - 1

    def get_params(self) -> dict:
        """The constructor's arguments (the hyperparameters), as in scikit-learn."""
        return {k: getattr(self, k) for k in inspect.signature(type(self).__init__).parameters if k != "self"}

    def clone(self, **changes) -> "BasePolicy":
        """An unfitted copy with the same hyperparameters, `changes` applied (e.g. random_state)."""
        return type(self)(**{**self.get_params(), **changes})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"


def rewards(accepted: np.ndarray, observed: np.ndarray, scale: float) -> list[float]:
    """Observed rewards in [0, 1] as a list (0 where unobserved; callers mask by `observed`)."""
    return [x / scale if o else 0.0 for x, o in zip(accepted.tolist(), observed.tolist())]


def exp_weights(s: list[float], eta: float) -> list[float]:
    m = max(s)
    return [math.exp(eta * (x - m)) for x in s]


# ---------------------------------------------------------------- baselines


class Random(BasePolicy):
    """Uniform random drafter at every block: the floor every learner must clear."""

    name = "random"

    def choose(self, ctx) -> int:
        return int(self.rng_.integers(self.n_arms_))

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


class Fixed(BasePolicy):
    """Always the same drafter, or one drafter per workload (`arms` indexed by workload).

    With the arm picked in hindsight this is docs/DESIGN.md's best fixed drafter (one arm) or the
    workload-level hindsight oracle (one arm per workload); core.hindsight_traces computes the
    same choices vectorised (tests/test_core.py checks that they agree).
    """

    name = "fixed"
    all_drafters = True  # a baseline: its arms index every drafter, trees included (walk.arms_only)

    def __init__(self, arms: int | Sequence[int] = 0, name: str = "fixed", random_state: int | None = 0):
        super().__init__(random_state)
        self.arms, self.name = arms, name

    def choose(self, ctx) -> int:
        return int(self.arms) if np.ndim(self.arms) == 0 else int(self.arms[ctx.workload])

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


# ---------------------------------------------------------------- non-contextual prior art


class UCB1(BasePolicy):
    """Our single-stream variant of UCB1 (Auer et al. 2002), not the published algorithm.

    Not BanditSpec's UCBSpec (that is `UCBSpec` below): one learner over every prompt of the
    campaign, never reset; reward accepted / k; bonus c * sqrt(2 ln t / n) with t the blocks
    seen so far in the whole stream. Bandit feedback; every drafter is tried once first. It
    converges to the best fixed drafter, which is also its ceiling when rankings flip
    between workloads.
    """

    name = "ucb_stream"

    def __init__(self, c: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.c = c

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.n_, self.sum_ = [0] * self.n_arms_, [0.0] * self.n_arms_

    def choose(self, ctx) -> int:
        k = self._scale(ctx)
        n = self.n_
        if 0 in n:
            return n.index(0)
        lt = 2.0 * math.log(self.t_)
        u = [s / (m * k) + self.c * math.sqrt(lt / m) for s, m in zip(self.sum_, n)]
        return u.index(max(u))

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.n_[chosen] += 1
        self.sum_[chosen] += float(accepted[chosen])


class EXP3(BasePolicy):
    """Our single-stream variant of EXP3 (Auer et al. 2002), not the published algorithm.

    Not BanditSpec's EXP3Spec (that is `EXP3Spec` below): one learner over every prompt,
    never reset; exponential weights on importance-weighted reward estimates (accepted / k)
    mixed with uniform exploration at the anytime rate gamma_t = min(1, sqrt(K ln K /
    ((e - 1) t))), t counted over the whole stream. EXP3Spec has no uniform mixing, uses
    losses and eta_t = sqrt(ln K / (t K)), and restarts per request. Bandit feedback only.
    """

    name = "exp3_stream"

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        K = self.n_arms_
        self.s_ = [0.0] * K  # cumulative importance-weighted rewards in [0, 1] units
        self.p_ = [1.0 / K] * K
        self.c_ = K * math.log(max(K, 2)) / (math.e - 1)

    def choose(self, ctx) -> int:
        self._scale(ctx)
        K = self.n_arms_
        g = min(1.0, math.sqrt(self.c_ / (self.t_ + 1)))
        w = exp_weights(self.s_, g / K)
        z = sum(w)
        self.p_ = [(1 - g) * x / z + g / K for x in w]
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_[chosen] += (float(accepted[chosen]) / self.scale_) / self.p_[chosen]


class Hedge(BasePolicy):
    """Our single-stream variant of full-information Hedge, not the published algorithm.

    Not HedgeSpec ("Not-a-Bandit", arXiv 2510.20064), which competes with the best drafter
    per query (`HedgeQuery` below restarts per prompt; HedgeSpec's experiments run
    NormalHedge): this is one learner over every prompt, never reset, so it competes with
    the best fixed drafter of the whole campaign. Every drafter's acceptance is known once
    the block is verified (panoramic feedback), so every weight is updated; the anytime
    learning rate eta_t = sqrt(8 ln K / t) on rewards accepted / k in [0, 1] gives
    O(sqrt(T ln K)) regret against the best fixed drafter. It samples its choice from the
    weights with `random_state`.
    """

    name = "hedge_stream"
    full_information = True

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.s_ = [0.0] * self.n_arms_
        self.c_ = 8.0 * math.log(max(self.n_arms_, 2))

    def choose(self, ctx) -> int:
        self._scale(ctx)
        self.w_ = exp_weights(self.s_, math.sqrt(self.c_ / (self.t_ + 1)))  # unnormalised: for pseudo-regret
        return self._sample(self.w_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_ = [a + b for a, b in zip(self.s_, rewards(accepted, observed, self.scale_))]


class NormalHedge(BasePolicy):
    """NormalHedge (Chaudhuri, Freund & Hsu 2009): a parameter-free full-information learner.

    Weights w_i ~ ([R_i]_+ / c) exp([R_i]_+^2 / 2c) on cumulative regrets R_i against its own
    expected reward, with c solving mean_i exp([R_i]_+^2 / 2c) = e. The scale is solved by
    Newton's method on u = 1/c, warm-started from the previous step: log-mean-exp is convex
    and increasing in u, so the iteration is monotone after one step. Uniform while no
    regret is positive. No learning rate to tune. One learner over every prompt (HedgeSpec's
    experiments also use NormalHedge, but against the best drafter per query).
    """

    name = "normalhedge"
    full_information = True

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        K = self.n_arms_
        self.R_, self.p_, self.u_ = [0.0] * K, [1.0 / K] * K, 1.0

    def _solve_u(self, a: list[float]) -> float:
        """u with log(mean exp(a_i u)) = 1, a_i = r_i^2 / 2 >= 0, some a_i > 0."""
        logK, amax, u = math.log(len(a)), max(a), self.u_
        for _ in range(50):
            e = [math.exp((x - amax) * u) for x in a]
            z = sum(e)
            g = amax * u + math.log(z) - logK - 1.0
            gp = sum(x * y for x, y in zip(a, e)) / z
            step = g / gp
            u -= step
            if u <= 0.0:
                u = (u + step) * 0.5  # Newton from the left of the root can overshoot past 0
            if abs(step) <= 1e-10 * u:
                break
        return u

    def choose(self, ctx) -> int:
        self._scale(ctx)
        r = [x if x > 0.0 else 0.0 for x in self.R_]
        if max(r) <= 0.0:
            self.p_ = [1.0 / self.n_arms_] * self.n_arms_
        else:
            a = [x * x / 2.0 for x in r]
            u = self.u_ = self._solve_u(a)
            amax = max(a)
            w = [x * math.exp((y - amax) * u) for x, y in zip(r, a)]  # the common 1/c cancels
            z = sum(w)
            self.p_ = [x / z for x in w]
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        x = rewards(accepted, observed, self.scale_)
        mean = sum(p * y for p, y in zip(self.p_, x))
        self.R_ = [R + y - mean for R, y in zip(self.R_, x)]


# ---------------------------------------------------------------- published per-request rules


# ---------------------------------------------------------------- what the cost-aware rules share


def lookup_mask(drafters: Sequence[str], timing: Timing | None) -> np.ndarray:
    """(D,) bool: which drafters are lookups, by the run's `Timing` (its manifest), else by name."""
    names = timing.lookup if timing is not None else lookup_drafters(drafters, None)
    return np.array([d in set(names) for d in drafters], bool)


def step_ms_table(drafters: Sequence[str], timing: Timing | None, k: int) -> list[list[float]] | None:
    """ms[d][n]: modelled time of one step of drafter d whose draft of n tokens (0..k) is verified
    with the bonus token (`StepTime`: verify(n + 1) + drafter_ms[d]); None when `timing` has no
    verification or no drafter times (then there is no measured step time to divide by)."""
    if timing is None or not timing.measured:
        return None
    st = StepTime.from_timing(drafters, lookup_mask(drafters, timing), timing)
    v = st.verify(np.arange(k + 1) + 1.0)
    return (v[None, :] + st.drafter_ms[:, None]).tolist()


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
    drafter_ms: np.ndarray  # (D,)
    measured: bool

    def verify(self, n_tokens) -> np.ndarray:
        return np.interp(n_tokens, self.verify_tokens, self.verify_ms)

    @staticmethod
    def from_timing(drafters: Sequence[str], lookup: np.ndarray, timing: Timing | None) -> "StepTime":
        default = np.where(lookup, 0.01, 0.1)
        if timing is None or not timing.verify_ms:
            return StepTime(np.array([1.0, 65.0]), np.array([1.0, 1.0 + 0.02 * 64]), default, False)
        tok, ms = np.asarray(timing.verify_tokens, float), np.asarray(timing.verify_ms, float)
        dm = timing.drafter_ms
        d_ms = np.array([float(dm[d]) if d in dm else default[i] * ms[-1] for i, d in enumerate(drafters)])
        return StepTime(tok, ms, d_ms, True)


if __name__ == "__main__":
    from bandit.policies.walk import policies_demo

    policies_demo([Random(), UCB1(), EXP3(), Hedge(), NormalHedge()], "bandits")
