"""A sweep killed with SIGKILL and resumed gives exactly the records of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sweep
from bandit.logs.reader import load_logs
from harness.models.lm import HarnessError
from harness.models.tiny import make_zoo, write_workload_file

torch.set_num_threads(1)
REPO = Path(sweep.__file__).resolve().parent
PROMPTS = [("code", f"c{i}", f"def f{i}(x):\n    return x * {i} + {i}\n\ndef g{i}(y):\n") for i in range(8)] + [
    ("copy", f"p{i}", f"{'abcdefg'[i:]} {'xyz' * i} {'abcdefg'[i:]}") for i in range(4)
]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    z["specs"] = [s for s in z["specs"] if not s.startswith(("eagle", "medusa"))]
    z["specs"].append("srun=suffix:corpus=run")  # state carried across prompts (earlier outputs) matters here
    return z


def _args(z, out):
    a = [
        "--target",
        str(z["target"]),
        "--workload-file",
        str(z["wl"]),
        "--out",
        str(out),
        "--k",
        "4",
        "--max-new-tokens",
        "48",
    ]
    for d in z["specs"]:
        a += ["--drafter", d]
    return a


def _run(z, out, resume=False):
    return sweep.run_sweep(
        target=str(z["target"]),
        drafter=z["specs"],
        workload_file=str(z["wl"]),
        out=str(out),
        k=4,
        max_new_tokens=48,
        resume=resume,
        quiet=True,
    )


def test_sigkill_then_resume_equals_uninterrupted(zoo, tmp_path):
    ref = _run(zoo, tmp_path / "ref") / "blocks_dense.jsonl"
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "sweep.py")] + _args(zoo, out),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    progress = out / "progress.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if progress.exists() and len(progress.read_text().splitlines()) >= 2:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(progress.read_text().splitlines())
    assert 2 <= done < len(PROMPTS), "the kill did not land mid-sweep"
    # a write torn by the kill: a partial record after the last finished prompt
    with open(out / "blocks_dense.jsonl", "ab") as fh:
        fh.write(b'{"v":1,"workload":"code","prompt_id":"c9","pos":0,"dra')
    with open(progress, "ab") as fh:  # and a progress line torn in the middle: that prompt is not finished
        fh.write(b'{"workload":"code","prompt_id":"c9","end":99')
    with pytest.raises(HarnessError, match="--resume"):
        _run(zoo, out)  # an existing run is never overwritten silently
    _run(zoo, out, resume=True)
    assert (out / "blocks_dense.jsonl").read_bytes() == ref.read_bytes()
    assert len(load_logs([out]).prompt_ids) == len(PROMPTS)
    # resuming a finished run does nothing and changes nothing
    _run(zoo, out, resume=True)
    assert (out / "blocks_dense.jsonl").read_bytes() == ref.read_bytes()


def test_resume_refuses_a_different_campaign(zoo, tmp_path):
    out = tmp_path / "r"
    sweep.run_sweep(
        target=str(zoo["target"]),
        drafter=["n=ngram"],
        workload_file=str(zoo["wl"]),
        out=str(out),
        k=4,
        max_new_tokens=8,
        limit=1,
        quiet=True,
    )
    with pytest.raises(HarnessError, match="'k'"):
        sweep.run_sweep(
            target=str(zoo["target"]),
            drafter=["n=ngram"],
            workload_file=str(zoo["wl"]),
            out=str(out),
            k=5,
            max_new_tokens=8,
            limit=1,
            resume=True,
            quiet=True,
        )
    m = json.loads((out / "manifest.json").read_text())
    assert m["k"] == 4
