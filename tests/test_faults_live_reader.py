"""One live.jsonl reader (issue 35): what one command refuses, every command refuses, located by line.

The corrupted lines of the issue's fault campaign: a control character in a configuration's name, a `fixed:` drafter
the run does not have, a line marked same-as-dense with another token count, an absurdly small wall time, a prompt
length that differs between configurations or from outputs.jsonl, `calls`/`draft_ms` keys naming no drafter.
"""

from __future__ import annotations

import json

import pytest

from tests.test_faults_analysis import invoke, live_lines, live_run, one_line, write_live
from bandit.logs.reader import load_logs

READERS = ("ci", "wallclock", "breakeven")


CASES = [
    ("config", lambda r, t: r.update(config="fixed:" + t.drafters[0] + "\x1b[2J"), ("config", "control")),
    ("config", lambda r, t: r.update(config="fixed:nosuch", calls={}, draft_ms={}), ("config", "no drafter")),
    ("tokens", lambda r, t: r.update(tokens=r["tokens"] - 1), ("tokens", "dense log")),
    ("wall_ms", lambda r, t: r.update(wall_ms=1e-300), ("wall_ms", "a target pass")),
    ("prompt_len", lambda r, t: r.update(prompt_len=5), ("prompt_len", "7 tokens")),
    ("calls", lambda r, t: r.update(calls={**r["calls"], "ghost": 1}), ("calls", "ghost")),
    ("draft_ms", lambda r, t: r.update(draft_ms={**r["draft_ms"], "ghost": 1.0}), ("draft_ms", "ghost")),
]


@pytest.mark.parametrize("cmd", READERS)
@pytest.mark.parametrize("field, edit, words", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_reader_refuses_the_same_corrupt_line(tmp_path, cmd, field, edit, words):
    d = live_run(tmp_path / "r")
    t = load_logs([d])
    lines = live_lines(t)
    # a configuration's name is edited on every prompt (each prompt needs every configuration), a count on one line
    hit = [i for i, r in enumerate(lines) if r["config"] == lines[4]["config"]] if field == "config" else [4]
    for i in hit:
        edit(lines[i], t)
    write_live(d, lines)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    err = one_line(invoke(cmd, d, "--resamples", "20"), 1, *words)
    assert f":{hit[0] + 1}: {field}" in err
    assert "\x1b" not in err  # a control character is never printed raw
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing lost


def test_the_prompt_length_is_checked_against_outputs_jsonl(tmp_path):
    d = live_run(tmp_path / "r")
    t = load_logs([d])
    lines = live_lines(t)
    wl, pid = lines[0]["workload"], lines[0]["prompt_id"]
    (d / "outputs.jsonl").write_text(json.dumps({"workload": wl, "prompt_id": pid, "prompt_ids": [1] * 185}) + "\n")
    write_live(d, lines)  # every configuration says 7: they agree with one another, not with the prompt
    one_line(invoke("wallclock", d, "--resamples", "20"), 1, ":1: prompt_len", "185 tokens")
    for r in lines:
        if (r["workload"], r["prompt_id"]) == (wl, pid):
            r["prompt_len"] = 185
    write_live(d, lines)
    assert invoke("wallclock", d, "--resamples", "20").exit_code == 0
