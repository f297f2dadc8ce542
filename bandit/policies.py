"""Drafter-selection policies behind one interface (the `Policy` protocol of bandit/replay.py).

A policy sees a `Context` before drafting at a block start (workload, prompt, position, the
previous block's acceptance and draft features, the draft lengths lookup drafters know), picks
a drafter (or a drafter and a cut length L: a draft cut to L accepts min(accepted, L)), and
then learns from what the verification revealed: `accepted (D,)` with NaN where unobserved.
The replay enforces the feedback model: a bandit policy (`full_information = False`) sees only
the drafter it chose; a full-information one sees every drafter (panoramic feedback).

Rewards are accepted tokens; learners that need rewards in [0, 1] divide by k (from the
`timing` dict given to `reset`, else the longest draft at the first block). The published
per-request rules (`UCBSpec`, `EXP3Spec` of BanditSpec; `HedgeQuery` after HedgeSpec) restart
at every new prompt and, by default, reward the tokens of a block, accepted + 1, as their
papers define; the `*_stream` learners are our single-stream variants (one learner over all
prompts), not the published algorithms. Every class is
sklearn-style: hyperparameters in `__init__` (`get_params`, `clone`), all state created in
`reset` (attributes with a trailing underscore), `random_state` seeds the only randomness.

    python bandit/policies.py      # every policy on a small simulated campaign with ranking flips [SIM]
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bandit.replay import LOOKUP_KINDS


class _Policy:
    """Shared plumbing: names, the seeded generator, the reward scale k.

    The per-block loops run 100k+ times per replay, so learners keep their D-sized state in
    Python lists: for D ~ 4 that is several times faster than numpy calls on tiny arrays.
    """
    name = "policy"
    full_information = False

    def __init__(self, random_state: int | None = 0):
        self.random_state = random_state

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: dict | None = None) -> None:
        self.drafters_, self.workloads_ = tuple(drafters), tuple(workloads)
        self.n_arms_ = len(self.drafters_)
        self.rng_ = np.random.default_rng(self.random_state)
        self.scale_ = float((timing or {}).get("k") or 0)   # 0: learn k from the first draft lengths seen
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
        import inspect
        return {k: getattr(self, k) for k in inspect.signature(type(self).__init__).parameters if k != "self"}

    def clone(self, **changes) -> "_Policy":
        """An unfitted copy with the same hyperparameters, `changes` applied (e.g. random_state)."""
        return type(self)(**{**self.get_params(), **changes})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"


def _rewards(accepted: np.ndarray, observed: np.ndarray, scale: float) -> list[float]:
    """Observed rewards in [0, 1] as a list (0 where unobserved; callers mask by `observed`)."""
    return [x / scale if o else 0.0 for x, o in zip(accepted.tolist(), observed.tolist())]


def _exp_weights(s: list[float], eta: float) -> list[float]:
    m = max(s)
    return [math.exp(eta * (x - m)) for x in s]


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

    With the arm picked in hindsight this is docs/DESIGN.md's best fixed drafter (one arm) or the
    workload-level hindsight oracle (one arm per workload); core.hindsight_traces computes the
    same choices vectorised (tests/test_core.py checks that they agree).
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


class EXP3(_Policy):
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
        self.s_ = [0.0] * K   # cumulative importance-weighted rewards in [0, 1] units
        self.p_ = [1.0 / K] * K
        self.c_ = K * math.log(max(K, 2)) / (math.e - 1)

    def choose(self, ctx) -> int:
        self._scale(ctx)
        K = self.n_arms_
        g = min(1.0, math.sqrt(self.c_ / (self.t_ + 1)))
        w = _exp_weights(self.s_, g / K)
        z = sum(w)
        self.p_ = [(1 - g) * x / z + g / K for x in w]
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_[chosen] += (float(accepted[chosen]) / self.scale_) / self.p_[chosen]


class Hedge(_Policy):
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
        self.w_ = _exp_weights(self.s_, math.sqrt(self.c_ / (self.t_ + 1)))   # unnormalised: for pseudo-regret
        return self._sample(self.w_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        self.s_ = [a + b for a, b in zip(self.s_, _rewards(accepted, observed, self.scale_))]


class NormalHedge(_Policy):
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
                u = (u + step) * 0.5   # Newton from the left of the root can overshoot past 0
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
            w = [x * math.exp((y - amax) * u) for x, y in zip(r, a)]   # the common 1/c cancels
            z = sum(w)
            self.p_ = [x / z for x in w]
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        self.t_ += 1
        x = _rewards(accepted, observed, self.scale_)
        mean = sum(p * y for p, y in zip(self.p_, x))
        self.R_ = [R + y - mean for R, y in zip(self.R_, x)]


# ---------------------------------------------------------------- published per-request rules

def _lookup_mask(drafters: Sequence[str], timing: dict | None) -> np.ndarray:
    """Which drafters are lookups: the timing dict's `lookup` list, else the name heuristic."""
    names = (timing or {}).get("lookup")
    if names is None:
        return np.array([any(k in d.lower() for k in LOOKUP_KINDS) for d in drafters])
    return np.array([d in set(names) for d in drafters])


