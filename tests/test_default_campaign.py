"""The default input is exactly one complete run; outputs go beside the run they describe; a manifest must
describe its own directory's logs; a run still in progress is read with a note."""

import json
import shutil

import pytest

from bandit import ci
from bandit.logs.reader import LogError, default_campaign, load_logs, output_path
from bandit.sim.simulate import SimConfig, write_sim_run


def _measured(d, created, complete=True):
    m = json.loads((d / "manifest.json").read_text())
    m.update(label="MEASURED", created=created)
    m.pop("complete", None)
    if complete:
        m["complete"] = True
    (d / "manifest.json").write_text(json.dumps(m))
    return d


@pytest.fixture()
def root(tmp_path):
    a = tmp_path / "runs" / "a"
    write_sim_run(SimConfig(n_prompts=3, out_len=24, seed=1), a)
    shutil.copytree(a, tmp_path / "runs" / "scratch" / "b")  # same campaign key, as a user's scratch run
    _measured(a, "2026-01-01T00:00:00Z")
    _measured(tmp_path / "runs" / "scratch" / "b", "2026-02-01T00:00:00Z")
    return tmp_path / "runs"


def test_default_is_the_newest_complete_run_alone_never_pooled(root):
    d, files, said = default_campaign(root)
    assert d == root / "scratch" / "b" and all(f.parent == d for f in files) and "[MEASURED]" in said
    load_logs(files)  # one run: no duplicate records, whatever else lies under runs/


def test_an_incomplete_run_is_skipped_and_named(root, capsys):
    _measured(root / "scratch" / "b", "2026-02-01T00:00:00Z", complete=False)
    d, files, said = default_campaign(root)
    assert d == root / "a" and "incomplete, not read" in said and str(root / "scratch" / "b") in said
    load_logs([root / "scratch" / "b"])  # read when named, with a note
    assert "incomplete run" in capsys.readouterr().err


def test_outputs_go_beside_the_run_and_the_other_run_is_untouched(root):
    shipped = root / "a" / "ci.json"
    ci.main([root / "a"])  # every option at its default: only then beside the run (issue 24)
    before = shipped.read_bytes()
    text = ci.main([root / "scratch" / "b"])
    assert (root / "scratch" / "b" / "ci.json").exists() and f"wrote {root / 'scratch' / 'b' / 'ci.json'}" in text
    assert shipped.read_bytes() == before
    assert output_path([root / "a", root / "scratch" / "b"], "ci.json") is None  # pooled: printed only


def test_a_manifest_must_name_the_drafters_of_its_logs(root):
    m = json.loads((root / "a" / "manifest.json").read_text())
    m["drafters"] = {"ngram": m["drafters"]["ngram"]}
    (root / "a" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LogError, match=r"manifest.json:0: manifest.drafters: names \['ngram'\], but the logs hold"):
        load_logs([root / "a"])


def test_a_manifest_is_read_only_from_the_logs_own_directory(root):
    sub = root / "a" / "sub"
    sub.mkdir()
    shutil.move(next((root / "a").glob("blocks_*")), sub)
    t = load_logs([sub])
    assert t.label == "UNLABELLED" and t.manifests == ()  # the parent's manifest describes another directory


def test_a_dense_log_missing_a_record_is_an_error_not_silently_sparse(tmp_path):
    d = tmp_path / "run"
    write_sim_run(SimConfig(n_prompts=2, out_len=20, seed=3), d, gz=False)
    f = next(d.glob("blocks_*"))
    lines = f.read_text().splitlines()
    gone = json.loads(lines[5])
    f.write_text("\n".join(lines[:5] + lines[6:]) + "\n")
    with pytest.raises(
        LogError,
        match=rf"manifest says dense, but prompt {gone['workload']}/{gone['prompt_id']} "
        rf"has no record at position {gone['pos']}",
    ):
        load_logs([d])


def test_a_name_with_a_lone_surrogate_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "run"
    write_sim_run(SimConfig(n_prompts=2, out_len=10, seed=3), d, gz=False)
    f = next(d.glob("blocks_*"))
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    pid = recs[0]["prompt_id"]
    for r in recs:
        if r["prompt_id"] == pid:
            r["prompt_id"] = "x\ud800"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))  # json.dumps writes it as the escape \\ud800
    with pytest.raises(LogError, match=r"blocks_sim.jsonl:0: prompt_id: name .* is not valid Unicode"):
        load_logs([d])


def test_deep_nesting_is_a_located_error(tmp_path):
    (tmp_path / "blocks_x.jsonl").write_text(
        '{"v":1,"workload":"w","prompt_id":"p","pos":0,"drafts":{"a":{"tokens":' + "[" * 100000 + "]" * 100000 + "}}}\n"
    )
    with pytest.raises(LogError, match=r"blocks_x.jsonl:1: line: nested too deeply"):
        load_logs([tmp_path])


def test_large_integers_survive_every_reader_exactly(tmp_path):
    from bandit.logs.reader import load_logs_reference

    recs = [
        {
            "v": 1,
            "workload": "w",
            "prompt_id": "p",
            "pos": 3 * i,
            "block": b,
            "drafts": {"a": {"tokens": [1, 2], "accepted": 1, "conf": [0.5, 0.5], "entropy": [0.1, 0.1]}},
        }
        for i, b in enumerate([2**53 + 1, 2**53 + 2, 2**62 + 1])
    ]
    (tmp_path / "blocks_x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    want = [2**53 + 1, 2**53 + 2, 2**62 + 1]
    assert [int(x) for x in load_logs([tmp_path]).block] == want  # the bulk path, not via float64
    assert [int(x) for x in load_logs_reference([tmp_path]).block] == want


def test_the_published_campaign_is_the_default_and_latest_the_newest(root, monkeypatch):
    """With no paths, the run paper/campaign.txt names (issue 24): a newer complete run is read only when asked
    for with --latest (`latest=True`) or named; a campaign.txt naming no complete run falls back to the newest."""
    from bandit.logs import reader as logs

    repo = root.parent
    (repo / "paper").mkdir()
    monkeypatch.setattr(logs, "REPO", repo)
    monkeypatch.setattr(logs, "PUBLISHED", repo / "paper" / "campaign.txt")
    monkeypatch.chdir(repo)
    logs.PUBLISHED.write_text("runs/a\n")
    d, files, said = default_campaign()
    assert str(d) == "runs/a" and "published campaign, paper/campaign.txt" in said
    d, _, said = default_campaign(latest=True)
    assert str(d) == "runs/scratch/b" and "newest complete" in said
    _measured(root / "a", "2026-01-01T00:00:00Z", complete=False)  # the published run unfinished: not read
    assert str(default_campaign()[0]) == "runs/scratch/b"
    logs.PUBLISHED.write_text("runs/nowhere\n")
    assert str(default_campaign()[0]) == "runs/scratch/b"
