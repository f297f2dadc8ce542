"""The live phase and the wall-clock model: live decodes equal the dense phase, the dense-log walk
predicts their target passes exactly, a planted timing model is recovered, bad live files are refused."""

import json
import math

import numpy as np
import pytest
import torch

import sweep
from bandit import wallclock
from bandit.live import livelog
from bandit.stats import steps
from bandit.policies import livepolicies
from bandit.policies.livepolicies import LIVE_POLICIES
from bandit.logs.reader import LogError, load_logs
from harness.decode import livephase
from harness.models.tiny import make_zoo, write_workload_file

torch.set_num_threads(1)
PROMPTS = [("code", f"c{i}", f"def f{i}(x):\n    return x * {i} + {i}\n\ndef g{i}(y):\n") for i in range(6)] + [
    ("copy", f"p{i}", f"{'abcdefg'[i:]} {'xyz' * i} {'abcdefg'[i:]}") for i in range(5)
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    z = make_zoo(root)
    wl = write_workload_file(root / "wl.jsonl", PROMPTS)
    specs = [s for s in z["specs"] if not s.startswith("medusa")]
    out = sweep.run_sweep(
        target=str(z["target"]),
        drafter=specs,
        workload_file=str(wl),
        out=str(root / "run"),
        k=4,
        max_new_tokens=40,
        quiet=True,
        live_prompts=3,
    )
    return {"dir": out, "specs": specs, "z": z, "wl": wl, "root": root}


def _live(d):
    return [json.loads(x) for x in (d / "live.jsonl").read_text().splitlines()]


def test_live_phase_covers_the_sample_with_every_configuration(run):
    live = _live(run["dir"])
    names = [s.split("=")[0] for s in run["specs"]]
    configs = ["plain"] + [f"fixed:{n}" for n in names] + ["best_of_n"] + [f"policy:{p}" for p in LIVE_POLICIES]
    keys = {(r["workload"], r["prompt_id"]) for r in live}
    assert len(keys) == 6 and {w for w, _ in keys} == {"code", "copy"}  # 3 per workload
    assert sorted(r["config"] for r in live) == sorted(configs * 6)
    assert all(r["same_as_dense"] for r in live)  # greedy: the live output is the dense phase's
    for r in live:
        assert r["prefill_ms"] + r["verify_ms"] + sum(r["draft_ms"].values()) <= r["wall_ms"] + 1e-6
        assert r["tokens"] >= r["passes"] >= 1
    man = json.loads((run["dir"] / "manifest.json").read_text())
    assert man["live"]["prompts"] == 6 and set(man["timing"]["drafter_ms"]) == set(names)


def step_timed(t) -> set[str]:
    """The live configurations whose choices may differ from the replay's: policies told measured step times."""
    timing = livelog.policy_timing(t)
    return {f"policy:{p}" for p in LIVE_POLICIES if hasattr(livepolicies.make(p, t, timing), "observe_step")}


def test_dense_walk_predicts_the_live_passes_exactly(run):
    t = load_logs([run["dir"]])
    res = wallclock.evaluate(t, livelog.read_live(run["dir"]), run["dir"].name, n_resamples=200)
    timed = step_timed(t)
    n_timed = sum(r["config"] in timed for r in _live(run["dir"]))
    assert len(_live(run["dir"])) - n_timed <= res.passes_agree[0] <= res.passes_agree[1] == len(_live(run["dir"]))
    assert res.same_as_dense[0] == res.same_as_dense[1]
    for d in wallclock.decodes(t, livelog.read_live(run["dir"])):
        if d.config not in timed:  # passes, verified tokens, calls and choices, all of them
            np.testing.assert_array_equal(d.x_live, d.x_dense)
            if d.config.startswith("policy:"):
                np.testing.assert_array_equal(d.chosen_live, d.chosen_dense)
        assert d.step_times == (d.config in timed)
    for e in res.entries:  # a policy's agreement, as reported
        if e["config"].startswith("policy:") and e["config"] not in timed:
            assert e["choices"]["total_variation"] == 0 and e["choices"]["decodes_equal_to_replay"] == [6, 6]


def _pass_sizes(t, live) -> dict:
    """Brute force: the size (tokens verified) of every target pass of each live decode's dense-log walk, per
    (config, table prompt): plain one token at a time; a fixed drafter or best-of-N from position 0, the next
    block after the accepted tokens, verifying 1 + its draft (best-of-N: every draft); a policy by its replay's
    blocks (walk.live_walk) over the live prompts in live order."""
    from bandit.policies.walk import live_walk

    index = {n: i for i, n in enumerate(t.prompt_ids)}
    out = {}
    for c in dict.fromkeys(r["config"] for r in live):
        order = [index[f"{r['workload']}/{r['prompt_id']}"] for r in live if r["config"] == c]
        if c.startswith("policy:"):
            timing = livelog.policy_timing(t)
            rows, chosen, cut, _ = live_walk(t, livepolicies.make(c[7:], t, timing), order, timing)
            n = t.draft_len[rows, chosen]
            n = np.where(cut >= 0, np.minimum(n, cut), n)
            for p in order:
                out[c, p] = [1 + int(x) for x in n[t.prompt[rows] == p]]
            continue
        for p in order:
            rows = np.flatnonzero(t.prompt == p)
            if c == "plain":
                out[c, p] = [1] * rows.size
                continue
            d = None if c == "best_of_n" else t.drafters.index(c[6:])
            pos, qs = 0, []
            while pos < rows.size:
                r = rows[pos]
                qs.append(1 + int(t.draft_len[r].sum() if d is None else t.draft_len[r, d]))
                pos += int(t.accepted[r].max() if d is None else t.accepted[r, d]) + 1
            out[c, p] = qs
    return out


def test_a_planted_timing_model_is_recovered(run):
    """A pass costs a planted non-decreasing function of its size, linear between the model's knots with a jump
    from 3 to 4 tokens (as a CPU's kernels switch); each decode's wall time is that summed over its passes, sized
    by brute force, plus its prefill and calls: the fit recovers every coefficient and predicts every configuration."""
    t = load_logs([run["dir"]])
    timed = step_timed(t)  # their replayed counts may differ from the live ones: a planted model cannot meet both
    live = [r for r in _live(run["dir"]) if r["config"] not in timed]
    knots = steps.table_knots(t)
    at_knot = {q: (1.5 + 0.1 * q if q <= 3 else 4.0 + 0.2 * q) for q in knots}  # non-decreasing, a jump at 4
    coef = {"prefill": 3.0, "prompt_token": 0.05} | {f"pass@{q}": v for q, v in at_knot.items()}
    call = {n: 0.5 + i for i, n in enumerate(t.drafters)}
    sizes = _pass_sizes(t, live)
    index = {n: i for i, n in enumerate(t.prompt_ids)}
    for r in live:
        qs = sizes[r["config"], index[f"{r['workload']}/{r['prompt_id']}"]]
        assert len(qs) == r["passes"] and sum(qs) == r["verified"]  # the brute-force walk is the live decode's
        r["draft_ms"] = {d: call[d] * c for d, c in r["calls"].items()}  # what timing every call would measure
        r["wall_ms"] = (
            coef["prefill"]
            + coef["prompt_token"] * r["prompt_len"]
            + float(np.interp(qs, list(at_knot), list(at_knot.values())).sum())
            + sum(r["draft_ms"].values())
        )
    res = wallclock.evaluate(t, live, "planted", n_resamples=200)
    # predictions are cross-fitted: a union pass size that one fold's best-of-N passes alone reach is less
    # determined by the other folds
    for e in res.entries:
        assert e["measured_over_predicted"] == pytest.approx(1.0, abs=1e-2 if e["config"] == "best_of_n" else 1e-3)
        lo, hi = e["measured_ci"]
        assert lo <= e["measured_tokens_per_s"] <= hi
    for d in t.drafters:
        assert res.coef[f"call:{d}"] == pytest.approx(call[d], rel=1e-3)
    for k, v in coef.items():
        assert res.coef[k] == pytest.approx(v, rel=1e-3, abs=1e-6)
    for e in res.entries:  # a configuration never seen by its fit is predicted too, but for best-of-N: its
        # union passes (more than k + 1 tokens) are the only ones past the last single-draft knot
        held = e["held_out_configuration"]["measured_over_predicted"]
        if e["config"] != "best_of_n":
            assert held == pytest.approx(1.0, abs=1e-3)
    # every prompt's prediction comes from the other folds: a slow machine on one fold's decodes shows as a miss
    fold0 = {r["prompt_id"] for r in live if wallclock.fold_of(f"{r['workload']}/{r['prompt_id']}") == 0}
    assert fold0 and len(fold0) < 6
    for r in live:
        r["wall_ms"] *= 2.0 if r["prompt_id"] in fold0 else 1.0
    res2 = wallclock.evaluate(t, live, "planted", n_resamples=200)
    assert max(abs(e["measured_over_predicted"] - 1) for e in res2.entries) > 0.02


def test_live_phase_resumes_after_a_half_written_prompt(run, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(run["dir"], d)
    lines = (d / "live.jsonl").read_text().splitlines()
    (d / "live.jsonl").write_text("\n".join(lines[:-3]) + "\n" + lines[-3][:20])  # a prompt cut mid-way
    sweep.run_sweep(
        target=str(run["z"]["target"]),
        drafter=run["specs"],
        workload_file=str(run["wl"]),
        out=str(d),
        k=4,
        max_new_tokens=40,
        quiet=True,
        live_prompts=3,
        resume=True,
    )
    timing = ("wall_ms", "prefill_ms", "verify_ms", "draft_ms")
    timed = step_timed(load_logs([d]))  # their choices follow the measured step times, which differ run to run
    strip = lambda rs: [{k: v for k, v in r.items() if k not in timing} for r in rs if r["config"] not in timed]
    assert strip(_live(d)) == strip(_live(run["dir"]))
    assert [r["config"] for r in _live(d)] == [r["config"] for r in _live(run["dir"])]


def test_sample_is_seeded_and_order_free():
    ps = [(w, f"{w}{i}", [1]) for w in ("a", "b") for i in range(20)]
    s = livephase.sample(ps, 5, 0)
    assert len(s) == 10 and s == livephase.sample(ps[::-1], 5, 0)
    assert s != livephase.sample(ps, 5, 1)
    assert livephase.sample(ps, 50, 0) == {(w, p) for w, p, _ in ps}


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r.pop("wall_ms"), "wall_ms: missing field"),
        (lambda r: r.pop("draft_ms"), "draft_ms: missing field"),
        (lambda r: r.update(passes=1.5), "passes: 1.5 is not a count"),
        (lambda r: r.update(passes=10**30), "passes: .* is not a count"),
        (lambda r: r.update(config=["x"]), r"config: \['x'\] is not a name"),
        (lambda r: r.update(workload=7), "workload: 7 is not a name"),
        (lambda r: r.update(calls={"ngram": -5}), "calls: .* is not an object of call counts"),
        (lambda r: r.update(draft_ms="x"), "draft_ms: 'x' is not an object of times"),
        (lambda r: r.update(draft_ms={"ngram": math.nan}), "draft_ms: .* is not an object of times"),
        (lambda r: r.update(wall_ms=math.nan), "not a positive number"),
        (lambda r: r.update(wall_ms=-1), "not a positive number"),
    ],
)
def test_bad_live_lines_are_refused_with_their_line(run, tmp_path, edit, match):
    live = _live(run["dir"])
    edit(live[1])
    (tmp_path / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live))
    with pytest.raises(LogError, match=rf"live.jsonl:2: .*{match}"):
        livelog.read_live(tmp_path)


