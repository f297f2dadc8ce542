"""bench/layerskip.py's table from a planted run: acceptance from the dense log, cost and speedup from live.jsonl,
each recomputed here by hand."""

import json

import pytest

from bench import layerskip


def _live(config, tokens, wall_ms, passes, verify_ms, calls=None, draft_ms=None):
    return dict(config=config, tokens=tokens, wall_ms=wall_ms, passes=passes, verify_ms=verify_ms,
                calls=calls or {}, draft_ms=draft_ms or {})  # fmt: skip


def test_the_table_matches_a_hand_count(tmp_path):
    blocks = [
        {"drafts": {"ls4": {"accepted": 1}, "ls8": {"accepted": 3}}},
        {"drafts": {"ls4": {"accepted": 0}, "ls8": {"accepted": 2}}},
        {"drafts": {"ls4": {"accepted": 2}, "ls8": {"accepted": 4}}},
    ]
    (tmp_path / "blocks_dense-s0of2.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blocks[:2]))
    (tmp_path / "blocks_dense-s1of2.jsonl").write_text(json.dumps(blocks[2]) + "\n")
    live = [
        _live("plain", 100, 1000.0, 100, 900.0),  # a plain step: 9 ms
        _live("plain", 50, 500.0, 50, 450.0),
        _live("fixed:ls4", 150, 1200.0, 90, 800.0, {"ls4": 90}, {"ls4": 270.0}),
        _live("fixed:ls8", 150, 1000.0, 50, 500.0, {"ls8": 50}, {"ls8": 300.0}),
    ]
    (tmp_path / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live))
    rows = {r["layers"]: r for r in layerskip.table(tmp_path, [4, 8])}
    assert rows[4]["mean_accepted"] == pytest.approx(1.0) and rows[8]["mean_accepted"] == pytest.approx(3.0)
    assert rows[4]["tokens_per_pass"] == pytest.approx(150 / 90) and rows[8]["tokens_per_pass"] == pytest.approx(3.0)
    assert rows[4]["draft_ms_per_call"] == pytest.approx(3.0) and rows[8]["call_over_plain_step"] == pytest.approx(
        6 / 9
    )
    plain = 150 / 1500.0
    assert rows[4]["speedup_over_plain"] == pytest.approx((150 / 1200) / plain)
    assert rows[8]["speedup_over_plain"] == pytest.approx((150 / 1000) / plain)
