"""Every way of reading a log gives the exact path's table, array for array, or its error, word for word.

Four routes to one table: pyarrow's JSON reader (bandit/logs/columnar.py), the exact path alone
(bandit/logs/records.py: pyarrow's reader switched off), the Parquet cache (a second load reads the copy
the first one wrote) and a packed Parquet directory (`pack`, then `load_logs` of it). Each table must
equal the exact path's in dtype, shape and bytes (NaN where absent and float rounding included); each
bad input must give the exact path's `PATH:LINE: FIELD: problem` whichever reader saw it first.
tests/test_pack.py tests the cache's files and `pack`'s refusals.
"""

import ast
import copy
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import bandit.logs.reader as logs
from bandit.logs import columnar
from bandit.logs import logcache
from bandit.logs import records
from bandit.logs.reader import LogError, load_logs, pack
from bandit.sim.simulate import SimConfig, simulate, write_sim_run
from bandit.logs.table import ROW_FIELDS
from test_logs import BAD_FIELDS, GOOD, _records, _write

ROOT = Path(__file__).resolve().parents[1]


class Routes:
    """load_logs along each route; `seen` lists what read each file: "pyarrow", "refused" (pyarrow's reader
    gave the file to the exact path) or "exact"."""

    def __init__(self, tmp: Path, monkeypatch):
        self.tmp, self.mp, self.seen, self.k = tmp, monkeypatch, [], 0
        monkeypatch.setenv("SPECBANDIT_CACHE", "off")
        monkeypatch.setattr(logcache, "CACHE_MIN_RECORDS", 0)  # the small logs here are cached too
        arrow, exact = self.real = logs.read_arrow, logs.read_exact

        def spy_arrow(path):
            out = arrow(path)
            self.seen.append("pyarrow" if out is not None else "refused")
            return out

        def spy_exact(path, dr):
            self.seen.append("exact")
            return exact(path, dr)

        monkeypatch.setattr(logs, "read_arrow", spy_arrow)
        monkeypatch.setattr(logs, "read_exact", spy_exact)

    def exact(self, paths, drafters=None):
        """The reference: every file on the exact path (not counted in `seen`)."""
        with self.mp.context() as m:
            m.setattr(logs, "read_arrow", lambda path: None)
            m.setattr(logs, "read_exact", self.real[1])
            return load_logs(paths, drafters)

    def pyarrow(self, paths, drafters=None):
        return load_logs(paths, drafters)

    def cache(self, paths, drafters=None):
        """The second of two loads with the cache on; `reparsed`: what it parsed again (a cached log: nothing)."""
        with self.mp.context() as m:
            m.setenv("SPECBANDIT_CACHE", str(self.tmp / "cache"))
            load_logs(paths, drafters)
            n = len(self.seen)
            try:
                return load_logs(paths, drafters)
            finally:
                self.reparsed = self.seen[n:]

    def parquet(self, paths, drafters=None):
        self.k += 1
        out = self.tmp / f"packed{self.k}"
        pack(list(paths), out=out)
        return load_logs([out], drafters)


@pytest.fixture
def routes(tmp_path, monkeypatch):
    return Routes(tmp_path, monkeypatch)


def _assert_same(a, b, sources: bool = True):
    for f in ("drafters", "workloads", "prompt_ids", "label", "manifests", "dense") + (("sources",) if sources else ()):
        assert getattr(a, f) == getattr(b, f), f
    for f in ROW_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f
        assert x.tobytes() == y.tobytes(), f  # bit for bit: NaN where absent and float rounding included


def _same_table(routes: Routes, paths, drafters=None, via=("pyarrow", "cache", "parquet"), cached=True):
    """The exact path's table, after checking every route in `via` gives it too (and, with `cached`, that the
    cache route's second load parsed nothing)."""
    want = routes.exact(paths, drafters)
    for name in via:
        _assert_same(getattr(routes, name)(paths, drafters), want, sources=name != "parquet")
        if name == "cache":
            assert (routes.reparsed == []) == cached, routes.reparsed
    return want


