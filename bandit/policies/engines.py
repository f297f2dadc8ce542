"""The production engines' own rules for combining a lookup draft with a model draft, as policies (issue 34).

Each rule chooses, per block, between a cache/lookup drafter (drafted before the choice, so its draft length and
FEATURES are in the Context) and a model drafter (its draft length the one asked for), as the engine it comes from
decides per iteration. They are replayed through bandit/policies/walk.py like every other policy and decoded live as
`policy:<name>` (bandit/policies/livepolicies.py). What the sources leave open, and which drafter of a run plays which
role, is chosen here and written in docs/DESIGN.md ("Engines' combining rules"). The rules see only the Context, so a
rule decoded live makes exactly the choices of its replay.

    python bandit/policies/engines.py [PATHS]    # each rule's mean accepted per logged block on a campaign
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/engines.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import math
from typing import Sequence

from bandit.policies.bandits import BasePolicy, lookup_mask

# the model drafter a rule combines with ("the Eagle3/MTP draft", "the model-based method"): the first of these
# names a run has, else its first non-lookup drafter in name order
MODEL_PREFS = ("eagle3", "eagle", "mtp", "medusa", "dflash", "draft", "layerskip")


def pick(drafters: Sequence[str], lookup: Sequence[bool], prefs: Sequence[str], want_lookup: bool) -> int:
    """Index of the first name of `prefs` among `drafters` whose lookup-ness is `want_lookup`, else of the first such
    drafter in name order; -1 when the run has none."""
    ok = [i for i, d in enumerate(drafters) if bool(lookup[i]) == want_lookup]
    for name in prefs:
        for i in ok:
            if drafters[i] == name:
                return i
    return min(ok, key=lambda i: drafters[i]) if ok else -1


def suffix_score(n: int, conf_mean: float, conf_min: float) -> float:
    """SuffixDecoding's speculation score of a draft of n tokens (the sum over its tokens of the probability of the
    draft up to it, arctic-inference suffix_decoding), from the draft's FEATURES: exactly n when every token's
    probability is 1 (conf_min == 1); else sum_j conf_mean^j, a stand-in below n (exact for equal confidences)."""
    if n <= 0:
        return 0.0
    if conf_min >= 1.0:
        return float(n)
    c = min(max(conf_mean, 0.0), 1.0)
    return float(sum(c**j for j in range(1, n + 1)))


class EngineRule(BasePolicy):
    """Shared plumbing: the two roles resolved at `reset` from the run's drafter names and lookups (timing.lookup).

    `cache_`: the lookup drafter (index, -1 when the run has none); `model_`: the model drafter (-1: none). With one
    role missing the rule runs the other; with neither, drafter 0."""

    name = "engine_rule"
    cache_prefs: tuple[str, ...] = ("suffix", "suffix_arctic", "ngram", "ngram_vllm")

    def __init__(self, cache: str | None = None, model: str | None = None, random_state: int | None = 0):
        super().__init__(random_state)
        self.cache, self.model = cache, model

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        look = lookup_mask(self.drafters_, timing).tolist()
        self.lookup_ = look
        self.cache_ = pick(self.drafters_, look, (self.cache,) if self.cache else self.cache_prefs, True)
        self.model_ = pick(self.drafters_, look, (self.model,) if self.model else MODEL_PREFS, False)

    def _fallback(self) -> int | None:
        if self.cache_ < 0 or self.model_ < 0:
            return max(self.cache_, self.model_, 0)
        return None

    @staticmethod
    def _feat(ctx, i: int) -> tuple[float, float, float, float]:
        """The lookup draft's FEATURES (conf_mean, conf_min, conf_first, ent_mean); zeros when not given."""
        f = ctx.draft_features
        if f is None or not math.isfinite(float(f[i][0])):
            return (0.0, 0.0, 0.0, 0.0)
        return (float(f[i][0]), float(f[i][1]), float(f[i][2]), float(f[i][3]))

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


class TrtllmSA(EngineRule):
    """TensorRT-LLM's suffix-automaton enhancer (`SAEnhancerConfig`, NVIDIA/TensorRT-LLM
    tensorrt_llm/llmapi/llm_args.py; `sa_config` on Eagle3DecodingConfig / MTPDecodingConfig): the SA draft
    overrides the neural draft when the suffix match length reaches `threshold` (default 4), else the Eagle3/MTP
    draft is verified.

    The block log holds no match length: the SA draft's length stands for it (our choice, docs/DESIGN.md), the SA
    being the run's `suffix` drafter (longest match), else `suffix_arctic`, else an ngram lookup."""

    name = "trtllm_sa"

    def __init__(self, threshold: int = 4, cache: str | None = None, model: str | None = None, random_state=0):
        super().__init__(cache, model, random_state)
        self.threshold = threshold

    def choose(self, ctx) -> int:
        fb = self._fallback()
        if fb is not None:
            return fb
        return self.cache_ if int(ctx.draft_len[self.cache_]) >= self.threshold else self.model_


