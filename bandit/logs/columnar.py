"""Block logs as columns: pyarrow's JSON reader, the Parquet block files, and the Parquet cache of logs.

Three jobs, one format. (1) `read_arrow` parses a JSON-lines log with pyarrow's reader and checks
its columns with numpy; it returns None for a file it is not sure of (any check failing, a spelling
pyarrow reads more leniently than the standard library), which `bandit.logs.reader.read_log` then hands
to the exact path (bandit/logs/records.py), so that an error is always the exact path's. (2) A block
Parquet file holds one log's validated columns, records in file order (`table_of`): `workload`,
`prompt_id`, `pos`, `block` (-1: none), `target_ms` (NaN: none), in a cache `line`, and per
drafter NAME `drafts.NAME.accepted`, `.draft_len` (int32), `.expected_accepted`, `.ms` (NaN: none)
and the FEATURES (float64). `ParquetPart` reads one and checks every value. (3) A cached copy of a
log is such a file too (bandit/logs/logcache.py writes and finds it); `ParquetPart(cache_of=log)` checks
it against the log's sha256, the schema and the digest of its own content (`content_digest`).

Columns become numpy arrays by their buffers, never through pandas (pyarrow imports it for
`to_numpy` and `pa.array`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from bandit.logs.safeio import write_file
from bandit.logs.records import COLUMNS, Columns, Keys, LogError, Text, file_sha256
from bandit.logs.schema import FEATURES, SCHEMA_VERSION, features

CHUNK = 1 << 24  # decompressed bytes parsed by one read_json call
BLOCK = 1 << 20  # pyarrow's block: the unit its threads parse in parallel; a longer line goes the exact path
FORMAT = "specbandit-blocks-1"  # the Parquet layout; a cache of another layout is not read
ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, pa.ArrowCapacityError)
DRAFT_COLUMNS = (("accepted", pa.int32()), ("draft_len", pa.int32()), ("expected_accepted", pa.float64()))
DRAFT_COLUMNS += (("ms", pa.float64()),) + tuple((f, pa.float64()) for f in FEATURES)
STRINGS = (pa.string(), pa.large_string())
BASE_COLUMNS = (("workload", STRINGS), ("prompt_id", STRINGS), ("pos", (pa.int64(),)), ("block", (pa.int64(),)))
BASE_COLUMNS += (("target_ms", (pa.float64(),)),)


class Unfit(Exception):
    """This file is not for the pyarrow reader (or is invalid): the exact path must read it."""


class StaleCache(Exception):
    """A cached copy failed its checks: the load must read the log itself (args[0]); args[1], where given: why,
    said in a note (a copy of an older layout or another log is routine, a copy edited in place is not)."""


# ---------------------------------------------------------------- arrays from pyarrow, with plain numpy


def _np(a: pa.Array, dtype) -> np.ndarray:
    """A primitive array (nulls: any value) as a zero-copy numpy view."""
    dtype, buf = np.dtype(dtype), a.buffers()[1]
    return np.zeros(len(a), dtype) if buf is None else np.frombuffer(buf, dtype, len(a), a.offset * dtype.itemsize)


def _valid(a: pa.Array) -> np.ndarray:
    """(n,) bool: not null."""
    if not a.null_count:
        return np.ones(len(a), bool)
    bits = np.unpackbits(np.frombuffer(a.buffers()[0], np.uint8), bitorder="little")
    return bits[a.offset : a.offset + len(a)].astype(bool)


def _dictionary(a: pa.Array) -> tuple[np.ndarray, list[str]]:
    """(n,) int32 codes and the distinct strings of a string column."""
    d = a if pa.types.is_dictionary(a.type) else a.dictionary_encode()
    return _np(d.indices.cast(pa.int32()), np.int32), d.dictionary.to_pylist()


def _codes(w: pa.Array, p: pa.Array, pairs: dict) -> np.ndarray:
    """(n,) int32 index into `pairs` (extended) of each record's (workload, prompt_id); Unfit on an empty one."""
    (wi, wd), (pi, pd) = _dictionary(w), _dictionary(p)
    uk, inv = np.unique(wi.astype(np.int64) * max(len(pd), 1) + pi, return_inverse=True)
    names = [(wd[k // len(pd)], pd[k % len(pd)]) for k in uk.tolist()]
    if any(not a or not b for a, b in names):
        raise Unfit
    return np.fromiter((pairs.setdefault(k, len(pairs)) for k in names), np.int32, len(names))[inv.ravel()]


# ---------------------------------------------------------------- JSON lines with pyarrow


def _json_schema(drafters: Sequence[str]) -> pa.Schema:
    i64, f64, lists = pa.int64(), pa.float64(), pa.list_
    draft = [("tokens", lists(i64)), ("accepted", i64), ("conf", lists(f64)), ("entropy", lists(f64))]
    draft = pa.struct(draft + [("expected_accepted", f64), ("ms", f64)])
    top = [("v", i64), ("workload", pa.string()), ("prompt_id", pa.string()), ("pos", i64), ("block", i64)]
    return pa.schema(top + [("target_ms", f64), ("drafts", pa.struct([(n, draft) for n in drafters]))])


def _lines(chunk: bytes) -> int:
    """The number of lines in `chunk` if every line is one `{...}` object alone on it, else raise Unfit.

    Every newline must sit between `}` and `{` (or end the chunk): valid JSON cannot have `}` and
    `{` adjacent inside a value, so each line is then one whole object, no line is blank, and the
    row count pyarrow reports must equal this line count. A `null` anywhere (even inside a string)
    also sends the file to the exact path: pyarrow reads a `null` as an absent optional field; so does a tree
    draft's `parents`, which only the exact path checks.
    """
    nl = chunk.endswith(b"\n")
    inner = chunk.count(b"\n") - nl
    ends = chunk[:1] == b"{" and chunk[len(chunk) - 1 - nl : len(chunk) - nl] == b"}"
    if not ends or chunk.count(b"}\n{") != inner or b"null" in chunk or b'"parents"' in chunk:
        raise Unfit  # a tree draft's parents are checked by the exact path (bandit/logs/records.py)
    return inner + 1


def _optional(a: pa.Array) -> np.ndarray:
    """An optional number >= 0: float64, NaN where absent; NaN or infinity written in the file are unfit."""
    x, ok = _np(a, np.float64), _valid(a)
    if not np.isfinite(x[ok]).all() or (x[ok] < 0).any() or np.signbit(x[ok]).any():
        raise Unfit  # -0.0: written `-0.0` it is -0.0, written `-0` (an int) it is 0.0: the exact path tells
    return x if ok.all() else np.where(ok, x, np.nan)


def _required(a: pa.Array) -> np.ndarray:
    if a.null_count:
        raise Unfit
    return _np(a, np.int64)


def _list(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, flat float64 values) of a list column without nulls."""
    if a.null_count or a.values.null_count:
        raise Unfit
    off = _np(a.offsets, np.int32)
    return off - off[0], _np(a.flatten(), np.float64)


def _chunk_columns(t: pa.Table, names: Sequence[str], pairs: dict) -> dict:
    """The checked columns of one parsed chunk (`Columns` fields); raises Unfit at the first doubt."""
    col = lambda k: t.column(k).chunk(0)  # the table is combined: one chunk a column
    w, p, drafts = col("workload"), col("prompt_id"), col("drafts")
    if (_required(col("v")) != SCHEMA_VERSION).any() or w.null_count or p.null_count or drafts.null_count:
        raise Unfit
    out = {"code": _codes(w, p, pairs), "pos": _required(col("pos"))}
    blk, has = _np(col("block"), np.int64), _valid(col("block"))
    if (out["pos"] < 0).any() or (blk[has] < 0).any():
        raise Unfit
    out |= {"block": np.where(has, blk, -1), "target_ms": _optional(col("target_ms"))}
    out |= {k: np.empty((t.num_rows, len(names)), np.int32) for k in ("accepted", "draft_len")}
    out |= {k: np.empty((t.num_rows, len(names))) for k in ("expected_accepted", "ms")}
    out["features"] = np.empty((t.num_rows, len(names), len(FEATURES)))
    for j, name in enumerate(names):
        d = drafts.field(name)
        if d.null_count or d.field("tokens").null_count or d.field("tokens").values.null_count:
            raise Unfit
        tok_off = _np(d.field("tokens").offsets, np.int32)
        (conf_off, c), (ent_off, e) = _list(d.field("conf")), _list(d.field("entropy"))
        L = np.diff(tok_off).astype(np.int64)
        if not (np.array_equal(tok_off - tok_off[0], conf_off) and np.array_equal(conf_off, ent_off)):
            raise Unfit
        a = _required(d.field("accepted"))
        if (a < 0).any() or (a > L).any() or not (np.isfinite(c).all() and np.isfinite(e).all()):
            raise Unfit
        if ((c < 0) | (c > 1)).any() or (e < 0).any() or np.signbit(c).any() or np.signbit(e).any():
            raise Unfit  # -0.0 as in `_optional`
        ea, ms = _optional(d.field("expected_accepted")), _optional(d.field("ms"))
        if (ea > L + 1e-9).any():
            raise Unfit
        for k, x in (("accepted", a), ("draft_len", L), ("expected_accepted", ea), ("ms", ms)):
            out[k][:, j] = x
        out["features"][:, j] = features(c, e, L)
    return out


def read_arrow(path: Path) -> Columns | None:
    """One log's columns read by pyarrow and checked, all its drafters; None: read it on the exact path."""
    text = Text(path, CHUNK)
    try:
        return _read_arrow(Path(path), text)
    except (Unfit, LogError, json.JSONDecodeError, UnicodeDecodeError, RecursionError, *ARROW_ERRORS):
        return None


def _read_arrow(path: Path, text: Text) -> Columns:
    ropts = pj.ReadOptions(use_threads=True, block_size=BLOCK)
    opts, names, pairs, parts = None, (), {}, []
    for chunk in text:
        n = _lines(chunk)
        if opts is None:  # the first record's drafters: every record must hold exactly these
            first = json.loads(chunk[: chunk.find(b"\n")] if b"\n" in chunk else chunk)
            if not isinstance(first, dict) or not isinstance(first.get("drafts"), dict) or not first["drafts"]:
                raise Unfit
            names = tuple(sorted(first["drafts"]))
            opts = pj.ParseOptions(explicit_schema=_json_schema(names), unexpected_field_behavior="error")
        t = pj.read_json(pa.BufferReader(chunk), read_options=ropts, parse_options=opts)
        del chunk
        if t.num_rows != n:
            raise Unfit
        parts.append(_chunk_columns(t.combine_chunks(), names, pairs))
    if not parts:
        raise Unfit  # no records: the exact path says so
    cols = {k: np.concatenate([b[k] for b in parts]) for k in COLUMNS}
    line = np.arange(1, len(cols["pos"]) + 1, dtype=np.int64)
    return Columns(path=str(path), sha256=text.sha256, drafters=names, pairs=list(pairs), line=line, **cols)


# ---------------------------------------------------------------- block Parquet files


def _arrow(x: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy array as a pyarrow one, by its buffer."""
    x = np.ascontiguousarray(x, typ.to_pandas_dtype())
    return pa.Array.from_buffers(typ, len(x), [None, pa.py_buffer(x)])


def _strings(idx: np.ndarray, names: list[str]) -> pa.Array:
    """(n,) strings names[idx]; raises UnicodeEncodeError on a name that is not valid Unicode."""
    data = [s.encode("utf-8") for s in names]
    off = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(b) for b in data], out=off[1:])
    values = pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(off), pa.py_buffer(b"".join(data))])
    return pa.DictionaryArray.from_arrays(_arrow(idx, pa.int32()), values).cast(pa.string())


def table_of(cols: Columns, meta: dict[str, str], with_line: bool) -> pa.Table:
    """One log's validated columns as the Parquet layout (module docstring), records in file order."""
    arrays = {}
    for i, k in enumerate(("workload", "prompt_id")):
        names = sorted({pair[i] for pair in cols.pairs})
        at = {s: c for c, s in enumerate(names)}
        arrays[k] = _strings(np.fromiter((at[pair[i]] for pair in cols.pairs), np.int32)[cols.code], names)
    for k, typ in (("pos", pa.int64()), ("block", pa.int64()), ("target_ms", pa.float64())):
        arrays[k] = _arrow(getattr(cols, k), typ)
    if with_line:
        arrays["line"] = _arrow(cols.line, pa.int64())
    for j, d in enumerate(cols.drafters):
        vals = [cols.accepted[:, j], cols.draft_len[:, j], cols.expected_accepted[:, j], cols.ms[:, j]]
        for (k, typ), v in zip(DRAFT_COLUMNS, vals + list(cols.features[:, j].T)):
            arrays[f"drafts.{d}.{k}"] = _arrow(v, typ)
    return pa.Table.from_arrays(
        list(arrays.values()), names=list(arrays), metadata=file_metadata(meta)
    )  # pa.table: pandas


def content_digest(table: pa.Table) -> str:
    """sha256 of a table's columns in a canonical form (names decoded from dictionaries, one chunk, Arrow IPC),
    metadata aside: what a cached copy carries of itself and is checked against on every load."""
    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in table.columns]
    canon = pa.Table.from_arrays(cols, names=table.column_names).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, canon.schema) as w:
        w.write_table(canon)
    return hashlib.sha256(sink.getvalue()).hexdigest()


def native(path: Path) -> pa.NativeFile:
    """The file opened by its bytes (os.fsencode): pyarrow's own path handling cannot take a name with a byte
    that is not UTF-8 (a surrogate escape), which a run directory may hold."""
    return pa.memory_map(os.fsencode(path))


def file_metadata(meta: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in {"specbandit.format": FORMAT, **meta}.items()}


def block_table(part: Keys, meta: dict[str, str]) -> pa.Table:
    """A validated log's columns as the block Parquet file `pack` writes (no line numbers): from memory,
    or copied from its cache."""
    if isinstance(part, Columns):
        return table_of(part, meta, with_line=False)
    return pq.read_table(native(part.file)).drop_columns(["line"]).replace_schema_metadata(file_metadata(meta))


def write_parquet(path: Path, table: pa.Table, replace_different: bool = True) -> bool:
    """`write_file` of a block table: lz4 (reads 2-3x faster than zstd's, files 1.4x larger), no statistics
    (nothing reads them), the names dictionary-coded and pos, block, line delta-coded (runs of small steps)."""
    how = dict(compression="lz4", write_statistics=False, use_dictionary=["workload", "prompt_id"])
    how["column_encoding"] = {k: "DELTA_BINARY_PACKED" for k in ("pos", "block", "line") if k in table.column_names}
    return write_file(path, lambda f: pq.write_table(table, f, **how), replace_different)


class ParquetPart(Keys):
    """A block Parquet file: its layout and keys checked on opening, its values on `fill`; rows in file order.

    A user's file raises LogError naming the file, the row (1-based) and the column; a cached copy
    (`cache_of`: the log it copies) raises StaleCache instead: the load then reads the log itself.
    """

    def __init__(self, path: Path, cache_of: Path | None = None, sha256: str | None = None):
        self.file, self.cache_of = Path(path), cache_of
        empty = np.empty(0, np.int64)
        super().__init__(str(cache_of or path), "", (), [], empty.astype(np.int32), empty, empty, True)
        self.pf = self._open()
        meta = {k.decode(): v.decode("utf-8", "replace") for k, v in (self.pf.schema_arrow.metadata or {}).items()}
        self.drafters = self._layout()
        self.pf = self._open(["workload", "prompt_id"])  # names as dictionaries: no string per row
        ours = meta.get("specbandit.format") == FORMAT and meta.get("specbandit.sha256") == sha256
        ours = ours and meta.get("specbandit.schema") == str(SCHEMA_VERSION)
        if cache_of is not None and not (ours and self.line is not None):
            raise StaleCache(str(cache_of))
        if cache_of is not None and meta.get("specbandit.digest") != self._digest():
            raise StaleCache(str(cache_of), "its content differs from the digest it was written with")
        self.sha256 = sha256 if cache_of is not None else file_sha256(self.file)
        self._keys()

    def _digest(self) -> str:
        """The digest of the file's columns as read now (a cache edited in place keeps its name and metadata)."""
        try:
            return content_digest(pq.read_table(native(self.file)))
        except (OSError, *ARROW_ERRORS):
            return ""

    def _open(self, dictionaries: list[str] | None = None) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(native(self.file), read_dictionary=dictionaries)
        except (OSError, *ARROW_ERRORS) as e:
            raise self._bad(-1, "file", f"not a readable Parquet file ({e})") from None

    def _bad(self, row: int, field: str, problem: str):
        """The error of a problem at `row` (0-based; -1: the file as a whole)."""
        if self.cache_of is not None:
            return StaleCache(str(self.cache_of))
        return LogError(self.file, row + 1, field, f"row {row + 1}: {problem}" if row >= 0 else problem)

    def _layout(self) -> tuple[str, ...]:
        """The drafters, from the column names; raises at a missing, unknown or mistyped column."""
        schema = self.pf.schema_arrow
        have = {f.name: f.type for f in schema}
        if len(have) != len(schema):
            raise self._bad(-1, "file", "a column name appears twice")
        drafters = sorted(n[7:-9] for n in have if n.startswith("drafts.") and n.endswith(".accepted"))
        want = dict(BASE_COLUMNS) | {"line": (pa.int64(),)}
        want |= {f"drafts.{d}.{k}": (t,) for d in drafters for k, t in DRAFT_COLUMNS}
        for name, types in want.items():
            t = have.get(name, pa.int64() if name == "line" else None)
            if t is None:
                raise self._bad(-1, name, "missing column")
            if name in ("workload", "prompt_id") and pa.types.is_dictionary(t):
                t = t.value_type
            if t not in types:
                raise self._bad(-1, name, f"column of type {t}, expected {' or '.join(map(str, types))}")
        for name in [n for n in have if n not in want]:
            why = "unknown column (a block Parquet file holds workload, prompt_id, pos, block, target_ms, line"
            raise self._bad(-1, name, why + " and drafts.NAME.* columns)")
        if not drafters:
            raise self._bad(-1, "drafts", "no drafter columns (drafts.NAME.accepted and the rest)")
        if self.pf.metadata.num_rows == 0:
            raise self._bad(-1, "file", "no records (empty file)")
        if "line" not in have or self.cache_of is None:
            self.line = None  # line numbers of the log a cache copies; a block file's records are its rows
        return tuple(drafters)

    def _read(self, columns: list[str]) -> dict[str, pa.ChunkedArray]:
        try:
            t = self.pf.read(columns=columns, use_threads=True)
        except (OSError, *ARROW_ERRORS) as e:
            raise self._bad(-1, "file", f"not a readable Parquet file ({e})") from None
        return {k: t.column(k) for k in columns}

    def _check(self, bad: np.ndarray, name: str, problem: Callable[[int], str], offset: int = 0) -> None:
        """Raise at the first row where `bad` holds (rows counted from `offset`)."""
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise self._bad(offset + i, name, problem(i))

    def _array(self, col: pa.ChunkedArray, name: str, dtype) -> np.ndarray:
        """A column without nulls as one numpy array."""
        if col.null_count:
            nulls = np.concatenate([~_valid(c) for c in col.chunks])
            self._check(nulls, name, lambda i: "null (an absent value is NaN, or -1 for block)")
        parts = [_np(c, dtype) for c in col.chunks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _keys(self) -> None:
        cols = self._read(["workload", "prompt_id", "pos"] + (["line"] if self.line is not None else []))
        pairs, codes, off = {}, [], 0
        for batch in pa.Table.from_arrays([cols["workload"], cols["prompt_id"]], ["w", "p"]).to_batches():
            for k, a in zip(("workload", "prompt_id"), batch.columns):
                self._check(~_valid(a), k, lambda i: "null (expected a non-empty string)", off)
                try:
                    idx, names = _dictionary(a)
                except UnicodeDecodeError:
                    raise self._bad(-1, k, "a name is not valid UTF-8") from None
                empty = np.isin(idx, [c for c, s in enumerate(names) if s == ""]) & _valid(a)
                self._check(empty, k, lambda i: "expected a non-empty string", off)
            codes.append(_codes(*batch.columns, pairs))
            off += len(batch)
        self.pairs, self.code = list(pairs), np.concatenate(codes)
        self.pos = self._array(cols["pos"], "pos", np.int64)
        self._check(self.pos < 0, "pos", lambda i: f"must be >= 0, got {self.pos[i]}")
        if self.line is not None:
            self.line = self._array(cols["line"], "line", np.int64)
            steps = np.r_[self.line[:1] < 1, np.diff(self.line) < 1]
            self._check(steps, "line", lambda i: "line numbers must increase from 1")

    def fill(self, out: dict, rows, names: Sequence[str]) -> None:
        cols = self._read(["block", "target_ms"])
        block = self._array(cols["block"], "block", np.int64)
        self._check(block < -1, "block", lambda i: f"expected -1 (none) or an int >= 0, got {block[i]}")
        out["block"][rows], out["target_ms"][rows] = block, self._optional(cols["target_ms"], "target_ms")
        for d in self.drafters:  # every drafter is checked, also those not loaded
            f = f"drafts.{d}."
            cols = {k[len(f) :]: c for k, c in self._read([f + k for k, _ in DRAFT_COLUMNS]).items()}
            acc, L = self._array(cols["accepted"], f + "accepted", np.int32), self._draft_len(cols, f)
            self._check((acc < 0) | (acc > L), f + "accepted", lambda i: f"must be in [0, {L[i]}], got {acc[i]}")
            ea = self._optional(cols["expected_accepted"], f + "expected_accepted")
            self._check(ea > L + 1e-9, f + "expected_accepted", lambda i: f"{ea[i]} exceeds draft_len={L[i]}")
            ms = self._optional(cols["ms"], f + "ms")
            vals = {"accepted": acc, "draft_len": L, "expected_accepted": ea, "ms": ms}
            # one (n, 4) block: its rows land in the table's (R, D, 4) features at once, not a strided pass each
            feats = np.stack([self._feature(cols[k], f + k, L) for k in FEATURES], axis=1)
            for j in [j for j, n in enumerate(names) if n == d]:
                for k, x in vals.items():
                    out[k][rows, j] = x
                out["features"][rows, j] = feats

    def _draft_len(self, cols: dict, f: str) -> np.ndarray:
        L = self._array(cols["draft_len"], f + "draft_len", np.int32)
        self._check(L < 0, f + "draft_len", lambda i: f"must be >= 0, got {L[i]}")
        return L

    def _optional(self, col: pa.ChunkedArray, name: str) -> np.ndarray:
        x = self._array(col, name, np.float64)
        bad = ~np.isnan(x) & ~(np.isfinite(x) & (x >= 0))
        self._check(bad, name, lambda i: f"expected NaN (none) or a finite number >= 0, got {x[i]}")
        return x

    def _feature(self, col: pa.ChunkedArray, name: str, L: np.ndarray) -> np.ndarray:
        x = self._array(col, name, np.float64)
        self._check(~np.isfinite(x), name, lambda i: f"not finite: {x[i]}")
        hi = np.inf if name.endswith(".ent_mean") else 1.0
        self._check((x < 0) | (x > hi), name, lambda i: f"{x[i]} outside [0.0, {hi}]")
        self._check((L == 0) & (x != 0), name, lambda i: f"an empty draft's features are 0, got {x[i]}")
        return x
