"""The loader: hand-computed values, the loader against the exact reference, and every bad-input class
named by file, line and field (pyarrow's reader first, and the exact path alone)."""

import copy
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import bandit.logs.reader as logs
from bandit.logs import records
from bandit.logs.reader import LogError, load_logs, load_logs_reference, validate_logs
from bandit.logs.table import ROW_FIELDS
from bandit.sim.simulate import SimConfig, write_sim_run

DATA = Path(__file__).parent / "data"
GOOD = {
    "v": 1,
    "workload": "w",
    "prompt_id": "p",
    "pos": 0,
    "drafts": {
        "x": {"tokens": [1, 2, 3], "accepted": 1, "conf": [0.5, 0.25, 1.0], "entropy": [0.1, 0.2, 0.3]},
        "y": {"tokens": [4], "accepted": 0, "conf": [0.75], "entropy": [0.0]},
    },
}


@pytest.fixture(autouse=True)
def no_cache(monkeypatch):
    """Every test here parses its logs (tests/test_pack.py tests the cache)."""
    monkeypatch.setenv("SPECBANDIT_CACHE", "off")


@pytest.fixture(params=["pyarrow", "exact"])
def parser(request, monkeypatch):
    """Run a test with pyarrow's reader first and with the exact path alone (pyarrow's reader refusing all)."""
    if request.param == "exact":
        monkeypatch.setattr(logs, "read_arrow", lambda path: None)
    return request.param


def _records(n: int = 6) -> list[dict]:
    out = []
    for i in range(n):
        r = copy.deepcopy(GOOD)
        r["pos"] = i
        out.append(r)
    return out


def _write(tmp_path: Path, recs, name: str = "blocks_t.jsonl") -> Path:
    p = tmp_path / name
    lines = [r if isinstance(r, str) else json.dumps(r) for r in recs]
    p.write_text("\n".join(lines) + "\n")
    return p


def _error(path: Path, drafters=None) -> LogError:
    with pytest.raises(LogError) as e:
        load_logs([path], drafters)
    return e.value


def test_hand_written_sparse_log_values(parser):
    t = load_logs([DATA / "blocks_tiny_sparse.jsonl"])
    assert t.drafters == ("x", "y") and t.workloads == ("a", "b") and t.label == "UNLABELLED"
    assert t.prompt_ids == ("a/p1", "a/p2", "b/p3") and not t.dense
    assert t.pos.tolist() == [0, 4, 0, 1, 0, 3]
    assert t.block.tolist() == [0, 1, 0, -1, 0, 1]
    assert t.accepted[:, 0].tolist() == [3, 2, 1, 5, 0, 1]
    assert t.draft_len[:, 0].tolist() == [5, 5, 5, 5, 0, 5]
    # x at a/p1 pos 0: conf [0.9, 0.5, 0.7, 0.2, 0.1], entropy [0.1, 0.3, 0.2, 1.0, 1.4]
    np.testing.assert_allclose(t.features[0, 0], [2.4 / 5, 0.1, 0.9, 3.0 / 5])
    np.testing.assert_array_equal(t.features[4, 0], logs.EMPTY_DRAFT_FEATURES)  # the empty draft
    assert t.ms[0].tolist() == [2.0, 1.0] and np.isnan(t.ms[1]).all()
    assert t.target_ms[0] == 10.0 and np.isnan(t.target_ms[1:]).all()
    assert np.isnan(t.expected_accepted).all()
    assert t.blocks().n_records == 5


def test_fast_loader_equals_reference_on_simulated_log(tmp_path):
    path = write_sim_run(SimConfig(n_prompts=3, out_len=40, seed=5), tmp_path / "run")
    fast, ref = load_logs([path]), load_logs_reference([path])
    for f in ROW_FIELDS:  # bit for bit: both compute the features with bandit.schema.features
        assert getattr(fast, f).tobytes() == getattr(ref, f).tobytes(), f
    assert fast.prompt_ids == ref.prompt_ids and fast.label == "SIM" and fast.dense
    assert fast.sources[0].sha256 == ref.sources[0].sha256


