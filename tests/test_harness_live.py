"""Live speculative decoding reproduces the target's own generate(), for every drafter,
every target family, and under a policy; sampled output does not depend on the drafter."""

import numpy as np
import pytest
import torch
import transformers

from harness.models import lm
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_zoo

torch.set_num_threads(1)
MAX_NEW = 32


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2"])
def zoo(request, tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp(request.param), request.param)
    if request.param == "gpt2" and int(transformers.__version__.split(".")[0]) < 5:
        with pytest.raises(lm.HarnessError, match="Cache-class support"):  # a clear refusal, not a crash
            lm.load_lm(z["target"])
        pytest.skip("GPT-2 runs on transformers >= 5 only (4.x GPT-2 has no Cache class)")
    z["model"], z["tok"] = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    z["arch"] = request.param
    return z


def _drafters(z, temperature=0.0, extra=()):
    env = DrafterEnv(z["model"], z["tok"], z["target"], temperature=temperature)
    return build_drafters([parse_spec(s) for s in list(z["specs"]) + list(extra)], env)


def _live(z, name, drafters, prompt, temperature=0.0, k=4):
    eng = Engine(
        Target(z["model"], z["tok"], temperature=temperature),
        {name: drafters[name]},
        RunConfig("live", k, MAX_NEW, temperature),
    )
    return eng.run_prompt("w", "p", prompt)


def test_live_greedy_equals_generate_for_every_drafter(zoo):
    # self=draft model identical to the target: every draft token must be accepted
    drafters = _drafters(zoo, extra=[f"self=draft:path={zoo['target']}"])
    accepted_any = set()
    for _, _, text in PROMPTS[:2]:
        prompt = zoo["tok"](text).input_ids
        ref = (
            zoo["model"]
            .generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
                0, len(prompt) :
            ]
            .tolist()
        )
        for name in drafters:
            res = _live(zoo, name, drafters, prompt)
            assert res.output == ref, f"{name}: live output differs from generate()"
            if any(r["drafts"][name]["accepted"] for r in res.records):
                accepted_any.add(name)
            # blocks tile the output: pos advances by accepted + 1
            pos = [r["pos"] for r in res.records]
            steps = [r["drafts"][name]["accepted"] + 1 for r in res.records]
            assert pos == list(np.cumsum([0] + steps[:-1]))
    assert {"self", "ngram"} <= accepted_any  # multi-token acceptance was exercised
    res = _live(zoo, "self", drafters, zoo["tok"](PROMPTS[0][2]).input_ids)
    assert all(r["drafts"]["self"]["accepted"] == len(r["drafts"]["self"]["tokens"]) for r in res.records)


class RoundRobin:
    """A trivial policy: drafter (block index mod D); records what it was told."""

    def reset(self, drafters, workloads):
        self.D, self.calls = len(drafters), []

    def choose(self, ctx):
        self.calls.append(("choose", ctx.pos, ctx.prev_accepted.copy(), ctx.prev_features.copy()))
        return len([c for c in self.calls if c[0] == "choose"]) % self.D

    def update(self, ctx, chosen, accepted, observed):
        self.calls.append(("update", chosen, accepted.copy(), observed.copy()))


def test_live_policy(zoo):
    drafters = _drafters(zoo)
    pol = RoundRobin()
    eng = Engine(Target(zoo["model"], zoo["tok"]), drafters, RunConfig("live", 4, MAX_NEW), pol, ["w"])
    prompt = zoo["tok"](PROMPTS[1][2]).input_ids
    res = eng.run_prompt("w", "p", prompt)
    ref = (
        zoo["model"]
        .generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
            0, len(prompt) :
        ]
        .tolist()
    )
    assert res.output == ref
    names = list(drafters)
    ups = [c for c in pol.calls if c[0] == "update"]
    chs = [c for c in pol.calls if c[0] == "choose"]
    assert len(ups) == len(res.records) == len(chs)
    for i, (rec, up) in enumerate(zip(res.records, ups)):
        assert list(rec["drafts"]) == [names[up[1]]]  # only the chosen drafter is observed
        assert up[3].sum() == 1 and up[3][up[1]]
        assert up[2][up[1]] == rec["drafts"][names[up[1]]]["accepted"]
        assert np.isnan(np.delete(up[2], up[1])).all()
        if i + 1 < len(chs):  # the next context carries this block's observation only
            prev_acc, prev_feat = chs[i + 1][2], chs[i + 1][3]
            assert prev_acc[up[1]] == up[2][up[1]] and np.isnan(np.delete(prev_acc, up[1])).all()
            assert np.isfinite(prev_feat[up[1]]).all() and np.isnan(np.delete(prev_feat, up[1], 0)).all()
    assert np.isnan(chs[0][2]).all()


