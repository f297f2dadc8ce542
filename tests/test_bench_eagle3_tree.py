"""bench/eagle3_tree.py: the head's ranks along the target's path are the harness's drafts (a chain read from them
accepts what Eagle3Drafter's dense drafts accept, at every origin; a planted chain ranks 0 throughout) and each rank
is the one a fresh forward over the prefix alone gives; a tree built from them is the best prefix-closed set of its
size (brute force); trajectories are counted as replay counts them; bad input is one line."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bandit.logs.errors import InputError
from bench import eagle3_tree
from harness.decode.engine import Engine, RunConfig
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.models import eagle3, lm
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_zoo

ROOT = Path(__file__).resolve().parents[1]
K = 4
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tree():
    return eagle3_tree


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    z = make_zoo(root, "llama")
    z["model"], z["tok"] = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    z["e3"] = eagle3.write_random(root / "e3", z["model"], [0, 1, 2], draft_vocab=60, seed=5)
    env = DrafterEnv(z["model"], z["tok"], z["target"])
    z["drafter"] = build_drafters([parse_spec(f"e3=eagle3:path={z['e3']}")], env)["e3"]
    z["head"] = z["drafter"].model
    return z


def test_a_chain_read_from_the_ranks_accepts_what_the_dense_drafts_accept(zoo, tree):
    eng = Engine(Target(zoo["model"], zoo["tok"]), {"e3": zoo["drafter"]}, RunConfig("dense", K, 24, 0.0))
    some = 0
    for w, p, text in PROMPTS:
        ids = zoo["tok"](text).input_ids
        res = eng.run_prompt(w, p, ids)
        R = tree.ranks(zoo["model"], zoo["head"], ids + res.output, len(ids), K)
        assert R.shape == (len(res.output), K)
        for rec in res.records:
            d = rec["drafts"]["e3"]
            assert tree.accepted(R[rec["pos"]][: len(d["tokens"])], tree.chain(K)) == d["accepted"], (p, rec["pos"])
            some += 1
    assert some > 50  # (a random head accepts little here; the planted chains below rank 0 at every depth)


def test_a_planted_chain_ranks_zero_and_each_rank_is_a_fresh_forwards(zoo, tree):
    """The output is the head's own greedy chains, drafted live one after another: every planted origin ranks 0 at
    every depth. Each rank is then recomputed from a forward over that prefix alone, the depths chained one token at
    a time on its cache: the same rank of the target's token."""
    ids = zoo["tok"](PROMPTS[0][2]).input_ids
    n_prompt, d = len(ids), zoo["drafter"]
    seq = list(ids)
    zoo["drafter"].start("", "")
    from harness.drafters.base import Prefix

    for _ in range(3):
        with torch.no_grad(), lm.tapped(zoo["model"], d.feature_layers()) as got:
            lm.forward(zoo["model"], torch.tensor(seq), lm.new_cache())
        hidden = {k_: v[0] for k_, v in got.items()}
        draft = d.draft(Prefix(seq, n_prompt, None, 0, 0.0, 0, hidden), K)
        seq += draft.tokens
    R = tree.ranks(zoo["model"], zoo["head"], seq, n_prompt, K)
    for origin in (0, K, 2 * K):
        assert list(R[origin][: 3 * K - origin]) == [0] * min(K, 3 * K - origin)
    head, x = zoo["head"], torch.tensor(seq)
    _, taps = lm.forward(zoo["model"], x, lm.new_cache(), taps=head.keys)
    g = torch.cat([taps[k_] for k_ in head.keys], -1).float()
    t2d = {int(t): i for i, t in enumerate(head.to_target(torch.arange(head.lm_head.weight.shape[0])))}
    for p in (1, 3, 5, 9):
        P = n_prompt + p
        j = torch.arange(P - 1)
        with torch.no_grad():
            h, lg, kv = head.step(head.fuse(g[: P - 1])[None], x[1:P][None], (j + 1)[None])
            h, lg = h[:, -1:], lg[0, -1]
            for s in range(K):
                if P + s >= len(seq):
                    assert R[p][s] == tree.PAST
                    break
                want = int((lg > lg[t2d[int(x[P + s])]]).sum()) if int(x[P + s]) in t2d else tree.MISS
                assert R[p][s] == want, (p, s)
                h, lgs, kv = head.step(h, x[P + s][None, None], torch.tensor([[P + s]]), kv)
                lg = lgs[0, -1]


