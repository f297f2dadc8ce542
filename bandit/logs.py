"""Block logs (schema v1): find, load and validate them into one typed table.

A block log is JSON lines, one object per (prompt, position) at which every drafter drafted
from the same prefix (see DESIGN.md). `load_logs` turns any number of files into a
`BlockTable` of plain numpy arrays, or raises `LogError` whose message is
`PATH:LINE: FIELD: problem`. Nothing is silently dropped: every record either loads or is
an error.

    python bandit/logs.py [PATHS...]     # one-line summary of the logs (default: runs/)
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/logs.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import glob
import gzip
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

try:  # 5-10x faster parsing; the stdlib parser gives identical results
    import orjson as _fastjson
except ImportError:  # pragma: no cover
    _fastjson = None

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
        """(R,) bool: records that are block starts (all of them when no record has `block`)."""
        return self.block >= 0 if self.has_block_flags else np.ones(self.n_records, bool)

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)

    def take(self, idx: np.ndarray) -> "BlockTable":
        """Rows `idx` (bool mask or sorted indices); names, provenance and flags kept."""
        rows = {k: getattr(self, k)[idx] for k in _ROW_FIELDS}
        return replace(self, **rows, dense=_is_dense(rows["prompt"], rows["pos"]))

    def blocks(self) -> "BlockTable":
        """The block starts only (the set B of DESIGN.md's definitions)."""
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
        return (f"{self.n_records} records, {int(self.is_block_start.sum())} blocks, {self.n_prompts} prompts, "
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
    """The manifest.json of the run a log belongs to: next to it or in a parent under runs/."""
    for d in [log_path.parent, *log_path.parent.parents][:3]:
        m = d / "manifest.json"
        if m.is_file():
            try:
                return json.loads(m.read_text())
            except json.JSONDecodeError as e:
                raise LogError(m, e.lineno, "manifest", f"not JSON: {e.msg}") from None
    return None


def campaign_key(manifest: dict | None) -> tuple:
    """Runs may be pooled only when these agree (DESIGN.md: same target, drafters, k, T, label)."""
    if manifest is None:
        return ("UNLABELLED",)
    tgt = manifest.get("target") or {}
    return (manifest.get("label", "UNLABELLED"), tgt.get("sha256") or tgt.get("name"),
            tuple(sorted((manifest.get("drafters") or {}).keys())), manifest.get("k"), manifest.get("temperature"))


# ---------------------------------------------------------------- parsing one file

def _open_lines(path: Path) -> tuple[list[bytes], str]:
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise LogError(path, 0, "file", f"not a readable gzip file ({e}); truncated?") from None
    return raw.split(b"\n"), digest


def _loads(b: bytes):
    if _fastjson is not None:
        return _fastjson.loads(b)
    return json.loads(b)


def _bad_number(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


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
    if "block" in obj and (type(obj["block"]) is not int or obj["block"] < 0):
        err("block", f"expected an int >= 0, got {obj['block']!r}")
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


def _parse_json(line: bytes, path: Path, ln: int, is_last: bool):
    try:
        return _loads(line)
    except ValueError as e:
        what = "truncated last line (an interrupted write?)" if is_last else "not valid JSON"
        raise LogError(path, ln, "line", f"{what}: {str(e).splitlines()[0]}") from None


def _has_nonfinite(obj) -> bool:
    # the stdlib parser accepts NaN/Infinity; orjson rejects them at parse time (then _parse_json reports it)
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_has_nonfinite(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_nonfinite(v) for v in obj)
    return False


def iter_records(path: Path, errors: list[LogError] | None = None, lines: list[bytes] | None = None):
    """Yield (line number, record) of one file; with `errors` collect problems instead of raising."""
    if lines is None:
        lines, _ = _open_lines(path)
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    for i in range(last + 1):
        line = lines[i]
        if not line.strip():
            continue
        try:
            obj = _parse_json(line, path, i + 1, i == last)
            if _fastjson is None and _has_nonfinite(obj):
                raise LogError(path, i + 1, "line", "NaN or Infinity is not allowed")
            _check_record(obj, path, i + 1)
        except LogError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        yield i + 1, obj


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


def _is_dense(prompt: np.ndarray, pos: np.ndarray) -> bool:
    """Every prompt's positions are exactly 0..n-1 (records are sorted by prompt, pos)."""
    if prompt.size == 0:
        return False
    starts = np.r_[0, np.flatnonzero(np.diff(prompt)) + 1]
    expect = np.arange(prompt.size) - np.repeat(starts, np.diff(np.r_[starts, prompt.size]))
    return bool(np.array_equal(pos, expect))


def load_logs(paths: Sequence[str | Path], drafters: Sequence[str] | None = None) -> BlockTable:
    """Load and validate logs into one `BlockTable`; raises `LogError` at the first problem.

    Refuses to pool runs of different campaigns (DESIGN.md): simulated with measured, or
    different targets, drafters, k or temperature.
    """
    files = expand_paths(paths)
    recs: list[tuple[Path, int, dict]] = []
    sources, manifests, keys = [], [], {}
    for f in files:
        n0 = len(recs)
        lines, digest = _open_lines(f)
        recs += [(f, ln, r) for ln, r in iter_records(f, lines=lines)]
        if len(recs) == n0:
            raise LogError(f, 0, "file", "no records (empty file)")
        sources.append(LogSource(str(f), digest, len(recs) - n0))
        m = read_manifest(f)
        key = campaign_key(m)
        keys.setdefault(key, f)
        if len(keys) > 1:
            other = next(p for k, p in keys.items() if k != key)
            raise LogError(f, 0, "manifest", f"belongs to another campaign than {other} ({key} vs "
                                             f"{campaign_key(read_manifest(other))}); analyse them separately")
        if m is not None and m not in manifests:
            manifests.append(m)
    t = _table_from_records(recs, drafters)
    label = campaign_key(manifests[0] if manifests else None)[0]
    if label not in LABELS:
        raise LogError(files[0], 0, "manifest.label", f"unknown label {label!r}; expected one of {LABELS}")
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

def default_inputs(root: str | Path = "runs") -> tuple[list[Path], str]:
    """The logs an analysis reads by default, and a sentence saying which.

    The newest measured campaign under `root` (by manifest `created`, then run name), else
    the shipped simulated one; runs without a manifest are used only when nothing else is there.
    """
    root = Path(root)
    runs: dict[Path, dict | None] = {}
    for f in expand_paths([root]):
        run_dir = f.parent
        runs.setdefault(run_dir, read_manifest(f))
    def newest(label):
        cands = [(str(m.get("created", "")), str(d)) for d, m in runs.items() if m and m.get("label") == label]
        return Path(max(cands)[1]) if cands else None
    for label in ("MEASURED", "SIM"):
        d = newest(label)
        if d is not None:
            key = campaign_key(runs[d])
            same = sorted(p for p, m in runs.items() if campaign_key(m) == key)
            files = expand_paths(same)
            return files, f"[{label}] campaign of {', '.join(str(p) for p in same)} (newest {label.lower()} under {root}/)"
    dirs = sorted(runs)
    return expand_paths(dirs), f"[UNLABELLED] logs without a manifest under {root}/"


def cli(paths: list[Path], all: bool = False, drafters: str = "") -> None:
    """Validate block logs: exit 0 and a one-line summary if valid, else exit 1 and the first error (every error with --all).

    PATHS are files (.jsonl, .jsonl.gz), globs, or directories (meaning **/blocks_*.jsonl* under them).
    --drafters a,b restricts to drafters present in every record.
    """
    import typer
    names = [d for d in drafters.split(",") if d] or None
    table, errors = validate_logs(paths, names, all_errors=all)
    if errors:
        for e in errors:
            typer.echo(str(e), err=True)
        typer.echo(f"invalid: {len(errors)} error{'s' if len(errors) > 1 else ''}" if all else "invalid", err=True)
        raise typer.Exit(1)
    typer.echo(f"valid: {table.summary()}")


if __name__ == "__main__":
    import sys
    args = sys.argv[1:]
    if args:
        print(load_logs(args).summary())
    else:
        files, said = default_inputs()
        print(said)
        print(load_logs(files).summary())
