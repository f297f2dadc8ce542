"""Policies on synthetic reward streams, each against an independent reference."""

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from bandit.policies.registry import (
    EXP3,
    EXP3Spec,
    SpecTables,
    UCB1,
    UCBSpec,
    Hedge,
    HedgeCtx,
    HedgeQuery,
    LinUCB,
    NormalHedge,
    Random,
    SpecSelect,
    StepTime,
    ThompsonCtx,
    make_policies,
)
from bandit.logs.schema import Context, Timing


def timing_of(d: dict) -> Timing:
    """A manifest-style timing dict (plus "k") as the Timing a policy is given at reset."""
    return Timing.from_manifest({"k": d.get("k", 0), "timing": {n: v for n, v in d.items() if n != "k"}}, ())


K = 8


def ctx(w=0, prompt=0, D=3, draft_len=None, prev_a=None, prev_f=None):
    return Context(
        w,
        prompt,
        0,
        np.full(D, np.nan) if prev_a is None else prev_a,
        np.full((D, 4), np.nan) if prev_f is None else prev_f,
        np.full(D, K) if draft_len is None else np.asarray(draft_len),
    )


def stream(means, T, seed, workloads=None):
    """(T,) workload, (T, D) accepted ~ min(Poisson(mean), K) with means (W, D)."""
    rng = np.random.default_rng([seed, 99])  # never the policies' own stream
    means = np.atleast_2d(means)
    w = rng.integers(0, means.shape[0], T) if workloads is None else workloads
    return w, np.minimum(rng.poisson(means[w]), K).astype(float)


def play(pol, w, A, D=3, W=1):
    pol.reset([f"d{i}" for i in range(D)], [f"w{i}" for i in range(W)], Timing(k=K))
    chosen = np.empty(len(w), int)
    for i in range(len(w)):
        c = ctx(int(w[i]), D=D)
        d = pol.choose(c)
        d = d[0] if isinstance(d, tuple) else d
        obs = np.ones(D, bool) if pol.full_information else np.arange(D) == d
        pol.update(c, d, np.where(obs, A[i], np.nan), obs)
        chosen[i] = d
    return chosen


def test_same_seed_same_choices_other_seed_differs():
    w, A = stream([[3, 2.5, 1]], 400, 0)
    for cls in (EXP3, Hedge, NormalHedge, EXP3Spec, HedgeQuery, ThompsonCtx, HedgeCtx, Random):
        a, b = play(cls(random_state=1), w, A), play(cls(random_state=1), w, A)
        assert np.array_equal(a, b), cls.name
        assert not np.array_equal(a, play(cls(random_state=2), w, A)), cls.name


def test_ucb1_index_matches_formula():
    w, A = stream([[3, 2.5, 1]], 200, 1)
    pol = UCB1(c=1.0)
    chosen = play(pol, w, A)
    # recompute the next choice from the history by hand
    n = np.bincount(chosen, minlength=3)
    s = np.array([A[chosen == d, d].sum() for d in range(3)])
    ucb = s / n / K + np.sqrt(2 * math.log(200) / n)
    assert pol.choose(ctx()) == int(np.argmax(ucb))
    assert np.array_equal(pol.n_, n)


@pytest.mark.parametrize("cls", [UCB1, EXP3, Hedge, NormalHedge, UCBSpec, EXP3Spec, HedgeQuery])
def test_noncontextual_learners_find_best_arm(cls):
    w, A = stream([[4.0, 2.0, 1.0]], 3000, 2)
    chosen = play(cls(random_state=0), w, A)
    assert np.mean(chosen[-1000:] == 0) > 0.8


def test_exp3_probabilities_keep_exploration_floor():
    w, A = stream([[4.0, 0.0, 0.0]], 500, 3)
    pol = EXP3()
    play(pol, w, A)
    g = min(1.0, math.sqrt(3 * math.log(3) / ((math.e - 1) * (pol.t_ + 1))))
    pol.choose(ctx())
    assert abs(sum(pol.p_) - 1) < 1e-12 and min(pol.p_) >= g / 3 - 1e-12


