"""Policy replay and the calibrated simulation, checked on simulated logs with planted structure."""

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from bandit.sim import evaluate
from bandit.sim import multiseq
from bandit.sim import falsify
from bandit.logs import reader as logs
from bandit.stats import trajectory
from bandit import core, replay
from specbandit_cli import app
from bandit.policies.registry import EXP3, UCB1, Fixed, Hedge, HedgeCtx, LinUCB, ThompsonCtx, make_policies
from bandit.sim.simulate import SimConfig, simulate_table, true_mean_accepted, true_tokens_per_pass, write_sim_run

SMALL = dict(n_prompts=40, out_len=120, dense=False, seed=4, workload_shift=(0.0, 0.0, 0.0, 0.0))
NO_FLIPS = SimConfig(drafter_accept=(0.75, 0.80, 0.65, 0.50), **SMALL)
FLIPS = SimConfig(drafter_accept=(0.72,) * 4, ranking_flips=True, flip_margin=0.6, **SMALL)
CONTEXTUAL = ("thompson_ctx", "hedge_ctx", "linucb")


@pytest.fixture(scope="module")
def no_flips():
    t = simulate_table(NO_FLIPS)
    return t, evaluate.evaluate(t, "block", [ThompsonCtx(), HedgeCtx(), LinUCB()], seeds=(0, 1), n_resamples=300)


@pytest.fixture(scope="module")
def flips():
    t = simulate_table(FLIPS)
    pols = [ThompsonCtx(), HedgeCtx(), LinUCB(), UCB1(), EXP3(), Hedge()]
    return t, evaluate.evaluate(t, "block", pols, seeds=(0, 1), n_resamples=300)


def planted_headroom(cfg, t):
    """Workload-oracle headroom of the planted means in tokens per pass (accepted + 1 on these sparse logs),
    weighted by the log's blocks per workload."""
    m = true_mean_accepted(cfg) + 1
    n_w = np.bincount(t.workload[t.is_block_start], minlength=len(cfg.workloads)).astype(float)
    return (n_w @ m.max(1)) / (n_w @ m).max() - 1


def test_every_policy_trajectory_tiles_each_output_exactly():
    """In trajectory mode each policy's blocks start at 0, follow pos + reward + 1, and end at the output's end."""
    t = simulate_table(SimConfig(n_prompts=4, out_len=50, dense=True, seed=3))
    order = np.random.default_rng(5).permutation(t.n_prompts)
    for pol in make_policies(random_state=2):
        tr = evaluate.run_policy(t, pol, "trajectory", order)
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
    for name in ("ucb_stream", "exp3_stream", "hedge_stream"):
        assert g.lo > rep.results[name].gain.hi, name


def test_contextual_policies_recover_most_of_replays_headroom(flips):
    t, rep = flips
    s = replay.summarize(t)  # in accepted tokens; the replay's gains are in tokens per pass (accepted + 1)
    headroom = (s.workload_oracle + 1) / (s.pooled[s.best_fixed] + 1) - 1
    assert headroom > 0.25
    for name in CONTEXTUAL:
        assert rep.results[name].gain.value > 0.7 * headroom, name


def test_hedge_regret_is_sublinear(no_flips):
    t, _ = no_flips
    for s in range(2):
        T, reg, slope = evaluate.regret_curve(
            t, Hedge(random_state=s), np.random.default_rng(s).permutation(t.n_prompts)
        )
        assert slope < 0.75, (s, slope, reg)
        assert reg[-1] / T[-1] < 0.05 * t.accepted.mean()


def test_block_mode_baselines_are_the_replay_summary(flips):
    t, rep = flips
    s = replay.summarize(t)
    r = rep.results
    p = s.pooled[s.best_fixed]
    assert rep.best_fixed == s.best_fixed_name
    assert r["best_fixed"].mean_accepted.value == pytest.approx(p)
    assert r["best_fixed"].tokens_per_pass.value == pytest.approx(p + 1)  # sparse: a block's tokens are a + 1
    assert r["workload_oracle"].gain.value == pytest.approx((s.workload_oracle + 1) / (p + 1) - 1)
    assert r["per_block_oracle"].gain.value == pytest.approx((s.per_block_oracle + 1) / (p + 1) - 1)
    assert r["per_block_oracle"].tokens_per_pass.value == pytest.approx(s.per_block_oracle + 1)


