"""Target hidden states from any layer, the EAGLE-3 and DFlash loaders in their public layouts,
the refusal of head directories (and partial weights) as draft models, and bfloat16 exactness.

No upstream package is needed here (tests/reference/ has the tiers that compare with them): the
public layouts are written by harness.models.eagle3.write_random / harness.models.dflash.write_random."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from harness.models import blocks, dflash, eagle3, lm
import sweep
from harness.drafters import DrafterEnv, Prefix, build_drafters, feature_layers, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.lm import HarnessError
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, make_zoo, save_model, write_workload_file

torch.set_num_threads(1)
MAX_NEW, K = 24, 5


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("feat")
    tok = make_tokenizer()
    t = save_model(make_model("llama", len(tok), layers=4), tok, root / "target")
    model = lm.load_lm(t)
    z = {
        "root": root,
        "target": t,
        "tok": tok,
        "model": model,
        "draft": save_model(make_model("llama", len(tok), layers=1, seed=1), tok, root / "draft"),
    }
    z["e3"] = eagle3.write_random(root / "e3", model, [1, 2, 4], draft_vocab=60, seed=1)
    z["e3l"] = eagle3.write_random(
        root / "e3l", model, [0, 2, 3], layout="eagle3", num_layers=2, model_type="qwen3", seed=2
    )
    z["df"] = dflash.write_random(root / "df", model, [0, 3], block_size=6, num_layers=2, seed=3)
    z["dfv"] = dflash.write_random(root / "dfv", model, [0, 3], block_size=6, seed=4, vocab_rows=list(range(7, 77)))
    z["specs"] = [
        f"e3=eagle3:path={z['e3']}",
        f"e3l=eagle3:path={z['e3l']}",
        f"df=dflash:path={z['df']}",
        f"dfv=dflash:path={z['dfv']}",
        "ng=ngram",
        f"self=draft:path={t}",
    ]
    return z


def _drafters(z, model=None, specs=None, exact=False, T=0.0):
    env = DrafterEnv(model or z["model"], z["tok"], z["target"], temperature=T, exact=exact)
    return build_drafters([parse_spec(s) for s in specs or z["specs"]], env)


def _reference(model, prompt):
    return model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
        0, len(prompt) :
    ].tolist()


# ------------------------------------------------------------------------- hidden states


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_taps_equal_output_hidden_states(arch):
    m = make_model(arch, 100, layers=3)
    L = 3
    ids = torch.arange(4, 20)
    hs = m(ids[None], output_hidden_states=True).hidden_states
    keys = [lm.LAST] + [lm.layer_in(i) for i in range(L)] + [lm.layer_out(i) for i in range(L)]
    mods = list(lm.decoder_layers(m)) + [m.get_output_embeddings()]
    n_hooks = lambda: [(len(x._forward_hooks), len(x._forward_pre_hooks)) for x in mods]
    before = n_hooks()  # transformers keeps hooks of its own for output_hidden_states
    cache = lm.new_cache()
    _, a = lm.forward(m, ids[:10], cache, taps=keys)  # in two parts through a cache, the second masked
    allow = torch.ones(6, 16, dtype=torch.bool).tril(10)
    _, b = lm.forward(m, ids[10:], cache, allow=allow, taps=keys)
    got = {k: torch.cat([a[k], b[k]]) for k in keys}
    assert torch.allclose(got[lm.LAST], hs[L][0], atol=1e-5)
    for i in range(L):
        assert torch.allclose(got[lm.layer_in(i)], hs[i][0], atol=1e-5)  # the input of layer i
        if i < L - 1:
            assert torch.allclose(got[lm.layer_out(i)], hs[i + 1][0], atol=1e-5)
    assert lm.hidden_state(L, L) == lm.LAST and lm.hidden_state(2, L) == "in:2"
    assert n_hooks() == before  # ours live only within a forward


def test_taps_are_checked_and_declared(zoo):
    with pytest.raises(HarnessError, match="in:9"):
        lm.forward(zoo["model"], torch.tensor([5, 6]), lm.new_cache(), taps=["in:9"])
    with pytest.raises(HarnessError, match="hidden_states\\[7\\]"):
        lm.hidden_state(7, 4)
    d = _drafters(zoo)
    assert feature_layers(d["e3"]) == {"in:1", "in:2", "last"}  # hidden_states[1, 2, 4] of 4 layers
    assert feature_layers(d["df"]) == {"in:1", "last"}  # z-lab's hidden_states[id + 1] for ids 0, 3
    assert feature_layers(d["ng"]) == feature_layers(d["self"]) == frozenset()
    eng = Engine(Target(zoo["model"], zoo["tok"]), d, RunConfig("dense", K, MAX_NEW))
    assert eng.taps == {"last", "in:0", "in:1", "in:2", "in:3"}  # the union, plus the free "last"
    lean = Engine(Target(zoo["model"], zoo["tok"]), {"ng": d["ng"]}, RunConfig("live", K, MAX_NEW))
    assert lean.taps == frozenset()  # lookups live: no hook at all, plain decoding's forwards
    kept = Engine(Target(zoo["model"], zoo["tok"]), {"ng": d["ng"]}, RunConfig("live", K, MAX_NEW), states=True)
    assert kept.taps == {"last"}


def test_a_live_run_that_taps_nothing_decodes_the_same(zoo, monkeypatch):
    """Lookups alone, live: no forward carries a tap and the prefill keeps the last row's logits only, yet the output
    and every record equal those of the same run with the "last" state kept (which taps it in every forward)."""
    tgt = Target(zoo["model"], zoo["tok"])
    ng = _drafters(zoo)["ng"]
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    kept = Engine(tgt, {"ng": ng}, RunConfig("live", K, MAX_NEW), states=True).run_prompt("w", "p", prompt)
    calls, forward = [], lm.forward
    monkeypatch.setattr(lm, "forward", lambda *a, **kw: calls.append(kw) or forward(*a, **kw))
    lean = Engine(tgt, {"ng": ng}, RunConfig("live", K, MAX_NEW)).run_prompt("w", "p", prompt)
    assert calls and all(not kw.get("taps") and not kw.get("hidden") for kw in calls)
    assert lean.output == kept.output and len(lean.records) == len(kept.records)
    for a, b in zip(lean.records, kept.records):
        assert (a["pos"], a["drafts"]["ng"]["tokens"], a["drafts"]["ng"]["accepted"]) == (
            b["pos"],
            b["drafts"]["ng"]["tokens"],
            b["drafts"]["ng"]["accepted"],
        )
    assert lean.state[0] is None and lean.hidden == {} and kept.state[0] is not None
    assert lm.cache_len(lean.state[1]) == lm.cache_len(kept.state[1]) == len(prompt) + len(lean.output) - 1


def test_generate_and_verify_carry_every_tap(zoo):
    tgt = Target(zoo["model"], zoo["tok"])
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    keys = {"last", "in:1", "out:2"}
    y, hid, cache = tgt.generate(prompt, 8, 0, taps=keys)
    ids = torch.tensor([prompt + y[:-1]])
    hs = zoo["model"](ids, output_hidden_states=True).hidden_states
    assert torch.allclose(hid["in:1"], hs[1][0], atol=1e-5) and torch.allclose(hid["out:2"], hs[3][0], atol=1e-5)
    y2, f2, _ = tgt.generate(prompt, 8, 0)  # no taps: the "last" state alone, as before
    assert y2 == y and torch.allclose(f2, hid["last"])


# ------------------------------------------------------------------ EAGLE-3 and DFlash


@pytest.mark.parametrize("T", [0.0, 0.8])
def test_public_layouts_live_equals_generate_and_dense(zoo, T):
    d = _drafters(zoo, T=T)
    tgt = Target(zoo["model"], zoo["tok"], temperature=T)
    dense = Engine(tgt, d, RunConfig("dense", K, MAX_NEW, T))
    for _, _, text in PROMPTS[:2]:
        prompt = zoo["tok"](text).input_ids
        dres = dense.run_prompt("w", "p", prompt)
        if T == 0:
            assert dres.output == _reference(zoo["model"], prompt)
        for n in d:
            live = Engine(tgt, {n: d[n]}, RunConfig("live", K, MAX_NEW, T)).run_prompt("w", "p", prompt)
            assert live.output == dres.output, n
            for r in live.records:  # every live block is the dense record at its position
                a, b = r["drafts"][n], dres.records[r["pos"]]["drafts"][n]
                assert (a["tokens"], a["accepted"]) == (b["tokens"], b["accepted"]), (n, r["pos"])
                assert a["conf"] == pytest.approx(b["conf"], abs=1e-4)
    df = [x["drafts"]["df"] for x in dres.records]
    assert max(len(x["tokens"]) for x in df) == K  # block 6 drafts up to 5
    e3 = {t for x in dres.records for t in x["drafts"]["e3"]["tokens"]}
    keep = torch.nonzero(load_file(str(zoo["e3"] / "model.safetensors"))["t2d"])[:, 0].tolist()
    assert e3 <= set(keep)  # draft-vocabulary tokens mapped into the target's by d2t
    dfv = {t for x in dres.records for t in x["drafts"]["dfv"]["tokens"]}
    assert dfv and dfv <= set(range(7, 77))  # DFlash's draft vocabulary too


def test_dflash_draft_vocabulary_is_the_full_heads_rows(zoo):
    """The same DFlash weights with a draft vocabulary: its logits are the full-vocabulary logits' columns of those
    rows, and its drafted index maps back to the target's id."""
    full = dflash.load(zoo["dfv"], zoo["model"])
    sub = dflash.load(zoo["dfv"], zoo["model"])
    rows = torch.arange(70) + sub.d2t
    assert rows.tolist() == list(range(7, 77))
    object.__setattr__(full, "_lm_head", zoo["model"].get_output_embeddings())
    g = torch.Generator().manual_seed(0)
    n, H = 12, zoo["model"].config.hidden_size
    ctx_f = full.context(torch.randn(n, 2 * H, generator=g), torch.arange(n))
    first, pos = torch.tensor([9, 30]), torch.tensor([5, 11])
    allow = torch.arange(n)[None, :] < pos[:, None]
    with torch.no_grad():
        lf = full.block(first, pos, ctx_f, allow)
        ls = sub.block(first, pos, ctx_f, allow)
    assert lf.shape[-1] == zoo["model"].config.vocab_size and ls.shape[-1] == 70
    torch.testing.assert_close(ls, lf[..., rows], rtol=1e-5, atol=1e-5)
    assert torch.equal(sub.to_target(ls.argmax(-1)), rows[ls.argmax(-1)])
    for bad, match in (({"draft_vocab_size": 0}, "positive"), ({"draft_vocab_size": 10**6}, "exceeds")):
        cfg = json.loads((zoo["dfv"] / "config.json").read_text())
        cfg["dflash_config"].update(bad)
        d = zoo["root"] / f"dfv-bad-{bad['draft_vocab_size']}"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes((zoo["dfv"] / "model.safetensors").read_bytes())
        with pytest.raises(HarnessError, match=match):
            dflash.load(d, zoo["model"])


