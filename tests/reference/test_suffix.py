"""The suffix tier: our `suffix` drafter against arctic-inference 0.3.0's suffix tree (SuffixDecoding, C++).

The reference is driven the way vLLM drives it: per request `start_request(prompt)`, then at every output
position `speculate(prompt + output so far)` followed by `add_active_response(the next token)`, and
`stop_request` at the end. Our drafter sees the same streams through its own protocol (`start`, `draft` on the
same prefix, `finish(output)`). With rule=arctic the draft tokens must be the reference's exactly and the
running product of our confs (in float32) must be its probabilities exactly, on every stream and setting
below. rule=longest (the default) is a different rule: the tests at the end show each documented difference
(SuffixDrafter's docstring) on a small stream, with the reference's answer next to ours.

The tests without the tier marker need no package (hand-worked answers for rule=arctic) and run in the
default suite. Run the tier with `bash .ci/tiers.sh suffix`.
"""

import random

import numpy as np
import pytest
from conftest import upstream

from harness.drafters import DrafterEnv, Prefix, SuffixDrafter
from harness.models.lm import HarnessError
from harness.models.tiny import PROMPTS, make_tokenizer

tier = pytest.mark.tier_suffix


def _cache_cls():
    return upstream("arctic_inference.suffix_decoding", "suffix").SuffixDecodingCache


def _markov(rng, vocab, n, stay=0.6):
    """A sticky random walk over a small vocabulary: many repeats, many ties."""
    out = [rng.randrange(vocab)]
    for _ in range(n - 1):
        out.append(out[-1] if rng.random() < stay else rng.randrange(vocab))
    return out


def _copying(rng, vocab, n, pool):
    """Spans copied from earlier text (a prompt, earlier outputs) with some noise: long matches."""
    out = []
    while len(out) < n:
        src = rng.choice(pool)
        i = rng.randrange(max(1, len(src) - 4))
        out += src[i : i + rng.randrange(3, 12)] + [rng.randrange(vocab)]
    return out[:n]


