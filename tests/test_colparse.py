"""The compiled parser (bandit/_colparse.c) on its own: float rounding, pieces, spellings, fuzzing.

Whatever it accepts must load to the very table the exact path loads (floats rounded as Python's
float() rounds them), and whatever it refuses must end as the exact path ends (the same table,
or the same `PATH:LINE: FIELD: problem`); no input may crash it. tests/test_fastload.py runs the
shared table and error tests on it and on pyarrow's reader.
"""
import copy
from decimal import Decimal, getcontext
import gzip
import json
import random
import struct

import numpy as np
import pytest

import bandit.logs as logs
from bandit import fastload
from bandit.logs import LogError, load_logs
from bandit.simulate import SimConfig, simulate
from test_fastload import _assert_same, _exact, spy_reads
from test_logs import GOOD, _records

colparse = pytest.importorskip("bandit._colparse", reason="bandit._colparse is not built (`pip install -e .` builds it)")

NAMES = [b"x", b"y"]


@pytest.fixture
def compiled(monkeypatch):
    """load_logs with the compiled reader only (pyarrow off): a refused file goes to the exact path.
    Returns the list of what read each file: "compiled" or None."""
    monkeypatch.setattr(fastload, "pa", None)
    return spy_reads(monkeypatch)


def _outcome(paths, drafters=None):
    try:
        return load_logs(paths, drafters)
    except LogError as e:
        return str(e)


def _same_outcome(paths, drafters=None):
    """The compiled configuration and the exact path agree: the same table or the same error."""
    a, b = _outcome(paths, drafters), None
    try:
        b = _exact(paths, drafters)
    except LogError as e:
        b = str(e)
    assert type(a) is type(b), (a, b)
    if isinstance(a, str):
        assert a == b
    else:
        _assert_same(a, b)
    return a


def _parse(text: bytes, names=NAMES, keep=None):
    """(columns of take(), None) or (None, why) for `text` fed to a fresh parser in one piece."""
    p = colparse.Parser(names, keep if keep is not None else [True] * len(names))
    if not p.feed(text) or not p.finish():
        return None, p.why
    return p.take(), None


def _line(rec) -> bytes:
    return json.dumps(rec, separators=(",", ":")).encode()


# ---------------------------------------------------------------- numbers

getcontext().prec = 120


def _float_tokens(rng: random.Random, n: int) -> list[str]:
    """Non-negative JSON number spellings of every kind: short decimals, 17-digit reprs, long
    mantissas, exponents near the limits, subnormals, ints."""
    out = ["0", "0.0", "0e0", "0.000", "1", "1.0", "1e0", "1E+0", "10e-1", "0.1", "0.30000000000000004",
           "4.9e-324", "5e-324", "2e-324", "1e-400", "2.2250738585072011e-308", "2.2250738585072014e-308",
           "1.7976931348623157e308", "9007199254740993", "9007199254740993.0", "123456789012345678",
           "0.1000000000000000055511151231257827021181583404541015625", "1" * 40 + "e-30",
           "0." + "0" * 30 + "1", "7.2", "9999999999999999", "99999999999999999", "1e22", "1e23", "8.5e-22"]
    while len(out) < n:
        kind = rng.randrange(6)
        if kind == 0:  # any double, shortest repr
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
            if np.isfinite(x):
                out.append(repr(x))
        elif kind == 1:  # few decimals, like the harness writes
            out.append(f"{rng.random() * 10 ** rng.randrange(4):.{rng.randrange(1, 7)}f}")
        elif kind == 2:  # a mantissa of 1..25 digits and any exponent
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 26))).lstrip("0") or "0"
            k = rng.randrange(len(digits) + 1)
            mant = (digits[:k] or "0") + ("." + digits[k:] if k < len(digits) else "")
            out.append(mant + (f"e{rng.randrange(-330, 310)}" if rng.random() < 0.6 else ""))
        elif kind == 3:  # near the fast path's edges: 15..17 digits, powers of ten near 22
            m = rng.randrange(10 ** rng.randrange(14, 18))
            out.append(f"{m}e{rng.choice([-23, -22, -21, 21, 22, 23])}")
        elif kind == 4:  # ints
            out.append(str(rng.randrange(10 ** rng.randrange(1, 19))))
        else:  # exactly halfway between two doubles, and just either side of it
            lo = rng.uniform(0, 10.0 ** rng.randrange(-5, 20))
            half = (Decimal(lo) + Decimal(float(np.nextafter(lo, np.inf)))) / 2
            out.append(str(half.normalize()) if rng.random() < 0.5 else
                       f"{half + rng.choice([-1, 1]) * Decimal(10) ** (half.adjusted() - 40):.45e}")
    return out


