"""Live verdicts (bandit/live/verdicts.py), the new live configurations (plain, policy:<name>) in bandit/live/livelog.py and
bandit/wallclock.py, and ci's headline: on a small simulated run with a planted live.jsonl, every
live_tokens_per_s and live_speedup_* value, the fastest fixed drafter and choosing_pays recomputed here in
plain Python from the live lines, and their intervals recomputed from the resampler's draws.

bandit/policies/livepolicies.py (another engineer's) is replaced by a stub inside these tests only."""

import dataclasses
import json
import sys
import types

import numpy as np
import pytest

import bandit.policies
from bandit import ci, wallclock
from bandit.live import livelog
from bandit.stats import resample
from bandit.stats.steps import basis
from bandit.live import verdicts
from bandit.logs.reader import LogError, load_logs
from bandit.logs.schema import Timing
from bandit.sim.simulate import SimConfig, write_sim_run

N_RES, SEED = 300, 7
POLICY_TIMING = {
    "verify_ms": {"tokens": [1, 9], "ms": [2.0, 3.0]},
    "verify_batch_ms": {"drafts": [1, 2], "ms": [3.0, 3.5]},
    "drafter_ms": {"cascade": 1.0, "dflash": 1.1, "eagle": 0.9, "ngram": 0.01},
}


# ---------------------------------------------------------------- the stub policies and the synthetic run


@dataclasses.dataclass(frozen=True)
class Counts:
    passes: np.ndarray
    verified: np.ndarray
    calls: np.ndarray
    chosen: np.ndarray
    steps: np.ndarray | None = None


def _walk_sizes(t, p, d) -> list[int]:
    """Tokens verified by each pass of always-drafter-d (d None: best-of-N, the longest accepted advancing and
    every draft verified) on prompt p of dense log t, by hand."""
    rows = np.flatnonzero(t.prompt == p)
    pos, sizes = 0, []
    while pos < rows.size:
        r = rows[pos]
        sizes.append(1 + int(t.draft_len[r].sum() if d is None else t.draft_len[r, d]))
        pos += int(t.accepted[r].max() if d is None else t.accepted[r, d]) + 1
    return sizes


def _walk_one(t, p, d):
    """(passes, verified) of `_walk_sizes`."""
    sizes = _walk_sizes(t, p, d)
    return len(sizes), sum(sizes)


def stub_module(calls: list):
    """A livepolicies stand-in: policy `alpha` runs drafter (running index) mod D on each prompt, `beta` the next
    (and, as spec-select does, is told the measured step times: it has observe_step)."""

    def make(name, t, timing, random_state=0):
        steps = {"observe_step": lambda n_verified, n_drafts, ms: None} if name == "beta" else {}
        return types.SimpleNamespace(name=name, **steps)

    def replay(t, policy, prompts, timing, random_state=0, knots=(1,)):
        name = policy.name
        calls.append((name, list(prompts), timing))
        P, D = t.n_prompts, len(t.drafters)
        out = Counts(*(np.zeros(s, np.int64) for s in ((P,), (P,), (P, D), (P, D))), np.zeros((P, len(knots))))
        for j, p in enumerate(prompts):
            d = (j + (name == "beta")) % D
            out.passes[p], out.verified[p] = _walk_one(t, p, d)
            out.calls[p, d] = out.chosen[p, d] = out.passes[p]
            out.steps[p] = basis(_walk_sizes(t, p, d), knots).sum(0)
        return out

    return types.SimpleNamespace(LIVE_POLICIES=("alpha", "beta"), make=make, replay=replay, Counts=Counts)


@pytest.fixture
def stub(monkeypatch):
    calls: list = []
    mod = stub_module(calls)
    monkeypatch.setitem(sys.modules, "bandit.policies.livepolicies", mod)
    monkeypatch.setattr(bandit.policies, "livepolicies", mod, raising=False)
    return calls


SPEED = {"plain": 1.0, "fixed:cascade": 0.55, "fixed:dflash": 0.5, "fixed:eagle": 0.8, "fixed:ngram": 0.505}
SPEED |= {"best_of_n": 0.7, "policy:alpha": 0.45, "policy:beta": 0.6}  # ms per output token, planted


