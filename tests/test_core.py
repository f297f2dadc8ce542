"""Policy replay and the calibrated simulation, checked on simulated logs with planted structure."""
import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from bandit import core, replay
from bandit.cli import app
from bandit.policies import EXP3, UCB1, Fixed, Hedge, HedgeCtx, LinUCB, ThompsonCtx, make_policies
from bandit.simulate import SimConfig, simulate_table, true_mean_accepted, write_sim_run

SMALL = dict(n_prompts=40, out_len=120, dense=False, seed=4, workload_shift=(0.0, 0.0, 0.0, 0.0))
NO_FLIPS = SimConfig(drafter_accept=(0.75, 0.80, 0.65, 0.50), **SMALL)
FLIPS = SimConfig(drafter_accept=(0.72,) * 4, ranking_flips=True, flip_margin=0.6, **SMALL)
CONTEXTUAL = ("thompson_ctx", "hedge_ctx", "linucb")


@pytest.fixture(scope="module")
def no_flips():
    t = simulate_table(NO_FLIPS)
    return t, core.evaluate(t, "block", [ThompsonCtx(), HedgeCtx(), LinUCB()], seeds=(0, 1), n_resamples=300)


@pytest.fixture(scope="module")
def flips():
    t = simulate_table(FLIPS)
    pols = [ThompsonCtx(), HedgeCtx(), LinUCB(), UCB1(), EXP3(), Hedge()]
    return t, core.evaluate(t, "block", pols, seeds=(0, 1), n_resamples=300)


def planted_headroom(cfg, t):
    """Workload-oracle headroom of the planted means, weighted by the log's blocks per workload."""
    m = true_mean_accepted(cfg)
    n_w = np.bincount(t.workload[t.is_block_start], minlength=len(cfg.workloads)).astype(float)
    return (n_w @ m.max(1)) / (n_w @ m).max() - 1


def test_every_policy_trajectory_tiles_each_output_exactly():
    """In trajectory mode each policy's blocks start at 0, follow pos + reward + 1, and end at the output's end."""
    t = simulate_table(SimConfig(n_prompts=4, out_len=50, dense=True, seed=3))
    order = np.random.default_rng(5).permutation(t.n_prompts)
    for pol in make_policies(random_state=2):
        tr = core.run_policy(t, pol, "trajectory", order)
        assert tr.row.size == tr.chosen.size == tr.reward.size > 0, pol.name
        for p in order:
            mine = tr.row[t.prompt[tr.row] == p]
            pos = t.pos[mine]
            rew = tr.reward[t.prompt[tr.row] == p]
            assert pos[0] == 0 and np.array_equal(pos[1:], pos[:-1] + rew[:-1] + 1), pol.name
            assert pos[-1] + rew[-1] + 1 == np.count_nonzero(t.prompt == p), pol.name
            assert np.all(rew <= t.accepted[mine, tr.chosen[t.prompt[tr.row] == p]]), pol.name

def test_without_flips_no_contextual_policy_beats_best_fixed(no_flips):
    t, rep = no_flips
    assert planted_headroom(NO_FLIPS, t) == pytest.approx(0.0, abs=1e-12)
    for name in CONTEXTUAL:
        assert rep.results[name].gain.lo <= 0.0, name


def test_with_flips_thompson_beats_best_fixed_and_bandits_by_the_planted_margin(flips):
    t, rep = flips
    planted = planted_headroom(FLIPS, t)
    assert planted > 0.3
    g = rep.results["thompson_ctx"].gain
    assert g.lo > 0 and abs(g.value - planted) < 0.25 * planted
    for name in ("ucb", "exp3", "hedge"):
        assert g.lo > rep.results[name].gain.hi, name


def test_contextual_policies_recover_most_of_replays_headroom(flips):
    t, rep = flips
    headroom = replay.summarize(t).workload_headroom
    assert headroom > 0.3
    for name in CONTEXTUAL:
        assert rep.results[name].gain.value > 0.7 * headroom, name


