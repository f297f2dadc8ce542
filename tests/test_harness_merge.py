"""`specbandit merge` and moving runs: shards written to separate directories merge into the single process's
campaign; mixed campaigns and duplicate prompts are refused, named; a run copied to another path (its models
too) resumes there, because models are identified by the sha256 of their weights."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

import sweep
from bandit.logs.errors import boundary
from harness.campaign import merge
from harness.campaign.shards import CampaignError
from harness.models.tiny import make_zoo, write_workload_file
from test_harness_shards import PROMPTS, assert_same_campaign, records

torch.set_num_threads(1)
REPO = Path(sweep.__file__).resolve().parent


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    z = make_zoo(root / "models")
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    z["specs"] = ["ngram=ngram", "suffix=suffix", f"draft=draft:path={z['draft']}"]
    z["single"] = _run(z, root / "single")
    z["s0"] = _run(z, root / "s0", shard="0/2")  # each shard in a directory of its own (another host, say)
    z["s1"] = _run(z, root / "s1", shard="1/2")
    return z


def _run(z, out, **over):
    kw = dict(target=str(z["target"]), drafter=z["specs"], workload_file=str(z["wl"]), out=str(out), k=4)
    return sweep.run_sweep(**{**kw, "max_new_tokens": 16, "quiet": True, "threads": 1, **over})


def _merge_cli(*args):
    app = typer.Typer()
    app.command()(boundary(merge.merge))  # as specbandit_cli.py registers it
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res.exit_code, (res.output or "") + (getattr(res, "stderr", "") or "")


def test_shards_in_separate_directories_merge_into_the_single_run(zoo, tmp_path):
    out = tmp_path / "campaign"
    code, text = _merge_cli(zoo["s0"], zoo["s1"], "--out", out)
    assert code == 0, text
    assert f"merged {len(PROMPTS)} prompts" in text and "complete" in text
    assert_same_campaign(out, zoo["single"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["run"] == "campaign" and m["shards"] == 2
    assert m["target_check"]["prompts_checked"] == len(PROMPTS)
    assert len(m["throughput"]["workers"]) == 2  # one per shard's process
    assert not (out / "run.lock").exists()
    # a merged campaign is a run directory: resuming it finds every prompt done and changes no record
    before = records(out)
    _run(zoo, out, resume=True)
    assert records(out) == before and json.loads((out / "manifest.json").read_text())["complete"] is True


def test_merge_refuses_mixed_campaigns_and_duplicates(zoo, tmp_path):
    other = _run(zoo, tmp_path / "k3", shard="1/2", k=3)
    code, text = _merge_cli(zoo["s0"], other, "--out", tmp_path / "o1")
    assert code == 1 and f"{other}: another campaign than {zoo['s0']}: 'k' differs (4 vs 3)" in text, text
    copy = tmp_path / "copy"
    shutil.copytree(zoo["s0"], copy)
    code, text = _merge_cli(zoo["s0"], zoo["s1"], copy, "--out", tmp_path / "o2")
    assert code == 1 and "is in both" in text and "duplicate" in text and str(copy) in text, text
    with pytest.raises(CampaignError, match="not empty"):
        merge.merge([zoo["s0"]], zoo["s1"])
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_merge_imports_no_torch():
    code = "import sys; import harness.campaign.merge; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_a_run_copied_to_another_path_resumes_there(zoo, tmp_path, capsys):
    first = _run(zoo, tmp_path / "here" / "run", limit=1)  # one prompt per workload, then moved
    moved = tmp_path / "there" / "run"
    shutil.copytree(first, moved)
    models = tmp_path / "there" / "models"
    shutil.copytree(zoo["root"], models)  # the same weights, at another path
    specs = ["ngram=ngram", "suffix=suffix", f"draft=draft:path={models / 'draft'}"]
    capsys.readouterr()
    _run(zoo, moved, resume=True, target=str(models / "target"), drafter=specs)
    err = capsys.readouterr().err
    assert "the same weights, so the campaign continues" in err and str(models / "target") in err
    assert_same_campaign(moved, zoo["single"])
    m = json.loads((moved / "manifest.json").read_text())
    assert m["complete"] is True and m["target"]["path"] == str(models / "target")
    assert m["drafters"]["draft"]["settings"]["path"] == str(models / "draft")