def live_lines(t, configs, seed=0):
    """3 prompts per workload, every configuration on each, in the contract's order; counts from a walk by hand
    (policies: the stub's choices in this decode order), wall time planted per configuration with noise."""
    rng = np.random.default_rng(seed)
    D = len(t.drafters)
    n = np.bincount(t.prompt)
    sample = [p for w in range(len(t.workloads)) for p in sorted(set(t.prompt[t.workload == w].tolist()))[:3]]
    out, running = [], {"policy:alpha": 0, "policy:beta": 1}
    for p in sample:
        wl, pid = t.prompt_ids[p].split("/", 1)
        for c in configs:
            calls, chosen = {}, None
            if c == "plain":
                passes = verified = int(n[p])
            elif c == "best_of_n":
                passes, verified = _walk_one(t, p, None)
                calls = {d: passes for d in t.drafters}
            else:
                d = t.drafters.index(c[6:]) if c.startswith("fixed:") else running[c] % D
                passes, verified = _walk_one(t, p, d)
                calls = {t.drafters[d]: passes}
                if c.startswith("policy:"):
                    running[c] += 1
                    chosen = {t.drafters[d]: passes}
            ms = float(n[p]) * SPEED[c] * rng.lognormal(0, 0.3)
            line = dict(config=c, workload=wl, prompt_id=pid, prompt_len=7, tokens=int(n[p]), passes=passes)
            line |= dict(
                verified=verified, calls=calls, wall_ms=round(ms, 3), draft_ms={d: 0.01 * k for d, k in calls.items()}
            )
            out.append(line | ({"chosen": chosen} if chosen is not None else {}) | {"same_as_dense": True})
    return out


ALL = [
    "plain",
    "fixed:cascade",
    "fixed:dflash",
    "fixed:eagle",
    "fixed:ngram",
    "best_of_n",
    "policy:alpha",
    "policy:beta",
]


def make_run(root, configs=ALL, policy_timing=True, seed=0):
    write_sim_run(SimConfig(n_prompts=4, out_len=24, seed=5), root)
    if policy_timing:
        m = json.loads((root / "manifest.json").read_text())
        m["live"] = {"policy_timing": POLICY_TIMING}
        (root / "manifest.json").write_text(json.dumps(m))
    t = load_logs([root])
    live = live_lines(t, configs, seed)
    write_live(root, live)
    return t, live


def write_live(root, live):
    (root / "live.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "_line"}) + "\n" for r in live)
    )


# ---------------------------------------------------------------- the independent recomputation


def tps(lines):
    return 1000 * sum(r["tokens"] for r in lines) / sum(r["wall_ms"] for r in lines)


def expected(live, scope=None):
    """{statistic name (pooled or [scope]) -> value} and the fastest fixed / best adaptive, by hand."""
    lines = [r for r in live if scope is None or r["workload"] == scope]
    configs = list(dict.fromkeys(r["config"] for r in lines))
    rate = {c: tps([r for r in lines if r["config"] == c]) for c in configs}
    fixed = sorted(c for c in configs if c.startswith("fixed:"))
    fastest = max(fixed, key=lambda c: (rate[c], -fixed.index(c)))
    adaptive = [c for c in configs if c == "best_of_n" or c.startswith("policy:")]
    best = max(adaptive, key=lambda c: (rate[c], -adaptive.index(c)))
    sc = "" if scope is None else f"[{scope}]"
    out = {}
    for c in configs:
        out[f"live_tokens_per_s{sc}[{c}]"] = rate[c]
        out[f"live_speedup_over_fastest_fixed{sc}[{c}]"] = rate[c] / rate[fastest]
        if "plain" in rate and c != "plain":
            out[f"live_speedup_over_plain{sc}[{c}]"] = rate[c] / rate["plain"]
    if "plain" in rate:
        out[f"live_fastest_fixed_over_plain{sc}"] = rate[fastest] / rate["plain"]
    out[f"choosing_pays{sc}"] = rate[best] / rate[fastest]
    return out, fastest, best


@pytest.fixture
def run(tmp_path, stub):
    t, live = make_run(tmp_path / "run")
    return tmp_path / "run", t, live


