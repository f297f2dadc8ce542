"""The compiled fast paths (bandit/fastload.py) against the exact path: identical tables, identical errors.

Two readers: the parser of bandit/_colparse.c ("compiled", built by `pip install -e .`) and
pyarrow's JSON reader ("pyarrow"). Every comparison runs with each of them alone (the other
switched off; a reader whose library is absent is skipped) and loads the same inputs again
with both off (`logs._fastload = None`: orjson bulk checks, then the exact per-record checks),
and requires the same BlockTable array for array, dtype and bytes, or the same
`PATH:LINE: FIELD: problem`. tests/test_colparse.py tests the compiled parser on its own.
"""
import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bandit.logs as logs
from bandit import fastload
from bandit.logs import LogError, load_logs
from bandit.simulate import SimConfig, simulate, write_sim_run
from test_logs import BAD_FIELDS, GOOD, _records, _write

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["compiled", "pyarrow"])
def reader(request, monkeypatch):
    """The fast reader under test, the other switched off."""
    if request.param == "compiled":
        if fastload._colparse is None:
            pytest.skip("bandit._colparse is not built (`pip install -e .` builds it)")
        monkeypatch.setattr(fastload, "pa", None)
    else:
        if fastload.pa is None:
            pytest.skip("pyarrow is not installed")
        monkeypatch.setattr(fastload, "_colparse", None)
    return request.param


def spy_reads(monkeypatch) -> list:
    """Which reader read each file ("compiled", "pyarrow"), None for a file handed to the exact path."""
    seen = []
    real = fastload.read_file

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out[3] if out is not None else None)
        return out
    monkeypatch.setattr(fastload, "read_file", spy)
    return seen


@pytest.fixture
def runs(monkeypatch, reader):
    return spy_reads(monkeypatch)


def _exact(paths, drafters=None):
    fast = logs._fastload
    logs._fastload = None
    try:
        return load_logs(paths, drafters)
    finally:
        logs._fastload = fast


def _assert_same(a, b):
    for f in ("drafters", "workloads", "prompt_ids", "label", "manifests", "sources", "dense"):
        assert getattr(a, f) == getattr(b, f), f
    for f in logs._ROW_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f
        assert x.tobytes() == y.tobytes(), f  # bit for bit: NaN where absent and float rounding included


def _same_table(paths, drafters=None):
    t = load_logs(paths, drafters)
    _assert_same(t, _exact(paths, drafters))
    return t


def _same_error(paths, drafters=None) -> LogError:
    with pytest.raises(LogError) as fast:
        load_logs(paths, drafters)
    with pytest.raises(LogError) as exact:
        _exact(paths, drafters)
    assert str(fast.value) == str(exact.value)
    return fast.value


def _write_records(path: Path, recs, gz: bool = False) -> Path:
    text = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


# ---------------------------------------------------------------- identical tables

@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_simulated_logs_identical(tmp_path, reader, runs, monkeypatch, dense):
    monkeypatch.setattr(fastload, "CHUNK", 1 << 15)  # many chunks, each parsed and checked on its own
    path = write_sim_run(SimConfig(n_prompts=3, out_len=40, dense=dense, seed=3), tmp_path / "run")
    t = _same_table([path])
    assert runs == [reader] and t.dense == dense and t.has_block_flags and t.label == "SIM"


def test_unflagged_log_with_expected_accepted_identical(tmp_path, reader, runs):
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
    path = _write_records(tmp_path / "blocks_u.jsonl.gz", recs, gz=True)
    t = _same_table([path])
    assert runs == [reader] and not t.has_block_flags
    assert np.isfinite(t.expected_accepted).any() and np.isnan(t.expected_accepted).any()
    assert np.isnan(t.target_ms).all() and np.isnan(t.ms).any()


def test_pooled_campaign_flagged_and_unflagged_files_identical(tmp_path, reader, runs):
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
    t = _same_table([run])
    assert runs == [reader, reader] and len(t.sources) == 2 and t.label == "SIM"
    _same_table([run], ["ngram", "cascade"])  # a subset, in the order asked for
    assert runs[2:] == [reader, reader]


def test_hand_written_and_shipped_logs_identical(reader, runs):
    paths = [ROOT / "tests" / "data" / "blocks_tiny_sparse.jsonl", ROOT / "tests" / "data" / "blocks_tiny_dense.jsonl"]
    for p in paths:
        _same_table([p])
    _same_table([ROOT / "runs" / "sim"])
    assert set(runs) == {reader}


