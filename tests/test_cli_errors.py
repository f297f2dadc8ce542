"""Bad input through every analysis command: one `error:` line naming where, a nonzero exit, never a traceback."""

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbandit_cli import app
from bandit.sim.simulate import SimConfig, write_sim_run
from test_logs import BAD_FIELDS, _records

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (
    ["validate"],
    ["replay", "--resamples", "20"],
    ["ci", "--resamples", "20", "--refit-resamples", "2"],
    ["selector", "--resamples", "2"],
    ["breakeven", "--resamples", "20", "--refit-resamples", "2"],
    ["policies", "--resamples", "20", "--seeds", "1"],
)


def _bad_logs(tmp: Path) -> dict[str, Path]:
    out = {}

    def put(name: str, text: bytes, fname: str = "blocks_t.jsonl") -> None:
        d = tmp / name
        d.mkdir()
        (d / fname).write_bytes(text)
        out[name] = d / fname

    lines = [json.dumps(r) for r in _records(7)]
    put("empty", b"")
    put("whitespace", b"  \n\n \n")
    put("truncated_line", ("\n".join(lines) + "\n" + lines[0][:30]).encode())
    blob = gzip.compress(("\n".join(lines * 30) + "\n").encode())
    put("truncated_gz", blob[: len(blob) // 2], "blocks_t.jsonl.gz")
    put("not_gzip", b"plain text\n", "blocks_t.jsonl.gz")
    put("deep_nesting", (lines[0][:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}\n").encode())
    for what, mutate, _ in BAD_FIELDS:
        recs = _records(7)
        recs[3] = mutate(copy.deepcopy(recs[3]))
        put(
            "field_" + what.replace(" ", "_"),
            ("\n".join(r if isinstance(r, str) else json.dumps(r) for r in recs) + "\n").encode(),
        )
    return out


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return _bad_logs(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_bad_log_gives_one_line_and_a_nonzero_exit(bad, cmd):
    runner = CliRunner()
    for name, path in bad.items():
        r = runner.invoke(app, [*cmd, str(path)])
        assert r.exit_code != 0, (name, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (name, repr(r.exception))
        assert "Traceback" not in r.output, (name, r.output)
        assert "error" in r.output.lower() or str(path) in r.output, (name, r.output)


def test_wrong_shape_manifest_and_one_workload(tmp_path):
    runner = CliRunner()
    run = write_sim_run(SimConfig(n_prompts=2, out_len=30, seed=1), tmp_path / "sim").parent
    (run / "manifest.json").write_text(json.dumps(["not", "an", "object"]))
    for cmd in COMMANDS:
        r = runner.invoke(app, [*cmd, str(run)])
        assert r.exit_code != 0 and (r.exception is None or isinstance(r.exception, SystemExit)), (cmd, r.output)
    one = write_sim_run(
        SimConfig(
            n_prompts=2, out_len=30, workloads=("code",), workload_shift=(0.0,), signal=(0.8,), conf_base=(0.0,), seed=1
        ),
        tmp_path / "one",
    )
    r = runner.invoke(app, ["selector", "--resamples", "2", str(one)])
    assert r.exit_code == 1 and "two workloads" in r.output, r.output


@pytest.mark.parametrize(
    "args",
    [
        ["ci", "--resamples", "0"],
        ["replay", "--resamples", "-5"],
        ["breakeven", "--gain", "0.1", "--redraft", "1.5"],
        ["breakeven", "--gain", "0.1", "--redraft", "0.3", "--rho", "0.02,abc"],
    ],
)
def test_bad_values_are_refused(args):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_module_scripts_use_the_same_boundary(bad):
    for module in ("ci", "replay", "selector", "logs/reader"):
        p = subprocess.run(
            [sys.executable, f"bandit/{module}.py", str(bad["field_" + BAD_FIELDS[0][0].replace(" ", "_")])],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, (
            module,
            p.stderr,
        )
        assert ":4: " in p.stderr, (module, p.stderr)  # names the file and line
    for module in ("breakeven", "core", "logs/reader", "ci"):
        p = subprocess.run(
            [sys.executable, f"bandit/{module}.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0 and "Usage" in p.stdout, (module, p.stderr)


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("specbandit ")
