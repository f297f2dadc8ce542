"""The eagle3 tier: our EAGLE-3 loader and forward (harness/models/eagle3.py) against speculators 0.9.0.

A tiny EAGLE-3 head is built with speculators' own classes (Eagle3SpeculatorConfig, Eagle3DraftModel) on
a tiny Llama target, saved with its `save_pretrained` (config.json, config.py, model.safetensors: the
directory vLLM loads), and loaded by our `eagle3:path=` drafter. speculators' forward is its training
forward (test-time training over ttt_steps): at step s, index t reads the ground-truth token s places on
and its own hidden state of step s-1, and attends to step 0's keys up to t and its own earlier steps.
Given as "ground truth" the prefix followed by our own drafts, index P-2 is therefore greedy chained
drafting from a prefix of P tokens, and its argmax at every step must be our draft token, its softmax our
conf. Then speculative decoding with the head through our Engine must give the target's greedy output.

Run with `bash .ci/tiers.sh eagle3`.
"""

import pytest
import torch
from conftest import upstream

from harness.models import lm
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

pytestmark = pytest.mark.tier_eagle3
torch.set_num_threads(1)
LAYERS, K, MAX_NEW = 4, 5, 32
VARIANTS = {  # (draft layer family, layers, draft vocabulary, options)
    "llama": ("llama", 1, 64, {}),
    "qwen3-2layers-nbr": ("qwen3", 2, 100, {"norm_before_residual": True}),
    "fc_norm-norm_output": ("llama", 1, 64, {"fc_norm": True, "norm_output": True}),
    "norm_before_fc": ("llama", 1, 80, {"norm_before_fc": True}),
}


def _classes():
    upstream("speculators", "eagle3")
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig, VerifierConfig, Eagle3DraftModel, Eagle3SpeculatorConfig, GreedyTokenProposalConfig


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    upstream("speculators", "eagle3")  # skip (or fail, in the tier) before building anything
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok), layers=LAYERS), tok, tmp_path_factory.mktemp("t") / "target")
    return {"path": path, "tok": tok, "model": lm.load_lm(path)}


def _build(target, variant, tmp_path):
    """speculators' own head, decisive random weights, saved by save_pretrained."""
    SpeculatorsConfig, VerifierConfig, Model, Config, Greedy = _classes()
    from transformers import LlamaConfig, Qwen3Config

    family, n_layers, Vd, opts = VARIANTS[variant]
    tm = target["model"]
    V, H = tm.config.vocab_size, tm.config.hidden_size
    cls = LlamaConfig if family == "llama" else Qwen3Config
    layer = cls(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=H // 4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
    )
    layer._attn_implementation = "eager"  # its float-mask path (flex attention wants a compiler)
    cfg = Config(
        transformer_layer_config=layer,
        draft_vocab_size=Vd,
        eagle_aux_hidden_state_layer_ids=[1, 2, 4],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[Greedy(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
        **opts,
    )
    m = Model(cfg).eval()
    g = torch.Generator().manual_seed(7)
    keep = (
        torch.arange(V)
        if Vd == V
        else torch.cat([torch.arange(8), 8 + torch.randperm(V - 8, generator=g)[: Vd - 8].sort().values])
    )
    if Vd != V:
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[keep] = True
        m.load_vocab_mappings(t2d, keep - torch.arange(Vd))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        m.embed_tokens.weight.copy_(tm.get_input_embeddings().weight)
        m.lm_head.weight.copy_(tm.get_output_embeddings().weight[keep])
    m.save_pretrained(tmp_path / "e3")
    return m, tmp_path / "e3"


def _ours(target, path):
    env = DrafterEnv(target["model"], target["tok"], target["path"])
    return build_drafters([parse_spec(f"e3=eagle3:path={path}")], env)["e3"]


def _reference(m, target, prompt, drafted, k):
    """speculators' forward teacher-forced on prompt + our drafts: (tokens, confs) at index P-2."""
    x = torch.tensor([prompt + drafted[: k - 1]])
    P = len(prompt)
    with torch.no_grad():
        hs = target["model"](x, output_hidden_states=True).hidden_states
        g = torch.cat([hs[i] for i in m.config.eagle_aux_hidden_state_layer_ids], -1)
        logits = []
        hook = m.lm_head.register_forward_hook(lambda mod, a, out: logits.append(out))
        steps = m(hidden_states=g[:, :-1], input_ids=x[:, 1:], document_ids=torch.zeros_like(x[:, 1:]), ttt_steps=k)
        hook.remove()
    d2t = m.d2t if m.d2t is not None else torch.zeros(m.lm_head.weight.shape[0], dtype=torch.long)
    toks = [int(s[0, P - 2] + d2t[s[0, P - 2]]) for s in steps]
    confs = [float(torch.softmax(lg[0, P - 2].float(), -1).max()) for lg in logits]
    return toks, confs


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_tokens_and_confs_equal_speculators(target, tmp_path, variant):
    m, path = _build(target, variant, tmp_path)
    d = _ours(target, path)
    assert d.model.layer_ids == [1, 2, 4] and d.model.keys == ["in:1", "in:2", "last"]
    for _, _, text in PROMPTS:
        prompt = target["tok"](text).input_ids
        P = len(prompt)
        _, hid = lm.forward(target["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=d.model.keys)
        d.start("w", "p")
        ours = d.draft(Prefix(prompt, P, hid["last"], 0, 0.0, 0, hid), K)
        toks, confs = _reference(m, target, prompt, ours.tokens, K)
        assert ours.tokens == toks, (variant, text)
        assert ours.conf == pytest.approx(confs, abs=1e-4)


def test_speculative_decoding_equals_target_greedy(target, tmp_path):
    _, path = _build(target, "llama", tmp_path)
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
        res = Engine(tgt, {"e3": d}, RunConfig("live", K, MAX_NEW)).run_prompt("w", "p", prompt)
        assert res.output == ref
        dense = Engine(tgt, {"e3": d}, RunConfig("dense", K, MAX_NEW)).run_prompt("w", "p", prompt)
        for r in res.records:  # the dense log holds the live run's drafts
            assert r["drafts"]["e3"]["tokens"] == dense.records[r["pos"]]["drafts"]["e3"]["tokens"]
        assert all(len(r["drafts"]["e3"]["tokens"]) == min(K, MAX_NEW - 1 - r["pos"]) for r in res.records)