def test_hedge_weights_are_softmax_of_cumulative_rewards():
    w, A = stream([[3, 2, 1]], 300, 4)
    pol = Hedge()
    play(pol, w, A)
    pol.choose(ctx())
    eta = math.sqrt(8 * math.log(3) / 301)
    ref = np.exp(eta * A.sum(0) / K)
    assert np.allclose(np.array(pol.w_) / sum(pol.w_), ref / ref.sum())


def test_normalhedge_scale_solves_its_equation():
    pol = NormalHedge()
    pol.reset(["a", "b", "c", "d"], ["w"])
    for R in ([3.0, 1.0, -2.0, 0.5], [0.01, 0.0, 0.0, 0.0], [50.0, 49.0, 10.0, -3.0]):
        pol.R_ = list(R)
        pol.choose(ctx(D=4))
        r = np.maximum(R, 0)
        with np.errstate(over="ignore"):
            c = brentq(lambda c: np.mean(np.exp(r**2 / (2 * c))) - math.e, 1e-8, 1e8)
        w = r / c * np.exp(r**2 / (2 * c))
        assert np.allclose(pol.p_, w / w.sum(), rtol=1e-6), R


def test_thompson_posterior_is_the_sample_moments_per_workload():
    w, A = stream([[3, 2, 1], [1, 2, 4]], 2000, 5)
    pol = ThompsonCtx()
    chosen = play(pol, w, A, W=2)
    for wl in range(2):
        for d in range(3):
            m = (w == wl) & (chosen == d)
            assert pol.n_[wl][d] == m.sum()
            if m.sum() > 1:
                assert math.isclose(pol.mean_[wl][d], A[m, d].mean(), rel_tol=1e-9)
                assert math.isclose(pol.m2_[wl][d], A[m, d].var() * m.sum(), rel_tol=1e-9)
    # it follows the flip: arm 0 on workload 0, arm 2 on workload 1
    late = np.arange(len(w)) > 1000
    assert np.mean(chosen[late & (w == 0)] == 0) > 0.85
    assert np.mean(chosen[late & (w == 1)] == 2) > 0.85


def test_hedge_ctx_follows_a_flip_and_hedge_cannot():
    w, A = stream([[3, 2, 1], [1, 2, 4]], 3000, 6)
    late = np.arange(len(w)) > 1500
    c = play(HedgeCtx(), w, A, W=2)
    h = play(Hedge(), w, A, W=2)
    gain_ctx, gain_h = A[late, c[late]].mean(), A[late, h[late]].mean()
    assert gain_ctx > gain_h + 0.5


def test_linucb_is_ridge_regression_and_ucb():
    rng = np.random.default_rng(7)
    D, W = 3, 2
    pol = LinUCB(alpha=0.5, ridge=1.0)
    pol.reset(["a", "b", "c"], ["x", "y"], Timing(k=K))
    X, y = {d: [] for d in range(D)}, {d: [] for d in range(D)}
    for i in range(300):
        pa = np.where(rng.random(D) < 0.5, rng.integers(0, K, D).astype(float), np.nan)
        pf = np.where(np.isnan(pa)[:, None], np.nan, rng.random((D, 4)))
        c = ctx(int(rng.integers(W)), D=D, prev_a=pa, prev_f=pf)
        d = pol.choose(c)
        x = np.r_[np.eye(W)[c.workload], np.nan_to_num(pf).ravel(), np.nan_to_num(pa) / K, ~np.isnan(pa)]
        assert np.allclose(pol.x_, x)
        a = float(rng.integers(0, K + 1))
        pol.update(c, d, np.where(np.arange(D) == d, a, np.nan), np.arange(D) == d)
        X[d].append(x)
        y[d].append(a / K)
    for d in range(D):
        Xd = np.array(X[d]).reshape(-1, pol.dim_)
        A_ = np.eye(pol.dim_) + Xd.T @ Xd
        assert np.allclose(pol.theta_[d], np.linalg.solve(A_, Xd.T @ np.array(y[d])), atol=1e-8)
        assert np.allclose(pol.Ainv_[d], np.linalg.inv(A_), atol=1e-8)


def test_random_is_uniform():
    w, A = stream([[1, 1, 1]], 6000, 8)
    counts = np.bincount(play(Random(random_state=3), w, A), minlength=3)
    assert np.all(np.abs(counts / 6000 - 1 / 3) < 0.03)


