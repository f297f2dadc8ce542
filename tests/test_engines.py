"""The engines' own lookup-or-model rules (bandit/policies/engines.py) on planted cases that follow each source's
stated behaviour (issue 34)."""

import numpy as np
import pytest

from bandit.logs.schema import Context, Timing
from bandit.policies import engines, livepolicies
from bandit.policies.engines import HVD, ArcticHybrid, LlamacppFirst, SglangHybrid, TrtllmSA, VllmNgramEagle


def ctx(lens, feats=None):
    D = len(lens)
    f = np.full((D, 4), np.nan)
    for i, v in (feats or {}).items():
        f[i] = v
    return Context(0, 0, 0, np.full(D, np.nan), np.full((D, 4), np.nan), np.array(lens), f)


def reset(pol, drafters, lookups, k=4):
    pol.reset(drafters, ["w"], Timing(k=k, lookup=tuple(lookups)))
    return pol


def test_trtllm_sa_threshold_4_keeps_the_model_draft_at_3_and_overrides_at_4():
    pol = reset(TrtllmSA(), ["eagle", "suffix"], ["suffix"])
    assert pol.threshold == 4  # SAEnhancerConfig's default
    assert pol.choose(ctx([4, 3])) == 0  # match 3 < threshold: the Eagle3 draft stays
    assert pol.choose(ctx([4, 4])) == 1  # match 4 reaches it: the SA draft overrides
    assert reset(TrtllmSA(threshold=2), ["eagle", "suffix"], ["suffix"]).choose(ctx([4, 2])) == 1


def test_arctic_hybrid_uses_suffix_when_its_score_reaches_the_speculators_length():
    pol = reset(ArcticHybrid(), ["eagle", "suffix", "suffix_arctic"], ["suffix", "suffix_arctic"])
    assert pol.cache_ == 2  # arctic's own suffix trees first
    sure, unsure = (1.0, 1.0, 1.0, 0.0), (0.9, 0.8, 1.0, 0.3)
    assert pol.choose(ctx([4, 0, 4], {2: sure})) == 2  # score 4 >= n_predict 4
    assert pol.choose(ctx([4, 0, 4], {2: unsure})) == 0  # score < 4: the model's draft
    assert pol.choose(ctx([4, 0, 3], {2: sure})) == 0  # score 3 < 4
    assert pol.choose(ctx([2, 0, 3], {2: sure})) == 2  # a shorter speculation length: 3 >= 2
    assert engines.suffix_score(3, 1.0, 1.0) == 3.0 and engines.suffix_score(2, 0.5, 0.5) == pytest.approx(0.75)


def test_sglang_hybrid_routes_by_continuation_and_matching_ratios():
    pol = reset(SglangHybrid(), ["eagle", "ngram"], ["ngram"])
    assert (pol.min_matching_ratio, pol.min_continuation_ratio) == (0.5, 0.5)
    assert pol.choose(ctx([4, 4], {1: (0.6, 0.5, 1.0, 0.1)})) == 1  # (4 / 4) * 0.6 >= 0.5: retrieval
    assert pol.choose(ctx([4, 2], {1: (0.6, 0.5, 1.0, 0.1)})) == 0  # (2 / 4) * 0.6 < 0.5: neural
    assert pol.choose(ctx([4, 0])) == 0
    strict = reset(SglangHybrid(min_continuation_ratio=0.9), ["eagle", "ngram"], ["ngram"])
    assert strict.choose(ctx([4, 4], {1: (0.6, 0.5, 1.0, 0.1)})) == 0


def test_vllm_ngram_eagle_prefers_a_found_ngram_draft():
    pol = reset(VllmNgramEagle(), ["eagle", "ngram", "ngram_vllm"], ["ngram", "ngram_vllm"])
    assert pol.cache_ == 2  # vLLM's own proposer
    assert pol.choose(ctx([4, 3, 1])) == 2
    assert pol.choose(ctx([4, 3, 0])) == 0  # no ngram match: EAGLE


def test_llamacpp_first_draftless_precedence_first_with_a_draft_wins():
    pol = reset(LlamacppFirst(), ["eagle", "ngram", "suffix"], ["ngram", "suffix"])
    assert pol.choose(ctx([4, 2, 4])) == 1  # the first lookup with a draft, however short
    assert pol.choose(ctx([4, 0, 1])) == 2
    assert pol.choose(ctx([4, 0, 0])) == 0  # no draftless draft: the draft model


def test_hvd_picks_the_cache_draft_by_its_predicted_payoff_and_learns_it():
    pol = reset(HVD(), ["eagle", "suffix"], ["suffix"])
    good, weak = (0.6, 0.5, 1.0, 0.1), (0.5, 0.5, 0.5, 0.1)
    assert pol.choose(ctx([4, 2], {1: good})) == 1  # prior payoff 2 * 0.6 = 1.2 >= the model's prior 1
    assert pol.choose(ctx([4, 1], {1: weak})) == 0  # 0.5 < 1
    assert pol.choose(ctx([4, 0])) == 0  # no cache draft
    for _ in range(50):  # the cache's drafts of this kind are never accepted; the model's accept 2 tokens
        c = ctx([4, 2], {1: good})
        pol.update(c, 0, np.array([2.0, 0.0]), np.array([True, True]))
    cache, model = pol.payoff(ctx([4, 2], {1: good}))
    assert cache < 0.2 and model > 1.9 and pol.choose(ctx([4, 2], {1: good})) == 0


def test_rules_without_one_role_run_the_other():
    assert reset(TrtllmSA(), ["eagle", "medusa"], []).choose(ctx([4, 4])) == 0
    assert reset(VllmNgramEagle(), ["ngram", "suffix"], ["ngram", "suffix"]).choose(ctx([0, 3])) == 0
    assert reset(LlamacppFirst(), ["ngram"], ["ngram"]).choose(ctx([0])) == 0


def test_every_rule_is_a_live_policy_and_replays_with_the_live_feedback():
    from bandit.policies.walk import run_timing
    from bandit.sim.simulate import SimConfig, simulate_table

    cfg = SimConfig(
        drafters=("eagle", "ngram", "suffix"), drafter_accept=(0.7, 0.6, 0.55), empty_rate=(0.0, 0.4, 0.3),
        drafter_ms=(3.0, 0.05, 0.04), n_prompts=4, out_len=60, seed=3,
    )  # fmt: skip
    t = simulate_table(cfg)
    timing = run_timing(t)
    for name in engines.RULE_NAMES:
        assert name in livepolicies.LIVE_POLICIES
        pol = livepolicies.make(name, t, timing)
        assert not hasattr(pol, "observe_step")  # timing-free: decoded live it makes its replay's choices
        a = livepolicies.replay(t, name, [0, 1, 2], timing)
        b = livepolicies.replay(t, name, [0, 1, 2], timing)
        assert a.chosen.sum() == a.passes.sum() > 0 and np.array_equal(a.chosen, b.chosen)
    with pytest.raises(ValueError, match="unknown engine rule"):
        engines.make_rule("nope")
