"""The fast paths of `bandit.logs.load_logs`: compiled parsers write columns directly.

Why they exist: with orjson every token, confidence and entropy of a log becomes a Python object
(about 100 per record) before bulk checks turn them into numpy arrays, and that took most of
`load_logs`' time (issue 2; NEGATIVE_RESULTS.md). Two readers skip those objects, tried in turn:

1. `bandit._colparse` (bandit/_colparse.c, built by `pip install -e .` where a C compiler
   exists): a recognizer specialised to schema v1 that parses decompressed text straight into
   per-record ints and, per drafter, confidences and entropies laid end to end, checking every
   field as it goes, with the GIL released while a second thread decompresses the next piece.
   `_read_compiled` turns its buffers into the batch's arrays with numpy.
2. pyarrow's JSON reader (when pyarrow is installed): it parses JSON lines in C++ into typed
   columns; list columns arrive as offsets plus flat values, and every bulk check is a numpy
   operation on them (`_read_arrow`).

Both are only fast paths. Each returns None whenever a file is anything but plainly valid in the
spelling it understands (a parse error, any check failing, a `null`, a blank line, a drafter
missing or extra, an unknown field, an unreadable gzip stream, ...): the next reader, and in the
end `bandit.logs`' exact path, reads the file again, and the exact path raises the same
`PATH:LINE: FIELD: problem` error as it always did. What they return is what the exact path
would return, array for array: the same checks, floats rounded as Python's float() rounds them,
and the features computed by the same function, passed in by the caller.

pyarrow is as strict as the exact path with an explicit schema (wrong types, `1.0` or `1e2` for
an int, duplicate and unknown keys, control characters are parse errors) except where the
checks here make up for it: it reads NaN and Infinity as numbers, `null` as an absent field, and
several objects on one line as several records. The compiled parser refuses all of those itself.

This module needs only numpy; each reader is skipped when its library is absent.
"""
from __future__ import annotations

import hashlib
import json
import queue
import threading
import zlib
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

_COLPARSE_API = 1        # bandit/_colparse.c's API_VERSION this module speaks
try:  # the compiled parser, built from bandit/_colparse.c by `pip install -e .` (optional)
    from bandit import _colparse
    if getattr(_colparse, "API_VERSION", None) != _COLPARSE_API:  # a stale build: rebuild with `pip install -e .`
        _colparse = None
except ImportError:
    _colparse = None
try:
    import pyarrow as pa
    import pyarrow.json as pj
except ImportError:
    pa = pj = None

CHUNK = 1 << 24          # decompressed bytes parsed at a time (bounded memory: ~2 chunks in flight)
_READ = 1 << 22          # compressed bytes read at a time
_BLOCK = 1 << 20         # pyarrow's block: the unit its threads parse in parallel
_SCHEMA_VERSION = 1      # bandit.logs.SCHEMA_VERSION (this module does not import bandit.logs)


class _Unfit(Exception):
    """This file is not for the fast path (or is invalid): the exact path must read it."""


def _schema(drafters: Sequence[str]):
    draft = pa.struct([("tokens", pa.list_(pa.int64())), ("accepted", pa.int64()),
                       ("conf", pa.list_(pa.float64())), ("entropy", pa.list_(pa.float64())),
                       ("expected_accepted", pa.float64()), ("ms", pa.float64())])
    return pa.schema([("v", pa.int64()), ("workload", pa.string()), ("prompt_id", pa.string()),
                      ("pos", pa.int64()), ("block", pa.int64()), ("target_ms", pa.float64()),
                      ("drafts", pa.struct([(n, draft) for n in drafters]))])


# ---------------------------------------------------------------- text: decompression and line structure

def _chunks(path: Path, h):
    """Text chunks of whole lines (the last may lack its newline); raises _Unfit on a bad gzip stream."""
    gz = path.name.endswith(".gz")
    d = zlib.decompressobj(wbits=31) if gz else None
    parts, size = [], 0
    with open(path, "rb") as f:
        while raw := f.read(_READ):
            h.update(raw)
            if gz:
                out = []
                try:
                    while raw:
                        out.append(d.decompress(raw))
                        raw = d.unused_data if d.eof else b""
                        if raw:  # concatenated gzip members
                            d = zlib.decompressobj(wbits=31)
                except zlib.error:
                    raise _Unfit from None
                raw = b"".join(out)
            parts.append(raw)
            size += len(raw)
            if size >= CHUNK:
                buf = b"".join(parts)
                k = buf.rfind(b"\n") + 1
                if k:
                    yield buf[:k]
                    parts, size = [buf[k:]], len(buf) - k
                else:
                    parts = [buf]
    if gz and not d.eof:
        raise _Unfit
    if size:
        yield b"".join(parts)