# ---------------------------------------------------------------- spec-select


def brute_expected_tokens(p, L):
    """E[min(A, L)] + 1 by enumerating every accept/reject pattern of the draft's positions."""
    n = len(p)
    tot = 0.0
    for bits in itertools.product([0, 1], repeat=n):
        pr = np.prod([p[i] if b else 1 - p[i] for i, b in enumerate(bits)])
        a = next((i for i, b in enumerate(bits) if not b), n)  # leading accepted run
        tot += pr * (min(a, L) + 1)
    return tot


def _seeded_spec_select(p_true, timing, lookup, k):
    """A SpecSelect whose per-prompt tables hold exactly p_true (hits/trials set by hand)."""
    D = len(p_true)
    pol = SpecSelect(explore=0.0, lookup=lookup)
    pol.reset([f"d{i}" for i in range(D)], ["w"], timing_of(dict(timing, k=k)))
    c = ctx(D=D, draft_len=np.full(D, k))
    pol.choose(c)  # builds the tables
    set_rates(pol, 0, p_true)
    return pol


def set_rates(pol, prompt, p, weight=1000.0):
    p = np.asarray(p, float)
    pol.state_[prompt] = SpecTables((p * weight).tolist(), np.full_like(p, weight).tolist(), [1.0] * len(p))


@pytest.mark.parametrize("seed", range(6))
def test_spec_select_cut_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    k, D = 4, 3
    p_true = rng.uniform(0.2, 0.99, (D, k))
    timing = {
        "verify_ms": {"tokens": [1, 3, 5], "ms": sorted(rng.uniform(5, 15, 3))},
        "drafter_ms": {
            "d0": float(rng.uniform(0, 0.3)),
            "d1": float(rng.uniform(0.5, 4)),
            "d2": float(rng.uniform(0.5, 4)),
        },
    }
    lookup = ["d0"]
    pol = _seeded_spec_select(p_true, timing, lookup, k)
    n0 = int(rng.integers(0, k + 1))
    draft_len = np.array([n0, k, k])
    got = pol.choose(ctx(D=D, draft_len=draft_len))
    st = StepTime.from_timing(pol.drafters_, pol.is_lookup_, timing_of(timing))
    look_ms = st.drafter_ms[0]
    best, arg = -np.inf, None
    for d in range(D):
        for L in range(draft_len[d] + 1) if d == 0 else [k]:
            ms = float(st.verify(L + 1)) + look_ms + (0.0 if d == 0 else st.drafter_ms[d])
            v = math.log(brute_expected_tokens(p_true[d, : max(L, 1)], L) / ms)
            if v > best + 1e-12:
                best, arg = v, (d, L)
    want = arg if arg[0] == 0 else arg[0]
    assert got == want


def test_spec_select_learns_positions_from_used_unused_and_cut_drafts():
    pol = SpecSelect(explore=0.0, decay=1.0, prior=1.0, lookup=["d0"])
    pol.reset(["d0", "d1"], ["w"], Timing(k=4))
    c = ctx(D=2, draft_len=[4, 4])
    pol.choose(c)
    base = pol._state(0).counts()
    pol.cut_ = (1, -1)  # the model drafter was used: both are seen
    pol.update(c, 1, np.array([2.0, 1.0]), np.ones(2, bool))
    s = pol._state(0).counts() - base
    assert np.array_equal(s[0], [[1, 1, 0, 0], [1, 1, 1, 0]])  # lookup: 2 accepted, rejected at 2
    assert np.array_equal(s[1], [[1, 0, 0, 0], [1, 1, 0, 0]])
    pol.cut_ = (0, 2)  # lookup draft cut at 2 and accepted to the cut: censored
    pol.update(c, 0, np.array([2.0, 3.0]), np.ones(2, bool))
    s2 = pol._state(0).counts() - base - s
    assert np.array_equal(s2[0], [[1, 1, 0, 0], [1, 1, 0, 0]])
    assert not s2[1].any()  # an unused model drafter was never called


