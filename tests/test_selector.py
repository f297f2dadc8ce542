"""The selector: frontier area against scikit-learn's AUC and brute force, the operating point against an exhaustive
search, no path from held-out outcomes to a fold's rule, weights as repeated prompts, planted signal."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bandit import selector_fit
from bandit.stats import bootstrap
from bandit import selector
from bandit.stats import trajectory
from bandit.stats.costmodel import Costs
from bandit.sim.simulate import SimConfig, simulate_table


@pytest.fixture(scope="module")
def table():
    return simulate_table(SimConfig(n_prompts=10, out_len=60, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=5))


def test_frontier_area_of_a_binary_gain_is_the_gains_curve_of_the_auc():
    """With up in {0, 1}: area under the cumulative-gains curve = pi / 2 + (1 - pi) AUC (pi = share of positives)."""
    rng = np.random.default_rng(0)
    for trial in range(5):
        up = (rng.random(400) < 0.3).astype(float)
        s = up * rng.normal(1.0, 1.0, 400) + rng.normal(0, 1, 400)
        s = np.round(s, 1)  # ties: roc_auc_score counts a tie as one half, as our linear step does
        pi = up.mean()
        want = pi / 2 + (1 - pi) * roc_auc_score(up, s)
        assert selector_fit.frontier_area(s, np.ones(400), up) == pytest.approx(want, abs=1e-12)
        assert selector_fit.frontier_area(-s, np.ones(400), up) < 0.5 < want


def test_frontier_area_with_ties_is_the_mean_over_tie_orders():
    """Brute force: every order of the tied blocks, a step curve each, averaged."""
    s = np.array([3.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    up = np.array([0.0, 2.0, 0.0, 1.0, 3.0, 0.0])
    w = np.array([1.0, 2.0, 1.0, 1.0, 1.0, 3.0])

    def step_area(order):
        R = np.r_[0, np.cumsum(w[order])] / w.sum()
        C = np.r_[0, np.cumsum((w * up)[order])] / (w * up).sum()
        return np.sum(np.diff(R) * (C[1:] + C[:-1]) / 2)

    areas = [step_area([0, *p, 4, 5]) for p in itertools.permutations([1, 2, 3])]
    assert selector_fit.frontier_area(s, w, up) == pytest.approx(np.mean(areas))
    # a weight-2 block is two copies of it
    s2, up2 = np.r_[s, 2.0], np.r_[up, 2.0]
    w2 = np.r_[w[0], 1.0, w[2:], 1.0]
    assert selector_fit.frontier_area(s2, w2, up2) == pytest.approx(selector_fit.frontier_area(s, w, up))


def _costs(D, rho, union):
    return Costs(tuple(f"d{j}" for j in range(D)), np.asarray(rho, float), np.asarray(union, float), "measured")


def test_operating_point_is_the_exhaustive_best():
    rng = np.random.default_rng(3)
    D = 4
    for trial in range(10):
        n = 40
        tau = rng.integers(1, 6, (n, D)).astype(float)
        s = np.round(rng.random(n), 2)
        w = rng.integers(0, 3, n).astype(float)
        costs = _costs(D, rng.uniform(0, 0.3, D), np.r_[0, 0, np.sort(rng.uniform(0, 0.6, D - 1))])
        p = int(rng.integers(D))
        rule = selector_fit.choose_rule(s, w, tau, p, costs)
        best, best_rule = 1.0, ((), np.inf)
        for alts in selector_fit.alternative_sets(D, p):
            for thr in np.unique(s[w > 0]):
                r = s >= thr
                g = (w * r) @ (tau[:, list(alts) + [p]].max(1) - tau[:, p]) / (w @ tau[:, p])
                c0 = 1 + costs.rho[p]
                c = c0 + (w @ r) / w.sum() * (costs.rho[list(alts)].sum() + costs.union[1 + len(alts)])
                v = (1 + g) * c0 / c
                if v > best + 1e-12:
                    best, best_rule = v, (alts, thr)
        assert rule.speedup == pytest.approx(best)
        assert rule.alts == best_rule[0]
        if rule.kind == "threshold":
            assert rule.threshold == best_rule[1]
        elif rule.kind == "always":
            assert best_rule[1] == s[w > 0].min()


def test_sets_searched():
    assert selector_fit.alternative_sets(4, 1) == [(0,), (2,), (3,), (0, 2), (0, 3), (2, 3), (0, 2, 3)]
    assert selector_fit.alternative_sets(2, 0) == [(1,)]


def test_expensive_redrafts_give_a_degenerate_never_rule(table):
    D = len(table.drafters)
    res = selector_fit.nested(
        table, np.ones((1, table.n_prompts)), costs=_costs(D, [5.0] * D, np.r_[0, 0, [9.0] * (D - 1)])
    )
    for s in selector_fit.SCORES:
        for g in range(len(table.workloads)):
            assert res.rules[s][g][0].kind == "never"
            assert res.outcome(s, g)["redraft_rate"][0] == 0
    assert res.outcome("logistic")["speedup"][0] == pytest.approx(1.0)


def test_held_out_outcomes_cannot_move_the_fold_rule(table):
    """Scramble one workload's accepted lengths: its own fold's primary and rule stay; another fold's move."""
    base = selector_fit.nested(table, np.ones((1, table.n_prompts)), scores=("logistic", "conf_min"))
    rng = np.random.default_rng(2)
    held = 1
    for victim, should_move in ((held, False), (2, True)):
        acc = table.accepted.copy()
        m = table.workload == victim
        acc[m] = rng.integers(0, 9, acc[m].shape)
        poisoned = selector_fit.nested(
            replace(table, accepted=acc), np.ones((1, table.n_prompts)), scores=("logistic", "conf_min")
        )
        same = all(poisoned.rules[s][held][0] == base.rules[s][held][0] for s in ("logistic", "conf_min"))
        assert same != should_move


