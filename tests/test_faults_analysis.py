"""Fault cases on the analysis side (issue 24): live.jsonl readers, option values, the boundary of every entry point.

Each case is refused in one line naming where (file, line, field; or the option and its range) with the documented
exit code, never a traceback, never accepted silently out of range; a hypothesis fuzz (derandomized) over live lines
and option values holds the same. The runs are small simulated ones with a planted live phase (`live_run`).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bandit.live import livelog
from bandit.logs import outputs
from specbandit_cli import app
from bandit.logs.reader import LogError, load_logs
from bandit.sim.simulate import SimConfig, write_sim_run

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- a small run with a live phase


def _walk(t, p: int, d: int | None) -> tuple[int, int]:
    """(passes, verified) of always-drafter-d (None: best-of-N) on prompt p of dense log t, by hand."""
    rows = np.flatnonzero(t.prompt == p)
    pos = passes = verified = 0
    while pos < rows.size:
        r = rows[pos]
        passes += 1
        verified += 1 + int(t.draft_len[r].sum() if d is None else t.draft_len[r, d])
        pos += int(t.accepted[r].max() if d is None else t.accepted[r, d]) + 1
    return passes, verified


def live_lines(t, seed: int = 0) -> list[dict]:
    """plain, every fixed drafter and best-of-N on every prompt, counts walked by hand, wall time planted."""
    rng = np.random.default_rng(seed)
    n = np.bincount(t.prompt)
    out = []
    for p in range(t.n_prompts):
        wl, pid = t.prompt_ids[p].split("/", 1)
        for c in ["plain", *(f"fixed:{d}" for d in t.drafters), "best_of_n"]:
            if c == "plain":
                passes = verified = int(n[p])
                calls = {}
            else:
                d = None if c == "best_of_n" else t.drafters.index(c[6:])
                passes, verified = _walk(t, p, d)
                calls = {x: passes for x in t.drafters} if d is None else {t.drafters[d]: passes}
            ms = float(n[p]) * (1.0 if c == "plain" else 0.3 + 0.1 * len(calls)) * rng.lognormal(0, 0.2)
            out.append(
                dict(config=c, workload=wl, prompt_id=pid, prompt_len=7, tokens=int(n[p]), passes=passes)
                | dict(verified=verified, calls=calls, wall_ms=round(ms, 3))
                | dict(draft_ms={x: 0.01 * k for x, k in calls.items()}, same_as_dense=True)
            )
    return out


def live_run(d: Path, seed: int = 3) -> Path:
    """A simulated dense run (3 prompts in each of 4 workloads) and its live.jsonl."""
    write_sim_run(SimConfig(n_prompts=3, out_len=24, seed=seed), d)
    write_live(d, live_lines(load_logs([d])))
    return d


def write_live(d: Path, lines: list[dict]) -> None:
    (Path(d) / livelog.LIVE_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return live_run(tmp_path_factory.mktemp("fa") / "run")


def one_line(res, code: int, *words: str) -> str:
    """The result is exit `code` with exactly one `error:` line containing `words`, and no traceback."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    err = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and all(w in err[0] for w in words), res.output
    assert "Traceback" not in res.output
    return err[0]


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


# ---------------------------------------------------------------- live.jsonl: absurd lines refused, located


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("wall_ms", 1e308, ("wall_ms", "a day")),
        ("same_as_dense", "false", ("same_as_dense", "not a boolean")),
        ("prompt_len", 2**62, ("prompt_len", "2^31")),
        ("passes", 10**6, ("passes",)),
        ("verified", 0, ("verified",)),
        ("wall_ms", float("nan"), ("wall_ms",)),
    ],
)
def test_wallclock_refuses_an_absurd_live_line(run, tmp_path, field, value, words):
    d = live_run(tmp_path / "r")
    lines = live_lines(load_logs([d]))
    lines[4][field] = value
    (d / livelog.LIVE_FILE).write_text("".join(json.dumps(x, allow_nan=True) + "\n" for x in lines))
    err = one_line(invoke("wallclock", d, "--resamples", "20"), 1, *words)
    assert f"{livelog.LIVE_FILE}:5: {field}:" in err  # located: file, line, field
    assert not (d / "wallclock.json").exists()


