"""python -m harness.campaign.rehash: a manifest re-stamped with its models' identities, and only its own models'."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from harness.campaign.rehash import LEGACY, main, rehash
from harness.models.identity import legacy_sha256, model_sha256
from harness.models.lm import HarnessError


def model(d, seed):
    d.mkdir(parents=True)
    save_file({"w": torch.randn(3, generator=torch.Generator().manual_seed(seed))}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"hidden_size": 3, "transformers_version": "x"}))
    return d


def manifest(root):
    t, h = model(root / "models" / "t", 0), model(root / "models" / "heads" / "eagle", 1)
    return {
        "target": {"path": "models/t", "sha256": legacy_sha256(t)},
        "drafters": {
            "eagle": {"kind": "eagle", "settings": {"path": "models/heads/eagle"}, "sha256": legacy_sha256(h)},
            "gone": {"kind": "medusa", "settings": {"path": "models/heads/medusa"}, "sha256": "a" * 64},
            "ls": {"kind": "layerskip", "settings": {"layers": 1}, "sha256": "b" * 64},
            "ngram": {"kind": "ngram", "settings": {}, "sha256": None},
        },
    }


def test_every_model_at_hand_gets_its_identity_and_a_missing_one_keeps_its_hash_marked(tmp_path):
    m = manifest(tmp_path)
    new, kept = rehash(m, tmp_path / "models")
    assert new["target"]["sha256"] == model_sha256(tmp_path / "models" / "t")
    assert new["drafters"]["eagle"]["sha256"] == model_sha256(tmp_path / "models" / "heads" / "eagle")
    assert new["drafters"]["gone"] == {**m["drafters"]["gone"], "identity": LEGACY} and len(kept) == 1
    assert new["drafters"]["ls"]["sha256"] not in ("b" * 64, None) and new["drafters"]["ngram"]["sha256"] is None
    assert rehash(new, tmp_path / "models")[0] == new  # a second stamp changes nothing


def test_other_weights_at_the_recorded_path_are_not_taken_for_the_runs(tmp_path):
    m = manifest(tmp_path)
    m["drafters"]["eagle"]["sha256"] = "c" * 64  # the run's eagle was another
    new, kept = rehash(m, tmp_path / "models")
    assert new["drafters"]["eagle"]["sha256"] == "c" * 64 and new["drafters"]["eagle"]["identity"] == LEGACY
    m["target"]["sha256"] = "d" * 64  # another target: nothing is written
    with pytest.raises(HarnessError, match="holds another model"):
        rehash(m, tmp_path / "models")


def test_the_command_rewrites_the_manifest_once(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(manifest(tmp_path)))
    main([str(run), "--models", str(tmp_path / "models")])
    first = (run / "manifest.json").read_bytes()
    main([str(run), "--models", str(tmp_path / "models")])
    assert (run / "manifest.json").read_bytes() == first and "nothing done" in capsys.readouterr().out