def _lines(chunk: bytes) -> int:
    """The number of lines in `chunk` if every line is one `{...}` object alone on it, else raise _Unfit.

    Every newline must sit between `}` and `{` (or end the chunk): valid JSON cannot have `}` and
    `{` adjacent inside a value, so each line is then one whole object, no line is blank, and the
    row count pyarrow reports must equal this line count. A `null` anywhere (even inside a string)
    also sends the file to the exact path: pyarrow reads a `null` as an absent optional field.
    """
    a = np.frombuffer(chunk, np.uint8)
    if a.size == 0 or a[0] != 0x7B or b"null" in chunk:
        raise _Unfit
    nl = np.flatnonzero(a == 0x0A)
    last_open = nl[:-1] if a[-1] == 0x0A else nl
    if (a[nl - 1] != 0x7D).any() or (a[last_open + 1] != 0x7B).any():
        raise _Unfit
    if a[-1] != 0x0A and a[-1] != 0x7D:
        raise _Unfit
    return len(last_open) + 1


def _produce(items, path: Path, q: queue.Queue, stop: threading.Event) -> None:
    """Thread: put every item of items(path, sha256 object), then ("end", sha256), or
    ("unfit", None) at the first problem."""
    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    h = hashlib.sha256()
    try:
        for item in items(path, h):
            if not put(item):
                return
        put(("end", h.hexdigest()))
    except Exception:  # _Unfit, a bad gzip stream, anything unforeseen: the exact path reports it
        put(("unfit", None))


def _arrow_items(path: Path, h):
    return ((chunk, _lines(chunk)) for chunk in _chunks(path, h))


# ---------------------------------------------------------------- columns: checks and arrays

def _column(t, name: str):
    col = t.column(name)
    return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)


def _np(a, dtype, nulls: bool = False):
    """A primitive array as a zero-copy numpy view, or with `nulls` (view, valid mask).

    Plain numpy on pyarrow's buffers: `Array.to_numpy` and `fill_null` would import pandas.
    """
    if a.null_count and not nulls:
        raise _Unfit
    dtype = np.dtype(dtype)
    buf = a.buffers()[1]
    x = np.frombuffer(buf, dtype, len(a), a.offset * dtype.itemsize) if buf is not None else np.zeros(len(a), dtype)
    if not nulls:
        return x
    if not a.null_count:
        return x, np.ones(len(a), bool)
    bits = np.unpackbits(np.frombuffer(a.buffers()[0], np.uint8), bitorder="little")
    return x, bits[a.offset:a.offset + len(a)].astype(bool)


def _ints(a, lo: int = 0) -> np.ndarray:
    """A required int column: no nulls, every value >= lo."""
    x = _np(a, np.int64)
    if x.size and x.min() < lo:
        raise _Unfit
    return x


def _optional(a) -> np.ndarray:
    """An optional number >= 0: float64 with NaN where absent; NaN or infinity written in the file are unfit."""
    x, valid = _np(a, np.float64, nulls=True)
    if not np.isfinite(x[valid]).all() or (x[valid] < 0).any() or np.signbit(x[valid]).any():
        raise _Unfit  # -0.0: written `-0.0` it is -0.0, written `-0` (an int) it is 0.0: the exact path tells
    return x if a.null_count == 0 else np.where(valid, x, np.nan)