def _step_ms_table(drafters: Sequence[str], timing: dict | None, k: int) -> list[list[float]] | None:
    """ms[d][n]: modelled time of one step of drafter d whose draft of n tokens (0..k) is verified
    with the bonus token (`StepTime`: verify(n + 1) + drafter_ms[d]); None when `timing` has no
    `verify_ms` or no `drafter_ms` (then there is no measured step time to divide by)."""
    if not timing or "verify_ms" not in timing or not timing.get("drafter_ms"):
        return None
    st = StepTime.from_timing(drafters, _lookup_mask(drafters, timing), timing)
    v = st.verify(np.arange(k + 1) + 1.0)
    return (v[None, :] + st.drafter_ms[:, None]).tolist()


class UCBSpec(_Policy):
    """UCBSpec of BanditSpec (Hou et al., ICML 2025, arXiv 2505.15141): Alg. 4 / Alg. 8, eqs. (5)-(7).

    Per request: BanditSpec (Alg. 3) runs one decoding of one prompt, and Alg. 8 starts every
    prompt from t = 0 and an empty history, as the released code (sail-sg/BanditSpec,
    `ucb_length_spec_generate`) zeroes its statistics in every generate call. So all statistics
    restart whenever `ctx.prompt` changes. Within a prompt, with t rounds played (Alg. 8):
    rounds t < K try the drafters in order (round robin); then the drafter maximising

        UCB_i = mu_i + cr_i,  cr_i = sigma * sqrt((1 + n_i) / n_i^2 * (1 + 2 ln(K t^2 sqrt(1 + n_i) / delta)))

    is used, mu_i the mean reward and n_i the pulls of drafter i in this prompt (eq. 5). The
    radius is eq. (6) (eq. 19): Lemma F.3's self-normalised bound (Abbasi-Yadkori et al. 2011,
    1-sub-Gaussian) scaled by sigma = L / 2, the sub-Gaussian scale of a reward in [1, L + 1]
    (proof of Thm 4.3, step 2), with delta / t^2 per round; L is the maximum draft length, k.
    (The text we read, arXiv's HTML of v2, drops radicals and fraction bars; sigma = L / 2 under
    the square root is the reading consistent with eq. (33), n <= 4 + 2 L^2 / Delta^2 (...).)

    Reward (`reward="tokens"`, the default): Y = accepted + 1, the block's accepted tokens plus
    the bonus token (Alg. 4 line 2, eq. 5: the length of SpecDecSub's output). That is the
    algorithm as defined and analysed, and the paper's drafter-selection experiment (Sec. 6.1)
    states no other reward. `reward="throughput"` is Sec. 6.2's use (speculation lengths, the
    only UCBSpec code released): tokens per unit time of the step, here (accepted + 1) divided
    by the modelled step time of `StepTime` (verify(draft length + 1) + drafter_ms, from the
    `timing` dict given to `reset`; the draft length is the chosen drafter's, read after it
    drafted). When `timing` has no `verify_ms` or no `drafter_ms` the throughput variant falls
    back to tokens per step (accepted + 1) and says so in `throughput_ = False`.

    Choices the paper leaves open, made here: delta = 1/2 (the value the proof of Thm 4.3
    takes; no experiment reports delta); for the throughput reward sigma is half the range of
    (n + 1) / step_ms(d, n) over drafters and draft lengths (the paper's radius assumes a
    reward in [1, L + 1]; the released code instead adds sqrt(6 ln t / sum_i n_i), the same
    bonus for every arm); ties go to the lowest index; natural logarithms. A drafter that
    proposes no draft still yields Y = 1. Bandit feedback only.
    """
    name = "ucbspec"

    def __init__(self, delta: float = 0.5, reward: str = "tokens", random_state: int | None = 0):
        super().__init__(random_state)
        if reward not in ("tokens", "throughput"):
            raise ValueError(f"reward must be 'tokens' or 'throughput', got {reward!r}")
        self.delta, self.reward = delta, reward
        self.name = "ucbspec" if reward == "tokens" else "ucbspec_throughput"

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.timing_ = timing
        self.step_ms_: list[list[float]] | None = None
        self.throughput_ = False
        self.sigma_ = 0.0         # set at the first block, once k is known
        self.prompt_ = None
        self._restart()

    def _restart(self) -> None:
        K = self.n_arms_
        self.t_, self.n_, self.sum_, self.ucb_ = 0, [0] * K, [0.0] * K, [math.inf] * K

    def _init_scale(self, ctx) -> None:
        k = int(self._scale(ctx))
        if self.reward == "throughput":
            self.step_ms_ = _step_ms_table(self.drafters_, self.timing_, k)
        self.throughput_ = self.step_ms_ is not None
        if self.throughput_:
            hi = max(max((n + 1) / ms for n, ms in enumerate(row)) for row in self.step_ms_)
            lo = min(1.0 / ms for row in self.step_ms_ for ms in row)
            self.sigma_ = (hi - lo) / 2.0
        else:
            self.sigma_ = k / 2.0             # Y in [1, L + 1]: sigma = L / 2

    def choose(self, ctx) -> int:
        if ctx.prompt != self.prompt_:        # a new request: BanditSpec starts from scratch
            self.prompt_ = ctx.prompt
            self._restart()
        if not self.sigma_:
            self._init_scale(ctx)
        t, K = self.t_, self.n_arms_
        if t < K:
            return t                          # round robin (Alg. 8, lines 4-5)
        lg = math.log(K * t * t / self.delta)
        sig, best, arg = self.sigma_, -math.inf, 0
        u = self.ucb_
        for i, (s, m) in enumerate(zip(self.sum_, self.n_)):
            if m == 0:
                return i
            x = u[i] = s / m + sig * math.sqrt((1.0 + m) / (m * m) * (1.0 + 2.0 * (lg + 0.5 * math.log(1.0 + m))))
            if x > best:
                best, arg = x, i
        return arg

    def update(self, ctx, chosen, accepted, observed) -> None:
        y = float(accepted[chosen]) + 1.0
        if self.throughput_:
            row = self.step_ms_[chosen]
            y /= row[min(max(int(ctx.draft_len[chosen]), 0), len(row) - 1)]
        self.t_ += 1
        self.n_[chosen] += 1
        self.sum_[chosen] += y


