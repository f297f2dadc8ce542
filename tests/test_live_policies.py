"""The live phase's `plain` and `policy:<name>` configurations on tiny models: plain is the target's own loop
(its output the dense phase's, one forward per token); a policy decoded live makes exactly the choices and
counts (passes, verified tokens, draft calls, chosen drafters) that bandit/livepolicies.replay computes on the
dense log of the same prompts, lookup drafts made before choosing are counted, the warm-up leaves the measured
policy fresh, a resumed live phase runs the same policies, and --live-policies is checked."""

import json
import pickle
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import sweep
from bandit.policies import engines, livepolicies
from bandit.logs import schema
from bandit.logs.schema import BEST_OF_N, FIXED, LOOKUP_KINDS, PLAIN, POLICY
from harness.decode import livephase
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.models import lm
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target
from harness.models.tiny import make_zoo, write_workload_file

torch.set_num_threads(1)
PROMPTS = [("code", f"c{i}", f"def f{i}(x):\n    return x * {i} + {i}\n\ndef g{i}(y):\n") for i in range(5)] + [
    ("copy", f"p{i}", f"{'abcdefg'[i:]} {'xyz' * i} {'abcdefg'[i:]}") for i in range(4)
]
K, MAX_NEW, N_LIVE = 4, 40, 2
# policies whose choices depend on no measured time: decoded live they equal their replay exactly
# (specselect learns its step times from the verify forwards it observes, so its live run follows the clock)
TIMING_FREE = ("selector", "ucbspec", "exp3spec", "hedge_query", "thompson_ctx") + engines.RULE_NAMES
TIMES = ("wall_ms", "prefill_ms", "verify_ms", "draft_ms")


def _sweep(z, out, resume=False, **kw):
    return sweep.run_sweep(
        target=str(z["target"]),
        drafter=z["specs"],
        workload_file=str(z["wl"]),
        out=str(out),
        k=K,
        max_new_tokens=MAX_NEW,
        quiet=True,
        live_prompts=N_LIVE,
        resume=resume,
        **kw,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("livepol")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    # a suffix drafter over every earlier output: its drafts depend on the prompts before, as in the dense phase
    z["specs"] = list(z["specs"]) + ["srun=suffix:corpus=run"]
    z["dir"] = _sweep(z, root / "run")
    return z


def _lines(d):
    return [json.loads(x) for x in (d / "live.jsonl").read_text().splitlines()]


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _strip(lines):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in lines]


def test_the_configurations_in_their_order(run):
    names = [s.split("=")[0] for s in run["specs"]]
    want = [PLAIN] + [FIXED + n for n in names] + [BEST_OF_N] + [POLICY + p for p in livepolicies.LIVE_POLICIES]
    lines = _lines(run["dir"])
    keys = list(dict.fromkeys((r["workload"], r["prompt_id"]) for r in lines))
    assert len(keys) == 2 * N_LIVE and [r["config"] for r in lines] == want * len(keys)
    m = _manifest(run["dir"])
    assert m["live"]["configs"] == want and m["complete"] is True
    pt = m["live"]["policy_timing"]  # the shape of the manifest's timing, every drafter timed
    assert set(pt) >= {"verify_ms", "verify_batch_ms", "drafter_ms"} and set(pt["drafter_ms"]) == set(names)
    assert pt["verify_ms"]["tokens"][-1] == K + 1 and all(x > 0 for x in pt["verify_ms"]["ms"])
    assert "timing" in m and m["timing"]["source"] == "live phase (live.jsonl)"  # the post-live calibration stays


def test_plain_is_the_targets_own_loop(run):
    plain = [r for r in _lines(run["dir"]) if r["config"] == PLAIN]
    assert plain and all(r["same_as_dense"] for r in plain)
    for r in plain:
        assert r["passes"] == r["tokens"] == r["verified"] >= 1 and r["calls"] == {} and r["draft_ms"] == {}
        assert 0 < r["prefill_ms"] and r["prefill_ms"] + r["verify_ms"] <= r["wall_ms"] + 1e-6
        assert "chosen" not in r
    # and it is literally Target.generate: the same tokens when called directly
    model, tok = lm.load_lm(run["target"]), lm.load_tokenizer(run["target"])
    wl, pid, text = next(p for p in PROMPTS if (p[0], p[1]) == (plain[0]["workload"], plain[0]["prompt_id"]))
    res = livephase.Plain(Target(model, tok), RunConfig("live", K, MAX_NEW)).run_prompt(wl, pid, tok(text).input_ids)
    y, _, _ = Target(model, tok).generate(tok(text).input_ids, MAX_NEW, 0)
    assert res.output == y and len(res.timings["verify"]) == len(y) == plain[0]["tokens"]