class ArcticHybrid(EngineRule):
    """Arctic Inference with `method: "arctic"` and `enable_suffix_decoding: true` (snowflakedb/ArcticInference
    arctic_inference/vllm/model_runner.py, config.py; docs/suffix-decoding.rst): the suffix draft is used when its
    speculation score reaches the model speculator's speculation length (`min_score = n_predict`), else the model's
    draft. The score is `suffix_score` of the suffix draft; n_predict is the model drafter's draft length asked for.
    Suffix drafter: `suffix_arctic` (arctic's own trees), else `suffix`, else an ngram lookup."""

    name = "arctic_hybrid"
    cache_prefs = ("suffix_arctic", "suffix", "ngram", "ngram_vllm")

    def choose(self, ctx) -> int:
        fb = self._fallback()
        if fb is not None:
            return fb
        n = int(ctx.draft_len[self.cache_])
        cm, cmin, _, _ = self._feat(ctx, self.cache_)
        score = suffix_score(n, cm, cmin)
        return self.cache_ if n > 0 and score >= float(ctx.draft_len[self.model_]) else self.model_


class SglangHybrid(EngineRule):
    """SGLang's batch-level hybrid speculative decoding (sgl-project/sglang PR #37237, the HYBRID algorithm): the
    retrieval worker runs a decode step when at least `bs * min_matching_ratio` requests qualify, a request
    qualifying when its retrieval draft's quality score reaches `min_continuation_ratio`; else the neural worker.
    One sequence here (bs = 1). The score weights the draft's length by its match strength, normalised by the draft
    width: (len / k) * conf_mean (the draft's confidence stands for the suffix-match weight, which the log lacks).
    The PR states no defaults we could read: 0.5 and 0.5 are ours (docs/DESIGN.md). Retrieval: `ngram`, else
    `ngram_vllm`, else a suffix lookup."""

    name = "sglang_hybrid"
    cache_prefs = ("ngram", "ngram_vllm", "suffix", "suffix_arctic")

    def __init__(
        self,
        min_matching_ratio: float = 0.5,
        min_continuation_ratio: float = 0.5,
        cache: str | None = None,
        model: str | None = None,
        random_state=0,
    ):
        super().__init__(cache, model, random_state)
        self.min_matching_ratio, self.min_continuation_ratio = min_matching_ratio, min_continuation_ratio

    def choose(self, ctx) -> int:
        fb = self._fallback()
        if fb is not None:
            return fb
        n = int(ctx.draft_len[self.cache_])
        width = max(int(ctx.draft_len[self.model_]), n, 1)
        score = n / width * self._feat(ctx, self.cache_)[0]
        qualifying = 1 if n > 0 and score >= self.min_continuation_ratio else 0
        return self.cache_ if qualifying > 0 and qualifying >= 1 * self.min_matching_ratio else self.model_


class VllmNgramEagle(EngineRule):
    """vLLM's `ngram-eagle` method (vllm-project/vllm PR #24344, RFC #18633): the ngram draft when the ngram
    proposer finds a match (a non-empty draft), else the EAGLE draft. The PR runs EAGLE for every request in a batch
    whatever ngram found; here, one sequence, EAGLE runs only when chosen (the RFC's "skip EAGLE for this seq").
    Ngram: `ngram_vllm` (vLLM's proposer), else `ngram`, else a suffix lookup."""

    name = "vllm_ngram_eagle"
    cache_prefs = ("ngram_vllm", "ngram", "suffix", "suffix_arctic")

    def choose(self, ctx) -> int:
        fb = self._fallback()
        if fb is not None:
            return fb
        return self.cache_ if int(ctx.draft_len[self.cache_]) > 0 else self.model_


class LlamacppFirst(EngineRule):
    """llama.cpp with several `--spec-type` (ggml-org/llama.cpp common/speculative.cpp, PR #28391: the types are
    additive): the draftless (lookup) methods take precedence, in their order, and the first with a draft wins; else
    the draft model. Every lookup of the run in name order, then the model drafter: the seed PR's "n-gram first (no
    select)" baseline."""

    name = "llamacpp_first"

    def choose(self, ctx) -> int:
        for i, d in sorted(enumerate(self.drafters_), key=lambda x: x[1]):
            if self.lookup_[i] and int(ctx.draft_len[i]) > 0:
                return i
        return self.model_ if self.model_ >= 0 else 0


