"""bench/tree_width.py without the SmolLM2 models: its prompts are the pool's unseen ones, its trajectory count is
replay's, and bad input is one line."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bandit.logs.errors import InputError, UsageError
from bench import tree_width

ROOT = Path(__file__).resolve().parents[1]


def _pool(d, n_used, n_free):
    d.mkdir()
    rows = [
        {"prompt_id": f"u{i}", "source": "magpie", "messages": [{"role": "user", "content": "x"}]}
        for i in range(n_used)
    ]
    rows += [
        {"prompt_id": f"f{i}", "source": "magpie", "messages": [{"role": "user", "content": "y"}]}
        for i in range(n_free)
    ]
    (d / "prompts.jsonl").write_text(json.dumps({"seed": 0}) + "\n" + "".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.table({"prompt_id": [f"u{i}" for i in range(n_used)]}), d / "tokens.parquet")
    return d


def test_the_prompts_are_the_pools_unseen_ones_spread_over_it(tmp_path):
    d = _pool(tmp_path / "pool", 5, 12)
    got = [r["prompt_id"] for r in tree_width.unseen(d, 4)]
    assert got == ["f0", "f3", "f6", "f9"]
    with pytest.raises(InputError, match="fewer than --prompts 13"):
        tree_width.unseen(d, 13)
    with pytest.raises(InputError, match="not a self-distillation dataset"):
        tree_width.unseen(tmp_path / "nothing", 2)


def test_tokens_per_pass_walk_the_drafters_own_trajectory():
    acc = [2, 0, 0, 1, 0, 0, 3, 0, 0, 0]  # from 0: +3 -> 3: +2 -> 5: +1 -> 6: +4 -> 10
    recs = [{"drafts": {"t": {"accepted": a}}} for a in acc]
    assert tree_width.per_pass(recs, "t") == (10, 4)


def test_tree_specs_are_checked():
    assert tree_width.trees("24x8, 16x4") == [(24, 8), (16, 4)]
    for bad in ("24", "24x", "0x4", "24x0", "axb"):
        with pytest.raises(UsageError, match="NxW"):
            tree_width.trees(bad)


@pytest.mark.parametrize("args,words", [(["--trees", "24"], "--trees"), (["--prompts", "1"], "--prompts 1"), (["--resamples", "0"], "--resamples 0"),
                                        (["--models", "/nonexistent-models"], "not a self-distillation dataset")])  # fmt: skip
def test_bad_input_is_one_line(args, words):
    p = subprocess.run(
        [sys.executable, "bench/tree_width.py", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert p.returncode != 0 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
