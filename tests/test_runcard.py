"""zoo/runcard.py: a campaign's card, its output gates recounted by brute force on the shipped zoo run and on
planted outputs (a looping workload fails the gate; a malformed line is one error line)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoo import runcard

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "runs" / "zoo-20261201-134938"


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    for f in ("manifest.json", "outputs.jsonl"):
        shutil.copyfile(ZOO / f, d / f)
    return d


def test_gates_match_a_brute_force_count(tmp_path):
    d = _copy(tmp_path)
    assert runcard.write(d, []) is True
    lines = [json.loads(x) for x in (ZOO / "outputs.jsonl").read_text().splitlines()]
    code = [x["output_ids"] for x in lines if x["workload"] == "code"]

    def loops(o):  # period p <= 4 repeated 4 times at the end, written out directly
        return any(len(o) >= 4 * p and o[-4 * p :] == o[-p:] * 4 for p in range(1, 5))

    card = (d / runcard.CARD).read_text()
    row = next(r for r in card.splitlines() if r.startswith("| code |"))
    assert row.split(" | ")[1] == str(len(code))
    assert row.split(" | ")[3] == f"{100 * sum(map(loops, code)) / len(code):.1f}%"
    assert "PASS: fewer than 10%" in card and "`zoo-target`" in card


def test_a_looping_campaign_fails_its_gate(tmp_path):
    d = _copy(tmp_path)
    lines = [json.loads(x) for x in (d / "outputs.jsonl").read_text().splitlines()]
    for x in lines[: len(lines) // 5]:  # a fifth of all outputs end in "a b a b a b a b"
        x["output_ids"] = x["output_ids"][:20] + [5, 6] * 4
    (d / "outputs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = subprocess.run([sys.executable, "-m", "zoo.runcard", str(d)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "FAILS" in r.stdout
    assert "FAIL: fewer than 10%" in (d / runcard.CARD).read_text()


@pytest.mark.parametrize("bad", ['{"workload": "code"}\n', "not json\n"])
def test_a_malformed_outputs_line_is_one_line(tmp_path, bad):
    d = _copy(tmp_path)
    with (d / "outputs.jsonl").open("a") as f:
        f.write(bad)
    r = subprocess.run([sys.executable, "-m", "zoo.runcard", str(d)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "outputs.jsonl:961" in r.stderr


def test_heads_of_another_run_are_refused(tmp_path):
    d = _copy(tmp_path)
    h = tmp_path / "heads"
    h.mkdir()
    (h / "README.md").write_text("# a card\n")
    (h / "training_info.json").write_text(json.dumps({"sha256": {"weights": "0" * 64}}))
    with pytest.raises(runcard.CardError, match="not any drafter's"):
        runcard.write(d, [h])


def test_a_runs_copy_of_a_card_names_no_machines_path(tmp_path):
    card = json.loads((REPO / "runs" / "smollm2-20261203" / "cards" / "eagle.json").read_text())
    card["target"]["path"] = "/somewhere/else/models/smollm2-135m-instruct"  # where a trainer's models root was
    card["command"] = card["command"].replace(
        card["command"].split("--models ")[1].split()[0], "/somewhere/else/models"
    )
    m = {"target": {"path": "models/smollm2-135m-instruct", "sha256": "t" * 64}}
    got = runcard.run_copy(card, "w" * 64, m)
    assert "/somewhere" not in json.dumps(got) and str(tmp_path) not in json.dumps(got)
    assert got["command"].startswith("python -m zoo.heads --models $SPECBANDIT_MODELS ")
    assert "--out $SPECBANDIT_MODELS/smollm2-heads" in got["command"]
    assert got["path"] == "$SPECBANDIT_MODELS/smollm2-heads/eagle"
    assert got["sha256"]["weights"] == "w" * 64 and got["target"] == {**card["target"], **m["target"]}
    assert got["heldout_acceptance"] == card["heldout_acceptance"]  # the numbers as the trainer measured them


def test_a_padded_live_phase_is_on_the_card():
    """A campaign whose live verifies ran padded (`kernels.verify_pad`) says so with the table and the times it was
    chosen from; one without padding (the zoo's) has no such line."""
    m = json.loads((REPO / "runs" / "smollm2-20261205b" / "manifest.json").read_text())
    pad = m["kernels"]["verify_pad"]
    line = [x for x in runcard.target_lines(m) if "padded" in x]
    assert len(line) == 1 and all(f"{q} as {p}" in line[0] for q, p in pad.items()) and pad
    assert all(f"{q}: {ms}" in line[0] for q, ms in m["kernels"]["pass_ms"].items())
    zoo = json.loads((ZOO / "manifest.json").read_text())
    assert not [x for x in runcard.target_lines(zoo) if "padded" in x]


def test_a_card_whose_run_only_resumed_says_steps_not_zero_seconds():
    """A trainer's card written by a run that found its training finished (`--stage eval`) has train_wall_s 0: the
    campaign card gives its steps, not "trained 0 s"; a card that trained says its time."""
    assert runcard._trained({"train_wall_s": 0.0, "resumed_at": 1600, "steps": 1600}).startswith("1600 steps")
    assert runcard._trained({"train_wall_s": 264.4, "resumed_at": 0, "steps": 1600}) == "264 s"
    assert runcard._trained({"train_wall_s": 0.0, "resumed_at": 0, "steps": 0}) == "0 s"
