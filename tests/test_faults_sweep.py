"""Fault cases of the collection sweep (issue 24): `python sweep.py` and `specbandit sweep` refuse every out-of-range
option, device or drafter setting with one line `error: ...` naming it, exit 1, no traceback, nothing written, and
before any model loads; a seeded fuzz (hypothesis) over option values finds no traceback and no silent acceptance.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import sweep
import specbandit_cli as cli
from harness.campaign import worker
from harness.drafters import parse_spec
from harness.decode.engine import RunConfig
from harness.models.lm import HarnessError
from harness.campaign.manifest import run_json
from harness.campaign.rundir import RunDir
from harness.models.tiny import make_pair, write_workload_file

REPO = Path(__file__).resolve().parents[1]
N_PROMPTS = 4  # harness.models.tiny.PROMPTS: the campaign of the workload file below


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_sweep")
    target, _ = make_pair(root)
    return {"target": target, "wl": write_workload_file(root / "wl.jsonl")}


def _invoke(app, args, prefix=()):
    res = CliRunner().invoke(app, [*prefix, *(str(a) for a in args)])
    out, err = res.output or "", getattr(res, "stderr", "") or ""
    return res, out if err in out else out + err  # click >= 8.2 mixes stderr into output


def _args(tiny, out, *extra):
    base = ["--target", tiny["target"], "--workload-file", tiny["wl"], "--drafter", "n=ngram", "--out", out]
    return [*base, "--k", "4", "--max-new-tokens", "8", *extra]


def _refused(res, text, *words, code=1):
    assert res.exit_code == code, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in text, text
    err = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(w in err[0] for w in words), text
    return err[0]


CASES = [  # the fault tester's cases first, then more of their kinds
    (["--temperature", "nan"], ["--temperature nan", "0 (greedy) or a number in 1e-06..100"]),
    (["--threads", "-1"], ["--threads -1", f"1..{4 * (os.cpu_count() or 1)}"]),
    (["--threads", "0"], ["--threads 0", f"1..{4 * (os.cpu_count() or 1)}"]),  # 0 never means 1
    (["--threads", "1000000"], ["--threads 1000000", "cores"]),
    (["--device", "bogus"], ["--device 'bogus'", "cpu, cuda or cuda:N"]),
    (["--drafter", "x=ngram:n_max=abc"], ["--drafter x=ngram", "n_max='abc'", "integer in 1..4096"]),
    (["--seed", "99999999999999999999"], ["--seed 99999999999999999999", "0..2^63-1"]),
    (["--drafter", "x=os:system"], ["--drafter x=os:system", "unknown drafter kind 'os'"]),
    (["--drafter", "x=builtins:eval"], ["--drafter x=builtins:eval", "unknown drafter kind 'builtins'"]),
    (["--shard", "0/99999999999999999999"], ["--shard 0/99999999999999999999", "N <= 65536"]),
    (["--seed", "-1"], ["--seed -1", "0..2^63-1"]),
    (["--shard", "0/5"], ["--shard 0/5", f"5 shards for a campaign of {N_PROMPTS} prompts", "at most 4"]),
    (["--shard", "0/1_0"], ["--shard 0/1_0", "expected I/N"]),
    (["--temperature", "inf"], ["--temperature inf"]),
    (["--temperature", "-0.5"], ["--temperature -0.5"]),
    (["--temperature", "1e-30"], ["--temperature 1e-30"]),
    (["--temperature", "1000"], ["--temperature 1000"]),
    (["--k", "99999999999999999999"], ["--k 99999999999999999999", "1..4095"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens 0", "1..1048576"]),
    (["--limit", "0"], ["--limit 0"]),
    (["--live-prompts", "-1"], ["--live-prompts -1", "0..100000"]),
    (["--calibrate", "10000000"], ["--calibrate 10000000", "0..100000"]),
    (["--workers", "-1"], ["--workers -1", "0..4096"]),
    (["--device", "cuda:01"], ["--device 'cuda:01'"]),
    (["--device", "cpu:0"], ["--device 'cpu:0'"]),
    (["--drafter", "x=ngram:n_max=2.5"], ["--drafter x=ngram", "n_max=2.5"]),
    (["--drafter", "x=ngram:n_max=true"], ["--drafter x=ngram", "n_max=True"]),
    (["--drafter", "x=ngram:n_max=0"], ["--drafter x=ngram", "n_max=0"]),
    (["--drafter", "x=ngram:max_occ=1e400"], ["--drafter x=ngram", "max_occ=1e400", "not a finite number"]),
    (["--drafter", "x=ngram:n_max=3,n_max=4"], ["--drafter x=ngram", "n_max=4", "given twice"]),
    (["--drafter", "x=suffix:min_score=nan"], ["--drafter x=suffix", "min_score=nan", "not a finite number"]),
    (["--drafter", "x=suffix:min_score=abc"], ["--drafter x=suffix", "min_score='abc'", "number in 0.0..1.0"]),
    (["--drafter", "x=suffix:max_depth=-3"], ["--drafter x=suffix", "max_depth=-3"]),
    (["--drafter", "x=draft:path=/nonexistent,batch=0"], ["--drafter x=draft", "batch=0"]),
    (["--drafter", "x=eagle:path=/nonexistent,batch=x"], ["--drafter x=eagle", "batch='x'"]),
    (["--drafter", "x=dflash:path=/nonexistent,block=-1"], ["--drafter x=dflash", "block=-1"]),
    (["--drafter", "x=cascade:of=n+n,min_conf=2"], ["--drafter x=cascade", "min_conf=2"]),
    (["--mode", "live", "--policy", "ucbspec:zzz=1"], ["--policy ucbspec:zzz=1", "unknown setting 'zzz'"]),
    (["--mode", "live", "--policy", "ucbspec:delta=abc"], ["--policy ucbspec:delta=abc", "delta='abc'"]),
    (["--mode", "live", "--policy", "ucbspec:delta=nan"], ["--policy ucbspec:delta=nan", "not a finite number"]),
]


@pytest.mark.parametrize("entry", ["python sweep.py", "specbandit sweep"])
@pytest.mark.parametrize("change,words", CASES, ids=[" ".join(c) for c, _ in CASES])
def test_out_of_range_is_one_line_and_writes_nothing(tiny, tmp_path, monkeypatch, entry, change, words):
    def no_model(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(worker, "Worker", no_model)
    monkeypatch.setattr(os, "system", no_model)  # x=os:system names code; it must never run
    out = tmp_path / "run"
    app, prefix = (sweep.app, ()) if entry == "python sweep.py" else (cli.app, ("sweep",))
    res, text = _invoke(app, _args(tiny, out, *change), prefix)
    _refused(res, text, *words)
    assert not out.exists() and not list(tmp_path.iterdir())  # no run directory, nothing beside it


def test_python_sweep_py_itself(tiny, tmp_path):
    """The real entry point (`app()` of sweep.py): one line on stderr, exit 1, no traceback, no run directory."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "sweep.py"), *map(str, _args(tiny, out, "--temperature", "nan"))]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines() == [
        "error: --temperature nan: expected 0 (greedy) or a number in 1e-06..100"
    ], p.stderr
    assert not out.exists()


