"""Block-log records the exact way: the text of a log, each line parsed by the standard library and
checked field by field, every problem named `PATH:LINE: FIELD: problem`.

The reference reader of `bandit.logs.reader.load_logs`. `Text` is the one decompression loop every reader
streams a log through (the sha256 of the file computed on the way); `read_exact` turns a file into
validated columns (`Columns`); `iter_records` yields its records one by one. The fast reader
(bandit/logs/columnar.py) hands every file it refuses to `read_exact`, so that an error always comes
from here, identically whichever reader saw the file first.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import zlib
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from bandit.logs.schema import FEATURES, SCHEMA_VERSION, features, tree_depths
from bandit.logs.table import LogError


# ---------------------------------------------------------------- the text of a log

READ = 1 << 22  # compressed bytes read at a time
PIECE = 1 << 24  # most bytes one inflate call returns: a small file may inflate to anything
BATCH = 4096  # lines parsed and checked together (small: freed memory is reused at once)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (as `Text` computes it while streaming)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while raw := f.read(READ):
            h.update(raw)
    return h.hexdigest()


class Text:
    """The decompressed text of a .jsonl or .jsonl.gz file in chunks of whole lines, about `chunk`
    bytes each (the last may lack its newline); `sha256` of the file's bytes is set once exhausted.

    Never holds the whole text: a 1M-record log is ~1 GB of it. A gzip stream that is damaged or
    ends early is a LogError of the file as a whole (line 0).
    """

    def __init__(self, path: str | Path, chunk: int = READ):
        self.path, self.chunk, self.sha256 = Path(path), chunk, None

    def _pieces(self) -> Iterator[bytes]:
        h = hashlib.sha256()
        gz = self.path.name.endswith(".gz")
        d = zlib.decompressobj(wbits=31)
        with open(self.path, "rb") as f:
            while raw := f.read(READ):
                h.update(raw)
                if not gz:
                    yield raw
                    continue
                while True:  # until the input is used up and inflate has nothing more to give
                    try:
                        out = d.decompress(raw, PIECE)
                    except zlib.error as e:
                        raise LogError(self.path, 0, "file", f"not a readable gzip file ({e})") from None
                    if out:
                        yield out
                    if d.eof:
                        raw = d.unused_data
                        if not raw:
                            break
                        d = zlib.decompressobj(wbits=31)  # concatenated gzip members
                    else:
                        raw = d.unconsumed_tail
                        if not raw and len(out) < PIECE:
                            break
        if gz and not d.eof:
            raise LogError(self.path, 0, "file", "not a readable gzip file (truncated: the stream ends early)")
        self.sha256 = h.hexdigest()

    def __iter__(self) -> Iterator[bytes]:
        parts, size = [], 0
        for piece in self._pieces():
            parts.append(piece)
            size += len(piece)
            if size >= self.chunk:
                buf = b"".join(parts)
                k = buf.rfind(b"\n") + 1
                if k:
                    yield buf[:k]
                parts, size = [buf[k:]], len(buf) - k
        if size:
            yield b"".join(parts)


def line_batches(text: Text, batch: int | None = None) -> Iterator[tuple[list[int], list[bytes], bool]]:
    """(line numbers, lines, last) of the non-blank lines, `batch` (default BATCH) lines of the file at a
    time; `last` marks the batch holding the file's last non-blank line."""
    ln, prev, batch = 1, None, batch or BATCH
    for chunk in text:
        lines = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            lines.pop()  # what follows the final newline
        for s in range(0, len(lines), batch):
            part = lines[s : s + batch]
            keep = [i for i, x in enumerate(part) if x.strip()]
            if keep:
                if prev is not None:
                    yield prev[0], prev[1], False
                prev = ([ln + i for i in keep], part if len(keep) == len(part) else [part[i] for i in keep])
            ln += len(part)
    if prev is not None:
        yield prev[0], prev[1], True


# ---------------------------------------------------------------- one record, exactly

_INT64_END = 2**63  # pos and block are stored as int64


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return d


def _bad_number(x) -> bool:
    """NaN or infinity, or an int too large to become a float (the table stores floats)."""
    if type(x) is int:
        try:
            float(x)
        except OverflowError:
            return True
        return False
    return isinstance(x, float) and not math.isfinite(x)


def _find_nonfinite(obj, where: str = "") -> str | None:
    """The field path of the first NaN or infinity in `obj`, or None."""
    if isinstance(obj, float):
        return where if not math.isfinite(obj) else None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        f = _find_nonfinite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else k)
        if f is not None:
            return f
    return None


