"""Shards of one campaign: `--shard I/N` sweeps write into one directory side by side, and their pooled records
are record for record the single process's; the suffix drafter's corpus; the locks between writers."""

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import sweep
from bandit.logs.reader import iter_records, load_logs
from harness.campaign import rundir, shards
from harness.models.lm import HarnessError
from harness.models.tiny import make_zoo, write_workload_file

torch.set_num_threads(1)
REPO = Path(sweep.__file__).resolve().parent
# ids chosen so that each of 2 shards holds prompts of both workloads (shards balance only up to chance)
PROMPTS = [("code", f"x{i}", f"def f{i}(x):\n    return x * {i} + {i}\n\ndef g{i}(y):\n") for i in range(5)] + [
    ("copy", f"xp{i}", f"{'abcdefg'[i:]} {'xyz' * i} {'abcdefg'[i:]} {'abcdefg'[i:]}") for i in range(5)
]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    # both suffix rules (their corpus is what sharding must not change), a lookup and a model drafter
    z["specs"] = ["ngram=ngram", "suffix=suffix", "arctic=suffix:rule=arctic", f"draft=draft:path={z['draft']}"]
    z["single"] = _run(z, root / "single")
    return z


def _kw(z, out, **over):
    kw = dict(
        target=str(z["target"]),
        drafter=z["specs"],
        workload_file=str(z["wl"]),
        out=str(out),
        k=4,
        max_new_tokens=24,
        quiet=True,
        threads=1,  # every process alike: a thread count changes the float sums, shards must equal one process
    )
    return {**kw, **over}


def _run(z, out, **over):
    return sweep.run_sweep(**_kw(z, out, **over))


def records(d: Path) -> list:
    """Every record of a run directory's blocks files, sorted: (workload, prompt, pos, drafts' tokens, accepted,
    conf, entropy)."""
    out = []
    for f in sorted(d.glob("blocks_*.jsonl")):
        for _, r in iter_records(f):
            drafts = {n: (x["tokens"], x["accepted"], x["conf"], x["entropy"]) for n, x in r["drafts"].items()}
            out.append((r["workload"], r["prompt_id"], r["pos"], drafts))
    return sorted(out, key=lambda r: r[:3])


def assert_same_campaign(a: Path, b: Path) -> None:
    """`load_logs` of both: the same table; and the raw records (tokens, accepted, conf, entropy) equal."""
    ta, tb = load_logs([a]), load_logs([b])
    assert ta.prompt_ids == tb.prompt_ids and ta.drafters == tb.drafters and ta.dense and tb.dense
    for col in ("pos", "accepted", "draft_len", "features"):
        np.testing.assert_array_equal(getattr(ta, col), getattr(tb, col), err_msg=col)
    assert records(a) == records(b)


def test_shards_are_deterministic_balanced_and_stable():
    keys = [(w, f"p{i}") for w in ("code", "math") for i in range(3000)]
    for n in (2, 3, 8):
        counts = Counter(shards.shard_of(w, p, n) for w, p in keys)
        assert set(counts) == set(range(n)) and max(counts.values()) < 1.1 * len(keys) / n, counts
    # a prompt's shard is a function of its own key: more prompts (a larger --limit) move none of the others
    assert [shards.shard_of(w, p, 4) for w, p in keys[:50]] == [shards.shard_of(w, p, 4) for w, p in keys[:50]]
    s = shards.parse_shard("1/3")
    assert (s.index, s.count, s.tag, str(s)) == (1, 3, "s1of3", "1/3")
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(shards.CampaignError, match="expected I/N"):
            shards.parse_shard(bad)