def _same_error(routes: Routes, paths, drafters=None) -> LogError:
    with pytest.raises(LogError) as exact:
        routes.exact(paths, drafters)
    for load in (routes.pyarrow, routes.cache):
        with pytest.raises(LogError) as e:
            load(paths, drafters)
        assert str(e.value) == str(exact.value)
    return exact.value


def _write_records(path: Path, recs, gz: bool = False) -> Path:
    text = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


# ---------------------------------------------------------------- identical tables


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_simulated_logs_identical(tmp_path, routes, monkeypatch, dense):
    monkeypatch.setattr(columnar, "CHUNK", 1 << 15)  # many chunks, each parsed and checked on its own
    monkeypatch.setattr(records, "BATCH", 50)
    path = write_sim_run(SimConfig(n_prompts=3, out_len=40, dense=dense, seed=3), tmp_path / "run")
    t = _same_table(routes, [path])
    assert routes.seen[:1] == ["pyarrow"] and t.dense == dense and t.has_block_flags and t.label == "SIM"
    assert (t.draft_len == 0).any()  # empty drafts (the lookup drafter): features EMPTY_DRAFT_FEATURES everywhere


def test_unflagged_log_with_expected_accepted_identical(tmp_path, routes):
    """No `block` anywhere, no target_ms; expected_accepted and ms on some drafters, ints among the floats."""
    recs = simulate(SimConfig(n_prompts=2, out_len=30, seed=4))
    for i, r in enumerate(recs):
        r.pop("block", None)
        r.pop("target_ms")
        for j, d in enumerate(r["drafts"].values()):
            if (i + j) % 3:
                d["expected_accepted"] = round(min(len(d["tokens"]), d["accepted"] + 0.25), 3)
            if i % 2:
                del d["ms"]
        r["drafts"]["cascade"]["conf"] = [1 if x > 0.5 else 0 for x in r["drafts"]["cascade"]["conf"]]
    (tmp_path / "u").mkdir()
    path = _write_records(tmp_path / "u" / "blocks_u.jsonl.gz", recs, gz=True)
    t = _same_table(routes, [path])
    assert routes.seen[:1] == ["pyarrow"] and not t.has_block_flags
    assert np.isfinite(t.expected_accepted).any() and np.isnan(t.expected_accepted).any()
    assert np.isnan(t.target_ms).all() and np.isnan(t.ms).any()


def test_pooled_campaign_flagged_and_unflagged_files_identical(tmp_path, routes):
    """Two files of one campaign (one manifest), one flagged and one not, plus a drafter subset."""
    recs = simulate(SimConfig(n_prompts=2, out_len=24, seed=6))
    half = len(recs) // 2
    run = tmp_path / "run"
    write_sim_run(SimConfig(n_prompts=1, out_len=4, seed=6), run)  # for its manifest
    (run / "blocks_sim.jsonl.gz").unlink()
    for r in recs[half:]:
        r.pop("block", None)
    _write_records(run / "blocks_a.jsonl", recs[:half])
    _write_records(run / "blocks_b.jsonl.gz", recs[half:], gz=True)
    t = _same_table(routes, [run])
    assert routes.seen[:2] == ["pyarrow", "pyarrow"] and len(t.sources) == 2 and t.label == "SIM"
    sub = _same_table(routes, [run], ["ngram", "cascade"])  # a subset, in the order asked for
    assert sub.drafters == ("ngram", "cascade")
    np.testing.assert_array_equal(sub.accepted, t.accepted[:, [3, 0]])


