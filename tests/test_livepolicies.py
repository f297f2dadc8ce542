"""The live policies' replay (bandit/policies/livepolicies.py, bandit/policies/walk.py's live mode) against a brute-force walk written
here from the contract's rules, the censored feedback by hand, and spec-select's learned step times."""

import math
from dataclasses import replace

import numpy as np
import pytest

from bandit.live import livelog
from bandit.policies import livepolicies
from bandit.policies.bandits import Fixed
from bandit.policies.published import HedgeQuery, ThompsonCtx
from bandit.logs.schema import Context, Timing
from bandit.sim.simulate import SimConfig, simulate_table
from bandit.policies.specselect import SpecSelect
from bandit.logs.table import BlockTable
from bandit.policies.walk import live_walk, lookups_drafted, run_timing, walk

K, N_OUT = 8, 40  # every simulated prompt runs to the budget: max_new_tokens = N_OUT


def budget_table(seed=0, n_prompts=4) -> BlockTable:
    """A simulated dense log shaped by the engine's budget: at position pos every draft is at most
    k(pos) = min(K, N_OUT - 1 - pos) long, a model drafter's exactly that, so the last position drafts nothing."""
    cfg = SimConfig(
        drafters=("cascade", "dflash", "ngram", "suffix"),
        drafter_accept=(0.78, 0.8, 0.6, 0.55),
        empty_rate=(0.0, 0.0, 0.4, 0.3),
        drafter_ms=(3.0, 2.8, 0.05, 0.04),
        n_prompts=n_prompts,
        out_len=N_OUT,
        seed=seed,
    )
    t = simulate_table(cfg)
    kpos = np.minimum(K, N_OUT - 1 - t.pos)
    model = np.array([d not in ("ngram", "suffix") for d in t.drafters])
    dl = np.where(model, kpos[:, None], np.minimum(t.draft_len, kpos[:, None]))
    feats = np.where((dl == 0)[..., None], 0.0, t.features)
    return replace(t, draft_len=dl.astype(np.int32), accepted=np.minimum(t.accepted, dl), features=feats)


class Recorder:
    """Wraps a policy and records every call the walk makes, with copies of what it was shown."""

    def __init__(self, inner):
        self.inner, self.log = inner, []
        self.name, self.full_information = inner.name, inner.full_information

    def reset(self, drafters, workloads, timing=None):
        self.log.append(("reset", tuple(drafters), tuple(workloads)))
        self.inner.reset(drafters, workloads, timing)

    def choose(self, ctx):
        c = self.inner.choose(ctx)
        df = None if ctx.draft_features is None else np.array(ctx.draft_features)
        shown = (ctx.workload, ctx.prompt, ctx.pos, np.array(ctx.prev_accepted), np.array(ctx.prev_features))
        self.log.append(("choose", *shown, np.array(ctx.draft_len, float), df, c))
        return c

    def update(self, ctx, chosen, accepted, observed):
        self.log.append(("update", chosen, np.array(accepted), np.array(observed)))
        self.inner.update(ctx, chosen, accepted, observed)

    def observe_step(self, n_verified, n_drafts, ms):
        self.log.append(("step", n_verified, n_drafts, ms))
        if hasattr(self.inner, "observe_step"):
            self.inner.observe_step(n_verified, n_drafts, ms)


