"""The Parquet cache of block logs: a validated log's columns, proven on every load, never trusted.

A log read whole leaves a copy `.<log name>.<sha16>.parquet` beside it, or `<sha256>.parquet` in
$SPECBANDIT_CACHE (default ~/.cache/specbandit; `off` disables the cache) when its directory takes
no file; later loads of the same bytes read that instead. The copy's metadata holds the log's sha256,
the schema version and the digest of the copy's own columns (`content_digest`), all checked on
every load: a copy edited in place keeps its name and metadata but not its digest, and is then
discarded with a note and rebuilt from the log (docs/DESIGN.md, "Readers").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bandit.logs.columnar import ParquetPart, StaleCache, content_digest, file_metadata, table_of, write_parquet
from bandit.logs.records import Columns
from bandit.logs.schema import SCHEMA_VERSION

CACHE_MIN_RECORDS = 1000  # smaller logs parse faster than a Parquet file opens: not cached


def cache_dir() -> Path | None:
    """Where caches go when a log's own directory is not writable; None: caching is off."""
    env = os.environ.get("SPECBANDIT_CACHE", "")
    if env == "off":
        return None
    return Path(env) if env else Path.home() / ".cache" / "specbandit"


def cache_paths(log: Path, sha256: str) -> list[Path]:
    """The places of a log's cached copy, in the order tried: beside the log, then in the cache directory."""
    d = cache_dir()
    return [] if d is None else [log.parent / f".{log.name}.{sha256[:16]}.parquet", d / f"{sha256}.parquet"]


def cached(log: Path, sha256: str) -> ParquetPart | None:
    """The log's cached columns (file `sha256`), if a valid copy exists (a symlink is not read)."""
    for p in cache_paths(log, sha256):
        if p.is_file() and not p.is_symlink():
            try:
                return ParquetPart(p, cache_of=log, sha256=sha256)
            except StaleCache as e:
                if len(e.args) > 1:  # rebuilt by the caller's read of the log (write_cache replaces it)
                    print(f"note: the cached copy {p} of {log} was discarded ({e.args[1]}); rebuilt", file=sys.stderr)
                continue
    return None


def write_cache(cols: Columns) -> Path | None:
    """Write the cached copy of a validated log; where, or None (not cacheable, or no place would take it)."""
    if not cols.uniform or cols.n < CACHE_MIN_RECORDS:
        return None
    try:
        table = table_of(cols, {"specbandit.sha256": cols.sha256}, with_line=True)
    except UnicodeEncodeError:  # a name with a lone surrogate: the load refuses it anyway
        return None
    meta = {"specbandit.sha256": cols.sha256, "specbandit.schema": str(SCHEMA_VERSION)}
    table = table.replace_schema_metadata(file_metadata(meta | {"specbandit.digest": content_digest(table)}))
    log = Path(cols.path)
    for p in cache_paths(log, cols.sha256):
        try:
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_parquet(p, table)
        except OSError:  # read-only, disk full, a symlink in the way: try the next place, else skip the cache
            continue
        if p.parent == log.parent:
            _remove_older(log, p)
        return p
    return None


def _remove_older(log: Path, keep: Path) -> None:
    """Delete the cached copies of earlier contents of this log beside it (plain files only)."""
    head = f".{log.name}."
    for q in log.parent.iterdir():
        ours = q.name.startswith(head) and q.name.endswith(".parquet") and len(q.name) == len(head) + 24
        if ours and q != keep and not q.is_symlink():
            try:
                q.unlink()
            except OSError:
                pass