def test_floats_round_as_python_does():
    """Every spelling gives the very bits of Python's float(), or is refused when that is not finite."""
    toks = _float_tokens(random.Random(7), 30000)
    # ints of over 18 digits are refused (conservatively: the exact path takes them)
    finite = [t for t in toks if np.isfinite(float(t)) and not (t.isdigit() and len(t) > 18)]
    assert len(finite) > 25000
    rec = {"v": 1, "workload": "w", "prompt_id": "p", "pos": 0, "drafts": {}}
    head = _line(rec)[:-len(b'"drafts":{}}')]
    k = 1000
    for i in range(0, len(finite), k):
        part = finite[i:i + k]
        body = (b'"drafts":{"x":{"tokens":[' + b",".join(b"0" for _ in part) + b'],"accepted":0,"conf":['
                + b",".join(b"0.5" for _ in part) + b'],"entropy":[' + ",".join(part).encode() + b'],"ms":'
                + part[0].encode() + b'},"y":{"tokens":[],"accepted":0,"conf":[],"entropy":[]}}}')
        cols, why = _parse(head + body + b"\n")
        assert why is None, why
        got = np.frombuffer(cols[6][0][5], np.float64)
        want = np.array([float(t) for t in part])
        bad = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
        assert not bad.size, [(part[j], got[j], want[j]) for j in bad[:5]]
        assert np.frombuffer(cols[6][0][3], np.float64)[0] == float(part[0])
    for t in ("1e400", "2e308", "1" * 19, "1" * 400):
        line = _line({**GOOD, "target_ms": 0}).replace(b'"target_ms":0', b'"target_ms":' + t.encode())
        assert _parse(line)[0] is None


@pytest.mark.parametrize("tok,ok", [
    ("01", False), ("1.", False), (".5", False), ("1e", False), ("1e+", False), ("+1", False), ("-", False),
    ("0x10", False), ("1.5.2", False), ("NaN", False), ("Infinity", False), ("-Infinity", False), ("1_0", False),
    ("1.0e-2", True), ("1E2", True), ("0.5e+0", True), ("-0.0", True), ("-0", True), ("0e-5", True)])
def test_number_grammar_is_json(tok, ok):
    """Strict JSON numbers only, as Python's json module reads them (its NaN/Infinity extension refused)."""
    line = _line({**GOOD, "target_ms": 0}).replace(b'"target_ms":0', b'"target_ms":' + tok.encode())
    cols, why = _parse(line)
    assert (cols is not None) == ok, why
    if ok:
        assert np.frombuffer(cols[3], np.float64)[0].tobytes() == np.float64(float(tok)).tobytes() or tok == "-0"
        if tok == "-0":  # an int: Python's 0, so 0.0 and not -0.0
            assert not np.signbit(np.frombuffer(cols[3], np.float64)[0])


@pytest.mark.parametrize("field,tok", [("pos", "1.0"), ("pos", "1e0"), ("pos", "-1"), ("pos", "1" * 19),
                                       ("v", "1.0"), ("v", "2"), ("accepted", "0.0"), ("accepted", "-1"),
                                       ("tokens", "[1.5]"), ("tokens", "[" + "9" * 19 + "]"), ("block", str(2**53 + 1))])
def test_ints_where_ints_belong(field, tok):
    rec = copy.deepcopy(GOOD)
    target = rec["drafts"]["x"] if field in ("accepted", "tokens") else rec
    target[field] = "@"
    line = _line(rec).replace(b'"@"', tok.encode())
    assert _parse(line)[0] is None


# ---------------------------------------------------------------- text: pieces, spellings