def test_hand_written_and_shipped_logs_identical(tmp_path, routes):
    """The tests' hand-written logs and the shipped campaigns (copied: the cache writes beside a log); of the
    measured one its first 6000 records (the exact path takes seconds for all 74k)."""
    for p in ("tests/data/blocks_tiny_sparse.jsonl", "tests/data/blocks_tiny_dense.jsonl"):
        d = tmp_path / Path(p).stem
        d.mkdir()
        shutil.copy(ROOT / p, d)
        _same_table(routes, [d / Path(p).name])
    for run, n in (("runs/sim", None), ("runs/zoo-20261201-134938", 6000)):
        d = tmp_path / Path(run).name
        d.mkdir()
        shutil.copy(ROOT / run / "manifest.json", d)
        for log in (ROOT / run).glob("blocks_*.jsonl.gz"):
            lines = gzip.decompress(log.read_bytes()).splitlines(keepends=True)
            (d / log.name).write_bytes(gzip.compress(b"".join(lines[:n])))  # a prefix of a dense log is dense
        t = _same_table(routes, [d])
        assert t.dense and t.label in ("SIM", "MEASURED") and t.n_records == (n or 9216)
    assert set(routes.seen) == {"pyarrow"}


def test_json_spelling_pyarrow_reads(tmp_path, routes):
    """Spaces after separators (json.dumps' default), escapes and non-ASCII in strings, no final newline."""
    recs = _records(5)
    recs[1]["prompt_id"] = 'p\u00e9/"q"'
    recs[2]["workload"] = "w\u2603"
    path = tmp_path / "blocks_s.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    t = _same_table(routes, [path])
    assert routes.seen[:1] == ["pyarrow"] and t.workloads == ("w", "w\u2603")


@pytest.mark.parametrize("spelling", ["-0 where a float belongs", "-0.0", "block beyond 2**53"])
def test_negative_zero_and_huge_block_identical(tmp_path, routes, spelling):
    """`-0` (an int) is 0.0 and `-0.0` is -0.0 on the exact path; a block over 2**53 stays exact on every
    route. pyarrow's reader refuses the zeros (it reads `-0` as -0.0) and reads the block exactly; the
    cache and a packed file keep the sign of zero."""
    text = [json.dumps(r) for r in _records(5)]
    if spelling == "block beyond 2**53":
        text[2] = text[2].replace('"pos": 2', f'"pos": 2, "block": {2**53 + 1}')
        text[3] = text[3].replace('"pos": 3', f'"pos": 3, "block": {2**63 - 1}')
    else:
        z = spelling.split()[0]
        text[2] = (
            text[2].replace('"conf": [0.5,', f'"conf": [{z},').replace('"accepted": 1,', f'"accepted": 1, "ms": {z},')
        )
        text[3] = (
            text[3].replace('"pos": 3', f'"pos": 3, "target_ms": {z}').replace('"entropy": [0.0]', f'"entropy": [{z}]')
        )
    path = tmp_path / "blocks_z.jsonl"
    path.write_text("\n".join(text) + "\n")
    t = _same_table(routes, [path])
    big = spelling == "block beyond 2**53"
    assert routes.seen[0] == ("pyarrow" if big else "refused")
    if big:
        assert t.block[2] == 2**53 + 1 and t.block[3] == 2**63 - 1
    else:
        assert np.signbit(t.ms[2, 0]) == np.signbit(t.target_ms[3]) == (z == "-0.0")


# ---------------------------------------------------------------- handed to the exact path, same result


