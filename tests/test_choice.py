"""The choice selector (bandit/policies/choice.py) on planted tables: where the lookup's draft length says which drafter
wins it must choose right and beat every fixed drafter in modelled tokens per ms; leave-one-workload-out
routing must use the rule fitted without the held-out workload."""

from dataclasses import replace

import numpy as np
import pytest
from sklearn.base import clone

from bandit.policies import choice
from bandit.logs.schema import Context, Timing
from bandit.logs.table import BlockTable
from bandit.policies.walk import live_walk

K = 8
TIMING = Timing(
    k=K, lookup=("ngram",), verify_tokens=(1.0, 9.0), verify_ms=(1.0, 1.2), drafter_ms={"model": 1.0, "ngram": 0.01}
)


def planted(copy_share=(0.5, 0.3, 0.7), flip=(), n_prompts=8, n=80, seed=0) -> BlockTable:
    """Dense log, drafters (model, ngram), one workload per entry of copy_share. Each output alternates copied
    spans (the n-gram drafts k(pos) = min(K, n - 1 - pos) tokens, all accepted; the model accepts 1) and novel
    ones (no n-gram draft; the model accepts 6). Workloads in `flip` reverse it: there a long n-gram draft is
    rejected and the model accepts 6."""
    rng = np.random.default_rng(seed)
    W = len(copy_share)
    rows = []
    for w in range(W):
        for q in range(n_prompts):
            pos, copy = 0, bool(rng.random() < copy_share[w])
            while pos < n:
                span = int(rng.integers(4, 16))
                for p in range(pos, min(pos + span, n)):
                    k = min(K, n - 1 - p)
                    if copy:
                        a = (0, 6) if w in flip else (k, 1)
                        rows.append((w, w * n_prompts + q, p, (min(a[1], k), min(a[0], k)), (k, k), True))
                    else:
                        rows.append((w, w * n_prompts + q, p, (min(6, k), 0), (k, 0), False))
                pos += span
                copy = bool(rng.random() < copy_share[w])
    R = len(rows)
    feats = np.zeros((R, 2, 4))
    feats[[i for i, r in enumerate(rows) if r[5] and r[4][1] > 0], 1] = (0.9, 0.8, 0.9, 0.1)
    feats[:, 0] = (0.5, 0.3, 0.5, 1.0)
    return BlockTable(
        drafters=("model", "ngram"),
        workloads=tuple(f"w{w}" for w in range(W)),
        prompt_ids=tuple(f"w{w}/p{q}" for w in range(W) for q in range(n_prompts)),
        workload=np.array([r[0] for r in rows], np.int32),
        prompt=np.array([r[1] for r in rows], np.int32),
        pos=np.array([r[2] for r in rows], np.int64),
        block=np.full(R, -1, np.int64),
        accepted=np.array([r[3] for r in rows], np.int32),
        draft_len=np.array([r[4] for r in rows], np.int32),
        expected_accepted=np.full((R, 2), np.nan),
        features=feats,
        ms=np.full((R, 2), np.nan),
        target_ms=np.full(R, np.nan),
        label="SIM",
        dense=True,
    )


def ctx_of(t, r, w=None):
    look = np.array([d in TIMING.lookup for d in t.drafters])
    df = np.where(look[:, None], t.features[r], np.nan)
    D = len(t.drafters)
    wl = int(t.workload[r]) if w is None else w
    return Context(wl, 0, int(t.pos[r]), np.full(D, np.nan), np.full((D, 4), np.nan), t.draft_len[r].copy(), df)


def test_planted_rule_chooses_the_winner_and_beats_every_fixed_drafter():
    t = planted()
    prep = choice.Prepared.of(t, TIMING)
    sel = choice.ChoiceSelector().fit(prep)
    sel.reset(t.drafters, t.workloads, TIMING)
    # the right drafter wherever the n-gram has a draft (copied: ngram) or not (novel: model), k > 0
    inner = np.flatnonzero(t.draft_len[:, 0] > 2)
    want = np.where(t.draft_len[inner, 1] > 0, 1, 0)
    got = np.array([sel.choose(ctx_of(t, r)) for r in inner])
    assert np.array_equal(got, want)
    assert np.array_equal(sel.decide_rows(prep)[inner], want)
    # its own trajectory, replayed as the live engine runs it, in modelled tokens per ms
    prompts = np.arange(t.n_prompts)
    rows, chosen, _, _ = live_walk(t, sel, prompts, TIMING)
    rate = prep.lengths.sum() / prep.cost[rows, chosen].sum()
    fixed = prep.fixed_rates(prompts)
    assert rate > 1.15 * fixed.max(), (rate, fixed)
    # the fast vectorised walk the fit uses follows the same trajectory
    tok, ms, r2 = prep.walk(sel.decide_rows(prep), prompts)
    assert np.array_equal(np.sort(r2), np.sort(rows)) and np.isclose(tok / ms, rate)


