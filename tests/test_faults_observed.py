"""Fault cases of `specbandit import-vllm` and observed records (issue 24): one line and a nonzero exit, never a
traceback, an exhausted memory, a write through a symlink, a silent overwrite or a file left behind."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from specbandit_cli import app
from bandit.logs.observed import OBSERVED_NAME

GOOD = {
    "num_drafts": 10,
    "num_draft_tokens": 40,
    "num_accepted_tokens": 12,
    "num_accepted_tokens_per_pos": [5, 4, 2, 1],
}
PREFIX = "vllm:spec_decode_"


def _prom(counts=GOOD, extra: str = "") -> str:
    lines = [f"{PREFIX}{k}_total {v}" for k, v in counts.items() if not isinstance(v, list)]
    lines += [
        f'{PREFIX}num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
        for i, v in enumerate(GOOD["num_accepted_tokens_per_pos"])
    ]
    return "\n".join(lines) + "\n" + extra


def _run(*args):
    return CliRunner().invoke(app, ["import-vllm", *map(str, args), "--engine", "vllm test"])


def _ok_one_line(res, *words):
    assert res.exit_code != 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    err = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, res.output
    for w in words:
        assert w in err[0], err[0]


@pytest.mark.parametrize("value", ["1e400", "Infinity", "+Inf", "NaN", "-1", "2.5", "abc"])
def test_counter_values_out_of_range(tmp_path, value):
    m = tmp_path / "m.txt"
    m.write_text(_prom().replace(f"{PREFIX}num_drafts_total 10", f"{PREFIX}num_drafts_total {value}"))
    res = _run(m, "--out", tmp_path / "o")
    _ok_one_line(res, "m.txt")
    assert not (tmp_path / "o" / OBSERVED_NAME).exists()


@pytest.mark.parametrize("value", ["1e400", "Infinity", "NaN"])
def test_json_counter_values_out_of_range(tmp_path, value):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(GOOD).replace('"num_drafts": 10', f'"num_drafts": {value}'))
    _ok_one_line(_run(m, "--out", tmp_path / "o"), "num_drafts")


@pytest.mark.parametrize("pos", ["64", "1000000000", "20000000", "99999999999999999999"])
def test_position_beyond_the_limit_is_refused_at_once(tmp_path, pos):
    m = tmp_path / "m.txt"
    m.write_text(_prom(extra=f'{PREFIX}num_accepted_tokens_per_pos_total{{position="{pos}"}} 0\n'))
    _ok_one_line(_run(m, "--out", tmp_path / "o"), "position")


def test_the_same_labels_twice_are_refused(tmp_path):
    m = tmp_path / "m.txt"
    m.write_text(_prom(extra=f"{PREFIX}num_drafts_total 10\n"))
    _ok_one_line(_run(m, "--out", tmp_path / "o"), "second time")


def test_zero_drafts_writes_nothing(tmp_path):
    m = tmp_path / "m.json"
    zero = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": [0]}
    m.write_text(json.dumps(zero))
    _ok_one_line(_run(m, "--out", tmp_path / "o"), "no drafts")
    assert not (tmp_path / "o" / OBSERVED_NAME).exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_symlink_at_the_record_is_not_written_through(tmp_path, dangling):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(GOOD))
    out = tmp_path / "o"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("keep")
    os.symlink(victim, out / OBSERVED_NAME)
    _ok_one_line(_run(m, "--out", out), OBSERVED_NAME)
    assert (victim.read_text() == "keep") if not dangling else not victim.exists()


def test_an_existing_record_of_other_content_is_kept(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(GOOD))
    assert _run(m, "--out", tmp_path / "o").exit_code == 0
    assert _run(m, "--out", tmp_path / "o").exit_code == 0  # the same record again: nothing changes
    other = GOOD | {"num_drafts": 11}
    m.write_text(json.dumps(other))
    _ok_one_line(_run(m, "--out", tmp_path / "o"), "not replaced")
    assert json.loads((tmp_path / "o" / OBSERVED_NAME).read_text())["num_drafts"] == 10


@pytest.mark.parametrize("edit", [{"num_drafts": "lots"}, {"accepted_per_pos": [1e400]}, {"num_drafts": None}])
def test_hand_edited_record_is_refused_by_replay(tmp_path, edit):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(GOOD))
    assert _run(m, "--out", tmp_path / "o").exit_code == 0
    rec_path = tmp_path / "o" / OBSERVED_NAME
    rec = json.loads(rec_path.read_text()) | edit
    rec_path.write_text(json.dumps(rec).replace("1e400", "1e999"))
    res = CliRunner().invoke(app, ["replay", str(tmp_path / "o")])
    _ok_one_line(res)
