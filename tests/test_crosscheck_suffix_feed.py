"""suffix:rule=arctic,feed=vllm: the global tree gets, after each prompt, the output and the tokens vLLM's last step
verified past it. Reference: bench/vllm_walk.model_walk (vLLM's walk, written separately) computes those tokens with
the target; a feed=output drafter handed output + those tokens must then draft exactly as the feed=vllm drafter does,
on every later prompt. The vllm tier compares both feeds with vLLM's own suffix decoding."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.vllm_walk import model_walk

from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec
from harness.models.lm import HarnessError
from harness.models.tiny import PROMPTS, make_model, make_tokenizer

SPEC = "suffix:rule=arctic,corpus=run,max_depth=24,min_score=0.1"
K, MAX_NEW = 4, 10


@pytest.fixture(scope="module")
def env():
    tok = make_tokenizer()
    model = make_model("llama", len(tok), layers=2, seed=3).eval()
    return DrafterEnv(model, tok)


def _greedy(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _verify(model, prompt, y):
    def at(pos, d):
        ids = prompt + y[:pos] + list(d)
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, len(prompt) + pos - 1 :].argmax(-1).tolist()

    return at


def test_feed_vllm_equals_a_tree_fed_the_walks_tail(env):
    torch.manual_seed(0)
    ds = build_drafters([parse_spec(f"sv={SPEC},feed=vllm"), parse_spec(f"s2={SPEC}"), parse_spec(f"s={SPEC}")], env)
    tails, differ = 0, 0
    prompts = [env.tokenizer(text).input_ids for _, _, text in PROMPTS] * 2  # again: earlier outputs now match
    for i, prompt in enumerate(prompts):
        y = _greedy(env.target, prompt, MAX_NEW)
        drafts = {}
        for name, d in ds.items():
            d.start("w", str(i))
            drafts[name] = [d.draft(Prefix(prompt + y[:p], len(prompt), None, 0, 0.0), K).tokens for p in range(len(y))]
        assert drafts["sv"] == drafts["s2"], i  # the same tree so far
        differ += drafts["sv"] != drafts["s"]
        blocks, tail = model_walk(
            lambda pos: ds["s2"].draft(Prefix(prompt + y[:pos], len(prompt), None, 0, 0.0), K).tokens,
            y,
            _verify(env.target, prompt, y),
        )
        tails += bool(tail)
        ds["sv"].finish(y)
        ds["s2"].finish(y + tail)
        ds["s"].finish(y)
    assert tails >= 2  # the last step ran past the end on several prompts: the feeds differ in what they add
    assert differ >= 1  # and the tokens past the end changed later drafts


def test_feed_settings_are_checked(env):
    with pytest.raises(HarnessError, match="feed"):
        build_drafters([parse_spec("s=suffix:feed=vllm")], env)  # rule=longest has no global tree
    with pytest.raises(HarnessError, match="feed"):
        build_drafters([parse_spec("s=suffix:rule=arctic,feed=tree")], env)
    hot = DrafterEnv(env.target, env.tokenizer, temperature=0.7)
    with pytest.raises(HarnessError, match="greedy"):
        build_drafters([parse_spec("s=suffix:rule=arctic,feed=vllm")], hot)
    d = build_drafters([parse_spec("s=suffix:rule=arctic,feed=vllm")], env)["s"]
    assert d.info()["settings"]["feed"] == "vllm"  # recorded: a run fed like vLLM is told apart