def _replays(d):
    """{(config, workload, prompt_id): (passes, verified, calls, chosen)} of every policy's replay on d's dense log."""
    t = livephase.dense_table(d)
    timing = livephase.policies_timing(_manifest(d), t.drafters)
    lines = _lines(d)
    order = [t.prompt_ids.index(f"{w}/{p}") for w, p in dict.fromkeys((r["workload"], r["prompt_id"]) for r in lines)]
    out = {}
    for name in livepolicies.LIVE_POLICIES:
        c = livepolicies.replay(t, name, order, timing)
        for p in order:
            wl, pid = t.prompt_ids[p].split("/", 1)
            calls = {n: int(x) for n, x in zip(t.drafters, c.calls[p]) if x}
            chosen = {n: int(x) for n, x in zip(t.drafters, c.chosen[p]) if x}
            out[(POLICY + name, wl, pid)] = (int(c.passes[p]), int(c.verified[p]), calls, chosen)
    return out


def test_timing_free_policies_decoded_live_equal_their_replay(run):
    t = livephase.dense_table(run["dir"])
    timing = livephase.policies_timing(_manifest(run["dir"]), t.drafters)
    assert set(timing.lookup) == {"ngram", "suffix", "srun"}  # lookups by kind, as the engine drafts them
    for name in livepolicies.LIVE_POLICIES:
        pol = livepolicies.make(name, t, timing)
        assert hasattr(pol, "observe_step") == (name not in TIMING_FREE)
        pickle.loads(pickle.dumps(pol))  # it travels to a Ray actor
    want = _replays(run["dir"])
    lines = [r for r in _lines(run["dir"]) if r["config"].startswith(POLICY)]
    assert {r["config"][len(POLICY) :] for r in lines} >= set(TIMING_FREE)
    n_checked, mixed = 0, set()
    for r in lines:
        assert r["same_as_dense"] and sum(r["chosen"].values()) == r["passes"]
        if r["config"][len(POLICY) :] not in TIMING_FREE:
            continue
        got = (r["passes"], r["verified"], r["calls"], r["chosen"])
        assert got == want[(r["config"], r["workload"], r["prompt_id"])], r["config"]
        n_checked += 1
        mixed |= {r["config"]} if len(r["chosen"]) > 1 else set()
    assert n_checked == len(TIMING_FREE) * 2 * N_LIVE and mixed  # some policy switched drafters within a prompt


def test_lookup_drafts_made_before_choosing_are_counted(run):
    """Every lookup drafts at every block with room for a draft (k > 0), chosen or not; a model drafter is called
    only when chosen. Counted independently from the lines themselves."""
    lookups = {"ngram", "suffix", "srun"}
    for r in _lines(run["dir"]):
        if not r["config"].startswith(POLICY):
            continue
        full = r["tokens"] == MAX_NEW  # only then can a block start at the last position (k = 0)
        for n in lookups:
            assert r["passes"] - int(full) <= r["calls"][n] <= r["passes"], (r["config"], n)
            assert r["draft_ms"][n] > 0
        for n, c in r["calls"].items():
            if n not in lookups:
                assert c == r["chosen"][n]


class Always:
    """Chooses one drafter at every block; records its contexts."""

    full_information = True

    def __init__(self, name):
        self.name, self.seen = name, []

    def reset(self, drafters, workloads, timing=None):
        self.names, self.timing = list(drafters), timing

    def choose(self, ctx):
        self.seen.append(ctx)
        return self.names.index(self.name)

    def update(self, ctx, chosen, accepted, observed):
        self.seen.append((chosen, accepted.copy(), observed.copy()))


def _engine_parts(run):
    model, tok = lm.load_lm(run["target"]), lm.load_tokenizer(run["target"])
    env = DrafterEnv(model, tok, run["target"])
    drafters = build_drafters([parse_spec(s) for s in run["specs"] if not s.startswith("srun")], env)
    return Target(model, tok), {n: drafters[n] for n in sorted(drafters)}, tok


