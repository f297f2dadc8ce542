"""Public head layouts (Medusa-1, EAGLE-1/2) and convert-checkpoint, without the upstream packages.

Each layout is written here by a helper from one of our heads, with the key names and config fields of the
upstream package (tests/reference/test_hf446.py checks the same against the packages' own classes); loading
it back must give the same maths and the same drafts. Pickle-only directories and key mismatches are refused
with one line naming the file and the key.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.models import convert
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.models.heads import EagleHead, MedusaHeads
from harness.models.lm import HarnessError
from harness.models.tiny import make_model, make_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return make_model("llama", len(make_tokenizer()))


def _feats(target, ids):
    with torch.no_grad():
        return target(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


# ------------------------------------------------------------------------ layout writers


def medusa1_state(heads: MedusaHeads) -> dict:
    """Our MedusaHeads under medusa-llm's keys: `{i}.{j}.linear.*` and `{i}.{L}.weight`."""
    L = heads.cfg.num_layers
    out = {}
    for k, v in heads.state_dict().items():
        part = k.split(".")
        if part[0] == "blocks":  # blocks.i.j.linear.p
            out[f"{part[1]}.{part[2]}.linear.{part[4]}"] = v.clone()
        else:  # proj.i.weight
            out[f"{part[1]}.{L}.weight"] = v.clone()
    return out


def write_medusa1(d, heads: MedusaHeads, pickled: bool = False):
    """A Medusa-1 directory: the config medusa-llm's MedusaConfig writes, and the heads' weights."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "medusa_num_heads": heads.cfg.num_heads,
        "medusa_num_layers": heads.cfg.num_layers,
        "base_model_name_or_path": "tiny-target",
        "transformers_version": "4.46.3",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    state = medusa1_state(heads)
    if pickled:
        torch.save(state, d / "medusa_lm_head.pt")
    else:
        save_file(state, str(d / "medusa_lm_head.safetensors"))
    return d


def eagle1_state(head: EagleHead, embed: torch.Tensor) -> dict:
    """Our EagleHead (input_norm=False) under eagle-llm's `cnets.Model` keys."""
    out = {"embed_tokens.weight": embed.detach().clone()}
    for k, v in head.state_dict().items():
        if k.startswith("layer."):
            name = k[len("layer.") :]
            sub = "mlp" if name.split("_")[0] in ("gate", "up", "down") else "self_attn"
            out[f"layers.0.{name}" if "layernorm" in name else f"layers.0.{sub}.{name}"] = v.clone()
        elif k.startswith("fc."):
            out[k] = v.clone()
    return out


def write_eagle1(d, head: EagleHead, embed: torch.Tensor, extra: dict | None = None):
    """An EAGLE-1/2 directory as eagle-llm ships one: a Llama config.json and pytorch_model.bin."""
    d.mkdir(parents=True, exist_ok=True)
    c = head.cfg
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "intermediate_size": c.intermediate_size or 4 * c.hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_scaling": None,
        "max_position_embeddings": 2048,
        "pretraining_tp": 1,
        "bias": c.fc_bias,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    torch.save({**eagle1_state(head, embed), **(extra or {})}, d / "pytorch_model.bin")
    return d


def eagle_like(target, **kw) -> EagleHead:
    torch.manual_seed(5)
    head = EagleHead.from_target(target, input_norm=False, embed_first=True, intermediate_size=64, **kw)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)  # far from init, so that a wrong convention shows
    return head


# ---------------------------------------------------------------------------- Medusa-1


def _drafts(name, kind, path, target, ids, k=4):
    env = DrafterEnv(target, make_tokenizer())
    d = build_drafters([parse_spec(f"{name}={kind}:path={path}")], env)[name]
    return d.draft(Prefix(list(ids), 3, _feats(target, ids), 0, 0.0), k)


def test_medusa1_layout_loads_and_drafts_like_our_format(tmp_path, target):
    torch.manual_seed(1)
    heads = MedusaHeads.from_target(target, num_heads=3, num_layers=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    heads.save(tmp_path / "ours")
    write_medusa1(tmp_path / "m1", heads)
    again = MedusaHeads.load(tmp_path / "m1", target)
    assert (again.cfg.num_heads, again.cfg.num_layers, again.cfg.share_lm_head) == (3, 2, False)
    f = _feats(target, list(range(5, 20)))
    assert torch.equal(again(f), heads(f))
    ids = list(range(5, 20))
    a, b = _drafts("m", "medusa", tmp_path / "ours", target, ids), _drafts("m", "medusa", tmp_path / "m1", target, ids)
    assert a.tokens == b.tokens and len(a.tokens) == 3 and a.conf == b.conf


def test_medusa1_pickle_is_refused_then_converted(tmp_path, target, capsys):
    heads = MedusaHeads.from_target(target, num_heads=2)
    d = write_medusa1(tmp_path / "m1", heads, pickled=True)
    with pytest.raises(HarnessError, match=r"only pickled weights \(medusa_lm_head.pt\).*convert-checkpoint"):
        MedusaHeads.load(d, target)
    convert.cli(d, d)  # in place: the safetensors go next to the pickle
    assert "medusa_lm_head.safetensors" in capsys.readouterr().out
    f = _feats(target, list(range(5, 12)))
    assert torch.equal(MedusaHeads.load(d, target)(f), heads(f))


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda st: st.pop("1.0.linear.bias"), r"missing key\(s\) 1\.0\.linear\.bias"),
        (
            lambda st: st.update({"2.0.linear.weight": st["0.0.linear.weight"].clone()}),
            r"unexpected key\(s\) 2\.0\.linear\.weight",
        ),
    ],
)
def test_medusa1_key_mismatch_names_the_key(tmp_path, target, change, match):
    d = write_medusa1(tmp_path / "m1", MedusaHeads.from_target(target, num_heads=2))
    st = load_file(str(d / "medusa_lm_head.safetensors"))
    change(st)
    save_file(st, str(d / "medusa_lm_head.safetensors"))
    with pytest.raises(HarnessError, match="medusa_lm_head.safetensors.*" + match):
        MedusaHeads.load(d, target)


