"""NgramDrafter's rule=vllm against a plain rewrite of vLLM 0.32's ngram proposer (bench/vllm_crosscheck.py's,
checked against vLLM's own numba proposer in the vllm tier), on random token streams with repeats."""

import importlib.util
from pathlib import Path

import numpy as np

from harness.drafters import NgramDrafter, Prefix

# loaded by path: putting bench/ on sys.path would let bench/coverage.py shadow the coverage package
_spec = importlib.util.spec_from_file_location(
    "vllm_crosscheck", Path(__file__).resolve().parents[1] / "bench" / "vllm_crosscheck.py"
)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
vllm_ngram_draft = _mod.vllm_ngram_draft


def test_rule_vllm_equals_vllms_proposer_and_latest_differs():
    rng = np.random.default_rng(0)
    differ = 0
    for trial in range(300):
        ctx = rng.integers(0, 5, int(rng.integers(2, 40))).tolist()
        k = int(rng.integers(1, 9))
        ours = NgramDrafter("n", {"n_min": 1, "n_max": 4, "rule": "vllm"}, None).draft(Prefix(ctx, 1, None, 0, 0.0), k)
        assert ours.tokens == vllm_ngram_draft(ctx, 1, 4, k), (ctx, k)
        assert len(ours.conf) == len(ours.tokens) == len(ours.entropy)
        latest = NgramDrafter("n", {"n_min": 1, "n_max": 4}, None).draft(Prefix(ctx, 1, None, 0, 0.0), k)
        assert latest.tokens == vllm_ngram_draft(ctx, 1, 4, k, latest=True, overlap=True), (ctx, k)
        differ += latest.tokens != ours.tokens
    assert differ > 30  # the two rules really differ on such streams
