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
            assert r["messages"] and all(
                m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str) for m in r["messages"]
            )


def test_workloads_regenerate_identically_from_heldout_items():
    from zoo.data import corpus_items
    from zoo.prompts import workload_records

    recs = workload_records()
    test_uids = {it.uid for it in corpus_items() if it.split == "test"}
    for w in WORKLOADS:
        assert recs[w] == _read(w), f"zoo/workloads/{w}.jsonl differs from its generator"
        for r in recs[w]:
            assert r["prompt_id"].split("@")[0] in test_uids


def test_prompts_end_at_a_token_boundary_of_their_items():
    """A prompt's tokens are a prefix of its whole item's tokens (no lone trailing-whitespace token: the target
    read one before an indented line as an item's end and stopped at once)."""
    from transformers import AutoTokenizer

    from zoo import TARGET_DIR
    from zoo.data import corpus_items
    from zoo.prompts import token_boundary_prompt

    tok = AutoTokenizer.from_pretrained(str(TARGET_DIR), local_files_only=True)
    items = {it.uid: it for it in corpus_items() if it.split == "test"}
    checked = 0
    for w in ("code", "copy"):
        for r in _read(w):
            it = items[r["prompt_id"].split("@")[0]]
            assert it.text.startswith(r["prompt"]) and not r["prompt"][-1].isspace()
            ids, full = tok(r["prompt"]).input_ids, tok(it.text).input_ids
            assert full[: len(ids)] == ids, f"{w}/{r['prompt_id']}: the prompt's last token is not the item's"
            checked += 1
    assert checked == 600
    with pytest.raises(ValueError, match="not a prefix"):
        token_boundary_prompt("abc", "abd")
    assert token_boundary_prompt("x = 1\n    y\n", "x = 1\n") == "x = 1"