def test_tokens_times_a_thousand_are_refused_with_or_without_the_budget(tmp_path):
    d = live_run(tmp_path / "r")
    lines = live_lines(load_logs([d]))
    lines[2]["tokens"] *= 1000
    lines[2]["passes"] = lines[2]["passes"]  # still <= tokens: only the length can tell
    write_live(d, lines)
    err = one_line(invoke("wallclock", d, "--resamples", "20"), 1, "tokens")  # the manifest names no budget
    assert ":3: tokens:" in err and "dense log" in err
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(m | {"max_new_tokens": 24}))
    one_line(invoke("wallclock", d, "--resamples", "20"), 1, ":3: tokens:", "max_new_tokens 24")
    for cmd in ("ci", "replay", "breakeven"):  # every reader of the live phase refuses it, not only wallclock
        one_line(invoke(cmd, d, "--resamples", "20"), 1, ":3: tokens:")


def test_the_budget_comes_from_the_manifest_else_settings_else_two_to_the_twenty(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    assert livelog.max_new_tokens(d) == 2**20
    (d / "settings.json").write_text(json.dumps({"max_new_tokens": 64}))
    assert livelog.max_new_tokens(d) == 64
    (d / "manifest.json").write_text(json.dumps({"max_new_tokens": 32}))
    assert livelog.max_new_tokens(d) == 32
    (d / "manifest.json").write_text(json.dumps({"max_new_tokens": "lots"}))
    assert livelog.max_new_tokens(d) == 64


# ---------------------------------------------------------------- option values


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gain", "nan", "--redraft", "0.4", "--json"], ("--gain", "finite")),
        (["--gain", "inf", "--redraft", "0.4", "--json"], ("--gain",)),
        (["--gain", "-5", "--redraft", "0.4", "--json"], ("--gain", "[-0.99, 64.0]")),
        (["--gain", "1e308", "--redraft", "0.4", "--json"], ("--gain", "[-0.99, 64.0]")),
        (["--gain", "-0.999999999", "--redraft", "0.4", "--json"], ("--gain",)),
        (["--gain", "0.1", "--redraft", "0.4", "--rho", "1e308"], ("--rho", "[0, 100.0]")),
        (["--gain", "0.1", "--redraft", "0.4", "--alpha", "1e308"], ("--alpha",)),
        (["--gain", "0.1", "--redraft", "0.4", "--alpha", "-1", "--json"], ("--alpha", "[0.0, 100.0]")),
        (["--gain", "0.1", "--redraft", "0.4", "--alpha", "nan", "--json"], ("--alpha",)),
        (["--gain", "0.1", "--redraft", "nan"], ("--redraft", "[0.0, 1.0]")),
        (["--gain", "0.1", "--redraft", "0.4", "--alternatives", "0"], ("--alternatives",)),
        (["--gain", "0.1", "--redraft", "0.4", "--rho", "0.1,inf"], ("--rho",)),
        (["--gain", "0.1"], ("--redraft",)),
    ],
)
def test_breakeven_whatif_refuses_what_rho_already_refuses(args, words):
    res = invoke("breakeven", *args)
    one_line(res, 2, *words)
    assert "NaN" not in res.stdout and "Infinity" not in res.stdout and "speedup" not in res.stdout


def test_breakeven_whatif_json_is_valid_json():
    res = invoke("breakeven", "--gain", "0.081", "--redraft", "0.43", "--alpha", "0.25", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout, parse_constant=lambda c: pytest.fail(c))


COUNTED = [  # (command, the resamples option, whether 0 means "no CI")
    ("ci", "--resamples", False),
    ("ci", "--refit-resamples", False),
    ("replay", "--resamples", True),
    ("selector", "--resamples", True),
    ("breakeven", "--resamples", False),
    ("breakeven", "--refit-resamples", False),
    ("wallclock", "--resamples", False),
    ("policies", "--resamples", False),
]