def test_every_live_verdict_equals_an_independent_computation(run):
    d, t, live = run
    entries = verdicts.run_entries(t, N_RES, SEED)
    by = {e.name: e.to_json([], "v") for e in entries}
    want = {}
    for scope in (None, *t.workloads):
        exp, fastest, best = expected(live, scope)
        want |= exp
        sc = "" if scope is None else f"[{scope}]"
        assert by[f"choosing_pays{sc}"]["config"] == best and by[f"choosing_pays{sc}"]["fastest_fixed"] == fastest
        assert by[f"live_fastest_fixed_over_plain{sc}"]["fastest_fixed"] == fastest
        assert by[f"live_speedup_over_fastest_fixed{sc}[plain]"]["fastest_fixed"] == fastest
        assert by[f"choosing_pays{sc}"]["workload"] == (scope or "pooled")
    assert set(by) == set(want)  # every name, per workload and pooled, and nothing else
    for name, v in want.items():
        e = by[name]
        assert e["value"] == pytest.approx(v, rel=6e-6), name
        lo, hi = e["ci"]
        assert lo <= e["value"] <= hi and (lo < hi or "fastest_fixed" in name), name  # the fastest's own: 1 at most
        assert e["label"] == "MEASURED" and e["unit"] == "prompt" and e["seed"] == SEED and e["n_resamples"] == N_RES
        assert e["inputs"][-1]["path"].endswith("live.jsonl") and len(e["inputs"][-1]["sha256"]) == 64
    assert "live_tokens_per_s[chat][policy:beta]" in by and "live_speedup_over_plain[plain]" not in by
    v = by["choosing_pays"]
    assert v["verdict"] == ("yes" if v["ci"][0] > 1 else "no" if v["ci"][1] < 1 else "not resolved")
    assert set(v["adaptive"]) == {"best_of_n", "policy:alpha", "policy:beta"}


def test_intervals_recomputed_from_the_resampler_with_the_fastest_rechosen_in_every_resample(run):
    d, t, live = run
    # ngram nearly tied with dflash, alternately faster and slower by prompt: resamples disagree on the fastest
    dflash = {(r["workload"], r["prompt_id"]): r["wall_ms"] for r in live if r["config"] == "fixed:dflash"}
    for i, r in enumerate(r for r in live if r["config"] == "fixed:ngram"):
        r["wall_ms"] = dflash[r["workload"], r["prompt_id"]] * (0.8 if i % 2 else 1.22)
    write_live(d, live)
    by = {e.name: e for e in verdicts.run_entries(t, N_RES, SEED)}
    keys = sorted({(r["workload"], r["prompt_id"]) for r in live}, key=lambda k: t.prompt_ids.index(f"{k[0]}/{k[1]}"))
    strata = np.array([t.workloads.index(w) for w, _ in keys])
    counts = np.concatenate(list(resample.count_chunks(strata, N_RES, SEED))).astype(float)
    configs = list(dict.fromkeys(r["config"] for r in live))
    tok = np.zeros((len(keys), len(configs)))
    ms = np.zeros_like(tok)
    for r in live:
        i, c = keys.index((r["workload"], r["prompt_id"])), configs.index(r["config"])
        tok[i, c], ms[i, c] = r["tokens"], r["wall_ms"]
    rate = 1000 * (counts @ tok) / (counts @ ms)  # (resamples, configs)
    fx = [configs.index(c) for c in sorted(c for c in configs if c.startswith("fixed:"))]
    ad = [configs.index(c) for c in configs if c == "best_of_n" or c.startswith("policy:")]
    fastest = rate[:, fx].max(1)
    pct = lambda x: np.percentile(x, [2.5, 97.5])
    for c, j in [("fixed:eagle", configs.index("fixed:eagle")), ("policy:alpha", configs.index("policy:alpha"))]:
        ci = by[f"live_speedup_over_fastest_fixed[{c}]"].ci
        np.testing.assert_allclose([ci.lo, ci.hi], pct(rate[:, j] / fastest), rtol=1e-9)
        ci = by[f"live_tokens_per_s[{c}]"].ci
        np.testing.assert_allclose([ci.lo, ci.hi], pct(rate[:, j]), rtol=1e-9)
    ci = by["choosing_pays"].ci
    np.testing.assert_allclose([ci.lo, ci.hi], pct(rate[:, ad].max(1) / fastest), rtol=1e-9)
    # the fastest fixed drafter re-chosen in every resample: how often the point's one wins, by hand
    names = sorted(c for c in configs if c.startswith("fixed:"))
    point = max(names, key=lambda c: tps([r for r in live if r["config"] == c]))
    share = np.mean(np.array(names)[rate[:, fx].argmax(1)] == point)
    assert by["choosing_pays"].extra["fastest_fixed_share"] == pytest.approx(share, abs=1e-4) and 0.1 < share < 0.9
    # the same resamples as wallclock's measured intervals (the same clusters, strata, stream)
    w = wallclock.evaluate(t, livelog.read_live(d), d.name, N_RES, SEED)
    for e in w.entries:
        ci = by[f"live_tokens_per_s[{e['config']}]"].ci
        assert e["measured_ci"] == [round(ci.lo, 4), round(ci.hi, 4)]


