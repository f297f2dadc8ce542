"""The Parquet cache of logs and `pack`: when a copy is written, read, refused or skipped, and that a block
Parquet file a user hands in is checked as strictly as a JSON record, each problem one located LogError."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bandit.logs.reader as logs
from bandit.logs import columnar
from bandit.logs import logcache
from bandit.logs import safeio
from bandit.logs.reader import LogError, expand_paths, load_logs, pack
from bandit.sim.simulate import SimConfig, write_sim_run
from bandit.logs.table import ROW_FIELDS
from test_logs import _records, _write

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    """The cache on, its fallback directory in tmp, HOME too (nothing lands in the real ~/.cache)."""
    monkeypatch.setenv("SPECBANDIT_CACHE", str(tmp_path / "cachedir"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(logcache, "CACHE_MIN_RECORDS", 0)


@pytest.fixture
def run(tmp_path) -> Path:
    """A simulated run directory; returns its log."""
    return write_sim_run(SimConfig(n_prompts=2, out_len=20, seed=4), tmp_path / "run")


def _parses(monkeypatch) -> list:
    """What parses a log from now on: each call of pyarrow's reader or the exact path, by name."""
    seen = []
    arrow, exact = logs.read_arrow, logs.read_exact
    monkeypatch.setattr(logs, "read_arrow", lambda p: seen.append("pyarrow") or arrow(p))
    monkeypatch.setattr(logs, "read_exact", lambda p, dr: seen.append("exact") or exact(p, dr))
    return seen


def _same(a, b):
    for f in ROW_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), f
    assert (a.drafters, a.workloads, a.prompt_ids, a.label, a.manifests, a.dense) == (
        b.drafters,
        b.workloads,
        b.prompt_ids,
        b.label,
        b.manifests,
        b.dense,
    )


def _beside(log: Path) -> list[Path]:
    return sorted(log.parent.glob(f".{log.name}.*.parquet"))


# ---------------------------------------------------------------- the cache


def test_second_load_reads_the_cache_a_changed_log_does_not(run, monkeypatch, tmp_path):
    seen = _parses(monkeypatch)
    first = load_logs([run])
    (copy,) = _beside(run)
    sha = first.sources[0].sha256
    assert copy.name == f".{run.name}.{sha[:16]}.parquet" and seen == ["pyarrow"]
    assert pq.read_schema(copy).metadata[b"specbandit.sha256"] == sha.encode()
    mtime = copy.stat().st_mtime_ns
    second = load_logs([run])
    assert seen == ["pyarrow"] and copy.stat().st_mtime_ns == mtime  # read, not parsed, not rewritten
    _same(second, first)
    assert second.sources == first.sources
    write_sim_run(SimConfig(n_prompts=2, out_len=20, seed=5), run.parent)  # other bytes, same name
    third = load_logs([run])
    assert seen == ["pyarrow", "pyarrow"] and third.sources[0].sha256 != sha
    (new,) = _beside(run)  # the stale copy removed
    assert new.name == f".{run.name}.{third.sources[0].sha256[:16]}.parquet"
    assert not (third.accepted.tobytes() == first.accepted.tobytes())
    assert not list(tmp_path.rglob("*.tmp"))


def test_unwritable_directory_falls_back_to_the_cache_dir(run, monkeypatch, tmp_path):
    """The log's directory refuses new files (as a read-only one does, even for root): the copy goes to
    $SPECBANDIT_CACHE as <sha256>.parquet, and the next load reads it there."""
    real_open = os.open

    def refuse(path, *a, **k):
        if Path(path).parent == run.parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(safeio.os, "open", refuse)
    seen = _parses(monkeypatch)
    t = load_logs([run])
    sha = t.sources[0].sha256
    assert not _beside(run) and (tmp_path / "cachedir" / f"{sha}.parquet").is_file()
    _same(load_logs([run]), t)
    assert seen == ["pyarrow"]
    monkeypatch.delenv("SPECBANDIT_CACHE")  # default: ~/.cache/specbandit
    (tmp_path / "cachedir" / f"{sha}.parquet").unlink()
    load_logs([run])
    assert (tmp_path / "home" / ".cache" / "specbandit" / f"{sha}.parquet").is_file()


