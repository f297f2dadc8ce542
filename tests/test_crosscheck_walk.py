"""bench/vllm_walk.py (vLLM's walk and its end effect, modelled) and `import-vllm --outputs` (bandit/logs/observed.py's
end correction), on hand-worked and random streams; no vLLM needed (the vllm tier compares them with vLLM itself).

Reference: vLLM's rule replayed along the output and the target's continuation past its end (`replay_vllm_rule`,
which knows nothing of dense logs) must equal the dense log walked with the end modelled (`walk_dense`), and the
dense log's own counts (drafts cut to the budget, acceptance within the output) must equal what the end correction
makes of vLLM's counters."""

import json
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.vllm_walk import (
    common_prefix,
    compare_prompts,
    model_walk,
    per_position,
    replay_vllm_rule,
    request_steps,
    vllm_ngram_draft,
    walk_dense,
)

from bandit.logs.errors import InputError
from bandit.logs.observed import end_correction, import_vllm

RULE = {"k": 4, "n_min": 1, "n_max": 3}
SETTINGS = {"method": "ngram", "k": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def dense_rows(prompt, y, k, max_new, rule=RULE):
    """A dense log by brute force: at every position vLLM's rule cut to the budget, accepted within y."""
    rows = []
    for pos in range(len(y)):
        d = vllm_ngram_draft(prompt + y[:pos], rule["n_min"], rule["n_max"], max(0, min(k, max_new - 1 - pos)))
        rows.append((d, common_prefix(d, y[pos:])))
    return rows


def stream(rng, eos_early: bool):
    """prompt, output y, the target's continuation past y (through the EOS), max_tokens."""
    vocab = rng.randrange(2, 5)
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))]
    long = [rng.randrange(vocab) for _ in range(rng.randrange(8, 30))]
    if rng.random() < 0.5:  # a repeated span: long drafts, runs to the end
        long = (long[:3] * 12)[: len(long)]
    cut = rng.randrange(2, len(long) - 4)
    y, cont = long[:cut], long[cut:]
    M = cut + rng.randrange(1, 6) if eos_early else cut  # EOS-ended outputs are shorter than max_tokens
    return prompt, y, y + cont, M


def test_hand_worked_end_effect():
    prompt, y, cont = [1, 2, 3, 4, 1], [2, 3, 4, 1, 2], [3, 9]
    rows = dense_rows(prompt, y, 4, 5)
    # pos 1: context 1 2 3 4 1 2 -> the earliest "1 2" (at 0) -> drafts 3 4 1 2, cut to the budget 5 - 1 - 1 = 3
    assert rows[1] == ([3, 4, 1], 3)

    def full(pos):
        return vllm_ngram_draft(prompt + y[:pos], 1, 3, 4)

    counted, within = walk_dense(rows, y, 4, 5, full, lambda pos, d: (y + cont)[pos:][: len(d) + 1])
    assert within == [(1, 3, 3)]  # the output's last token is the bonus token: 3 accepted within it
    assert counted == [(1, 4, 4)]  # vLLM drafts 4, and counts the last output token as an accepted draft token
    assert replay_vllm_rule(prompt, y, y + cont, RULE) == [(4, 4)]
    # one token shorter an output (max_tokens 4): the 4th draft token runs past it, and the target accepts it
    rows = dense_rows(prompt, y[:4], 4, 4)
    counted, within = walk_dense(rows, y[:4], 4, 4, full, lambda pos, d: (y + cont)[pos:][: len(d) + 1])
    assert within == [(1, 2, 2)] and counted == [(1, 4, 4)]


@pytest.mark.parametrize("eos_early", [False, True])
def test_dense_walk_with_the_end_modelled_equals_vllms_rule_replayed(eos_early):
    rng = random.Random(int(eos_early))
    end_seen = 0
    for _ in range(300):
        prompt, y, y_long, M = stream(rng, eos_early)
        rows = dense_rows(prompt, y, RULE["k"], M)

        def full(pos):
            return vllm_ngram_draft(prompt + y[:pos], 1, 3, RULE["k"])

        counted, within = walk_dense(rows, y, RULE["k"], M, full, lambda pos, d: y_long[pos : pos + len(d) + 1])
        ref = replay_vllm_rule(prompt, y, y_long, RULE)
        assert [(dl, a) for _, dl, a in counted] == ref
        # within the output: the log's own values at the same block starts
        assert within == [(p, len(rows[p][0]), rows[p][1]) for p, _, _ in within]
        mw, _ = model_walk(full, y, lambda pos, d: y_long[pos : pos + len(d) + 1])
        assert mw == counted  # a drafter called at each block start walks the same blocks
        end_seen += counted != within
    assert end_seen > 30  # the end effect occurs often on these streams: the comparison is not vacuous


def test_model_walk_tail_is_what_the_last_step_verified_past_the_end():
    y, long = [5, 6, 5, 6], [5, 6, 5, 6, 5, 7, 8]
    blocks, tail = model_walk(lambda pos: [6, 5, 6, 5][:4], y, lambda pos, d: long[pos : pos + len(d) + 1])
    # pos 1: 6 5 6 consume y[1:]; then 5 (y_long[4]) is accepted past the end and 7 is the bonus
    assert blocks == [(1, 4, 4)] and tail == [5, 7]