def test_hedge_regret_is_sublinear(no_flips):
    t, _ = no_flips
    for s in range(2):
        T, reg, slope = core.regret_curve(t, Hedge(random_state=s), np.random.default_rng(s).permutation(t.n_prompts))
        assert slope < 0.75, (s, slope, reg)
        assert reg[-1] / T[-1] < 0.05 * t.accepted.mean()


def test_block_mode_baselines_are_the_replay_summary(flips):
    t, rep = flips
    s = replay.summarize(t)
    r = rep.results
    assert r["best_fixed"].mean_accepted.value == pytest.approx(s.pooled[s.best_fixed])
    assert r["workload_oracle"].gain.value == pytest.approx(s.workload_headroom)
    assert r["per_block_oracle"].gain.value == pytest.approx(s.per_block_gap)
    assert r["per_block_oracle"].tokens_per_pass.value == pytest.approx(s.per_block_oracle + 1)


def test_trajectory_mode_and_modelled_time():
    t = simulate_table(SimConfig(n_prompts=5, out_len=60, dense=True, seed=1))
    rep = core.evaluate(t, "trajectory", [ThompsonCtx(), Hedge()], seeds=(0,), n_resamples=200)
    r = rep.results
    opt = r["trajectory_oracle"].tokens_per_pass.value
    assert opt == pytest.approx(replay.trajectory_oracle(t).tokens_per_pass)
    assert all(v.tokens_per_pass.value <= opt + 1e-12 for v in r.values())
    bf = max(range(len(t.drafters)), key=lambda d: replay.fixed_trajectory(t, d).tokens_per_pass)
    assert r["best_fixed"].tokens_per_pass.value == pytest.approx(replay.fixed_trajectory(t, bf).tokens_per_pass)
    # modelled time of the best fixed drafter, by hand from the manifest's timing
    tim = core.run_timing(t)
    tr = core.hindsight_traces(t, "trajectory")["best_fixed"]
    ms = np.interp(t.draft_len[tr.row, bf] + 1, tim["verify_ms"]["tokens"], tim["verify_ms"]["ms"]) \
        + tim["drafter_ms"][t.drafters[bf]]
    assert r["best_fixed"].tokens_per_s == pytest.approx((tr.reward + 1).sum() / ms.sum() * 1000)
    # panoramic feedback is not free: Hedge pays every drafter and a union verification
    assert r["hedge"].tokens_per_s < r["best_fixed"].tokens_per_s


def test_fit_simulator_recovers_planted_acceptance():
    planted = ((0.60, 0.75, 0.70), (0.85, 0.65, 0.80))
    cfg = SimConfig(workloads=("a", "b"), drafters=("x", "y", "z"), token_accept=planted, drafter_accept=(0.7,) * 3,
                    workload_shift=(0.0, 0.0), signal=(0.5, 0.5), conf_base=(0.0, 0.0), empty_rate=(0.0,) * 3,
                    drafter_ms=(1.0,) * 3, n_prompts=40, out_len=100, dense=True, seed=8)
    t = simulate_table(cfg)
    fit = core.fit_simulator(t, cfg)
    assert np.allclose(fit.token_accept, planted, atol=0.03)
    assert fit.k == cfg.k and fit.out_len == cfg.out_len and fit.n_prompts == cfg.n_prompts
    # from the shipped 4 x 4 calibration as the base: resized to the logs' 2 workloads x 3 drafters
    fit = core.fit_simulator(t)
    assert fit.drafters == cfg.drafters and np.allclose(fit.token_accept, planted, atol=0.03)


def test_shipped_calibration_assumes_flips_and_bad_files_say_where(tmp_path):
    cfg = core.load_calibration()
    m = true_mean_accepted(cfg)
    assert len(set(m.argmax(1))) == len(cfg.workloads)     # every workload has a different best drafter
    bad = tmp_path / "cal.toml"
    bad.write_text('[sim]\nworkloads = ["a"]\nbogus = 1\n')
    with pytest.raises(ValueError, match="cal.toml.*bogus"):
        core.load_calibration(bad)
    bad.write_text('[sim]\nk = \n')
    with pytest.raises(ValueError, match="cal.toml"):
        core.load_calibration(bad)