def brute_live(t: BlockTable, pol, prompts, timing: Timing):
    """The live engine's loop over the dense log, from the contract's words, one record dict at a time:
    (passes, verified, calls, chosen) per table prompt."""
    D, names = len(t.drafters), t.drafters
    lookups = [j for j, d in enumerate(names) if d in timing.lookup]
    recs = {}
    for r in range(t.n_records):
        recs.setdefault(int(t.prompt[r]), []).append(r)
    P = t.n_prompts
    passes, verified = np.zeros(P, int), np.zeros(P, int)
    calls, chosen = np.zeros((P, D), int), np.zeros((P, D), int)
    pol.reset(names, t.workloads, timing)
    for i, p in enumerate(prompts):
        rows = recs[p]
        n = len(rows)
        pos, prev_a, prev_f = 0, np.full(D, np.nan), np.full((D, 4), np.nan)
        while pos < n:
            r = rows[pos]
            k = min(K, N_OUT - 1 - pos)
            df = np.full((D, 4), np.nan)
            for j in lookups:
                df[j] = t.features[r, j]
            ctx = Context(int(t.workload[r]), i, pos, prev_a, prev_f, t.draft_len[r].copy(), df)
            c = pol.choose(ctx)
            d, cut = c if isinstance(c, tuple) else (c, None)
            length = int(t.draft_len[r, d]) if cut is None else min(int(t.draft_len[r, d]), cut)
            a = min(int(t.accepted[r, d]), length)
            new = min(a + 1, n - pos)  # the block's new tokens
            acc, obs, feats = np.full(D, np.nan), np.zeros(D, bool), np.full((D, 4), np.nan)
            acc[d], obs[d], feats[d] = a, True, t.features[r, d]
            for j in lookups:
                if k > 0:
                    calls[p, j] += 1
                    if pol.full_information and j != d:
                        acc[j], obs[j], feats[j] = min(int(t.accepted[r, j]), new), True, t.features[r, j]
            if not (k > 0 and d in lookups):
                calls[p, d] += 1
            if hasattr(pol, "observe_step"):
                pol.observe_step(1 + length, 1, float(timing.verify(1 + length)))
            pol.update(ctx, d, acc, obs)
            passes[p] += 1
            verified[p] += 1 + length
            chosen[p, d] += 1
            prev_a, prev_f = acc, feats
            pos += a + 1
    return passes, verified, calls, chosen


def same_log(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0] == y[0] and len(x) == len(y), (x, y)
        for u, v in zip(x, y):
            if isinstance(u, np.ndarray):
                assert np.array_equal(u, v, equal_nan=True), (x, y)
            else:
                assert u == v, (x, y)