def test_cache_off_writes_nothing(run, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBANDIT_CACHE", "off")
    seen = _parses(monkeypatch)
    load_logs([run])
    load_logs([run])
    assert seen == ["pyarrow", "pyarrow"] and not list(tmp_path.rglob("*.parquet"))


def test_small_logs_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(logcache, "CACHE_MIN_RECORDS", 1000)
    path = _write(tmp_path, _records(6))
    load_logs([path])
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_symlink_in_the_cache_place_is_not_written_through(run, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    sha = columnar.file_sha256(run)
    link = run.parent / f".{run.name}.{sha[:16]}.parquet"
    link.symlink_to(victim)
    other = tmp_path / "cachedir" / f"{sha}.parquet"
    other.parent.mkdir()
    other.symlink_to(victim)
    t = load_logs([run])  # neither place is written, nor read; the load succeeds
    assert victim.read_text() == "precious\n" and link.is_symlink() and other.is_symlink()
    _same(load_logs([run]), t)
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_failing_write_skips_the_cache(run, monkeypatch, tmp_path):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(columnar.pq, "write_table", full)
    t = load_logs([run])
    assert t.n_records == 160 and not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["out-of-range value", "truncated", "other log's copy"])
def test_a_damaged_copy_is_not_trusted(run, monkeypatch, tmp_path, damage):
    want = load_logs([run])
    (copy,) = _beside(run)
    if damage == "out-of-range value":
        t = pq.read_table(copy)
        i = t.schema.get_field_index("drafts.eagle.accepted")
        t = t.set_column(i, "drafts.eagle.accepted", pa.array(np.full(t.num_rows, 99, np.int32)))
        pq.write_table(t, copy)
    elif damage == "truncated":
        copy.write_bytes(copy.read_bytes()[:1000])
    else:
        other = write_sim_run(SimConfig(n_prompts=2, out_len=20, seed=9), tmp_path / "other")
        load_logs([other])
        copy.write_bytes(_beside(other)[0].read_bytes())  # a valid copy, of other bytes
    seen = _parses(monkeypatch)
    _same(load_logs([run]), want)
    assert seen == ["pyarrow"]  # parsed again, and the copy rewritten
    _same(load_logs([run]), want)
    assert seen == ["pyarrow"]


# ---------------------------------------------------------------- pack


def test_pack_then_load_equals_the_logs(run, tmp_path, capsys):
    out = tmp_path / "packed"
    pack([run.parent], out=out)
    assert sorted(p.name for p in out.iterdir()) == ["blocks_sim.parquet", "manifest.json"]
    assert (out / "manifest.json").read_bytes() == (run.parent / "manifest.json").read_bytes()
    assert "wrote" in capsys.readouterr().out
    want = load_logs([run])
    for paths in ([out], [out / "blocks_sim.parquet"], [str(out / "*.parquet")]):
        t = load_logs(paths)
        _same(t, want)
        assert t.sources[0].path == str(out / "blocks_sim.parquet") and t.sources[0].n_records == 160
    _same(load_logs([out], ["ngram", "eagle"]), load_logs([run], ["ngram", "eagle"]))
    before = (out / "blocks_sim.parquet").read_bytes()
    pack([run], out=out)  # again: the same bytes, nothing refused
    assert (out / "blocks_sim.parquet").read_bytes() == before
    assert expand_paths([out]) == [out / "blocks_sim.parquet"]


def test_pack_writes_the_same_bytes_from_the_log_or_from_its_cache(run, tmp_path, monkeypatch):
    pack([run], out=tmp_path / "a")  # the cache on: the copy the load wrote is packed
    monkeypatch.setenv("SPECBANDIT_CACHE", "off")
    pack([run], out=tmp_path / "b")  # off: the columns parsed
    assert (tmp_path / "a" / "blocks_sim.parquet").read_bytes() == (tmp_path / "b" / "blocks_sim.parquet").read_bytes()


def test_pack_as_a_typer_command(run, tmp_path):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("pack")(pack)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["pack", str(run), "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p" / "blocks_sim.parquet").is_file()


def test_pack_refuses_mixed_campaigns_naming_them(tmp_path):
    sim = write_sim_run(SimConfig(n_prompts=1, out_len=10), tmp_path / "sim")
    m = tmp_path / "real"
    m.mkdir()
    real = _write(m, _records(3))
    (m / "manifest.json").write_text(
        json.dumps(
            {
                "v": 1,
                "label": "MEASURED",
                "k": 8,
                "temperature": 0.0,
                "target": {"name": "t"},
                "drafters": {"x": {}, "y": {}},
            }
        )
    )
    with pytest.raises(LogError, match="different campaigns") as e:
        pack([sim, real], out=tmp_path / "out")
    assert str(sim) in str(e.value) and str(real) in str(e.value) and "MEASURED" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_pack_never_writes_through_a_symlink_nor_over_another_file(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / "blocks_sim.parquet").symlink_to(victim)
    with pytest.raises(LogError, match="symlink"):
        pack([run], out=out)
    assert victim.read_text() == "precious\n" and (out / "blocks_sim.parquet").is_symlink()
    (out / "blocks_sim.parquet").unlink()
    (out / "blocks_sim.parquet").write_bytes(b"someone else's")
    with pytest.raises(LogError, match="other content") as e:
        pack([run], out=out)
    assert e.value.path == str(out / "blocks_sim.parquet")
    assert (out / "blocks_sim.parquet").read_bytes() == b"someone else's"
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    with pytest.raises(LogError, match="symlink"):
        pack([run], out=link)
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_directory_holding_a_log_and_its_parquet_is_refused(run, tmp_path):
    """Both would be read: every record twice. Refused, naming both (pack refuses to make that directory)."""
    with pytest.raises(LogError, match="would hold one log twice"):
        pack([run], out=run.parent)
    pack([run], out=tmp_path / "p")
    (run.parent / "blocks_sim.parquet").write_bytes((tmp_path / "p" / "blocks_sim.parquet").read_bytes())
    with pytest.raises(LogError, match=r"holds both blocks_sim.jsonl.gz and blocks_sim.parquet"):
        load_logs([run.parent])
    assert load_logs([run]).n_records == load_logs([run.parent / "blocks_sim.parquet"]).n_records == 160


def test_parquet_drafters_must_agree_with_the_load(run, tmp_path):
    pack([run], out=tmp_path / "p")
    path = tmp_path / "p" / "blocks_sim.parquet"
    with pytest.raises(LogError) as e:
        load_logs([path], ["eagle", "zzz"])
    assert (e.value.path, e.value.line, e.value.field) == (str(path), 0, "drafts.zzz")
    (tmp_path / "p" / "manifest.json").unlink()  # unlabelled, as the log below: one campaign
    other = tmp_path / "q"
    other.mkdir()
    log = _write(other, _records(3))
    with pytest.raises(LogError, match="differ from those of") as e:
        load_logs([log, path])
    assert e.value.path == str(path)


def test_loading_parquet_imports_no_pandas(run, tmp_path):
    pack([run], out=tmp_path / "p")
    code = (
        "import sys; from bandit.logs.reader import load_logs; "
        f"t = load_logs([{str(tmp_path / 'p')!r}]); u = load_logs([{str(run)!r}]); "
        "print(t.n_records, u.n_records, 'pandas' in sys.modules)"
    )
    env = {**os.environ, "SPECBANDIT_CACHE": str(tmp_path / "c")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["160", "160", "False"], out.stderr


# ---------------------------------------------------------------- a user's Parquet file, checked


@pytest.fixture
def packed(tmp_path) -> pa.Table:
    """The block Parquet table of a small sparse log with an empty draft (tests/data/blocks_tiny_sparse.jsonl)."""
    d = tmp_path / "src"
    d.mkdir()
    (d / "blocks_t.jsonl").write_bytes((ROOT / "tests" / "data" / "blocks_tiny_sparse.jsonl").read_bytes())
    pack([d], out=tmp_path / "good")
    return pq.read_table(tmp_path / "good" / "blocks_t.parquet")


def _set(t: pa.Table, name: str, values, typ=None) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, name, pa.array(values, typ or t.schema.field(name).type))


def _col(t: pa.Table, name: str) -> list:
    return t.column(name).to_pylist()


def _at(t, name, row, value):
    xs = _col(t, name)
    xs[row - 1] = value
    return _set(t, name, xs)


BAD_PARQUET = [  # (what, change the table, line (0 = the file as a whole; else the 1-based row), field)
    ("wrong column type", lambda t: _set(t, "pos", [float(x) for x in _col(t, "pos")], pa.float64()), 0, "pos"),
    (
        "int64 where int32 belongs",
        lambda t: _set(t, "drafts.x.accepted", _col(t, "drafts.x.accepted"), pa.int64()),
        0,
        "drafts.x.accepted",
    ),
    ("missing column", lambda t: t.drop_columns(["drafts.y.ms"]), 0, "drafts.y.ms"),
    ("missing key column", lambda t: t.drop_columns(["prompt_id"]), 0, "prompt_id"),
    ("unknown column", lambda t: t.append_column("note", pa.array(["x"] * t.num_rows)), 0, "note"),
    ("no drafters", lambda t: t.drop_columns([c for c in t.column_names if c.startswith("drafts.")]), 0, "drafts"),
    ("no records", lambda t: t.slice(0, 0), 0, "file"),
    ("accepted > draft_len", lambda t: _at(t, "drafts.x.accepted", 3, 9), 3, "drafts.x.accepted"),
    ("negative accepted", lambda t: _at(t, "drafts.y.accepted", 2, -1), 2, "drafts.y.accepted"),
    ("negative draft_len", lambda t: _at(t, "drafts.y.draft_len", 2, -3), 2, "drafts.y.draft_len"),
    ("conf feature above 1", lambda t: _at(t, "drafts.x.conf_mean", 4, 1.5), 4, "drafts.x.conf_mean"),
    ("negative entropy", lambda t: _at(t, "drafts.y.ent_mean", 1, -0.5), 1, "drafts.y.ent_mean"),
    ("NaN feature", lambda t: _at(t, "drafts.x.conf_first", 2, float("nan")), 2, "drafts.x.conf_first"),
    ("infinite ms", lambda t: _at(t, "drafts.x.ms", 5, float("inf")), 5, "drafts.x.ms"),
    ("negative target_ms", lambda t: _at(t, "target_ms", 6, -1.0), 6, "target_ms"),
    (
        "expected_accepted > draft_len",
        lambda t: _at(t, "drafts.x.expected_accepted", 1, 6.5),
        1,
        "drafts.x.expected_accepted",
    ),
    ("negative pos", lambda t: _at(t, "pos", 2, -1), 2, "pos"),
    ("block below -1", lambda t: _at(t, "block", 3, -2), 3, "block"),
    ("null pos", lambda t: _at(t, "pos", 4, None), 4, "pos"),
    ("null feature", lambda t: _at(t, "drafts.y.conf_min", 4, None), 4, "drafts.y.conf_min"),
    ("empty workload", lambda t: _at(t, "workload", 5, ""), 5, "workload"),
    ("null prompt_id", lambda t: _at(t, "prompt_id", 2, None), 2, "prompt_id"),
    ("features of an empty draft", lambda t: _at(t, "drafts.x.conf_min", 5, 0.5), 5, "drafts.x.conf_min"),
    ("duplicate record", lambda t: _at(_at(t, "pos", 2, 0), "prompt_id", 2, "p1"), 2, "pos"),
]


@pytest.mark.parametrize("what,change,line,field", BAD_PARQUET, ids=[b[0] for b in BAD_PARQUET])
def test_a_malformed_parquet_is_one_located_error(tmp_path, packed, what, change, line, field):
    bad = tmp_path / "bad"
    bad.mkdir()
    path = bad / "blocks_t.parquet"
    pq.write_table(change(packed), path)
    with pytest.raises(LogError) as e:
        load_logs([bad])
    msg = str(e.value)
    assert (e.value.path, e.value.line, e.value.field) == (str(path), line, field), msg
    assert len(msg.splitlines()) == 1 and msg.startswith(f"{path}:{line}: {field}: ")
    if line:
        assert e.value.problem.startswith(f"row {line}: "), msg
    if what == "duplicate record":
        assert f"first at {path} row 1" in msg


@pytest.mark.parametrize("what", ["truncated", "not Parquet", "empty file"])
def test_an_unreadable_parquet_is_one_located_error(tmp_path, packed, what):
    path = tmp_path / "blocks_t.parquet"
    pq.write_table(packed, path)
    path.write_bytes(
        {"truncated": path.read_bytes()[:-100], "not Parquet": b"PAR1 plain text\n", "empty file": b""}[what]
    )
    with pytest.raises(LogError) as e:
        load_logs([path])
    assert (e.value.path, e.value.line, e.value.field) == (str(path), 0, "file")
    assert "not a readable Parquet file" in e.value.problem and len(str(e.value).splitlines()) == 1


def test_replay_json_and_ci_on_the_packed_parquet_equal_those_on_the_jsonl(tmp_path):
    """The issue's check end to end: `specbandit pack`, then `replay --json` and `ci` on the Parquet directory
    print and write the same numbers as on the JSON lines (ci.json differs only in the inputs it names)."""
    from typer.testing import CliRunner

    from specbandit_cli import app

    log = write_sim_run(SimConfig(n_prompts=4, out_len=24, seed=9), tmp_path / "run")
    runner = CliRunner()
    r = runner.invoke(app, ["pack", str(log), "--out", str(tmp_path / "packed")])
    assert r.exit_code == 0, r.output
    assert [p.name for p in sorted((tmp_path / "packed").iterdir())] == ["blocks_sim.parquet", "manifest.json"]
    outs = {}
    for name, where in (("jsonl", log.parent), ("parquet", tmp_path / "packed")):
        rep = runner.invoke(app, ["replay", str(where), "--json", "--resamples", "50"])
        assert rep.exit_code == 0, rep.output
        out = tmp_path / f"ci_{name}.json"  # options not at their defaults: written only where --out says
        c = runner.invoke(
            app, ["ci", str(where), "--resamples", "50", "--refit-resamples", "4", "--quiet", "--out", str(out)]
        )
        assert c.exit_code == 0, c.output
        entries = json.loads(out.read_text())
        summary = {k: v for k, v in json.loads(rep.output).items() if k not in ("sources", "inputs")}
        outs[name] = (summary, [{k: v for k, v in e.items() if k not in ("inputs", "command")} for e in entries])
    assert outs["jsonl"] == outs["parquet"]
    assert len(outs["jsonl"][1]) > 10 and "table" in outs["jsonl"][0] and "ci" in outs["jsonl"][0]