def test_no_live_phase_is_a_clear_error(tmp_path):
    with pytest.raises(LogError, match="no live phase"):
        livelog.read_live(tmp_path)


def test_live_files_with_a_duplicate_or_a_missing_configuration_are_refused(run, tmp_path):
    live = _live(run["dir"])
    (tmp_path / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live + live[:1]))
    with pytest.raises(LogError, match="a second time"):
        livelog.read_live(tmp_path)
    (tmp_path / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live[1:]))
    with pytest.raises(LogError, match="lacks"):
        livelog.read_live(tmp_path)


def test_live_lines_that_do_not_match_the_dense_log_name_their_line(run, tmp_path):
    import shutil

    d = tmp_path / "r"
    shutil.copytree(run["dir"], d)
    live = _live(d)
    for r in live:
        if r["config"] == "fixed:ngram":
            r["config"] = "fixed:bogus"
    (d / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live))
    first = next(i for i, r in enumerate(live, 1) if r["config"] == "fixed:bogus")
    with pytest.raises(LogError, match=rf"live.jsonl:{first}: config: 'fixed:bogus' names no drafter of the run"):
        wallclock.main([d], n_resamples=20)


def test_one_prompt_per_workload_is_refused_not_nan(run, tmp_path):
    live = [r for r in _live(run["dir"]) if r["prompt_id"] in ("c0", "p0") or r["workload"] not in ("code", "copy")]
    keep = {(r["workload"], r["prompt_id"]) for r in live}
    live = [
        r
        for r in _live(run["dir"])
        if (r["workload"], r["prompt_id"]) in {min(k for k in keep if k[0] == w) for w in {k[0] for k in keep}}
    ]
    with pytest.raises(LogError, match="needs at least 2 per workload"):
        wallclock.evaluate(load_logs([run["dir"]]), live, n_resamples=20)