def test_no_plain_means_no_speedup_over_plain_and_it_is_said(tmp_path, stub):
    t, live = make_run(tmp_path / "r", [c for c in ALL if c != "plain"])
    by = {e.name: e.to_json([], "") for e in verdicts.run_entries(t, 50, 0)}
    assert by and not [n for n in by if "plain" in n]
    assert "no plain decodes" in verdicts.note(t, by)
    table = verdicts.headline_table(by)
    assert "n/a (no plain decodes)" in table and table.count("\n") == 2 + len(t.workloads)


def test_no_live_phase_no_entries_and_one_line(tmp_path):
    write_sim_run(SimConfig(n_prompts=3, out_len=20, seed=1), tmp_path / "r")
    t = load_logs([tmp_path / "r"])
    assert verdicts.run_entries(t, 20, 0) == []
    assert verdicts.note(t, {}).startswith("live verdicts: none (") and "live.jsonl" in verdicts.note(t, {})


def test_ci_writes_the_live_entries_and_opens_with_the_headline(run, tmp_path):
    d, t, live = run
    text = ci.main([d], tmp_path / "ci.json", n_resamples=40, seed=3, n_refit=2)
    data = {e["name"]: e for e in json.loads((tmp_path / "ci.json").read_text())}
    exp, fastest, best = expected(live)
    assert data["choosing_pays"]["value"] == pytest.approx(exp["choosing_pays"], rel=6e-6)
    assert data["live_speedup_over_plain[fixed:eagle]"]["n_resamples"] == 40
    assert data["per_block_gap"]["label"] == "SIM" and "live.jsonl" not in json.dumps(data["per_block_gap"]["inputs"])
    body = text.split("\n", 2)[2]
    assert body.startswith("Does choosing pay, measured?")
    head = body.split("\n\n")[1].splitlines()
    assert head[0].startswith("| workload | plain decoding") and head[-1].startswith("| pooled |")
    assert f"| {best} (in " in head[-1] and f"| {fastest[6:]} (in " in head[-1]
    assert head[-1].rstrip(" |").endswith(data["choosing_pays"]["verdict"])
    assert f"the primary: {fastest[6:]}, fastest fixed drafter measured live" in text  # ci attaches the live phase


def test_ci_says_so_without_a_live_phase(tmp_path):
    write_sim_run(SimConfig(n_prompts=3, out_len=20, seed=1), tmp_path / "r")
    text = ci.main([tmp_path / "r"], tmp_path / "ci.json", n_resamples=20, seed=0, n_refit=2)
    assert len([x for x in text.splitlines() if x.startswith("live verdicts: none (")]) == 1
    assert not [
        e for e in json.loads((tmp_path / "ci.json").read_text()) if e["name"].startswith(("live_", "choosing"))
    ]


@pytest.mark.parametrize(
    "verdict_of, want",
    [((1.01, 1.2), "yes"), ((0.5, 0.99), "no"), ((0.9, 1.1), "not resolved"), ((None, None), "not resolved (no CI)")],
)
def test_verdict_words(verdict_of, want):
    assert verdicts.verdict(*verdict_of) == want


# ---------------------------------------------------------------- livelog: the new configurations


def test_plain_and_policy_counts(run, stub):
    d, t, live = run
    passes, verified, calls, chosen, step_times, steps = livelog._trajectory_counts(t, "plain")
    n = np.bincount(t.prompt)
    assert (passes == n).all() and (verified == n).all() and not calls.any() and chosen is None and not step_times
    np.testing.assert_array_equal(steps[:, 0], n)  # every pass of plain decoding verifies one token: knot 1
    assert not steps[:, 1:].any()
    dec = livelog.decodes(t, livelog.read_live(d))
    order = [t.prompt_ids.index(f"{r['workload']}/{r['prompt_id']}") for r in live if r["config"] == "policy:beta"]
    got = [c for c in stub if c[0] == "beta"]
    assert len(got) == 1 and got[0][1] == order  # the prompts in the order live.jsonl decoded them
    timing = got[0][2]
    assert timing.verify_ms == (2.0, 3.0) and timing.drafter_ms["eagle"] == 0.9 and timing.k == 8
    for x in dec:  # every count of the planted live lines is the walk's, plain and policies included
        np.testing.assert_array_equal(x.x_live, x.x_dense)
        if x.config.startswith("policy:"):
            np.testing.assert_array_equal(x.chosen_live, x.chosen_dense)
        assert x.step_times == (x.config == "policy:beta")