class HVD(EngineRule):
    """Hybrid Verified Decoding (Su et al., arXiv 2606.01019): predicts the accepted length (payoff) of the cache
    draft before verification and verifies the cache draft or runs the model drafter by that estimate.

    The paper's predictor and threshold are not in the text we could read; ours (docs/DESIGN.md): an online ridge
    regression (penalty `ridge`) of the cache draft's accepted tokens on (1, len, len * conf_mean, conf_min), its
    prior the draft's own expectation len * conf_mean, fitted on every observation of the cache draft (its blocks,
    and live the feedback censored to what the block revealed, which only errs low where the model drafter's block
    already beat it); the model drafter's payoff its running mean accepted (prior
    `model_prior` tokens, weight 1). The cache draft runs when non-empty and its predicted payoff is at least the
    model's. Cache: `suffix`, else `suffix_arctic`, else an ngram lookup."""

    name = "hvd"
    full_information = True

    def __init__(
        self, ridge: float = 1.0, model_prior: float = 1.0, cache: str | None = None, model: str | None = None,
        random_state=0,
    ):  # fmt: skip
        super().__init__(cache, model, random_state)
        self.ridge, self.model_prior = ridge, model_prior

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        r = float(self.ridge)
        self.A_ = [[r if i == j else 0.0 for j in range(4)] for i in range(4)]  # X'X + r I
        self.b_ = [0.0, 0.0, r, 0.0]  # X'y + r w0, w0 = (0, 0, 1, 0): payoff = len * conf_mean before any data
        self.w_ = [0.0, 0.0, 1.0, 0.0]
        self.m_sum_, self.m_n_ = float(self.model_prior), 1.0

    def _phi(self, ctx) -> list[float]:
        n = float(ctx.draft_len[self.cache_])
        cm, cmin, _, _ = self._feat(ctx, self.cache_)
        return [1.0, n, n * cm, cmin]

    def payoff(self, ctx) -> tuple[float, float]:
        """(predicted accepted tokens of the cache draft, of the model drafter)."""
        return sum(w * x for w, x in zip(self.w_, self._phi(ctx))), self.m_sum_ / self.m_n_

    def choose(self, ctx) -> int:
        fb = self._fallback()
        if fb is not None:
            return fb
        if int(ctx.draft_len[self.cache_]) <= 0:
            return self.model_
        cache, model = self.payoff(ctx)
        return self.cache_ if cache >= model else self.model_

    def update(self, ctx, chosen, accepted, observed) -> None:
        if self.cache_ < 0 or self.model_ < 0:
            return
        if chosen == self.model_:
            self.m_sum_ += float(accepted[chosen])
            self.m_n_ += 1.0
        a = float(accepted[self.cache_])
        if not observed[self.cache_] or not math.isfinite(a) or int(ctx.draft_len[self.cache_]) <= 0:
            return
        x = self._phi(ctx)
        for i in range(4):
            self.b_[i] += x[i] * a
            for j in range(4):
                self.A_[i][j] += x[i] * x[j]
        self.w_ = _solve(self.A_, self.b_)


def _solve(A: list[list[float]], b: list[float]) -> list[float]:
    """A w = b for a small symmetric positive definite A (Gaussian elimination; plain lists, as the walk is hot)."""
    n = len(b)
    M = [row[:] + [b[i]] for i, row in enumerate(A)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(M[r][c]))
        M[c], M[p] = M[p], M[c]
        for r in range(c + 1, n):
            f = M[r][c] / M[c][c]
            for j in range(c, n + 1):
                M[r][j] -= f * M[c][j]
    w = [0.0] * n
    for r in range(n - 1, -1, -1):
        w[r] = (M[r][n] - sum(M[r][j] * w[j] for j in range(r + 1, n))) / M[r][r]
    return w


ENGINE_RULES = (TrtllmSA, ArcticHybrid, SglangHybrid, VllmNgramEagle, LlamacppFirst, HVD)
RULE_NAMES = tuple(cls.name for cls in ENGINE_RULES)


def make_rule(name: str, random_state: int = 0) -> EngineRule:
    """The rule `name` of RULE_NAMES with its source's default settings."""
    for cls in ENGINE_RULES:
        if cls.name == name:
            return cls(random_state=random_state)
    raise ValueError(f"unknown engine rule {name!r}; known: {', '.join(RULE_NAMES)}")


if __name__ == "__main__":
    from bandit.policies.walk import policies_demo

    policies_demo([cls() for cls in ENGINE_RULES], "engines")