def test_pieces_cut_anywhere_give_the_same_columns():
    recs = simulate(SimConfig(n_prompts=2, out_len=20, seed=1))
    text = b"".join(_line(r) + b"\n" for r in recs)
    names = sorted(recs[0]["drafts"])
    whole, why = _parse(text, [n.encode() for n in names])
    assert why is None and whole[0] == len(recs)
    rng = random.Random(3)
    for trial in range(20):
        p = colparse.Parser([n.encode() for n in names], [True] * len(names))
        i, parts = 0, []
        while i < len(text):
            j = i + rng.choice([1, 2, 7, 100, 4096, rng.randrange(1, 20000)])
            assert p.feed(memoryview(text)[i:j]), p.why
            parts.append(p.take())
            i = j
        assert p.finish()
        parts.append(p.take())
        assert sum(t[0] for t in parts) == len(recs)
        for k in (1, 2, 3, 4):
            assert b"".join(t[k] for t in parts) == whole[k]
        assert [q for t in parts for q in t[5]] == whole[5]
        for j in range(len(names)):
            for c in range(6):
                assert b"".join(t[6][j][c] for t in parts) == whole[6][j][c]


def _respell(obj, rng: random.Random) -> str:
    """JSON text of `obj` with keys shuffled and random JSON whitespace between tokens."""
    ws = lambda: "".join(rng.choice(" \t\r") for _ in range(rng.choice([0, 0, 1, 3])))
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return "{" + ws() + ",".join(f"{ws()}{json.dumps(k)}{ws()}:{ws()}{_respell(v, rng)}{ws()}" for k, v in items) + "}"
    if isinstance(obj, list):
        return "[" + ws() + ",".join(ws() + _respell(v, rng) + ws() for v in obj) + ws() + "]"
    lone_surrogate = isinstance(obj, str) and any(0xD800 <= ord(c) < 0xE000 for c in obj)  # escaped, always
    return json.dumps(obj, ensure_ascii=lone_surrogate or rng.random() < 0.5)


def test_any_key_order_whitespace_and_escapes_identical(tmp_path, compiled):
    rng = random.Random(11)
    recs = simulate(SimConfig(n_prompts=3, out_len=12, seed=9))
    names = ["caf\u00e9/\"1\"", "tab\there", "\u2603 snow", "emoji \U0001F600", "sl/ash\\back", "nul\u0000",
             "\u00e9"]  # a lone surrogate is refused by every reader (tests/test_default_campaign.py)
    for i, r in enumerate(recs):
        r["prompt_id"] = names[i % len(names)] + r["prompt_id"]
        r["drafts"]["ngram"]["conf"] = [1 if c > 0.5 else 0 for c in r["drafts"]["ngram"]["conf"]]
        if i % 3 == 0:
            r["drafts"]["eagle"]["expected_accepted"] = r["drafts"]["eagle"]["accepted"]
    path = tmp_path / "blocks_r.jsonl"
    path.write_text("\n".join(" " + _respell(r, rng) + "\r" for r in recs), encoding="utf-8")
    t = _same_outcome([path])
    assert compiled == ["compiled"] and not isinstance(t, str) and t.n_records == len(recs)
    assert "sim/\u00e9" not in t.prompt_ids and any("\u2603" in p for p in t.prompt_ids)


@pytest.mark.parametrize("what,bad", [
    ("escaped key", b'"p\\u006fs":3'), ("escaped drafter name", b'"\\u0078":'), ("bad escape", b'"prompt_id":"a\\x"'),
    ("control character", b'"prompt_id":"a\tb"'), ("overlong UTF-8", b'"prompt_id":"\xc0\xaf"'),
    ("encoded surrogate", b'"prompt_id":"\xed\xa0\x80"'), ("truncated UTF-8", b'"prompt_id":"\xe2\x98"'),
    ("beyond U+10FFFF", b'"prompt_id":"\xf4\x90\x80\x80"'), ("latin-1 byte", b'"prompt_id":"\xe9"'),
    ("BOM", b"\xef\xbb\xbf"), ("true", b'"block":true'), ("null", b'"block":null'),
    ("duplicate drafter", b'"drafts":{"x":'), ("duplicate draft key", b'"accepted":1,"accepted":1'),
    ("duplicate top key", b'"pos":3,"pos":3'), ("unknown draft field", b'"accepted":1,"note":2'),
    ("empty line", b"\n"), ("vertical tab", b"\x0b"), ("two objects", b"}{")])
