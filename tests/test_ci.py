"""The bootstrap engine against scipy and brute force, and ci.json against independent computations."""

import json

import numpy as np
import pytest
import scipy.stats

from bandit import replay, selector_fit
from bandit.stats import bootstrap
from bandit import ci
from bandit.sim.simulate import SimConfig, simulate_table, write_sim_run

FIELDS = {
    "name",
    "value",
    "ci",
    "method",
    "unit",
    "n_resamples",
    "seed",
    "n_blocks",
    "n_clusters",
    "label",
    "inputs",
    "code_version",
    "command",
}


@pytest.fixture(scope="module")
def table():
    return simulate_table(SimConfig(n_prompts=8, out_len=60, shared=0.3, seed=3))


def test_resample_counts_stratified_and_deterministic():
    strata = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    c = bootstrap.resample_counts(strata, 1000, seed=7)
    assert c.shape == (1000, 10)
    for s, n in ((0, 3), (1, 2), (2, 5)):
        assert (c[:, strata == s].sum(1) == n).all()  # every stratum keeps its size
    assert np.array_equal(c, bootstrap.resample_counts(strata, 1000, seed=7))
    assert not np.array_equal(c, bootstrap.resample_counts(strata, 1000, seed=8))
    # each cluster is drawn Binomial(n_s, 1/n_s) times: mean 1
    assert np.allclose(c.mean(0), 1.0, atol=0.1)


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_ratio_agrees_with_scipy_bootstrap(method):
    rng = np.random.default_rng(0)
    den = rng.integers(1, 30, 200).astype(float)
    num = den * rng.gamma(2.0, 1.0, 200)  # skewed ratio: BCa and percentile differ
    n = 4000
    mine = bootstrap.bootstrap_ratio(num, den, np.zeros(200, int), n, seed=1, method=method)
    ref = scipy.stats.bootstrap(
        (num, den),
        lambda a, b, axis=-1: a.sum(axis) / b.sum(axis),
        paired=True,
        vectorized=True,
        n_resamples=n,
        method=method,
        random_state=2,
    ).confidence_interval
    se = np.std([bootstrap.bootstrap_ratio(num, den, np.zeros(200, int), 400, s, method).lo for s in range(5)])
    width = ref.high - ref.low
    assert mine.value == pytest.approx(num.sum() / den.sum())
    # Monte-Carlo error of an endpoint with 4000 resamples is a few percent of the width
    assert abs(mine.lo - ref.low) < 0.08 * width and abs(mine.hi - ref.high) < 0.08 * width, (mine, ref, se)


def test_vectorised_gap_equals_refit_on_materialised_resamples(table):
    """The count-matrix path and a brute-force path (rebuild each resampled table, recompute) give the same CI:
    on a dense log the primary and its block set re-chosen in every resample; on a sparse one, the best fixed."""
    from dataclasses import replace
    from bandit.replay import summarize

    for name in ("per_block_gap", "workload_headroom", "trajectory_oracle_gain"):
        fast = next(e.ci for e in replay.table_stats(table, "prompt", 60, 5, "percentile") if e.name == name)
        key = {"trajectory_oracle_gain": None}.get(name, name)

        def stat(t, name=name, key=key):
            s = summarize(t)
            return getattr(s, key) if key else s.trajectory["oracle"] / s.trajectory[s.best_fixed_name] - 1

        slow = bootstrap.bootstrap_refit(table, stat, "prompt", 60, 5)
        assert fast.value == pytest.approx(stat(table))
        assert (fast.lo, fast.hi) == pytest.approx((slow.lo, slow.hi), rel=1e-12), name
    sparse = replace(table.blocks(), dense=False)

    def gap(t):
        a = t.accepted.astype(float)
        return a.max(1).mean() / a.mean(0).max() - 1

    for unit in ("prompt", "block"):
        fast = next(e.ci for e in replay.table_stats(sparse, unit, 60, 5, "percentile") if e.name == "per_block_gap")
        slow = bootstrap.bootstrap_refit(sparse, gap, unit, 60, 5)
        assert fast.value == pytest.approx(gap(sparse))
        assert (fast.lo, fast.hi) == pytest.approx((slow.lo, slow.hi), rel=1e-12)


def _walk(a: np.ndarray, d: int) -> list[int]:
    pos, out = 0, []
    while pos < len(a):
        out.append(pos)
        pos += int(a[pos, d]) + 1
    return out


