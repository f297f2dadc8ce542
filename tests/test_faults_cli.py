"""Fault cases at the command line (issue 24): each a one-line error and a nonzero exit, never a traceback, and
nothing pooled, printed raw or accepted out of range silently."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specbandit_cli import app
from bandit.logs.errors import InputError
from bandit.logs.reader import load_logs
from bandit.sim.simulate import SimConfig, write_sim_run
from harness.campaign.shards import CampaignError, parse_shard


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli") / "run"
    write_sim_run(SimConfig(n_prompts=4, out_len=24, seed=2), d)
    return d


def _one_line(res, *words):
    assert res.exit_code not in (0, None), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    err = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(w in err[0] for w in words), res.output


def test_a_drafter_named_twice_is_refused(run):
    _one_line(CliRunner().invoke(app, ["replay", str(run), "--drafters", "ngram,ngram", "--resamples", "0"]), "twice")


def test_an_empty_path_is_not_the_working_directory(run):
    res = CliRunner().invoke(app, ["validate", ""])
    assert res.exit_code == 1 and "empty path" in res.output and "valid:" not in res.output


@pytest.mark.parametrize("name", ["co\x1b[31mde", "a\x07b", "x\x9by"])
def test_control_characters_in_names_are_refused_escaped(tmp_path, name):
    rec = {
        "v": 1,
        "workload": name,
        "prompt_id": "p",
        "pos": 0,
        "drafts": {"a": {"tokens": [1], "accepted": 0, "conf": [0.5], "entropy": [0.1]}},
    }
    p = tmp_path / "blocks_x.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    with pytest.raises(InputError, match="control character") as e:
        load_logs([p])
    assert "\x1b" not in str(e.value) and "\x07" not in str(e.value)


@pytest.mark.parametrize("text", ["0/99999999999999999999", "0/65537", "-1/2", "2/2", "a/b", "1"])
def test_shards_out_of_range(text):
    with pytest.raises(CampaignError, match="expected I/N"):
        parse_shard(text)
