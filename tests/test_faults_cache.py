"""Fault cases of the Parquet cache (issue 24): a cached copy is proven on every load, never trusted.

A copy edited in place keeps its name and its metadata (the log's sha256, the layout); only the digest of
its own content, written into its metadata and recomputed on load, tells it apart. Each case edits the copy
the way a fault tester did and checks that the numbers come from the log, that the copy is rebuilt with a
note, and that `validate` reads the log itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bandit.logs import columnar
from bandit.logs import logcache
from bandit.logs.columnar import write_parquet
from bandit.logs.reader import load_logs, validate_logs
from bandit.sim.simulate import SimConfig, write_sim_run


@pytest.fixture
def log(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(logcache, "CACHE_MIN_RECORDS", 0)
    monkeypatch.setenv("SPECBANDIT_CACHE", str(tmp_path / "shared"))
    return write_sim_run(SimConfig(n_prompts=6, out_len=40, dense=True, seed=3), tmp_path / "run")


def _copy(log: Path) -> Path:
    (c,) = log.parent.glob(f".{log.name}.*.parquet")
    return c


def _tamper(copy: Path, column: str = "accepted") -> None:
    """Set every draft's accepted to its draft length, metadata kept (the fault tester's edit)."""
    t = pq.read_table(copy)
    meta = t.schema.metadata
    for name in [n for n in t.column_names if n.endswith(f".{column}")]:
        i = t.column_names.index(name)
        src = t.column(name.replace(f".{column}", ".draft_len")).cast(t.schema.field(i).type)
        t = t.set_column(i, name, src)
    write_parquet(copy, t.replace_schema_metadata(meta))


def test_tampered_copy_beside_the_log_is_discarded_and_rebuilt(log, capsys):
    truth = load_logs([log]).accepted.copy()
    copy = _copy(log)
    assert pq.read_schema(copy).metadata[b"specbandit.digest"]
    _tamper(copy)
    edited = [pq.read_table(copy).column(n).to_numpy() for n in pq.read_schema(copy).names if n.endswith(".accepted")]
    assert not np.array_equal(np.stack(edited, 1), truth)  # the edit took
    again = load_logs([log])
    np.testing.assert_array_equal(again.accepted, truth)
    assert "discarded" in capsys.readouterr().err
    np.testing.assert_array_equal(load_logs([log]).accepted, truth)  # the rebuilt copy is good again
    assert "discarded" not in capsys.readouterr().err


def test_tampered_shared_copy_does_not_poison_another_copy_of_the_log(log, tmp_path, capsys):
    """The shared cache directory serves every copy of a log whose own directory takes no cache file: an edit
    there is caught too. (A directory stands where the copy beside the log would go, so that the test holds as
    root, whom a read-only directory does not stop.)"""
    truth = load_logs([log]).accepted.copy()
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(log, other / log.name)
    shutil.copy(log.parent / "manifest.json", other / "manifest.json")
    beside = logcache.cache_paths(other / log.name, columnar.file_sha256(other / log.name))[0]
    beside.mkdir()
    load_logs([other / log.name])
    (shared,) = (tmp_path / "shared").glob("*.parquet")
    _tamper(shared)
    np.testing.assert_array_equal(load_logs([other / log.name]).accepted, truth)
    assert "discarded" in capsys.readouterr().err


def test_copy_without_a_digest_or_of_another_schema_is_not_read(log):
    truth = load_logs([log]).accepted.copy()
    copy = _copy(log)
    t = pq.read_table(copy)
    for drop in (b"specbandit.digest", b"specbandit.schema"):
        meta = {k: v for k, v in t.schema.metadata.items() if k != drop}
        _tamper(copy)
        write_parquet(copy, pq.read_table(copy).replace_schema_metadata(meta))
        np.testing.assert_array_equal(load_logs([log]).accepted, truth)


def test_validate_reads_the_log_itself(log, monkeypatch):
    load_logs([log])
    _tamper(_copy(log))
    opened = []
    real = logcache.cached
    monkeypatch.setattr("bandit.logs.reader.cached", lambda *a: opened.append(a) or real(*a))
    t, errors = validate_logs([log])
    assert errors == [] and opened == []  # never asked the cache
    assert not (t.accepted == t.draft_len).all()


def test_digest_is_of_content_not_of_metadata():
    a = pa.table({"x": pa.array([1, 2, 3], pa.int64()), "w": pa.array(["a", "b", "a"]).dictionary_encode()})
    b = pa.table({"x": pa.array([1, 2, 3], pa.int64()), "w": pa.array(["a", "b", "a"])})
    assert columnar.content_digest(a) == columnar.content_digest(b.replace_schema_metadata({b"k": b"v"}))
    c = pa.table({"x": pa.array([1, 2, 4], pa.int64()), "w": pa.array(["a", "b", "a"])})
    assert columnar.content_digest(c) != columnar.content_digest(b)