def test_records_across_batches_and_files_are_sorted(tmp_path, monkeypatch, parser):
    monkeypatch.setattr(records, "BATCH", 3)  # many batches from a few lines
    recs = _records(8)[::-1]
    a = _write(tmp_path, recs[:5], "blocks_a.jsonl")
    b = _write(tmp_path, recs[5:], "blocks_b.jsonl")
    t = load_logs([a, b])
    assert t.pos.tolist() == list(range(8)) and t.dense and [s.n_records for s in t.sources] == [5, 3]


def test_gzip_and_directory_inputs(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with gzip.open(d / "blocks_1.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in _records(4)) + "\n")
    t = load_logs([tmp_path])
    assert t.n_records == 4


BAD_FIELDS = [  # (what, mutate record -> record or a raw line, field named in the error)
    ("not JSON", lambda r: '{"v": 1, "workload": ', "line"),
    ("missing field", lambda r: {k: v for k, v in r.items() if k != "pos"}, "pos"),
    ("string where an int belongs", lambda r: {**r, "pos": "3"}, "pos"),
    ("bool where an int belongs", lambda r: {**r, "pos": True}, "pos"),
    ("negative pos", lambda r: {**r, "pos": -1}, "pos"),
    ("unknown v", lambda r: {**r, "v": 2}, "v"),
    ("accepted > len(tokens)", lambda r: _draft(r, accepted=4), "drafts.x.accepted"),
    ("accepted < 0", lambda r: _draft(r, accepted=-1), "drafts.x.accepted"),
    ("conf outside [0,1]", lambda r: _draft(r, conf=[0.5, 1.5, 0.5]), "drafts.x.conf[1]"),
    ("negative entropy", lambda r: _draft(r, entropy=[0.1, -0.2, 0.3]), "drafts.x.entropy[1]"),
    ("conf length", lambda r: _draft(r, conf=[0.5, 0.5]), "drafts.x.conf"),
    ("entropy length", lambda r: _draft(r, entropy=[0.1]), "drafts.x.entropy"),
    ("string token", lambda r: _draft(r, tokens=[1, "2", 3]), "drafts.x.tokens"),
    ("float token", lambda r: _draft(r, tokens=[1, 2.5, 3]), "drafts.x.tokens"),
    ("bool in conf", lambda r: _draft(r, conf=[0.5, True, 0.5]), "drafts.x.conf"),
    ("null conf", lambda r: _draft(r, conf=None), "drafts.x.conf"),
    ("missing draft field", lambda r: _draft(r, drop="entropy"), "drafts.x.entropy"),
    ("negative ms", lambda r: _draft(r, ms=-1.0), "drafts.x.ms"),
    ("expected_accepted > len", lambda r: _draft(r, expected_accepted=3.5), "drafts.x.expected_accepted"),
    ("empty drafts", lambda r: {**r, "drafts": {}}, "drafts"),
    ("negative block", lambda r: {**r, "block": -2}, "block"),
    ("empty workload", lambda r: {**r, "workload": ""}, "workload"),
    ("NaN in conf", lambda r: json.dumps(_draft(r, conf=[0.5, float("nan"), 0.5])), "drafts.x.conf[1]"),
    ("Infinity in target_ms", lambda r: json.dumps({**r, "target_ms": float("inf")}), "target_ms"),
    ("-Infinity in ms", lambda r: json.dumps(_draft(r, ms=float("-inf"))), "drafts.x.ms"),
    ("duplicate JSON key", lambda r: json.dumps(r)[:-1] + ', "pos": 99}', "pos"),
    ("record not an object", lambda r: "[1, 2]", "record"),
    ("int too large for a float", lambda r: json.dumps(_draft(r, entropy=[0.1, 10**400, 0.3])), "drafts.x.entropy[1]"),
    ("pos beyond int64", lambda r: {**r, "pos": 2**63}, "pos"),
    ("block beyond int64", lambda r: {**r, "block": 2**64 + 5}, "block"),
]


def _draft(r: dict, drop: str | None = None, **changes) -> dict:
    r = copy.deepcopy(r)
    r["drafts"]["x"].update(changes)
    if drop:
        del r["drafts"]["x"][drop]
    return r


@pytest.mark.parametrize("what,mutate,field", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_record_names_file_line_field(tmp_path, parser, what, mutate, field):
    recs = _records(7)
    recs[3] = mutate(recs[3])  # line 4, in the middle
    path = _write(tmp_path, recs)
    e = _error(path)
    assert (e.path, e.line) == (str(path), 4), str(e)
    assert e.field == field, str(e)
    assert str(e).startswith(f"{path}:4: {field}: ")


def test_truncated_last_line(tmp_path, parser):
    path = tmp_path / "blocks_t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records(3)) + "\n" + json.dumps(GOOD)[:40])
    e = _error(path)
    assert (e.line, e.field) == (4, "line") and "truncated last line" in e.problem


def test_truncated_gzip_file(tmp_path):
    path = tmp_path / "blocks_t.jsonl.gz"
    blob = gzip.compress(("\n".join(json.dumps(r) for r in _records(50)) + "\n").encode())
    path.write_bytes(blob[: len(blob) // 2])
    e = _error(path)
    assert (e.path, e.line, e.field) == (str(path), 0, "file") and "truncated" in e.problem


def test_not_gzip(tmp_path):
    path = tmp_path / "blocks_t.jsonl.gz"
    path.write_bytes(b"this is not gzip\n")
    assert _error(path).field == "file"


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_or_no_blocks(tmp_path, parser, content):
    path = tmp_path / "blocks_t.jsonl"
    path.write_text(content)
    e = _error(path)
    assert (e.path, e.line, e.field) == (str(path), 0, "file") and "no records" in e.problem


def test_duplicate_workload_prompt_pos(tmp_path, parser):
    recs = _records(5)
    recs.append(copy.deepcopy(recs[2]))  # line 6 repeats line 3's key
    path = _write(tmp_path, recs)
    e = _error(path)
    assert (e.line, e.field) == (6, "pos") and f"{path}:3" in e.problem


def test_duplicate_across_files(tmp_path):
    a = _write(tmp_path, _records(3), "blocks_a.jsonl")
    b = _write(tmp_path, _records(3)[1:2], "blocks_b.jsonl")
    e = _error(tmp_path)
    assert (e.path, e.line, e.field) == (str(b), 1, "pos") and f"{a}:2" in e.problem


def test_drafter_missing_in_some_records(tmp_path, parser):
    recs = _records(6)
    del recs[4]["drafts"]["y"]
    path = _write(tmp_path, recs)
    e = _error(path)
    assert (e.line, e.field) == (5, "drafts.y") and "--drafters" in e.problem
    t = load_logs([path], drafters=["x"])  # a subset present everywhere is fine
    assert t.drafters == ("x",) and t.n_records == 6
    e = _error(path, drafters=["y"])
    assert (e.line, e.field) == (5, "drafts.y")
    with pytest.raises(LogError, match="drafts.z"):
        load_logs([path], drafters=["z"])


def test_drafter_extra_in_some_records(tmp_path, parser):
    recs = _records(4)
    recs[2]["drafts"]["z"] = copy.deepcopy(recs[2]["drafts"]["y"])
    path = _write(tmp_path, recs)
    e = _error(path)
    assert (e.line, e.field) == (3, "drafts.z")
    assert load_logs([path], drafters=["x", "y"]).n_records == 4


def test_subset_still_validates_other_drafters(tmp_path):
    recs = _records(4)
    recs[1]["drafts"]["y"]["accepted"] = 7
    path = _write(tmp_path, recs)
    e = _error(path, drafters=["x"])
    assert (e.line, e.field) == (2, "drafts.y.accepted")


def test_bad_line_deep_in_a_large_gz_file(tmp_path):
    """Line numbers stay right across decompression chunks and parse batches."""
    path = write_sim_run(SimConfig(n_prompts=11, out_len=96, seed=2), tmp_path / "run")  # 4224 lines > a batch
    lines = gzip.decompress(path.read_bytes()).split(b"\n")
    rec = json.loads(lines[4199])
    rec["drafts"]["eagle"]["conf"][2] = 2.0
    lines[4199] = json.dumps(rec).encode()
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    e = _error(path)
    assert (e.line, e.field) == (4200, "drafts.eagle.conf[2]")


def test_validate_all_collects_every_error(tmp_path):
    recs = _records(6)
    recs[1] = {**recs[1], "pos": "x"}
    recs[4] = _draft(recs[4], accepted=9)
    path = _write(tmp_path, recs)
    table, errors = validate_logs([path], all_errors=True)
    assert table is None and [(e.line, e.field) for e in errors] == [(2, "pos"), (5, "drafts.x.accepted")]


def test_refuses_to_pool_sim_with_measured(tmp_path):
    write_sim_run(SimConfig(n_prompts=1, out_len=10), tmp_path / "sim")
    m = tmp_path / "real"
    m.mkdir()
    _write(m, _records(3))
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
    with pytest.raises(LogError, match="another campaign"):
        load_logs([tmp_path])


def test_cli_validate_exit_codes(tmp_path):
    from typer.testing import CliRunner
    from specbandit_cli import app

    recs = _records(9)
    good = _write(tmp_path, recs, "blocks_good.jsonl")
    r = CliRunner().invoke(app, ["validate", str(good)])
    assert r.exit_code == 0 and "9 records" in r.output and "dense" in r.output
    recs[4] = _draft(recs[4], conf=[0.5, 0.5, 7.0])
    bad = _write(tmp_path, recs, "blocks_bad.jsonl")
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 1 and f"{bad}:5: drafts.x.conf[2]:" in r.output


def test_cli_validate_checks_each_campaign_separately(tmp_path):
    """A runs/ folder with a simulated and a measured campaign is valid: one summary each, no pooling."""
    from typer.testing import CliRunner
    from specbandit_cli import app

    write_sim_run(SimConfig(n_prompts=2, out_len=20, seed=1), tmp_path / "sim")
    m = tmp_path / "measured"
    m.mkdir()
    _write(m, _records(3))
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
    r = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert r.output.count("valid: ") == 2 and "[SIM]" in r.output and "[MEASURED]" in r.output
    with pytest.raises(LogError, match="another campaign"):  # the analysis itself still refuses to pool them
        load_logs([tmp_path])


def test_clean_logs_take_the_bulk_path(tmp_path, monkeypatch):
    """The exact per-record path runs only to locate a problem: a clean log never needs it."""
    path = write_sim_run(SimConfig(n_prompts=2, out_len=30, seed=1), tmp_path / "run")
    ref = load_logs([path])

    def boom(*a):
        raise AssertionError("exact path used on a clean log")

    monkeypatch.setattr(logs, "read_exact", boom)
    monkeypatch.setattr(records, "parse_exact", boom)
    t = load_logs([path])
    np.testing.assert_array_equal(t.accepted, ref.accepted)
    np.testing.assert_array_equal(t.features, ref.features)


def test_block_starts_decided_per_prompt_when_pooling_flagged_and_unflagged(tmp_path):
    """A sparse (flagged) log pooled with a dense unflagged one: the unflagged prompts keep every record."""

    def rec(pid, pos, **kw):
        return {
            "v": 1,
            "workload": "w",
            "prompt_id": pid,
            "pos": pos,
            **kw,
            "drafts": {"x": {"tokens": [1], "accepted": 1, "conf": [0.5], "entropy": [0.1]}},
        }

    (tmp_path / "blocks_a.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [rec("flagged", 0, block=0), rec("flagged", 1), rec("flagged", 2, block=1)])
        + "\n"
    )
    (tmp_path / "blocks_b.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [rec("plain", 0), rec("plain", 1), rec("plain", 2)]) + "\n"
    )
    t = load_logs([tmp_path])
    starts = {(t.prompt_ids[p], int(q)) for p, q, s in zip(t.prompt, t.pos, t.is_block_start) if s}
    assert starts == {("w/flagged", 0), ("w/flagged", 2), ("w/plain", 0), ("w/plain", 1), ("w/plain", 2)}
