"""The dflash tier: our DFlash loader and forward (harness/models/dflash.py) against z-lab's dflash 0.1.0.

A tiny DFlash drafter is built with dflash's own DFlashDraftModel on a Qwen3 config carrying
`dflash_config {mask_token_id, target_layer_ids}`, saved with its `save_pretrained`, and loaded by our
`dflash:path=` drafter. The reference's forward takes the target's context features
(`extract_context_feature(hidden_states, target_layer_ids)`, i.e. hidden_states[id + 1]) and the
embedded block [last token, mask, ...]; `compute_logits` with the target's lm_head gives the block's
logits. Our draft tokens must be its argmax at block positions 1..k, our confs its softmax there. Then
speculative decoding with it through our Engine, dflash's own `dflash_generate`, and the target's greedy
`generate` must give one and the same output.

Run with `bash .ci/tiers.sh dflash`.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import upstream

from harness.models import lm
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

pytestmark = pytest.mark.tier_dflash
torch.set_num_threads(1)
LAYERS, MAX_NEW = 4, 32
VARIANTS = {  # (target_layer_ids, draft layers, block size, extra config)
    "two-layers": ([0, 2], 2, 6, {}),
    "last-layer-and-scales": ([1, 3], 1, 8, {"input_embedding_scale": 1.5, "output_multiplier": 0.7}),
    "three-taps-softcap": ([0, 1, 2], 2, 4, {"final_logit_softcapping": 5.0}),
}


def _model_mod():
    return upstream("dflash.model", "dflash")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    _model_mod()  # skip (or fail, in the tier) before building anything
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok), layers=LAYERS), tok, tmp_path_factory.mktemp("t") / "target")
    return {"path": path, "tok": tok, "model": lm.load_lm(path)}


def _build(target, variant, tmp_path):
    mod = _model_mod()
    from transformers import Qwen3Config

    ids, n_layers, block, extra = VARIANTS[variant]
    tm = target["model"]
    H = tm.config.hidden_size
    cfg = Qwen3Config(
        vocab_size=tm.config.vocab_size,
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=H // 4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        block_size=block,
        num_target_layers=LAYERS,
        dflash_config={"mask_token_id": 3, "target_layer_ids": ids, **extra},
    )
    m = mod.DFlashDraftModel(cfg).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))
            else:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    m.save_pretrained(tmp_path / "df")
    return m, tmp_path / "df"


def _ours(target, path):
    env = DrafterEnv(target["model"], target["tok"], target["path"])
    return build_drafters([parse_spec(f"df=dflash:path={path}")], env)["df"]


def _reference(m, target, prompt):
    """dflash's forward on the prefix: (argmax tokens, max probabilities) at block positions 1.."""
    mod = _model_mod()
    tm = target["model"]
    P, B = len(prompt), m.block_size
    with torch.no_grad():
        hs = tm(torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states
        ctx = mod.extract_context_feature(hs, m.target_layer_ids)
        block = torch.tensor([[prompt[-1]] + [m.mask_token_id] * (B - 1)])
        scale = float(m.config.dflash_config.get("input_embedding_scale", 1.0))
        emb = F.embedding(block, tm.get_input_embeddings().weight) * scale
        out = m(target_hidden=ctx, noise_embedding=emb, position_ids=torch.arange(P - 1 + B)[None])
        logits = m.compute_logits(out[:, 1:], tm.lm_head)[0].float()
    return logits.argmax(-1).tolist(), torch.softmax(logits, -1).max(-1).values.tolist()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_drafts_and_confs_equal_dflash(target, tmp_path, variant):
    m, path = _build(target, variant, tmp_path)
    d = _ours(target, path)
    assert d.model.keys == [lm.hidden_state(i + 1, LAYERS) for i in VARIANTS[variant][0]]
    for _, _, text in PROMPTS:
        prompt = target["tok"](text).input_ids
        P = len(prompt)
        _, hid = lm.forward(target["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=d.model.keys)
        d.start("w", "p")
        ours = d.draft(Prefix(prompt, P, None, 0, 0.0, 0, hid), m.block_size - 1)
        toks, confs = _reference(m, target, prompt)
        assert ours.tokens == toks, (variant, text)
        assert ours.conf == pytest.approx(confs, abs=1e-4)
        short = d.draft(Prefix(prompt, P, None, 0, 0.0, 0, hid), 2)  # k < block-1: the block's first k
        assert short.tokens == toks[:2]


def test_speculative_decoding_equals_dflash_generate_and_greedy(target, tmp_path):
    mod = _model_mod()
    m, path = _build(target, "two-layers", tmp_path)
    d = _ours(target, path)
    tgt = Target(target["model"], target["tok"])
    for _, _, text in PROMPTS:
        prompt = target["tok"](text).input_ids
        ref = (
            target["model"]
            .generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)[
                0, len(prompt) :
            ]
            .tolist()
        )
        theirs = mod.dflash_generate(m, target["model"], torch.tensor([prompt]), MAX_NEW, None)[0, len(prompt) :]
        ours = Engine(tgt, {"df": d}, RunConfig("live", m.block_size - 1, MAX_NEW)).run_prompt("w", "p", prompt)
        assert ours.output == ref == theirs.tolist()[:MAX_NEW]
        dense = Engine(tgt, {"df": d}, RunConfig("dense", m.block_size - 1, MAX_NEW)).run_prompt("w", "p", prompt)
        for r in ours.records:
            assert r["drafts"]["df"]["tokens"] == dense.records[r["pos"]]["drafts"]["df"]["tokens"]