def test_spec_select_batch_respects_the_slowdown_limit_and_reduces_to_single():
    rng = np.random.default_rng(11)
    k = 4
    timing = {"verify_ms": {"tokens": [1, 5], "ms": [5.0, 6.0]}, "drafter_ms": {"d0": 0.05, "d1": 1.5}}
    pol = _seeded_spec_select(rng.uniform(0.3, 0.95, (2, k)), timing, ["d0"], k)
    one = ctx(D=2, draft_len=[3, k])
    assert pol.choose_batch([one]) == [pol.choose(one)]
    for trial in range(20):
        ctxs = [ctx(prompt=j, D=2, draft_len=[int(rng.integers(0, k + 1)), k]) for j in range(3)]
        for j in range(3):
            set_rates(pol, j, rng.uniform(0.1, 0.99, (2, k)), 100.0)
        got = pol.choose_batch(ctxs)
        pairs = [(g, k) if not isinstance(g, tuple) else g for g in got]
        ms = pol.batch_step_ms(pairs)
        base_ms = pol.batch_step_ms([(1, k)] * 3)
        for j, (d, L) in enumerate(pairs):
            et = pol.expected_tokens(j)
            assert et[d, L] / ms >= 0.9 * et[1, k] / base_ms - 1e-9


def test_make_policies_has_every_name():
    names = {p.name for p in make_policies()}
    assert names == {
        "ucb_stream",
        "exp3_stream",
        "hedge_stream",
        "normalhedge",
        "ucbspec",
        "exp3spec",
        "hedge_query",
        "thompson_ctx",
        "hedge_ctx",
        "linucb",
        "spec_select",
        "random",
        "trtllm_sa",
        "arctic_hybrid",
        "sglang_hybrid",
        "vllm_ngram_eagle",
        "llamacpp_first",
        "hvd",
    }
    assert UCBSpec(reward="throughput").name == "ucbspec_throughput"
    assert UCBSpec(reward="throughput").clone(random_state=3).name == "ucbspec_throughput"
    with pytest.raises(ValueError, match="reward"):
        UCBSpec(reward="tokens/s")


# ---------------------------------------------------------------- published per-request rules (BanditSpec, HedgeSpec)


def play_prompts(pol, prompts, A, D=3, timing=None, draft_len=None):
    """Replay (B, D) accepted rows with their prompt index, in order; the chosen drafter per row.

    `draft_len` (D,) is every block's draft lengths (default: k for every drafter)."""
    pol.reset([f"d{i}" for i in range(D)], ["w"], timing_of({"k": K} if timing is None else timing))
    chosen = np.empty(len(prompts), int)
    for i, p in enumerate(prompts):
        c = ctx(prompt=int(p), D=D, draft_len=draft_len)
        d = pol.choose(c)
        obs = np.ones(D, bool) if pol.full_information else np.arange(D) == d
        pol.update(c, d, np.where(obs, A[i], np.nan), obs)
        chosen[i] = d
    return chosen


def state(pol):
    return {k: v for k, v in vars(pol).items() if k.endswith("_") and k not in ("rng_", "prompt_")}


@pytest.mark.parametrize("make", [UCBSpec, lambda: UCBSpec(reward="throughput"), EXP3Spec, HedgeQuery])
def test_per_request_rules_restart_at_a_new_prompt(make):
    """After the first choice of a new prompt the statistics are a fresh learner's, and what the
    learner does on prompt 1 does not depend on what prompt 0 showed it."""
    timing = {
        "k": K,
        "verify_ms": {"tokens": [1, K + 1], "ms": [10.0, 12.0]},
        "drafter_ms": {"d0": 3.0, "d1": 1.0, "d2": 0.05},
    }
    _, A0 = stream([[4.0, 2.0, 1.0]], 200, 20)
    _, B0 = stream([[0.5, 1.0, 6.0]], 200, 21)  # a different first prompt, same length
    _, A1 = stream([[1.0, 5.0, 2.0]], 150, 22)
    prompts = np.r_[np.zeros(200, int), np.ones(150, int)]
    a, b = make(), make()
    ca = play_prompts(a, prompts, np.r_[A0, A1], timing=timing)
    cb = play_prompts(b, prompts, np.r_[B0, A1], timing=timing)
    assert not np.array_equal(ca[:200], cb[:200])
    # one uniform per choice (or none) keeps the generators in step, so prompt 1 replays identically
    assert np.array_equal(ca[200:], cb[200:])
    assert all(
        np.allclose(x, y) if isinstance(x, list) else x == y for x, y in zip(state(a).values(), state(b).values())
    )
    # the state right after the first choice of prompt 1 is a fresh learner's state after its first choice
    fresh = make()
    fresh.reset(["d0", "d1", "d2"], ["w"], timing_of(timing))
    fresh.choose(ctx(prompt=7))
    c = make()
    play_prompts(c, np.zeros(200, int), A0, timing=timing)
    c.choose(ctx(prompt=1))
    for key, v in state(fresh).items():
        assert v == state(c)[key], key