def test_one_configuration_writes_valid_json(run, tmp_path):
    import shutil

    d = tmp_path / "r"
    shutil.copytree(run["dir"], d)
    (d / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _live(d) if r["config"] == "fixed:ngram"))
    wallclock.main([d], out=tmp_path / "w.json", n_resamples=20)
    text = (tmp_path / "w.json").read_text()
    assert "NaN" not in text and json.loads(text)["entries"][0]["config"] == "fixed:ngram"


def test_a_planted_extra_cost_per_call_is_recovered(run):
    """A call costs more than its own timer shows (the bookkeeping around it, the caches it leaves cold): the fit
    recovers a planted extra per call on top of the measured call time, because plain decodes call nothing,
    best-of-N calls every drafter per pass and the policies a mix."""
    t = load_logs([run["dir"]])
    timed = step_timed(t)
    live = [r for r in _live(run["dir"]) if r["config"] not in timed]
    call = {n: 0.5 + i for i, n in enumerate(t.drafters)}
    extra = {n: 0.3 * (i + 1) for i, n in enumerate(t.drafters)}
    for r in live:
        r["draft_ms"] = {d: call[d] * c for d, c in r["calls"].items()}
        r["wall_ms"] = (
            3.0 + 1.5 * r["passes"] + 0.2 * r["verified"] + sum((call[d] + extra[d]) * c for d, c in r["calls"].items())
        )
    res = wallclock.evaluate(t, live, "planted", n_resamples=50)
    for d in t.drafters:
        assert res.coef[f"call:{d}"] == pytest.approx(call[d] + extra[d], rel=1e-3)
    for q in steps.table_knots(t):  # a pass of Q tokens: 1.5 + 0.2 Q, a line, which the step cost holds exactly
        assert res.coef[f"pass@{q}"] == pytest.approx(1.5 + 0.2 * q, rel=1e-3)
    # with measured call times alone, the same decodes were mispriced: the extras are what makes them fit
    for e in res.entries:
        assert e["measured_over_predicted"] == pytest.approx(1.0, abs=1e-2 if e["config"] == "best_of_n" else 1e-3)