def test_trajectory_mode_and_modelled_time():
    t = simulate_table(SimConfig(n_prompts=5, out_len=60, dense=True, seed=1))
    rep = evaluate.evaluate(t, "trajectory", [ThompsonCtx(), Hedge()], seeds=(0,), n_resamples=200)
    r = rep.results
    opt = r["trajectory_oracle"].tokens_per_pass.value
    assert opt == pytest.approx(trajectory.trajectory_oracle(t).tokens_per_pass)
    assert all(v.tokens_per_pass.value <= opt + 1e-12 for v in r.values())
    bf = max(range(len(t.drafters)), key=lambda d: trajectory.fixed_trajectory(t, d).tokens_per_pass)
    assert r["best_fixed"].tokens_per_pass.value == pytest.approx(trajectory.fixed_trajectory(t, bf).tokens_per_pass)
    # modelled time of the best fixed drafter, by hand from the manifest's timing
    tim = t.manifests[0]["timing"]
    tr = evaluate.hindsight_traces(t, "trajectory")["best_fixed"]
    ms = (
        np.interp(t.draft_len[tr.row, bf] + 1, tim["verify_ms"]["tokens"], tim["verify_ms"]["ms"])
        + tim["drafter_ms"][t.drafters[bf]]
    )
    tps = r["best_fixed"].tokens_per_s
    assert tps.value == pytest.approx(evaluate.trace_tokens(t, tr).sum() / ms.sum() * 1000)
    assert evaluate.trace_tokens(t, tr).sum() == t.n_records  # a trajectory produces every output token once
    assert tps.lo < tps.value < tps.hi
    # the interval is bandit.ci.bootstrap_ratio's of per-prompt tokens over per-prompt modelled ms
    from bandit.stats.bootstrap import bootstrap_ratio

    tot = r["best_fixed"].totals
    ref = bootstrap_ratio(1000 * tot[:, 0], tot[:, 3], evaluate.prompt_strata(t), 200, 0)
    assert (tps.value, tps.lo, tps.hi) == pytest.approx((ref.value, ref.lo, ref.hi))
    # panoramic feedback is not free: Hedge pays every drafter and a union verification
    assert r["hedge_stream"].tokens_per_s.value < r["best_fixed"].tokens_per_s.value


def test_fit_simulator_recovers_planted_acceptance():
    planted = ((0.60, 0.75, 0.70), (0.85, 0.65, 0.80))
    cfg = SimConfig(
        workloads=("a", "b"),
        drafters=("x", "y", "z"),
        token_accept=planted,
        drafter_accept=(0.7,) * 3,
        workload_shift=(0.0, 0.0),
        signal=(0.5, 0.5),
        conf_base=(0.0, 0.0),
        empty_rate=(0.0,) * 3,
        drafter_ms=(1.0,) * 3,
        n_prompts=150,
        out_len=100,
        dense=True,
        seed=8,
    )
    t = simulate_table(cfg)
    fit = falsify.fit_simulator(t, cfg)  # per-cell sd of the fit ~0.01 at 150 prompts (0.02 at 40)
    assert np.allclose(fit.token_accept, planted, atol=0.03)
    assert fit.k == cfg.k and fit.out_len == cfg.out_len and fit.n_prompts == cfg.n_prompts
    # from the shipped 4 x 4 calibration as the base: resized to the logs' 2 workloads x 3 drafters
    fit = falsify.fit_simulator(t)
    assert fit.drafters == cfg.drafters and np.allclose(fit.token_accept, planted, atol=0.03)


README_TABLE = {  # the research README's "Full 4x4 sweep, mean accepted tokens per block", verbatim
    "gsm8k": {"dflash": 3.837, "eagle": 2.371, "cascade": 3.803, "ngram": 1.374},
    "code": {"dflash": 4.265, "eagle": 2.575, "cascade": 4.237, "ngram": 1.435},
    "chat": {"dflash": 2.869, "eagle": 1.910, "cascade": 2.863, "ngram": 1.080},
    "copy": {"dflash": 6.347, "eagle": 5.356, "cascade": 6.594, "ngram": 4.647},
}