# ---------------------------------------------------------------------------- EAGLE-1/2


def test_eagle1_layout_after_conversion_loads_with_its_conventions(tmp_path, target):
    head = eagle_like(target)
    src = write_eagle1(tmp_path / "e1", head, target.get_input_embeddings().weight)
    with pytest.raises(HarnessError, match=r"pytorch_model\.bin.*specbandit convert-checkpoint"):
        EagleHead.load(src, target)
    written = convert.convert_checkpoint(src, tmp_path / "e1st")
    assert sorted(p.name for p in written) == ["config.json", "model.safetensors"]
    again = EagleHead.load(tmp_path / "e1st", target)
    c = again.cfg
    assert (c.input_norm, c.embed_first, c.fc_bias, c.own_embedding) == (False, True, True, False)
    ids = list(range(5, 25))
    f, nxt = _feats(target, ids)[None, :-1], torch.tensor([ids[1:]])
    assert torch.equal(again(f, nxt), head(f, nxt))
    head.save(tmp_path / "ours")  # the same head in our format, its conventions in its config
    a, b = _drafts("e", "eagle", tmp_path / "ours", target, ids), _drafts("e", "eagle", tmp_path / "e1st", target, ids)
    assert a.tokens == b.tokens and len(a.tokens) == 4
    assert a.conf == pytest.approx(b.conf, abs=1e-6)


def test_eagle1_conventions_change_the_maths(target):
    head = eagle_like(target)
    ids = list(range(5, 25))
    f, nxt = _feats(target, ids)[None, :-1], torch.tensor([ids[1:]])
    swapped = EagleHead.from_target(target, input_norm=False, embed_first=False, intermediate_size=64)
    swapped.load_state_dict(head.state_dict())
    assert not torch.allclose(swapped(f, nxt), head(f, nxt))  # the fc input order is a real convention


def test_eagle1_own_embedding_is_kept_when_it_differs_from_the_target(tmp_path, target):
    head = eagle_like(target, own_embedding=True)  # its embedding is random, not the target's
    src = write_eagle1(tmp_path / "e1", head, head.embed.weight)
    convert.convert_checkpoint(src, src)
    again = EagleHead.load(src, target)
    assert again.cfg.own_embedding and torch.equal(again.embed.weight, head.embed.weight)
    ids = list(range(5, 25))
    f, nxt = _feats(target, ids)[None, :-1], torch.tensor([ids[1:]])
    assert torch.equal(again(f, nxt), head(f, nxt))


def test_eagle1_unexpected_key_and_unsupported_config_are_named(tmp_path, target):
    head = eagle_like(target)
    src = write_eagle1(
        tmp_path / "e1",
        head,
        target.get_input_embeddings().weight,
        extra={"layers.0.input_layernorm.weight": torch.ones(32)},
    )
    convert.convert_checkpoint(src, src)
    with pytest.raises(HarnessError, match=r"model\.safetensors: unexpected key\(s\) layers\.0\.input_layernorm"):
        EagleHead.load(src, target)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    with pytest.raises(HarnessError, match="'num_hidden_layers' is 2"):
        EagleHead.load(src, target)


def test_our_format_key_mismatch_is_named(tmp_path, target):
    EagleHead.from_target(target).save(tmp_path / "e")
    st = load_file(str(tmp_path / "e/model.safetensors"))
    st["layer.extra"] = torch.zeros(1)
    del st["fc.bias"]
    save_file(st, str(tmp_path / "e/model.safetensors"))
    with pytest.raises(HarnessError, match=r"missing key\(s\) fc\.bias; unexpected key\(s\) layer\.extra"):
        EagleHead.load(tmp_path / "e", target)


# ------------------------------------------------------------------------ convert-checkpoint


def test_convert_round_trips_and_refuses_to_overwrite(tmp_path):
    w = torch.randn(4, 6)
    state = {"a.weight": w, "tied.weight": w, "view.weight": w.t(), "b.bias": torch.arange(3, dtype=torch.int64)}
    src = tmp_path / "src"
    src.mkdir()
    torch.save(state, src / "pytorch_model.bin")
    (src / "config.json").write_text('{"hidden_size": 6}')
    out = convert.convert_checkpoint(src / "pytorch_model.bin", tmp_path / "dst")
    assert [p.name for p in out] == ["model.safetensors", "config.json"]
    back = load_file(str(tmp_path / "dst/model.safetensors"))
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert (tmp_path / "dst/config.json").read_text() == '{"hidden_size": 6}'
    with pytest.raises(HarnessError, match="already exists; convert-checkpoint never overwrites"):
        convert.convert_checkpoint(src, tmp_path / "dst")


def test_convert_refuses_what_is_not_a_plain_state_dict(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # a pickled module: code, not only tensors
    with pytest.raises(HarnessError, match=r"module\.pt: cannot be read with torch\.load\(weights_only=True\)"):
        convert.convert_checkpoint(tmp_path / "module.pt", tmp_path / "out")
    torch.save({"state_dict": {"w": torch.ones(1)}}, tmp_path / "nested.pt")
    with pytest.raises(HarnessError, match="nested.pt: entries that are not name -> tensor: state_dict"):
        convert.convert_checkpoint(tmp_path / "nested.pt", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written on refusal
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="empty: no .bin, .pt, .pth weight files"):
        convert.convert_checkpoint(tmp_path / "empty", tmp_path / "x")