def test_a_subset_of_the_drafters_is_priced_by_the_runs_model(run):
    """`--drafters` (or a workload subset) attaches the run's timing model, fitted on the whole dense log and every
    live decode, with the subset's call costs: not a model refitted on the decodes a subset can walk."""
    from bandit.live import primary

    t = load_logs([run["dir"]])
    whole = primary.attach(t, run["dir"]).timing_model
    names = ("ngram", "eagle")
    sub = primary.attach(t.select_drafters(names), run["dir"]).timing_model
    assert sub.knots == whole.knots and sub.drafters == names
    np.testing.assert_array_equal(sub.step_ms, whole.step_ms)
    np.testing.assert_array_equal(sub.call_ms, [whole.call_ms[t.drafters.index(n)] for n in names])
    assert (sub.prefill, sub.prompt_token) == (whole.prefill, whole.prompt_token)


def test_no_decode_that_repeats_its_walk_is_one_clear_error(run):
    """The fit takes pass sizes from the walks its decodes repeat: a live phase with none (here every output left
    the dense one) is refused in one line, not a least-squares crash."""
    t = load_logs([run["dir"]])
    live = [dict(r, same_as_dense=False) for r in _live(run["dir"]) if r["config"] == "plain"]
    for r in live:
        r["tokens"] = r["passes"] = r["verified"] = r["tokens"] - 1  # not the dense output: no walk is repeated
    with pytest.raises(LogError, match="no live decode repeats its walk"):
        wallclock.evaluate(t, live, n_resamples=20)