def test_shipped_calibration_is_the_readme_table_mapped_onto_the_logs():
    cal = falsify.read_calibration()
    assert cal.arms == {"dflash": "draft", "eagle": "eagle", "cascade": "cascade", "ngram": "ngram"}
    assert cal.workloads == {"gsm8k": "math", "code": "code", "chat": "chat", "copy": "copy"}
    cfg = cal.cfg
    assert cfg.drafters == ("cascade", "draft", "eagle", "ngram") and cfg.workloads == ("chat", "code", "copy", "math")
    inv_a, inv_w = {v: k for k, v in cal.arms.items()}, {v: k for k, v in cal.workloads.items()}
    table = np.array([[README_TABLE[inv_w[w]][inv_a[d]] for d in cfg.drafters] for w in cfg.workloads])
    np.testing.assert_array_equal(cal.table, table)
    # the solved per-token acceptance reproduces the table along each drafter's own trajectory at the file's design
    assert (cfg.k, cfg.out_len) == (8, 128) and not cfg.ranking_flips
    np.testing.assert_allclose(true_tokens_per_pass(cfg) - 1, table, atol=2e-3)
    # and a simulated campaign of it shows it too (the per-token rates are not tuned to anything else)
    t = simulate_table(replace(cfg, n_prompts=400, seed=3))  # prompt effects shared by a row: se ~1.5%
    np.testing.assert_allclose(falsify.fixed_tokens_per_pass(t) - 1, table, rtol=0.05)
    # the table's ranking: dflash (draft) leads everywhere but copy, where cascade leads: no flips were added
    assert [cfg.drafters[j] for j in true_tokens_per_pass(cfg).argmax(1)] == ["draft", "draft", "cascade", "draft"]


def test_bad_calibration_files_say_where(tmp_path):
    bad = tmp_path / "cal.toml"
    bad.write_text('[sim]\nworkloads = ["a"]\nbogus = 1\n')
    with pytest.raises(ValueError, match="cal.toml.*bogus"):
        falsify.load_calibration(bad)
    bad.write_text("[sim]\nk = \n")
    with pytest.raises(ValueError, match="cal.toml"):
        falsify.load_calibration(bad)
    bad.write_text('[arms]\na = "x"\nb = "y"\n[mean_accepted]\nw = { a = 1.0 }\n')
    with pytest.raises(ValueError, match=r"cal.toml.*mean_accepted.*\['b'\]"):
        falsify.load_calibration(bad)
    bad.write_text('[arms]\na = "x"\nb = "x"\n[mean_accepted]\nw = { a = 1.0, b = 2.0 }\n')
    with pytest.raises(ValueError, match="cal.toml.*same"):
        falsify.load_calibration(bad)


def test_cli_json_names_and_byte_identical(tmp_path):
    run = tmp_path / "sim"
    write_sim_run(SimConfig(n_prompts=3, out_len=40, seed=2), run, gz=False)
    args = ["policies", str(run), "--json", "--seeds", "1", "--resamples", "100"]
    a, b = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert a.exit_code == 0, a.output
    assert a.output == b.output
    out = json.loads(a.output)
    for name in (
        "best_fixed",
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
        "workload_oracle",
        "per_block_oracle",
    ):
        v = out[name]
        assert v["ci"][0] <= v["mean_accepted"] <= v["ci"][1] and v["label"] == "SIM"
        assert v["tokens_per_pass"] == pytest.approx(v["mean_accepted"] + 1)
    bad = CliRunner().invoke(app, ["policies", str(tmp_path / "nope"), "--json"])
    assert bad.exit_code == 1 and "nope" in bad.output


def test_multi_sequence_replay_counts_and_batching():
    t = simulate_table(SimConfig(n_prompts=3, out_len=50, dense=True, seed=6))
    lengths = np.bincount(t.prompt)
    one = multiseq.multi_sequence_replay(t, None, 1, fixed=1)
    assert np.array_equal(one.tokens, lengths)
    assert one.steps == trajectory.fixed_trajectory(t, 1).passes.sum()
    four = multiseq.multi_sequence_replay(t, None, 4, fixed=1)
    assert np.array_equal(four.tokens, lengths) and four.total_ms < one.total_ms  # batching pays
    assert four.share.sum() == pytest.approx(four.total_ms)
    ss = multiseq.multi_sequence_replay(t, None, 4)
    assert np.array_equal(ss.tokens, lengths)


def test_sparse_logs_refuse_trajectory_mode():
    t = simulate_table(SimConfig(n_prompts=2, out_len=40, dense=False, seed=1))
    with pytest.raises(ValueError, match="dense"):
        evaluate.evaluate(t, "trajectory", [Hedge()], seeds=(0,), n_resamples=50)
    with pytest.raises(ValueError, match="mode"):
        evaluate.evaluate(t, "blocks", [Hedge()], seeds=(0,), n_resamples=50)