def test_two_shards_side_by_side_pool_to_the_single_process_run(zoo, tmp_path):
    out = tmp_path / "campaign"
    base = [sys.executable, str(REPO / "sweep.py"), "--target", str(zoo["target"]), "--workload-file", str(zoo["wl"])]
    base += ["--out", str(out), "--k", "4", "--max-new-tokens", "24", "--threads", "1"]
    for d in zoo["specs"]:
        base += ["--drafter", d]
    procs = [  # at the same time, into one directory: shards do not refuse each other
        subprocess.Popen(
            base + ["--shard", f"{i}/2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for i in range(2)
    ]
    texts = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], texts
    assert sorted(p.name for p in out.glob("blocks_*")) == ["blocks_dense-s0of2.jsonl", "blocks_dense-s1of2.jsonl"]
    assert not list(out.glob("*.lock"))  # every lock released
    assert_same_campaign(out, zoo["single"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["shards"] == 2 and m["n_prompts"] == len(PROMPTS)
    assert sum(p["done"] for p in m["parts"].values()) == len(PROMPTS) and set(m["parts"]) == {"s0of2", "s1of2"}
    workers = m["throughput"]["workers"]
    assert len(workers) == 2 and sum(w["prompts"] for w in workers.values()) == len(PROMPTS)
    assert m["target_check"]["prompts_checked"] == len(PROMPTS)
    assert m["drafters"]["suffix"]["settings"]["corpus"] == "prompt"  # the default of new runs, recorded
    # a shard run again finds its prompts done; the campaign stays complete
    _run(zoo, out, shard="0/2", resume=True)
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert_same_campaign(out, zoo["single"])


def test_shards_refuse_a_corpus_of_earlier_outputs_and_other_splits(zoo, tmp_path):
    with pytest.raises(HarnessError, match=r"corpus=run.*--shard"):
        _run(zoo, tmp_path / "a", shard="0/2", drafter=["n=ngram", "s=suffix:corpus=run"])
    assert not (tmp_path / "a").exists()
    out = tmp_path / "b"
    _run(zoo, out, shard="0/2", drafter=["n=ngram"], limit=2)
    m = json.loads((out / "manifest.json").read_text())
    assert "complete" not in m and m["shards"] == 2  # the other shard's prompts are missing
    with pytest.raises(HarnessError, match=r"split into 2 shards; give --shard I/2"):
        _run(zoo, out, shard="0/3", drafter=["n=ngram"], limit=2)
    with pytest.raises(HarnessError, match="already holds records of shard 0/2; add --resume"):
        _run(zoo, out, shard="0/2", drafter=["n=ngram"], limit=2)
    # the one-process sweep finishes what the shards left, into its own part
    _run(zoo, out, drafter=["n=ngram"], limit=2, resume=True)
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and len(load_logs([out]).prompt_ids) == 4


def test_suffix_corpus_new_runs_prompt_old_runs_keep_theirs(zoo, tmp_path, capsys):
    out = tmp_path / "old"
    _run(zoo, out, drafter=["s=suffix:corpus=run"], limit=1)  # recorded as before the setting: no corpus
    m = json.loads((out / "manifest.json").read_text())
    assert "corpus" not in m["drafters"]["s"]["settings"]
    capsys.readouterr()
    _run(zoo, out, drafter=["s=suffix"], limit=2, resume=True)  # resumes: the old run keeps corpus=run
    assert "keeps corpus=run" in capsys.readouterr().err
    assert "corpus" not in json.loads((out / "manifest.json").read_text())["drafters"]["s"]["settings"]
    with pytest.raises(HarnessError, match="'drafters' differs"):
        _run(zoo, out, drafter=["s=suffix:corpus=prompt"], limit=2, resume=True)


HOLD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from harness.campaign.rundir import RunDir
from harness.campaign.shards import parse_shard
out = Path(sys.argv[1])
rd = RunDir(out, json.loads((out / "manifest.json").read_text()), True, shard=parse_shard(sys.argv[2]))
print("locked", flush=True)
time.sleep(120)
"""


def test_locks_between_shards_and_whole_campaign_writers(zoo, tmp_path):
    out = tmp_path / "run"
    kw = dict(drafter=["n=ngram"], max_new_tokens=8)
    _run(zoo, out, shard="0/2", **kw)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(repo=str(REPO)), str(out), "0/2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(HarnessError, match="in use by another sweep") as e:  # the same shard: refused
            _run(zoo, out, shard="0/2", resume=True, **kw)
        msg = str(e.value)
        assert f"pid {holder.pid} on {socket.gethostname()}, started 20" in msg and "shard-s0of2.lock" in msg
        _run(zoo, out, shard="1/2", **kw)  # another shard of the campaign runs beside it
        with pytest.raises(HarnessError, match=f"in use by another sweep .shard s0of2: pid {holder.pid}"):
            _run(zoo, out, resume=True, **kw)  # a whole-campaign writer waits for no shard: refused
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    # the holder died holding its shard's lock: stale, taken over with a note
    assert shards.holder(out / "shard-s0of2.lock")["pid"] == holder.pid
    proc = subprocess.run(
        [sys.executable, str(REPO / "sweep.py"), "--target", str(zoo["target"]), "--workload-file", str(zoo["wl"])]
        + [
            "--drafter",
            "n=ngram",
            "--k",
            "4",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--shard",
            "0/2",
            "--resume",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"taking over a stale lock of pid {holder.pid}" in proc.stderr
    assert not (out / "shard-s0of2.lock").exists() and not (out / rundir.LOCK).exists()
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_the_single_process_path_imports_no_ray():
    code = "import sys, sweep, harness.campaign.worker, harness.campaign.rundir, harness.decode.livephase; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--shard", "2/2"], "expected I/N"),
        (["--workers", "2"], "applies to --ray only"),
        (["auto"], "only with --ray"),
        (["--shard", "0/2", "--calibrate", "1"], "--calibrate with --shard"),
    ],
)
def test_bad_campaign_options_are_one_line(zoo, tmp_path, args, message):
    out = tmp_path / "x"
    args = ["--target", zoo["target"], "--workload-file", zoo["wl"], "--drafter", "n=ngram", "--out", out, *args]
    res = CliRunner().invoke(sweep.app, [str(a) for a in args])
    text = (res.output or "") + (getattr(res, "stderr", "") or "")
    assert res.exit_code == 1 and message in text, text
    assert not out.exists()
