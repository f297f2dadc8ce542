"""Dense logs: each drafter's trajectory equals a live run with it; batched verification
equals separate verification; sparse blocks verify every drafter on the identical prefix;
expected_accepted matches its definition."""

import pytest
import torch

from harness.models import lm
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.sampling import expected_accepted
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_zoo

torch.set_num_threads(1)
MAX_NEW, K = 36, 5


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("dense"), "llama")
    z["model"], z["tok"] = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    z["specs"] = z["specs"] + [f"self=draft:path={z['target']}"]
    return z


def _drafters(z, T=0.0):
    return build_drafters(
        [parse_spec(s) for s in z["specs"]], DrafterEnv(z["model"], z["tok"], z["target"], temperature=T)
    )


def _prompts(z, n=len(PROMPTS)):
    return [(w, p, z["tok"](t).input_ids) for w, p, t in PROMPTS[:n]]


@pytest.mark.parametrize("T", [0.0, 0.8])
def test_dense_trajectory_equals_live(zoo, T):
    dense = Engine(
        Target(zoo["model"], zoo["tok"], temperature=T), _drafters(zoo, T), RunConfig("dense", K, MAX_NEW, T)
    )
    n = len(PROMPTS) if T == 0 else 2  # sampled blocks accept little: keep the live runs short
    dres = [dense.run_prompt(*p) for p in _prompts(zoo, n)]
    names = list(dense.drafters)
    live_d = _drafters(zoo, T)
    for name in names:
        if name == "suffix":  # its corpus of earlier outputs must start empty, as in the dense run
            live_d["suffix"] = type(live_d["suffix"])("suffix", {}, live_d["suffix"].env)
        live = Engine(
            Target(zoo["model"], zoo["tok"], temperature=T), {name: live_d[name]}, RunConfig("live", K, MAX_NEW, T)
        )
        for p, dr in zip(_prompts(zoo, n), dres):
            lr = live.run_prompt(*p)
            assert lr.output == dr.output
            pos, traj = 0, []
            while pos < len(dr.output):
                a = dr.records[pos]["drafts"][name]["accepted"]
                traj.append((pos, a))
                pos += a + 1
            assert traj == [(r["pos"], r["drafts"][name]["accepted"]) for r in lr.records], name
            for r in lr.records:  # identical drafts, not just identical counts
                d, ld = dr.records[r["pos"]]["drafts"][name], r["drafts"][name]
                assert d["tokens"] == ld["tokens"], name
                assert d["conf"] == pytest.approx(ld["conf"], abs=1e-4)
                assert d["expected_accepted"] == pytest.approx(ld["expected_accepted"], abs=1e-4)
    recs = [r for d in dres for r in d.records]
    if T == 0:
        assert max(r["drafts"]["self"]["accepted"] for r in recs) == K  # acceptance exercised
        assert all(r["drafts"]["self"]["accepted"] == len(r["drafts"]["self"]["tokens"]) for r in recs)
    else:  # a drafter equal to the target: p == q for every token, so min(1, p/q) = 1
        assert all(
            r["drafts"]["self"]["expected_accepted"] == pytest.approx(len(r["drafts"]["self"]["tokens"]), abs=1e-4)
            for r in recs
        )


