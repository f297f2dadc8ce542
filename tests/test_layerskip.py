"""layerskip (harness/drafters/layerskip.py): the target's first L decoder layers + its final norm and lm_head.

The reference is independent of the drafter's code: a plain transformers forward of the full target with
`output_hidden_states=True` over prefix + draft so far, no cache, hidden_states[L] (hidden_states[0] is the
embeddings, so hidden_states[L] is the output of layer L-1), the model's final norm, lm_head, argmax."""

from pathlib import Path

import pytest
import torch

from harness.models import lm
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec, registry
from harness.decode.engine import Engine, RunConfig
from harness.models.lm import HarnessError
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

torch.set_num_threads(1)
N_LAYERS, K, MAX_NEW = 4, 4, 14
ZOO = Path(__file__).resolve().parents[1] / "zoo" / "target"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok), layers=N_LAYERS), tok, tmp_path_factory.mktemp("ls") / "target")
    model, tok = lm.load_lm(path), lm.load_tokenizer(path)
    return {"path": path, "model": model, "tok": tok, "prompts": [tok(t).input_ids for _, _, t in PROMPTS]}


def brute(model, prefix: list[int], n_layers: int, k: int) -> list[int]:
    """k greedy tokens of the early exit after n_layers layers, by full forwards without any cache."""
    ids = list(prefix)
    with torch.no_grad():
        for _ in range(k):
            out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
            assert len(out.hidden_states) == model.config.num_hidden_layers + 1
            h = out.hidden_states[n_layers][0, -1]
            ids.append(int(model.lm_head(model.model.norm(h)).argmax()))
    return ids[len(prefix) :]


def build(t, spec: str, path=True):
    env = DrafterEnv(t["model"], t["tok"], t["path"] if path else None)
    return build_drafters([parse_spec(spec)], env)


def prefixes(t):
    """A few prefixes per prompt: the prompt, and the prompt + some of its tokens again (varied lengths)."""
    for ids in t["prompts"]:
        for extra in (0, 3, 7):
            yield ids + ids[:extra], len(ids)


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_draft_equals_the_brute_force_early_exit(tiny, n_layers):
    d = build(tiny, f"ls=layerskip:layers={n_layers}")["ls"]
    d.start("w", "p")
    for ids, n_prompt in prefixes(tiny):  # one drafter across prefixes: its cache is cropped and extended
        got = d.draft(Prefix(ids, n_prompt, None, 0, 0.0), K).tokens
        assert got == brute(tiny["model"], ids, n_layers, K), (n_layers, ids)


def test_the_layer_count_is_not_off_by_one(tiny):
    """The drafter runs exactly the target's first L layer objects (no copy); and on this target the early exits
    after L-1, L and L+1 layers draft differently, so an off-by-one in L would fail the brute-force test."""
    layers = lm.decoder_layers(tiny["model"])
    for n_layers in (1, 2, 3):
        d = build(tiny, f"ls=layerskip:layers={n_layers}")["ls"]
        own = lm.decoder_layers(d.model)
        assert len(own) == n_layers and all(a is b for a, b in zip(own, layers))
        mine = {p.data_ptr() for p in d.model.parameters()}
        assert mine <= {p.data_ptr() for p in tiny["model"].parameters()}  # shared weights, nothing allocated
        ids = tiny["prompts"][0]
        d.start("w", "p")
        d.draft(Prefix(ids, len(ids), None, 0, 0.0), K)
        assert len(d.cache.layers) == n_layers  # its own cache, L layers deep
    for ids, _ in prefixes(tiny):  # L = 1, 2, 3 and the full target (its greedy tokens, one at a time)
        drafts = [tuple(brute(tiny["model"], ids, n, K)) for n in range(1, N_LAYERS)]
        drafts.append(tuple(Target(tiny["model"], tiny["tok"]).generate(ids, K, 0)[0]))
        if len(set(drafts)) == N_LAYERS:
            return
    pytest.fail("no prefix separates the early exits of adjacent layer counts")


def _recording(d):
    """Record (prefix ids, k, draft tokens) of every live draft call."""
    calls, draft = [], d.draft

    def rec(pre, k):
        out = draft(pre, k)
        calls.append((list(pre.ids), k, out.tokens))
        return out

    d.draft = rec
    return calls