def test_sampled_output_is_drafter_invariant(zoo):
    if zoo["arch"] != "llama":
        pytest.skip("one family suffices: the coupling lives in harness/models/sampling.py, not in the model")
    T = 0.9
    drafters = _drafters(zoo, T, extra=[f"self=draft:path={zoo['target']}"])
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    outs = {n: _live(zoo, n, drafters, prompt, T).output for n in drafters}
    dense = Engine(
        Target(zoo["model"], zoo["tok"], temperature=T), _drafters(zoo, T), RunConfig("dense", 4, MAX_NEW, T)
    )
    ref = dense.run_prompt("w", "p", prompt).output
    assert all(o == ref for o in outs.values()), {n: o[:8] for n, o in outs.items()}
    greedy = _live(zoo, "ngram", _drafters(zoo), prompt).output
    assert ref != greedy  # sampling really sampled
    # the same seed gives the same sample; another seed another one
    other = (
        Engine(
            Target(zoo["model"], zoo["tok"], temperature=T),
            {"ngram": drafters["ngram"]},
            RunConfig("live", 4, MAX_NEW, T, seed=1),
        )
        .run_prompt("w", "p", prompt)
        .output
    )
    assert other != ref


def test_live_with_bandit_policies(zoo):
    """The policies of bandit/policies/registry.py run in the loop unchanged (their reset takes timing,
    choose may return (drafter, cut length), ctx.draft_len is read)."""
    policies = pytest.importorskip("bandit.policies.registry")
    if zoo["arch"] != "llama":
        pytest.skip("one family suffices")
    prompt = zoo["tok"](PROMPTS[3][2]).input_ids
    ref = (
        zoo["model"]
        .generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
            0, len(prompt) :
        ]
        .tolist()
    )
    for pol in [policies.Random(random_state=0), CutOne()]:
        eng = Engine(Target(zoo["model"], zoo["tok"]), _drafters(zoo), RunConfig("live", 4, MAX_NEW), pol, ["w"])
        res = eng.run_prompt("w", "p", prompt)
        assert res.output == ref
        assert all(len(r["drafts"]) == 1 for r in res.records)
        if isinstance(pol, CutOne):
            assert all(len(d["tokens"]) <= 1 for r in res.records for d in r["drafts"].values())
            assert pol.lens and all(len(x) == len(eng.names) for x in pol.lens)


class CutOne(RoundRobin):
    """Chooses ngram with a cut of one token; records ctx.draft_len."""

    def reset(self, drafters, workloads, timing=None):
        super().reset(drafters, workloads)
        self.lens, self.k = [], (timing.k if timing is not None else None)

    def choose(self, ctx):
        self.lens.append(ctx.draft_len.copy())
        return (0, 1)


def test_live_best_of_n_equals_generate_and_advances_by_the_longest(zoo):
    # the advancing draft is often not the first one, so its keys must be moved into place
    drafters = _drafters(zoo, extra=[f"self=draft:path={zoo['target']}"])
    names = list(drafters)
    order = [n for n in names if n != "self"] + ["self"]  # the perfect drafter last
    eng = Engine(
        Target(zoo["model"], zoo["tok"]), {n: drafters[n] for n in order}, RunConfig("live", 4, MAX_NEW), best_of_n=True
    )
    for _, _, text in PROMPTS[:2]:
        prompt = zoo["tok"](text).input_ids
        ref = (
            zoo["model"]
            .generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
                0, len(prompt) :
            ]
            .tolist()
        )
        res = eng.run_prompt("w", "p", prompt)
        assert res.output == ref
        pos = [r["pos"] for r in res.records]
        best = [max(d["accepted"] for d in r["drafts"].values()) for r in res.records]
        assert pos == list(np.cumsum([0] + [b + 1 for b in best[:-1]]))
        assert all(set(r["drafts"]) == set(order) for r in res.records)  # every drafter observed
        assert all(v[1] == len(order) for v in res.timings["verify"])  # one tree forward of all drafts
        assert res.timings["prefill_ms"] >= 0


def test_best_of_n_is_live_only(zoo):
    drafters = _drafters(zoo)
    with pytest.raises(lm.HarnessError, match="best-of-N"):
        Engine(Target(zoo["model"], zoo["tok"]), drafters, RunConfig("dense", 4, MAX_NEW), best_of_n=True)