def test_hindsight_trajectories_match_fixed_policies_replayed():
    t = simulate_table(SimConfig(n_prompts=4, out_len=60, dense=True, seed=9))
    hind = evaluate.hindsight_traces(t, "trajectory")
    best = int(hind["best_fixed"].chosen[0])
    tr = evaluate.run_policy(t, Fixed(best), "trajectory")
    assert np.array_equal(np.sort(tr.row), hind["best_fixed"].row)
    arms = [
        int(hind["workload_oracle"].chosen[t.workload[hind["workload_oracle"].row] == w][0])
        for w in range(len(t.workloads))
    ]
    tr = evaluate.run_policy(t, Fixed(arms), "trajectory")
    assert np.array_equal(np.sort(tr.row), hind["workload_oracle"].row)
    per_w = {
        w: min(
            range(len(t.drafters)),
            key=lambda d: (trajectory.fixed_trajectory(t, d).passes[np.unique(t.prompt[t.workload == w])].sum(), d),
        )
        for w in range(len(t.workloads))
    }
    assert arms == [per_w[w] for w in range(len(t.workloads))]


def _truth_calibration(cfg, path, drop="ngram"):
    """A calibration file whose table is the planted truth of `cfg` (tokens per pass along each drafter's own
    trajectory - 1), every drafter but `drop` mapped onto itself, the other knobs cfg's own."""
    m = true_tokens_per_pass(replace(cfg, dense=True)) - 1
    arms = [d for d in cfg.drafters if d != drop]
    rows = "\n".join(
        f"{w} = {{ " + ", ".join(f"{d} = {m[i, j]:.6f}" for j, d in enumerate(cfg.drafters) if d != drop) + " }"
        for i, w in enumerate(cfg.workloads)
    )
    idx = [cfg.drafters.index(d) for d in arms]
    sim = (
        f"k = {cfg.k}\nout_len = {cfg.out_len}\nn_prompts = {cfg.n_prompts}\nshared = {cfg.shared}\n"
        f"signal = {list(cfg.signal)}\nconf_base = {list(cfg.conf_base)}\n"
        f"empty_rate = {[cfg.empty_rate[i] for i in idx]}\ndrafter_ms = {[cfg.drafter_ms[i] for i in idx]}\n"
    )
    path.write_text(
        "[arms]\n"
        + "".join(f'{d} = "{d}"\n' for d in arms)
        + "[workloads]\n"
        + "".join(f'{w} = "{w}"\n' for w in cfg.workloads)
        + f"[mean_accepted]\n{rows}\n[sim]\n{sim}"
    )
    return path


def test_falsify_does_not_reject_the_model_that_made_the_logs(tmp_path):
    cfg = replace(FLIPS, n_prompts=30, out_len=100, dense=True, seed=12)
    t = simulate_table(cfg)
    f = falsify.falsify(t, _truth_calibration(cfg, tmp_path / "truth.toml"), seeds=(0,), n_resamples=300, replicates=2)
    assert f.compared == ("cascade", "dflash", "eagle") and f.left_out == ("ngram",)
    assert f.fitted.drafters == f.assumed.drafters == f.compared and f.observed_report.best_fixed in f.compared
    assert f.fitted.n_prompts == 30 and f.fitted.out_len == 100 and f.fitted.out_lens == (100,) * 120
    # the calibration's table is the truth: solving it gives back the planted per-token acceptance; the fit to
    # 30 prompts per workload is near it (prompt effects shared by a workload's drafters make rows move together)
    from scipy.special import ndtr

    planted = ndtr(cfg.mu())[:, :3]
    np.testing.assert_allclose(f.assumed.token_accept, planted, atol=2e-3)
    np.testing.assert_allclose(f.fitted.token_accept, planted, atol=0.1)
    for pred in (f.predicted_assumed, f.predicted_fitted):
        assert not f.excludes(pred), f.summary()
        assert pred.lo > 0
    assert f.observed.lo > 0
    assert f.predicted_fitted_all is not None and f.fitted_all.drafters == t.drafters
    text = f.summary()
    assert "drafters compared: cascade, dflash, eagle" in text and "left out: ngram" in text
    assert "[SIM]" in text and "tokens per target pass" in text