def _list(a, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, flat values) of a list column without nulls."""
    if a.null_count:
        raise _Unfit
    off = _np(a.offsets, np.int32)
    return off - off[0], _np(a.flatten(), dtype)


def _strings(a) -> list[str]:
    """A required non-empty string column as Python strings (invalid UTF-8 raises: unfit)."""
    if a.null_count:
        raise _Unfit
    off = np.frombuffer(a.buffers()[1], np.int32, len(a) + 1, a.offset * 4)  # a string array's offsets
    if (np.diff(off) < 1).any():
        raise _Unfit
    return a.to_pylist()


def _columns(t, names: Sequence[str], schema_names: Sequence[str], features: Callable) -> dict:
    """The validated columns of one parsed chunk, as `bandit.logs._Batch` fields (less `line`)."""
    n, D = t.num_rows, len(names)
    v = _ints(_column(t, "v"))
    if (v != _SCHEMA_VERSION).any():
        raise _Unfit
    out = {"workload": _strings(_column(t, "workload")), "prompt_id": _strings(_column(t, "prompt_id")),
           "pos": _ints(_column(t, "pos"))}
    blk, has = _np(_column(t, "block"), np.int64, nulls=True)
    if (blk[has] < 0).any():
        raise _Unfit
    out["block"] = np.where(has, blk, -1)
    out["target_ms"] = _optional(_column(t, "target_ms"))
    drafts = _column(t, "drafts")
    if drafts.null_count:
        raise _Unfit
    acc_out = np.empty((n, D), np.int32); len_out = np.empty((n, D), np.int32)
    exp_out = np.empty((n, D)); ms_out = np.empty((n, D)); feat_out = np.empty((n, D, 4))
    for name in schema_names:  # every drafter of the records is checked, also those not loaded
        d = drafts.field(name)
        if d.null_count:
            raise _Unfit
        tok_off, _ = _list(d.field("tokens"), np.int64)
        conf_off, c = _list(d.field("conf"), np.float64)
        ent_off, e = _list(d.field("entropy"), np.float64)
        if not (np.array_equal(tok_off, conf_off) and np.array_equal(tok_off, ent_off)):
            raise _Unfit
        L = np.diff(tok_off).astype(np.int64)
        a = _ints(d.field("accepted"))
        if (a > L).any():
            raise _Unfit
        if not (np.isfinite(c).all() and np.isfinite(e).all()):
            raise _Unfit
        if ((c < 0) | (c > 1)).any() or (e < 0).any() or np.signbit(c).any() or np.signbit(e).any():
            raise _Unfit  # -0.0 as in `_optional`
        ea, ms = _optional(d.field("expected_accepted")), _optional(d.field("ms"))
        if (ea > L + 1e-9).any():
            raise _Unfit
        if name in names:
            j = names.index(name)
            acc_out[:, j], len_out[:, j], exp_out[:, j], ms_out[:, j] = a, L, ea, ms
            feat_out[:, j] = features(c, e, L)
    out.update(accepted=acc_out, draft_len=len_out, expected=exp_out, features=feat_out, ms=ms_out)
    return out


# ---------------------------------------------------------------- one file

def read_file(path: Path, requested: Sequence[str] | None, names: Sequence[str],
              features: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
    """(first record, column batches, sha256, reader) of one valid file, or None: read it on the exact path.

    `requested`: the drafters asked for (then every record must hold them, and its others are
    checked too); else `names`, the drafters already fixed by an earlier file, or () to take the
    first record's. `features(conf, entropy, lengths)` computes the (n, 4) confidence features.
    Each batch is a dict of `bandit.logs._Batch` fields; `reader` names the reader that read it
    ("compiled" or "pyarrow"). The compiled reader goes first, then pyarrow's, each only when its
    library is there, each reading the file from the start.
    """
    if requested and len(set(requested)) != len(requested):
        return None
    for name, reader, available in (("compiled", _read_compiled, _colparse is not None),
                                    ("pyarrow", _read_arrow, pa is not None)):
        if available:
            out = reader(Path(path), requested, names, features)
            if out is not None:
                return (*out, name)
    return None


def _run(items, consume, path: Path, *args):
    """consume(queue, *args) while a thread runs _produce(items, path, queue, stop); None if either fails."""
    q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    worker = threading.Thread(target=_produce, args=(items, path, q, stop), daemon=True)
    worker.start()
    try:
        return consume(q, *args)
    except Exception:  # _Unfit, a parse error, invalid UTF-8, anything unforeseen
        return None
    finally:
        stop.set()
        worker.join()


def _drafter_names(first, requested, names) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(drafters loaded, drafters every record must hold exactly) given the first record."""
    have = first.get("drafts") if isinstance(first, dict) else None
    if not isinstance(have, dict) or not have:
        raise _Unfit
    if requested:
        names = tuple(requested)
        return names, names + tuple(sorted(set(have) - set(names)))
    names = tuple(names) or tuple(sorted(have))
    return names, names


# ---------------------------------------------------------------- the compiled reader (bandit/_colparse.c)

def _pieces(path: Path, h):
    """Decompressed text in pieces of at most CHUNK bytes, cut anywhere; raises on a bad gzip stream."""
    with open(path, "rb") as f:
        if not path.name.endswith(".gz"):
            while raw := f.read(_READ):
                h.update(raw)
                yield raw
            return
        d = zlib.decompressobj(wbits=31)
        while raw := f.read(_READ):
            h.update(raw)
            while True:
                out = d.decompress(raw, CHUNK)  # bounded: a tiny file may inflate to anything
                if out:
                    yield out
                if d.eof:
                    raw = d.unused_data
                    if not raw:
                        break
                    d = zlib.decompressobj(wbits=31)  # concatenated gzip members
                else:
                    raw = d.unconsumed_tail
                    if not raw and len(out) < CHUNK:
                        break
    if not d.eof:
        raise _Unfit  # truncated


def _piece_items(path: Path, h):
    return (("piece", piece) for piece in _pieces(path, h))