def test_request_steps_and_compare():
    assert request_steps({"per_step_drafted": [4, 0, 3], "per_step_accepted": [2, 0, 3]}) == [(4, 2), (3, 3)]
    with pytest.raises(ValueError):
        request_steps(None)
    cmp = compare_prompts({"a": [(4, 2), (3, 3)], "b": [(4, 1)]}, {"a": [(1, 4, 2), (4, 3, 3)], "b": [(1, 4, 2)]}, 4)
    assert cmp["zero_gap"] == 1 and cmp["by_prompt"]["b"]["first_different_step"] == 0
    assert cmp["by_prompt"]["b"]["gap"]["accepted_per_pos"] == [0, -1, 0, 0]
    assert per_position([(1, 4, 2), (4, 0, 0)], 4)["drafts"] == 1  # an empty draft is no draft


# --------------------------------------------------------------------------------- import-vllm --outputs
def _requests(seed: int, n: int = 30):
    rng = random.Random(seed)
    reqs, raw, within = [], [], []
    for i in range(n):
        prompt, y, y_long, M = stream(rng, eos_early=i % 2 == 1)
        rows = dense_rows(prompt, y, 4, M)
        counted, w = walk_dense(
            rows,
            y,
            4,
            M,
            lambda pos: vllm_ngram_draft(prompt + y[:pos], 1, 3, 4),
            lambda pos, d: y_long[pos:][: len(d) + 1],
        )
        raw += counted
        within += w
        steps = [[dl, a] for _, dl, a in counted]
        reqs.append({"prompt_token_ids": prompt, "output_token_ids": y, "max_tokens": M, "steps": steps})
    return reqs, per_position(raw, 4), per_position(within, 4)


def _counters(pp):
    return {
        "num_drafts": pp["drafts"],
        "num_draft_tokens": pp["draft_tokens"],
        "num_accepted_tokens": sum(pp["accepted_per_pos"]),
        "accepted_per_pos": pp["accepted_per_pos"],
    }


def _write(tmp_path, reqs, name="out.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return p


def test_end_correction_gives_the_dense_logs_counts(tmp_path):
    reqs, raw, within = _requests(3)
    assert raw != within
    got, extra = end_correction(_counters(raw), _write(tmp_path, reqs), SETTINGS)
    assert got == _counters(within)
    assert extra["post_end"]["num_draft_tokens"] == raw["draft_tokens"] - within["draft_tokens"] > 0
    # without the per-request steps: the same (vLLM's aggregate counters alone)
    bare = [{k: v for k, v in r.items() if k != "steps"} for r in reqs]
    assert end_correction(_counters(raw), _write(tmp_path, bare, "b.jsonl"), SETTINGS)[0] == got


def test_end_correction_refusals(tmp_path):
    reqs, raw, _ = _requests(4)
    path = _write(tmp_path, reqs)
    m = _counters(raw)
    with pytest.raises(InputError, match="only ngram"):
        end_correction(m, path, SETTINGS | {"method": "suffix"})
    with pytest.raises(InputError, match="drafts of"):
        end_correction(m, _write(tmp_path, reqs[1:], "short.jsonl"), SETTINGS)  # another set of requests
    with pytest.raises(InputError, match="prompt_lookup_max"):
        end_correction(m, path, {"method": "ngram", "k": 4, "prompt_lookup_min": 1})
    bad = [dict(r) for r in reqs]
    bad[0]["steps"] = [[s[0] + 1, s[1]] for s in bad[0]["steps"]] or [[1, 1]]  # another draft length
    with pytest.raises(InputError, match="steps are not"):
        end_correction(m, _write(tmp_path, bad, "bad.jsonl"), SETTINGS)
    more = dict(m, accepted_per_pos=[m["accepted_per_pos"][0] + 1] + m["accepted_per_pos"][1:])
    more["num_accepted_tokens"] += 1
    with pytest.raises(InputError, match="cannot be"):
        end_correction(more, _write(tmp_path, [{k: v for k, v in r.items() if k != "steps"} for r in reqs]), SETTINGS)
    for line in ("[1]", '{"prompt_token_ids": [], "output_token_ids": [], "max_tokens": 4}', "{"):
        (tmp_path / "x.jsonl").write_text(line + "\n")
        with pytest.raises(InputError):
            end_correction(m, tmp_path / "x.jsonl", SETTINGS)


def test_import_vllm_outputs_record_and_cli(tmp_path):
    from specbandit_cli import app

    reqs, raw, within = _requests(5)
    metrics = tmp_path / "m.json"
    metrics.write_text(
        json.dumps({"metrics": _counters(raw) | {"num_accepted_tokens_per_pos": raw["accepted_per_pos"]}})
    )
    outs = _write(tmp_path, reqs)
    rec = json.loads(import_vllm(metrics, tmp_path / "obs", {"engine": "vllm 0.32.0 cpu"} | SETTINGS, outs).read_text())
    assert rec["counted"] == "within the output" and rec["num_drafts"] == within["drafts"]
    assert rec["as_counted"]["num_drafts"] == raw["drafts"]
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    r = CliRunner().invoke(
        app,
        ["import-vllm", str(metrics), "--out", str(tmp_path / "o2"), "--engine", "e", *sets, "--outputs", str(outs)],
    )
    assert r.exit_code == 0, r.output
    assert "vLLM also counted past them" in r.output
