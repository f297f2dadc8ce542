"""Block logs (schema v1): find, load and validate them into one typed table.

A block log is JSON lines, one object per (prompt, position) at which every drafter drafted
from the same prefix (see docs/DESIGN.md). `load_logs` turns any number of files into a
`BlockTable` of plain numpy arrays, or raises `LogError` whose message is
`PATH:LINE: FIELD: problem`. Nothing is silently dropped: every record either loads or is
an error.

    python bandit/logs.py [PATHS...]     # one-line summary of the logs (default: runs/)
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/logs.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import gc
import sys
import glob
import hashlib
import json
import math
import zlib
from dataclasses import dataclass, replace
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Annotated, Iterable, Optional, Sequence

import numpy as np
import typer

try:  # 5-10x faster parsing; the stdlib parser gives identical results
    import orjson as _fastjson
except ImportError:  # pragma: no cover
    _fastjson = None

# The fast paths (bandit/fastload.py): the compiled parser bandit/_colparse.c, then pyarrow's
# reader, each used when present; a file neither reads takes the paths below.
from bandit import fastload as _fastload

SCHEMA_VERSION = 1
FEATURES = ("conf_mean", "conf_min", "conf_first", "ent_mean")
# Features of an empty draft (no proposal): zero confidence, zero entropy. The selector then
# sees "no confidence" for a drafter that had nothing to say, which is what it is.
EMPTY_DRAFT_FEATURES = (0.0, 0.0, 0.0, 0.0)
LABELS = ("MEASURED", "SIM", "UNLABELLED")


class LogError(ValueError):
    """A problem in a log, located: `PATH:LINE: FIELD: problem` (LINE 0 = the file as a whole)."""

    def __init__(self, path: str | Path, line: int, field: str, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        super().__init__(f"{self.path}:{line}: {field}: {problem}")


@dataclass(frozen=True)
class LogSource:
    """One input file: its path, content hash and record count."""
    path: str
    sha256: str
    n_records: int


@dataclass(frozen=True, eq=False)
class BlockTable:
    """Every record of a set of logs as arrays; R records, D drafters, F = 4 features.

    Records are sorted by (workload, prompt_id, pos). `prompt` indexes the prompt clusters
    (the bootstrap's default resampling unit); a prompt id is unique within its workload.
    """
    drafters: tuple[str, ...]        # D drafter names, sorted
    workloads: tuple[str, ...]       # W workload names, sorted
    prompt_ids: tuple[str, ...]      # P cluster names "workload/prompt_id", sorted
    workload: np.ndarray             # (R,) int32: index into workloads
    prompt: np.ndarray               # (R,) int32: index into prompt_ids
    pos: np.ndarray                  # (R,) int64: output position of the block's first token
    block: np.ndarray                # (R,) int64: block index, -1 where the record has none
    accepted: np.ndarray             # (R, D) int32: accepted draft tokens (bonus excluded)
    draft_len: np.ndarray            # (R, D) int32: len(tokens)
    expected_accepted: np.ndarray    # (R, D) float64: NaN where not logged
    features: np.ndarray             # (R, D, F) float64: FEATURES of each draft
    ms: np.ndarray                   # (R, D) float64: drafter wall ms, NaN where not logged
    target_ms: np.ndarray            # (R,) float64: verify wall ms, NaN where not logged
    label: str = "UNLABELLED"        # MEASURED | SIM | UNLABELLED (no manifest)
    manifests: tuple[dict, ...] = ()  # the manifests of the runs read
    sources: tuple[LogSource, ...] = ()
    dense: bool = False              # every prompt has a record at every position 0..n-1

    @property
    def n_records(self) -> int:
        return int(self.pos.shape[0])

    @property
    def has_block_flags(self) -> bool:
        return bool((self.block >= 0).any())

    @property
    def is_block_start(self) -> np.ndarray:
        """(R,) bool: block starts; every record of a prompt none of whose records has `block`.

        Decided per prompt, so that pooling a flagged (sparse-trajectory) log with an unflagged
        one keeps the unflagged one's records as blocks.
        """
        flagged = np.zeros(len(self.prompt_ids), bool)
        flagged[self.prompt[self.block >= 0]] = True
        return (self.block >= 0) | ~flagged[self.prompt]

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)

    def take(self, idx: np.ndarray) -> "BlockTable":
        """Rows `idx` (bool mask or sorted indices); names, provenance and flags kept."""
        rows = {k: getattr(self, k)[idx] for k in _ROW_FIELDS}
        return replace(self, **rows, dense=_is_dense(rows["prompt"], rows["pos"]))

    def take_prompts(self, keep: np.ndarray) -> "BlockTable":
        """The records of the prompts with keep[prompt] (keep: (P,) bool), prompts re-indexed 0..P'-1."""
        keep = np.asarray(keep, bool)
        new = np.cumsum(keep) - 1
        sub = self.take(keep[self.prompt])
        return replace(sub, prompt=new[sub.prompt].astype(np.int32),
                       prompt_ids=tuple(p for p, k in zip(self.prompt_ids, keep) if k))

    def blocks(self) -> "BlockTable":
        """The block starts only (the set B of docs/DESIGN.md's definitions)."""
        return self.take(self.is_block_start)

    def select_drafters(self, names: Sequence[str]) -> "BlockTable":
        missing = [n for n in names if n not in self.drafters]
        if missing:
            raise KeyError(f"drafters not in the logs: {', '.join(missing)}; present: {', '.join(self.drafters)}")
        j = [self.drafters.index(n) for n in names]
        cols = {k: getattr(self, k)[:, j] for k in _DRAFTER_FIELDS}
        return replace(self, drafters=tuple(names), **cols)

    def summary(self) -> str:
        kind = "dense" if self.dense else "sparse"
        what = "one per output position" if self.dense else f"{int(self.is_block_start.sum())} block starts"
        return (f"{self.n_records} records ({what}), {self.n_prompts} prompts, "
                f"{len(self.workloads)} workloads ({', '.join(self.workloads)}), "
                f"{len(self.drafters)} drafters ({', '.join(self.drafters)}), {kind}, [{self.label}]")


_ROW_FIELDS = ("workload", "prompt", "pos", "block", "accepted", "draft_len", "expected_accepted",
               "features", "ms", "target_ms")
_DRAFTER_FIELDS = ("accepted", "draft_len", "expected_accepted", "features", "ms")


# ---------------------------------------------------------------- finding the files

def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, globs expanded, a directory meaning `**/blocks_*.jsonl[.gz]` under it."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.rglob("blocks_*.jsonl*") if q.name.endswith((".jsonl", ".jsonl.gz")))
            if not found:
                raise LogError(p, 0, "path", "directory holds no blocks_*.jsonl or blocks_*.jsonl.gz")
            out += found
        elif p.exists():
            out.append(p)
        else:
            hits = sorted(Path(h) for h in glob.glob(str(p), recursive=True))
            if not hits:
                raise LogError(p, 0, "path", "no such file, and no file matches it as a glob")
            out += [h for h in hits if h.is_file()]
    seen: set[Path] = set()
    return [q for q in out if not (q.resolve() in seen or seen.add(q.resolve()))]


def read_manifest(log_path: Path) -> dict | None:
    """The manifest.json of the run a log belongs to: in the log's own directory, nowhere else (a manifest
    found further up would describe some other run)."""
    for d in [log_path.parent]:
        m = d / "manifest.json"
        if m.is_file():
            try:
                man = json.loads(m.read_text())
            except json.JSONDecodeError as e:
                raise LogError(m, e.lineno, "manifest", f"not JSON: {e.msg}") from None
            except (RecursionError, UnicodeDecodeError) as e:
                raise LogError(m, 0, "manifest", f"unreadable: {type(e).__name__}") from None
            if not isinstance(man, dict):
                raise LogError(m, 0, "manifest", f"expected a JSON object, got {type(man).__name__}")
            for key, typ in (("label", str), ("drafters", dict), ("timing", dict), ("k", int)):
                if man.get(key) is not None and not isinstance(man[key], typ):
                    raise LogError(m, 0, f"manifest.{key}", f"expected {typ.__name__}, got {type(man[key]).__name__}")
            return man
    return None


def campaign_key(manifest: dict | None) -> tuple:
    """Runs may be pooled only when these agree (docs/DESIGN.md: same target, drafters, k, T, label)."""
    if manifest is None:
        return ("UNLABELLED",)
    tgt = manifest.get("target") or {}
    return (manifest.get("label", "UNLABELLED"), tgt.get("sha256") or tgt.get("name"),
            tuple(sorted((manifest.get("drafters") or {}).keys())), manifest.get("k"), manifest.get("temperature"))


# ---------------------------------------------------------------- reading one file

_READ = 1 << 22          # compressed bytes read at a time
_BATCH = 4096            # lines parsed and validated together (small: freed memory is reused at once)


class _Lines:
    """Stream the lines of a .jsonl or .jsonl.gz file in batches; `sha256` is set once exhausted.

    Never holds the whole decompressed file: a 1M-record log is ~1 GB of text.
    """

    def __init__(self, path: Path, batch: int = _BATCH):
        self.path, self.batch, self.sha256 = Path(path), batch, None

    def _chunks(self):
        h = hashlib.sha256()
        gz = self.path.name.endswith(".gz")
        d = zlib.decompressobj(wbits=31) if gz else None
        with open(self.path, "rb") as f:
            while raw := f.read(_READ):
                h.update(raw)
                if not gz:
                    yield raw
                    continue
                try:
                    while raw:
                        yield d.decompress(raw)
                        raw = d.unused_data if d.eof else b""
                        if raw:  # concatenated gzip members
                            d = zlib.decompressobj(wbits=31)
                except zlib.error as e:
                    raise LogError(self.path, 0, "file", f"not a readable gzip file ({e})") from None
        if gz and not d.eof:
            raise LogError(self.path, 0, "file", "not a readable gzip file (truncated: the stream ends early)")
        self.sha256 = h.hexdigest()

    def __iter__(self):
        """Yield (first line number, lines, last): `last` marks the batch holding the file's final line."""
        buf, ln, prev = b"", 1, None
        for chunk in self._chunks():
            lines = (buf + chunk).split(b"\n")
            buf = lines.pop()
            for s in range(0, len(lines), self.batch):
                if prev is not None:
                    yield prev[0], prev[1], False
                prev = (ln, lines[s:s + self.batch])
                ln += len(prev[1])
        if buf.strip():
            if prev is not None:
                yield prev[0], prev[1], False
            prev = (ln, [buf])
        if prev is not None:
            yield prev[0], prev[1], True


def _bad_number(x) -> bool:
    """NaN or infinity, or an int too large to become a float (the table stores floats)."""
    if type(x) is int:
        try:
            float(x)
        except OverflowError:
            return True
        return False
    return isinstance(x, float) and not math.isfinite(x)


_INT64_END = 2 ** 63  # pos and block are stored as int64


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return d


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


def _parse_exact(line: bytes, path: Path, ln: int, is_last: bool):
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


def _check_record(obj, path: Path, ln: int) -> None:
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
    if "target_ms" in obj and (type(obj["target_ms"]) not in (int, float) or _bad_number(obj["target_ms"]) or obj["target_ms"] < 0):
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


def _nonblank(ln0: int, lines: list[bytes]) -> tuple[list[int], list[bytes]]:
    lns = [ln0 + i for i, s in enumerate(lines) if s.strip()]
    return lns, (lines if len(lns) == len(lines) else [lines[n - ln0] for n in lns])


def iter_records(path: Path, errors: list[LogError] | None = None, lines=None):
    """Yield (line number, record) of one file, validated exactly record by record (the reference
    path; `load_logs` validates in bulk). With `errors` collect problems instead of raising."""
    reader = _Lines(Path(path))
    try:
        for ln0, batch, last in reader:
            lns, batch = _nonblank(ln0, batch)
            for i, (ln, line) in enumerate(zip(lns, batch)):
                try:
                    obj = _parse_exact(line, path, ln, last and i == len(batch) - 1)
                    _check_record(obj, path, ln)
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


# ---------------------------------------------------------------- the table

def _table_from_records(recs: list[tuple[Path, int, dict]], drafters: Sequence[str] | None) -> BlockTable:
    if not recs:
        raise LogError("<inputs>", 0, "records", "no records: the logs are empty")
    present = [set(r["drafts"]) for _, _, r in recs]
    everywhere = set.intersection(*present)
    if drafters:
        for n in drafters:
            if n not in everywhere:
                p, ln, _ = next((p, ln, r) for (p, ln, r), s in zip(recs, present) if n not in s)
                raise LogError(p, ln, f"drafts.{n}", "requested drafter missing in this record")
        names = tuple(drafters)
    else:
        union = set.union(*present)
        if union != everywhere:
            (p, ln, _), s = next(((x, s) for x, s in zip(recs, present) if s != union))
            gone = sorted(union - s)
            raise LogError(p, ln, f"drafts.{gone[0]}",
                           f"drafter missing in this record (present everywhere: {sorted(everywhere)}; "
                           "pick a subset with --drafters)")
        names = tuple(sorted(union))

    keys = {}
    for p, ln, r in recs:
        k = (r["workload"], r["prompt_id"], r["pos"])
        if k in keys:
            raise LogError(p, ln, "pos", f"duplicate record for workload={k[0]!r} prompt_id={k[1]!r} pos={k[2]} "
                                         f"(first at {keys[k][0]}:{keys[k][1]})")
        keys[k] = (p, ln)
    recs.sort(key=lambda x: (x[2]["workload"], x[2]["prompt_id"], x[2]["pos"]))

    R, D = len(recs), len(names)
    workloads = tuple(sorted({r["workload"] for _, _, r in recs}))
    prompt_ids = tuple(sorted({f"{r['workload']}/{r['prompt_id']}" for _, _, r in recs}))
    widx = {w: i for i, w in enumerate(workloads)}
    pidx = {p: i for i, p in enumerate(prompt_ids)}
    workload = np.empty(R, np.int32); prompt = np.empty(R, np.int32)
    pos = np.empty(R, np.int64); block = np.full(R, -1, np.int64)
    accepted = np.empty((R, D), np.int32); draft_len = np.empty((R, D), np.int32)
    expected = np.full((R, D), np.nan); ms = np.full((R, D), np.nan)
    feats = np.empty((R, D, len(FEATURES))); target_ms = np.full(R, np.nan)
    for i, (_, _, r) in enumerate(recs):
        workload[i] = widx[r["workload"]]
        prompt[i] = pidx[f"{r['workload']}/{r['prompt_id']}"]
        pos[i] = r["pos"]
        if "block" in r:
            block[i] = r["block"]
        if "target_ms" in r:
            target_ms[i] = r["target_ms"]
        for j, n in enumerate(names):
            d = r["drafts"][n]
            accepted[i, j] = d["accepted"]
            draft_len[i, j] = len(d["tokens"])
            if "expected_accepted" in d:
                expected[i, j] = d["expected_accepted"]
            if "ms" in d:
                ms[i, j] = d["ms"]
            feats[i, j] = draft_features(d["conf"], d["entropy"])
    return BlockTable(drafters=names, workloads=workloads, prompt_ids=prompt_ids, workload=workload,
                      prompt=prompt, pos=pos, block=block, accepted=accepted, draft_len=draft_len,
                      expected_accepted=expected, features=feats, ms=ms, target_ms=target_ms,
                      dense=_is_dense(prompt, pos))


def draft_features(conf: Sequence[float], entropy: Sequence[float]) -> tuple[float, float, float, float]:
    """(conf_mean, conf_min, conf_first, ent_mean) of one draft; EMPTY_DRAFT_FEATURES if empty."""
    if not conf:
        return EMPTY_DRAFT_FEATURES
    return (sum(conf) / len(conf), min(conf), conf[0], sum(entropy) / len(entropy))


def _first_gap(t: BlockTable) -> str:
    """The first prompt whose positions are not 0..n-1, said in words."""
    starts = np.r_[0, np.flatnonzero(np.diff(t.prompt)) + 1]
    for a, b in zip(starts, np.r_[starts[1:], t.prompt.size]):
        want = np.arange(b - a)
        if not np.array_equal(t.pos[a:b], want):
            miss = int(want[np.flatnonzero(t.pos[a:b] != want)[0]])
            return f"prompt {t.prompt_ids[t.prompt[a]]} has no record at position {miss}"
    return "its positions are not 0..n-1 in every prompt"


def _is_dense(prompt: np.ndarray, pos: np.ndarray) -> bool:
    """Every prompt's positions are exactly 0..n-1 (records are sorted by prompt, pos)."""
    if prompt.size == 0:
        return False
    starts = np.r_[0, np.flatnonzero(np.diff(prompt)) + 1]
    expect = np.arange(prompt.size) - np.repeat(starts, np.diff(np.r_[starts, prompt.size]))
    return bool(np.array_equal(pos, expect))


# ---------------------------------------------------------------- bulk validation (the fast path)

@dataclass
class _Batch:
    """Columns of n validated records of one file (D drafters, in the order asked for)."""
    line: np.ndarray               # (n,) int64
    workload: list[str] | None     # None when `pairs` and `code` say it
    prompt_id: list[str] | None
    pos: np.ndarray                # (n,) int64
    block: np.ndarray              # (n,) int64, -1 where absent
    target_ms: np.ndarray          # (n,) float64
    accepted: np.ndarray           # (n, D) int32
    draft_len: np.ndarray          # (n, D) int32
    expected: np.ndarray           # (n, D) float64
    features: np.ndarray           # (n, D, 4) float64
    ms: np.ndarray                 # (n, D) float64
    pairs: list | None = None      # distinct (workload, prompt_id) pairs (may be shared by a file's batches)
    code: np.ndarray | None = None  # (n,) int32: index into `pairs`

    def keys(self) -> tuple[list, np.ndarray]:
        """(distinct (workload, prompt_id) pairs, (n,) int32 index of each record's pair)."""
        if self.code is not None:
            return self.pairs, self.code
        idx: dict = {}
        code = np.fromiter((idx.setdefault(k, len(idx)) for k in zip(self.workload, self.prompt_id)),
                           np.int32, len(self.workload))
        return list(idx), code


def _types(xs) -> set:
    return set(map(type, xs))


def _optional_numbers(ds: list[dict], key: str) -> np.ndarray | None:
    """(n,) float64 with NaN where absent; None if a present value is not a number >= 0."""
    xs = list(map(dict.get, ds, repeat(key)))
    if not _types(xs) <= {int, float, type(None)}:
        return None
    a = np.array(xs, float)
    return None if (a < 0).any() else a


def _features(c: np.ndarray, e: np.ndarray, L: np.ndarray) -> np.ndarray:
    """(n, 4) FEATURES of n drafts from their confidences and entropies laid end to end, L (n,) long.

    The one implementation of the features in bulk: every loading path calls it, so that they
    agree to the last bit (its sums may differ from `draft_features`' in the last place).
    """
    nz = L > 0
    if nz.all():  # no empty draft: the same operations on every row, without the masks
        start = np.cumsum(L) - L
        f = np.empty((len(L), len(FEATURES)))
        f[:, 0] = np.add.reduceat(c, start) / L
        f[:, 1] = np.minimum.reduceat(c, start)
        f[:, 2] = c[start]
        f[:, 3] = np.add.reduceat(e, start) / L
        return f
    f = np.tile(np.asarray(EMPTY_DRAFT_FEATURES), (len(L), 1))
    if nz.any():
        start = (np.cumsum(L) - L)[nz]  # empty drafts add no values, so reduceat's segments are exact
        f[nz, 0] = np.add.reduceat(c, start) / L[nz]
        f[nz, 1] = np.minimum.reduceat(c, start)
        f[nz, 2] = c[start]
        f[nz, 3] = np.add.reduceat(e, start) / L[nz]
    return f


def _bulk(objs: list, names: Sequence[str], lines: list[bytes] | None) -> _Batch | str:
    """Validate parsed records column by column; their columns, or the first failing check's name.

    Every check mirrors one of `_check_record` (the exact reference); orjson has already rejected
    NaN and Infinity. `lines` given (the raw text, on the fast path): also require exactly `names`
    as drafters in every record and count structure on the text: as many quotes as keys and
    string fields, as many `[` as lists, as many `{` as objects, no true/false/null. Then no key
    is duplicated, every list holds numbers only and no field goes unchecked; a batch of any
    other shape just takes the exact path.
    """
    n, D = len(objs), len(names)
    if _types(objs) != {dict}:
        return "record"
    try:
        v, wl, pid, pos, drafts = (list(map(itemgetter(k), objs)) for k in ("v", "workload", "prompt_id", "pos", "drafts"))
    except KeyError:
        return "missing field"
    if _types(v) != {int} or set(v) != {SCHEMA_VERSION}:
        return "v"
    if _types(wl) != {str} or _types(pid) != {str} or "" in set(wl) or "" in set(pid):
        return "workload/prompt_id"
    if _types(pos) != {int}:
        return "pos"
    try:
        pos = np.array(pos, np.int64)
    except OverflowError:
        return "pos"
    if (pos < 0).any():
        return "pos"
    blk = list(map(dict.get, objs, repeat("block")))
    if not _types(blk) <= {int, type(None)}:
        return "block"
    if any(b is not None and b < 0 for b in blk):
        return "block"
    try:  # int64 straight from the Python ints: a float64 round trip would merge 2**53 + 1 into 2**53
        blk = np.array([-1 if b is None else b for b in blk], np.int64)
    except OverflowError:
        return "block"
    tms = _optional_numbers(objs, "target_ms")
    if tms is None:
        return "target_ms"
    if _types(drafts) != {dict}:
        return "drafts"
    if lines is not None:
        raw = b"\n".join(lines)
        if b"true" in raw or b"false" in raw or b"null" in raw:
            return "true/false/null"
        if raw.count(b"[") != 3 * D * n or raw.count(b"{") != (2 + D) * n:
            return "structure"
        want = frozenset(names)
        if set(map(frozenset, drafts)) != {want}:
            return "drafters"
        n_keys = sum(map(len, objs)) + sum(map(len, drafts))
    acc_out = np.empty((n, D), np.int32); len_out = np.empty((n, D), np.int32)
    exp_out = np.empty((n, D)); ms_out = np.empty((n, D)); feat_out = np.empty((n, D, len(FEATURES)))
    for j, name in enumerate(names):
        try:
            ds = list(map(itemgetter(name), drafts))
        except KeyError:
            return "drafters"
        if _types(ds) != {dict}:
            return f"drafts.{name}"
        try:
            tok, acc, conf, ent = (list(map(itemgetter(k), ds)) for k in ("tokens", "accepted", "conf", "entropy"))
        except KeyError:
            return f"drafts.{name}"
        if lines is not None:
            n_keys += sum(map(len, ds))
        if _types(tok) != {list} or _types(conf) != {list} or _types(ent) != {list}:
            return f"drafts.{name}"
        lens = list(map(len, tok))
        if lens != list(map(len, conf)) or lens != list(map(len, ent)):
            return f"drafts.{name}.conf/entropy"
        L = np.array(lens, np.int64)
        # lists hold numbers only (checked on the bytes, or exactly on the slow path): a float
        # among the tokens turns their sum into a float
        if type(sum(chain.from_iterable(tok))) is not int:
            return f"drafts.{name}.tokens"
        if _types(acc) != {int}:
            return f"drafts.{name}.accepted"
        a = np.array(acc, np.int64)
        if ((a < 0) | (a > L)).any():
            return f"drafts.{name}.accepted"
        total = int(L.sum())
        c = np.fromiter(chain.from_iterable(conf), float, total)
        e = np.fromiter(chain.from_iterable(ent), float, total)
        if ((c < 0) | (c > 1)).any() or (e < 0).any():
            return f"drafts.{name}.conf/entropy"
        ea, ms = _optional_numbers(ds, "expected_accepted"), _optional_numbers(ds, "ms")
        if ea is None or ms is None or (ea > L + 1e-9).any():
            return f"drafts.{name}.expected_accepted/ms"
        acc_out[:, j], len_out[:, j], exp_out[:, j], ms_out[:, j] = a, L, ea, ms
        feat_out[:, j] = _features(c, e, L)
    if lines is not None and raw.count(b'"') != 2 * (n_keys + 2 * n):
        return "duplicate key or unknown string field"
    return _Batch(line=np.zeros(n, np.int64), workload=wl, prompt_id=pid, pos=pos,
                  block=blk, target_ms=tms, accepted=acc_out,
                  draft_len=len_out, expected=exp_out, features=feat_out, ms=ms_out)


@dataclass
class _Drafters:
    """Which drafters a load keeps: those asked for, else the first record's (then every record must match)."""
    requested: tuple[str, ...] | None
    names: tuple[str, ...] = ()
    first: str = ""                # PATH:LINE of the record that fixed `names`

    def fix(self, obj, path: Path, ln: int) -> tuple[str, ...]:
        if not self.names:
            if self.requested:
                self.names = self.requested
            elif isinstance(obj, dict) and isinstance(obj.get("drafts"), dict):
                self.names, self.first = tuple(sorted(obj["drafts"])), f"{path}:{ln}"
        return self.names

    def check(self, obj: dict, path: Path, ln: int) -> None:
        """After `_check_record`: the record holds the drafters this load needs (and only them, unless asked)."""
        have, names = obj["drafts"], self.fix(obj, path, ln)
        if self.requested:
            for n in self.requested:
                if n not in have:
                    raise LogError(path, ln, f"drafts.{n}", "requested drafter missing in this record")
            return
        missing, extra = [n for n in names if n not in have], sorted(set(have) - set(names))
        if missing:
            raise LogError(path, ln, f"drafts.{missing[0]}", f"drafter missing in this record (present in "
                           f"{self.first}); pick drafters present in every record with --drafters")
        if extra:
            raise LogError(path, ln, f"drafts.{extra[0]}", f"drafter absent from {self.first}; pick drafters "
                           "present in every record with --drafters")


def _read_file(path: Path, dr: _Drafters) -> tuple[list[_Batch], str]:
    """Every record of one file as validated column batches, and the file's sha256.

    Three paths, each giving identical arrays: a compiled reader for the whole file (the parser
    of bandit/_colparse.c, else pyarrow's; bandit/fastload.py); else orjson and bulk checks batch
    by batch; a batch that fails those is re-read record by record with the exact checks, which
    name the file, line and field.
    """
    if _fastload is not None:
        fast = _fastload.read_file(path, dr.requested, dr.names, _features)
        if fast is not None:
            first, cols, digest, _reader = fast
            dr.fix(first, path, 1)
            return [_Batch(**c) for c in cols], digest
    reader = _Lines(path)
    out = []
    for ln0, lines, last in reader:
        lns, lines = _nonblank(ln0, lines)
        if not lines:
            continue
        res: _Batch | str = "json"
        if _fastjson is not None:
            try:
                objs = list(map(_fastjson.loads, lines))
            except ValueError:
                objs = None
            if objs is not None and dr.fix(objs[0], path, lns[0]):
                # records holding other drafters than those loaded go the exact path, which checks them too
                try:
                    res = _bulk(objs, dr.names, lines)
                except (TypeError, ValueError, OverflowError):  # a shape the bulk checks did not foresee
                    res = "bulk"
        if isinstance(res, str):
            objs = [_parse_exact(s, path, ln, last and i == len(lines) - 1) for i, (ln, s) in enumerate(zip(lns, lines))]
            for ln, o in zip(lns, objs):  # raises at the first problem, named by file, line and field
                _check_record(o, path, ln)
                dr.check(o, path, ln)
            res = _bulk(objs, dr.names, None)
            if isinstance(res, str):
                raise LogError(path, lns[0], res, "failed bulk validation in the batch of lines starting here, "
                                                  "yet the exact check found nothing (a loader bug)")
        res.line = np.asarray(lns, np.int64)
        out.append(res)
    return out, reader.sha256


def _assemble(batches: list[_Batch], file_idx: np.ndarray, files: list[Path], names: tuple[str, ...]) -> BlockTable:
    """One table from every file's batches: codes for names, records sorted, duplicates located."""
    keyed = [b.keys() for b in batches]
    uniq = sorted(set(chain.from_iterable(pairs for pairs, _ in keyed)))
    workloads = tuple(sorted({w for w, _ in uniq}))
    pmap = {k: i for i, k in enumerate(uniq)}
    wmap = {w: i for i, w in enumerate(workloads)}
    lut: dict[int, np.ndarray] = {}  # per distinct pairs list (a file's batches may share one)
    for pairs, _ in keyed:
        if id(pairs) not in lut:
            lut[id(pairs)] = np.fromiter(map(pmap.__getitem__, pairs), np.int32, len(pairs))
    prompt = np.concatenate([lut[id(pairs)][code] for pairs, code in keyed]).astype(np.int32, copy=False)
    workload = np.fromiter((wmap[w] for w, _ in uniq), np.int32, len(uniq))[prompt]
    del keyed, lut
    cat = lambda f: np.concatenate([getattr(b, f) for b in batches])
    pos, line = cat("pos"), cat("line")
    dp = np.diff(prompt)
    if ((dp > 0) | ((dp == 0) & (np.diff(pos) > 0))).all():
        take = lambda a: a  # records already in order, no key twice: the stable sort below is the identity
    else:
        order = np.lexsort((pos, prompt))  # stable: equal keys keep file order
        dup = (np.diff(prompt[order]) == 0) & (np.diff(pos[order]) == 0)
        if dup.any():
            later = order[1:][dup]
            i = int(later.min())  # the first record, in reading order, whose key was seen before
            k = int(np.flatnonzero(order == i)[0])
            j = int(order[k - 1])
            while k > 1 and prompt[order[k - 2]] == prompt[i] and pos[order[k - 2]] == pos[i]:
                k -= 1
                j = int(order[k - 1])
            w, p = uniq[prompt[i]]
            raise LogError(files[file_idx[i]], int(line[i]), "pos",
                           f"duplicate record for workload={w!r} prompt_id={p!r} pos={pos[i]} "
                           f"(first at {files[file_idx[j]]}:{line[j]})")
        take = lambda a: a[order]
    return BlockTable(
        drafters=tuple(names), workloads=workloads, prompt_ids=tuple(f"{w}/{p}" for w, p in uniq),
        workload=take(workload), prompt=take(prompt), pos=take(pos), block=take(cat("block")),
        accepted=take(cat("accepted")), draft_len=take(cat("draft_len")), expected_accepted=take(cat("expected")),
        features=take(cat("features")), ms=take(cat("ms")), target_ms=take(cat("target_ms")),
        dense=_is_dense(take(prompt), take(pos)))


def load_logs(paths: Sequence[str | Path], drafters: Sequence[str] | None = None) -> BlockTable:
    """Load and validate logs into one `BlockTable`; raises `LogError` at the first problem.

    Reads each file with a compiled reader where it can (bandit/fastload.py: the parser of
    bandit/_colparse.c, else pyarrow's JSON reader), else streams it in batches validated in
    bulk; a file the compiled readers refuse and a batch that fails a bulk check are re-read
    with the exact reference checks, which name the file, line and field.
    Refuses to pool runs of different campaigns (docs/DESIGN.md): simulated with measured, or
    different targets, drafters, k or temperature.
    """
    files = expand_paths(paths)
    if not files:
        raise LogError("<inputs>", 0, "path", "no input files")
    dr = _Drafters(tuple(drafters) if drafters else None)
    batches: list[_Batch] = []
    file_idx, sources, manifests, keys = [], [], [], {}
    gc_on = gc.isenabled()
    gc.disable()  # millions of short-lived containers: the collector would rescan them, finding nothing
    try:
        for fi, f in enumerate(files):
            m = read_manifest(f)
            key = campaign_key(m)
            keys.setdefault(key, f)
            if len(keys) > 1:
                other = next(p for k, p in keys.items() if k != key)
                raise LogError(f, 0, "manifest", f"belongs to another campaign than {other} ({key} vs "
                                                 f"{campaign_key(read_manifest(other))}); analyse them separately")
            if m is not None and m not in manifests:
                manifests.append(m)
            bs, digest = _read_file(f, dr)
            n = sum(len(b.pos) for b in bs)
            if n == 0:
                raise LogError(f, 0, "file", "no records (empty file)")
            sources.append(LogSource(str(f), digest, n))
            batches += bs
            file_idx.append(np.full(n, fi, np.int32))
        t = _assemble(batches, np.concatenate(file_idx), files, dr.names)
    finally:
        if gc_on:
            gc.enable()
    label = campaign_key(manifests[0] if manifests else None)[0]
    if label not in LABELS:
        raise LogError(files[0], 0, "manifest.label", f"unknown label {label!r}; expected one of {LABELS}")
    _check_names(files, t)
    _check_manifests(files, t, drafters)
    return replace(t, label=label, manifests=tuple(manifests), sources=tuple(sources))


def _check_names(files: Sequence[Path], t: BlockTable) -> None:
    """Names must be valid Unicode: JSON can spell a lone surrogate (\\ud800), which no output can print."""
    for field, names in (("workload", t.workloads), ("drafts", t.drafters),
                         ("prompt_id", [p.split("/", 1)[-1] for p in t.prompt_ids])):
        for n in names:
            try:
                n.encode("utf-8")
            except UnicodeEncodeError:
                bad = n.encode("utf-8", "backslashreplace").decode()
                where = next((f for f in files if bad.encode() in f.read_bytes()), files[0]) \
                    if all(f.suffix == ".jsonl" for f in files) else files[0]
                raise LogError(where, 0, field, f"name {bad!r} is not valid Unicode (a lone surrogate escape)") \
                    from None


def _check_manifests(files: Sequence[Path], t: BlockTable, restricted) -> None:
    """Each manifest must describe its logs (the drafters they hold); a measured run still in progress is
    read, with one note on stderr, since its numbers then cover only the prompts logged so far."""
    for d in sorted({f.parent for f in files}):
        m = read_manifest(d / "x")
        if m is None:
            continue
        declared = set(m.get("drafters") or {})
        if not restricted and declared and declared != set(t.drafters):
            raise LogError(d / "manifest.json", 0, "manifest.drafters",
                           f"names {sorted(declared)}, but the logs hold {sorted(t.drafters)}")
        if m.get("mode") == "dense" and not t.dense:
            raise LogError(d / "manifest.json", 0, "mode", "the manifest says dense, but " + _first_gap(t)
                           + "; a dense log has a record at every output position (a truncated or edited file?)")
        if m.get("label") == "MEASURED" and not is_complete(m):
            print(f"note: {d} is an incomplete run (its sweep has not finished: no \"complete\" in its manifest); "
                  "every number read from it covers only the prompts logged so far", file=sys.stderr)


def load_logs_reference(paths: Sequence[str | Path], drafters: Sequence[str] | None = None) -> BlockTable:
    """`load_logs` the slow, obvious way (every record a dict, checked one by one): the tests' reference."""
    files = expand_paths(paths)
    recs: list[tuple[Path, int, dict]] = []
    sources, manifests = [], []
    for f in files:
        n0 = len(recs)
        recs += [(f, ln, r) for ln, r in iter_records(f)]
        if len(recs) == n0:
            raise LogError(f, 0, "file", "no records (empty file)")
        sources.append(LogSource(str(f), _Lines(f).sha256 or hashlib.sha256(f.read_bytes()).hexdigest(), len(recs) - n0))
        m = read_manifest(f)
        if m is not None and m not in manifests:
            manifests.append(m)
    t = _table_from_records(recs, drafters)
    label = campaign_key(manifests[0] if manifests else None)[0]
    return replace(t, label=label, manifests=tuple(manifests), sources=tuple(sources))


def validate_logs(paths: Sequence[str | Path], drafters: Sequence[str] | None = None,
                  all_errors: bool = False) -> tuple[BlockTable | None, list[LogError]]:
    """(table, []) when valid; else (None, errors): the first, or with `all_errors` every record error."""
    try:
        files = expand_paths(paths)
    except LogError as e:
        return None, [e]
    if not all_errors:
        try:
            return load_logs(files, drafters), []
        except LogError as e:
            return None, [e]
    errors: list[LogError] = []
    for f in files:
        try:
            n = sum(1 for _ in iter_records(f, errors))
            if n == 0 and not any(e.path == str(f) for e in errors):
                errors.append(LogError(f, 0, "file", "no records (empty file)"))
        except LogError as e:
            errors.append(e)
    if errors:
        return None, errors
    try:
        return load_logs(files, drafters), []
    except LogError as e:
        return None, [e]


# ---------------------------------------------------------------- the default input

def is_complete(manifest: dict | None) -> bool:
    """A simulator's run is whole when written; a sweep's once it marked itself `complete`."""
    return bool(manifest) and (manifest.get("label") == "SIM" or manifest.get("complete") is True)


def default_campaign(root: str | Path = "runs") -> tuple[Path, list[Path], str]:
    """The one run an analysis reads when given no paths: (its directory, its log files, a sentence saying which).

    The newest *complete* measured run under `root` (by manifest `created`, then name), else the newest
    simulated one. Never several runs pooled: pooling is explicit (give the paths). Runs without a manifest,
    and measured runs still in progress (or killed), are never chosen.
    """
    root = Path(root)
    runs: dict[Path, dict | None] = {}
    for f in expand_paths([root]):
        try:
            runs.setdefault(f.parent, read_manifest(f))
        except LogError:
            runs.setdefault(f.parent, None)  # an unreadable manifest: that run is not a default
    skipped = sorted(str(d) for d, m in runs.items() if m and m.get("label") == "MEASURED" and not is_complete(m))
    for label in ("MEASURED", "SIM"):
        cands = [(str(m.get("created", "")), str(d)) for d, m in runs.items()
                 if m and m.get("label") == label and is_complete(m)]
        if cands:
            d = Path(max(cands)[1])
            note = f"; incomplete, not read: {', '.join(skipped)}" if skipped else ""
            return d, expand_paths([d]), f"[{label}] campaign {d} (the newest complete {label.lower()} run under {root}/{note})"
    raise LogError(root, 0, "path", "no complete measured or simulated run with a manifest here; give log paths")


def default_inputs(root: str | Path = "runs") -> tuple[list[Path], str]:
    """`default_campaign` without the directory: (its log files, the sentence)."""
    _, files, said = default_campaign(root)
    return files, said


def run_dir(paths: Sequence[str | Path]) -> Path | None:
    """The one run directory all of `paths`' logs lie in, or None (no logs, or several runs pooled)."""
    dirs = {f.parent for f in expand_paths(paths)}
    return next(iter(dirs)) if len(dirs) == 1 else None


def output_path(paths: Sequence[str | Path], name: str, out: str | Path | None = None) -> Path | None:
    """Where an analysis writes its output `name`: `out` if given; else next to the campaign it describes
    (<run dir>/<name>) when its inputs are one run; else nowhere (pooled runs: printed only)."""
    if out is not None:
        return Path(out)
    d = run_dir(paths)
    return None if d is None else d / name


def cli(paths: Annotated[list[Path], typer.Argument(help="log files, globs or directories")],
        all: Annotated[bool, typer.Option("--all", help="report every problem, not only the first")] = False,
        drafters: Annotated[str, typer.Option(help="comma-separated drafters every record must hold")] = "") -> None:
    """Validate block logs: exit 0 and a one-line summary if valid, else exit 1 and the first error (every error with --all).

    PATHS are files (.jsonl, .jsonl.gz), globs, or directories (meaning **/blocks_*.jsonl* under them).
    Logs of different campaigns (runs that may not be pooled) are validated separately, a summary each.
    --drafters a,b restricts to drafters present in every record.
    """
    names = [d for d in drafters.split(",") if d] or None
    try:
        files = expand_paths(paths)
    except LogError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    campaigns: dict[tuple, list[Path]] = {}
    for f in files:
        try:
            key = campaign_key(read_manifest(f))
        except LogError:  # an unreadable manifest: validate_logs reports it with the file
            key = ("?", str(f))
        campaigns.setdefault(key, []).append(f)
    errors, summaries = [], []
    for group in campaigns.values():
        table, errs = validate_logs(group, names, all_errors=all)
        errors += errs
        if table is not None:
            summaries.append(table.summary())
        if errs and not all:
            break
    if errors:
        for e in errors:
            typer.echo(str(e), err=True)
        typer.echo(f"invalid: {len(errors)} error{'s' if len(errors) > 1 else ''}" if all else "invalid", err=True)
        raise typer.Exit(1)
    for s in summaries:
        typer.echo(f"valid: {s}")


def script(paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories "
                                                                   "(default: the default campaign under runs/)")] = None) -> None:
    """Load the logs (default: the default campaign under runs/) and print their one-line summary."""
    if paths:
        typer.echo(load_logs(paths).summary())
    else:
        files, said = default_inputs()
        typer.echo(said)
        typer.echo(load_logs(files).summary())


if __name__ == "__main__":
    from bandit.errors import run
    run(script)
