"""zoo CPU workloads: well-formed, deterministic, drawn from held-out items only."""
import json

import pytest

from zoo import WORKLOADS, WORKLOADS_DIR


def _read(w):
    return [json.loads(line) for line in (WORKLOADS_DIR / f"{w}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("w", WORKLOADS)
def test_workload_file_well_formed(w):
    recs = _read(w)
    assert 200 <= len(recs) <= 1000
    ids = [r["prompt_id"] for r in recs]
    assert len(ids) == len(set(ids))
    for r in recs:
        assert r["workload"] == w
        assert isinstance(r["prompt_id"], str) and r["prompt_id"]
        assert ("prompt" in r) != ("messages" in r)
        if "prompt" in r:
            assert isinstance(r["prompt"], str) and r["prompt"].strip()
        else:
            assert r["messages"] and all(m["role"] in ("system", "user", "assistant")
                                         and isinstance(m["content"], str) for m in r["messages"])


def test_workloads_regenerate_identically_from_heldout_items():
    from zoo.train import corpus_items, workload_records
    recs = workload_records()
    test_uids = {it.uid for it in corpus_items() if it.split == "test"}
    for w in WORKLOADS:
        assert recs[w] == _read(w), f"zoo/workloads/{w}.jsonl differs from its generator"
        for r in recs[w]:
            assert r["prompt_id"].split("@")[0] in test_uids