def test_falsify_sees_a_wrong_calibration(tmp_path):
    """A calibration without the logs' ranking flips predicts no gain; logs with strong flips exclude it."""
    made = replace(FLIPS, n_prompts=30, out_len=100, dense=True, seed=12)
    flat = replace(NO_FLIPS, n_prompts=30, out_len=100, dense=True)
    f = falsify.falsify(
        simulate_table(made),
        _truth_calibration(flat, tmp_path / "flat.toml"),
        seeds=(0,),
        n_resamples=300,
        replicates=2,
        all_drafters=False,
    )
    assert f.predicted_assumed.hi < 0.05 < f.observed.lo and f.excludes(f.predicted_assumed), f.summary()
    assert not f.excludes(f.predicted_fitted), f.summary()
    assert f.predicted_fitted_all is None
    with pytest.raises(ValueError, match="dense"):
        falsify.falsify(simulate_table(replace(made, dense=False)), seeds=(0,), n_resamples=50)


# ---------------------------------------------------------------- one accounting, by hand

# Three prompts, drafters a and b, k = 8. By construction the per-position mean and the trajectories disagree:
# a accepts more per position (48/23 vs 44/23: long runs counted many times), b needs fewer target passes
# along its own trajectory (7 vs 10), so b is the primary. Prompt 2 has drafts accepted past the output's end
# (a at pos 1 would make 5 tokens with 4 left, b at pos 3 3 with 2 left); prompt 3 is where the greedy
# per-block oracle (a first, 2 > 1) loses to the shortest path (b, then b's run of 3 to the end).
HAND = {
    "p1": ([0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0], [3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1, 0]),
    "p2": ([0, 4, 3, 2, 1], [2, 2, 2, 2, 2]),
    "p3": ([2, 0, 0, 0, 0, 0], [1, 0, 3, 0, 0, 0]),
}


def hand_table(spec=HAND, k=8):
    from bandit.logs.reader import BlockTable

    acc = np.concatenate([np.stack([a, b], 1) for a, b in spec.values()]).astype(np.int32)
    lens = [len(a) for a, _ in spec.values()]
    prompt = np.repeat(np.arange(len(lens)), lens).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    R = len(pos)
    return BlockTable(
        drafters=("a", "b"),
        workloads=("w",),
        prompt_ids=tuple(f"w/{p}" for p in spec),
        workload=np.zeros(R, np.int32),
        prompt=prompt,
        pos=pos,
        block=np.full(R, -1, np.int64),
        accepted=acc,
        draft_len=np.full((R, 2), k, np.int32),
        expected_accepted=np.full((R, 2), np.nan),
        features=np.full((R, 2, 4), 0.5),
        ms=np.full((R, 2), np.nan),
        target_ms=np.full(R, np.nan),
        dense=True,
    )


def test_one_accounting_on_a_hand_made_dense_log():
    t = hand_table()
    assert t.dense and t.n_records == 23
    assert replay.summarize(t).per_position["best_fixed_per_position"] == "a"  # 48/23 > 44/23 per position
    # block mode: every row meets B = b's trajectory starts (p1: 0, 4, 8; p2: 0, 3; p3: 0, 2), 7 blocks
    blk = evaluate.evaluate(
        t, "block", [Fixed(0, name="always_a"), Fixed(1, name="always_b")], seeds=(0,), n_resamples=200
    )
    assert blk.best_fixed == "b" and "7 blocks" in blk.block_set
    r = blk.results
    # b's blocks make 4 + 4 + 4 | 3 + min(3, 2) | 2 + 4 = 23 tokens (1 + accepted would count 24)
    assert r["best_fixed"].tokens_per_pass.value == pytest.approx(23 / 7)
    assert r["always_b"].tokens_per_pass.value == pytest.approx(23 / 7)
    assert r["best_fixed"].mean_accepted.value == pytest.approx(17 / 7)  # accepted as logged
    # a at b's starts: 1 + min(8, 8) + 4 | 1 + min(3, 2) | 3 + 1 = 20
    assert r["always_a"].tokens_per_pass.value == pytest.approx(20 / 7)
    assert r["always_a"].gain.value == pytest.approx(20 / 23 - 1)
    assert r["always_a"].regret.value == pytest.approx(3.0) and r["always_a"].regret_unit == "tokens"
    # per block the most accepted (a on ties): 4 + 8 + 4 | 3 + 2 | 3 + 4 = 28
    assert r["per_block_oracle"].tokens_per_pass.value == pytest.approx(28 / 7)
    assert r["per_block_oracle"].gain.value == pytest.approx(28 / 23 - 1)
    assert r["per_block_oracle"].regret.value == pytest.approx(-5.0)
    assert r["workload_oracle"].tokens_per_pass.value == pytest.approx(23 / 7)  # one workload: b
    assert all(v.tokens_per_s is None for v in r.values())  # no timing in the manifest
    # trajectory mode: output tokens (23, nothing past an end) / each row's own passes
    tr = evaluate.evaluate(
        t,
        "trajectory",
        [Fixed(0, name="always_a"), Fixed(1, name="always_b")] + make_policies(0),
        seeds=(0, 1),
        n_resamples=200,
    )
    r = tr.results
    assert r["best_fixed"].tokens_per_pass.value == pytest.approx(23 / 7)  # b: 3 + 2 + 2 passes
    assert r["always_a"].tokens_per_pass.value == pytest.approx(23 / 10)  # a: 4 + 2 + 4 passes
    assert r["always_a"].regret.value == pytest.approx(3.0) and r["always_a"].regret_unit == "target passes"
    assert r["per_block_oracle"].tokens_per_pass.value == pytest.approx(23 / 8)  # greedy: 2 + 2 + 4 passes
    assert r["trajectory_oracle"].tokens_per_pass.value == pytest.approx(23 / 6)  # shortest path: 2 + 2 + 2
    assert r["trajectory_oracle"].gain.value == pytest.approx(7 / 6 - 1)
    opt = r["trajectory_oracle"].tokens_per_pass.value
    for name, v in r.items():  # the invariant: no trajectory beats the shortest path
        assert v.tokens_per_pass.value <= opt + 1e-12, name
        assert v.totals[:, 0].sum() == pytest.approx(23), name  # every output token, once
    assert r["per_block_oracle"].tokens_per_pass.value < opt