@pytest.mark.parametrize("cmd, flag, zero_ok", COUNTED)
def test_resamples_are_bounded_before_anything_is_read(cmd, flag, zero_ok):
    one_line(invoke(cmd, "no/such/run", flag, str(10**9)), 2, flag, "1000000")
    one_line(invoke(cmd, "no/such/run", flag, "-1"), 2, flag)
    one_line(invoke(cmd, "no/such/run", flag, "0"), 1 if zero_ok else 2)  # 0: the path is what is wrong


@pytest.mark.parametrize("cmd", ["ci", "replay", "selector", "breakeven", "wallclock", "policies"])
@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**63)])
def test_seeds_lie_in_zero_to_two_to_the_63(cmd, seed):
    one_line(invoke(cmd, "no/such/run", "--seed", seed), 2, "--seed", "2^63")
    one_line(invoke(cmd, "no/such/run", "--seed", str(2**63 - 1)), 1, "no/such/run")  # in range: read, and refused


def test_unit_method_mode_come_from_their_sets():
    one_line(invoke("ci", "--unit", "token"), 2, "--unit", "prompt, block")
    one_line(invoke("ci", "--method", "basic"), 2, "--method", "percentile")
    one_line(invoke("policies", "--mode", "x"), 2, "--mode", "block, trajectory")


@pytest.mark.parametrize(
    "args",
    [
        ["ci", ""],
        ["replay", ""],
        ["selector", ""],
        ["breakeven", ""],
        ["wallclock", ""],
        ["policies", ""],
        ["validate", ""],
        ["pack", "", "--out", "x"],
        ["ci", "RUN", "--out", ""],
        ["replay", "RUN", "--out", ""],
        ["selector", "RUN", "--out-dir", ""],
        ["breakeven", "RUN", "--out", ""],
        ["breakeven", "RUN", "--engine-timing", ""],
        ["wallclock", "RUN", "--out", ""],
        ["simulate", "--out", ""],
    ],
)
def test_an_empty_path_is_refused_everywhere(run, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)  # were '' the working directory, something would land here
    res = invoke(*[str(run) if a == "RUN" else a for a in args])
    if args[0] == "validate":  # validate's own format: PATH:LINE: FIELD: problem
        assert res.exit_code == 1 and "empty path" in res.output and "valid:" not in res.output
    else:
        one_line(res, res.exit_code, "empty path")
    assert res.exit_code in (1, 2) and "wrote" not in res.output and not list(tmp_path.iterdir())