def test_policy_timing_falls_back_to_the_manifest(tmp_path, stub):
    t, _ = make_run(tmp_path / "r", policy_timing=False)
    livelog.decodes(t, livelog.read_live(tmp_path / "r"))
    timing = stub[0][2]
    assert timing == Timing.from_manifest(t.manifests[0], t.drafters, k=8) and timing.verify_ms[0] != 2.0


def test_wallclock_entries_cover_plain_and_policies_with_their_choice_agreement(run, tmp_path):
    d, t, live = run
    res = wallclock.evaluate(t, livelog.read_live(d), d.name, 60, 0)
    by = {e["config"]: e for e in res.entries}
    assert list(by) == ALL and all("predicted_tokens_per_s" in e and "measured_ci" in e for e in by.values())
    for p in ("policy:alpha", "policy:beta"):
        ch = by[p]["choices"]
        assert ch["total_variation"] == 0 and ch["decodes_equal_to_replay"] == [12, 12]
        assert ch["chosen_equal_to_replay"] == [12, 12] and ch["live_chosen_share"] == ch["replay_chosen_share"]
    assert "choices" not in by["plain"] and "choices" not in by["best_of_n"]
    assert by["policy:beta"]["choices"]["learns_step_times"] and not by["policy:alpha"]["choices"]["learns_step_times"]
    assert "| policy:beta (learns live step times) | 12 of 12 | 12 of 12 | 0.000 |" in wallclock.render(res)
    # one live decode of alpha chooses otherwise: the agreement and the distance say how far, by hand
    mine = [r for r in live if r["config"] == "policy:alpha"]
    replayed = {x: sum(r["chosen"].get(x, 0) for r in mine) for x in t.drafters}  # the planted lines are the replay
    ((k, v),) = mine[0]["chosen"].items()
    mine[0]["chosen"] = {next(x for x in t.drafters if x != k): v}
    write_live(d, live)
    res = wallclock.evaluate(t, livelog.read_live(d), d.name, 20, 0)
    ch = {e["config"]: e for e in res.entries}["policy:alpha"]["choices"]
    got = {x: sum(r["chosen"].get(x, 0) for r in mine) for x in t.drafters}
    tv = 0.5 * sum(abs(got[x] / sum(got.values()) - replayed[x] / sum(replayed.values())) for x in t.drafters)
    assert ch["total_variation"] == pytest.approx(tv, abs=1e-4) and tv > 0
    assert ch["chosen_equal_to_replay"] == [11, 12] and ch["decodes_equal_to_replay"] == [12, 12]
    for r in mine:
        del r["chosen"]
    write_live(d, live)
    ch = {e["config"]: e for e in wallclock.evaluate(t, livelog.read_live(d), d.name, 20, 0).entries}["policy:alpha"][
        "choices"
    ]
    assert "total_variation" not in ch and "not in live.jsonl" in ch["live_chosen"]


