"""bench/coverage.py: the Wilson interval, the subsampling study's truth, ci.coverage_warnings, a mini study end to end."""

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest
import scipy.stats

from bandit import replay
from bandit.stats import bootstrap
from bandit.logs import schema
from bandit import ci
from bandit.stats import trajectory
from bandit.sim.simulate import SimConfig, simulate_table, write_sim_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is not installed: its modules import as bench.<name> from the root
from bench import coverage_draws as cov_draws  # the draws, their intervals, the coverage rows
from bench import coverage_sim as cov_sim  # the simulator fitted to a campaign

_spec = importlib.util.spec_from_file_location("bench_coverage", ROOT / "bench" / "coverage.py")
cov = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cov  # dataclasses look their module up there
_spec.loader.exec_module(cov)

ROW_FIELDS = {"study", "entry", "unit", "coverage", "coverage_ci", "draws", "mean_width", "label"}


@pytest.fixture(scope="module")
def table():
    return simulate_table(SimConfig(n_prompts=8, out_len=40, shared=0.3, seed=5))


@pytest.mark.parametrize("k,n", [(0, 10), (1, 10), (5, 10), (10, 10), (19, 20), (96, 100), (285, 300), (126, 300)])
def test_wilson_equals_scipy(k, n):
    ref = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert cov_draws.wilson(k, n) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_subsample_draws_without_replacement_and_truth_is_the_full_tables_value(table):
    sub = cov_draws.subsample(table, 3, seed=11)
    starts, _ = trajectory.prompt_rows(sub)
    assert np.bincount(sub.workload[starts], minlength=len(table.workloads)).tolist() == [3] * len(table.workloads)
    assert len(set(sub.prompt_ids)) == sub.n_prompts and set(sub.prompt_ids) <= set(table.prompt_ids)
    for pid in sub.prompt_ids:  # a drawn prompt comes with all its records, unchanged
        a = sub.accepted[sub.prompt == sub.prompt_ids.index(pid)]
        assert np.array_equal(a, table.accepted[table.prompt == table.prompt_ids.index(pid)])
    assert sub.dense
    assert not np.array_equal(cov_draws.subsample(table, 3, seed=12).prompt_ids, sub.prompt_ids)
    names = [
        "per_block_gap",
        "workload_headroom",
        "trajectory_oracle_gain",
        f"mean_accepted[chat][{table.drafters[0]}]",
    ]
    truth = cov_draws.truth_of(table, names, bootstrap.UNITS, "percentile")
    for unit in bootstrap.UNITS:
        full = {e.name: e.ci for e in replay.table_stats(table, unit, 50, 0, "percentile")}
        for n in names:
            if full[n].unit == unit:
                assert truth[unit][n] == full[n].value
            else:  # ci.py keeps this entry on the prompt unit: no block-unit row
                assert n not in truth[unit]
    assert "trajectory_oracle_gain" not in truth["block"]
    with pytest.raises(ValueError):
        cov_draws.subsample(table, 8, seed=0)


def test_rows_count_coverage_and_misses():
    draws = [
        {"prompt": {"g": [0.5, 0.4, 0.6]}},
        {"prompt": {"g": [0.8, 0.7, 0.9]}},
        {"prompt": {"g": [0.1, 0.0, 0.2]}},
        {"prompt": {"g": [np.nan, np.nan, np.nan]}},
        {"prompt": {}},
    ]
    (r,) = cov_draws.rows_of("subsample", "MEASURED", draws, {"prompt": {"g": 0.55}})
    assert (r["draws"], r["coverage"], r["miss_below"], r["miss_above"], r["undefined"], r["absent"]) == (
        4,
        0.25,
        1,
        1,
        1,
        1,
    )
    assert r["coverage_ci"] == [round(x, 4) for x in cov_draws.wilson(1, 4)]
    assert r["mean_width"] == pytest.approx(0.2)