def test_pack_refuses_an_empty_out(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(invoke("pack", run, "--out", ""), 1, "empty path")
    assert not list(tmp_path.iterdir())


def test_latest_and_paths_exclude_each_other(run):
    one_line(invoke("ci", run, "--latest"), 2, "--latest")


def test_simulate_options_are_bounded(tmp_path):
    one_line(invoke("simulate", "--out", tmp_path / "s", "--seed", "-1"), 2, "--seed")
    one_line(invoke("simulate", "--out", tmp_path / "s", "--n-prompts", "0"), 2, "--n-prompts")
    one_line(invoke("simulate", "--out", tmp_path / "s", "--n-prompts", "100000", "--out-len", "4096"), 2, "x")
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------- every module's entry point behind the boundary


def _modules_with_main() -> list[str]:
    """bandit's modules with a `python bandit/<path>.py` entry, as paths below bandit/ without .py."""
    return sorted(
        str(p.relative_to(ROOT / "bandit").with_suffix(""))
        for p in (ROOT / "bandit").rglob("*.py")
        if 'if __name__ == "__main__":' in p.read_text()
    )


def test_every_module_main_goes_through_the_boundary():
    """Every `python bandit/<module>.py` runs its command through bandit/logs/errors.py (run, or logs.demo which does)."""
    assert {"ci", "logs/reader", "policies/bandits", "sim/simulate"} <= set(_modules_with_main())
    for m in _modules_with_main():
        tail = (ROOT / "bandit" / f"{m}.py").read_text().split('if __name__ == "__main__":', 1)[1]
        assert "run(" in tail or "demo(" in tail, m


@pytest.mark.parametrize(
    "module", ["ci", "replay", "wallclock", "live/livelog", "live/verdicts", "stats/trajectory", "policies/choice"]
)
def test_module_scripts_say_one_line_for_a_missing_run(module):
    p = subprocess.run(
        [sys.executable, f"bandit/{module}.py", "no/such/run"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error:"), p.stderr


# ---------------------------------------------------------------- fuzz: live lines and option values

VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.sampled_from(["false", "true", "1e400", [], {}, {"cascade": -1}, {"cascade": 1e308}]),
)
FIELDS = ["prompt_len", "tokens", "passes", "verified", "wall_ms", "same_as_dense", "draft_ms", "calls", "config"]


@pytest.fixture(scope="module")
def fuzz_run(tmp_path_factory):
    d = live_run(tmp_path_factory.mktemp("fz") / "run")
    return d, live_lines(load_logs([d]))


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(FIELDS), VALUES), min_size=1, max_size=3))
def test_fuzz_live_lines_are_refused_located_or_within_range(fuzz_run, changes):
    d, base = fuzz_run
    lines = [dict(x) for x in base]
    for i, f, v in changes:
        lines[i][f] = v
    raw = "".join(json.dumps(x, allow_nan=True) + "\n" for x in lines)
    tmp = d.parent / "fuzzcase"
    tmp.mkdir(exist_ok=True)
    (tmp / livelog.LIVE_FILE).write_text(raw)
    try:
        got = livelog.read_live(tmp)
    except LogError as e:
        assert e.line >= 1 and e.field, str(e)  # located
        return
    budget = livelog.MAX_TOKENS
    for r in got:
        assert isinstance(r["wall_ms"], (int, float)) and math.isfinite(r["wall_ms"]) and 0 < r["wall_ms"] < 864e5
        assert all(isinstance(r[f], int) and not isinstance(r[f], bool) for f in ("tokens", "passes", "verified"))
        assert 0 <= r["passes"] <= r["tokens"] <= budget and r["verified"] >= r["passes"]
        assert 0 <= r["prompt_len"] < 2**31 and isinstance(r.get("same_as_dense", True), bool)
        assert all(math.isfinite(v) and 0 <= v < 864e5 for v in r["draft_ms"].values())


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0]))


@FUZZ
@given(g=FLOATS, r=FLOATS, a=FLOATS, k=st.integers(-3, 100), rho=st.lists(FLOATS, min_size=1, max_size=3))
def test_fuzz_whatif_options_answer_valid_json_or_one_line(tmp_path_factory, g, r, a, k, rho):
    where = tmp_path_factory.mktemp("wf")
    args = ["--gain", repr(g), "--redraft", repr(r), "--alpha", repr(a), "--alternatives", str(k)]
    res = CliRunner().invoke(app, ["breakeven", *args, "--rho", ",".join(map(repr, rho)), "--json"])
    assert not list(where.iterdir())
    ok = all(map(math.isfinite, [g, r, a, *rho])) and -0.99 <= g <= 64 and 0 <= r <= 1 and 0 <= a <= 100
    ok = ok and 1 <= k <= 64 and all(0 <= x <= 100 for x in rho)
    if ok:
        assert res.exit_code == 0, res.output
        json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"{c} in {res.stdout}"))
    else:
        one_line(res, 2)


@FUZZ
@given(n=st.integers(-(2**65), 2**65), flag=st.sampled_from(["--resamples", "--seed"]))
def test_fuzz_counted_options_are_checked_before_any_input(n, flag):
    res = invoke("replay", "no/such/run", flag, str(n))
    top = outputs.MAX_RESAMPLES if flag == "--resamples" else outputs.SEED_END - 1
    inside = 0 <= n <= top
    one_line(res, 1 if inside else 2, "no/such/run" if inside else flag)
