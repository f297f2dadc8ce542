"""Fault cases of the bench scripts (issue 35): bench/pass_cost.py, bench_live.py, gpu_smoke.py and layerskip.py.
Every bad option is one `error:` line naming it and a nonzero exit (bandit/logs/errors.py `guarded`), checked before
any model loads; --json never writes through a symlink nor into a missing folder; pass_cost never shows another
target's fit without saying so; layerskip passes a relative --out to its sweep as the current directory's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bandit.logs.errors import guarded
from harness.models import lm
from harness.models.tiny import make_zoo

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}_faults", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict:
    return make_zoo(tmp_path_factory.mktemp("faults_bench"))


@pytest.fixture(scope="module")
def scripts() -> dict:
    return {n: _load(n) for n in ("pass_cost", "bench_live", "gpu_smoke", "layerskip")}


@pytest.fixture()
def victim(tmp_path) -> Path:
    v = tmp_path / "victim.json"
    v.write_text("precious\n")
    (tmp_path / "link.json").symlink_to(v)
    return v


def fails(main, argv, monkeypatch, capsys, *words: str, code: int | None = None) -> str:
    """`main` run as its script runs it (guarded): a nonzero exit, one `error:` line (the last) holding `words`."""
    monkeypatch.setattr(sys, "argv", ["script", *argv])
    with pytest.raises(SystemExit) as e:
        guarded(main)
    out = capsys.readouterr()
    lines = [x for x in out.err.splitlines() if x.startswith("error:")]
    assert e.value.code not in (0, None) and (code is None or e.value.code == code), out.err
    assert len(lines) == 1 and out.err.rstrip().endswith(lines[0]) and "Traceback" not in out.err, out.err
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------- pass_cost.py
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--q", "5000"], ["--q 5000", "1024"]),
        (["--context", "100000"], ["--context 100000", "1024 positions"]),
        (["--q", "33", "--context", "1000"], ["--q 33", "--context 1000"]),
        (["--q", "0"], ["--q"]),
        (["--q", "a,b"], ["--q"]),
        (["--reps", "0"], ["--reps 0"]),
        (["--context", "-1"], ["--context -1"]),
        (["--run", "/nonexistent"], ["--run /nonexistent", "no such run"]),
        (["--json", "nofolder/out.json"], ["--json", "no folder"]),
        (["--json", ""], ["--json ''"]),
        (["--run", ""], ["--run ''"]),
    ],
)
def test_pass_cost_refuses_a_bad_option(zoo, scripts, monkeypatch, capsys, tmp_path, argv, words):
    monkeypatch.chdir(tmp_path)
    fails(scripts["pass_cost"].main, ["--target", str(zoo["target"]), *argv], monkeypatch, capsys, *words)


def test_pass_cost_refuses_a_heads_directory_a_missing_target_and_a_bad_run(
    zoo, scripts, monkeypatch, capsys, tmp_path
):
    main = scripts["pass_cost"].main
    fails(main, ["--target", str(zoo["root"] / "medusa")], monkeypatch, capsys, "medusa", "not a causal LM")
    fails(main, ["--target", str(tmp_path / "none")], monkeypatch, capsys, "no model directory")
    for bad in ("{not json", "[1, 2]", json.dumps({"model": {"coef_ms": {"pass@1": "x"}}}), "[" * 100_000):
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / "wallclock.json").write_text(bad)
        fails(main, ["--target", str(zoo["target"]), "--run", str(run)], monkeypatch, capsys, "wallclock.json", code=1)


def _run(tmp_path: Path, sha: str | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    coef = {"prefill": 1.0, "pass@1": 10.0, "pass@2": 12.0, "pass@4": 20.0}
    (run / "wallclock.json").write_text(json.dumps({"model": {"coef_ms": coef}}))
    if sha is not None:
        (run / "manifest.json").write_text(json.dumps({"target": {"sha256": sha}}))
    return run


@pytest.mark.parametrize("same", [True, False])
def test_pass_cost_says_when_the_fit_is_another_targets(zoo, scripts, monkeypatch, capsys, tmp_path, victim, same):
    sha = lm.weights_sha256(zoo["target"]) if same else "0" * 64
    run = _run(tmp_path, sha)
    argv = ["--target", str(zoo["target"]), "--run", str(run), "--q", "1,2", "--context", "4", "--reps", "1"]
    fails(scripts["pass_cost"].main, [*argv, "--json", str(tmp_path / "link.json")], monkeypatch, capsys, "symlink")
    assert victim.read_text() == "precious\n"
    scripts["pass_cost"].main([*argv, "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr()
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["fitted_ms"] == {"1": 10.0, "2": 12.0}
    if same:
        assert "ANOTHER" not in out.out and "fitted_on_another_target" not in doc
    else:
        assert "[MODEL, ANOTHER TARGET]" in out.out and "another target" in out.err
        assert "0000000000000000" in doc["fitted_on_another_target"]


# ------------------------------------------------------------------------------------------------ bench_live.py
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--limit", "0"], ["--limit 0"]),
        (["--reps", "0"], ["--reps 0"]),
        (["--threads", "-1"], ["--threads -1"]),
        (["--threads", "0"], ["--threads 0"]),
        (["--threads", "100000"], ["--threads 100000", "cores"]),
        (["--k", "0"], ["--k 0"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens 0"]),
        (["--max-new-tokens", "100000"], ["--max-new-tokens 100000", "positions"]),
        (["--ngram", "bogus"], ["--ngram bogus"]),
        (["--ngram", "ngram=ngram:n_min=0"], ["--ngram", "n_min"]),
        (["--hf-assist", "0"], ["--hf-assist 0"]),
        (["--hf-assist", "999"], ["--hf-assist 999", "layers"]),
        (["--workloads", "nope", "--limit", "1"], ["unknown workload 'nope'"]),
        (["--target", "/nonexistent"], ["--target /nonexistent"]),
        (["--target", ""], ["--target ''"]),
        (["--json", "nofolder/x.json"], ["--json", "no folder"]),
        (["--json", ""], ["--json ''"]),
        (["--json", "link.json"], ["--json link.json", "symlink"]),
        (["--limit", "x"], ["--limit"]),
    ],
)
def test_bench_live_refuses_a_bad_option(scripts, monkeypatch, capsys, tmp_path, victim, argv, words):
    monkeypatch.chdir(tmp_path)
    fails(scripts["bench_live"].main, argv, monkeypatch, capsys, *words)
    assert victim.read_text() == "precious\n"


def test_bench_live_vllm_without_the_tier_is_one_line(scripts, monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else _find(name, *a))
    fails(scripts["bench_live"].main, ["--vllm"], monkeypatch, capsys, "--vllm", "not installed")


_find = importlib.util.find_spec


# ------------------------------------------------------------------------------------------------- gpu_smoke.py
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--dtype", "fp8"], ["--dtype 'fp8'"]),
        (["--k", "0"], ["--k 0"]),
        (["--drafter", "bogus"], ["--drafter bogus"]),
        (["--drafter", "x=nokind"], ["unknown drafter kind"]),
        (["--drafter", "x=medusa:path=/nonexistent"], ["/nonexistent"]),  # found when built: still one line
        (["--workloads", "nope"], ["unknown workload"]),
        (["--workloads", ","], ["--workloads"]),
        (["--target", "/nonexistent"], ["--target /nonexistent"]),
        (["--target", ""], ["--target ''"]),
        (["--device", "tpu"], ["--device 'tpu'"]),
        (["--prompts", "0"], ["--prompts 0"]),
        (["--prompts", "1", "--workloads", "code"], ["--prompts 1", "needs 2"]),
        (["--max-new-tokens", "100000"], ["--max-new-tokens 100000"]),
        (["--json", "nofolder/x.json"], ["--json", "no folder"]),
        (["--json", "link.json"], ["symlink"]),
    ],
)
def test_gpu_smoke_refuses_a_bad_option(scripts, monkeypatch, capsys, tmp_path, victim, argv, words):
    monkeypatch.chdir(tmp_path)
    fails(scripts["gpu_smoke"].main, ["--device", "cpu", "--no-exact", *argv], monkeypatch, capsys, *words)
    assert victim.read_text() == "precious\n"


# ------------------------------------------------------------------------------------------------- layerskip.py
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--layers", "a,b"], ["--layers"]),
        (["--layers", "0"], ["--layers"]),
        (["--layers", "4,4"], ["--layers"]),
        (["--k", "0"], ["--k 0"]),
        (["--per-workload", "0"], ["--per-workload 0"]),
        (["--max-new-tokens", "0"], ["--max-new-tokens 0"]),
        (["--out", ""], ["--out ''"]),
        (["--models", ""], ["--models ''"]),
        (["--json", "nofolder/x.json"], ["--json", "no folder"]),
        (["--json", "link.json"], ["symlink"]),
    ],
)
def test_layerskip_refuses_a_bad_option_before_the_sweep(scripts, monkeypatch, capsys, tmp_path, victim, argv, words):
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(scripts["layerskip"].subprocess, "run", lambda *a, **k: ran.append(a))
    fails(scripts["layerskip"].main, argv, monkeypatch, capsys, *words, code=2)
    assert not ran and victim.read_text() == "precious\n"


def test_layerskip_passes_relative_paths_as_the_current_directorys(scripts, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytarget").mkdir()
    seen = []

    class Done:
        returncode = 1

    monkeypatch.setattr(scripts["layerskip"].subprocess, "run", lambda cmd, **k: seen.append(cmd) or Done())
    argv = ["--out", "rel/run", "--models", "mym", "--target", "mytarget"]
    fails(scripts["layerskip"].main, argv, monkeypatch, capsys, "the sweep failed", code=1)
    cmd = seen[0]
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "rel" / "run")
    assert cmd[cmd.index("--models") + 1] == str(tmp_path / "mym")
    assert cmd[cmd.index("--target") + 1] == str(tmp_path / "mytarget")


# --------------------------------------------------------------------------------------------- as scripts run
@pytest.mark.parametrize("script", ["pass_cost", "bench_live", "gpu_smoke", "layerskip"])
def test_each_script_is_one_line_and_exit_2(script, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{script}.py"), "--k" if script != "pass_cost" else "--reps", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
