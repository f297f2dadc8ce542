"""Trees of drafts (EAGLE-2's dynamic tree on an EAGLE-3 head, `eagle3:tree=N,width=W`): the drafter's tree against
an independent construction by one-path-at-a-time feeding, the target's tree verification against verifying each
root-to-leaf chain alone, live decoding with planted trees against transformers' greedy output, dense records equal
to live ones, the log's checks of a tree, and the refusals."""

import json
import math
import random

import pytest
import torch

from bandit.logs.reader import LogError, load_logs
from bandit.logs.schema import tree_depths, tree_path
from harness.decode.engine import Engine, RunConfig
from harness.drafters import Draft, Drafter, DrafterEnv, Prefix, build_drafters, parse_spec
from harness.models import eagle3, lm
from harness.models.lm import HarnessError
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

torch.set_num_threads(1)
MAX_NEW, K = 24, 4


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    tok = make_tokenizer()
    t = save_model(make_model("llama", len(tok), layers=4), tok, root / "target")
    model = lm.load_lm(t)
    return {
        "tok": tok,
        "target": t,
        "model": model,
        "e3": eagle3.write_random(root / "e3", model, [1, 2, 3], draft_vocab=60, seed=1),
        "e3l": eagle3.write_random(root / "e3l", model, [0, 2, 3], layout="eagle3", num_layers=2, seed=2),
    }


def _drafter(z, spec, T=0.0, exact=False):
    env = DrafterEnv(z["model"], z["tok"], z["target"], temperature=T, exact=exact)
    return build_drafters([parse_spec(spec)], env)[spec.split("=")[0]]


def _reference(model, prompt):
    return model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
        0, len(prompt) :
    ].tolist()


# ------------------------------------------------------------------------------ the schema's helpers


def _random_tree(rng, n, vocab=4):
    parents, tokens = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        used = {tokens[j] for j in range(i) if parents[j] == p}
        free = [t for t in range(vocab) if t not in used]
        if not free:
            p, free = -1, [vocab + i]  # a fresh token under the root keeps siblings distinct
        parents.append(p)
        tokens.append(rng.choice(free))
    return tokens, parents


def test_tree_path_and_depths_against_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        tokens, parents = _random_tree(rng, rng.randrange(0, 12))
        paths = []  # every node's tokens from the root
        for i, p in enumerate(parents):
            paths.append((paths[p] if p >= 0 else []) + [tokens[i]])
        assert tree_depths(parents) == [len(x) for x in paths]
        y = [rng.randrange(4) for _ in range(6)]
        deepest = max((len(x) for x in paths if y[: len(x)] == x), default=0)
        got = tree_path(tokens, parents, y)
        assert len(got) == deepest
        assert [tokens[i] for i in got] == y[:deepest] and all(parents[b] == a for a, b in zip([-1] + got, got))
    assert tree_path([5, 6, 7], [-1, 0, 1], [5, 6, 9]) == [0, 1]  # a chain: its common prefix
    for bad in ([0], [-2], [-1, 1]):
        with pytest.raises(ValueError, match="parent"):
            tree_depths(bad)


# ------------------------------------------------------------------------------ the drafter's tree