def test_live_blocks_keep_the_cache_in_sync(tiny):
    """Live decoding with the drafter, prompt after prompt: at every block its draft is the brute force of that
    block's prefix (accepted tokens appended, rejected ones cropped), and the output is the target's own."""
    for n_layers in (1, 3):
        drafters = build(tiny, f"ls=layerskip:layers={n_layers}")
        calls = _recording(drafters["ls"])
        target = Target(tiny["model"], tiny["tok"])
        engine = Engine(target, drafters, RunConfig("live", K, MAX_NEW))
        accepted = []
        for (w, p, _), ids in zip(PROMPTS, tiny["prompts"]):
            res = engine.run_prompt(w, p, ids)
            y, _, _ = target.generate(ids, MAX_NEW, 0)
            assert res.output == y  # lossless: the target's greedy output
            assert len(res.records) > 1
            accepted += [r["drafts"]["ls"]["accepted"] for r in res.records if r["pos"] < MAX_NEW - 1]  # k > 0
        assert len(calls) == len(accepted) > len(PROMPTS)
        for ids, k, tokens in calls:
            assert tokens == brute(tiny["model"], ids, n_layers, k)
        assert 0 < sum(accepted) < sum(k for _, k, _ in calls)  # some blocks accept, some reject


def test_dense_drafts_and_the_targets_outputs(tiny):
    """Dense: at every origin the draft is the brute force; the target's outputs and another drafter's records
    are the same with and without the layer-skip drafter."""
    ids = tiny["prompts"][1]
    runs = {}
    for specs in (["ng=ngram"], ["ng=ngram", "ls=layerskip:layers=2"]):
        drafters = build_drafters([parse_spec(s) for s in specs], DrafterEnv(tiny["model"], tiny["tok"]))
        engine = Engine(Target(tiny["model"], tiny["tok"]), drafters, RunConfig("dense", K, MAX_NEW))
        runs[len(specs)] = engine.run_prompt("code", "c2", ids)
    without, with_ls = runs[1], runs[2]
    assert with_ls.output == without.output
    assert [r["drafts"]["ng"] for r in with_ls.records] == [r["drafts"]["ng"] for r in without.records]
    y = with_ls.output
    for r in with_ls.records:
        k = min(K, MAX_NEW - 1 - r["pos"])
        assert r["drafts"]["ls"]["tokens"] == brute(tiny["model"], ids + y[: r["pos"]], 2, k), r["pos"]


@pytest.mark.parametrize(
    "setting", ["layers=0", "layers=4", "layers=-1", "layers=2.5", "layers=abc", "layers=true", ""]
)
def test_a_layer_count_out_of_range_is_refused_in_one_line(tiny, setting):
    spec = "ls=layerskip" + (f":{setting}" if setting else "")
    with pytest.raises(HarnessError) as e:
        build(tiny, spec)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--drafter ls=layerskip")
    assert ("missing setting layers=" in msg) if not setting else ("1..3 (the target has 4 decoder layers)" in msg)


def test_other_refusals(tiny):
    with pytest.raises(HarnessError, match=r"unknown setting\(s\) \['path'\]"):
        build(tiny, "ls=layerskip:layers=1,path=x")
    with pytest.raises(HarnessError, match="needs the loaded target model"):
        build_drafters([parse_spec("ls=layerskip:layers=1")], DrafterEnv(None, None))
    tok = make_tokenizer()
    one = {"model": make_model("llama", len(tok), layers=1), "tok": tok, "path": None}
    with pytest.raises(HarnessError, match="a 1-layer target has nothing to skip"):
        build(one, "ls=layerskip:layers=1", path=False)


def test_info_names_the_layers_and_the_target(tiny):
    assert registry.BUILTIN["layerskip"] == "harness.drafters.layerskip:LayerSkipDrafter"
    infos = [build(tiny, f"ls=layerskip:layers={n}")["ls"].info() for n in (1, 2)]
    assert [i["settings"]["layers"] for i in infos] == [1, 2]
    assert all(len(i["sha256"]) == 64 for i in infos) and infos[0]["sha256"] != infos[1]["sha256"]
    assert infos[0] == build(tiny, "ls=layerskip:layers=1")["ls"].info()  # a function of the weights and L
    assert build(tiny, "ls=layerskip:layers=1", path=False)["ls"].info()["sha256"] is None


@pytest.mark.skipif(not (ZOO / "model.safetensors").is_file(), reason="the zoo target is not here")
def test_zoo_target(tmp_path):
    zoo = {"path": ZOO, "model": lm.load_lm(ZOO), "tok": lm.load_tokenizer(ZOO)}
    prompts = ["def add(a, b):\n    return a + b\n", "The capital of France is"]
    zoo["prompts"] = [zoo["tok"](t).input_ids for t in prompts]
    for n_layers in (1, 2, 3):
        d = build(zoo, f"ls=layerskip:layers={n_layers}")["ls"]
        d.start("w", "p")
        for ids, n_prompt in prefixes(zoo):
            assert d.draft(Prefix(ids, n_prompt, None, 0, 0.0), K).tokens == brute(zoo["model"], ids, n_layers, K)