def test_batched_verification_equals_separate(zoo):
    tgt = Target(zoo["model"], zoo["tok"], temperature=0.0)
    ids = _prompts(zoo)[0][2]
    g = torch.Generator().manual_seed(0)
    ref_next = tgt.generate(ids, 6, 0)[0]
    chains = [ref_next[:5], ref_next[:2] + [7, 8], torch.randint(4, 100, (5,), generator=g).tolist(), [], ref_next[:3]]

    def fresh():
        c = lm.new_cache()
        lm.forward(zoo["model"], torch.tensor(ids[:-1]), c)
        return c

    batched, tf, cf = tgt.verify(fresh(), ids[-1:], chains, len(ids), 0)
    for ch, b, f in zip(chains, batched, cf):
        (s,), tf1, (f1,) = tgt.verify(fresh(), ids[-1:], [ch], len(ids), 0)
        assert (s.accepted, s.choices) == (b.accepted, b.choices)
        assert s.p == pytest.approx(b.p, abs=1e-5)
        assert torch.allclose(f, f1, atol=1e-5) and torch.allclose(tf, tf1, atol=1e-5)
        # and against a plain full forward of prefix + chain (no cache, no custom mask)
        full = zoo["model"](torch.tensor([ids + ch])).logits[0, len(ids) - 1 :].argmax(-1).tolist()
        assert full == s.choices
    assert [b.accepted for b in batched] == [5, 2, batched[2].accepted, 0, 3]


@pytest.mark.parametrize("T", [0.0, 0.8])
def test_sparse_mode(zoo, T):
    drafters = _drafters(zoo, T)
    eng = Engine(
        Target(zoo["model"], zoo["tok"], temperature=T), drafters, RunConfig("sparse", K, MAX_NEW, T, behaviour="ngram")
    )
    dense = Engine(
        Target(zoo["model"], zoo["tok"], temperature=T), _drafters(zoo, T), RunConfig("dense", K, MAX_NEW, T)
    )
    for p in _prompts(zoo)[:2]:
        sr, dr = eng.run_prompt(*p), dense.run_prompt(*p)
        assert sr.output == dr.output
        assert [r["block"] for r in sr.records] == list(range(len(sr.records)))
        for r in sr.records:  # every drafter, same prefix: same drafts and acceptance as dense
            assert set(r["drafts"]) == set(drafters) and r["target_ms"] >= 0
            for n, d in r["drafts"].items():
                assert d["tokens"] == dr.records[r["pos"]]["drafts"][n]["tokens"]
                assert d["accepted"] == dr.records[r["pos"]]["drafts"][n]["accepted"]
                assert d["expected_accepted"] == pytest.approx(
                    dr.records[r["pos"]]["drafts"][n]["expected_accepted"], abs=1e-4
                )
        nxt = [r["pos"] + r["drafts"]["ngram"]["accepted"] + 1 for r in sr.records]
        assert [r["pos"] for r in sr.records[1:]] == nxt[:-1]  # the behaviour drafter advances


def test_expected_accepted_definition():
    assert expected_accepted([], []) == 0.0
    assert expected_accepted([0.5, 1.0, 0.2], [1.0, 1.0, 1.0]) == pytest.approx(0.5 + 0.5 + 0.1)
    assert expected_accepted([0.3, 0.9], [0.6, 0.3]) == pytest.approx(0.5 + 0.5 * 1.0)
    assert expected_accepted([0.0, 1.0], [1.0, 1.0]) == 0.0


@pytest.mark.parametrize("T", [0.0, 0.8])
def test_dense_generator_gives_the_same_logs(zoo, T):
    """y made by speculative decoding (generator=ngram) instead of token by token: same
    output, same drafts, same acceptance; features differ only by float summation order."""
    runs = {}
    for gen in (None, "ngram"):
        eng = Engine(
            Target(zoo["model"], zoo["tok"], temperature=T),
            _drafters(zoo, T),
            RunConfig("dense", K, MAX_NEW, T, generator=gen),
        )
        runs[gen] = [eng.run_prompt(*p) for p in _prompts(zoo, 3)]
    for a, b in zip(runs[None], runs["ngram"]):
        assert a.output == b.output
        for ra, rb in zip(a.records, b.records):
            for n in ra["drafts"]:
                x, y = ra["drafts"][n], rb["drafts"][n]
                assert (x["tokens"], x["accepted"]) == (y["tokens"], y["accepted"]), n
                assert x["conf"] == pytest.approx(y["conf"], abs=1e-4)
                assert x["expected_accepted"] == pytest.approx(y["expected_accepted"], abs=1e-4)