def _sequential_tree(z, d, prompt, k, n_nodes, width):
    """EAGLE-2's rule built independently: every node's distribution from feeding its own path alone (a plain
    causal step per token after the prefix's cache, no tree mask), expanding each depth's `width` most probable
    nodes by their `width` most probable tokens, then the `n_nodes` most probable nodes."""
    m = d.model
    P = len(prompt)
    _, hid = lm.forward(z["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=m.keys)
    g = m.fuse(torch.cat([hid[key] for key in m.keys], -1))
    with torch.no_grad():
        h, lg, kv = m.step(g[None], torch.tensor(prompt[1:])[None], torch.arange(1, P)[None])

        def children(path):  # (hidden to feed a child with, log-probs) after the path's draft-vocabulary ids
            hh, ll, cache = h[:, -1:], lg[0, -1], kv
            for s, di in enumerate(path):
                hh, l2, cache = m.step(hh, m.to_target(torch.tensor([di]))[None], torch.tensor([[P + s]]), cache)
                ll = l2[0, -1]
            return torch.log_softmax(ll.float(), -1)

        nodes = []  # (path log-prob, creation order, draft-vocabulary path)
        frontier = [((), 0.0)]
        for depth in range(1, k + 1):
            made = []
            for path, lp in frontier:
                logp = children(list(path))
                v, i = logp.topk(width)
                for x, di in zip(v.tolist(), i.tolist()):
                    made.append((lp + x, len(nodes) + len(made), path + (di,), x))
            nodes += made
            frontier = [(p, lp) for lp, _, p, _ in sorted(made, key=lambda t: (-t[0], t[1]))[:width]]
        keep = sorted(nodes, key=lambda t: (-t[0], t[1]))[:n_nodes]
    # each kept node's target-token path -> its probability under its parent's distribution
    return {tuple(int(m.to_target(torch.tensor([di]))) for di in p): math.exp(x) for _, _, p, x in keep}


@pytest.mark.parametrize("n_nodes,width", [(6, 2), (11, 3), (14, 2)])  # 14: every node made, to depth 4
def test_tree_is_eagle2s_top_nodes_fed_one_path_at_a_time(zoo, n_nodes, width):
    d = _drafter(zoo, f"t=eagle3:path={zoo['e3']},tree={n_nodes},width={width}")
    for _, _, text in PROMPTS[:3]:
        prompt = zoo["tok"](text).input_ids
        _, hid = lm.forward(zoo["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=d.feature_layers())
        d.start("w", "p")
        got = d.draft(Prefix(prompt, len(prompt), None, 0, 0.0, 0, hid), K)
        assert len(got.tokens) == n_nodes and got.depth <= K
        depth = tree_depths(got.parents)
        assert depth == sorted(depth)  # by depth: parents before children
        paths = []
        for i, p in enumerate(got.parents):
            paths.append((paths[p] if p >= 0 else ()) + (got.tokens[i],))
        want = _sequential_tree(zoo, d, prompt, K, n_nodes, width)
        assert set(paths) == set(want)
        # each node's probability: its ancestors' keys and its position change it (a random head: a little)
        assert got.conf == pytest.approx([want[x] for x in paths], abs=1e-6, rel=0)


def test_a_width_one_tree_is_the_chain(zoo):
    chain = _drafter(zoo, f"c=eagle3:path={zoo['e3']}")
    tree = _drafter(zoo, f"t=eagle3:path={zoo['e3']},tree={K},width=1")
    prompt = zoo["tok"](PROMPTS[1][2]).input_ids
    _, hid = lm.forward(zoo["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=chain.feature_layers())
    pre = Prefix(prompt, len(prompt), None, 0, 0.0, 0, hid)
    a, b = chain.draft(pre, K), tree.draft(pre, K)
    assert b.tokens == a.tokens and b.parents == list(range(-1, K - 1))
    assert b.conf == pytest.approx(a.conf, abs=1e-5) and b.entropy == pytest.approx(a.entropy, abs=1e-4)


@pytest.mark.parametrize("key", ["e3", "e3l"])
def test_live_tree_decoding_is_greedy_and_every_block_is_the_dense_record(zoo, key):
    d = {"t": _drafter(zoo, f"t=eagle3:path={zoo[key]},tree=7,width=3")}
    tgt = Target(zoo["model"], zoo["tok"])
    for _, _, text in PROMPTS[:3]:
        prompt = zoo["tok"](text).input_ids
        dense = Engine(tgt, d, RunConfig("dense", K, MAX_NEW)).run_prompt("w", "p", prompt)
        live = Engine(tgt, d, RunConfig("live", K, MAX_NEW)).run_prompt("w", "p", prompt)
        assert live.output == dense.output == _reference(zoo["model"], prompt)
        for r in live.records:
            a, b = r["drafts"]["t"], dense.records[r["pos"]]["drafts"]["t"]
            assert (a["tokens"], a.get("parents"), a["accepted"]) == (b["tokens"], b.get("parents"), b["accepted"])
        for r in dense.records:
            x = r["drafts"]["t"]
            if x["tokens"]:
                room = min(K, MAX_NEW - 1 - r["pos"])  # one depth holds width (3) nodes, two enough for 7
                assert len(x["parents"]) == len(x["tokens"]) == (7 if room >= 2 else 3) == d["t"].tree_size(room)
                assert max(tree_depths(x["parents"])) <= room
                assert x["accepted"] == len(tree_path(x["tokens"], x["parents"], dense.output[r["pos"] :]))


# ------------------------------------------------------------------------------ verification, planted


class Planted(Drafter):
    """Trees that hold the target's own next tokens (from `output`) on a branch that is not the first: decoys
    first at every depth, so the accepted path's keys lie scattered over the tree's span."""

    kind = "planted"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.output, self.depth = settings["output"], settings["depth"]

    def draft(self, pre, k):
        y = self.output[pre.pos :]
        true = min(self.depth, k, len(y))
        tokens, parents, conf, at = [], [], [], -1
        for j in range(k):
            decoy = (y[j] + 1 + j) % 90 if j < len(y) else 5
            tokens.append(decoy)  # a decoy under the same parent, first
            parents.append(at)
            if j < true:
                tokens.append(y[j])
                parents.append(at)
                at = len(tokens) - 1
            else:
                break
        conf = [0.5] * len(tokens)
        return Draft(tokens, conf, [1.0] * len(tokens), None, parents)


@pytest.mark.parametrize("depth", [1, 3, K])
def test_planted_trees_decode_greedy_and_accept_their_planted_depth(zoo, depth):
    tgt = Target(zoo["model"], zoo["tok"])
    for _, _, text in PROMPTS[:2]:
        prompt = zoo["tok"](text).input_ids
        ref = _reference(zoo["model"], prompt)
        d = {"p": Planted("p", {"output": ref, "depth": depth}, None)}
        live = Engine(tgt, d, RunConfig("live", K, MAX_NEW)).run_prompt("w", "p", prompt)
        assert live.output == ref  # a wrong key moved into place would change every later token
        for r in live.records:
            rem = MAX_NEW - 1 - r["pos"]
            assert r["drafts"]["p"]["accepted"] == min(depth, K, rem), r["pos"]
        assert len(live.records) < MAX_NEW


def test_a_tree_verified_after_another_draft_advances_from_its_own_rows(zoo):
    """Best-of-N (the tree verified second, after a chain, and advancing) and sparse mode (the chain advancing, the
    tree beside it): the output is transformers' greedy one, and the tree accepts its planted depth."""
    tgt = Target(zoo["model"], zoo["tok"])
    prompt = zoo["tok"](PROMPTS[1][2]).input_ids
    ref = _reference(zoo["model"], prompt)
    chain = _drafter(zoo, f"c=eagle3:path={zoo['e3']}")
    for mode, kw in (("live", {"best_of_n": True}), ("sparse", {})):
        d = {"c": chain, "p": Planted("p", {"output": ref, "depth": 3}, None)}
        res = Engine(tgt, d, RunConfig(mode, K, MAX_NEW, behaviour="c" if mode == "sparse" else None), **kw).run_prompt(
            "w", "p", prompt
        )
        assert res.output == ref, mode
        for r in res.records:
            assert r["drafts"]["p"]["accepted"] == min(3, MAX_NEW - 1 - r["pos"]), (mode, r["pos"])
        if mode == "live":  # the tree won every block the chain did not beat
            assert len(res.records) <= -(-MAX_NEW // 4) + 1


def test_a_tree_verdict_is_the_best_of_its_chains_verified_alone(zoo):
    rng = random.Random(1)
    tgt = Target(zoo["model"], zoo["tok"])
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    ref = _reference(zoo["model"], prompt)
    for trial in range(12):
        tokens, parents = _random_tree(rng, rng.randrange(1, 10), vocab=3)
        tokens = [ref[tree_depths(parents)[i] - 1] if t == 0 else 50 + t for i, t in enumerate(tokens)]
        leaves = [i for i in range(len(tokens)) if i not in parents]
        chains = []
        for leaf in leaves:
            path, at = [], leaf
            while at >= 0:
                path.append(tokens[at])
                at = parents[at]
            chains.append(path[::-1])
        cache = lm.new_cache()
        lm.forward(zoo["model"], torch.tensor(prompt[:-1]), cache)
        n0 = lm.cache_len(cache)
        (v,), _, _ = tgt.verify(cache, prompt[-1:], [tokens], len(prompt), 0, parents=[parents])
        lm.crop(cache, n0)
        alone = []
        for c in chains:
            (w,), _, _ = tgt.verify(cache, prompt[-1:], [c], len(prompt), 0)
            lm.crop(cache, n0)
            alone.append(w.accepted)
        assert v.accepted == max(alone) == len(tree_path(tokens, parents, ref)), trial
        assert v.choices[v.accepted] == ref[v.accepted]  # the bonus token after the accepted path


# ------------------------------------------------------------------------------ the log and refusals


def test_a_tree_record_is_checked_by_the_log_reader(zoo, tmp_path):
    d = {"t": _drafter(zoo, f"t=eagle3:path={zoo['e3']},tree=5,width=2")}
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    recs = Engine(Target(zoo["model"], zoo["tok"]), d, RunConfig("dense", K, MAX_NEW)).run_prompt("w", "p", prompt)
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in recs.records))
    t = load_logs([good])
    assert t.draft_len[:, 0].tolist() == [len(r["drafts"]["t"]["tokens"]) for r in recs.records]  # nodes, priced
    for edit, where in (
        (lambda x: x.update(parents=x["parents"][:-1]), "drafts.t.parents"),
        (lambda x: x.update(parents=[0] + x["parents"][1:]), "drafts.t.parents"),
        (lambda x: x.update(parents=[-1] * len(x["tokens"]), accepted=2), "drafts.t.accepted"),
    ):
        bad = json.loads(json.dumps(recs.records))
        edit(bad[2]["drafts"]["t"])
        f = tmp_path / "bad.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in bad))
        with pytest.raises(LogError) as e:
            load_logs([f], trust_cache=False)
        assert where in str(e.value) and ":3" in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "extra,T,exact,words",
    [
        (",stop_below=0.4", 0.0, False, "stop_below"),
        ("", 0.7, False, "temperature"),
        ("", 0.0, True, "exact"),
        (",width=0", 0.0, False, "width=0"),
        (",tree=x", 0.0, False, "tree='x'"),
    ],
)
def test_trees_are_refused_where_they_cannot_be_verified(zoo, extra, T, exact, words):
    spec = f"t=eagle3:path={zoo['e3']},tree=6{extra}".replace("tree=6,tree=x", "tree=x")
    with pytest.raises(HarnessError) as e:
        _drafter(zoo, spec, T=T, exact=exact)
    assert words in str(e.value) and "--drafter t=eagle3" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------ a sweep with a tree


def test_a_sweep_with_a_tree_decodes_its_policies_live_as_their_replay(tmp_path):
    """The live phase with a tree drafter beside a stopping chain: the tree is hidden from every policy (schema.ArmsOnly),
    live as in its replay on the dense log, so every timing-free policy decoded live makes its replay's choices and
    counts; the tree, named to sort first, shifts no other drafter's index in the fixed configurations' replays."""
    import sweep
    from bandit.logs.schema import POLICY
    from bandit.policies import engines, livepolicies
    from harness.decode import livephase
    from harness.models.tiny import write_workload_file

    tok = make_tokenizer()
    t = save_model(make_model("llama", len(tok), layers=4), tok, tmp_path / "target")
    e3 = eagle3.write_random(tmp_path / "e3", lm.load_lm(t), [1, 2, 3], draft_vocab=60, seed=1)
    prompts = [("code", f"c{i}", f"def f{i}(x):\n    return x * {i} + {i}\n") for i in range(3)]
    prompts += [("copy", f"p{i}", f"{'abcdefg'[i:]} {'xyz' * i} {'abcdefg'[i:]}") for i in range(3)]
    specs = [
        "ngram=ngram",
        "suffix=suffix",
        f"stop=eagle3:path={e3},stop_below=0.02",
        f"atree=eagle3:path={e3},tree=9,width=3",
    ]
    out = sweep.run_sweep(target=str(t), drafter=specs, workload_file=str(write_workload_file(tmp_path / "wl.jsonl", prompts)),
                          out=str(tmp_path / "run"), k=K, max_new_tokens=MAX_NEW, quiet=True, live_prompts=2)  # fmt: skip
    out = tmp_path / "run" if out is None else out
    table = livephase.dense_table(out)
    j = table.drafters.index("atree")
    assert set(table.draft_len[:, j].tolist()) <= {0, 3, 9} and (table.draft_len[:, j] == 9).any()
    manifest = json.loads((out / "manifest.json").read_text())
    timing = livephase.policies_timing(manifest, table.drafters)
    lines = [json.loads(x) for x in (out / "live.jsonl").read_text().splitlines()]
    assert all(r["same_as_dense"] for r in lines)
    order = [
        table.prompt_ids.index(f"{w}/{p}") for w, p in dict.fromkeys((r["workload"], r["prompt_id"]) for r in lines)
    ]
    timing_free = ("selector", "ucbspec", "exp3spec", "hedge_query", "thompson_ctx") + engines.RULE_NAMES
    n = 0
    for name in timing_free:
        c = livepolicies.replay(table, name, order, timing)
        for r in (x for x in lines if x["config"] == POLICY + name):
            p = table.prompt_ids.index(f"{r['workload']}/{r['prompt_id']}")
            chosen = {d: int(x) for d, x in zip(table.drafters, c.chosen[p]) if x}
            assert (r["passes"], r["verified"], r["chosen"]) == (int(c.passes[p]), int(c.verified[p]), chosen), name
            n += 1
    assert n == len(timing_free) * len(order)
    fixed = [r for r in lines if r["config"] == "fixed:atree"]
    assert fixed and all(r["verified"] > r["passes"] * 3 for r in fixed)  # a tree of 9 verified at every pass
    from bandit.live.export import walked

    for r in (x for x in lines if x["config"].startswith("fixed:")):
        p = table.prompt_ids.index(f"{r['workload']}/{r['prompt_id']}")
        rows, chosen, _, _ = walked(table, r["config"], [p])
        assert {table.drafters[c] for c in chosen.tolist()} == {r["config"][len("fixed:") :]}
        assert (len(rows), int((1 + table.draft_len[rows, chosen]).sum())) == (r["passes"], r["verified"]), r["config"]
    assert all(not any(d == "atree" for d in r["chosen"]) for r in lines if r["config"].startswith(POLICY))