def test_json_spelling_the_fast_path_reads(tmp_path, reader, runs):
    """Spaces after separators (json.dumps' default), escapes and non-ASCII in strings, no final newline."""
    recs = _records(5)
    recs[1]["prompt_id"] = "p\u00e9/\"q\""
    recs[2]["workload"] = "w\u2603"
    path = tmp_path / "blocks_s.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    t = _same_table([path])
    assert runs == [reader] and t.workloads == ("w", "w\u2603")


# ---------------------------------------------------------------- handed to the exact path, same result

@pytest.mark.parametrize("what,mutate,field", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_record_same_error(tmp_path, reader, runs, what, mutate, field):
    recs = _records(7)
    recs[3] = mutate(recs[3])
    e = _same_error([_write(tmp_path, recs)])
    assert (e.line, e.field) == (4, field) and runs == [None]


@pytest.mark.parametrize("what,line,field", [
    ("conf NaN", '"conf": [NaN, 0.25, 1.0]', "drafts.x.conf[0]"),
    ("entropy Infinity", '"entropy": [Infinity, 0.2, 0.3]', "drafts.x.entropy[0]"),
    ("null optional field", '"accepted": 1, "ms": null', "drafts.x.ms"),
    ("null block", '"pos": 3, "block": null', "block"),
    ("accepted as float", '"accepted": 1.0', "drafts.x.accepted"),
    ("pos in exponent form", '"pos": 3e0', "pos"),
    ("huge accepted", '"accepted": 99999999999999999999', "drafts.x.accepted"),
])
def test_arrow_lenient_spellings_same_error(tmp_path, reader, runs, what, line, field):
    """What pyarrow reads without complaint (NaN, null as absent, 1.0 as a number) still fails, identically."""
    key = line.split(":")[0]
    text = [json.dumps(r) for r in _records(6)]
    old = {'"conf"': '"conf": [0.5, 0.25, 1.0]', '"entropy"': '"entropy": [0.1, 0.2, 0.3]',
           '"accepted"': '"accepted": 1', '"pos"': '"pos": 3'}[key]
    assert old in text[3]
    text[3] = text[3].replace(old, line, 1)
    path = tmp_path / "blocks_t.jsonl"
    path.write_text("\n".join(text) + "\n")
    e = _same_error([path])
    assert (e.line, e.field) == (4, field) and runs == [None]


@pytest.mark.parametrize("what", ["blank line", "two records on a line", "CRLF", "trailing blank lines",
                                  "record over two lines", "unknown field", "null in a string", "huge token",
                                  "drafter missing", "drafter extra", "line over a block"])
def test_shapes_the_fast_path_refuses_load_the_same(tmp_path, reader, runs, monkeypatch, what):
    """Valid or not, a shape a fast reader does not read goes the exact path and ends the same.

    The compiled parser reads three of them: `\r` is JSON whitespace, "null" inside a string is
    text, and it has no block size; pyarrow's reader refuses all.
    """
    monkeypatch.setattr(fastload, "_BLOCK", 1 << 12)
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
        r = copy.deepcopy(GOOD); r["pos"] = 2; del r["drafts"]["y"]
        recs[2] = json.dumps(r)
    elif what == "drafter extra":
        r = copy.deepcopy(GOOD); r["pos"] = 2; r["drafts"]["z"] = r["drafts"]["y"]
        recs[2] = json.dumps(r)
    elif what == "line over a block":
        r = copy.deepcopy(GOOD); r["pos"] = 2; n = 700
        r["drafts"]["x"].update(tokens=[7] * n, conf=[0.5] * n, entropy=[0.25] * n)
        recs[2] = json.dumps(r)
    path = tmp_path / "blocks_t.jsonl"
    path.write_text("\n".join(recs) + "\n")
    try:
        _same_table([path])
    except LogError:
        _same_error([path])
    if what in ("drafter missing", "drafter extra"):
        _same_table([path], ["x"])
    reads = reader == "compiled" and what in ("CRLF", "null in a string", "line over a block")
    assert runs and set(runs) == ({reader} if reads else {None})


def test_bad_line_deep_in_a_gz_file_same_error(tmp_path, reader, runs, monkeypatch):
    """A problem in a late chunk, after several chunks read fast: the exact path names it."""
    monkeypatch.setattr(fastload, "CHUNK", 1 << 15)
    path = write_sim_run(SimConfig(n_prompts=3, out_len=64, seed=2), tmp_path / "run")
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    rec = json.loads(lines[700])
    rec["drafts"]["eagle"]["accepted"] = 99
    lines[700] = json.dumps(rec).encode()
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    e = _same_error([path])
    assert (e.line, e.field) == (701, "drafts.eagle.accepted") and runs == [None]


def test_duplicate_record_across_chunks_same_error(tmp_path, monkeypatch, reader, runs):
    monkeypatch.setattr(fastload, "CHUNK", 1 << 10)
    monkeypatch.setattr(fastload, "_READ", 100)  # the compiled reader: pieces cut inside lines
    recs = _records(12)
    recs.append(copy.deepcopy(recs[2]))
    e = _same_error([_write(tmp_path, recs)])
    assert (e.line, e.field) == (13, "pos") and ":3" in e.problem and runs == [reader]


@pytest.mark.parametrize("what", ["truncated gzip", "not gzip", "empty", "blank only"])
def test_unreadable_or_empty_files_same_error(tmp_path, reader, runs, what):
    path = tmp_path / ("blocks_t.jsonl.gz" if "gzip" in what else "blocks_t.jsonl")
    blob = gzip.compress(("\n".join(json.dumps(r) for r in _records(50)) + "\n").encode())
    path.write_bytes({"truncated gzip": blob[: len(blob) // 2], "not gzip": b"plain\n",
                      "empty": b"", "blank only": b"\n \n"}[what])
    _same_error([path])
    assert runs == [None]


def test_requested_drafter_missing_same_error(tmp_path, reader, runs):
    path = _write(tmp_path, _records(4))
    e = _same_error([path], ["x", "q"])
    assert e.field == "drafts.q"


@pytest.mark.parametrize("spelling", ["-0 where a float belongs", "-0.0", "block beyond 2**53"])
def test_negative_zero_and_huge_block_identical(tmp_path, reader, runs, spelling):
    """`-0` (an int) is 0.0 and `-0.0` is -0.0 on the exact path; a block over 2**53 stays exact on every
    path. The compiled parser reproduces the first two and refuses the third (the exact path reads it);
    pyarrow refuses the zeros (it reads `-0` as -0.0) and reads the block exactly."""
    text = [json.dumps(r) for r in _records(5)]
    if spelling == "block beyond 2**53":
        text[2] = text[2].replace('"pos": 2', f'"pos": 2, "block": {2**53 + 1}')
    else:
        z = spelling.split()[0]
        text[2] = text[2].replace('"conf": [0.5,', f'"conf": [{z},').replace('"accepted": 1,', f'"accepted": 1, "ms": {z},')
        text[3] = text[3].replace('"pos": 3', f'"pos": 3, "target_ms": {z}').replace('"entropy": [0.0]', f'"entropy": [{z}]')
    path = tmp_path / "blocks_z.jsonl"
    path.write_text("\n".join(text) + "\n")
    t = _same_table([path])
    big = spelling == "block beyond 2**53"
    reads = (reader == "compiled" and not big) or (reader == "pyarrow" and big)
    assert runs == [reader if reads else None]
    if big:
        assert t.block[2] == 2**53 + 1
    else:
        assert np.signbit(t.ms[2, 0]) == np.signbit(t.target_ms[3]) == (z == "-0.0")


@pytest.mark.parametrize("blocked,expect", [(("pyarrow",), "compiled"), (("bandit._colparse",), "pyarrow"),
                                            (("pyarrow", "bandit._colparse"), None)],
                         ids=["no pyarrow", "no compiled parser", "neither"])
def test_loads_without_compiled_readers(tmp_path, blocked, expect):
    """The compiled parser or pyarrow absent at import time: the loader reads with what is left."""
    if expect == "compiled" and fastload._colparse is None:
        pytest.skip("bandit._colparse is not built")
    if expect == "pyarrow" and fastload.pa is None:
        pytest.skip("pyarrow is not installed")
    path = _write(tmp_path, _records(5))
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "import bandit.logs as logs\nfrom bandit import fastload\n"
            f"out = fastload.read_file({str(path)!r}, None, (), logs._features)\n"
            "t = logs.load_logs([%r])\n"
            "print(t.n_records, out and out[3])\n" % str(path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["5", str(expect)], out.stderr