@pytest.mark.skipif(bool(sweep._missing_zoo()), reason="the embedded default needs the zoo models")
def test_the_embedded_default_refuses_before_making_its_run_directory():
    runs = REPO / "runs"
    before = sorted(os.listdir(runs)) if runs.is_dir() else []
    for app, prefix in ((sweep.app, ()), (cli.app, ("sweep",))):
        res, text = _invoke(app, ["--seed", "-1"], prefix)
        _refused(res, text, "--seed -1", "0..2^63-1")
    assert (sorted(os.listdir(runs)) if runs.is_dir() else []) == before


def test_help_states_every_range():
    res, text = _invoke(sweep.app, ["--help"])
    flat = " ".join(text.split())
    assert res.exit_code == 0
    for words in (
        "an integer in 1..4095",
        "an integer in 1..1048576",
        "0 (greedy) or a number in 1e-06..100",
        "an integer in 0..2^63-1",
        f"an integer in 1..{4 * (os.cpu_count() or 1)}",
        "cpu | cuda | cuda:N",
        "an integer in 0..100000",
        "an integer in 0..4096",
        "an integer in 1..1000000000",
        "N <= the campaign's prompts (and <= 65536)",
    ):
        assert words in flat, words


def test_a_nan_manifest_is_never_written(tmp_path):
    with pytest.raises(HarnessError, match=r"manifest.json: temperature is not a finite number"):
        run_json({"temperature": math.nan}, "manifest.json")
    with pytest.raises(HarnessError, match=r"settings.json: a.1.b is not a finite number"):
        run_json({"a": [0, {"b": -math.inf}]}, "settings.json")
    out = tmp_path / "run"
    with pytest.raises(HarnessError, match="temperature is not a finite number"):
        RunDir(out, {"mode": "dense", "temperature": math.nan}, False, settings={})
    assert not out.exists()