def test_cli_json_names_and_byte_identical(tmp_path):
    run = tmp_path / "sim"
    write_sim_run(SimConfig(n_prompts=3, out_len=40, seed=2), run, gz=False)
    args = ["policies", str(run), "--json", "--seeds", "1", "--resamples", "100"]
    a, b = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert a.exit_code == 0, a.output
    assert a.output == b.output
    out = json.loads(a.output)
    for name in ("best_fixed", "ucb", "exp3", "hedge", "normalhedge", "thompson_ctx", "hedge_ctx", "linucb",
                 "spec_select", "random", "workload_oracle", "per_block_oracle"):
        v = out[name]
        assert v["ci"][0] <= v["mean_accepted"] <= v["ci"][1] and v["label"] == "SIM"
        assert v["tokens_per_pass"] == pytest.approx(v["mean_accepted"] + 1)
    bad = CliRunner().invoke(app, ["policies", str(tmp_path / "nope"), "--json"])
    assert bad.exit_code == 1 and "nope" in bad.output


def test_multi_sequence_replay_counts_and_batching():
    t = simulate_table(SimConfig(n_prompts=3, out_len=50, dense=True, seed=6))
    lengths = np.bincount(t.prompt)
    one = core.multi_sequence_replay(t, None, 1, fixed=1)
    assert np.array_equal(one.tokens, lengths)
    assert one.steps == replay.fixed_trajectory(t, 1).passes.sum()
    four = core.multi_sequence_replay(t, None, 4, fixed=1)
    assert np.array_equal(four.tokens, lengths) and four.total_ms < one.total_ms   # batching pays
    assert four.share.sum() == pytest.approx(four.total_ms)
    ss = core.multi_sequence_replay(t, None, 4)
    assert np.array_equal(ss.tokens, lengths)


def test_sparse_logs_refuse_trajectory_mode():
    t = simulate_table(SimConfig(n_prompts=2, out_len=40, dense=False, seed=1))
    with pytest.raises(ValueError, match="dense"):
        core.evaluate(t, "trajectory", [Hedge()], seeds=(0,), n_resamples=50)
    with pytest.raises(ValueError, match="mode"):
        core.evaluate(t, "blocks", [Hedge()], seeds=(0,), n_resamples=50)


def test_hindsight_trajectories_match_fixed_policies_replayed():
    t = simulate_table(SimConfig(n_prompts=4, out_len=60, dense=True, seed=9))
    hind = core.hindsight_traces(t, "trajectory")
    best = int(hind["best_fixed"].chosen[0])
    tr = core.run_policy(t, Fixed(best), "trajectory")
    assert np.array_equal(np.sort(tr.row), hind["best_fixed"].row)
    arms = [int(hind["workload_oracle"].chosen[t.workload[hind["workload_oracle"].row] == w][0])
            for w in range(len(t.workloads))]
    tr = core.run_policy(t, Fixed(arms), "trajectory")
    assert np.array_equal(np.sort(tr.row), hind["workload_oracle"].row)
    per_w = {w: min(range(len(t.drafters)), key=lambda d: (replay.fixed_trajectory(t, d).passes[
        np.unique(t.prompt[t.workload == w])].sum(), d)) for w in range(len(t.workloads))}
    assert arms == [per_w[w] for w in range(len(t.workloads))]


def test_falsify_does_not_reject_the_model_that_made_the_logs():
    cfg = replace(FLIPS, n_prompts=15, out_len=100, dense=True, seed=12)
    t = simulate_table(cfg)
    f = core.falsify(t, seeds=(0,), n_resamples=300)
    assert f.fitted.n_prompts == 15 and f.fitted.out_len == 100
    assert not f.excludes(f.predicted_fitted), f.summary()
    assert f.observed.lo > 0 and f.predicted_fitted.lo > 0
    assert "[SIM]" in f.summary()