def test_stream_learners_carry_prompt_history():
    """Contrast: the single-stream variants' behaviour on prompt 1 depends on prompt 0."""
    _, A0 = stream([[4.0, 2.0, 1.0]], 200, 20)
    _, B0 = stream([[0.5, 1.0, 6.0]], 200, 21)
    _, A1 = stream([[1.0, 5.0, 2.0]], 150, 22)
    prompts = np.r_[np.zeros(200, int), np.ones(150, int)]
    for cls in (UCB1, EXP3, Hedge):
        ca = play_prompts(cls(), prompts, np.r_[A0, A1])
        cb = play_prompts(cls(), prompts, np.r_[B0, A1])
        assert not np.array_equal(ca[200:], cb[200:]), cls.name


def test_ucbspec_round_robin_then_the_bonus_of_eq_6_by_hand():
    """A tiny sequence: K = 3 drafters, k = L = 4, delta = 1/2; every index checked by hand."""
    L, delta = 4, 0.5
    acc = [[3, 0, 1], [2, 4, 0], [1, 1, 1], [0, 2, 4], [4, 4, 4], [2, 0, 3], [1, 3, 2], [0, 0, 0]]
    pol = UCBSpec(delta=delta)
    pol.reset(["a", "b", "c"], ["w"], Timing(k=L))
    n, s = [0, 0, 0], [0.0, 0.0, 0.0]
    for t, row in enumerate(acc):
        c = ctx(prompt=0)
        d = pol.choose(c)
        if t < 3:
            assert d == t  # round robin first
        else:
            want = []
            for i in range(3):
                # eq. (6): (L/2) sqrt((1+n)/n^2 (1 + 2 log(K t^2 (1+n)^(1/2) / delta)))
                rad = (L / 2) * math.sqrt(
                    (1 + n[i]) / n[i] ** 2 * (1 + 2 * math.log(3 * t**2 * math.sqrt(1 + n[i]) / delta))
                )
                want.append(s[i] / n[i] + rad)
            assert np.allclose(pol.ucb_, want)
            assert d == int(np.argmax(want))
        pol.update(c, d, np.where(np.arange(3) == d, np.array(row, float), np.nan), np.arange(3) == d)
        n[d] += 1
        s[d] += row[d] + 1  # Y = accepted + the bonus token
    assert pol.n_ == n and np.allclose(pol.sum_, s)
    # one number worked out on paper: after rounds a, b, c (Y = 4, 5, 2), t = 3, n = 1 each:
    # radius 2 sqrt(2 (1 + 2 ln(3 * 9 * sqrt(2) / 0.5))) = 2 sqrt(2 (1 + 2 * 4.3356)) = 8.7960
    fresh = UCBSpec(delta=delta)
    fresh.reset(["a", "b", "c"], ["w"], Timing(k=L))
    for t, y in enumerate([3, 4, 1]):
        c = ctx(prompt=0)
        assert fresh.choose(c) == t
        fresh.update(c, t, np.where(np.arange(3) == t, float(y), np.nan), np.arange(3) == t)
    assert fresh.choose(ctx(prompt=0)) == 1
    assert np.allclose(fresh.ucb_, [4 + 8.7960, 5 + 8.7960, 2 + 8.7960], atol=1e-4)


