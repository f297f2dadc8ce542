"""The hf446 tier: our Medusa-1 and EAGLE-1/2 loaders against medusa-llm 0.1 and eagle-llm 1.2.1 themselves.

Every checkpoint here is built with the package's own classes (its KV Llama as the tiny target, its
`MedusaModel` heads, its EAGLE `cnets.Model`) and saved the way the package saves it (medusa-llm's train.py:
`torch.save(medusa_head.state_dict(), "medusa_lm_head.pt")` and `MedusaConfig.save_pretrained`; eagle-llm:
`pytorch_model.bin` of the `Model` state dict and `EConfig.save_pretrained`). The package then loads it back with
its own `from_pretrained` (so the directory really is its format); we convert it with convert-checkpoint and load
it with our loaders. Our k draft tokens and confidences must equal the reference's own forward on the same
prefix and the same target features, and greedy speculative decoding through our engine must reproduce the
target's own greedy output. Run with `bash .ci/tiers.sh hf446`.
"""

import json

import pytest
import torch
from conftest import upstream

from harness.models import lm
from harness.models.convert import convert_checkpoint
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.heads import EagleHead, MedusaHeads
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_tokenizer

pytestmark = pytest.mark.tier_hf446
torch.set_num_threads(1)

medusa_model = upstream("medusa.model.medusa_model", "hf446")
medusa_kv = upstream("medusa.model.modeling_llama_kv", "hf446")
eagle_model = upstream("eagle.model.ea_model", "hf446")
eagle_cnets = upstream("eagle.model.cnets", "hf446")
eagle_configs = upstream("eagle.model.configs", "hf446")
eagle_kv = upstream("eagle.model.modeling_llama_kv", "hf446")
transformers = upstream("transformers", "hf446")

K = 4
MAX_NEW = 24
HIDDEN, INTER = 32, 64


def test_the_tier_runs_transformers_4_46():
    assert transformers.__version__.startswith("4.46.")


def _target(kv_module, root, seed=0):
    """A tiny Llama built with the package's own KV Llama class, saved as a local checkpoint."""
    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = kv_module.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # decisive, repetitive greedy outputs (as harness.models.tiny does)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    path = root / "target"
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return model, path, tok


def _ids(tok, text=PROMPTS[0][2]):
    return tok(text).input_ids


def _drafter(spec, ours, tok):
    name = spec.split("=")[0]
    return build_drafters([parse_spec(spec)], DrafterEnv(ours, tok))[name]


def _features_match(ref_feats, ours, ids):
    with torch.no_grad():
        mine = ours(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(mine, ref_feats, atol=1e-5)  # the package's Llama and transformers' agree


def _live_equals_greedy(ours, tok, drafter):
    """Live greedy speculative decoding with `drafter` reproduces the target's generate() on three prompts
    (one with periodic output, two with runs of one token); returns the draft tokens accepted in all."""
    accepted = 0
    for _, _, text in (PROMPTS[0], PROMPTS[1], PROMPTS[3]):
        prompt = _ids(tok, text)
        ref = ours.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False)[
            0, len(prompt) :
        ].tolist()
        eng = Engine(Target(ours, tok), {drafter.name: drafter}, RunConfig("live", K, MAX_NEW, 0.0))
        res = eng.run_prompt("w", text, prompt)
        assert res.output == ref
        accepted += sum(r["drafts"][drafter.name]["accepted"] for r in res.records)
    return accepted


# ----------------------------------------------------------------------------------- Medusa


