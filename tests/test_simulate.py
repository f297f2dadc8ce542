"""The simulator against its planted parameters: acceptance, teacher forcing, signal, flips, correlation."""

import gzip
import json
from dataclasses import replace

import numpy as np
import pytest

from bandit.logs.reader import load_logs
from bandit.logs.records import check_record
from bandit.sim.simulate import (
    SimConfig,
    simulate,
    simulate_table,
    true_mean_accepted,
    true_tokens_per_pass,
    write_sim_run,
)


def _by_prompt(t, cfg):
    """(P, n, D) accepted of a dense simulated table."""
    return t.accepted.reshape(len(cfg.workloads) * cfg.n_prompts, cfg.out_len, len(cfg.drafters))


def test_mean_accepted_matches_planted_truth():
    cfg = SimConfig(n_prompts=400, out_len=40, seed=11)
    t = simulate_table(cfg)
    truth = true_mean_accepted(cfg)
    P = cfg.n_prompts
    for w in range(len(cfg.workloads)):
        per_prompt = t.accepted[t.workload == w].reshape(P, cfg.out_len, -1).mean(1)  # (P, D): iid prompts
        se = per_prompt.std(0, ddof=1) / np.sqrt(P)
        assert np.all(np.abs(per_prompt.mean(0) - truth[w]) < 4 * se + 1e-9), (w, per_prompt.mean(0), truth[w])


def test_truth_closed_form_against_brute_force_without_prompt_effects():
    # no prompt effects, output much longer than k: E[a] = sum_{i=1..k} p^i with p the planted rate
    cfg = SimConfig(
        prompt_sd=0.0,
        prompt_drafter_sd=0.0,
        out_len=10_000,
        k=4,
        token_accept=((0.5, 0.6, 0.7, 0.8),) * 4,
        workload_shift=(0, 0, 0, 0),
    )
    p = np.array([0.5, 0.6, 0.7, 0.8])
    expect = sum(p**i for i in range(1, 5))
    np.testing.assert_allclose(true_mean_accepted(cfg)[0], expect, rtol=2e-3)  # the end-of-output cap is tiny


def test_teacher_forced_chain_and_caps():
    cfg = SimConfig(n_prompts=20, out_len=30, seed=3)
    t = simulate_table(cfg)
    a = _by_prompt(t, cfg)
    assert np.all(a[:, 1:] >= a[:, :-1] - 1)  # accepted a >= 1 at t => at least a-1 at t+1
    assert np.all(a <= cfg.k) and np.all(a[:, -1] == 0)  # nothing left to accept at the last position
    assert np.all(a <= cfg.out_len - 1 - np.arange(cfg.out_len)[None, :, None])
    assert np.all(t.accepted <= t.draft_len)
    empty = t.draft_len == 0
    assert empty[:, 3].any() and not empty[:, :3].any()  # only the lookup drafter has empty drafts


def test_signal_strength_controls_feature_information():
    cfg = SimConfig(n_prompts=60, out_len=60, seed=4, signal=(0.9, 0.9, 0.0, 0.9))
    t = simulate_table(cfg)
    corr = lambda w: np.corrcoef(t.features[t.workload == w, 1, 2], t.accepted[t.workload == w, 1])[0, 1]
    assert corr(0) > 0.3 and corr(3) > 0.3  # conf_first of dflash predicts its acceptance
    assert abs(corr(2)) < 0.05  # signal 0: independent (n = 5760, se ~ 0.013)


def test_ranking_flips():
    flips = true_mean_accepted(SimConfig(ranking_flips=True)).argmax(1)
    assert len(set(flips.tolist())) == 4
    assert len(set(true_mean_accepted(SimConfig(ranking_flips=False)).argmax(1).tolist())) == 1


def test_shared_latent_correlates_drafters_and_prompts_cluster():
    def corr(shared):
        t = simulate_table(
            SimConfig(n_prompts=30, out_len=60, seed=8, shared=shared, prompt_sd=0.0, prompt_drafter_sd=0.0)
        )
        return np.corrcoef(t.accepted[:, 0], t.accepted[:, 1])[0, 1]

    assert corr(0.9) > corr(0.0) + 0.3
    cfg = SimConfig(n_prompts=60, out_len=60, seed=9, prompt_sd=0.5)
    a = _by_prompt(simulate_table(cfg), cfg)[:, :, 1].astype(float)
    # prompt means vary more than blocks would if they were independent (the design effect is > 1)
    assert a.mean(1).var() > 3 * a.var() / cfg.out_len


def test_written_log_loads_as_the_in_memory_table_and_is_deterministic(tmp_path):
    cfg = SimConfig(n_prompts=2, out_len=25, seed=6)
    p1 = write_sim_run(cfg, tmp_path / "a")
    p2 = write_sim_run(cfg, tmp_path / "b", chunk=7)  # chunking must not change the bytes
    assert p1.read_bytes() == p2.read_bytes()
    loaded, mem = load_logs([p1]), simulate_table(cfg)
    for f in ("workload", "prompt", "pos", "block", "accepted", "draft_len", "ms", "target_ms"):
        np.testing.assert_array_equal(getattr(loaded, f), getattr(mem, f), err_msg=f)
    np.testing.assert_allclose(loaded.features, mem.features, atol=1e-12)
    assert loaded.label == mem.label == "SIM" and loaded.prompt_ids == mem.prompt_ids
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["label"] == "SIM" and m["k"] == cfg.k and set(m["timing"]["drafter_ms"]) == set(cfg.drafters)


