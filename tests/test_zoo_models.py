"""zoo weights: the committed models load offline (safetensors), the tokenizer round-trips and
has a chat template, and the target beats a unigram baseline on held-out text."""

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from zoo import DRAFT_DIR, EAGLE_DIR, MEDUSA_DIR, TARGET_DIR, WORKLOADS, ZOO_DIR


def _need(d: Path):
    if not (d / "model.safetensors").exists():
        pytest.fail(f"{d}/model.safetensors missing: run `python -m zoo.train all`")


@pytest.fixture(scope="module")
def tok():
    _need(TARGET_DIR)
    return transformers.AutoTokenizer.from_pretrained(str(TARGET_DIR), local_files_only=True)


@pytest.fixture(scope="module")
def target():
    _need(TARGET_DIR)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(TARGET_DIR), local_files_only=True, dtype=torch.float32
    ).eval()


def test_weights_are_half_precision_safetensors_within_budget():
    from safetensors import safe_open

    total = 0
    for d in (TARGET_DIR, DRAFT_DIR, MEDUSA_DIR, EAGLE_DIR):
        _need(d)
        assert not list(d.glob("*.bin")) and not list(d.glob("*.pt"))
        f = d / "model.safetensors"
        total += f.stat().st_size
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                assert st.get_slice(k).get_dtype() in ("F16", "BF16"), (f, k)
        assert (d / "README.md").exists(), f"{d} has no model card"
    assert total <= 40 * 2**20


def test_target_and_draft_load_offline(target):
    draft = transformers.AutoModelForCausalLM.from_pretrained(str(DRAFT_DIR), local_files_only=True)
    assert type(target).__name__ == "LlamaForCausalLM"
    nt = sum(p.numel() for p in target.parameters())
    nd = sum(p.numel() for p in draft.parameters())
    assert 1_000_000 <= nt <= 10_000_000
    assert 500_000 <= nd <= 1_500_000
    assert target.config.vocab_size == draft.config.vocab_size
    assert (TARGET_DIR / "tokenizer.json").read_bytes() == (DRAFT_DIR / "tokenizer.json").read_bytes()


def test_heads_load_on_target(target):
    from harness.models.heads import EagleHead, MedusaHeads

    m = MedusaHeads.load(MEDUSA_DIR, target)
    e = EagleHead.load(EAGLE_DIR, target)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        f = target(input_ids=x, output_hidden_states=True).hidden_states[-1]
        assert m(f).shape[:2] == (m.cfg.num_heads, 1)
        assert e(f, x).shape == f.shape


def test_tokenizer_round_trip_and_chat_template(tok):
    from zoo.corpus_base import render_chat

    for s in [
        "def f(x):\n    return x ** 2  # square\n",
        "Question: Ava has 3 apples.\nAnswer:",
        "naïve café — ünïcödé ✓ 日本",
        "  leading and trailing spaces  ",
        "\t\ttabs\n\n",
    ]:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    assert len(tok) <= 8192
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == render_chat([(m["role"], m["content"]) for m in msgs], add_generation_prompt=True)
    assert tok.eos_token == "<|endoftext|>"
    assert "<|end|>" in tok.all_special_tokens


def test_target_beats_unigram_on_heldout_sample(tok, target):
    """Per workload, on ~1k held-out tokens: the target's loss is below the entropy of a
    unigram model fitted to that very sample (an optimistic unigram baseline)."""
    import collections
    import torch.nn.functional as F

    for w in WORKLOADS:
        ids = []
        for line in (ZOO_DIR / "workloads" / f"{w}.jsonl").read_text().splitlines()[:40]:
            r = json.loads(line)
            text = r.get("prompt") or tok.apply_chat_template(r["messages"], tokenize=False)
            ids += tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            if len(ids) > 1024:
                break
        ids = ids[:1024]
        cnt = collections.Counter(ids[1:])
        n = sum(cnt.values())
        uni = -sum(c / n * math.log(c / n) for c in cnt.values())
        with torch.no_grad():
            x = torch.tensor([ids])
            loss = F.cross_entropy(target(input_ids=x[:, :-1]).logits[0].float(), x[0, 1:]).item()
        assert loss < uni - 0.5, (w, loss, uni)


def test_cards_acceptance_tables_are_generated_from_the_named_run():
    """Each card's acceptance table and quality gates equal what `zoo.cards.acceptance`
    computes now from the committed run the card names (no number typed by hand)."""
    import re

    from zoo.cards import acceptance, render_gates

    text = (TARGET_DIR / "README.md").read_text()
    m = re.search(r"`runs/(zoo-[^/`]+)/`", text)
    assert m, "target card names no runs/zoo-* run"
    run = ZOO_DIR.parent / "runs" / m.group(1)
    md, gates = acceptance(run)
    for d in (TARGET_DIR, DRAFT_DIR, MEDUSA_DIR, EAGLE_DIR):
        card = (d / "README.md").read_text()
        assert md in card, f"{d}/README.md: acceptance table is stale; run `python -m zoo.cards runs/{run.name}`"
        assert render_gates(gates) in card