def test_prompt_weights_equal_repeated_prompts(table):
    """Weight c on a prompt = the prompt present c times (the bootstrap's weights path against materialised copies)."""
    units, strata = bootstrap.cluster_units(table, "prompt")
    counts = bootstrap.resample_counts(strata, 1, seed=4)[0]
    a = selector_fit.nested(table, counts[None, :].astype(float), scores=("logistic", "ent_mean"))
    b = selector_fit.nested(
        bootstrap.resample_table(table, counts, units),
        None or np.ones((1, int(counts.sum()))),
        scores=("logistic", "ent_mean"),
    )
    for s in ("logistic", "ent_mean"):
        np.testing.assert_allclose(a.areas[s], b.areas[s], atol=1e-9)
        for k in ("token_gain", "redraft_rate", "speedup"):
            np.testing.assert_allclose(a.outcome(s)[k], b.outcome(s)[k], atol=1e-9)


def test_batched_resamples_equal_one_at_a_time(table):
    units, strata = bootstrap.cluster_units(table, "prompt")
    counts = bootstrap.resample_counts(strata, 3, seed=1).astype(float)
    batch = selector_fit.nested(table, counts, scores=("logistic",))
    for i in range(3):
        one = selector_fit.nested(table, counts[i : i + 1], scores=("logistic",))
        np.testing.assert_allclose(batch.areas["logistic"][i], one.areas["logistic"][0], atol=1e-9)
        for rb, ro in zip((r[i] for r in batch.rules["logistic"]), (r[0] for r in one.rules["logistic"])):
            assert (rb.primary, rb.alts) == (ro.primary, ro.alts)
            assert rb.threshold == pytest.approx(ro.threshold, rel=1e-7) and rb.speedup == pytest.approx(ro.speedup)


def test_planted_signal_frontier_area_cis():
    """Confidence signal on chat, code and math, none on copy: the area CI above 0.5 on the three, containing it on copy."""
    t = simulate_table(SimConfig(n_prompts=30, out_len=80, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=0))
    e = {x.name: x.ci for x in selector.selector_entries(t, "prompt", 60, 0, "percentile")}
    for w in ("chat", "code", "math"):
        assert e[f"selector_frontier_area[{w}]"].lo > 0.5, (w, e[f"selector_frontier_area[{w}]"])
    c = e["selector_frontier_area[copy]"]
    assert c.lo <= 0.5 <= c.hi, c


def test_scores_and_workloads_checked(table):
    with pytest.raises(ValueError, match="score"):
        selector_fit.nested(table, np.ones((1, table.n_prompts)), scores=("oracle",))
    one = table.take_prompts(
        np.isin(np.arange(table.n_prompts), np.flatnonzero(table.workload[trajectory.prompt_rows(table)[0]] == 0))
    )
    with pytest.raises(ValueError, match="two workloads"):
        selector_fit.nested(replace(one, workloads=one.workloads[:1]), np.ones((1, one.n_prompts)))


def test_main_prints_intervals_and_writes_beside_the_run(tmp_path):
    from bandit.sim.simulate import write_sim_run

    write_sim_run(SimConfig(n_prompts=4, out_len=40, seed=2), tmp_path / "sim")
    before = set(tmp_path.rglob("*"))
    text = selector.main([tmp_path / "sim"])  # every option at its default (issue 24: else printed only)
    new = set(tmp_path.rglob("*")) - before  # one run given: its outputs beside it
    assert {p.relative_to(tmp_path).as_posix() for p in new} == {
        "sim/selector.txt",
        "sim/selector_frontier.png",
        "sim/selector_frontier.csv",
    }
    rows = [x for x in text.splitlines() if x.startswith("| logistic | ")]
    assert len(rows) == 1 + 4 + 1  # the area row, 4 folds, pooled
    assert all("[" in x for x in rows if "undefined" not in x)  # every cell with its interval
    out = selector.main([tmp_path / "sim"], n_resamples=8, seed=1, out_dir=tmp_path / "out")
    assert (tmp_path / "out" / "selector.txt").read_text() in out and (
        tmp_path / "out" / "selector_frontier.png"
    ).exists()