def test_fixed_rates_by_hand():
    t = planted(copy_share=(0.5,), n_prompts=2)
    prep = choice.Prepared.of(t, TIMING)
    for d in range(2):
        tok = ms = 0.0
        for p in range(t.n_prompts):
            rows = np.flatnonzero(t.prompt == p)
            pos = 0
            while pos < len(rows):
                r = rows[pos]
                ms += float(TIMING.verify(1 + t.draft_len[r, d])) + TIMING.drafter_ms[t.drafters[d]]
                pos += int(t.accepted[r, d]) + 1
            tok += len(rows)
        assert np.isclose(prep.fixed_rates(np.arange(t.n_prompts))[d], tok / ms)


def test_one_row_design_is_the_batch_design():
    t = planted(n_prompts=3)
    rng = np.random.default_rng(1)
    dl = rng.integers(0, K + 1, (50, 3)).astype(float)
    f = rng.random((50, 3, 4))
    f[3, 1] = np.nan
    krow = rng.integers(0, K + 1, 50).astype(float)
    X = choice.design(dl, f, krow, K)
    X1 = np.array([choice.design_one(dl[i].tolist(), f[i].tolist(), float(krow[i]), K) for i in range(50)])
    assert X.shape == (50, 3 * 10 + 3 * 2 + 1) and np.array_equal(X, X1)
    assert t.n_records > 0


def test_lowo_routes_each_workload_to_the_rule_fitted_without_it():
    t = planted(copy_share=(0.5, 0.4, 0.6), flip=(2,))
    prep = choice.Prepared.of(t, TIMING)
    rules = choice.fit_lowo(prep)
    assert set(rules) == set(t.workloads)
    for w, name in enumerate(t.workloads):
        mask = np.arange(3) != w
        assert rules[name].train_workloads_ == tuple(np.array(t.workloads)[mask])
        ref = choice.ChoiceSelector().fit(prep, mask)
        assert np.array_equal(rules[name].coef_, ref.coef_) and rules[name].lam_ == ref.lam_
    pol = choice.routed(prep)
    pol.reset(t.drafters, t.workloads, TIMING)
    # on w2, where a long n-gram draft is rejected, the rule that never saw w2 still takes the n-gram draft,
    # and the routed policy follows that rule, not the one fitted on every workload
    r = int(np.flatnonzero((t.workload == 2) & (t.draft_len[:, 1] == K))[0])
    assert rules["w2"].choose(ctx_of(t, r)) == 1 and pol.choose(ctx_of(t, r)) == 1
    for r in np.random.default_rng(2).choice(t.n_records, 200, replace=False):
        for w, name in enumerate(t.workloads):
            assert pol.choose(ctx_of(t, r, w)) == rules[name].choose(ctx_of(t, r, w))
        # a workload no rule was fitted for (-1: not among the campaign's) runs the rule fitted on every workload
        assert pol.choose(ctx_of(t, r, -1)) == pol.fallback.choose(ctx_of(t, r, -1))


def test_sklearn_conventions_and_refusals():
    sel = choice.ChoiceSelector(ridge=2.0, inner_cv=False, random_state=3)
    assert not [k for k in vars(sel) if k.endswith("_")]  # no work in __init__
    c = clone(sel)
    assert c.get_params()["ridge"] == 2.0 and c.get_params()["random_state"] == 3
    t = planted(n_prompts=3)
    c.fit(t, np.array([True, False, True]), TIMING)
    assert c.train_workloads_ == ("w0", "w2") and c.name == "selector" and c.full_information is False
    with pytest.raises(ValueError, match="measured"):
        choice.ChoiceSelector().fit(t, None, Timing(k=K, lookup=("ngram",)))
    no_lookup = replace(t, drafters=("model", "other"))
    ms = {"model": 1.0, "other": 0.1}
    with pytest.raises(ValueError, match="lookup"):
        choice.ChoiceSelector().fit(no_lookup, None, Timing(k=K, verify_tokens=(1.0,), verify_ms=(1.0,), drafter_ms=ms))
    with pytest.raises(ValueError, match="fitted for drafters"):
        c.reset(("a", "b"), t.workloads, TIMING)
