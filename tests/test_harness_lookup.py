"""The lookup drafters on hand-made sequences, against answers worked out by hand."""

import pytest

from harness.drafters import DrafterEnv, NgramDrafter, Prefix, SuffixDrafter


def pre(ids, n_prompt=1):
    return Prefix(list(ids), n_prompt, None, 0, 0.0)


def test_ngram_copies_the_most_recent_match_and_scores_agreement():
    d = NgramDrafter("n", {"n_max": 2}, DrafterEnv(None, None))
    # "5 6" occurs at 0 (followed by 7 8) and at 4 (followed by 9 8); the most recent wins
    out = d.draft(pre([5, 6, 7, 8, 5, 6, 9, 8, 5, 6]), 3)
    assert out.tokens == [9, 8, 5]
    assert out.conf[:2] == [0.5, 1.0]  # 1 of 2 occurrences continue with 9; the one that does, with 8
    assert out.entropy[0] == pytest.approx(0.6931, abs=1e-4)  # two continuations, equally often
    assert d.draft(pre([1, 2, 3]), 4).tokens == []  # no earlier occurrence of any suffix
    # a repeated span continues past the prefix end (overlapping copy)
    assert d.draft(pre([4, 1, 2, 1, 2]), 5).tokens == [1, 2, 1, 2, 1]


def test_suffix_uses_earlier_outputs_and_stops_on_low_score():
    d = SuffixDrafter("s", {"min_score": 0.4}, DrafterEnv(None, None))
    d.start("w", "a")
    d.finish([1, 2, 3, 4, 1, 2, 3, 9])  # an earlier output of the run
    d.start("w", "b")
    out = d.draft(pre([7, 1, 2]), 4)
    # "1 2" -> 3 twice (conf 1); then "1 2 3" -> 4 once, 9 once: tie broken by recency -> 9 (0.5),
    # score 0.5 >= 0.4; nothing follows 9, so the draft ends
    assert out.tokens == [3, 9] and out.conf == [1.0, 0.5]
    d.finish([7, 1, 2, 3])
    d.start("w", "c")  # the current prompt's own text is indexed too, and un-indexed at finish
    out = d.draft(pre([8, 6, 5, 8, 6]), 2)
    assert out.tokens == [5, 8]
    d.finish([8, 6])
    assert len(d.seqs) == 3 and d.seqs[-1] == [8, 6]  # the prompt's prefix was replaced by its output
    assert {o for occ in d.index.values() for o in occ if o[0] == 2} == {(2, 0)}