def streams(kind: str, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Requests (prompt, output), in order."""
    rng = random.Random(seed)
    if kind == "markov":
        return [(_markov(rng, 4, rng.randrange(5, 25)), _markov(rng, 4, rng.randrange(20, 50))) for _ in range(8)]
    if kind == "copying":
        reqs, pool = [], []
        for _ in range(8):
            prompt = [rng.randrange(30) for _ in range(rng.randrange(10, 30))]
            out = _copying(rng, 30, rng.randrange(30, 60), [prompt] + pool)
            reqs.append((prompt, out))
            pool.append(out)
        return reqs
    tok = make_tokenizer()  # "text": the character tokenizer over the tiny prompts; outputs repeat their lines
    reqs = []
    for _, _, text in PROMPTS:
        ids = tok(text).input_ids
        reqs.append((ids, (ids[len(ids) // 2 :] * 3)[:60]))
    return reqs


def run_both(reqs, cache, drafter, k, factor, offset, min_prob):
    """Every (reference draft, our draft) pair along the streams."""
    pairs = []
    for r, (prompt, out) in enumerate(reqs):
        if cache is not None:
            cache.start_request(r, prompt)
        drafter.start("w", str(r))
        for pos in range(len(out)):
            ctx = prompt + out[:pos]
            ref = None
            if cache is not None:
                ref = cache.speculate(
                    r,
                    ctx,
                    max_spec_tokens=k,
                    max_spec_factor=factor,
                    max_spec_offset=offset,
                    min_token_prob=min_prob,
                    use_tree_spec=False,
                )
                cache.add_active_response(r, [out[pos]])
            pairs.append((ref, drafter.draft(Prefix(ctx, len(prompt), None, 0, 0.0), k), ctx))
        if cache is not None:
            cache.stop_request(r)
        drafter.finish(out)
    return pairs


def arctic(depth, factor=1.0, offset=0.0, min_prob=0.1) -> SuffixDrafter:
    return SuffixDrafter(
        "s",
        {"rule": "arctic", "max_depth": depth, "spec_factor": factor, "spec_offset": offset, "min_score": min_prob},
        DrafterEnv(None, None),
    )


def cumprod32(conf):
    out, p = [], np.float32(1.0)
    for c in conf:
        p = np.float32(p * np.float32(c))
        out.append(float(p))
    return out


SETTINGS = [  # max_depth, k, spec_factor, spec_offset, min_token_prob
    (24, 8, 1.0, 0.0, 0.1),  # vLLM's defaults
    (6, 5, 2.0, 1.0, 0.0),
    (64, 16, 0.5, 2.0, 0.3),
    (3, 4, 1.0, 0.0, 0.05),
]


@tier
@pytest.mark.parametrize("kind", ["markov", "copying", "text"])
@pytest.mark.parametrize("depth,k,factor,offset,min_prob", SETTINGS)
def test_rule_arctic_equals_the_reference(kind, depth, k, factor, offset, min_prob):
    reqs = streams(kind)
    pairs = run_both(
        reqs, _cache_cls()(max_tree_depth=depth), arctic(depth, factor, offset, min_prob), k, factor, offset, min_prob
    )
    assert sum(bool(ref.token_ids) for ref, _, _ in pairs) > len(pairs) // 4  # the streams exercise drafting
    for ref, ours, ctx in pairs:
        assert ours.tokens == list(ref.token_ids), f"context {ctx}"
        assert cumprod32(ours.conf) == [float(p) for p in ref.probs], f"context {ctx}"


@tier
def test_an_unfinished_prompt_leaves_no_trace():
    """Dropping a prompt mid-way (a live phase decodes one prompt under several configurations, finishing
    it once) must leave the global tree as if it never started: the reference, which never saw it, agrees."""
    reqs = streams("markov", seed=3)
    d = arctic(8)
    for prompt, out in reqs[:2]:  # started and dropped, twice
        d.start("w", "x")
        for pos in range(len(out)):
            d.draft(Prefix(prompt + out[:pos], len(prompt), None, 0, 0.0), 4)
    pairs = run_both(reqs[2:], _cache_cls()(max_tree_depth=8), d, 4, 1.0, 0.0, 0.1)
    assert all(ours.tokens == list(ref.token_ids) for ref, ours, _ in pairs)


# Where rule=longest differs (SuffixDrafter's docstring), each on one stream: requests (prompt, output), then the
# context drafted from, k, and the drafts of the reference and of rule=longest.
DIFFERENCES = {
    # an occurrence at the end of the sequence counts in arctic's denominator (0.5, not 1); arctic's 2-token
    # match caps its draft at 2 tokens; longest follows the sequence up to its end
    "end-of-sequence counts, match-length cap": ([], [1, 2, 3, 1, 2], 4, [3, 1], [3, 1, 2]),
    # longest takes the longest match, 7 8 9 (three continuations, once each; the most recent, 6 6, wins the
    # tie); arctic scores every match length: "8 9" gives 1 2 at probability 1/3 each (score 0.67), "9" alone is
    # followed by 5 in 7 of its 10 occurrences (score 0.7 over its 1-token cap), and 0.7 wins
    "best score, not longest match": (
        [([0], [7, 8, 9, 1, 2]), ([0], [7, 8, 9, 3, 4]), ([0], [7, 8, 9, 6, 6])] + [([0], [9, 5, 5, 5])] * 7,
        [7, 8, 9],
        3,
        [5],
        [6, 6],
    ),
    # "1" was followed by 2, then by 3: longest breaks the tie by recency (3), arctic by its child order (the
    # first child created, 2)
    "ties": ([([0], [1, 2, 1, 3])], [0, 1], 2, [2], [3]),
}


@tier
@pytest.mark.parametrize("name", list(DIFFERENCES))
def test_rule_longest_differs_as_documented(name):
    earlier, ctx, k, want_ref, want_longest = DIFFERENCES[name]
    cache, d_arc, d_long = _cache_cls()(max_tree_depth=24), arctic(24), SuffixDrafter("s", {}, DrafterEnv(None, None))
    run_both(earlier, cache, d_arc, k, 1.0, 0.0, 0.1)
    run_both(earlier, None, d_long, k, 1.0, 0.0, 0.1)
    r = len(earlier)
    cache.start_request(r, ctx)
    ref = cache.speculate(r, ctx, max_spec_tokens=k, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)
    for d in (d_arc, d_long):
        d.start("w", "last")
    pre = Prefix(list(ctx), len(ctx), None, 0, 0.0)
    assert list(ref.token_ids) == want_ref == d_arc.draft(pre, k).tokens
    assert d_long.draft(pre, k).tokens == want_longest != want_ref


# ------------------------------------------------------------------ no package: hand-worked rule=arctic


def test_rule_arctic_by_hand():
    d = arctic(24)
    d.start("w", "a")
    out = d.draft(Prefix([1, 2, 3, 1, 2], 5, None, 0, 0.0), 4)
    # match "1 2" (2 occurrences, one at the end: 3 follows once -> 1/2), then "1 2 3" -> 1 (1/1); the 2-token
    # match caps the draft at 2 tokens; "2" alone scores 0.5 over 1 token, less than 0.5 + 0.5
    assert out.tokens == [3, 1] and out.conf == [0.5, 1.0]
    d.finish([4, 4, 4])
    d.start("w", "b")  # the prompt [1, 2, 3, 1, 2] is gone (local tree); the output 4 4 4 stays (global)
    out = d.draft(Prefix([9, 4, 4], 3, None, 0, 0.0), 4)
    # global: "4 4" occurs twice in 4 4 4 (once at the end) -> 4 with 1/2; "4" occurs 3 times, 4 follows twice
    # -> 2/3 over 1 token; "4 4" scores 0.5, "4" 0.667: the 1-token draft wins
    assert out.tokens == [4] and out.conf == pytest.approx([2 / 3])


def test_rule_arctic_settings_are_checked():
    with pytest.raises(HarnessError, match="rule='tree'; expected longest or arctic"):
        SuffixDrafter("s", {"rule": "tree"}, DrafterEnv(None, None))
    with pytest.raises(HarnessError, match=r"unknown setting\(s\) \['max_occ'\]"):
        SuffixDrafter("s", {"rule": "arctic", "max_occ": 3}, DrafterEnv(None, None))
    assert SuffixDrafter("s", {}, DrafterEnv(None, None)).info()["settings"] == {
        "max_depth": 8,
        "min_score": 0.1,
        "max_occ": 256,
    }  # the default rule is not recorded: old manifests match