def test_engine_tells_a_policy_the_lookups_before_and_after_choosing(run):
    """Under a full-information policy: each lookup's draft length and features before the choice, and after the
    block its acceptance censored to the block's new tokens; checked against a dense run of the same prompt (every
    lookup's draft and full acceptance at every position)."""
    target, drafters, tok = _engine_parts(run)
    ids = tok(PROMPTS[5][2]).input_ids
    fresh = _engine_parts(run)[1]
    lookups = {n: fresh[n] for n in ("ngram", "suffix")}
    dense = Engine(target, lookups, RunConfig("dense", K, MAX_NEW)).run_prompt("copy", "p0", ids)
    pol = Always("draft")
    res = Engine(target, drafters, RunConfig("live", K, MAX_NEW), pol, ["code", "copy"]).run_prompt("copy", "p0", ids)
    assert res.output == dense.output
    names = list(drafters)
    look = [i for i, n in enumerate(names) if drafters[n].kind in LOOKUP_KINDS]
    assert [names[i] for i in look] == ["ngram", "suffix"]
    ctxs, ups = pol.seen[0::2], pol.seen[1::2]
    assert len(ctxs) == len(res.records) == len(res.timings["draft"]["draft"]) == res.timings["chosen"].count("draft")
    with_room = [r["pos"] < MAX_NEW - 1 for r in res.records]
    for n in ("ngram", "suffix"):  # drafted (and timed) before every choice with room for a draft
        assert len(res.timings["draft"][n]) == sum(with_room) > 1
    censored = 0
    for rec, ctx, (chosen, acc, obs), room in zip(res.records, ctxs, ups, with_room):
        assert list(rec["drafts"]) == ["draft"]  # only the verified draft is recorded
        assert ctx.draft_len.dtype == np.int32 and np.isnan(np.delete(ctx.draft_features, look, 0)).all()
        a = rec["drafts"]["draft"]["accepted"]
        assert chosen == names.index("draft") and obs[chosen] and acc[chosen] == a
        n_new = len(res.output[rec["pos"] : rec["pos"] + a + 1])
        for i in look:
            logged = dense.records[rec["pos"]]["drafts"][names[i]]
            assert ctx.draft_len[i] == len(logged["tokens"])
            assert tuple(ctx.draft_features[i]) == schema.draft_features(logged["conf"], logged["entropy"])
            if room:  # its common prefix with the block's new tokens
                assert obs[i] and acc[i] == min(logged["accepted"], n_new)
                censored += logged["accepted"] > n_new
            else:
                assert not obs[i] and np.isnan(acc[i])
        others = [i for i in range(len(names)) if i not in look and i != chosen]
        assert not obs[others].any() and np.isnan(acc[others]).all()
    assert censored  # some lookup would have accepted more than the block revealed


def test_the_warm_up_leaves_the_measured_policy_fresh(run):
    target, drafters, tok = _engine_parts(run)
    prompts = [(w, p, tok(text).input_ids) for w, p, text in PROMPTS]
    outputs = {(w, p): target.generate(ids, MAX_NEW, 0)[0] for w, p, ids in prompts}
    chosen = {("code", "c1"), ("copy", "p2"), ("copy", "p3")}
    pol = Always("medusa")
    cfg = RunConfig("dense", K, MAX_NEW)
    got = list(
        livephase.decode(target, drafters, prompts, outputs, cfg, chosen, set(), {"always": pol}, ["code", "copy"])
    )
    assert [(w, p) for w, p, _ in got] == [("code", "c1"), ("copy", "p2"), ("copy", "p3")]
    ctxs = [c for c in pol.seen if not isinstance(c, tuple)]
    line = [ls[-1] for _, _, ls in got]
    assert [x["config"] for x in line] == ["policy:always"] * 3
    # the measured instance met the sampled prompts only, counted 0, 1, 2: the warm-up decode was another's
    assert len(ctxs) == sum(x["passes"] for x in line)
    assert [c.prompt for c in ctxs] == sum(([i] * x["passes"] for i, x in enumerate(line)), [])
    assert ctxs[0].workload == 0 and ctxs[-1].workload == 1 and np.isnan(ctxs[0].prev_accepted).all()


