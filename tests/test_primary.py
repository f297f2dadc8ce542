"""The primary by measured speed (bandit/live/primary.py) and the timing model as the verdicts' cost model
(bandit/live/timingmodel.py): a planted case where measured speed and tokens per pass disagree, the primary
re-chosen per resample, prices against brute-force sums over walked blocks, the pooled frontier area
invariant to a monotone rescaling of one fold's scores, and every report naming the rule."""

import json
from dataclasses import replace

import numpy as np
import pytest

from bandit import breakeven, replay_stats, selector, selector_fit
from bandit.live import primary, timingmodel
from bandit.stats import steps, trajectory
from bandit.sim.evaluate import evaluate
from bandit.replay import summarize
from bandit.sim.simulate import SimConfig, simulate_table
from bandit.logs.table import BlockTable, is_dense
from bandit.live.timingmodel import TimingModel

# ---------------------------------------------------------------- a planted campaign with a live phase


def _planted_table() -> BlockTable:
    """Drafters a and b, workloads w0 and w1, 4 prompts each of 24 tokens. `a` accepts 3 at every position and `b`
    1, so `a` has twice b's tokens per target pass everywhere: the token proxy picks a."""
    P, n, D = 8, 24, 2
    prompt = np.repeat(np.arange(P, dtype=np.int32), n)
    pos = np.tile(np.arange(n, dtype=np.int64), P)
    R = prompt.size
    acc = np.tile(np.array([[3, 1]], np.int32), (R, 1))
    ids = tuple(f"w{p // 4}/p{p}" for p in range(P))
    return BlockTable(
        drafters=("a", "b"),
        workloads=("w0", "w1"),
        prompt_ids=ids,
        workload=(prompt // 4).astype(np.int32),
        prompt=prompt,
        pos=pos,
        block=np.full(R, -1, np.int64),
        accepted=acc,
        draft_len=np.full((R, D), 4, np.int32),
        expected_accepted=np.full((R, D), np.nan),
        features=np.zeros((R, D, 4)),
        ms=np.full((R, D), np.nan),
        target_ms=np.full(R, np.nan),
        label="MEASURED",
        dense=is_dense(prompt, pos),
    )


# wall ms of each fixed decode (24 tokens): on w0 a is slow (b 4x faster), on w1 a is faster (1.5x); pooled b wins
LIVE_MS = {("w0", "a"): 240.0, ("w0", "b"): 60.0, ("w1", "a"): 40.0, ("w1", "b"): 60.0}


def _write_live(run, t: BlockTable, prompts=range(8), configs=("a", "b")) -> None:
    lines = []
    for p in prompts:
        w, pid = t.prompt_ids[p].split("/")
        for d in configs:
            passes = 6 if d == "a" else 12
            lines.append(
                {
                    "config": f"fixed:{d}",
                    "workload": w,
                    "prompt_id": pid,
                    "prompt_len": 10 + p,
                    "tokens": 24,
                    "passes": passes,
                    "verified": 5 * passes,
                    "calls": {d: passes},
                    "wall_ms": LIVE_MS[(w, d)],
                    "draft_ms": {d: 0.5 * passes},
                }
            )
    run.mkdir(parents=True, exist_ok=True)
    (run / "live.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture
def planted(tmp_path):
    t = _planted_table()
    _write_live(tmp_path / "run", t)
    return t, primary.attach(t, tmp_path / "run")


def test_the_primary_follows_measured_speed_not_tokens_per_pass(planted):
    t, tl = planted
    assert trajectory.primary(t) == 0 and trajectory.rule_name(t) == trajectory.DENSE_PROXY_RULE  # a: the proxy
    assert trajectory.primary(tl) == 1 and trajectory.rule_name(tl) == trajectory.MEASURED_RULE  # b: measured
    # by hand: b 8 * 24 tokens in 8 * 60 ms against a's 8 * 24 in 4 * 240 + 4 * 40
    assert primary.measured_rates(tl)[-1] == pytest.approx([1000 * 192 / 1120, 1000 * 192 / 480])
    assert primary.fastest_by_workload(tl) == {
        "w0": ("b", pytest.approx(400.0)),
        "w1": ("a", pytest.approx(600.0)),
        "pooled": ("b", pytest.approx(400.0)),
    }
    assert trajectory.block_set(tl).n_records == 8 * 12  # b's own trajectory starts: 12 blocks per prompt
    assert summarize(tl).primary == "b" and summarize(t).primary == "a"


def test_the_primary_is_rechosen_in_every_resample(planted, monkeypatch):
    """A resample drawing only w1's prompts (where a is faster) chooses a, one drawing all chooses b: through the
    shared chooser, the selector's fold primary, and the replay statistics' and break-even's resampled stats."""
    _, tl = planted
    only_w1 = np.r_[np.zeros(4), np.ones(4)]
    both = np.ones(8)
    # 3 copies of each w1 prompt and one w0 prompt: a 312 tokens in 720 ms, b 312 in 780 ms; with 2 copies b wins
    wp = np.stack([both, only_w1, 3 * only_w1 + np.eye(8)[0], 2 * only_w1 + np.eye(8)[0]])
    assert trajectory.choose_primary(wp @ trajectory.proxy_key(tl), *trajectory.live_sums(tl, wp)).tolist() == [
        1,
        0,
        0,
        1,
    ]
    cands = selector_fit.candidates(tl, [])
    assert selector_fit.fold_primary(tl, cands, wp, np.array([True, True]), None).tolist() == [1, 0, 0, 1]
    # the fold primary on training workloads only: holding w0 out leaves w1, where a is faster
    assert selector_fit.primaries(tl) == [0, 1]

    sub = tl.take_prompts(only_w1.astype(bool))
    assert trajectory.primary(sub) == 0
    sub_gap = {e.name: e.ci.value for e in replay_stats.table_stats(sub, "prompt", 2, 0, "percentile")}
    boots = []

    def fake_boot_totals(totals, stat, strata, n_resamples, seed, jackknife):
        W = np.stack([both, only_w1])  # two "resamples": every prompt once, then w1's prompts only
        boots.append(stat(W @ totals))
        return stat(totals.sum(0, keepdims=True))[0], boots[-1], None

    monkeypatch.setattr(replay_stats, "boot_totals", fake_boot_totals)
    names = [e.name for e in replay_stats.table_stats(tl, "prompt", 2, 0, "percentile")]
    gap = boots[-1][:, names.index("per_block_gap")]
    # all prompts: b's starts, where a accepts 3 and b 1 (gap 2); w1 alone: a is the primary, nothing to gain
    assert gap.tolist() == pytest.approx([2.0, 0.0])
    assert gap[1] == pytest.approx(sub_gap["per_block_gap"])  # = the table of w1's prompts alone

    from bandit.stats.bootstrap import Entry, Interval

    names = ("selector_token_gain", "selector_redraft_rate", "selector_speedup")
    fake = [Entry(n, Interval(1.0, 1.0, 1.0, "percentile", "prompt", 1, 0), 1, 1, "MODEL") for n in names]
    monkeypatch.setattr(breakeven, "boot_totals", fake_boot_totals)
    monkeypatch.setattr(breakeven.selector, "selector_entries", lambda *a, **k: fake)
    rep = breakeven.report_from_table(tl, 2, 1)
    bon = boots[-1][:, 0]  # best-of-N's token gain: on b's starts a doubles b; on a's starts (w1) nothing
    assert rep.primary == "b" and bon[0] > 0.5 and bon[1] == pytest.approx(0.0)


def test_resampled_statistics_equal_the_subset_tables(planted):
    """The resampled statistic at a weighting equals the statistic of the table holding those prompts: the per-block
    gap of w1's prompts alone is computed on a's block set (a faster there), of all prompts on b's."""
    _, tl = planted
    only_w1 = np.r_[np.zeros(4), np.ones(4)].astype(bool)
    full = {e.name: e.ci.value for e in replay_stats.table_stats(tl, "prompt", 20, 0, "percentile")}
    sub = {
        e.name: e.ci.value for e in replay_stats.table_stats(tl.take_prompts(only_w1), "prompt", 20, 0, "percentile")
    }
    assert full["per_block_gap"] == pytest.approx(2.0)  # on b's starts: max 3 over b's 1, minus 1
    assert sub["per_block_gap"] == pytest.approx(0.0)  # on a's starts: a is the best there


def test_attach_keeps_the_proxy_and_says_why_when_a_drafter_was_not_decoded(tmp_path):
    t = _planted_table()
    _write_live(tmp_path / "run", t, configs=("a",))
    tl = primary.attach(t, tmp_path / "run")
    assert tl.live_tokens is None and trajectory.primary(tl) == 0
    assert "token proxy" in trajectory.rule_name(tl) and "fixed:b" in trajectory.rule_name(tl)
    assert primary.attach(t, None) is t and primary.attach(t, tmp_path / "nowhere") is t


def test_per_prompt_fields_follow_the_prompts_and_drafters(planted):
    _, tl = planted
    keep = np.r_[np.ones(4), np.zeros(4)].astype(bool)
    sub = tl.take_prompts(keep)
    np.testing.assert_array_equal(sub.live_ms, tl.live_ms[keep])
    np.testing.assert_array_equal(sub.prefill_ms, tl.prefill_ms[keep])
    assert trajectory.primary(sub) == 1  # w0 alone: b is faster there
    one = tl.select_drafters(["b"])
    assert one.live_ms.shape == (8, 1) and one.timing_model.drafters == ("b",)
    assert one.timing_model.call_ms[0] == pytest.approx(tl.timing_model.call_ms[1])
    with pytest.raises(ValueError, match="prompts"):
        replace(tl, prompt_ids=tl.prompt_ids[:4])


def test_the_timing_model_is_wallclocks_fit_on_every_live_decode(planted):

    _, tl = planted
    m = tl.timing_model
    # call times: at least the measured mean per call (0.5 ms, as written), plus wallclock's fitted extra
    assert (np.asarray(m.call_ms) >= 0.5 - 1e-9).all()
    knots = steps.knots_for(4, 2)
    assert m.knots == knots
    at5 = [float(q == 5) for q in knots]  # every pass of either walk verifies 1 + 4 tokens
    X = np.array(
        [
            [1, 10 + p, *(pa * np.array(at5)), pa if d == "a" else 0, pa if d == "b" else 0]
            for p in range(8)
            for d, pa in (("a", 6), ("b", 12))
        ],
        float,
    )
    y = np.array([LIVE_MS[(f"w{p // 4}", d)] for p in range(8) for d in "ab"])
    M = np.array(
        [
            [0.5 * pa if d == "a" else 0, 0.5 * pa if d == "b" else 0]
            for p in range(8)
            for d, pa in (("a", 6), ("b", 12))
        ]
    )
    want = timingmodel.fit(X, y, M, len(knots))
    K = len(knots)
    assert [m.prefill, m.prompt_token, *m.step_ms] == pytest.approx(want[: 2 + K].tolist())
    assert m.call_ms == pytest.approx(want[2 + K :].tolist())
    assert tl.prefill_ms == pytest.approx(m.prefill + m.prompt_token * (10 + np.arange(8)))


# ---------------------------------------------------------------- prices against brute force


def _planted(knots) -> np.ndarray:
    """A planted step cost at the knots: non-decreasing, with a jump from 3 to 4 tokens (a CPU kernel's switch)."""
    q = np.asarray(knots, float)
    return 4.0 + 0.07 * q + 2.0 * (q >= 4)


def _pass(m: TimingModel, q) -> np.ndarray:
    """Brute force: a pass of q tokens, by interpolating the planted values between the knots."""
    return np.interp(np.asarray(q, float), m.knots, m.step_ms)


@pytest.fixture(scope="module")
def sim():
    t = simulate_table(SimConfig(n_prompts=6, out_len=40, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=3))
    rng = np.random.default_rng(0)
    dlen = np.minimum(t.accepted + rng.integers(0, 5, t.accepted.shape), 8).astype(np.int32)
    knots = steps.knots_for(8, len(t.drafters))  # drafts of up to 8 tokens: every union within the last knot
    model = TimingModel(t.drafters, 5.0, 0.1, knots, _planted(knots), np.array([9.0, 6.0, 3.0, 0.2]), "planted")
    pre = model.prompt_prefill(rng.integers(5, 50, t.n_prompts))
    return replace(t, draft_len=dlen, timing_model=model, prefill_ms=pre)


def _walk_ms(t: BlockTable, p: int, d: int) -> float:
    """Brute force: prompt p's trajectory of drafter d, one block at a time."""
    m, rows = t.timing_model, np.flatnonzero(t.prompt == p)
    pos, ms = 0, float(t.prefill_ms[p])
    while pos < rows.size:
        r = rows[pos]
        ms += _pass(m, 1 + t.draft_len[r, d]) + m.call_ms[d]
        pos += int(t.accepted[r, d]) + 1
    return ms


def test_fixed_trajectory_prices_equal_a_walk_block_by_block(sim):
    got = primary.fixed_ms(sim)
    want = np.array([[_walk_ms(sim, p, d) for d in range(len(sim.drafters))] for p in range(sim.n_prompts)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_selector_operating_point_prices_equal_a_sum_over_its_blocks(sim):
    res = selector_fit.nested(sim, np.ones((1, sim.n_prompts)), scores=("conf_min",))
    m = sim.timing_model
    cands = selector_fit.candidates(sim)
    from bandit.logs.schema import FEATURES

    for g in range(len(sim.workloads)):
        rule = res.rules["conf_min"][g][0]
        q, c = rule.primary, cands[rule.primary]
        base = extra = tok = tok0 = 0.0
        for p in np.unique(c.prompt[c.workload == g]):
            base += sim.prefill_ms[p]
        for b in np.flatnonzero(c.workload == g):
            L = c.dlen[b]
            base += _pass(m, 1 + L[q]) + m.call_ms[q]
            tok0 += c.tau[b, q]
            redraft = bool(rule.alts) and -c.X[b, FEATURES.index("conf_min")] >= rule.threshold
            tok += c.tau[b, list(rule.alts) + [q]].max() if redraft else c.tau[b, q]
            if redraft:
                extra += _pass(m, 1 + L[q] + L[list(rule.alts)].sum()) - _pass(m, 1 + L[q])
                extra += sum(m.call_ms[a] for a in rule.alts)
        s = res.sums["conf_min"][g]
        assert s.c0[0] == pytest.approx(base) and s.cx[0] == pytest.approx(extra)
        assert res.outcome("conf_min", g)["speedup"][0] == pytest.approx((tok / (base + extra)) / (tok0 / base))


def test_choose_rule_under_the_timing_model_is_the_exhaustive_best():
    rng = np.random.default_rng(5)
    D, n = 3, 30
    knots = steps.knots_for(8, D)
    model = TimingModel(("x", "y", "z"), 0.0, 0.0, knots, _planted(knots), np.array([3.0, 0.3, 0.1]))
    for _ in range(5):
        tau = rng.integers(1, 6, (n, D)).astype(float)
        dlen = rng.integers(0, 9, (n, D)).astype(float)
        pre = rng.uniform(0, 2, n)
        s, w, p = np.round(rng.random(n), 2), rng.integers(0, 3, n).astype(float), int(rng.integers(D))
        rule = selector_fit.choose_rule(s, w, tau, p, prices=selector_fit.RowPrices(model, p, n, dlen, pre))
        best = 1.0
        for alts in selector_fit.alternative_sets(D, p):
            for thr in np.unique(s[w > 0]):
                r = s >= thr
                tok = w @ np.where(r, tau[:, list(alts) + [p]].max(1), tau[:, p])
                alone = _pass(model, 1 + dlen[:, p])
                base_ms = pre + alone + model.call_ms[p]
                both = _pass(model, 1 + dlen[:, p] + dlen[:, list(alts)].sum(1)) - alone
                ms = w @ (base_ms + r * (both + model.call_ms[list(alts)].sum()))
                best = max(best, (tok / ms) / ((w @ tau[:, p]) / (w @ base_ms)))
        assert rule.speedup == pytest.approx(best)


def test_breakeven_timing_verdicts_equal_sums_over_the_primarys_blocks(sim):
    r = breakeven.report_from_table(sim, 20, 2)
    m, p = sim.timing_model, sim.drafters.index(r.primary)
    rows = trajectory.block_mask(sim)
    tau = trajectory.block_tokens(sim, rows).astype(float)
    L = sim.draft_len[rows].astype(float)
    alone = _pass(m, 1 + L[:, p])
    ms_p = sim.prefill_ms.sum() + (alone + m.call_ms[p]).sum()
    ms_bon = sim.prefill_ms.sum() + (_pass(m, 1 + L.sum(1)) + m.call_ms.sum()).sum()
    want = (tau.max(1).sum() / ms_bon) / (tau[:, p].sum() / ms_p)
    assert r.timed["best_of_n"].value == pytest.approx(want)
    for j, d in enumerate(sim.drafters):
        if j == p:
            continue
        tok = np.maximum(tau[:, j], tau[:, p]).sum()
        more = (_pass(m, 1 + L[:, p] + L[:, j]) - alone).sum()  # the larger verify pass of both drafts
        extra = more + m.call_ms[j] * len(tau)
        assert r.timed[d].value == pytest.approx((tok / (ms_p + extra)) / (tau[:, p].sum() / ms_p))
        # at the break-even call time the speedup is 1
        c = r.timed[f"breakeven_call_ms[{d}]"].value
        ms_c = ms_p + more + c * len(tau)
        assert (tok / ms_c) / (tau[:, p].sum() / ms_p) == pytest.approx(1.0)


# ---------------------------------------------------------------- the pooled frontier area


def test_pooled_logistic_area_is_invariant_to_a_monotone_rescaling_of_one_fold(monkeypatch):
    t = simulate_table(SimConfig(n_prompts=8, out_len=50, shared=0.0, signal=(1.0, 1.0, 0.0, 1.0), seed=1))
    wp = np.ones((1, t.n_prompts))
    before = selector_fit.nested(t, wp, scores=("logistic",))
    held = frozenset(h for h in range(len(t.workloads)) if h != 1)  # the model that scores fold 1's blocks
    orig = selector_fit._Fits.scores

    def squashed(self, train, rows):
        s = orig(self, train, rows)
        return s**6 if train == held else s  # monotone on (0, 1): fold 1's ranking unchanged, its scale not

    monkeypatch.setattr(selector_fit._Fits, "scores", squashed)
    after = selector_fit.nested(t, wp, scores=("logistic",))
    np.testing.assert_allclose(after.areas["logistic"], before.areas["logistic"], atol=1e-12)
    # the test can fail: pooling the raw probabilities moves with the rescaling
    c = selector_fit.candidates(t)[selector_fit.primaries(t)[0]]

    def raw_pool(fits):
        S, U, Wt = [], [], []
        for g in range(len(t.workloads)):
            train = [h for h in range(len(t.workloads)) if h != g]
            sh, _ = selector_fit.oof_scores(c, np.ones((1, c.rows.size)), "logistic", train, g, fits)
            held_rows = c.workload == g
            S.append(sh[0])
            U.append((c.tau.max(1) - c.tau[:, c.q])[held_rows])
            Wt.append(np.ones(held_rows.sum()))
        return selector_fit.frontier_area(np.concatenate(S), np.concatenate(Wt), np.concatenate(U))

    fits = selector_fit._Fits(c, np.ones((1, c.rows.size)))
    monkeypatch.setattr(selector_fit._Fits, "scores", orig)
    raw_before = raw_pool(fits)
    monkeypatch.setattr(selector_fit._Fits, "scores", squashed)
    fits.memo.clear()
    assert abs(raw_pool(fits) - raw_before) > 1e-4


def test_fold_rank_is_a_weighted_mid_rank():
    s, w = np.array([0.9, 0.1, 0.5, 0.5]), np.array([1.0, 2.0, 1.0, 0.0])
    # weight below + half the tie's, over 4
    assert selector_fit.fold_rank(s, w).tolist() == pytest.approx([3.5 / 4, 1 / 4, 2.5 / 4, 2.5 / 4])
    assert selector_fit.fold_rank(np.exp(s), w).tolist() == selector_fit.fold_rank(s, w).tolist()


# ---------------------------------------------------------------- every report names the rule


def test_reports_name_the_rule_and_the_cost_model(planted, sim):
    t, tl = planted
    assert "most tokens per target pass (token proxy)" in summarize(t).summary()
    assert trajectory.MEASURED_RULE in summarize(tl).summary()
    assert trajectory.MEASURED_RULE in "\n".join(primary.primary_lines(tl, 20))
    assert trajectory.MEASURED_RULE in evaluate(tl, "block", [], (0,), 20).summary()
    # break-even and the selector under the timing model say so; without one, the rho/alpha model
    r = breakeven.report_from_table(sim, 20, 2)
    text = breakeven.render(r)
    assert "speedup in this section comes from the timing model fitted on the live phase" in text
    assert "[MODEL, timing fitted on MEASURED live decodes]" in text and "most tokens per target pass" in text
    plain = breakeven.render(breakeven.report_from_table(replace(sim, timing_model=None, prefill_ms=None), 20, 2))
    assert "timing model fitted on the live phase" not in plain and "token proxy" in plain
    sel = selector.render(sim, selector_fit.nested(sim, np.ones((1, sim.n_prompts))))
    assert "every speedup below comes from the timing model fitted on the live phase" in sel
    assert "most tokens per target pass (token proxy)" in sel


def test_model_check_puts_the_rho_alpha_error_beside_the_timing_models(planted):
    _, tl = planted
    rows = primary.model_check(tl)
    meas = primary.measured_rates(tl)[-1]
    assert [r["measured"] for r in rows] == pytest.approx((meas / meas.max()).tolist())
    ms, f = primary.fixed_ms(tl).sum(0), int(np.argmax(meas))  # every speedup over the measured fastest
    assert [r["timing_model"] for r in rows] == pytest.approx((ms[f] / ms).tolist())
    assert all(r["rho_alpha"] is None for r in rows)  # no manifest timing: no rho/alpha model to check
    assert "no rho/alpha model" in "\n".join(primary.model_check_lines(tl))


def test_a_sparse_log_chooses_its_primary_by_measured_speed_too(planted):
    """A sparse log (the logged block starts only): the primary by measured speed in the full data and in the
    resamples (the live sums ride on each prompt's first block), the token proxy without a live phase."""
    t, tl = planted
    keep = trajectory.fixed_starts(t)[:, 1]  # b's trajectory starts, logged as a behaviour trajectory
    sp = replace(t.take(keep), block=np.zeros(int(keep.sum()), np.int64))
    assert not sp.dense and trajectory.primary(sp) == 0  # proxy: a accepts more at every logged block
    spl = replace(sp, live_tokens=tl.live_tokens, live_ms=tl.live_ms, primary_rule=trajectory.MEASURED_RULE)
    assert trajectory.primary(spl) == 1 and summarize(spl).primary == "b"
    ents = {e.name: e.ci for e in replay_stats.table_stats(spl, "prompt", 50, 0, "percentile")}
    assert ents["per_block_gap"].value == pytest.approx(2.0)  # over b's accepted 1: a's 3
    proxy = {e.name: e.ci for e in replay_stats.table_stats(sp, "prompt", 50, 0, "percentile")}
    assert proxy["per_block_gap"].value == pytest.approx(0.0)


def test_without_a_live_phase_the_hosts_step_timing_chooses_the_primary(tmp_path):
    """No live.jsonl, but the manifest's step timing from the same host (issue 22, item 2): the primary is the
    fixed drafter fastest under it [MODEL], priced block by block: a makes 6 blocks of 24 tokens at 4 + 10 ms,
    b 12 blocks at 4 + 0.5 ms; by hand a costs 84 ms a prompt, b 54 ms, so b, against the token proxy's a."""
    t = _planted_table()
    timing = {"verify_ms": {"tokens": [1, 9], "ms": [4.0, 4.0]}, "drafter_ms": {"a": 10.0, "b": 0.5}}
    tm = replace(t, manifests=({"k": 4, "timing": timing},))
    assert primary.attach(replace(tm, label="SIM"), tmp_path / "no-live").live_tokens is None  # never measured
    tl = primary.attach(tm, tmp_path / "no-live")
    assert trajectory.primary(tl) == 1 and trajectory.rule_name(tl) == trajectory.TIMED_RULE
    np.testing.assert_allclose(tl.live_ms[0], [6 * 14.0, 12 * 4.5])
    assert tl.timing_model is None  # verdicts keep the what-if: no live decode was fitted
    assert "[MODEL]" in "\n".join(primary.primary_lines(tl, n_resamples=20))
    # a drafter without a measured call time: the token proxy, as before
    timing_a = {"verify_ms": timing["verify_ms"], "drafter_ms": {"a": 10.0}}
    assert primary.attach(replace(t, manifests=({"k": 4, "timing": timing_a},)), tmp_path).live_tokens is None
