"""lm.forward(last_logits=True): a prefill that computes only its last logits leaves the cache and every other tap
as a full forward does, and Target.generate(feats=False) decodes the same tokens (plain decoding's fast path)."""

from pathlib import Path

import torch

from harness.models import lm
from harness.models.target import Target

ROOT = Path(__file__).resolve().parents[1]


def test_last_logits_keep_the_cache_and_the_layer_taps():
    m, tok = lm.load_lm(ROOT / "zoo" / "target"), lm.load_tokenizer(ROOT / "zoo" / "target")
    ids = torch.tensor(tok("def f(x):\n    return x + 1\n" * 4)["input_ids"])
    taps = [lm.layer_out(1)]
    c_full, c_last = lm.new_cache(), lm.new_cache()
    full, f_full = lm.forward(m, ids, c_full, taps=taps)
    last, f_last = lm.forward(m, ids, c_last, taps=taps, last_logits=True)
    assert full.shape[0] == len(ids) and last.shape[0] == 1  # the model skipped the other positions' logits
    assert torch.allclose(full[-1:], last, atol=1e-4)
    assert torch.equal(f_full[taps[0]], f_last[taps[0]])
    for a, b in zip(c_full.layers, c_last.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    _, h = lm.forward(m, ids, lm.new_cache(), hidden=True, last_logits=True)  # the "last" tap needs every position
    assert h.shape[0] == len(ids)


def test_plain_decoding_without_features_decodes_the_same_tokens():
    m, tok = lm.load_lm(ROOT / "zoo" / "target"), lm.load_tokenizer(ROOT / "zoo" / "target")
    t = Target(m, tok)
    for text in ("def add(a, b):", "Question: what is 7 times 6?\nAnswer:", "The cat sat on"):
        p = tok(text)["input_ids"]
        y, feats, _ = t.generate(p, 40, 0)
        y2, none, _ = t.generate(p, 40, 0, feats=False)
        assert y2 == y and none is None and feats.shape[0] == len(p) + len(y) - 1


def test_a_lean_model_seen_first_does_not_decide_for_its_class(monkeypatch):
    from harness.models import fastpath

    monkeypatch.setattr(lm, "_KEEP", {})  # as in a fresh process whose first model of the class runs the lean forward
    lean, tok = lm.load_lm(ROOT / "zoo" / "target"), lm.load_tokenizer(ROOT / "zoo" / "target")
    ids = torch.tensor(tok("def f(x):\n    return x + 1\n")["input_ids"])
    if not fastpath.install(lean):
        return  # a transformers the lean forward does not follow: nothing to order
    assert lm.forward(lean, ids, lm.new_cache(), last_logits=True)[0].shape[0] == 1
    plain = lm.load_lm(ROOT / "zoo" / "target")
    assert lm.forward(plain, ids, lm.new_cache(), last_logits=True)[0].shape[0] == 1