POLICIES = {
    "hedge_query": lambda: HedgeQuery(random_state=3),
    "thompson_ctx": lambda: ThompsonCtx(random_state=4),
    "specselect": lambda: SpecSelect(step_time="learned", censored=True, explore=0.2, random_state=5),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_live_replay_equals_a_brute_force_walk(name):
    t = budget_table()
    timing = run_timing(t)
    prompts = [5, 0, 12, 3, 9, 15, 1]  # a live order, not the table's
    a, b = Recorder(POLICIES[name]()), Recorder(POLICIES[name]())
    c = livepolicies.replay(t, a, prompts, timing)
    want = brute_live(t, b, prompts, timing)
    same_log(a.log, b.log)
    for got, ref in zip((c.passes, c.verified, c.calls, c.chosen), want):
        assert np.array_equal(got, ref)
    assert c.passes[[2, 4]].sum() == 0 and c.passes[prompts].min() > 0  # prompts not walked count nothing
    # the walk went to every output's end and met the k = 0 last position somewhere
    assert not lookups_drafted(t).all()


def test_live_mode_of_walk_and_replay_of_the_selector_agree():
    t = budget_table(seed=1, n_prompts=6)
    timing = run_timing(t)
    pol = livepolicies.make("selector", t, timing)
    rows, chosen, cut, _ = walk(t, Recorder(pol), "live", np.arange(t.n_prompts), timing)
    ref = brute_live(t, Recorder(livepolicies.make("selector", t, timing)), list(range(t.n_prompts)), timing)
    c = livepolicies.counts(t, rows, chosen, cut, timing)
    assert np.array_equal(c.passes, ref[0]) and np.array_equal(c.calls, ref[2]) and np.array_equal(c.chosen, ref[3])


def tiny(accepted, draft_len, n=None):
    """One prompt of a dense log: drafters (m, ngram, suffix), rows given."""
    A = np.asarray(accepted, np.int32)
    R = len(A)
    return BlockTable(
        drafters=("m", "ngram", "suffix"),
        workloads=("w",),
        prompt_ids=("w/p",),
        workload=np.zeros(R, np.int32),
        prompt=np.zeros(R, np.int32),
        pos=np.arange(R, dtype=np.int64),
        block=np.full(R, -1, np.int64),
        accepted=A,
        draft_len=np.asarray(draft_len, np.int32),
        expected_accepted=np.full(A.shape, np.nan),
        features=np.tile(np.arange(1.0, 4.0)[None, :, None], (R, 1, 4)),
        ms=np.full(A.shape, np.nan),
        target_ms=np.full(R, np.nan),
        dense=True,
    )


class Script:
    def __init__(self, picks, full):
        self.picks, self.full_information, self.name, self.seen = list(picks), full, "script", []

    def reset(self, drafters, workloads, timing=None):
        pass

    def choose(self, ctx):
        return self.picks.pop(0)

    def update(self, ctx, chosen, accepted, observed):
        self.seen.append((chosen, accepted.tolist(), observed.tolist(), ctx.prev_accepted.tolist()))


def test_censored_feedback_by_hand():
    # one 9-token output; rows 1, 2, 4, 5, 6 are never block starts; row 8 is the budget's last position (k = 0)
    A = [[2, 5, 1], [0, 0, 0], [0, 0, 0], [1, 4, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    DL = [[4, 6, 2], [4, 0, 0], [4, 0, 0], [3, 4, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0]]
    t = tiny(A, DL)
    timing = Timing(k=4, lookup=("ngram", "suffix"), verify_tokens=(1.0, 5.0), verify_ms=(1.0, 2.0))
    full = Script([0, 2, (1, 0), 0], True)
    live_walk(t, full, [0], timing)
    nan = math.nan
    # pos 0: m accepts 2, the block reveals 3 tokens: ngram (5 matched) is told 3, suffix its 1
    assert _eq(full.seen[0][:3], (0, [2.0, 3.0, 1.0], [True, True, True]))
    # pos 3: suffix accepts 3 (4 tokens revealed): ngram's 4; m was not run: NaN, unobserved
    assert _eq(full.seen[1][:3], (2, [nan, 4.0, 3.0], [False, True, True]))
    assert _eq(full.seen[1][3], [2.0, 3.0, 1.0])  # prev_accepted: what the last block told
    # pos 7: ngram cut to 0 accepts 0 (1 token revealed): suffix min(0, 1)
    assert _eq(full.seen[2][:3], (1, [nan, 0.0, 0.0], [False, True, True]))
    # pos 8, k = 0: no lookup drafted before choosing: the chosen drafter only
    assert len(full.seen) == 4 and _eq(full.seen[3][:3], (0, [0.0, nan, nan], [True, False, False]))
    # a bandit policy is told the chosen drafter only, never a lookup's censored value
    band = Script([0, 2, 1], False)
    live_walk(t, band, [0], timing)
    assert _eq(
        [s[:3] for s in band.seen],
        [
            (0, [2.0, nan, nan], [True, False, False]),
            (2, [nan, nan, 3.0], [False, False, True]),
            (1, [nan, 1.0, nan], [False, True, False]),
        ],
    )
    c = livepolicies.replay(t, Script([0, 2, (1, 0), 0], True), [0], timing)
    # calls: lookups at the 3 drafting blocks, m at pos 0 and at pos 8 (k = 0: the chosen drafter is called)
    assert c.calls.tolist() == [[2, 3, 3]] and c.passes.tolist() == [4] and c.verified.tolist() == [5 + 4 + 1 + 1]
    assert c.chosen.tolist() == [[2, 1, 1]]


def _eq(a, b):
    return repr(a) == repr(b)  # NaN included: both print "nan"


def test_fixed_policy_replay_equals_the_fixed_trajectory_counts():
    t = budget_table(seed=2)
    timing = run_timing(t)
    look = [j for j, d in enumerate(t.drafters) if d in timing.lookup]
    for d, name in enumerate(t.drafters):
        c = livepolicies.replay(t, Fixed(d), np.arange(t.n_prompts), timing)
        ref = livelog._trajectory_counts(t, f"fixed:{name}")
        assert np.array_equal(c.passes, ref[0]) and np.array_equal(c.verified, ref[1])
        assert np.array_equal(c.calls[:, d], ref[2][:, d]) and np.array_equal(c.chosen[:, d], c.passes)
        # a policy configuration also drafts every lookup before choosing: at every pass but one at k = 0
        for j in look:
            assert np.all((c.calls[:, j] == c.passes) | (c.calls[:, j] == c.passes - 1))


def test_make_builds_every_live_policy_and_names_are_checked():
    t = budget_table(seed=3)
    timing = run_timing(t)
    for name in livepolicies.LIVE_POLICIES:
        c = livepolicies.replay(t, name, [3, 1, 2], timing, random_state=1)
        assert c.passes[[3, 1, 2]].min() > 0 and c.chosen.sum() == c.passes.sum()
    with pytest.raises(ValueError, match="unknown live policy"):
        livepolicies.make("nope", t, timing)


# ---------------------------------------------------------------- spec-select's learned step times


def test_spec_select_learns_step_times_and_chooses_by_them():
    timing = Timing(k=4, lookup=("d0",), verify_tokens=(1.0, 5.0), verify_ms=(10.0, 10.0), drafter_ms={"d0": 0.0})
    pol = SpecSelect(explore=0.0, step_time="learned", time_prior=2.0, lookup=["d0"])
    pol.reset(["d0", "d1"], ["w"], replace(timing, drafter_ms={"d0": 0.0, "d1": 1.0}))
    c = Context(0, 0, 0, np.full(2, np.nan), np.full((2, 4), np.nan), np.array([4, 4]))
    pol.choose(c)
    pol.state_[0] = SpecSelectTables([[0.9] * 4, [0.9] * 4])
    assert pol.choose(c) == (0, 4)  # verify is flat: the whole lookup draft
    for ms in (40.0, 70.0, 55.0):
        pol.observe_step(5, 1, ms)  # verifying 5 tokens is slow in fact
    pol.observe_step(5, 2, 1000.0)  # a pass of two drafts is not a clean step: ignored
    assert math.isclose(pol.vsum_[5] / pol.vn_[5], (2 * 10.0 + 40 + 70 + 55) / 5)
    assert math.isclose(pol.log_step_[1][4], math.log((2 * 10.0 + 165) / 5 + 1.0))
    # by brute force over the candidates under the learned times: a shorter cut of the lookup draft wins
    p, best = [0.9] * 4, None
    for L in range(5):
        tok = 1 + sum(math.prod(p[:j]) for j in range(1, L + 1))
        v = math.log(tok) - pol.log_step_[0][L]
        best = max(best or (v, L), (v, L))
    assert pol.choose(c) == (0, best[1]) and best[1] < 4
    fixed = SpecSelect(explore=0.0, lookup=["d0"])  # step_time "model": observations change nothing
    fixed.reset(["d0", "d1"], ["w"], replace(timing, drafter_ms={"d0": 0.0, "d1": 1.0}))
    fixed.choose(c)
    before = [list(r) for r in fixed.log_step_]
    fixed.observe_step(5, 1, 500.0)
    assert fixed.log_step_ == before


def SpecSelectTables(p):
    from bandit.policies.specselect import SpecTables

    w = 1000.0
    return SpecTables([[x * w for x in r] for r in p], [[w] * len(r) for r in p], [1.0] * len(p))


def test_spec_select_censored_lookup_counts_no_rejection():
    pol = SpecSelect(explore=0.0, decay=1.0, prior=1.0, lookup=["d0"], censored=True)
    pol.reset(["d0", "d1"], ["w"], Timing(k=4))
    c = Context(0, 0, 0, np.full(2, np.nan), np.full((2, 4), np.nan), np.array([4, 4]))
    pol.choose(c)
    base = pol._state(0).counts()
    pol.cut_ = (1, -1)
    pol.update(c, 1, np.array([2.0, 1.0]), np.ones(2, bool))  # d1 accepted 1: 2 tokens revealed, d0 matched both
    s = pol._state(0).counts() - base
    assert np.array_equal(s[0], [[1, 1, 0, 0], [1, 1, 0, 0]])  # 2 hits, no trial at position 2: censored
    plain = SpecSelect(explore=0.0, decay=1.0, prior=1.0, lookup=["d0"])
    plain.reset(["d0", "d1"], ["w"], Timing(k=4))
    plain.choose(c)
    plain.cut_ = (1, -1)
    plain.update(c, 1, np.array([2.0, 1.0]), np.ones(2, bool))
    assert np.array_equal((plain._state(0).counts() - base)[0], [[1, 1, 0, 0], [1, 1, 1, 0]])