def test_rho_alpha_speedups_against_an_independent_computation(run):
    d, t, live = run
    res = wallclock.evaluate(t, livelog.read_live(d), d.name, 40, 0)
    cm = res.cost_models
    fixed = [c for c in ALL if c.startswith("fixed:")]
    fastest = max(fixed, key=lambda c: tps([r for r in live if r["config"] == c]))
    assert cm["fastest_fixed"] == fastest
    m = t.manifests[0]["timing"]
    verify = np.interp(t.manifests[0]["k"] + 1, m["verify_ms"]["tokens"], m["verify_ms"]["ms"])
    sampled = {t.prompt_ids.index(f"{r['workload']}/{r['prompt_id']}") for r in live}

    def rate(c):  # tokens per pass of the drafter's own walk over the live sample, over 1 + rho
        dd = t.drafters.index(c[6:])
        tok = sum(int((t.prompt == p).sum()) for p in sampled)
        return tok / sum(_walk_one(t, p, dd)[0] for p in sampled) / (1 + m["drafter_ms"][c[6:]] / verify)

    rows = {w["config"]: w for w in cm["rows"]}
    assert fastest not in rows and "best_of_n" in rows and "plain" not in rows and "policy:alpha" not in rows
    for c in fixed:
        if c != fastest:
            assert rows[c]["rho_alpha"] == pytest.approx(rate(c) / rate(fastest), abs=1e-4)
            meas = tps([r for r in live if r["config"] == c]) / tps([r for r in live if r["config"] == fastest])
            assert rows[c]["measured"] == pytest.approx(meas, abs=1e-4)
            assert rows[c]["rho_alpha_over_measured"] == pytest.approx(rows[c]["rho_alpha"] / meas, abs=1e-3)


@pytest.mark.parametrize(
    "edit, field, match",
    [
        (lambda r: r.update(config="policy:zeta"), "config", "'policy:zeta' is not a live policy"),
        (lambda r: r.update(config="greedy"), "config", "'greedy' is none of plain"),
        (lambda r: r.update(config="fixed:"), "config", "is none of plain"),
        (lambda r: r.update(chosen=[1, 2]), "chosen", r"\[1, 2\] is not an object of block counts"),
        (lambda r: r.update(chosen={"ngram": -1}), "chosen", "is not an object of block counts"),
        (lambda r: r.update(chosen="ngram"), "chosen", "is not an object of block counts"),
        (lambda r: r.update(config="plain", calls={"ngram": 3}), "calls", "a plain decode calls no drafter"),
    ],
)
def test_bad_live_lines_are_located(run, tmp_path, edit, field, match):
    d, t, live = run
    edit(live[4])
    write_live(tmp_path, live)
    with pytest.raises(LogError, match=rf"live.jsonl:5: {field}: .*{match}"):
        livelog.read_live(tmp_path)


def test_a_drafter_the_log_lacks_in_chosen_is_located(run):
    d, t, live = run
    i = next(i for i, r in enumerate(live) if r["config"] == "policy:beta")
    live[i]["chosen"] = {"nope": 1}
    write_live(d, live)
    with pytest.raises(LogError, match=rf"live.jsonl:{i + 1}: chosen: names \['nope'\]"):
        livelog.decodes(t, livelog.read_live(d), d / "live.jsonl")


def test_the_command_prints_the_table_and_refuses_a_stray_prompt_by_line(tmp_path):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    t, live = make_run(tmp_path / "r", [c for c in ALL if not c.startswith("policy:")])
    r = subprocess.run(
        [sys.executable, "bandit/live/verdicts.py", str(tmp_path / "r")], cwd=root, capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.startswith("Does choosing pay, measured?"), r.stderr
    assert "| pooled | " in r.stdout and "Speedup over plain decoding [MEASURED]:" in r.stdout
    n = len(live)
    live += [dict(r, prompt_id="nowhere") for r in live[:6]]  # one more prompt, every configuration, not in the log
    write_live(tmp_path / "r", live)
    r = subprocess.run(
        [sys.executable, "bandit/live/verdicts.py", str(tmp_path / "r")], cwd=root, capture_output=True, text=True
    )
    assert r.returncode == 1 and f"live.jsonl:{n + 1}: prompt_id" in r.stderr and r.stderr.startswith("error: ")


def test_a_workload_with_one_live_prompt_has_no_interval_and_says_why(tmp_path, stub):
    t, live = make_run(tmp_path / "r")
    keep = {(r["workload"], r["prompt_id"]) for r in live if r["workload"] != "chat"}
    keep.add(next((r["workload"], r["prompt_id"]) for r in live if r["workload"] == "chat"))
    write_live(tmp_path / "r", [r for r in live if (r["workload"], r["prompt_id"]) in keep])
    by = {e.name: e for e in verdicts.run_entries(t, 50, 0)}
    e = by["live_tokens_per_s[chat][plain]"]
    assert e.ci.warning.startswith("no CI: one live prompt in chat") and np.isnan(e.ci.lo)
    assert by["choosing_pays[chat]"].extra["verdict"] == "not resolved (no CI)"
    assert np.isfinite(by["live_tokens_per_s[plain]"].ci.lo)  # pooled: the other workloads still vary