def _write_rows(path, rows):
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_coverage_warnings_fire_on_under_covering_rows_only(tmp_path, table):
    entries = replay.table_stats(table, "block", 20, 0, "percentile")
    bad = {
        "study": "subsample",
        "entry": "per_block_gap",
        "unit": "block",
        "coverage": 0.42,
        "coverage_ci": [0.37, 0.48],
        "draws": 300,
        "mean_width": 0.01,
        "label": "MEASURED",
    }
    p = _write_rows(tmp_path / "bad.json", [bad])
    w = ci.coverage_warnings(entries, p)
    assert len(w) == 1
    assert w[0].startswith(f"warning: unit block under-covers for per_block_gap in {p}: 42% [37, 48]")
    # quiet: a good row, the other unit, a missing or unreadable file
    good = dict(bad, coverage=0.955, coverage_ci=[0.93, 0.97])
    assert ci.coverage_warnings(entries, _write_rows(tmp_path / "good.json", [good])) == []
    assert ci.coverage_warnings(replay.table_stats(table, "prompt", 20, 0, "percentile"), p) == []
    assert ci.coverage_warnings(entries, tmp_path / "missing.json") == []
    (tmp_path / "junk.json").write_text("{not json")
    assert ci.coverage_warnings(entries, tmp_path / "junk.json") == []
    assert ci.coverage_warnings(entries, _write_rows(tmp_path / "odd.json", [{"entry": 3}])) == []
    # a row of one cell speaks for its family, on that unit
    fam = dict(bad, entry=f"mean_accepted[chat][{table.drafters[0]}]")
    w = ci.coverage_warnings(entries, _write_rows(tmp_path / "fam.json", [fam]))
    n_cells = sum(e.name.startswith("mean_accepted[") for e in entries)
    assert len(w) == 1 and "mean_accepted[" in w[0] and f"(and {n_cells - 1} more of its family" in w[0]


def test_sim_table_is_dense_and_shaped(table):
    fit = cov_sim.fit_config(table, 4)
    t = cov_sim.sim_table(fit, 5, seed=3)
    assert t.dense and t.n_prompts == 5 * len(table.workloads) and t.label == "SIM"
    _, lens = trajectory.prompt_rows(t)
    assert (t.accepted <= (lens[t.prompt] - 1 - t.pos)[:, None]).all()
    assert set(lens) <= set(np.concatenate(fit.lengths))
    big = cov_sim.sim_table(fit, 2 * cov_sim.CHUNK + 3, seed=4)  # several generated chunks, one sorted campaign
    assert big.dense and big.n_prompts == (2 * cov_sim.CHUNK + 3) * len(table.workloads)
    assert list(big.prompt_ids) == sorted(big.prompt_ids) and len(set(big.prompt_ids)) == big.n_prompts
    assert np.array_equal(cov_sim.sim_table(fit, 5, seed=3).accepted, t.accepted)


def test_mini_study_end_to_end(tmp_path):
    write_sim_run(SimConfig(n_prompts=8, out_len=32, seed=2), tmp_path / "sim")
    out = tmp_path / "cov.json"

    def args(o):
        return [
            str(tmp_path / "sim"),
            "--quick",
            "--draws",
            "3",
            "--prompts-per-workload",
            "4",
            "--truth-prompts",
            "20",
            "--resamples",
            "40",
            "--refit",
            "2",
            "--jobs",
            "1",
            "--out",
            str(o),
            "--entries",
            "per_block_gap,workload_headroom,mean_accepted[chat][*],selector_frontier_area",
        ]

    res = cov.main(args(out))
    got = json.loads(out.read_text())
    assert got == json.loads(json.dumps(res))
    assert {"inputs", "code_version", "settings", "seed", "rows"} <= set(got)
    assert got["inputs"] and all(len(i["sha256"]) == 64 for i in got["inputs"])
    assert got["code_version"] == schema.code_version("bandit")
    assert got["settings"]["draws"] == 3 and got["settings"]["prompts_per_workload"] == 4
    rows = got["rows"]
    assert {(r["study"], r["unit"]) for r in rows} == {(s, u) for s in cov_draws.STUDIES for u in bootstrap.UNITS}
    for r in rows:
        assert ROW_FIELDS <= set(r)
        assert r["label"] == "SIM" and r["draws"] == 3
        assert 0 <= r["coverage"] <= 1 and r["coverage_ci"][0] <= r["coverage"] <= r["coverage_ci"][1]
    assert {r["entry"] for r in rows} >= {"per_block_gap", "selector_frontier_area", "mean_accepted[chat][cascade]"}
    # the same seed gives the same file
    out2 = tmp_path / "cov2.json"
    cov.main(args(out2))
    assert out2.read_text() == out.read_text()