def parse_exact(line: bytes, path: Path, ln: int, is_last: bool):
    """The reference parse of one line (stdlib json): duplicate keys and NaN/Infinity are errors."""
    try:
        obj = json.loads(line, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise LogError(path, ln, str(e), "duplicate key in one JSON object") from None
    except RecursionError:
        raise LogError(path, ln, "line", "nested too deeply (a JSON value inside thousands of brackets)") from None
    except ValueError as e:
        what = "truncated last line (an interrupted write?)" if is_last else "not valid JSON"
        raise LogError(path, ln, "line", f"{what}: {str(e).splitlines()[0]}") from None
    bad = _find_nonfinite(obj)
    if bad is not None:
        raise LogError(path, ln, bad, "not finite (NaN and Infinity are not allowed)")
    return obj


def check_record(obj, path: Path, ln: int) -> None:
    """Full per-record validation; raises LogError at the first problem."""

    def err(fld: str, msg: str):
        raise LogError(path, ln, fld, msg)

    if not isinstance(obj, dict):
        err("record", f"expected a JSON object, got {type(obj).__name__}")
    for k in ("v", "workload", "prompt_id", "pos", "drafts"):
        if k not in obj:
            err(k, "missing field")
    if type(obj["v"]) is not int or obj["v"] != SCHEMA_VERSION:
        err("v", f"unknown schema version {obj['v']!r} (this reader knows {SCHEMA_VERSION})")
    for k in ("workload", "prompt_id"):
        if not isinstance(obj[k], str) or not obj[k]:
            err(k, f"expected a non-empty string, got {obj[k]!r}")
    if type(obj["pos"]) is not int:
        err("pos", f"expected an int, got {type(obj['pos']).__name__} {obj['pos']!r}")
    if obj["pos"] < 0:
        err("pos", f"must be >= 0, got {obj['pos']}")
    if obj["pos"] >= _INT64_END:
        err("pos", f"must be < 2**63, got {obj['pos']}")
    if "block" in obj and (type(obj["block"]) is not int or not 0 <= obj["block"] < _INT64_END):
        err("block", f"expected an int in [0, 2**63), got {obj['block']!r}")
    if "target_ms" in obj and (
        type(obj["target_ms"]) not in (int, float) or _bad_number(obj["target_ms"]) or obj["target_ms"] < 0
    ):
        err("target_ms", f"expected a finite number >= 0, got {obj['target_ms']!r}")
    drafts = obj["drafts"]
    if not isinstance(drafts, dict) or not drafts:
        err("drafts", "expected an object with at least one drafter")
    for name, d in drafts.items():
        f = f"drafts.{name}"
        if not isinstance(d, dict):
            err(f, f"expected an object, got {type(d).__name__}")
        for k in ("tokens", "accepted", "conf", "entropy"):
            if k not in d:
                err(f"{f}.{k}", "missing field")
        toks = d["tokens"]
        if not isinstance(toks, list) or any(type(t) is not int for t in toks):
            err(f"{f}.tokens", "expected a list of ints")
        if type(d["accepted"]) is not int:
            err(f"{f}.accepted", f"expected an int, got {type(d['accepted']).__name__} {d['accepted']!r}")
        if not 0 <= d["accepted"] <= len(toks):
            err(f"{f}.accepted", f"must be in [0, len(tokens)={len(toks)}], got {d['accepted']}")
        if "parents" in d:  # a tree of drafts (harness/drafters/eagle3.py `tree`): node i hangs under parents[i]
            par = d["parents"]
            if not isinstance(par, list) or len(par) != len(toks) or any(type(x) is not int for x in par):
                err(f"{f}.parents", f"expected a list of {len(toks)} ints, one per token")
            try:
                deepest = max(tree_depths(par), default=0)
            except ValueError as e:
                err(f"{f}.parents", str(e))
            if d["accepted"] > deepest:
                err(f"{f}.accepted", f"{d['accepted']} exceeds the tree's depth {deepest}")
        for k, lo, hi in (("conf", 0.0, 1.0), ("entropy", 0.0, math.inf)):
            xs = d[k]
            if not isinstance(xs, list) or any(type(x) not in (int, float) for x in xs):
                err(f"{f}.{k}", "expected a list of numbers")
            if len(xs) != len(toks):
                err(f"{f}.{k}", f"has {len(xs)} values for {len(toks)} tokens")
            for i, x in enumerate(xs):
                if _bad_number(x):
                    err(f"{f}.{k}[{i}]", f"not finite: {x}")
                if not lo <= x <= hi:
                    err(f"{f}.{k}[{i}]", f"{x} outside [{lo}, {hi}]")
        for k in ("expected_accepted", "ms"):
            if k in d:
                x = d[k]
                if type(x) not in (int, float) or _bad_number(x) or x < 0:
                    err(f"{f}.{k}", f"expected a finite number >= 0, got {x!r}")
        if "expected_accepted" in d and d["expected_accepted"] > len(toks) + 1e-9:
            err(f"{f}.expected_accepted", f"{d['expected_accepted']} exceeds len(tokens)={len(toks)}")


def iter_records(path: Path, errors: list[LogError] | None = None):
    """Yield (line number, record) of one file, validated exactly record by record. With `errors`
    collect problems instead of raising."""
    path = Path(path)
    try:
        for lns, lines, last in line_batches(Text(path)):
            for i, (ln, line) in enumerate(zip(lns, lines)):
                try:
                    obj = parse_exact(line, path, ln, last and i == len(lines) - 1)
                    check_record(obj, path, ln)
                except LogError as e:
                    if errors is None:
                        raise
                    errors.append(e)
                    continue
                yield ln, obj
    except LogError as e:  # the file as a whole (gzip)
        if errors is None:
            raise
        errors.append(e)


# ---------------------------------------------------------------- which drafters a load keeps


class Drafters:
    """Which drafters a load keeps: those asked for, else the first record's (then every record must match)."""

    def __init__(self, requested: Sequence[str] | None):
        if requested and len(set(requested)) != len(requested):
            twice = next(n for i, n in enumerate(requested) if n in requested[:i])
            raise LogError("--drafters", 0, twice, "named twice (each drafter once)")
        self.requested = tuple(requested) if requested else None
        self.names: tuple[str, ...] = self.requested or ()
        self.first = ""  # PATH:LINE of the record that fixed `names`

    def _fix(self, have, where: str) -> tuple[str, ...]:
        if not self.names:
            self.names, self.first = tuple(sorted(have)), where
        return self.names

    def check(self, obj: dict, path: Path, ln: int) -> None:
        """After `check_record`: the record holds the drafters this load needs (and only them, unless asked)."""
        have = obj["drafts"]
        names = self._fix(have, f"{path}:{ln}")
        if self.requested:
            for n in self.requested:
                if n not in have:
                    raise LogError(path, ln, f"drafts.{n}", "requested drafter missing in this record")
            return
        missing, extra = [n for n in names if n not in have], sorted(set(have) - set(names))
        pick = "; pick drafters present in every record with --drafters"
        if missing:
            why = f"drafter missing in this record (present in {self.first})"
            raise LogError(path, ln, f"drafts.{missing[0]}", why + pick)
        if extra:
            raise LogError(path, ln, f"drafts.{extra[0]}", f"drafter absent from {self.first}" + pick)

    def fits(self, cols: "Keys") -> bool:
        """Whether `check` passes every record of a file whose records all hold `cols.drafters` (the names
        then fixed, as `check` fixes them); False: the exact path must read the file and say why."""
        if self.requested:
            return all(n in cols.drafters for n in self.requested)
        if self.names:
            return set(self.names) == set(cols.drafters)
        self._fix(cols.drafters, cols.where(0))
        return True


# ---------------------------------------------------------------- validated columns


@dataclass
class Keys:
    """One log file's n records as a load first needs them: where they are, their keys and drafters."""

    path: str  # the file errors name (a cached log: the log)
    sha256: str  # of that file
    drafters: tuple[str, ...]  # D drafters of every record (those kept, where records differ)
    pairs: list  # distinct (workload, prompt_id) pairs
    code: np.ndarray  # (n,) int32: index into `pairs`
    pos: np.ndarray  # (n,) int64
    line: np.ndarray | None  # (n,) int64 line numbers; None: rows 1..n of a Parquet file
    uniform: bool = True  # every record holds exactly `drafters` (then it may be cached)

    @property
    def n(self) -> int:
        return len(self.pos)

    def where(self, i: int) -> str:
        """Where record i is: PATH:LINE, or PATH row N in a Parquet file."""
        return f"{self.path}:{self.line[i]}" if self.line is not None else f"{self.path} row {i + 1}"

    def error(self, i: int, field: str, problem: str) -> LogError:
        """A problem of record i (or of the file as a whole: i = -1)."""
        if self.line is not None:
            return LogError(self.path, int(self.line[i]) if i >= 0 else 0, field, problem)
        return LogError(self.path, i + 1, field, f"row {i + 1}: {problem}" if i >= 0 else problem)

    def fill(self, out: dict, rows, names: Sequence[str]) -> None:
        """Write the records' values into out[field][rows] for drafters `names` (out: the table's arrays)."""
        raise NotImplementedError


@dataclass
class Columns(Keys):
    """Keys and values of one log file's records, validated, in file order (BlockTable's dtypes and shapes)."""

    block: np.ndarray = None  # (n,) int64, -1 where absent
    target_ms: np.ndarray = None  # (n,) float64, NaN where absent
    accepted: np.ndarray = None  # (n, D) int32
    draft_len: np.ndarray = None  # (n, D) int32
    expected_accepted: np.ndarray = None  # (n, D) float64, NaN where absent
    ms: np.ndarray = None  # (n, D) float64, NaN where absent
    features: np.ndarray = None  # (n, D, 4) float64

    def fill(self, out: dict, rows, names: Sequence[str]) -> None:
        j = [self.drafters.index(n) for n in names]
        for k in VALUES:
            a = getattr(self, k)
            out[k][rows] = a if a.ndim == 1 else a[:, j]


VALUES = ("block", "target_ms", "accepted", "draft_len", "expected_accepted", "ms", "features")  # Columns' values
COLUMNS = ("code", "pos") + VALUES  # the arrays a reader makes, `line` aside


def _batch(objs: list[dict], names: Sequence[str], pairs: dict) -> dict:
    """The columns of checked records for drafters `names`; `pairs` numbers the (workload, prompt_id) seen."""
    n, D = len(objs), len(names)
    get = lambda k, missing: [o.get(k, missing) for o in objs]
    code = (pairs.setdefault((o["workload"], o["prompt_id"]), len(pairs)) for o in objs)
    out = {"code": np.fromiter(code, np.int32, n), "pos": np.fromiter((o["pos"] for o in objs), np.int64, n)}
    # int64 straight from the Python ints: a float64 round trip would merge 2**53 + 1 into 2**53
    out["block"] = np.fromiter(get("block", -1), np.int64, n)
    out["target_ms"] = np.array(get("target_ms", math.nan), np.float64)
    out |= {k: np.empty((n, D), np.int32) for k in ("accepted", "draft_len")}
    out |= {k: np.empty((n, D)) for k in ("expected_accepted", "ms")}
    out["features"] = np.empty((n, D, len(FEATURES)))
    for j, name in enumerate(names):
        ds = [o["drafts"][name] for o in objs]
        L = np.fromiter((len(d["tokens"]) for d in ds), np.int64, n)
        c = np.fromiter(chain.from_iterable(d["conf"] for d in ds), np.float64, int(L.sum()))
        e = np.fromiter(chain.from_iterable(d["entropy"] for d in ds), np.float64, int(L.sum()))
        out["accepted"][:, j], out["draft_len"][:, j] = np.fromiter((d["accepted"] for d in ds), np.int64, n), L
        out["expected_accepted"][:, j] = np.array([d.get("expected_accepted", math.nan) for d in ds], np.float64)
        out["ms"][:, j] = np.array([d.get("ms", math.nan) for d in ds], np.float64)
        out["features"][:, j] = features(c, e, L)
    return out


def read_exact(path: Path, dr: Drafters) -> Columns:
    """Every record of one file parsed and checked exactly, as columns; raises LogError at the first problem.

    Keeps the columns of every drafter when all records hold the same ones, else of the drafters asked for.
    """
    path = Path(path)
    text, pairs, parts, lines_seen = Text(path), {}, [], []
    first: frozenset | None = None
    uniform = True
    gc_on = gc.isenabled()
    gc.disable()  # millions of short-lived containers: the collector would rescan them, finding nothing
    try:
        for lns, lines, last in line_batches(text):
            objs = [parse_exact(s, path, ln, last and i == len(lines) - 1) for i, (ln, s) in enumerate(zip(lns, lines))]
            for ln, o in zip(lns, objs):  # raises at the first problem, named by file, line and field
                check_record(o, path, ln)
                dr.check(o, path, ln)
            first = frozenset(objs[0]["drafts"]) if first is None else first
            uniform = uniform and all(o["drafts"].keys() == first for o in objs)
            names = tuple(sorted(first)) if uniform else dr.names
            parts.append((names, _batch(objs, names, pairs)))
            lines_seen.append(np.asarray(lns, np.int64))
            del objs
    finally:
        if gc_on:
            gc.enable()
    if not parts:
        raise LogError(path, 0, "file", "no records (empty file)")
    names = parts[-1][0]  # a batch kept more drafters than the last one: keep those of the last
    keep = lambda bn, a: a if bn == names or a.ndim == 1 else a[:, [bn.index(n) for n in names]]
    cols = {k: np.concatenate([keep(bn, b[k]) for bn, b in parts]) for k in COLUMNS}
    line = np.concatenate(lines_seen)
    return Columns(str(path), text.sha256, names, list(pairs), line=line, uniform=uniform, **cols)