@pytest.fixture(scope="module", params=[1, 2], ids=["layers1", "layers2"])
def medusa(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"medusa{request.param}")
    base, tpath, tok = _target(medusa_kv, root)
    torch.manual_seed(1)
    mm = medusa_model.MedusaModel(
        base, medusa_num_heads=3, medusa_num_layers=request.param, base_model_name_or_path=str(tpath)
    )
    with torch.no_grad():  # away from the init (zero ResBlocks, heads = lm_head), so that every head differs
        for p in mm.medusa_head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    d = root / "medusa"
    # medusa-llm's train.py: the config through MedusaConfig, the heads as a pickled state dict
    medusa_model.MedusaConfig(
        medusa_num_heads=3, medusa_num_layers=request.param, base_model_name_or_path=str(tpath)
    ).save_pretrained(d)
    torch.save(mm.medusa_head.state_dict(), d / "medusa_lm_head.pt")
    ref = medusa_model.MedusaModel.from_pretrained(str(d)).eval()  # the package reads its own directory back
    assert all(
        torch.equal(a, b) for a, b in zip(ref.medusa_head.state_dict().values(), mm.medusa_head.state_dict().values())
    )
    return {"ref": ref, "dir": d, "tpath": tpath, "tok": tok, "layers": request.param}


def test_medusa_pickle_refused_then_converted_loads(medusa, tmp_path):
    ours = lm.load_lm(medusa["tpath"])
    with pytest.raises(lm.HarnessError, match="convert-checkpoint"):
        MedusaHeads.load(medusa["dir"], ours)
    written = convert_checkpoint(medusa["dir"], tmp_path / "st")
    assert sorted(p.name for p in written) == ["config.json", "medusa_lm_head.safetensors"]
    heads = MedusaHeads.load(tmp_path / "st", ours)
    assert (heads.cfg.num_heads, heads.cfg.num_layers) == (3, medusa["layers"])


def test_medusa_drafts_equal_the_reference_forward(medusa, tmp_path):
    st = tmp_path / "st"
    convert_checkpoint(medusa["dir"], st)
    tok, ref = medusa["tok"], medusa["ref"]
    ours = lm.load_lm(medusa["tpath"])
    d = _drafter(f"m=medusa:path={st}", ours, tok)
    for text in (PROMPTS[0][2], PROMPTS[2][2]):
        ids = _ids(tok, text)
        with torch.no_grad():
            mlogits, outputs, _ = ref(input_ids=torch.tensor([ids]), output_orig=True)  # (heads, 1, T, V)
        feats = outputs[0]  # (1, T, H): the base model's last hidden state, after its final norm
        _features_match(feats, ours, ids)
        for P in range(3, len(ids) + 1, 5):
            got = d.draft(Prefix(ids[:P], 2, feats[0], 0, 0.0), K)
            want = mlogits[:, 0, P - 2].float()  # head i at the feature of position P-2 drafts token P-1+i
            assert got.tokens == want.argmax(-1).tolist()[: len(got.tokens)] and len(got.tokens) == 3
            conf = torch.softmax(want, -1).gather(1, want.argmax(-1, keepdim=True))[:, 0]
            assert got.conf == pytest.approx(conf.tolist(), abs=1e-5)


def test_medusa_greedy_speculative_decoding_equals_the_target(medusa, tmp_path):
    st = tmp_path / "st"
    convert_checkpoint(medusa["dir"], st)
    ours, tok = lm.load_lm(medusa["tpath"]), medusa["tok"]
    accepted = _live_equals_greedy(ours, tok, _drafter(f"m=medusa:path={st}", ours, tok))
    assert accepted > 0  # the perturbed heads guess some tokens right: acceptance is exercised


# ------------------------------------------------------------------------------------ EAGLE


@pytest.fixture(
    scope="module",
    params=[(True, True, False), (False, True, False), (True, False, False), (True, True, True)],
    ids=["target-embedding", "own-embedding", "no-fc-bias", "repeat-last"],
)
def eagle(request, tmp_path_factory):
    shared_emb, bias, repeat = request.param
    root = tmp_path_factory.mktemp("eagle")
    base, tpath, tok = _target(eagle_kv, root)
    cfg = eagle_configs.EConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bias=bias,
    )
    torch.manual_seed(2)
    layer = eagle_cnets.Model(cfg, bias=bias).eval()
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 2:
                p.mul_(2.0)  # decisive drafts
        if shared_emb:  # what EAGLE training does (load_emb=True): the base model's embedding, frozen
            layer.embed_tokens.weight.copy_(base.get_input_embeddings().weight)
        if repeat:  # predicted feature = input feature, so each draft token repeats the last one: the
            # target's repetitive greedy output then accepts some, which exercises the acceptance path
            layer.fc.weight.zero_()
            layer.fc.weight[:, HIDDEN:] = torch.eye(HIDDEN)  # fc reads cat([embedding, feature])
            layer.fc.bias.zero_()
            layer.layers[0].self_attn.o_proj.weight.zero_()
            layer.layers[0].mlp.down_proj.weight.zero_()
    d = root / "eagle"
    cfg.save_pretrained(d)  # eagle-llm reads config.json (and its "bias") from here
    torch.save(layer.state_dict(), d / "pytorch_model.bin")
    ref = eagle_model.EaModel.from_pretrained(base_model_path=str(tpath), ea_model_path=str(d))
    ref.eval()
    assert json.loads((d / "config.json").read_text())["bias"] is bias
    return {"ref": ref, "dir": d, "tpath": tpath, "tok": tok, "shared": shared_emb, "bias": bias, "repeat": repeat}