def test_multi_sequence_counts_nothing_past_the_end():
    t = hand_table()
    lengths = np.bincount(t.prompt)
    for n_seq in (1, 2):
        for fixed in (0, 1):
            m = multiseq.multi_sequence_replay(t, None, n_seq, fixed=fixed)
            assert np.array_equal(m.tokens, lengths), (n_seq, fixed)
    assert (
        multiseq.multi_sequence_replay(t, None, 1, fixed=0).steps == 10
        and multiseq.multi_sequence_replay(t, None, 1, fixed=1).steps == 7
    )


def test_main_labels_every_line_and_writes_next_to_given_logs(tmp_path, monkeypatch):
    run = tmp_path / "camp"
    write_sim_run(SimConfig(n_prompts=3, out_len=30, seed=5), run, gz=False)
    assert core.default_out([]) == logs.default_inputs()[0][0].parent / "core.txt"  # beside the default campaign
    assert core.default_out([str(run)]) == run / "core.txt"
    monkeypatch.chdir(tmp_path)  # a relative runs/core.txt would land here: it must not be written
    text = core.main([str(run)], seeds=(0,), n_resamples=50, order_seeds=3, replicates=1)
    assert not (run / "core.txt").exists() and not (tmp_path / "runs").exists()  # options not at their defaults
    assert text.startswith(f"# made by: python bandit/core.py {run} --seeds 1 --resamples 50 --order-seeds 3")
    lines = text.splitlines()
    labels = ("[SIM]", "[MEASURED]", "[MODEL]", "[unlabelled]")
    for line in lines[1:]:
        assert line.startswith(labels) or line.startswith("  ") or line.startswith("inputs:"), line
    assert any("block mode; blocks: B = the primary" in x for x in lines)
    assert any("trajectory mode; blocks: each policy's own trajectory" in x for x in lines)
    assert any("order-seed interval" in x and "not a bootstrap" in x for x in lines)
    assert sum(x.startswith("[MODEL]") and "95% CI" in x for x in lines) == 2
    other = tmp_path / "other.txt"
    assert core.main([str(run)], seeds=(0,), n_resamples=50, order_seeds=3, replicates=1, out=other) == text
    assert other.read_text() == text  # byte-identical from the same logs and seeds


def test_hedge_slope_interval_is_over_order_seeds(no_flips):
    t, _ = no_flips
    line = core.hedge_slope_line(t, order_seeds=4)
    slopes = [
        evaluate.regret_curve(t, Hedge(random_state=s), np.random.default_rng(s).permutation(t.n_prompts))[2]
        for s in range(4)
    ]
    lo, hi = np.percentile(slopes, [2.5, 97.5])
    assert f"mean {np.mean(slopes):.2f}, 95% order-seed interval [{lo:.2f}, {hi:.2f}]" in line
    assert "over 4 seeded prompt orders" in line and lo < hi