class EXP3Spec(_Policy):
    """EXP3Spec of BanditSpec (Hou et al., ICML 2025, arXiv 2505.15141): Alg. 5 / Alg. 9, eqs. (13)-(14), (21)-(22).

    Anytime EXP3 written as FTRL on losses (Lattimore & Szepesvari 2020), restarted per
    request like every BanditSpec learner (Alg. 9 starts each prompt from t = 0, empty
    history): statistics restart whenever `ctx.prompt` changes. At round t = 1, 2, ... of a
    prompt, with eta_t = sqrt(ln K / (t K)) (Alg. 9 inputs, eq. 43),

        p_t,i = exp(-eta_t Zsum_i) / sum_j exp(-eta_t Zsum_j)       (eq. 14 / 21)

    with Zsum_i the sum over earlier rounds of this prompt of the importance-weighted loss
    Z_i,s = 1{i = I_s} (L + 1 - Y_s) / (L p_s,i) (eq. 13 / 22), Y = accepted + 1 the tokens of
    the block (accepted plus bonus, in [1, L + 1]) and L the maximum draft length k. The
    drafter is drawn from p_t with `random_state`. No uniform exploration is mixed in (unlike
    `EXP3`), so the first round of every prompt is uniform and nothing else forces exploration.

    Choices the paper leaves open: the sampling uses one uniform draw per round (inverse CDF);
    Y is clipped to [1, L + 1] should a log report more accepted tokens than k. The paper
    defines EXP3Spec's reward as tokens only (Sec. 6.2's throughput reward is used with
    UCBSpec alone), so there is no throughput option. Bandit feedback only.
    """
    name = "exp3spec"

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.prompt_ = None
        self._restart()

    def _restart(self) -> None:
        K = self.n_arms_
        self.t_, self.Z_, self.p_ = 0, [0.0] * K, [1.0 / K] * K

    def choose(self, ctx) -> int:
        if ctx.prompt != self.prompt_:
            self.prompt_ = ctx.prompt
            self._restart()
        self._scale(ctx)
        K = self.n_arms_
        eta = math.sqrt(math.log(K) / ((self.t_ + 1) * K))
        m = min(self.Z_)
        w = [math.exp(-eta * (z - m)) for z in self.Z_]
        s = sum(w)
        self.p_ = [x / s for x in w]
        return self._sample(self.p_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        L = self.scale_
        y = min(max(float(accepted[chosen]) + 1.0, 1.0), L + 1.0)
        self.t_ += 1
        self.Z_[chosen] += (L + 1.0 - y) / (L * self.p_[chosen])


class HedgeQuery(_Policy):
    """Full-information Hedge restarted per query, after HedgeSpec ("Not-a-Bandit", Liu et al., ICLR 2026, arXiv 2510.20064).

    HedgeSpec competes with the best drafter in hindsight for each query (abstract; Thm 4 of
    v2 as summarised in the sources we could read): one verified trajectory scores every
    drafter (panoramic feedback), and a full-information learner (Hedge, or NormalHedge in
    its experiments) follows the drafter with the least loss within the query. Here: the
    weights restart at uniform whenever `ctx.prompt` changes; at round t of a prompt,

        w_i = exp(eta_t S_i),  eta_t = sqrt(8 ln N / t),  S_i = sum over this prompt of (a_i + 1) / (k + 1)

    with a_i drafter i's accepted tokens at a block, so the reward is one minus HedgeSpec's
    acceptance-length loss f = 1 - AcceptLength / (K + 1) (AcceptLength in [1, K + 1], K the
    draft depth, here k). The drafter is drawn from w with `random_state`; `w_` is kept
    (unnormalised) for `core.regret_curve`.

    What we could not take from the paper, stated plainly: we could read only the abstract and
    secondary summaries of arXiv 2510.20064, not its equations, so the learning rate is the
    standard anytime rate for losses in [0, 1] (Cesa-Bianchi & Lugosi 2006, Thm 2.3; the same as
    `Hedge`), not one checked against the paper, and HedgeSpec's experiments use NormalHedge,
    which has no learning rate. HedgeSpec scores every drafter by the expected acceptance
    length from acceptance probabilities and treats censored feedback as delayed (Joulani et
    al. 2013); the replay instead reveals each drafter's realised acceptance at the block
    (its full-information feedback model), so neither the estimator nor the delay is modelled.
    """
    name = "hedge_query"
    full_information = True

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        self.c_ = 8.0 * math.log(self.n_arms_)
        self.prompt_ = None
        self._restart()

    def _restart(self) -> None:
        self.t_, self.S_, self.w_ = 0, [0.0] * self.n_arms_, [1.0] * self.n_arms_

    def choose(self, ctx) -> int:
        if ctx.prompt != self.prompt_:
            self.prompt_ = ctx.prompt
            self._restart()
        self._scale(ctx)
        self.w_ = _exp_weights(self.S_, math.sqrt(self.c_ / (self.t_ + 1)))   # unnormalised: for pseudo-regret
        return self._sample(self.w_)

    def update(self, ctx, chosen, accepted, observed) -> None:
        k1 = self.scale_ + 1.0
        self.t_ += 1
        self.S_ = [s + ((a + 1.0) / k1 if o else 0.0)
                   for s, a, o in zip(self.S_, accepted.tolist(), observed.tolist())]


# ---------------------------------------------------------------- contextual

class ThompsonCtx(_Policy):
    """Thompson sampling per workload, Gaussian posterior on each drafter's mean accepted length.

    The research README's contextual policy: a separate bandit per workload, so it can follow
    a drafter ranking that flips between workloads. Posterior N(m, s^2 / (n + n0)) from the
    sample mean and variance (Welford) with a weak prior (n0 pseudo-blocks at k/2 with
    variance (k/2)^2); one mean drawn per drafter, the largest wins. Bandit feedback only.
    """
    name = "thompson_ctx"

    def __init__(self, prior_n: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.prior_n = prior_n

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        W, D = max(len(self.workloads_), 1), self.n_arms_
        self.n_ = [[0.0] * D for _ in range(W)]
        self.mean_ = [[0.0] * D for _ in range(W)]
        self.m2_ = [[0.0] * D for _ in range(W)]

    def choose(self, ctx) -> int:
        half = self._scale(ctx) / 2.0
        w, n0 = ctx.workload, self.prior_n
        z = self.rng_.standard_normal(self.n_arms_).tolist()
        best, arg = -math.inf, 0
        for d, (n, m, m2, e) in enumerate(zip(self.n_[w], self.mean_[w], self.m2_[w], z)):
            nn = n + n0
            mu = (n * m + n0 * half) / nn
            var = (m2 + n0 * half * half) / nn    # the prior variance counts as n0 observations
            x = mu + math.sqrt(var / nn) * e
            if x > best:
                best, arg = x, d
        return arg

    def update(self, ctx, chosen, accepted, observed) -> None:
        w, c, x = ctx.workload, chosen, float(accepted[chosen])
        n = self.n_[w][c] = self.n_[w][c] + 1
        d = x - self.mean_[w][c]
        self.mean_[w][c] += d / n
        self.m2_[w][c] += d * (x - self.mean_[w][c])


class HedgeCtx(_Policy):
    """Hedge per workload (full information): one independent `Hedge` learner per workload.

    The research README's contextual Hedge. Each workload's own clock sets its learning rate,
    so a rare workload is not starved by a frequent one.
    """
    name = "hedge_ctx"
    full_information = True

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        W = max(len(self.workloads_), 1)
        self.S_, self.T_ = [[0.0] * self.n_arms_ for _ in range(W)], [0] * W
        self.c_ = 8.0 * math.log(max(self.n_arms_, 2))

    def choose(self, ctx) -> int:
        self._scale(ctx)
        w = ctx.workload
        return self._sample(_exp_weights(self.S_[w], math.sqrt(self.c_ / (self.T_[w] + 1))))

    def update(self, ctx, chosen, accepted, observed) -> None:
        w = ctx.workload
        self.T_[w] += 1
        self.S_[w] = [a + b for a, b in zip(self.S_[w], _rewards(accepted, observed, self.scale_))]


class LinUCB(_Policy):
    """Disjoint LinUCB (Li et al. 2010) on a per-block context vector, bandit feedback.

    Context x = [workload one-hot, previous block's draft features (D x 4, NaN -> 0),
    previous block's acceptance / k (NaN -> 0), an observed flag per drafter]: what is known
    before drafting. One ridge regression per drafter (`ridge` prior) whose inverse is kept
    by Sherman-Morrison updates; choose argmax theta.x + alpha sqrt(x A^-1 x).
    """
    name = "linucb"

    def __init__(self, alpha: float = 0.5, ridge: float = 1.0, random_state: int | None = 0):
        super().__init__(random_state)
        self.alpha, self.ridge = alpha, ridge

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        D, W = self.n_arms_, max(len(self.workloads_), 1)
        self.dim_ = dim = W + 6 * D
        # per drafter [A^-1 ; theta] stacked, so that one batched product gives A^-1 x and theta.x
        self.Z_ = np.concatenate([np.repeat(np.eye(dim)[None] / self.ridge, D, axis=0), np.zeros((D, 1, dim))], axis=1)
        self.onehot_ = np.eye(W)
        self.x_, self.Zx_ = np.zeros(dim), np.zeros((D, dim + 1))

    @property
    def Ainv_(self) -> np.ndarray:
        """(D, dim, dim) inverse of each drafter's ridge Gram matrix."""
        return self.Z_[:, :-1]

    @property
    def theta_(self) -> np.ndarray:
        """(D, dim) ridge estimate A^-1 b of each drafter."""
        return self.Z_[:, -1]

    def _x(self, ctx) -> np.ndarray:
        a = ctx.prev_accepted
        x = np.concatenate((self.onehot_[ctx.workload], ctx.prev_features.ravel(), a / self.scale_, a == a))
        x[np.isnan(x)] = 0.0
        return x

    def choose(self, ctx) -> int:
        self._scale(ctx)
        x = self.x_ = self._x(ctx)
        Zx = self.Zx_ = self.Z_ @ x                          # (D, dim + 1): [A^-1 x, theta.x]
        score = Zx[:, -1] + self.alpha * np.sqrt(np.maximum(Zx[:, :-1] @ x, 0.0))
        return int(score.argmax())

    def update(self, ctx, chosen, accepted, observed) -> None:
        # Sherman-Morrison on A^-1 and the matching recursive least-squares step on theta
        x, Zx = self.x_, self.Zx_[chosen]
        Ax, thx = Zx[:-1], Zx[-1]
        denom = 1.0 + float(x @ Ax)
        Z = self.Z_[chosen]
        Z[:-1] -= np.outer(Ax, Ax / denom)
        Z[-1] += Ax * ((float(accepted[chosen]) / self.scale_ - thx) / denom)


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


@dataclass
class _Tables:
    """Decayed (hits, trials) per drafter and draft position, D lists of k floats.

    Decay is lazy: each drafter's row holds counts divided by a running scale `c` (true count =
    c * stored), so decaying a row is one multiply and an observation touches only the positions
    it reached; the acceptance estimate hits / trials is scale-free.
    """
    h: list[list[float]]
    t: list[list[float]]
    c: list[float]

    @staticmethod
    def empty(D: int, k: int, h0: float, t0: float) -> "_Tables":
        return _Tables([[h0] * k for _ in range(D)], [[t0] * k for _ in range(D)], [1.0] * D)

    def add(self, d: int, hits: int, trials: int, decay: float) -> None:
        """Decay row d, then one hit at positions < hits and one trial at positions < trials."""
        c = self.c[d] = self.c[d] * decay
        if c < 1e-200:      # renormalise before the scale underflows
            self.h[d] = [x * c for x in self.h[d]]
            self.t[d] = [x * c for x in self.t[d]]
            c = self.c[d] = 1.0
        inc, H, T = 1.0 / c, self.h[d], self.t[d]
        for i in range(hits):
            H[i] += inc
        for i in range(trials):
            T[i] += inc

    def counts(self) -> np.ndarray:
        """(D, 2, k) true decayed (hits, trials)."""
        c = np.array(self.c)[:, None]
        return np.stack([np.array(self.h) * c, np.array(self.t) * c], axis=1)


class SpecSelect(_Policy):
    """The spec-select rule (production PR in seeds/spec-select-pr.txt) adapted to block logs.

    Learns each drafter's acceptance per draft position (decayed hits and trials per position),
    per prompt as the PR does per slot (a new prompt starts from the pooled estimate, worth
    `prior` pseudo-trials), from the drafts used, from lookup drafts not used and from the
    cut-off part of a used lookup draft: lookup drafts are compared with the text that follows
    at no cost, so their full acceptance is always seen; an unused model drafter is never
    called, so it is never seen (the class asks for full information and then ignores unused
    model drafters). Options: each lookup draft cut to its best length L (its length is known
    before choosing: `ctx.draft_len` is read for lookup drafters only), each model drafter's
    whole draft (assumed k long), or no draft (L = 0). It maximises log(expected tokens / step
    time) under `StepTime` (the manifest's timing, or stated defaults). A model drafter that
    looks worse than a lookup draft is never called again, so its estimate would never recover
    from an unlucky start: with probability `explore` a random model drafter runs (our
    extension; the PR relies on lookup drafts rarely winning outside copy-heavy text). `choose_batch` is the
    multi-sequence rule: maximise the sum over the step's sequences of log(tokens / step time),
    no sequence more than `max_slowdown` slower than with every sequence on the model drafter.
    """
    name = "spec_select"
    full_information = True

    def __init__(self, decay: float = 0.98, prior: float = 4.0, explore: float = 0.02,
                 lookup: Sequence[str] | None = None, max_slowdown: float = 0.10, pass_per_length: bool = True,
                 random_state: int | None = 0):
        super().__init__(random_state)
        self.decay, self.prior, self.explore, self.lookup = decay, prior, explore, lookup
        self.max_slowdown, self.pass_per_length = max_slowdown, pass_per_length

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        names = self.lookup if self.lookup is not None else (timing or {}).get("lookup")
        if names is None:
            names = [d for d in self.drafters_ if any(k in d.lower() for k in LOOKUP_KINDS)]
        self.is_lookup_ = np.array([d in set(names) for d in self.drafters_])
        self.time_ = StepTime.from_timing(self.drafters_, self.is_lookup_, timing)
        self.state_: dict[int, _Tables] = {}   # prompt -> decayed (hits, trials) per drafter and position
        self.B_ = 0   # draft positions tracked: k, fixed at the first block
        self.cut_ = (-1, -1)

    def _init_tables(self, ctx) -> None:
        k = self.B_ = int(self._scale(ctx))
        D = self.n_arms_
        self.G_ = _Tables.empty(D, k, 0.0, 0.0)   # pooled over prompts
        calls = float(self.time_.drafter_ms[self.is_lookup_].sum()) + np.where(self.is_lookup_, 0.0, self.time_.drafter_ms)
        # log step time of drafter d verifying L = 0..k draft tokens (+1 bonus); lookup drafts are always computed
        self.log_step_ = np.log(self.time_.verify(np.arange(k + 1) + 1.0)[None, :] + calls[:, None]).tolist()
        self.lookup_list_ = self.is_lookup_.tolist()
        self.models_ = np.flatnonzero(~self.is_lookup_)

    def _state(self, prompt: int) -> "_Tables":
        """This prompt's tables; a new prompt starts from the pooled estimate with `prior`
        pseudo-trials per position (a slot carries what it learned into the next request)."""
        s = self.state_.get(prompt)
        if s is None:
            G, pr = self.G_, self.prior
            hits = [[pr * (c * h + 1.0) / (c * t + 2.0) for h, t in zip(H, T)] for H, T, c in zip(G.h, G.t, G.c)]
            s = self.state_[prompt] = _Tables(hits, [[pr] * self.B_ for _ in hits], [1.0] * len(hits))
        return s

    def expected_tokens(self, prompt: int) -> np.ndarray:
        """(D, k + 1) expected tokens of each drafter's draft cut to L = 0..k, for this prompt.

        A draft cut to L accepts min(A, L), and E[min(A, L)] = sum_{j <= L} prod_{i < j} p_i with
        p_i the acceptance at draft position i given the earlier ones were accepted.
        """
        s = self._state(prompt)
        p = np.array(s.h) / np.array(s.t)
        return np.c_[np.ones(len(p)), 1.0 + np.cumsum(np.cumprod(p, axis=1), axis=1)]

    def choose(self, ctx):
        if not self.B_:
            self._init_tables(ctx)
        if self.models_.size and self.rng_.random() < self.explore:
            d = int(self.models_[self.rng_.integers(self.models_.size)])
            self.cut_ = (d, -1)
            return d
        s, k, log = self._state(ctx.prompt), self.B_, math.log
        best, arg = -math.inf, (0, 0)
        # plain floats: D x k ~ 32 values, where numpy's per-call overhead would dominate
        for d, (H, T, ls, look, n) in enumerate(zip(s.h, s.t, self.log_step_, self.lookup_list_, ctx.draft_len.tolist())):
            prod, tok = 1.0, 1.0
            if look:        # a lookup draft may be cut to any L <= its length, L = 0 being no draft
                n = min(n, k)
                if -ls[0] > best:
                    best, arg = -ls[0], (d, 0)
                for i in range(n):
                    prod *= H[i] / T[i]
                    tok += prod
                    v = log(tok) - ls[i + 1]
                    if v > best:
                        best, arg = v, (d, i + 1)
            else:           # a model draft is verified whole (its length, k, is not known before drafting)
                for i in range(k):
                    prod *= H[i] / T[i]
                    tok += prod
                v = log(tok) - ls[k]
                if v > best:
                    best, arg = v, (d, k)
        d, L = arg
        if not self.lookup_list_[d]:
            self.cut_ = (d, -1)
            return d
        self.cut_ = (d, L if L < ctx.draft_len[d] else -1)
        return (d, L)

    def update(self, ctx, chosen, accepted, observed) -> None:
        if not self.B_:
            self._init_tables(ctx)
        s, G, k = self._state(ctx.prompt), self.G_, self.B_
        cd, cL = self.cut_
        for d, (a, o, n, look) in enumerate(zip(accepted.tolist(), observed.tolist(), ctx.draft_len.tolist(),
                                                 self.lookup_list_)):
            if not o or not (look or d == chosen) or n == 0:
                continue    # unseen, or an unused model drafter (never called), or no draft
            a, n = int(a), min(n, k)
            if d == chosen and d == cd and 0 <= cL <= a:
                n = cL      # the replay reveals a cut draft only up to the cut: censored, no rejection at L
            # positions 0..a-1 accepted, position a (when drafted) rejected, later ones never reached
            s.add(d, min(a, n), min(a, n - 1) + 1, self.decay)
            G.add(d, min(a, n), min(a, n - 1) + 1, self.decay)

    # ---------------------------------------------------------------- several sequences per step

    def batch_step_ms(self, choices: Sequence[tuple[int, int]]) -> float:
        """Step time of one batch: (drafter, verified draft tokens) per sequence.

        One verify pass per distinct verified length when `pass_per_length` (ubatches of a
        hybrid/recurrent target, the PR's case), else one pass at the longest; each model
        drafter used by any sequence is called once (batched), lookup drafters always.
        """
        t = self.time_
        lens = sorted({L + 1 for _, L in choices})
        verify = sum(float(t.verify(n)) for n in lens) if self.pass_per_length else float(t.verify(lens[-1]))
        models = {d for d, L in choices if not self.is_lookup_[d] and L > 0}
        return verify + float(t.drafter_ms[self.is_lookup_].sum()) + sum(float(t.drafter_ms[d]) for d in models)

    def choose_batch(self, ctxs: Sequence) -> list:
        """Joint choice for S sequences in one step, by brute force over each one's candidates.

        Candidates per sequence: every model drafter's whole draft, every lookup draft at its
        single-sequence best cut and at L = 0. Reference: everyone on the model drafter with the
        highest expected tokens; no sequence's tokens / step time may fall below (1 - max_slowdown)
        times its reference rate.
        """
        import itertools
        if not self.B_:
            self._init_tables(ctxs[0])
        per_seq, ref = [], []
        for ctx in ctxs:
            et = self.expected_tokens(ctx.prompt)
            n = np.where(self.is_lookup_, np.minimum(ctx.draft_len, self.B_), self.B_)
            cands = {}
            for d in range(self.n_arms_):
                if self.is_lookup_[d]:
                    v = np.log(et[d, :n[d] + 1]) - np.asarray(self.log_step_[d][:n[d] + 1])
                    L = int(np.argmax(v))
                    cands[(d, L)], cands[(d, 0)] = float(et[d, L]), float(et[d, 0])
                else:
                    cands[(d, int(n[d]))] = float(et[d, n[d]])
            per_seq.append(list(cands.items()))
            models = [(c, e) for c, e in cands.items() if not self.is_lookup_[c[0]]]
            ref.append(max(models, key=lambda x: x[1]) if models else per_seq[-1][0])
        base_ms = self.batch_step_ms([c for c, _ in ref])
        floor = [(1.0 - self.max_slowdown) * e / base_ms - 1e-12 for _, e in ref]
        best, best_v = [c for c, _ in ref], -math.inf
        for combo in itertools.product(*per_seq):
            ms = self.batch_step_ms([c for c, _ in combo])
            rates = [e / ms for _, e in combo]
            if all(r >= f for r, f in zip(rates, floor)):
                v = sum(math.log(r) for r in rates)
                if v > best_v:
                    best, best_v = [c for c, _ in combo], v
        out = []
        for d, L in best:   # the same exploration as `choose`, per sequence
            if self.models_.size and self.rng_.random() < self.explore:
                d = int(self.models_[self.rng_.integers(self.models_.size)])
            out.append((d, L) if self.is_lookup_[d] else d)
        return out


ALL = (UCB1, EXP3, Hedge, NormalHedge, UCBSpec, EXP3Spec, HedgeQuery, ThompsonCtx, HedgeCtx, LinUCB,
       SpecSelect, Random)


def make_policies(random_state: int = 0) -> list[_Policy]:
    """One instance of every learning policy (baselines needing hindsight are built in core.py)."""
    return [cls(random_state=random_state) for cls in ALL]


if __name__ == "__main__":
    # every policy on a small simulated campaign with planted ranking flips between workloads
    from bandit.core import evaluate
    from bandit.simulate import SimConfig, simulate_table
    t = simulate_table(SimConfig(drafter_accept=(0.72,) * 4, workload_shift=(0.0,) * 4, ranking_flips=True,
                                 flip_margin=0.6, n_prompts=30, out_len=120, dense=False, seed=0))
    print(f"simulated campaign with planted ranking flips: {t.summary()}")
    print(evaluate(t, "block", None, seeds=(0, 1), n_resamples=1000, seed=0).summary())