@pytest.mark.parametrize(
    "kw,flag",
    [({"temperature": math.nan}, "--temperature"), ({"seed": 1 << 63}, "--seed"), ({"seed": -1}, "--seed")]
    + [({"k": 4096}, "--k"), ({"max_new_tokens": 0}, "--max-new-tokens")],
)
def test_the_engine_checks_its_config_too(kw, flag):
    with pytest.raises(HarnessError, match=re.escape(flag)):
        RunConfig(**kw).check([])


def test_settings_keep_their_type():
    assert parse_spec("x=draft:path=123").settings == {"path": "123"}  # a directory named 123 stays a path
    assert parse_spec("x=ngram:n_max=3,rule=vllm").settings == {"n_max": 3, "rule": "vllm"}
    assert parse_spec("x=suffix:min_score=1").settings == {"min_score": 1}
    for bad in ("x=ngram:=3", "x=ngram:n_max=٣"):
        with pytest.raises(HarnessError, match="--drafter x=ngram"):
            parse_spec(bad)


# ---- seeded fuzz over option values: each value is refused naming its option, or reaches the models (stubbed) ----

REACHED = "stub: every option accepted, the models would load now"
cuda_n = torch.cuda.device_count() if torch.cuda.is_available() else 0
big = st.integers(min_value=-(2**70), max_value=2**70)
edges = st.sampled_from([-1, 0, 1, 2, 3, 4, 5, 4095, 4096, 1 << 20, (1 << 20) + 1, 100_000, 100_001, 2**63 - 1, 2**63])
small = st.integers(min_value=-2, max_value=6)
ints = st.one_of(big, edges, small)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e-6, 1e-7, 100.0, 100.5]))
junk = st.from_regex(r"[a-z][a-z0-9.]{0,6}", fullmatch=True)


def _int_in(lo, hi):
    return lambda v: isinstance(v, int) and lo <= v <= hi


def _temperature_ok(v):
    return math.isfinite(v) and (v == 0 or 1e-6 <= v <= 100)


def _device_ok(v):
    m = re.fullmatch(r"cuda(?::(0|[1-9][0-9]*))?", v)
    return v == "cpu" or bool(m and cuda_n and (m.group(1) is None or int(m.group(1)) < cuda_n))


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