def _reference_chain(ref, feats, ids, k):
    """eagle-llm's own drafting (`Model.generate` with use_cache, without its stop at token 2), with the
    logits of each step: pairs (feature j, token j+1) for j = 0..P-2, then its own features and tokens."""
    layer, head = ref.ea_layer, ref.base_model.lm_head
    with torch.no_grad():
        out, past = layer(feats[:, : len(ids) - 1], input_ids=torch.tensor([ids[1:]]), use_cache=True)
        toks, logits = [], []
        for _ in range(k):
            lg = head(out[:, -1])[0].float()
            t = int(lg.argmax())
            toks.append(t)
            logits.append(lg)
            out, past = layer(out[:, -1:], input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
    return toks, torch.stack(logits)


def test_eagle_layout_converted_loads_with_the_reference_conventions(eagle, tmp_path):
    ours = lm.load_lm(eagle["tpath"])
    with pytest.raises(lm.HarnessError, match=r"pytorch_model\.bin.*convert-checkpoint"):
        EagleHead.load(eagle["dir"], ours)
    convert_checkpoint(eagle["dir"], tmp_path / "st")
    c = EagleHead.load(tmp_path / "st", ours).cfg
    assert (c.input_norm, c.embed_first, c.fc_bias, c.own_embedding) == (
        False,
        True,
        eagle["bias"],
        not eagle["shared"],
    )


def test_eagle_drafts_equal_the_reference_forward(eagle, tmp_path):
    st = tmp_path / "st"
    convert_checkpoint(eagle["dir"], st)
    tok, ref = eagle["tok"], eagle["ref"]
    ours = lm.load_lm(eagle["tpath"])
    d = _drafter(f"e=eagle:path={st}", ours, tok)
    for text in (PROMPTS[0][2], PROMPTS[2][2]):
        ids = _ids(tok, text)
        with torch.no_grad():
            feats = ref.base_model.model(input_ids=torch.tensor([ids]))[0]  # (1, T, H)
        _features_match(feats, ours, ids)
        d.start("w", text)
        for P in range(3, len(ids) + 1, 4):
            want, logits = _reference_chain(ref, feats, ids[:P], K)
            gen = ref.ea_layer.generate(
                feats[:, : P - 1], torch.tensor([ids[:P]]), ref.base_model.lm_head, max_length=K, use_cache=True
            )[P:]
            got = d.draft(Prefix(ids[:P], 2, feats[0], 0, 0.0), K)
            assert got.tokens == want
            assert gen == want[: len(gen)] and (len(gen) == K or gen[-1] == 2)  # generate stops at token 2
            conf = torch.softmax(logits, -1).gather(1, torch.tensor(want)[:, None])[:, 0]
            assert got.conf == pytest.approx(conf.tolist(), abs=1e-5)


def test_eagle_greedy_speculative_decoding_equals_the_target(eagle, tmp_path):
    st = tmp_path / "st"
    convert_checkpoint(eagle["dir"], st)
    ours, tok = lm.load_lm(eagle["tpath"]), eagle["tok"]
    accepted = _live_equals_greedy(ours, tok, _drafter(f"e=eagle:path={st}", ours, tok))
    assert accepted > 0 or not eagle["repeat"]
