"""Faults around the run directory: a second sweep into a locked run, writes through planted
symlinks, --resume pitfalls, and resumes whose record-changing settings differ."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import sweep
from harness.campaign import preflight, rundir
from harness.models.lm import HarnessError
from harness.models.tiny import make_zoo, write_workload_file

torch.set_num_threads(1)
REPO = Path(sweep.__file__).resolve().parent


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl")
    return z


def _kw(z, out, **over):
    kw = dict(
        target=str(z["target"]),
        drafter=["n=ngram"],
        workload_file=str(z["wl"]),
        out=None if out is None else str(out),
        k=4,
        max_new_tokens=8,
        quiet=True,
    )
    kw.update(over)
    return kw


def _run(z, out, **over):
    return sweep.run_sweep(**_kw(z, out, **over))


def _cli(args):
    res = CliRunner().invoke(sweep.app, [str(a) for a in args])
    out = res.output or ""
    try:
        err = res.stderr or ""
    except ValueError:  # an older click: stderr is mixed into output
        err = ""
    return res.exit_code, out if err in out else out + err


def _cli_args(z, out, *extra):
    return [
        "--target",
        z["target"],
        "--workload-file",
        z["wl"],
        "--drafter",
        "n=ngram",
        "--k",
        "4",
        "--max-new-tokens",
        "8",
        *(["--out", out] if out is not None else []),
        *extra,
    ]


def _snapshot(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.is_symlink()}


def _one_error_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ---- 1. the lock ----

HOLD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from harness.campaign.rundir import RunDir
out = Path(sys.argv[1])
rd = RunDir(out, json.loads((out / "manifest.json").read_text()), True)
print("locked", flush=True)
time.sleep(120)
"""


def test_second_sweep_is_refused_while_the_first_holds_the_lock(zoo, tmp_path):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    assert not (out / rundir.LOCK).exists()  # released at the end of the sweep
    before = _snapshot(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(repo=str(REPO)), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, text = _cli(_cli_args(zoo, out, "--resume", "--limit", "2"))
        assert code == 1, text  # an input problem (bandit.errors.EXIT_INPUT)
        line = _one_error_line(text)
        assert "in use by another sweep" in line and f"pid {holder.pid}" in line and socket.gethostname() in line
        with pytest.raises(HarnessError, match="in use by another sweep"):
            rundir.RunDir(out, json.loads((out / "manifest.json").read_text()), True)
        after = _snapshot(out)
        assert after.pop(rundir.LOCK) and {k: v for k, v in before.items()} == after  # nothing else touched
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    # the holder died without releasing: its lock file is stale and is taken over, with a note
    assert json.loads((out / rundir.LOCK).read_text())["pid"] == holder.pid
    code, text = _cli(_cli_args(zoo, out, "--resume", "--limit", "2"))
    assert code == 0, text
    assert f"taking over a stale lock of pid {holder.pid}" in text
    assert len((out / "progress.jsonl").read_text().splitlines()) == 4  # --limit is per workload
    assert not (out / rundir.LOCK).exists()


def test_stale_lock_file_of_a_dead_pid_is_taken_over(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / rundir.LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}) + "\n")
    _run(zoo, out, limit=1)
    err = capsys.readouterr().err
    notes = [x for x in err.splitlines() if "lock" in x]
    assert len(notes) == 1 and f"taking over a stale lock of pid {dead.pid}" in notes[0], err
    assert not (out / rundir.LOCK).exists()