OPTIONS = {  # option -> (values, accepted?) with the ranges written out here, not read from harness/models/options.py
    "--k": (ints, _int_in(1, 4095)),
    "--max-new-tokens": (ints, _int_in(1, 1 << 20)),
    "--seed": (ints, _int_in(0, 2**63 - 1)),
    "--threads": (ints, _int_in(1, 4 * (os.cpu_count() or 1))),
    "--limit": (ints, _int_in(1, 10**9)),
    "--live-prompts": (ints, _int_in(0, 100_000)),
    "--calibrate": (ints, _int_in(0, 100_000)),
    "--workers": (ints, lambda v: v == 0),  # any other number needs --ray
    "--temperature": (floats, _temperature_ok),
    "--device": (st.one_of(st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:7", "CPU", "", "mps"]), junk), _device_ok),
    "--shard": (st.one_of(st.tuples(small, small), st.tuples(ints, ints)), lambda v: 0 <= v[0] < v[1] <= N_PROMPTS),
    "ngram:n_max": (st.one_of(ints, floats, junk), lambda v: isinstance(v, int) and 1 <= v <= 4096),
    "suffix:min_score": (st.one_of(ints, floats, junk), lambda v: _number(v) and 0 <= v <= 1),
    "suffix:spec_offset": (st.one_of(ints, floats, junk), lambda v: _number(v) and -1000 <= v <= 1000),
    "dflash:block": (st.one_of(ints, floats, junk), lambda v: isinstance(v, int) and 0 <= v <= 4096),
}


@st.composite
def option_values(draw):
    name = draw(st.sampled_from(sorted(OPTIONS)))
    values, ok = OPTIONS[name]
    v = draw(values)
    text = f"{v[0]}/{v[1]}" if name == "--shard" else repr(v) if isinstance(v, float) else str(v)
    if ":" in name:  # a drafter setting
        kind, key = name.split(":")
        path = ",path=/nonexistent" if kind == "dflash" else ""
        return ["--drafter", f"x={kind}:{key}={text}{path}"], f"--drafter x={kind}", ok(v)
    return [name, text], name, ok(v)


@settings(
    max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=option_values())
def test_fuzz_options_refused_or_accepted_never_a_traceback(tiny, tmp_path, case):
    args, flag, ok = case
    event(f"{flag}: {'accepted' if ok else 'refused'}")  # --hypothesis-show-statistics: both sides are reached

    def stub(*a, **kw):
        raise HarnessError(REACHED)

    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker, "Worker", stub)
        res, text = _invoke(sweep.app, _args(tiny, out, *args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in text and not out.exists(), text
    if ok:  # accepted: it went on to load the models
        assert res.exit_code == 1 and REACHED in text, (args, text)
    elif res.exit_code == 2:  # typer's own usage error: not a number at all
        assert "Invalid value" in text and flag in text, (args, text)
    else:  # refused: one line naming the option, before the models
        err = _refused(res, text, flag)
        assert REACHED not in err, (args, text)


def test_a_cuda_index_past_the_machines_devices_is_refused(monkeypatch):
    from harness.models import options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for ok in ("cpu", "cuda", "cuda:0", "cuda:1"):
        options.device(ok)
    with pytest.raises(HarnessError, match=r"--device cuda:2: this machine has 2 CUDA device\(s\): cuda:0..cuda:1"):
        options.device("cuda:2")
    options.device("cuda:2", here=False)  # a Ray worker checks its own host
    for bad in ("cuda:", "cuda:-1", "cuda:00", "CUDA", "cuda:0 ", "gpu"):
        with pytest.raises(HarnessError, match="expected cpu, cuda or cuda:N"):
            options.device(bad, here=False)


@pytest.mark.parametrize("change", [["--shard", "0/\x1b[31m2"], ["--drafter", "x=ngr\x1bam"], ["--device", "cu\x07da"]])
def test_control_characters_in_option_values_are_shown_escaped(tiny, tmp_path, change):
    res, text = _invoke(sweep.app, _args(tiny, tmp_path / "run", *change))
    line = _refused(res, text, change[0])
    assert "\x1b" not in text and "\x07" not in text and ("\\x1b" in line or "\\x07" in line), line
