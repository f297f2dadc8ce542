"""Fault cases of the report writers (issue 24): every file through bandit/logs/safeio.py, never through a symlink, a
read-only run directory still prints its report, a non-UTF-8 run directory works, options not at their defaults
never overwrite a run's default outputs, and each file records the command that remakes it byte for byte."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bandit import breakeven, core
from bandit.logs import reader as logs
from bandit.logs import outputs
from specbandit_cli import app
from bandit.logs.errors import boundary
from test_faults_analysis import invoke, live_run, one_line

ROOT = Path(__file__).resolve().parents[1]
WRITES = {  # command -> the default outputs it writes beside the run
    "ci": ["ci.json"],
    "replay": ["replay.txt"],
    "selector": ["selector.txt", "selector_frontier.csv", "selector_frontier.png"],
    "breakeven": ["breakeven.txt", "breakeven.csv", "breakeven.png"],
    "wallclock": ["wallclock.json", "wallclock.txt", "wallclock.png"],
}
SCRIPT = {"ci": "ci", "replay": "replay", "selector": "selector", "breakeven": "breakeven", "wallclock": "wallclock"}
core_app = typer.Typer()
core_app.command()(boundary(core.script))  # as `python bandit/core.py` runs it


def run_recorded(cmd: str):
    """A recorded `python bandit/<module>.py ARGS` run in this process, through the same command."""
    words = shlex.split(cmd)
    assert words[0] == "python" and words[1].startswith("bandit/"), cmd
    name = Path(words[1]).stem
    if name == "core":
        return CliRunner().invoke(core_app, [*words[2:], "--no-progress"])
    return CliRunner().invoke(app, [name, *words[2:]])


@pytest.fixture()
def run(tmp_path) -> Path:
    return live_run(tmp_path / "run")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A run with a live phase and every default output made by the CLI with default options."""
    d = live_run(tmp_path_factory.mktemp("fo") / "run")
    for cmd in WRITES:
        res = invoke(cmd, d)
        assert res.exit_code == 0 and "wrote" in res.output, res.output
    res = CliRunner().invoke(core_app, [str(d), "--no-progress"])
    assert res.exit_code == 0, res.output
    return d


# ---------------------------------------------------------------- the recorded command remakes the file


def test_every_output_records_its_command_and_that_command_remakes_it_byte_for_byte(made):
    names = [n for ns in WRITES.values() for n in ns] + ["core.txt"]
    before = {n: (made / n).read_bytes() for n in names}
    for n in names:
        cmd = outputs.recorded(made / n)
        assert cmd == f"python bandit/{outputs.DOCUMENTED[n].split('/')[1].split()[0]} {made}", (n, cmd)
    for cmd in sorted({outputs.recorded(made / n) for n in names}):
        res = run_recorded(cmd)
        assert res.exit_code == 0, (cmd, res.output)
    assert {n: (made / n).read_bytes() for n in names} == before