def test_lock_released_on_error_and_on_keyboard_interrupt(zoo, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    with pytest.raises(HarnessError, match="max_new_tokens"):
        _run(zoo, out, limit=2, resume=True, max_new_tokens=9)
    assert not (out / rundir.LOCK).exists()

    def interrupted(self, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.RunDir, "append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(zoo, out, limit=2, resume=True)
    assert not (out / rundir.LOCK).exists()
    with pytest.raises(KeyboardInterrupt):
        _run(zoo, tmp_path / "new", limit=1)
    assert not (tmp_path / "new" / rundir.LOCK).exists()


# ---- 2. no writes through symlinks ----


def test_run_directory_that_is_a_symlink_is_refused(zoo, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "progress.jsonl").write_text("precious\n")
    link = tmp_path / "link"
    link.symlink_to(victim, target_is_directory=True)
    for extra in ([], ["--resume"]):
        code, text = _cli(_cli_args(zoo, link, "--limit", "1", *extra))
        assert code == 1 and "symlink" in _one_error_line(text), text
        assert sorted(p.name for p in victim.iterdir()) == ["progress.jsonl"]
        assert (victim / "progress.jsonl").read_text() == "precious\n"


@pytest.mark.parametrize(
    "name",
    ["progress.jsonl", "blocks_dense.jsonl", "manifest.json", "manifest.json.tmp", "run.lock", "blocks_sparse.jsonl"],
)
@pytest.mark.parametrize("resume", [False, True])
def test_planted_file_symlinks_are_refused(zoo, tmp_path, name, resume):
    out = tmp_path / "run"
    if resume:
        _run(zoo, out, limit=1)
        (out / name).unlink(missing_ok=True)
    else:
        out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / name).symlink_to(victim)
    code, text = _cli(_cli_args(zoo, out, "--limit", "2", *(["--resume"] if resume else [])))
    assert code == 1, text  # an input problem (bandit.errors.EXIT_INPUT)
    line = _one_error_line(text)
    assert "symlink" in line and name in line
    assert victim.read_text() == "precious\n"
    assert not (out / rundir.LOCK).exists() or name == "run.lock"


def test_writers_do_not_follow_symlinks(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "m.json.tmp").symlink_to(victim)
    rundir._atomic_write(tmp_path / "m.json", "{}\n")  # a planted temporary is removed, not written through
    assert victim.read_text() == "precious\n" and (tmp_path / "m.json").read_text() == "{}\n"
    (tmp_path / "a.jsonl").symlink_to(victim)
    with pytest.raises(HarnessError, match="symlink"):
        rundir._open_append(tmp_path / "a.jsonl")
    with pytest.raises(HarnessError, match="symlink"):
        rundir._write_bytes(tmp_path / "a.jsonl", b"")
    assert victim.read_text() == "precious\n"


# ---- 3. --resume pitfalls ----


def test_resume_without_out_continues_the_newest_incomplete_run(zoo, tmp_path, capsys):
    root = tmp_path / "runs"
    with pytest.raises(HarnessError, match="nothing to continue"):
        _run(zoo, None, resume=True, runs_root=root, limit=2)
    old = _run(zoo, root / "old", limit=1)
    time.sleep(1.1)  # manifests record the creation time to the second
    newer = _run(zoo, root / "newer", limit=1)
    time.sleep(1.1)
    _run(zoo, root / "complete", limit=2)  # the newest, but it has all of this command's prompts
    capsys.readouterr()
    got = _run(zoo, None, resume=True, runs_root=root, limit=2)
    assert got == newer and f"continuing {newer}" in capsys.readouterr().err
    assert len((newer / "progress.jsonl").read_text().splitlines()) == 4
    assert _run(zoo, None, resume=True, runs_root=root, limit=2) == old
    with pytest.raises(HarnessError, match=r"all 3 run\(s\) under .* are complete"):
        _run(zoo, None, resume=True, runs_root=root, limit=2)


def test_cli_resume_without_out_uses_runs_under_the_working_directory(zoo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, text = _cli(_cli_args(zoo, None, "--resume", "--limit", "1"))
    assert code == 1 and "nothing to continue" in _one_error_line(text) and "runs" in text, text
    assert not (tmp_path / "runs").exists()


def test_resume_into_a_missing_directory_is_refused(zoo, tmp_path):
    out = tmp_path / "nope"
    code, text = _cli(_cli_args(zoo, out, "--resume", "--limit", "1"))
    assert code == 1 and "no such run directory" in _one_error_line(text), text
    assert not out.exists()


@pytest.mark.parametrize("damage", ["missing", "unparsable", "not-an-object"])
def test_records_without_a_readable_manifest_are_never_emptied(zoo, tmp_path, damage):
    out = tmp_path / "run"
    _run(zoo, out, limit=2)
    m = out / "manifest.json"
    if damage == "missing":
        m.unlink()
    else:
        m.write_text('{"v": 1, "mode": "den' if damage == "unparsable" else "[1, 2]")
    before = _snapshot(out)
    for extra in (["--resume"], []):
        code, text = _cli(_cli_args(zoo, out, "--limit", "2", *extra))
        assert code == 1, text  # an input problem (bandit.errors.EXIT_INPUT)
        line = _one_error_line(text)
        assert "manifest.json" in line if extra else "already holds a run" in line or "manifest.json" in line
        assert _snapshot(out) == before  # the finished work is still there


def test_resume_of_an_empty_directory_starts_the_run(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    _run(zoo, out, limit=1, resume=True)
    assert "holds no run yet" in capsys.readouterr().err
    assert len((out / "progress.jsonl").read_text().splitlines()) == 3


# ---- 4. record-changing settings are recorded and compared ----


@pytest.mark.parametrize(
    "setting,change,old,new",
    [
        ("max_new_tokens", {"max_new_tokens": 9}, "8", "9"),
        ("k", {"k": 5}, "4", "5"),
        ("dtype", {"dtype": "bfloat16"}, "'float32'", "'bfloat16'"),
        ("generator", {"generator": "n"}, "None", "'n'"),
        ("temperature", {"temperature": 0.5}, "0.0", "0.5"),
        ("seed", {"seed": 1}, "0", "1"),
        ("mode", {"mode": "sparse", "behaviour": "n"}, "'dense'", "'sparse'"),
    ],
)
def test_resume_refuses_changed_settings(zoo, tmp_path, setting, change, old, new):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    before = _snapshot(out)
    with pytest.raises(HarnessError) as e:
        _run(zoo, out, limit=2, resume=True, **change)
    msg = str(e.value)
    assert f"setting {setting!r} differs: recorded {old}, this command {new}" in msg, msg
    assert "\n" not in msg
    assert _snapshot(out) == before


def test_settings_are_recorded_and_limit_may_grow(zoo, tmp_path):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    s = json.loads((out / rundir.SETTINGS).read_text())
    for f in (
        "max_new_tokens",
        "dtype",
        "generator",
        "k",
        "temperature",
        "seed",
        "mode",
        "workloads",
        "workload_file",
        "device",
        "behaviour",
    ):
        assert f in s
    assert s["max_new_tokens"] == 8 and s["dtype"] == "float32" and "limit" not in s
    prog = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    assert all(len(p["sha"]) == 16 for p in prog)
    _run(zoo, out, limit=3, resume=True)  # --limit is not a record-changing setting
    assert len((out / "progress.jsonl").read_text().splitlines()) == 4


def test_resume_refuses_other_prompts(zoo, tmp_path):
    out = tmp_path / "run"
    _run(zoo, out, limit=2)
    # the same file, moved: refused by its recorded path
    moved = tmp_path / "moved.jsonl"
    shutil.copy(zoo["wl"], moved)
    code, text = _cli(_cli_args(zoo, out, "--resume", "--limit", "2", "--workload-file", moved))
    assert code == 1 and "setting 'workload_file' differs" in _one_error_line(text), text
    # a prompt whose text changed under the same id: refused by its recorded token hash
    lines = Path(zoo["wl"]).read_text().splitlines()
    rec = json.loads(lines[0])
    rec["prompt"] = rec["prompt"] + " changed"
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "wl.jsonl").write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    s = json.loads((out / rundir.SETTINGS).read_text())
    s["workload_file"] = str(edited / "wl.jsonl")
    (out / rundir.SETTINGS).write_text(json.dumps(s))
    before = _snapshot(out)
    with pytest.raises(HarnessError, match=f"prompt {rec['workload']}/{rec['prompt_id']} differs"):
        _run(zoo, out, limit=2, resume=True, workload_file=str(edited / "wl.jsonl"))
    assert _snapshot(out) == before


def test_run_from_before_settings_resumes_with_a_note(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    (out / rundir.SETTINGS).unlink()
    capsys.readouterr()
    _run(zoo, out, limit=2, resume=True)
    assert "only the manifest's fields were checked" in capsys.readouterr().err
    assert (out / rundir.SETTINGS).exists()


def test_a_manifest_that_is_a_directory_is_one_error_line(zoo, tmp_path):
    out = tmp_path / "run"
    _run(zoo, out, limit=1)
    (out / "manifest.json").unlink()
    (out / "manifest.json").mkdir()
    code, text = _cli(_cli_args(zoo, out, "--resume", "--limit", "1"))
    assert code == 1 and "manifest.json" in _one_error_line(text), text


def test_disk_full_mid_sweep_is_one_line_and_resumes_to_the_uninterrupted_run(zoo, tmp_path, monkeypatch):
    import errno

    ref = _run(zoo, tmp_path / "ref")
    real, calls = rundir.RunDir._append, []

    def failing(self, *a):
        calls.append(1)
        if len(calls) == 3:  # the third prompt: half its records reach the disk, then ENOSPC
            with open(self.blocks, "ab") as fh:
                fh.write(b'{"v":1,"workload":"half')
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a)

    monkeypatch.setattr(rundir.RunDir, "_append", failing)
    out = tmp_path / "full"
    code, text = _cli(_cli_args(zoo, out))
    assert code != 0 and "Traceback" not in text
    errors = sorted({x[x.index("error:") :] for x in text.replace("\r", "\n").splitlines() if "error:" in x})
    assert len(errors) == 1 and "disk full" in errors[0] and f"--resume --out {out}" in errors[0]
    assert len((out / "progress.jsonl").read_text().splitlines()) == 2  # finished prompts are kept
    monkeypatch.setattr(rundir.RunDir, "_append", real)
    _run(zoo, out, resume=True)
    assert (out / "blocks_dense.jsonl").read_bytes() == (ref / "blocks_dense.jsonl").read_bytes()
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_a_prompt_longer_than_the_target_context_is_refused(zoo, tmp_path):
    long = write_workload_file(tmp_path / "long.jsonl", [("code", "huge", "ab " * 600)])  # 1,800 characters
    with pytest.raises(
        HarnessError,
        match=r"code/huge: 1800 prompt tokens \+ 8 output tokens \+ k 4 exceed the "
        r"target's 1024 positions",
    ):
        _run(zoo, tmp_path / "o", workload_file=str(long))
    assert not (tmp_path / "o").exists()


def test_an_unfinished_run_is_not_complete_and_resume_finds_it(zoo, tmp_path):
    runs = tmp_path / "runs"
    _run(zoo, runs / "a")
    assert json.loads((runs / "a" / "manifest.json").read_text())["complete"] is True
    m = json.loads((runs / "a" / "manifest.json").read_text())
    m.pop("complete")  # e.g. killed in the live phase, after the last dense prompt
    (runs / "a" / "manifest.json").write_text(json.dumps(m))
    keys = [(p.workload, p.prompt_id) for p in __import__("workloads").load(None, str(zoo["wl"]))]
    assert preflight.find_resumable(runs, keys) == runs / "a"