@pytest.mark.parametrize("what,mutate,field", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_record_same_error(tmp_path, routes, what, mutate, field):
    recs = _records(7)
    recs[3] = mutate(recs[3])
    e = _same_error(routes, [_write(tmp_path, recs)])
    assert (e.line, e.field) == (4, field) and routes.seen[0] == "refused"
    assert not list(tmp_path.rglob("*.parquet"))  # nothing cached of an invalid log


@pytest.mark.parametrize(
    "what,line,field",
    [
        ("conf NaN", '"conf": [NaN, 0.25, 1.0]', "drafts.x.conf[0]"),
        ("entropy Infinity", '"entropy": [Infinity, 0.2, 0.3]', "drafts.x.entropy[0]"),
        ("null optional field", '"accepted": 1, "ms": null', "drafts.x.ms"),
        ("null block", '"pos": 3, "block": null', "block"),
        ("accepted as float", '"accepted": 1.0', "drafts.x.accepted"),
        ("pos in exponent form", '"pos": 3e0', "pos"),
        ("huge accepted", '"accepted": 99999999999999999999', "drafts.x.accepted"),
        ("bool as v", '"pos": 3, "v": true', "v"),
    ],
)
def test_arrow_lenient_spellings_same_error(tmp_path, routes, what, line, field):
    """What pyarrow reads without complaint (NaN, null as absent, 1.0 as a number) still fails, identically."""
    key = line.split(":")[0]
    text = [json.dumps(r) for r in _records(6)]
    old = {
        '"conf"': '"conf": [0.5, 0.25, 1.0]',
        '"entropy"': '"entropy": [0.1, 0.2, 0.3]',
        '"accepted"': '"accepted": 1',
        '"pos"': '"pos": 3',
    }[key]
    assert old in text[3]
    text[3] = text[3].replace(old, line, 1)
    if what == "bool as v":
        text[3] = text[3].replace('{"v": 1, ', "{", 1)
    path = tmp_path / "blocks_t.jsonl"
    path.write_text("\n".join(text) + "\n")
    e = _same_error(routes, [path])
    assert (e.line, e.field) == (4, field) and routes.seen[0] == "refused"


@pytest.mark.parametrize(
    "what",
    [
        "blank line",
        "two records on a line",
        "CRLF",
        "trailing blank lines",
        "record over two lines",
        "unknown field",
        "null in a string",
        "huge token",
        "drafter missing",
        "drafter extra",
        "line over a block",
        "lone surrogate",
    ],
)
def test_shapes_pyarrow_refuses_load_the_same(tmp_path, routes, monkeypatch, what):
    """Valid or not, a shape pyarrow's reader does not read goes the exact path and ends the same."""
    monkeypatch.setattr(columnar, "BLOCK", 1 << 12)
    recs = [json.dumps(r, separators=(",", ":")) for r in _records(6)]
    if what == "blank line":
        recs[2] += "\n"
    elif what == "two records on a line":
        recs[2] += recs.pop(3)
    elif what == "CRLF":
        recs = [r + "\r" for r in recs]
    elif what == "trailing blank lines":
        recs += ["", "  "]
    elif what == "record over two lines":
        recs[2] = recs[2].replace(',"drafts":', ',\n"drafts":')
    elif what == "unknown field":
        recs[2] = recs[2][:-1] + ',"note":"x"}'
    elif what == "null in a string":
        recs[2] = recs[2].replace('"prompt_id":"p"', '"prompt_id":"nullable"')
    elif what == "huge token":
        recs[2] = recs[2].replace('"tokens":[1,', '"tokens":[123456789012345678901234567890,', 1)
    elif what == "drafter missing":
        r = copy.deepcopy(GOOD)
        r["pos"] = 2
        del r["drafts"]["y"]
        recs[2] = json.dumps(r)
    elif what == "drafter extra":
        r = copy.deepcopy(GOOD)
        r["pos"] = 2
        r["drafts"]["z"] = r["drafts"]["y"]
        recs[2] = json.dumps(r)
    elif what == "line over a block":
        r = copy.deepcopy(GOOD)
        r["pos"] = 2
        n = 700
        r["drafts"]["x"].update(tokens=[7] * n, conf=[0.5] * n, entropy=[0.25] * n)
        recs[2] = json.dumps(r)
    elif what == "lone surrogate":
        recs = [r.replace('"prompt_id":"p"', '"prompt_id":"p\\ud800"') for r in recs]
    path = tmp_path / "blocks_t.jsonl"
    path.write_text("\n".join(recs) + "\n")
    try:
        routes.exact([path])
    except LogError:
        _same_error(routes, [path])
    else:
        _same_table(routes, [path], via=("pyarrow", "cache"))
    if what in ("drafter missing", "drafter extra"):
        _same_table(routes, [path], ["x"], via=("pyarrow", "cache"), cached=False)  # records differ: never cached
        assert not list(tmp_path.rglob("*.parquet"))
    assert routes.seen and set(routes.seen) <= {"refused", "exact"}


def test_bad_line_deep_in_a_gz_file_same_error(tmp_path, routes, monkeypatch):
    """A problem in a late chunk, after several chunks read fast: the exact path names it."""
    monkeypatch.setattr(columnar, "CHUNK", 1 << 15)
    path = write_sim_run(SimConfig(n_prompts=3, out_len=64, seed=2), tmp_path / "run")
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    rec = json.loads(lines[700])
    rec["drafts"]["eagle"]["accepted"] = 99
    lines[700] = json.dumps(rec).encode()
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    e = _same_error(routes, [path])
    assert (e.line, e.field) == (701, "drafts.eagle.accepted") and routes.seen[0] == "refused"


def test_duplicate_record_across_chunks_and_files_same_error(tmp_path, monkeypatch, routes):
    """A key logged twice is found after every file was read, by each route, with both places named."""
    monkeypatch.setattr(columnar, "CHUNK", 1 << 10)
    recs = _records(12)
    recs.append(copy.deepcopy(recs[2]))
    e = _same_error(routes, [_write(tmp_path, recs)])
    assert (e.line, e.field) == (13, "pos") and ":3" in e.problem and routes.seen[0] == "pyarrow"
    d = tmp_path / "two"
    d.mkdir()
    a, b = _write(d, _records(3), "blocks_a.jsonl"), _write(d, _records(3)[1:2], "blocks_b.jsonl")
    e = _same_error(routes, [d])
    assert (e.path, e.line) == (str(b), 1) and f"{a}:2" in e.problem


@pytest.mark.parametrize("what", ["truncated gzip", "not gzip", "empty", "blank only"])
def test_unreadable_or_empty_files_same_error(tmp_path, routes, what):
    path = tmp_path / ("blocks_t.jsonl.gz" if "gzip" in what else "blocks_t.jsonl")
    blob = gzip.compress(("\n".join(json.dumps(r) for r in _records(50)) + "\n").encode())
    path.write_bytes(
        {"truncated gzip": blob[: len(blob) // 2], "not gzip": b"plain\n", "empty": b"", "blank only": b"\n \n"}[what]
    )
    e = _same_error(routes, [path])
    assert e.line == 0 and routes.seen[0] == "refused"


def test_requested_drafter_missing_same_error(tmp_path, routes):
    path = _write(tmp_path, _records(4))
    e = _same_error(routes, [path], ["x", "q"])
    assert e.field == "drafts.q"
    second = _write(tmp_path, [{**GOOD, "pos": 9, "drafts": {"x": GOOD["drafts"]["x"]}}], "blocks_u.jsonl")
    e = _same_error(routes, [path, second])  # a later file of other drafters than the first's
    assert (e.path, e.line, e.field) == (str(second), 1, "drafts.y") and f"{path}:1" in e.problem


# ---------------------------------------------------------------- the loader's modules

LOADER = ("table", "records", "columnar", "logcache", "reader")


@pytest.mark.parametrize("name", LOADER)
def test_loader_modules_are_short_and_layered(name):
    """Under 500 lines; imports only from lower layers (schema/errors <- table <- records <- columnar <- reader),
    at the top, never a private name; no `except Exception`, no orjson."""
    src = (ROOT / "bandit" / "logs" / f"{name}.py").read_text()
    assert len(src.splitlines()) <= 500
    tree = ast.parse(src)
    lower = {"schema", "errors", "observed", "safeio"} | set(LOADER[: LOADER.index(name)])  # observed: layer 0 too
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bandit"):
            assert node.module.startswith("bandit.logs."), (name, node.module)  # the logs layer only
            mod = node.module.split(".")[2]
            assert mod in lower, (name, node.module)
            assert not any(a.name.startswith("_") for a in node.names), (name, node.module)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node)), (name, node.name)
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = [n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)]
            assert "Exception" not in names and "BaseException" not in names, name
    assert "orjson" not in src