def _read_compiled(path: Path, requested, names, features):
    return _run(_piece_items, _consume_compiled, path, requested, names, features)


def _decode(raw: bytes) -> str:
    """A string's raw JSON text (the parser checked it: strict UTF-8, valid escapes) as json decodes it."""
    return json.loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode()


def _consume_compiled(q: queue.Queue, requested, names, features):
    """Feed each piece to the parser as it arrives and turn what it parsed into a batch; raises when unfit."""
    parser, head, batches, pairs, line, keep = None, [], [], [], 1, []
    while True:
        kind, data = q.get()
        if kind == "unfit":
            raise _Unfit
        if parser is None:  # hold the pieces until the first line is whole: its drafters set the parser up
            if kind == "piece":
                head.append(data)
                if b"\n" not in data:
                    if sum(map(len, head)) > 1 << 28:
                        raise _Unfit
                    continue
            text = b"".join(head)
            if not text.strip():
                raise _Unfit  # no records (or a blank first line): the exact path says so
            first = json.loads(text[:text.index(b"\n")] if b"\n" in text else text)
            names, schema_names = _drafter_names(first, requested, names)
            parser = _colparse.Parser([n.encode() for n in schema_names], [n in names for n in schema_names])
            keep = [schema_names.index(n) for n in names]
            ok = parser.feed(text)
            del text, head
        else:
            ok = parser.feed(data) if kind == "piece" else True
        if not ok or (kind == "end" and not parser.finish()):
            raise _Unfit
        b = _take(parser, keep, pairs, features)
        if b is not None:
            b["line"] = np.arange(line, line + len(b["pos"]), dtype=np.int64)
            line += len(b["pos"])
            batches.append(b)
        if kind == "end":
            if line == 1:
                raise _Unfit
            return first, batches, data  # `data` holds the sha256 here


def _take(parser, keep: list[int], pairs: list, features) -> dict | None:
    """The records parsed since the last take as a batch (a dict of `bandit.logs._Batch` fields), or None."""
    n, pos, block, tms, code, new_pairs, cols = parser.take()
    pairs += [(_decode(w), _decode(p)) for w, p in new_pairs]  # codes index this one list of the file
    if not n:
        return None
    D = len(keep)
    acc_out = np.empty((n, D), np.int32); len_out = np.empty((n, D), np.int32)
    exp_out = np.empty((n, D)); ms_out = np.empty((n, D)); feat_out = np.empty((n, D, 4))
    for jj, j in enumerate(keep):
        acc, L, ea, ms, c, e = cols[j]
        L = np.frombuffer(L, np.int64)
        acc_out[:, jj], len_out[:, jj] = np.frombuffer(acc, np.int64), L
        exp_out[:, jj], ms_out[:, jj] = np.frombuffer(ea, np.float64), np.frombuffer(ms, np.float64)
        feat_out[:, jj] = features(np.frombuffer(c, np.float64), np.frombuffer(e, np.float64), L)
    return dict(workload=None, prompt_id=None, pairs=pairs, code=np.frombuffer(code, np.int32),
                pos=np.frombuffer(pos, np.int64), block=np.frombuffer(block, np.int64),
                target_ms=np.frombuffer(tms, np.float64), accepted=acc_out, draft_len=len_out,
                expected=exp_out, features=feat_out, ms=ms_out)


# ---------------------------------------------------------------- the pyarrow reader

def _read_arrow(path: Path, requested, names, features):
    return _run(_arrow_items, _consume, path, requested, names, features)


def _consume(q: queue.Queue, requested, names, features):
    """The pyarrow reader's loop: parse each chunk as it arrives, check it, turn it into arrays; raises when unfit."""
    first, schema_names, opts, batches, line = None, (), None, [], 1
    ropts = pj.ReadOptions(use_threads=True, block_size=_BLOCK)
    while True:
        chunk, lines = q.get()
        if chunk == "unfit":
            raise _Unfit
        if chunk == "end":
            if first is None:
                raise _Unfit  # no records: the exact path says so
            return first, batches, lines  # `lines` holds the sha256 here
        if first is None:
            first = json.loads(chunk[:chunk.find(b"\n")] if b"\n" in chunk else chunk)
            names, schema_names = _drafter_names(first, requested, names)
            opts = pj.ParseOptions(explicit_schema=_schema(schema_names), unexpected_field_behavior="error")
        t = pj.read_json(pa.BufferReader(chunk), read_options=ropts, parse_options=opts)
        del chunk
        if t.num_rows != lines:
            raise _Unfit
        b = _columns(t, names, schema_names, features)
        b["line"] = np.arange(line, line + lines, dtype=np.int64)
        line += lines
        batches.append(b)