def test_a_resumed_live_phase_runs_the_same_policies(run, tmp_path):
    d = tmp_path / "cut"
    shutil.copytree(run["dir"], d)
    lines = (d / "live.jsonl").read_text().splitlines()
    per = len(lines) // (2 * N_LIVE)
    (d / "live.jsonl").write_text("\n".join(lines[: per + 3]) + "\n" + lines[per + 3][:30])  # killed in prompt 2
    _sweep(run, d, resume=True)
    # the same policy timing, and the policies learned from prompt 1 again (specselect follows the clock)
    same = lambda rs: [r for r in _strip(rs) if r["config"] != "policy:specselect"]
    assert same(_lines(d)) == same(_lines(run["dir"]))
    assert _manifest(d)["live"]["policy_timing"] == _manifest(run["dir"])["live"]["policy_timing"]


def test_resume_of_an_older_live_phase_redoes_it_with_every_configuration(run, tmp_path):
    """A complete run whose live.jsonl predates plain and the policies: --resume redoes its live phase with every
    configuration, leaving the dense records as they were."""
    d = tmp_path / "old"
    shutil.copytree(run["dir"], d)
    old = [r for r in _lines(d) if r["config"].startswith(FIXED) or r["config"] == BEST_OF_N]
    (d / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    m = _manifest(d)
    m["live"] = {k: v for k, v in m["live"].items() if k != "policy_timing"}
    m["live"]["configs"] = list(dict.fromkeys(r["config"] for r in old))
    (d / "manifest.json").write_text(json.dumps(m))
    dense = {f.name: f.read_bytes() for f in d.iterdir() if f.name.startswith(("blocks_dense", "progress"))}
    _sweep(run, d, resume=True)
    assert {f.name: f.read_bytes() for f in d.iterdir() if f.name.startswith(("blocks_dense", "progress"))} == dense
    new, ref = _strip(_lines(d)), _strip(_lines(run["dir"]))
    assert [r["config"] for r in new] == [r["config"] for r in ref]
    fixed = lambda rs: [r for r in rs if not r["config"].startswith(POLICY)]
    assert fixed(new) == fixed(ref)
    want = _replays(d)  # its policies were made with the policy timing measured now
    for r in new:
        if r["config"][len(POLICY) :] in TIMING_FREE:
            assert (r["passes"], r["verified"], r["calls"], r["chosen"]) == want[
                (r["config"], r["workload"], r["prompt_id"])
            ]
    m2 = _manifest(d)
    assert m2["live"]["configs"] == _manifest(run["dir"])["live"]["configs"] and m2["complete"] is True
    assert set(m2["live"]["policy_timing"]) >= {"verify_ms", "drafter_ms"}  # measured now, for the new policies


def test_live_policies_option(run, tmp_path):
    assert livephase.policy_list(None) == list(livepolicies.LIVE_POLICIES)
    assert livephase.policy_list("") == []
    assert livephase.policy_list("ucbspec, selector") == ["selector", "ucbspec"]  # the contract's order
    with pytest.raises(lm.HarnessError, match=r"--live-policies ucbspec,nope: 'nope' is not a live policy"):
        livephase.policy_list("ucbspec,nope")
    args = [
        "--target",
        run["target"],
        "--workload-file",
        run["wl"],
        "--out",
        tmp_path / "x",
        "--drafter",
        "ngram=ngram",
    ]
    for extra, msg in [
        (["--live-prompts", "1", "--live-policies", "bandit"], "error: --live-policies bandit: 'bandit' is not"),
        (["--live-policies", "ucbspec"], "error: --live-policies: applies to the live phase (--live-prompts N)"),
    ]:
        res = CliRunner().invoke(sweep.app, [str(a) for a in args + extra])
        text = (res.output or "") + (getattr(res, "stderr", "") or "")
        assert res.exit_code == 1 and msg in text and len(set(text.strip().splitlines())) == 1, text
    assert not (tmp_path / "x").exists()  # refused before any work
    names = ["a", "b"]
    assert livephase.configurations(names, []) == [PLAIN, "fixed:a", "fixed:b", BEST_OF_N]
    assert livephase.configurations(["a"], ["ucbspec"]) == [PLAIN, "fixed:a"]  # one drafter: nothing to choose
