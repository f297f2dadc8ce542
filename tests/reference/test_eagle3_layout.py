"""The eagle3 tier, the other direction: the speculators layout harness.models.eagle3.write_random writes (the one vLLM loads:
`speculators_config` with the verifier and the draft length; the vllm tier decodes with it, tests/reference/
test_vllm_heads.py) is read by speculators 0.9.0's own loader, every tensor as written, and speculators' forward
drafts what our drafter drafts from the same directory.

Run with `bash .ci/tiers.sh eagle3`.
"""

import json

import pytest
import torch
from conftest import upstream
from safetensors.torch import load_file

from harness.models import eagle3, lm
from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

pytestmark = pytest.mark.tier_eagle3
torch.set_num_threads(1)
LAYERS, K = 4, 4
VARIANTS = {  # write_random's arguments
    "llama": dict(draft_vocab=None, num_layers=1, model_type="llama"),
    "small-vocab-qwen3-2layers": dict(draft_vocab=70, num_layers=2, model_type="qwen3"),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    upstream("speculators", "eagle3")
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok), layers=LAYERS), tok, tmp_path_factory.mktemp("t") / "target")
    return {"path": path, "tok": tok, "model": lm.load_lm(path)}


def _speculators(path):
    upstream("speculators", "eagle3")
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    cfg = Eagle3SpeculatorConfig.from_pretrained(str(path))  # speculators' own config reader
    cfg.transformer_layer_config._attn_implementation = "eager"  # its float-mask path (flex wants a compiler)
    return Eagle3DraftModel.from_pretrained(str(path), config=cfg).eval()


def _reference(m, model, prompt, drafted, k):
    """speculators' forward teacher-forced on prompt + our drafts: its tokens at index P-2 (tests/reference/
    test_eagle3.py explains why that index is greedy chained drafting)."""
    x = torch.tensor([prompt + drafted[: k - 1]])
    P = len(prompt)
    with torch.no_grad():
        hs = model(x, output_hidden_states=True).hidden_states
        g = torch.cat([hs[i] for i in m.config.eagle_aux_hidden_state_layer_ids], -1)
        steps = m(hidden_states=g[:, :-1], input_ids=x[:, 1:], document_ids=torch.zeros_like(x[:, 1:]), ttt_steps=k)
    d2t = m.d2t if m.d2t is not None else torch.zeros(m.lm_head.weight.shape[0], dtype=torch.long)
    return [int(s[0, P - 2] + d2t[s[0, P - 2]]) for s in steps]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_reads_the_layout_vllm_loads(target, tmp_path, variant):
    path = eagle3.write_random(
        tmp_path / "e3", target["model"], [1, 2, 3], verifier=target["path"], speculative_tokens=K, seed=5,
        **VARIANTS[variant],
    )  # fmt: skip
    cfg = json.loads((path / "config.json").read_text())
    sc = cfg["speculators_config"]
    assert sc["proposal_methods"][0]["speculative_tokens"] == K  # what vLLM reads
    assert sc["verifier"]["name_or_path"] == str(target["path"].resolve())
    m = _speculators(path)
    assert m.config.speculators_config.proposal_methods[0].speculative_tokens == K
    assert m.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    written, state = load_file(str(path / "model.safetensors")), m.state_dict()
    for key, t in written.items():  # every tensor as written: nothing left at speculators' random init
        if key == "t2d":
            assert torch.equal(state[key].bool(), t.bool())
        else:
            assert torch.equal(state[key].float(), t.float()), key
    assert {k for k in state if k not in written} <= {"verifier_lm_head.weight", "verifier_norm.weight"}

    env = DrafterEnv(target["model"], target["tok"], target["path"])
    ours = build_drafters([parse_spec(f"e3=eagle3:path={path}")], env)["e3"]
    for _, _, text in PROMPTS:
        prompt = target["tok"](text).input_ids
        _, hid = lm.forward(target["model"], torch.tensor(prompt[:-1]), lm.new_cache(), taps=[*ours.model.keys, "last"])
        ours.start("w", "p")
        d = ours.draft(Prefix(prompt, len(prompt), hid["last"], 0, 0.0, 0, hid), K)
        assert d.tokens == _reference(m, target["model"], prompt, d.tokens, K), (variant, text)
