"""A model's identity comes from its tensors and architecture, not from the tool that wrote its files (issue 35)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from harness.models.identity import arch_fields, model_sha256

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "vocab_size": 16,
}


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(12, 8, generator=g),
    }


def write(d, ts, config, split: bool = False, meta=None):
    d.mkdir()
    names = sorted(ts)
    if split:  # another file layout: two shards, another order, metadata
        save_file({n: ts[n] for n in names[:1]}, str(d / "model-00002.safetensors"), metadata=meta)
        save_file({n: ts[n] for n in names[1:]}, str(d / "model-00001.safetensors"), metadata=meta)
    else:
        save_file(ts, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


def test_the_same_model_written_by_another_tool_has_the_same_identity(tmp_path):
    a = write(tmp_path / "a", tensors(), CONFIG | {"transformers_version": "4.57.0", "rope_theta": 1e5})
    other = {k: v for k, v in CONFIG.items()} | {
        "transformers_version": "5.25.0",
        "dtype": "float32",
        "rope_parameters": {"rope_theta": 1e5, "rope_type": "default"},
        "head_dim": 4,  # written by this version, derived (8 / 2) by the other
        "_model_name_or_path": "a name from the GGUF",
        "pad_token_id": 2,
    }
    b = write(tmp_path / "b", tensors(), dict(reversed(list(other.items()))), split=True, meta={"format": "pt"})
    assert model_sha256(a) == model_sha256(b)


@pytest.mark.parametrize(
    "change",
    [
        lambda ts, c: ts["model.norm.weight"].view(torch.int16).__setitem__(0, 1),  # one weight's bits
        lambda ts, c: ts.__setitem__("model.norm.weight", ts["model.norm.weight"].float()),  # its dtype
        lambda ts, c: ts.__setitem__("model.extra.weight", torch.zeros(1)),  # one more tensor
        lambda ts, c: ts.__setitem__("model.up.weight", ts.pop("model.layers.0.mlp.up_proj.weight")),  # a name
        lambda ts, c: ts.__setitem__("model.embed_tokens.weight", ts["model.embed_tokens.weight"].reshape(8, 16)),
        lambda ts, c: c.__setitem__("rms_norm_eps", 1e-6),  # an architecture field
        lambda ts, c: c.__setitem__("rope_theta", 1e4),
        lambda ts, c: c.__setitem__("tie_word_embeddings", False),
    ],
)
def test_a_change_in_what_the_model_computes_changes_its_identity(tmp_path, change):
    base = write(tmp_path / "a", tensors(), CONFIG | {"rope_theta": 1e5})
    ts, c = tensors(), CONFIG | {"rope_theta": 1e5}
    change(ts, c)
    assert model_sha256(write(tmp_path / "b", ts, c)) != model_sha256(base)


def test_arch_fields_keep_a_real_scaling_and_drop_tool_fields():
    got = arch_fields(CONFIG | {"rope_parameters": {"rope_theta": 5.0, "rope_type": "linear", "factor": 2.0}})
    assert got["rope_theta"] == 5.0 and got["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert "transformers_version" not in arch_fields(CONFIG | {"transformers_version": "x"})