def test_spellings_it_refuses_end_as_the_exact_path_ends(tmp_path, compiled, what, bad):
    """Each line holds one spelling the parser refuses: it hands the file on, and load_logs then
    loads or fails exactly as the exact path does (valid or not)."""
    text = [_line(r) for r in _records(5)]
    line = text[3]
    if what == "escaped key":
        line = line.replace(b'"pos":3', bad)
    elif what == "escaped drafter name":
        line = line.replace(b'"x":', bad)
    elif what in ("bad escape", "control character", "overlong UTF-8", "encoded surrogate", "truncated UTF-8",
                  "beyond U+10FFFF", "latin-1 byte"):
        line = line.replace(b'"prompt_id":"p"', bad)
    elif what in ("BOM", "vertical tab"):
        line = bad + line
    elif what in ("true", "null"):
        line = line.replace(b'"pos":3', b'"pos":3,' + bad)
    elif what == "duplicate drafter":
        line = line.replace(b'"y":', b'"x":' + json.dumps(GOOD["drafts"]["y"]).encode() + b',"y":')
    elif what == "duplicate draft key":
        line = line.replace(b'"accepted":1', bad)
    elif what == "duplicate top key":
        line = line.replace(b'"pos":3', bad)
    elif what == "unknown draft field":
        line = line.replace(b'"accepted":1', bad)
    elif what == "empty line":
        line = line + bad
    elif what == "two objects":
        line = line[:-1] + b"}" + line
    assert line != text[3]
    text[3] = line
    path = tmp_path / "blocks_b.jsonl"
    path.write_bytes(b"\n".join(text) + b"\n")
    assert _parse(path.read_bytes())[0] is None
    _same_outcome([path])
    assert compiled == [None]


def test_requested_drafters_and_drafters_fixed_by_an_earlier_file(tmp_path, compiled):
    a = tmp_path / "blocks_a.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in _records(4)) + "\n")
    b = tmp_path / "blocks_b.jsonl"
    recs = _records(8)[4:]
    for r in recs:
        r["drafts"] = {"y": r["drafts"]["y"], "x": r["drafts"]["x"]}  # another order: still x and y
    b.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    for drafters in (None, ["y"], ["y", "x"]):
        t = _same_outcome([a, b], drafters)
        assert t.drafters == tuple(drafters or ("x", "y"))
    assert compiled == ["compiled"] * 6


def test_gz_members_and_pieces(tmp_path, compiled, monkeypatch):
    """Concatenated gzip members, tiny decompressed pieces (max_length), a final line without newline."""
    monkeypatch.setattr(fastload, "CHUNK", 37)
    monkeypatch.setattr(fastload, "_READ", 50)
    text = [_line(r) for r in _records(9)]
    path = tmp_path / "blocks_g.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(text[:4]) + b"\n") + gzip.compress(b"\n".join(text[4:])))
    t = _same_outcome([path])
    assert compiled == ["compiled"] and t.n_records == 9
    path.write_bytes(path.read_bytes() + b"\0" * 10)  # trailing garbage after the members
    _same_outcome([path])
    assert compiled[-1] is None


def test_parser_api_misuse():
    with pytest.raises(ValueError):
        colparse.Parser([], [])
    with pytest.raises(ValueError):
        colparse.Parser([b"x"], [True, False])
    with pytest.raises(TypeError):
        colparse.Parser(["x"], [True])  # names are bytes
    p = colparse.Parser.__new__(colparse.Parser)
    with pytest.raises(RuntimeError):
        p.feed(b"{}")
    p = colparse.Parser([b"x", b"y"], [True, True])
    with pytest.raises(TypeError):
        p.feed("text")
    assert not p.feed(b"garbage\n") and p.why and p.lines == 1
    assert not p.feed(_line(GOOD) + b"\n")  # once refused, always refused
    with pytest.raises(RuntimeError):
        p.take()
    p = colparse.Parser([b"x", b"y"], [False, True])  # x checked, not kept
    cols, why = _parse(_line(GOOD) + b"\n", [b"x", b"y"], [False, True])
    assert why is None and cols[6][0] is None and np.frombuffer(cols[6][1][1], np.int64).tolist() == [1]