def test_the_built_tree_is_the_best_prefix_closed_set_of_its_size(tree):
    rng = np.random.default_rng(0)
    prompts = [rng.choice([0, 0, 0, 1, 1, 2, tree.MISS], size=(30, 2)) for _ in range(4)]
    paths = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    rows = [r for R in prompts for r in R]
    for n in (1, 2, 4, 6):
        best = max(
            sum(tree.accepted(r, set(c)) for r in rows)
            for c in itertools.combinations(paths, n)
            if all(len(q) == 1 or q[:-1] in c for q in c)
        )
        got = tree.build(prompts, n)
        assert len(got) == n and all(len(q) == 1 or q[:-1] in got for q in got)
        assert sum(tree.accepted(r, got) for r in rows) == best, n


def test_trajectories_count_passes_as_replay_does(tree):
    ten = np.zeros((10, 4), dtype=np.int64)
    assert tree.walk(ten, tree.chain(4)) == (10, 2)  # 5 tokens a pass: 4 accepted and the target's own
    assert tree.walk(np.full((10, 4), tree.MISS), tree.chain(4)) == (10, 10)
    ranks = np.array([[1, 0, 0, 0]] * 6)
    assert tree.walk(ranks, tree.chain(4)) == (6, 6)
    assert tree.walk(ranks, {(1,), (1, 0)}) == (6, 2)  # 2 accepted + 1 a pass


def test_no_prompt_is_scored_with_a_tree_built_on_it(tree):
    """Planted halves: every even prompt of a workload ranks the target's token second at depth 1, every odd one
    first. A one-node tree built on the odd half is {(0,)} and accepts nothing on the even half, and the reverse:
    cross-fitted, every pass makes one token; scored in sample, it would make more."""
    keys = [("w", f"p{i}") for i in range(8)] + [("v", f"q{i}") for i in range(6)]
    even, odd = np.array([[1, 0, 0, 0]] * 9), np.zeros((9, 4), dtype=np.int64)
    R = [even if h == 0 else odd for h in tree.halves(keys)]
    figures, trees = tree.crossfit(R, keys, 4, [1], 100, 0)
    assert trees["tree1"] == [[[0]], [[1]]]
    assert figures["tree1"]["pooled"]["value"] == 1.0 and figures["tree1"]["w"]["value"] == 1.0
    assert figures["chain"]["pooled"]["value"] > 1.0  # (the odd prompts accept whole chains)


def test_the_chain_check_reads_the_runs_ci_json(tree, tmp_path):
    names = ["tokens_per_pass[a][eagle3]", "tokens_per_pass[a][eagle3_stop]", "tokens_per_pass[b][eagle3]", "x"]
    (tmp_path / "ci.json").write_text(json.dumps([{"name": n, "value": i + 0.5} for i, n in enumerate(names)]))
    assert tree.ci_figures(tmp_path, "eagle3") == {"a": 0.5, "b": 2.5}
    (tmp_path / "ci.json").write_text("[")
    with pytest.raises(InputError, match="ci.json: unreadable"):
        tree.ci_figures(tmp_path, "eagle3")


def test_relative_time_by_hand(tree):
    figures = {"chain": {"pooled": {"value": 1.5}}, "tree8": {"pooled": {"value": 1.8}}}
    got = tree.relative_time(figures, {"chain": 5, "tree8": 9}, {1: 10.0, 5: 10.0, 17: 20.0}, 0.25)
    assert got["chain"] == 1.0
    # 9 tokens: 10 + 4/12 * 10 ms by the line through 5 and 17, so 4/3 of the chain's verify
    assert got["tree8"] == pytest.approx((4 / 3 + 0.25) / 1.25 * 1.5 / 1.8, abs=1e-4)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--nodes", "4,x"], "--nodes 4,x: expected comma-separated integers"),
        (["--nodes", "0"], "--nodes 0: each size in 1..64"),
        (["--run", "runs/zoo-20261201-134938"], "--drafter eagle3: not an eagle3 drafter of"),
        (["--run", "runs/nowhere"], "no such run directory"),
        (["--run", "runs/smollm2-20261205b", "--drafter", "eagle3_stop"], "its drafts are cut by stop_below"),
        (["--nodes", "4", "--pass-cost", "pyproject.toml"], "pyproject.toml is unreadable"),
        (["--nodes", "4", "--pass-cost", "bench/vllm_timing.json"], "timed target"),
    ],
)
def test_bad_input_is_one_line(args, said):
    r = subprocess.run(
        [sys.executable, "bench/eagle3_tree.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