def test_ucbspec_throughput_reward_prefers_the_faster_drafter():
    """Planted: d0 accepts every token of k = 4 but its calls take 60 ms; d1 accepts 2 and costs
    0.05 ms. Tokens per step favour d0 (5 vs 3), tokens per ms favour d1 (5/70 vs 3/10.05)."""
    kk = 4
    timing = {"k": kk, "verify_ms": {"tokens": [1, kk + 1], "ms": [10.0, 10.0]}, "drafter_ms": {"d0": 60.0, "d1": 0.05}}
    T = 3000
    A = np.tile([4.0, 2.0], (T, 1))
    prompts = np.zeros(T, int)
    thr = UCBSpec(reward="throughput")
    ch = play_prompts(thr, prompts, A, D=2, timing=timing, draft_len=[kk, kk])
    assert thr.throughput_
    assert np.mean(ch[-1000:] == 1) > 0.95
    # its reward is (accepted + 1) / (verify(draft + 1) + drafter_ms), by hand
    assert np.isclose(thr.sum_[1] / thr.n_[1], 3 / 10.05) and np.isclose(thr.sum_[0] / thr.n_[0], 5 / 70.0)
    tok = UCBSpec()
    ch = play_prompts(tok, prompts, A, D=2, timing=timing, draft_len=[kk, kk])
    assert np.mean(ch[-1000:] == 0) > 0.95
    assert tok.sum_[0] / tok.n_[0] == 5 and tok.sum_[1] / tok.n_[1] == 3
    # without verify_ms / drafter_ms the throughput variant falls back to tokens per step
    fb = UCBSpec(reward="throughput")
    ch_fb = play_prompts(fb, prompts, A, D=2, timing={"k": kk}, draft_len=[kk, kk])
    assert not fb.throughput_ and np.array_equal(ch_fb, ch)


def test_exp3spec_probabilities_by_hand():
    """eq. (14) with eta_t = sqrt(ln K / (t K)) and the loss estimate of eq. (13), step by step."""
    L, Kd = 4, 3
    rng = np.random.default_rng(5)
    acc = rng.integers(0, L + 1, (40, Kd)).astype(float)
    pol = EXP3Spec(random_state=9)
    pol.reset(["a", "b", "c"], ["w"], Timing(k=L))
    Z = np.zeros(Kd)
    for t, row in enumerate(acc, start=1):
        c = ctx(prompt=0)
        d = pol.choose(c)
        eta = math.sqrt(math.log(Kd) / (t * Kd))
        p = np.exp(-eta * Z) / np.exp(-eta * Z).sum()
        assert np.allclose(pol.p_, p, rtol=1e-12), t
        if t == 1:
            assert np.allclose(pol.p_, 1 / 3)
        pol.update(c, d, np.where(np.arange(Kd) == d, row, np.nan), np.arange(Kd) == d)
        Z[d] += (L + 1 - (row[d] + 1)) / (L * p[d])
    assert np.allclose(pol.Z_, Z)
    # no uniform floor: a drafter that always accepts everything takes almost all the mass
    A = np.tile([4.0, 0.0, 0.0], (3000, 1))
    ch = play_prompts(EXP3Spec(), np.zeros(3000, int), A, timing={"k": L})
    assert np.mean(ch[-500:] == 0) > 0.97


def test_hedge_query_weights_are_softmax_of_within_prompt_rewards_and_restart():
    _, A0 = stream([[1, 2, 5]], 120, 30)
    _, A1 = stream([[5, 2, 1]], 80, 31)
    pol = HedgeQuery()
    prompts = np.r_[np.zeros(120, int), np.ones(80, int)]
    play_prompts(pol, prompts, np.r_[A0, A1])
    pol.choose(ctx(prompt=1))
    eta = math.sqrt(8 * math.log(3) / 81)
    ref = np.exp(eta * ((A1 + 1) / (K + 1)).sum(0))  # prompt 1's 80 blocks only
    assert np.allclose(np.array(pol.w_) / sum(pol.w_), ref / ref.sum())
    pol.choose(ctx(prompt=2))  # a new query: uniform again
    assert np.allclose(pol.w_, 1.0) and pol.t_ == 0
    # stream Hedge on the same data keeps prompt 0 in its weights
    h = Hedge()
    play_prompts(h, prompts, np.r_[A0, A1])
    h.choose(ctx(prompt=1))
    assert not np.allclose(np.array(h.w_) / sum(h.w_), ref / ref.sum())