def test_eagle3_draft_by_hand(zoo):
    """Our chained drafting step by step, from the module's pieces: fc over three taps, step 0 on the
    true pairs at positions t+1, then feeding back its own hidden state and token."""
    d = _drafters(zoo, specs=[f"e3=eagle3:path={zoo['e3']}"])["e3"]
    m = d.model
    prompt = zoo["tok"](PROMPTS[1][2]).input_ids
    P = len(prompt)
    _, hid = lm.forward(zoo["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=m.keys)
    g = m.fuse(torch.cat([hid[k] for k in m.keys], -1))
    with torch.no_grad():
        h, lg, kv = m.step(g[None], torch.tensor(prompt[1:])[None], torch.arange(1, P)[None])
        h, lg, toks = h[:, -1:], lg[0, -1], []
        for s in range(4):
            t = m.to_target(lg.argmax()[None])
            toks.append(int(t))
            h, lg2, kv = m.step(h, t[None], torch.tensor([[P + s]]), kv)
            lg = lg2[0, -1]
    got = d.draft(Prefix(prompt, P, hid["last"], 0, 0.0, 0, hid), 4)
    assert got.tokens == toks


def test_dflash_block_size_setting_and_info(zoo):
    d = _drafters(zoo, specs=[f"df=dflash:path={zoo['df']},block=3"])["df"]
    assert d.max_len == 2 and d.info()["settings"]["block"] == 3
    prompt = zoo["tok"](PROMPTS[0][2]).input_ids
    res = Engine(Target(zoo["model"], zoo["tok"]), {"df": d}, RunConfig("live", K, MAX_NEW)).run_prompt(
        "w", "p", prompt
    )
    assert res.output == _reference(zoo["model"], prompt)
    assert max(len(r["drafts"]["df"]["tokens"]) for r in res.records) == 2


# ------------------------------------------------------------------------------ refusals


def _env(z):
    return DrafterEnv(z["model"], z["tok"], z["target"])


def test_draft_refuses_head_directories(zoo):
    for key, words in (
        ("df", "this is a DFlash checkpoint"),
        ("e3", "this is an EAGLE-3 checkpoint"),
        ("e3l", "this is an EAGLE-3 checkpoint"),
    ):
        with pytest.raises(HarnessError) as e:
            build_drafters([parse_spec(f"x=draft:path={zoo[key]}")], _env(zoo))
        msg = str(e.value)
        kind = "dflash" if key == "df" else "eagle3"
        assert words in msg and f"--drafter x={kind}:path={zoo[key]}" in msg and "\n" not in msg, msg


def _copy_dir(src, dst, edit):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(dst / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_draft_refuses_weights_that_do_not_cover_the_model(zoo, tmp_path):
    def drop(sd):
        sd.pop("model.layers.0.mlp.down_proj.weight")

    def add(sd):
        sd["model.extra.weight"] = torch.zeros(3)

    for name, edit, key in (
        ("missing", drop, "model.layers.0.mlp.down_proj.weight"),
        ("unexpected", add, "model.extra.weight"),
    ):
        bad = _copy_dir(zoo["draft"], tmp_path / name, edit)
        with pytest.raises(HarnessError) as e:
            build_drafters([parse_spec(f"x=draft:path={bad}")], _env(zoo))
        msg = str(e.value)
        assert name in msg and key in msg and str(bad) in msg and "\n" not in msg, msg
    build_drafters([parse_spec(f"x=draft:path={zoo['draft']}")], _env(zoo))  # the intact one loads


def test_head_loaders_name_what_is_wrong(zoo, tmp_path):
    def drop(sd):
        sd.pop("fc.weight")

    bad = _copy_dir(zoo["e3"], tmp_path / "e3", drop)
    with pytest.raises(HarnessError, match="missing 1: fc.weight"):
        build_drafters([parse_spec(f"x=eagle3:path={bad}")], _env(zoo))
    bad = _copy_dir(zoo["df"], tmp_path / "df", lambda sd: sd.update({"lm_head.weight": torch.zeros(2, 2)}))
    with pytest.raises(HarnessError, match="unexpected 1: lm_head.weight"):
        build_drafters([parse_spec(f"x=dflash:path={bad}")], _env(zoo))
    cfg = json.loads((zoo["df"] / "config.json").read_text())
    cfg["num_target_layers"] = 7
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="target of 7 layers"):
        build_drafters([parse_spec(f"x=dflash:path={bad}")], _env(zoo))
    cfg = json.loads((zoo["e3"] / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]
    (tmp_path / "e3" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HarnessError, match="hidden_states\\[9\\]"):
        build_drafters([parse_spec(f"x=eagle3:path={tmp_path / 'e3'}")], _env(zoo))
    with pytest.raises(HarnessError, match="not a causal LM"):
        lm.load_lm(zoo["df"], what="--target")


# ------------------------------------------------------------------------- bfloat16


def test_bf16_exact_mode_makes_dense_equal_live(zoo):
    model = lm.load_lm(zoo["target"], dtype="bfloat16")
    specs = [f"e3=eagle3:path={zoo['e3']}", f"df=dflash:path={zoo['df']}", "ng=ngram", f"dm=draft:path={zoo['draft']}"]
    d = _drafters(zoo, model, specs, exact=True)
    tgt = Target(model, zoo["tok"], exact=True)
    dense = Engine(tgt, d, RunConfig("dense", K, MAX_NEW), check=True)
    for _, _, text in PROMPTS[:2]:
        prompt = zoo["tok"](text).input_ids
        dres = dense.run_prompt("w", "p", prompt)
        assert dres.check["tokens"] == len(dres.output)
        for n in d:
            live = Engine(tgt, {n: d[n]}, RunConfig("live", K, MAX_NEW), states=True).run_prompt("w", "p", prompt)
            assert live.output == dres.output, n
            for r in live.records:  # bit for bit: the same forwards, one position each
                assert r["drafts"][n]["tokens"] == dres.records[r["pos"]]["drafts"][n]["tokens"], (n, r["pos"])
                assert r["drafts"][n]["conf"] == dres.records[r["pos"]]["drafts"][n]["conf"], (n, r["pos"])
        f_live = live.hidden["last"]
        _, f_gen, _ = tgt.generate(prompt, MAX_NEW, 0)
        assert torch.equal(f_live, f_gen[: f_live.shape[0]])  # the target's own states too


def test_exact_verify_keeps_the_tree_layout(zoo):
    """Exact verification leaves the cache as the tree forward does (trunk, then each chain), so the
    engine's cache moves need no change; its verdicts equal the tree forward's at float32."""
    prompt = zoo["tok"](PROMPTS[2][2]).input_ids
    chains = [[40, 41, 42], [], [50, 51]]
    out = []
    for exact in (False, True):
        tgt = Target(zoo["model"], zoo["tok"], exact=exact)
        c = lm.new_cache()
        lm.forward(zoo["model"], torch.tensor(prompt[:-1]), c)
        v, tf, cf = tgt.verify(c, prompt[-1:], chains, len(prompt), 0, taps={"last", "in:2"})
        out.append((v, tf, cf, [k.clone() for k in (c.layers[0].keys,)]))
    (v0, tf0, cf0, k0), (v1, tf1, cf1, k1) = out
    assert [(a.accepted, a.choices) for a in v0] == [(a.accepted, a.choices) for a in v1]
    assert k0[0].shape == k1[0].shape and torch.allclose(k0[0], k1[0], atol=1e-5)
    assert torch.allclose(tf0["in:2"], tf1["in:2"], atol=1e-5)
    assert all(torch.allclose(a["last"], b["last"], atol=1e-5) for a, b in zip(cf0, cf1))


def test_sweep_records_dtype_exactness_and_the_target_check(zoo, tmp_path):
    wl = write_workload_file(tmp_path / "wl.jsonl", PROMPTS[:2])
    out = sweep.run_sweep(
        target=str(zoo["target"]),
        drafter=[f"e3=eagle3:path={zoo['e3']}", f"df=dflash:path={zoo['df']}", "ng=ngram"],
        workload_file=str(wl),
        out=str(tmp_path / "run"),
        k=4,
        max_new_tokens=16,
        quiet=True,
        exact_verify=True,
    )
    m = json.loads((out / "manifest.json").read_text())
    s = json.loads((out / "settings.json").read_text())
    assert s["dtype"] == "float32" and s["exact_verify"] is True  # auto on CPU is float32
    tc = m["target_check"]
    assert tc["prompts_checked"] == 2 and tc["tokens"] > 0 and tc["disagreements"] == 0 and tc["exact_verify"]
    assert m["drafters"]["e3"]["kind"] == "eagle3" and m["drafters"]["e3"]["settings"]["layers"] == [1, 2, 4]
    assert len((out / "target_check.jsonl").read_text().splitlines()) == 2


def test_zoo_drafters_need_no_layer_taps(tmp_path):
    z = make_zoo(tmp_path)
    model, tok = lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])
    d = build_drafters([parse_spec(s) for s in z["specs"]], DrafterEnv(model, tok, z["target"]))
    assert Engine(Target(model, tok), d, RunConfig("dense", K, MAX_NEW)).taps == {"last"}


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        {"rope_type": "default", "rope_theta": 1000000.0},
    ],
)
def test_rope_frequencies_equal_transformers(rope):
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096, rope_parameters=rope)
    ours = blocks.inv_freq(blocks.rope_params(cfg.to_dict(), "t"), 16)
    if rope["rope_type"] == "default":
        ref = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16))
    else:
        ref, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
        assert scale == 1.0
    assert torch.allclose(ours, ref)
    with pytest.raises(HarnessError, match="rope_type 'yarn'"):
        blocks.rope_params({"rope_parameters": {"rope_type": "yarn"}}, "t")