def test_the_module_script_and_specbandit_write_the_same_bytes(made, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(made, d)
    before = (d / "replay.txt").read_bytes()
    p = subprocess.run([sys.executable, "bandit/replay.py", str(d)], cwd=ROOT, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (d / "replay.txt").read_bytes().replace(str(d).encode(), str(made).encode()) == before


def test_the_published_campaign_records_the_documented_commands_and_build_checks_them(made, tmp_path, monkeypatch):
    d = tmp_path / "pub"
    shutil.copytree(made, d)
    monkeypatch.setattr(logs, "published_campaign", lambda: d)
    monkeypatch.setattr(outputs, "published_campaign", lambda: d)
    for cmd in ("ci", "replay", "breakeven"):
        res = invoke(cmd)  # no paths: the published campaign, said so
        assert res.exit_code == 0 and "the published campaign" in res.output, res.output
    for n in ("ci.json", "replay.txt", "breakeven.txt", "breakeven.csv", "breakeven.png"):
        assert outputs.recorded(d / n) == outputs.DOCUMENTED[n]
    stale = outputs.check_commands(d)
    assert {s.split()[0].rsplit("/", 1)[1] for s in stale} == {
        "selector.txt",
        "selector_frontier.csv",
        "selector_frontier.png",
        "wallclock.json",
        "wallclock.txt",
        "wallclock.png",
        "core.txt",
    }  # made with the run's path: not the documented command of the published campaign
    assert all("its documented command is" in s for s in stale)
    res = invoke("ci", d)  # the published campaign named: the same file as without a path
    assert res.exit_code == 0 and outputs.recorded(d / "ci.json") == "python bandit/ci.py"


def test_default_breakeven_includes_the_engine_section_where_the_engine_timed_the_campaign(made, tmp_path, monkeypatch):
    d = tmp_path / "eng"
    shutil.copytree(made, d)
    m = json.loads((d / "manifest.json").read_text())
    m["target"] = {"name": "t", "path": "zoo/t", "sha256": None}
    (d / "manifest.json").write_text(json.dumps(m))
    eng = json.loads((ROOT / "bench" / "vllm_timing.json").read_text())
    eng.update(target="zoo/t", k=m["k"], timing=eng["timing"] | {"drafter_ms": {"ngram": 0.05}})
    (tmp_path / "vllm_timing.json").write_text(json.dumps(eng))
    (d / "breakeven.txt").unlink()
    monkeypatch.setattr(breakeven, "ENGINE_TIMING", tmp_path / "vllm_timing.json")
    res = invoke("breakeven", d)  # the campaign's default: the engine section, and no --engine-timing recorded
    assert res.exit_code == 0, res.output
    assert "under the engine's measured costs" in (d / "breakeven.txt").read_text()
    assert outputs.recorded(d / "breakeven.txt") == f"python bandit/breakeven.py {d}"
    res = invoke("breakeven", d, "--engine-timing", tmp_path / "vllm_timing.json")  # the default, named: the same
    assert res.exit_code == 0 and f"kept {d / 'breakeven.txt'}" in res.output, res.output  # (the same numbers)
    sentinel = b"shipped"
    (d / "breakeven.txt").write_bytes(sentinel)
    res = invoke("breakeven", d, "--engine-timing", "none")  # not the campaign's default: printed only
    assert "not written" in res.output and (d / "breakeven.txt").read_bytes() == sentinel


# ---------------------------------------------------------------- options not at their defaults


NON_DEFAULT = [
    ("ci", ["--resamples", "30", "--refit-resamples", "3"]),
    ("ci", ["--seed", "3", "--resamples", "30", "--refit-resamples", "3"]),
    ("ci", ["--unit", "block", "--resamples", "30", "--refit-resamples", "3"]),
    ("ci", ["--method", "bca", "--resamples", "30", "--refit-resamples", "3"]),
    ("replay", ["--drafters", "ngram,eagle"]),
    ("replay", ["--resamples", "0"]),
    ("replay", ["--seed", "4"]),
    ("selector", ["--resamples", "3"]),
    ("breakeven", ["--seed", "1", "--resamples", "30", "--refit-resamples", "3"]),
    ("breakeven", ["--engine-timing", "bench/vllm_timing.json", "--resamples", "30", "--refit-resamples", "3"]),
    ("wallclock", ["--seed", "2", "--resamples", "30"]),
]


@pytest.mark.parametrize("cmd, opts", NON_DEFAULT, ids=[f"{c} {' '.join(o)}" for c, o in NON_DEFAULT])
def test_options_not_at_their_defaults_never_overwrite_default_outputs(run, cmd, opts, monkeypatch):
    monkeypatch.chdir(ROOT)
    for n in WRITES[cmd]:
        (run / n).write_bytes(b"shipped")
    res = invoke(cmd, run, *opts)
    assert res.exit_code == 0 and "not written" in res.output and "--out FILE" in res.output, res.output
    assert all((run / n).read_bytes() == b"shipped" for n in WRITES[cmd])
    flag = "--out-dir" if cmd == "selector" else "--out"
    res = invoke(cmd, run, *opts, flag, run if cmd == "selector" else run / WRITES[cmd][0])
    one_line(res, 2, "default output")  # --out naming the run's default output: refused before anything is read
    assert all((run / n).read_bytes() == b"shipped" for n in WRITES[cmd])
    where = run.parent / f"{cmd}_other"
    out = where if cmd == "selector" else where.with_suffix("." + WRITES[cmd][0].rsplit(".", 1)[1])
    res = invoke(cmd, run, *opts, flag, out)
    assert res.exit_code == 0 and "wrote" in res.output, res.output
    rec = outputs.recorded(out / "selector.txt" if cmd == "selector" else out)
    assert rec.startswith(f"python bandit/{cmd}.py {run} ") and "--out" not in rec, rec
    assert all(o in rec.split() for o in opts if o.startswith("--")), rec


def test_core_with_other_options_prints_only(run):
    (run / "core.txt").write_text("shipped")
    res = CliRunner().invoke(core_app, [str(run), "--seeds", "1", "--resamples", "20", "--no-progress"])
    assert res.exit_code == 0 and "not written" in res.output and (run / "core.txt").read_text() == "shipped"


def test_a_drafter_subset_records_itself(run, tmp_path):
    res = invoke("replay", run, "--drafters", "ngram,eagle", "--out", tmp_path / "r.txt")
    assert res.exit_code == 0, res.output
    assert outputs.recorded(tmp_path / "r.txt") == f"python bandit/replay.py {run} --drafters ngram,eagle"
    res = run_recorded(outputs.recorded(tmp_path / "r.txt") + f" --out {tmp_path / 'again.txt'}")
    assert (tmp_path / "again.txt").read_bytes() == (tmp_path / "r.txt").read_bytes()


# ---------------------------------------------------------------- symlinks, read-only and non-UTF-8 run directories


@pytest.mark.parametrize("cmd, name", [(c, n) for c, ns in WRITES.items() for n in ns])
def test_a_symlink_at_an_output_is_not_written_through(run, tmp_path, cmd, name):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (run / name).symlink_to(victim)
    res = invoke(cmd, run)
    one_line(res, 3, "symlink")
    assert victim.read_text() == "untouched" and (run / name).is_symlink()
    assert not any((run / n).exists() and not (run / n).is_symlink() for n in WRITES[cmd])  # none of its files


def test_a_dangling_symlink_at_out_is_not_written_through(run, tmp_path):
    (tmp_path / "o.txt").symlink_to(tmp_path / "nowhere.txt")
    res = CliRunner().invoke(
        core_app, [str(run), "--seeds", "1", "--resamples", "20", "--out", str(tmp_path / "o.txt")]
    )
    assert res.exit_code == 3 and not (tmp_path / "nowhere.txt").exists(), res.output


def _refuse_writes_in(d: Path, monkeypatch) -> None:
    """A read-only directory: chmod where that binds; as root (chmod does not) the write path refuses instead."""
    os.chmod(d, 0o555)
    try:
        (d / ".probe").write_text("")
        (d / ".probe").unlink()
    except OSError:
        return
    real = outputs.write_file

    def refuse(path, write, replace_different=True):
        if Path(path).parent == d:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, write, replace_different)

    monkeypatch.setattr(outputs, "write_file", refuse)


def test_ci_on_a_read_only_run_prints_its_whole_report_then_one_error(run, monkeypatch):
    _refuse_writes_in(run, monkeypatch)
    try:
        res = invoke("ci", run)
    finally:
        os.chmod(run, 0o755)
    assert res.exit_code == 3, res.output
    assert "per_block_gap" in res.stdout and "95% CI" in res.stdout and "live_tokens_per_s" in res.stdout
    assert res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert "Permission denied" in res.stderr and not (run / "ci.json").exists()


def test_a_run_directory_with_a_non_utf8_byte_works(made, tmp_path):
    d = os.fsencode(tmp_path) + b"/r\xff"
    os.makedirs(d)
    for f in ("blocks_sim.jsonl.gz", "manifest.json", "live.jsonl"):
        shutil.copy(os.fsencode(made / f), d + b"/" + f.encode())
    for cmd in ("ci", "replay", "wallclock"):
        p = subprocess.run(
            [sys.executable, f"bandit/{cmd}.py", d, "--resamples", "30"]
            + (["--refit-resamples", "3"] if cmd == "ci" else []),
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )
        assert p.returncode == 0 and b"Traceback" not in p.stderr, (cmd, p.stderr)
        assert b"r\\udcff" in p.stdout  # the path printed escaped
    p = subprocess.run([sys.executable, "bandit/replay.py", d], cwd=ROOT, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    first = open(d + b"/replay.txt", "rb").read().split(b"\n", 1)[0]
    assert first.startswith(b"# made by: python bandit/replay.py") and b"\\udcff" in first


@pytest.mark.parametrize("cmd", ["ci", "replay", "breakeven", "wallclock"])
@pytest.mark.parametrize("name", ["blocks_sim.jsonl.gz", "manifest.json", "live.jsonl"])
def test_out_never_names_an_input_or_a_file_of_the_run(run, cmd, name):
    before = (run / name).read_bytes()
    one_line(invoke(cmd, run, "--seed", "1", "--out", run / name), 2, "--out", name)
    assert (run / name).read_bytes() == before
