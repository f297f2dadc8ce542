"""Head formats: save/load round trip, feature convention, training loss, clear load errors."""

import json

import pytest
import torch

from harness.models.heads import EagleHead, MedusaHeads
from harness.models.tiny import make_model, make_tokenizer


@pytest.fixture(scope="module")
def target():
    return make_model("llama", len(make_tokenizer()))


def _feats(target, ids):
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_feature_is_lm_head_input(arch):
    m = make_model(arch, 100)
    f, logits = _feats(m, torch.arange(4, 20)[None])
    assert torch.allclose(m.get_output_embeddings()(f), logits, atol=1e-5)


@pytest.mark.parametrize("cls,kw", [(MedusaHeads, {}), (MedusaHeads, {"share_lm_head": True}), (EagleHead, {})])
def test_round_trip_and_training(tmp_path, target, cls, kw):
    ids = torch.arange(4, 30)[None]
    f, _ = _feats(target, ids)
    head = cls.from_target(target, **kw)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = head.training_loss(f, ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]  # the documented loss is trainable
    head.save(tmp_path / "h")
    assert not any("embed" in k or "lm_head" in k for k in head.state_dict())  # target weights never saved
    again = cls.load(tmp_path / "h", target)
    run = (lambda h: h(f)) if cls is MedusaHeads else (lambda h: h(f, ids))
    assert torch.equal(run(head), run(again))


def test_medusa_head_one_starts_as_lm_head(target):
    f, logits = _feats(target, torch.arange(4, 12)[None])
    assert torch.allclose(MedusaHeads.from_target(target)(f)[0], logits, atol=1e-5)


def test_load_errors_name_the_file(tmp_path, target):
    with pytest.raises(FileNotFoundError, match="config.json"):
        MedusaHeads.load(tmp_path, target)
    EagleHead.from_target(target).save(tmp_path / "e")
    with pytest.raises(ValueError, match="format"):
        MedusaHeads.load(tmp_path / "e", target)
    cfg = json.loads((tmp_path / "e/config.json").read_text())
    (tmp_path / "e/config.json").write_text(json.dumps({**cfg, "vocab_size": 7}))
    with pytest.raises(ValueError, match="vocab_size=7"):
        EagleHead.load(tmp_path / "e", target)