# ---------------------------------------------------------------- fuzzing

_ALPHABET = b'{}[]",:.-+eE0123456789 \t\r\n\\u/abnrtfxyvsl\x00\x1f\x7f\x80\xbf\xc3\xe2\xed\xf0\xff'


def _mutate(line: bytes, rng: random.Random) -> bytes:
    b = bytearray(line)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(6)
        i = rng.randrange(len(b) + 1) if b else 0
        if op == 0 and b:  # replace a byte
            b[min(i, len(b) - 1)] = rng.choice(_ALPHABET)
        elif op == 1:  # insert a byte
            b.insert(i, rng.choice(_ALPHABET))
        elif op == 2 and b:  # delete a span
            del b[i:i + rng.choice([1, 1, 2, 5])]
        elif op == 3:  # truncate
            del b[i:]
        elif op == 4 and b:  # duplicate a span
            j = min(len(b), i + rng.randrange(1, 30))
            b[j:j] = b[i:j]
        else:  # swap a digit for another, or a number for a special one
            digits = [k for k, c in enumerate(b) if 48 <= c <= 57]
            if digits:
                k = rng.choice(digits)
                b[k:k + 1] = rng.choice([b"0", b"9", b"-0", b"1e400", b"1.5", b"1e-9", b"99999999999999999999"])
    return bytes(b)


def _fuzz_base() -> list[bytes]:
    recs = _records(4)
    recs[0].update(block=0, target_ms=12.5)
    recs[1]["drafts"]["x"].update(expected_accepted=1.5, ms=0.25)
    recs[1]["prompt_id"] = "p\u00e9\"q"
    recs[2]["drafts"]["y"].update(tokens=[], accepted=0, conf=[], entropy=[])
    recs[3]["drafts"]["x"].update(conf=[1, 0.125e1 / 2, 3e-5], entropy=[0, 2.5, 1e-300])
    return [json.dumps(r, separators=(",", ":") if i % 2 else (", ", ": ")).encode() for i, r in enumerate(recs)]


def test_fuzz_parser_never_crashes_and_accepts_only_valid_lines():
    """Thousands of mutated lines straight into the parser: no crash, and every line it accepts is
    one the exact checks accept too, with the same values."""
    rng = random.Random(2024)
    base = _fuzz_base()
    accepted = 0
    for trial in range(50000):
        line = _mutate(rng.choice(base), rng)
        cols, why = _parse(line + rng.choice([b"", b"\n"]))
        if cols is None or cols[0] == 0:
            continue
        accepted += 1
        objs = [logs._parse_exact(s, "fuzz", 1, True) for s in line.split(b"\n")]  # raise if the exact path refuses
        for obj in objs:
            logs._check_record(obj, "fuzz", 1)
        if len(objs) > 1:
            continue
        obj = objs[0]
        assert sorted(obj["drafts"]) == ["x", "y"]
        assert np.frombuffer(cols[1], np.int64).tolist() == [obj["pos"]]
        for j, name in enumerate(("x", "y")):
            d = obj["drafts"][name]
            assert np.frombuffer(cols[6][j][5], np.float64).tobytes() == np.array(d["entropy"], float).tobytes()
            assert np.frombuffer(cols[6][j][4], np.float64).tobytes() == np.array(d["conf"], float).tobytes()
            assert np.frombuffer(cols[6][j][0], np.int64).tolist() == [d["accepted"]]
    assert accepted > 500  # mutations that stay valid (a digit changed, whitespace added) are common


def test_fuzz_load_logs_same_table_or_same_error(tmp_path, compiled):
    """Mutated and truncated records in files: the compiled configuration and the exact path agree."""
    rng = random.Random(99)
    base = _fuzz_base()
    path = tmp_path / "blocks_f.jsonl"
    read = 0
    for trial in range(800):
        lines = list(base)
        k = rng.randrange(len(lines))
        lines[k] = _mutate(lines[k], rng)
        tail = rng.choice([b"\n", b"", b"\n\n"])
        path.write_bytes(b"\n".join(lines) + tail)
        _same_outcome([path])
        read += compiled[-1] == "compiled"
    assert 10 < read < 800  # most mutants are invalid; the table tests above cover valid files