def test_copy_probe_separates_a_copier_from_a_uniform_model():
    """Planted truth: a model that predicts the token `length` positions back scores ~0 on the
    repeat; a uniform model scores log(V) on both occurrences."""
    from types import SimpleNamespace

    from zoo.check import copy_probe

    V, L = 50, 12

    class Fake:
        config = SimpleNamespace(vocab_size=V)

        def __init__(self, copier):
            self.copier = copier

        def __call__(self, input_ids):
            T = input_ids.shape[1]
            logits = torch.zeros(1, T, V)
            if self.copier:
                for t in range(L - 1, T - 1):  # predicts x[t+1] = x[t+1-L]
                    logits[0, t, input_ids[0, t + 1 - L]] = 50.0
            return SimpleNamespace(logits=logits)

    u = copy_probe(Fake(False), n=4, length=L)
    c = copy_probe(Fake(True), n=4, length=L)
    assert abs(u["first"] - math.log(V)) < 1e-3 and abs(u["second"] - math.log(V)) < 1e-3
    assert c["second"] < 1e-3 and c["first"] > 1.0


def test_copy_probe_draws_spans_from_a_pool():
    """With `pool`, the probe's strings are contiguous spans of it: a model that scores 0 on
    exactly the pool's bigrams and log(V) elsewhere gets a low first-occurrence loss."""
    from types import SimpleNamespace

    import numpy as np

    from zoo.check import copy_probe

    V, L = 40, 10
    pool = np.arange(5, 35)  # next token = this token + 1

    class Bigram:
        config = SimpleNamespace(vocab_size=V)

        def __call__(self, input_ids):
            T = input_ids.shape[1]
            logits = torch.zeros(1, T, V)
            for t in range(T):
                logits[0, t, (int(input_ids[0, t]) + 1) % V] = 50.0
            return SimpleNamespace(logits=logits)

    r = copy_probe(Bigram(), n=3, length=L, pool=pool)
    assert r["first"] < 1e-3 and r["source"] == "held-out corpus spans"
    assert copy_probe(Bigram(), n=3, length=L)["first"] > 1.0  # uniform strings break the bigrams


def test_copy_drills_repeat_a_corpus_span_to_the_end():
    """Every drill row is a corpus prefix followed by one corpus span tiled: from the second
    copy on, token t equals token t - n, the span length; rows are deterministic per step."""
    import numpy as np

    from zoo.data import DRILL_SPAN, copy_drills

    corpus = np.random.default_rng(0).integers(5, 4000, size=50_000).astype(np.uint16)
    a = copy_drills(corpus, 16, 128, seed=3, step=7)
    assert a.shape == (16, 129) and a.dtype == np.int64
    assert np.array_equal(a, copy_drills(corpus, 16, 128, seed=3, step=7))
    assert not np.array_equal(a, copy_drills(corpus, 16, 128, seed=3, step=8))
    text = corpus.astype(np.int64).tobytes()
    for row in a:
        periods = [
            n
            for n in range(DRILL_SPAN[0], DRILL_SPAN[1])
            if np.array_equal(row[-(128 - 24 - n) :], row[-(128 - 24 - n) - n : -n])
        ]
        assert periods, "the tail of a drill row repeats with the span length"
        n = periods[0]
        # the span itself is a contiguous corpus window (some rotation of the row's period)
        period = row[-n:]
        assert any(np.roll(period, k).tobytes() in text for k in range(n))


def test_best_of_n_live_on_the_zoo_equals_greedy_through_eos_with_its_cache_and_features():
    """Best-of-N on real zoo prompts that end at EOS, the advancing draft often not the first: the output, the
    cache and the features it leaves equal plain greedy generation's."""
    import torch

    from harness.models import lm
    from harness.drafters import DrafterEnv, build_drafters, parse_spec
    from harness.decode.engine import Engine, RunConfig
    from harness.models.target import Target
    from workloads import load

    torch.set_num_threads(1)
    model, tok = lm.load_lm(TARGET_DIR), lm.load_tokenizer(TARGET_DIR)
    env = DrafterEnv(model, tok, TARGET_DIR)
    specs = ["ngram=ngram", f"draft=draft:path={DRAFT_DIR}", "suffix=suffix"]
    drafters = build_drafters([parse_spec(s) for s in specs], env)
    tgt = Target(model, tok)
    eng = Engine(
        tgt,
        {n: drafters[n] for n in ("suffix", "ngram", "draft")},
        RunConfig("live", 8, 96),
        best_of_n=True,
        states=True,
    )
    ended, not_first = 0, 0
    for p in load(["math"], limit=4):
        ids = p.token_ids(tok)
        res = eng.run_prompt(p.workload, p.prompt_id, ids)
        y, feats, cache = tgt.generate(ids, 96, 0)
        assert res.output == y
        ended += y[-1] in tgt.eos
        f, c = res.state
        assert lm.cache_len(c) == lm.cache_len(cache) == len(ids) + len(y) - 1
        assert torch.allclose(f, feats, atol=1e-4)
        k_live, k_ref = c.layers[0].keys, cache.layers[0].keys
        assert torch.allclose(k_live, k_ref, atol=1e-4)
        for r in res.records:
            acc = [d["accepted"] for d in r["drafts"].values()]
            not_first += acc.index(max(acc)) != 0
    assert ended >= 2 and not_first >= 3  # EOS reached, and the winner's keys were moved into place
