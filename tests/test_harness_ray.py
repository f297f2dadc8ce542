"""`sweep.py --ray` on a real local Ray (two workers on the tiny models): the same records as one process, and a
worker killed mid-run ends in a complete, valid campaign. Skipped where Ray is not installed (the `ray` extra)."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import sweep
from harness.models.tiny import make_zoo, write_workload_file
from test_harness_shards import PROMPTS, assert_same_campaign

ray = pytest.importorskip("ray")
torch.set_num_threads(1)
REPO = Path(sweep.__file__).resolve().parent
SPECS = ["ngram=ngram", "suffix=suffix", "arctic=suffix:rule=arctic"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    z["specs"] = SPECS + [f"draft=draft:path={z['draft']}"]
    z["single"] = sweep.run_sweep(**_kw(z, root / "single"))
    return z


def _kw(z, out, **over):
    kw = dict(target=str(z["target"]), drafter=z["specs"], workload_file=str(z["wl"]), out=str(out), k=4)
    return {**kw, "max_new_tokens": 32, "quiet": True, "threads": 1, **over}  # one thread a process, as each worker


def test_sweep_on_ray_with_two_workers_equals_one_process(zoo, tmp_path):
    out = tmp_path / "ray"
    args = [sys.executable, str(REPO / "sweep.py"), "--ray", "--workers", "2", "--target", str(zoo["target"])]
    args += [
        "--workload-file",
        str(zoo["wl"]),
        "--out",
        str(out),
        "--k",
        "4",
        "--max-new-tokens",
        "32",
        "--threads",
        "1",
    ]
    for d in zoo["specs"]:
        args += ["--drafter", d]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)  # starts a Ray of its own
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_campaign(out, zoo["single"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["shards"] == 8 and sum(p["done"] for p in m["parts"].values()) == len(PROMPTS)
    workers = m["throughput"]["workers"].values()
    assert len(workers) == 2 and sum(w["prompts"] for w in workers) == len(PROMPTS)
    assert all(w["records_per_s"] > 0 for w in workers)
    assert m["target_check"]["prompts_checked"] == len(PROMPTS) and not list(out.glob("*.lock"))
    assert m["outputs"]["prompts"] == len(PROMPTS) and m["outputs"]["problems"] == 0  # every shard part's outputs
    single = (zoo["single"] / "outputs.jsonl").read_text().splitlines()
    assert sorted(x for f in out.glob("outputs-s*of8.jsonl") for x in f.read_text().splitlines()) == sorted(single)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # the sweep below joins it
    yield
    ray.shutdown()


def test_a_worker_killed_mid_run_ends_in_a_complete_campaign(zoo, cluster, tmp_path, capsys):
    out = tmp_path / "killed"
    killed = []

    def kill_one_worker_after_the_first_prompt():
        # only once a prompt is done: on a loaded machine the workers' loading alone can take minutes, and a kill
        # then would test a failed start instead (test_a_worker_that_cannot_load...); no progress, no kill
        deadline = time.time() + 900
        while not any(p.stat().st_size for p in out.glob("progress-*.jsonl")):
            if time.time() > deadline:
                return
            time.sleep(0.005)
        names = sorted(ray.util.list_named_actors())
        killed.append(names[0])
        ray.kill(ray.get_actor(names[0]))

    killer = threading.Thread(target=kill_one_worker_after_the_first_prompt, daemon=True)
    killer.start()
    sweep.run_sweep(**_kw(zoo, out, ray="local", workers=2))
    killer.join(timeout=5)
    assert killed, "no worker was killed"
    assert "goes back to the queue" in capsys.readouterr().err
    assert_same_campaign(out, zoo["single"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["target_check"]["prompts_checked"] == len(PROMPTS)
    assert m["outputs"]["prompts"] == len(PROMPTS) and m["outputs"]["problems"] == 0  # a re-run shard: one line each
    workers = m["throughput"]["workers"].values()
    assert sum(w.get("failures", 0) for w in workers) == 1 and sum(w["prompts"] for w in workers) == len(PROMPTS)


def test_a_worker_that_cannot_load_the_models_is_one_error_line(zoo, cluster, tmp_path):
    from harness.models.lm import HarnessError

    out = tmp_path / "bad"
    with pytest.raises(HarnessError, match="/nonexistent/model"):  # the worker's own error, not a dead actor
        sweep.run_sweep(**_kw(zoo, out, ray="local", workers=1, drafter=["d=draft:path=/nonexistent/model"]))
    assert not out.exists() and not ray.util.list_named_actors()  # nothing written, no actor left behind
