"""The per-block selector: outcomes by brute force, the nested threshold, no test-data leakage, planted truth."""
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from bandit import selector
from bandit.breakeven import speedup_equal
from bandit.simulate import SimConfig, simulate_table


@pytest.fixture(scope="module")
def data():
    t = simulate_table(SimConfig(n_prompts=12, out_len=60, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=5))
    return selector.selector_data(t.blocks())


def test_curve_matches_brute_force():
    rng = np.random.default_rng(0)
    a_p = rng.integers(0, 5, 300).astype(float)
    a_best = a_p + rng.integers(0, 3, 300) * (rng.random(300) < 0.4)
    s, w = rng.random(300), rng.integers(0, 3, 300).astype(float)
    c = selector.curve(s, np.array([0.3, 0.7]), a_p, a_best, w)
    for i, thr in enumerate([0.3, 0.7]):
        num = den = rr = sel = base = 0.0
        for j in range(300):
            r = s[j] >= thr
            sel += w[j] * (a_best[j] if r else a_p[j]); base += w[j] * a_p[j]
            num += w[j] * (a_best[j] - a_p[j]) * r; den += w[j] * (a_best[j] - a_p[j]); rr += w[j] * r
        R = rr / w.sum()
        assert c["redraft_rate"][i] == pytest.approx(R)
        assert c["capture"][i] == pytest.approx(num / den)
        assert c["skill"][i] == pytest.approx(num / den / R)
        assert c["token_gain"][i] == pytest.approx((sel + w.sum()) / (base + w.sum()) - 1)


def test_nested_threshold_equals_hand_inner_lowo(data):
    """Threshold = argmax of the criterion over the pooled inner out-of-fold predictions (sklearn's own predict_proba)."""
    tr = data.workload != 0
    X, ap, ab, g = data.X[tr], data.a_p[tr], data.a_best[tr], data.workload[tr]
    est = selector.NestedSelector(criterion="speedup", n_alternatives=3).fit(X, ap, ab, g)
    oof = np.zeros(len(X))
    for k in np.unique(g):
        m = make_pipeline(StandardScaler(), LogisticRegression()).fit(X[g != k], (ab > ap)[g != k])
        oof[g == k] = m.predict_proba(X[g == k])[:, 1]
    best, best_thr = -np.inf, None
    for thr in selector.LEVELS:
        r = oof >= thr
        gain = ((ab - ap) * r).sum() / (ap + 1).sum()
        v = speedup_equal(gain, r.mean(), 3, 0.10, 0.0)
        if v > best + 1e-12:
            best, best_thr = v, thr
    assert est.threshold_ == pytest.approx(best_thr)
    full = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, ab > ap)
    assert est.decision_function(X) == pytest.approx(full.predict_proba(X)[:, 1], abs=2e-3)  # solvers differ (lbfgs tol)


def test_weights_equal_repeated_rows(data):
    rng = np.random.default_rng(1)
    w = rng.integers(0, 3, data.a_p.size)
    idx = np.repeat(np.arange(w.size), w)
    a = selector.NestedSelector(criterion="net").fit(data.X, data.a_p, data.a_best, data.workload, w)
    b = selector.NestedSelector(criterion="net").fit(data.X[idx], data.a_p[idx], data.a_best[idx], data.workload[idx])
    assert a.threshold_ == b.threshold_
    assert a.decision_function(data.X) == pytest.approx(b.decision_function(data.X), abs=1e-4)


def test_held_out_labels_cannot_move_the_threshold(data):
    """Poison the held-out workload's outcomes: its fold's threshold and model stay; poisoning a training one moves them."""
    w = np.ones(data.a_p.size)
    _, _, fits = selector.lowo_arrays(data, w, "logistic", "net")
    held = 1
    rng = np.random.default_rng(2)
    for victim, should_move in ((held, False), (2, True)):
        a_best = data.a_best.copy()
        m = data.workload == victim
        a_best[m] = np.where(rng.random(m.sum()) < 0.5, data.a_p[m] + 6, data.a_p[m])   # labels scrambled
        poisoned = selector.SelectorData(data.X, data.a_p, a_best, data.workload, data.primary, data.alternatives)
        _, _, fits2 = selector.lowo_arrays(poisoned, w, "logistic", "net")
        same = (fits2[held].threshold_ == fits[held].threshold_ and
                np.allclose(fits2[held].inner_curve_["capture"], fits[held].inner_curve_["capture"]) and
                np.allclose(fits2[held].model_[3], fits[held].model_[3]))
        assert same != should_move


def test_frontier_shape(data):
    t = simulate_table(SimConfig(n_prompts=6, out_len=50, shared=0.0, seed=2))
    res = selector.lowo(t, "ent_mean", "net")
    R, C, g = selector.frontier(res)
    assert R[0] == 0 and C[0] == 0 and R[-1] == pytest.approx(1) and C[-1] == pytest.approx(1)
    assert (np.diff(R) > 0).all() and (np.diff(C) >= -1e-12).all()
    assert g[-1] == pytest.approx(res.bon_gain)


def test_planted_truth_skill_cis():
    """Confidence signal on chat, code, math and none on copy: skill CIs above 1 on the three, containing 1 on copy."""
    t = simulate_table(SimConfig(n_prompts=40, out_len=80, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=0))
    res = selector.lowo(t, "logistic", "net", n_resamples=60, seed=0)
    v = {f.workload: f for f in res.folds}
    for w in ("chat", "code", "math"):
        assert v[w].skill_ci[0] > 1, v[w]
        assert v[w].verdict == "beats random"
    assert v["copy"].skill_ci[0] <= 1 <= v["copy"].skill_ci[1], v["copy"]
    assert res.primary == "dflash" and set(res.alternatives) == {"cascade", "eagle", "ngram"}


def test_baselines_share_the_protocol(data):
    t = simulate_table(SimConfig(n_prompts=6, out_len=50, seed=2))
    for score in ("conf_min", "ent_mean"):
        res = selector.lowo(t, score, "net")
        assert [f.workload for f in res.folds] == list(t.workloads)
        assert all(score in f.threshold for f in res.folds)
    with pytest.raises(ValueError, match="score"):
        selector.lowo(t, "oracle")