def test_headline_values_equal_independent_computation(table):
    entries = {e.name: e for e in ci.headline(table, n_resamples=50, n_refit=4)}
    D = len(table.drafters)
    rows, passes, tokens = [], np.zeros((table.n_prompts, D), int), np.zeros(table.n_prompts, int)
    for q in range(table.n_prompts):
        a = table.accepted[table.prompt == q]
        tokens[q] = len(a)
        for d in range(D):
            passes[q, d] = len(_walk(a, d))
    p = int(np.argmin(passes.sum(0)))
    wq = np.array([table.workload[table.prompt == q][0] for q in range(table.n_prompts)])
    for q in range(table.n_prompts):
        a = table.accepted[table.prompt == q]
        rows += [dict(zip(table.drafters, a[i]), w=table.workloads[wq[q]]) for i in _walk(a, p)]
    for w in table.workloads:  # plain Python means over the primary's blocks, grouped by hand
        mine = [r for r in rows if r["w"] == w]
        for d in table.drafters:
            assert entries[f"mean_accepted[{w}][{d}]"].ci.value == pytest.approx(sum(r[d] for r in mine) / len(mine))
            j = table.drafters.index(d)
            want = tokens[wq == table.workloads.index(w)].sum() / passes[wq == table.workloads.index(w), j].sum()
            assert entries[f"tokens_per_pass[{w}][{d}]"].ci.value == pytest.approx(want)
    pn = table.drafters[p]
    best = sum(max(r[d] for d in table.drafters) for r in rows) / len(rows)
    assert entries["per_block_gap"].ci.value == pytest.approx(best / (sum(r[pn] for r in rows) / len(rows)) - 1)
    best_w = sum(passes[wq == w].sum(0).min() for w in range(len(table.workloads)))
    assert entries["workload_headroom"].ci.value == pytest.approx(passes[:, p].sum() / best_w - 1)
    # trajectory oracle: brute-force recursion over one prompt at a time
    passes_oracle = 0
    for q in range(table.n_prompts):
        a = table.accepted[table.prompt == q]
        n = len(a)
        f = np.zeros(n + 1, int)
        for i in range(n - 1, -1, -1):
            f[i] = 1 + min(f[min(n, i + a[i, d] + 1)] for d in range(a.shape[1]))
        passes_oracle += f[0]
    assert entries["trajectory_oracle_gain"].ci.value == pytest.approx(passes[:, p].sum() / passes_oracle - 1)
    assert entries["greedy_oracle_gain"].ci.value <= entries["trajectory_oracle_gain"].ci.value
    for e in entries.values():
        assert e.ci.lo <= e.ci.value <= e.ci.hi or not np.isfinite(e.ci.value) or e.ci.warning
    assert entries["selector_speedup"].label == "MODEL" and entries["per_block_gap"].label == "SIM"
    point = selector_fit.nested(table, np.ones((1, table.n_prompts)))
    assert entries["selector_frontier_area"].ci.value == pytest.approx(point.areas["logistic"][0, -1], rel=1e-5)
    assert entries["selector_frontier_area_conf_min[chat]"].ci.value == pytest.approx(
        point.areas["conf_min"][0, table.workloads.index("chat")], rel=1e-5
    )


def test_ci_json_fields_and_byte_identical(tmp_path):
    write_sim_run(SimConfig(n_prompts=5, out_len=48, seed=1), tmp_path / "sim")
    outs = []
    for i in range(2):
        ci.main([tmp_path / "sim"], tmp_path / f"ci{i}.json", n_resamples=40, seed=3, n_refit=3)
        outs.append((tmp_path / f"ci{i}.json").read_bytes())
    assert outs[0] == outs[1]
    data = json.loads(outs[0])
    names = {e["name"] for e in data}
    assert {
        "per_block_gap",
        "workload_headroom",
        "trajectory_oracle_gain",
        "greedy_oracle_gain",
        "selector_token_gain",
        "selector_redraft_rate",
        "selector_speedup",
        "selector_frontier_area",
        "selector_frontier_area[copy]",
        "selector_frontier_area_conf_min[code]",
        "selector_frontier_area_draft_empty",
        "mean_accepted[code][ngram]",
        "tokens_per_pass[code][ngram]",
    } <= names
    for e in data:
        assert set(e) - {"warning"} == FIELDS and isinstance(e.get("warning", ""), str)
        assert e["inputs"][0]["sha256"] and e["inputs"][0]["path"].endswith("blocks_sim.jsonl.gz")
        assert e["seed"] == 3 and e["label"] in ("SIM", "MODEL")
    gap = next(e for e in data if e["name"] == "per_block_gap")
    assert gap["n_resamples"] == 40 and gap["unit"] == "prompt" and gap["n_clusters"] == 20
    assert next(e for e in data if e["name"] == "selector_frontier_area")["n_resamples"] == 3
    ci.main([tmp_path / "sim"], tmp_path / "other.json", n_resamples=40, seed=4, n_refit=3)
    assert (tmp_path / "other.json").read_bytes() != outs[0]


def test_block_unit_counts_blocks(table):
    from bandit.stats import trajectory

    e = next(e for e in replay.table_stats(table, "block", 30, 0, "percentile") if e.name == "per_block_gap")
    n = trajectory.block_set(table).n_records
    assert e.n_clusters == e.n_blocks == n and e.ci.unit == "block"
    tr = next(e for e in replay.table_stats(table, "block", 30, 0, "percentile") if e.name == "trajectory_oracle_gain")
    assert tr.ci.unit == "prompt"  # a trajectory lives inside one prompt


def test_disagreement_warning_and_bad_method():
    boot = np.random.default_rng(0).uniform(0, 1, 2000)
    assert bootstrap.interval(0.0, boot, None, "percentile", "prompt", 0).warning  # estimate at the edge: non-smooth
    assert bootstrap.interval(0.5, boot, None, "percentile", "prompt", 0).warning is None
    with pytest.raises(ValueError, match="method"):
        bootstrap.interval(0.5, boot, None, "studentized", "prompt", 0)
    with pytest.raises(ValueError, match="unit"):
        bootstrap.cluster_units(simulate_table(SimConfig(n_prompts=2, out_len=20)), "token")


def test_resample_table_keeps_dense_copies_as_clusters(table):
    units, strata = bootstrap.cluster_units(table, "prompt")
    counts = np.zeros(strata.size, int)
    counts[[0, 3]] = [2, 1]
    r = bootstrap.resample_table(table, counts, units)
    assert (
        r.n_prompts == 3
        and r.dense
        and r.n_records == (2 * int((table.prompt == 0).sum()) + int((table.prompt == 3).sum()))
    )
    assert r.prompt_ids[0].endswith("#0") and r.prompt_ids[1].endswith("#1")