def test_records_are_valid_and_drafts_match_the_target():
    cfg = SimConfig(n_prompts=1, out_len=12, seed=1)
    recs = simulate(cfg)
    for i, r in enumerate(recs):
        check_record(r, "sim", i + 1)
    by_key = {(r["workload"], r["prompt_id"], r["pos"]): r for r in recs}
    for (w, p, pos), r in by_key.items():
        for name, d in r["drafts"].items():
            a = d["accepted"]
            # accepted tokens equal the next draft's accepted prefix shifted by one (teacher forcing)
            if a >= 2:
                nxt = by_key[(w, p, pos + 1)]["drafts"][name]
                assert d["tokens"][1:a] == nxt["tokens"][: a - 1]


def test_sparse_log_holds_block_starts_only(tmp_path):
    cfg = SimConfig(n_prompts=3, out_len=50, dense=False, seed=2)
    t = load_logs([write_sim_run(cfg, tmp_path / "s")])
    assert not t.dense and (t.block >= 0).all()
    dense = simulate_table(SimConfig(n_prompts=3, out_len=50, dense=True, seed=2))
    np.testing.assert_array_equal(t.accepted, dense.blocks().accepted)
    # the behaviour drafter's trajectory: next block at pos + accepted + 1
    b = cfg.behaviour
    for p in range(t.n_prompts):
        rows = np.flatnonzero(t.prompt == p)
        np.testing.assert_array_equal(t.pos[rows][1:], (t.pos[rows] + t.accepted[rows, b] + 1)[:-1])


@pytest.mark.parametrize(
    "bad",
    [
        dict(signal=(0.5, 0.5, 2.0, 0.5)),
        dict(drafters=("a", "b")),
        dict(workloads=("z", "a", "b", "c")),
        dict(shared=1.5),
        dict(k=0),
    ],
)
def test_config_errors_name_the_field(bad):
    with pytest.raises(ValueError, match="SimConfig"):
        SimConfig(**bad)


def test_gzip_is_byte_stable(tmp_path):
    p = write_sim_run(SimConfig(n_prompts=1, out_len=5), tmp_path / "x")
    assert gzip.decompress(p.read_bytes()).count(b"\n") == 4 * 5


def test_per_prompt_output_lengths():
    lens = (1, 7, 30, 12, 30, 2, 19, 25)  # 4 workloads x 2 prompts, workload-major
    cfg = SimConfig(n_prompts=2, out_len=30, out_lens=lens, seed=5)
    t = simulate_table(cfg)
    assert t.dense and np.array_equal(np.bincount(t.prompt), lens)
    n = np.asarray(lens)[t.prompt]
    assert np.all(t.accepted <= (n - 1 - t.pos)[:, None]) and np.all(t.accepted[t.pos == n - 1] == 0)
    sparse = simulate_table(replace(cfg, dense=False))
    for p in range(len(lens)):  # the behaviour trajectory ends at each output's end
        rows = np.flatnonzero(sparse.prompt == p)
        assert sparse.pos[rows[-1]] + sparse.accepted[rows[-1], cfg.behaviour] + 1 == lens[p]
    same = simulate_table(replace(cfg, out_lens=None, out_len=30))  # out_lens None: every prompt out_len long
    assert np.array_equal(np.bincount(same.prompt), [30] * 8)
    with pytest.raises(ValueError, match="out_lens"):
        SimConfig(n_prompts=2, out_len=30, out_lens=(5,) * 7)
    with pytest.raises(ValueError, match="out_lens"):
        SimConfig(n_prompts=2, out_len=30, out_lens=(31,) * 8)


def test_true_tokens_per_pass_closed_form_and_against_simulation():
    # no prompt effects, long outputs: one pass makes 1 + E[a] = 1 + sum_{i=1..k} p^i tokens
    p = np.array([0.5, 0.6, 0.7, 0.8])
    cfg = SimConfig(prompt_sd=0.0, prompt_drafter_sd=0.0, out_len=3000, n_prompts=1, k=4, token_accept=(tuple(p),) * 4)
    np.testing.assert_allclose(true_tokens_per_pass(cfg)[0], 1 + sum(p**i for i in range(1, 5)), rtol=2e-3)
    # a 2-token output with k = 4: a pass makes 2 tokens with probability p, else 1 (then 1 more)
    cfg2 = replace(cfg, out_len=2)
    np.testing.assert_allclose(true_tokens_per_pass(cfg2)[0], 2 / (1 + (1 - p)), rtol=1e-12)
    # variable lengths and prompt effects: the campaign's tokens / passes of each fixed drafter (trajectory.py)
    from bandit.stats import trajectory

    rng = np.random.default_rng(0)
    cfg = SimConfig(n_prompts=300, out_len=60, out_lens=tuple(rng.integers(1, 61, 1200).tolist()), seed=5)
    t = simulate_table(cfg)
    passes = trajectory.fixed_passes(t)
    wl = t.workload[trajectory.prompt_rows(t)[0]]
    n = trajectory.output_lengths(t)
    truth = true_tokens_per_pass(cfg)
    for w in range(4):
        for d in range(4):
            x, y = n[wl == w], passes[wl == w, d]
            r = x.sum() / y.sum()
            se = np.sqrt(((x - r * y) ** 2).sum()) / y.sum()  # ratio estimator over iid prompts (delta method)
            assert abs(r - truth[w, d]) < 4 * se, (w, d, r, truth[w, d], se)
    # the per-position mean of the same campaign, records weighted per prompt length
    truth = true_mean_accepted(cfg)
    sums = np.zeros((t.n_prompts, 4))
    np.add.at(sums, t.prompt, t.accepted)
    for w in range(4):
        x, y = sums[wl == w], n[wl == w][:, None]
        r = x.sum(0) / y.sum()
        se = np.sqrt(((x - r * y) ** 2).sum(0)) / y.sum()
        assert np.all(np.abs(r - truth[w]) < 4 * se), (w, r, truth[w], se)
