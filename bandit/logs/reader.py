"""Block logs (schema v1): find, load and validate them into one typed table, and pack them as Parquet.

A block log is JSON lines, one object per (prompt, position) at which every drafter drafted
from the same prefix (see docs/DESIGN.md). `load_logs` turns any number of files into a
`BlockTable` of numpy arrays, or raises `LogError` (`PATH:LINE: FIELD: problem`): nothing is
silently dropped. Each log is read once by pyarrow (bandit/logs/columnar.py) or, where it refuses, on
the exact path (bandit/logs/records.py), which names every error; the first load leaves a Parquet copy
of the validated columns beside the log (hidden, keyed by its sha256) that later loads read
instead. `pack` writes such copies as block Parquet files (`blocks_<name>.parquet`).

    python bandit/logs/reader.py [PATHS...]     # one-line summary of the logs (default: the published campaign)
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/logs/reader.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import glob
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Iterable, Optional, Sequence

import typer

from bandit.logs.columnar import ParquetPart, StaleCache, block_table, read_arrow
from bandit.logs.logcache import cache_dir, cached, write_cache
from bandit.logs.columnar import write_parquet
from bandit.logs.safeio import write_file
from bandit.logs.errors import run
from bandit.logs.observed import is_observed, refuse_counterfactual
from bandit.logs.records import Drafters, Keys, file_sha256, iter_records, read_exact
from bandit.logs.schema import EMPTY_DRAFT_FEATURES, FEATURES, LABELS, REPO, SCHEMA_VERSION
from bandit.logs.table import BlockTable, LogError, LogSource, assemble, drafter_names, first_gap, table_from_records

__all__ = ["BlockTable", "LogError", "LogSource", "load_logs", "load_logs_reference", "validate_logs", "expand_paths"]
__all__ += ["read_manifest", "campaign_key", "default_campaign", "default_inputs", "run_dir", "output_path"]
__all__ += ["is_complete", "iter_records", "pack", "FEATURES", "LABELS", "SCHEMA_VERSION", "EMPTY_DRAFT_FEATURES"]

SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")


# ---------------------------------------------------------------- finding the files


def _stem(name: str) -> str:
    return next(name[: -len(s)] for s in SUFFIXES if name.endswith(s))


def _one_copy_each(found: list[Path]) -> None:
    """A directory may not hold a log both as JSON lines and as Parquet (e.g. packed beside itself):
    read both and every record would be twice; which one is meant is the user's to say."""
    seen: dict[tuple[Path, str], Path] = {}
    for q in found:
        other = seen.setdefault((q.parent, _stem(q.name)), q)
        if other is not q and (other.name.endswith(".parquet") != q.name.endswith(".parquet")):
            why = f"holds both {other.name} and {q.name} (one log twice?); remove one, or name the file to read"
            raise LogError(q.parent, 0, "path", why)


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, globs expanded, a directory meaning `**/blocks_*.jsonl[.gz]` and `**/blocks_*.parquet`
    under it (one directory holding blocks_X.jsonl[.gz] and blocks_X.parquet is refused)."""
    out: list[Path] = []
    for p in paths:
        if not str(p):  # Path("") is ".": an empty argument would pool every run below the working directory
            raise LogError("''", 0, "path", "an empty path (name a run directory or log file)")
        p = Path(p)
        if is_observed(p):  # an engine's counters are no block log: every reader of logs refuses them, saying why
            refuse_counterfactual(p)
        if p.is_dir():
            found = sorted(q for q in p.rglob("blocks_*") if q.name.endswith(SUFFIXES) and q.is_file())
            if not found:
                raise LogError(p, 0, "path", "directory holds no blocks_*.jsonl, blocks_*.jsonl.gz or blocks_*.parquet")
            _one_copy_each(found)
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
    m = Path(log_path).parent / "manifest.json"
    if not m.is_file():
        return None
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


def campaign_key(manifest: dict | None) -> tuple:
    """Runs may be pooled only when these agree (docs/DESIGN.md: same target, drafters, k, T, label)."""
    if manifest is None:
        return ("UNLABELLED",)
    tgt, drafters = manifest.get("target") or {}, tuple(sorted((manifest.get("drafters") or {}).keys()))
    target = tgt.get("sha256") or tgt.get("name")
    return (manifest.get("label", "UNLABELLED"), target, drafters, manifest.get("k"), manifest.get("temperature"))


# ---------------------------------------------------------------- loading


def read_log(path: Path, dr: Drafters, trust_cache: bool = True) -> Keys:
    """One file's validated records: a block Parquet file; else a log from its cached copy (unless
    `trust_cache` is False: a copy that failed its checks), from pyarrow's reader, or on the exact path (a
    file pyarrow refuses, or whose drafters this load refuses or subsets). A log read whole leaves its
    cached copy (bandit/logs/columnar.py) and is then read back from it."""
    path = Path(path)
    if path.name.endswith(".parquet"):
        part = ParquetPart(path)
        if not dr.fits(part):
            raise _drafters_differ(dr, part)
        return part
    caching = cache_dir() is not None
    part = cached(path, file_sha256(path)) if caching and trust_cache else None
    if part is not None:
        return part if dr.fits(part) else read_exact(path, dr)  # the exact path names the record
    cols = read_arrow(path)
    if cols is None or not dr.fits(cols):
        cols = read_exact(path, dr)
    written = write_cache(cols) if caching else None
    if written is not None:
        try:  # from the copy: one file's columns in memory at a time, however large the campaign
            return ParquetPart(written, cache_of=path, sha256=cols.sha256)
        except StaleCache:
            pass
    return cols


def _drafters_differ(dr: Drafters, part: Keys) -> LogError:
    have = ", ".join(part.drafters)
    if dr.requested:
        gone = next(n for n in dr.requested if n not in part.drafters)
        return part.error(-1, f"drafts.{gone}", f"requested drafter not in this file (it holds {have})")
    gone = sorted(set(dr.names) ^ set(part.drafters))[0]
    why = f"this file's drafters ({have}) differ from those of {dr.first}; pick drafters present in every file"
    return part.error(-1, f"drafts.{gone}", why + " with --drafters")


def load_logs(
    paths: Sequence[str | Path], drafters: Sequence[str] | None = None, trust_cache: bool = True
) -> BlockTable:
    """Load and validate logs into one `BlockTable`; raises `LogError` at the first problem.

    Each log is read by `read_log` (its cached copy, pyarrow, or the exact path, which names the
    file, line and field of any problem: the error is the same whichever reader saw the file
    first); block Parquet files are read and checked column by column. Refuses to pool runs of
    different campaigns (docs/DESIGN.md): simulated with measured, or different targets,
    drafters, k or temperature. `trust_cache=False` (validate): every log is read itself, its cache rewritten.
    """
    files = expand_paths(paths)
    if not files:
        raise LogError("<inputs>", 0, "path", "no input files")
    stale: set[str] = set() if trust_cache else {str(f) for f in files}  # False: every log read itself
    while True:
        try:
            return _load(files, drafters, stale)
        except StaleCache as e:  # a cached copy failed its checks (edited, damaged): read that log itself
            stale.add(e.args[0])
            if len(e.args) > 1:
                print(
                    f"note: the cached copy of {e.args[0]} was discarded ({e.args[1]}); rebuilt from the log",
                    file=sys.stderr,
                )


def _load(files: list[Path], drafters: Sequence[str] | None, stale: set[str]) -> BlockTable:
    dr = Drafters(drafters)
    parts, manifests, keys = [], [], {}
    for f in files:
        m = read_manifest(f)
        key = campaign_key(m)
        keys.setdefault(key, f)
        if len(keys) > 1:
            other = next(p for k, p in keys.items() if k != key)
            why = f"belongs to another campaign than {other} ({key} vs {campaign_key(read_manifest(other))})"
            raise LogError(f, 0, "manifest", why + "; analyse them separately")
        if m is not None and m not in manifests:
            manifests.append(m)
        parts.append(read_log(f, dr, trust_cache=str(f) not in stale))
    sources = tuple(LogSource(str(f), p.sha256, p.n) for f, p in zip(files, parts))
    t = assemble(parts, dr.names)
    label = campaign_key(manifests[0] if manifests else None)[0]
    if label not in LABELS:
        raise LogError(files[0], 0, "manifest.label", f"unknown label {label!r}; expected one of {LABELS}")
    _check_names(files, t)
    _check_manifests(files, t, drafters)
    return replace(t, label=label, manifests=tuple(manifests), sources=sources)


def _check_names(files: Sequence[Path], t: BlockTable) -> None:
    """Names must be valid Unicode: JSON can spell a lone surrogate (\\ud800), which no output can print."""
    prompts = [p.split("/", 1)[-1] for p in t.prompt_ids]
    for field, names in (("workload", t.workloads), ("drafts", t.drafters), ("prompt_id", prompts)):
        for n in names:
            if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in n):  # would reach the terminal raw (escapes)
                why = f"name {n!r} holds a control character; names are printed in every report"
                raise LogError(files[0], 0, field, why.encode("utf-8", "backslashreplace").decode())
            try:
                n.encode("utf-8")
            except UnicodeEncodeError:
                bad = n.encode("utf-8", "backslashreplace").decode()
                where = files[0]
                if all(f.suffix == ".jsonl" for f in files):
                    where = next((f for f in files if bad.encode() in f.read_bytes()), files[0])
                why = f"name {bad!r} is not valid Unicode (a lone surrogate escape)"
                raise LogError(where, 0, field, why) from None


def _check_manifests(files: Sequence[Path], t: BlockTable, restricted) -> None:
    """Each manifest must describe its logs (the drafters they hold); a measured run still in progress is
    read, with one note on stderr, since its numbers then cover only the prompts logged so far."""
    for d in sorted({f.parent for f in files}):
        m = read_manifest(d / "x")
        if m is None:
            continue
        declared, where = set(m.get("drafters") or {}), d / "manifest.json"
        if not restricted and declared and declared != set(t.drafters):
            why = f"names {sorted(declared)}, but the logs hold {sorted(t.drafters)}"
            raise LogError(where, 0, "manifest.drafters", why)
        if m.get("mode") == "dense" and not t.dense:
            why = "; a dense log has a record at every output position (a truncated or edited file?)"
            raise LogError(where, 0, "mode", "the manifest says dense, but " + first_gap(t) + why)
        if m.get("label") == "MEASURED" and not is_complete(m):
            note = f'note: {d} is an incomplete run (its sweep has not finished: no "complete" in its manifest); '
            print(note + "every number read from it covers only the prompts logged so far", file=sys.stderr)


def load_logs_reference(paths: Sequence[str | Path], drafters: Sequence[str] | None = None) -> BlockTable:
    """`load_logs` of JSON-lines logs the slow, obvious way (every record a dict, checked one by one):
    the tests' reference."""
    files = expand_paths(paths)
    recs: list[tuple[Path, int, dict]] = []
    sources, manifests = [], []
    for f in files:
        if f.name.endswith(".parquet"):
            raise LogError(f, 0, "path", "the reference loader reads JSON lines only")
        n0 = len(recs)
        recs += [(f, ln, r) for ln, r in iter_records(f)]
        if len(recs) == n0:
            raise LogError(f, 0, "file", "no records (empty file)")
        sources.append(LogSource(str(f), file_sha256(f), len(recs) - n0))
        m = read_manifest(f)
        if m is not None and m not in manifests:
            manifests.append(m)
    t = table_from_records(recs, drafters)
    label = campaign_key(manifests[0] if manifests else None)[0]
    return replace(t, label=label, manifests=tuple(manifests), sources=tuple(sources))


def validate_logs(
    paths: Sequence[str | Path], drafters: Sequence[str] | None = None, all_errors: bool = False
) -> tuple[BlockTable | None, list[LogError]]:
    """(table, []) when valid; else (None, errors): the first, or with `all_errors` every record error."""
    try:
        files = expand_paths(paths)
    except LogError as e:
        return None, [e]
    errors: list[LogError] = []
    for f in files if all_errors else []:
        try:
            if f.name.endswith(".parquet"):  # columns, not records: its first problem
                load_logs([f], drafters)
                continue
            n = sum(1 for _ in iter_records(f, errors))
            if n == 0 and not any(e.path == str(f) for e in errors):
                errors.append(LogError(f, 0, "file", "no records (empty file)"))
        except LogError as e:
            errors.append(e)
    if errors:
        return None, errors
    try:
        return load_logs(files, drafters, trust_cache=False), []  # the logs themselves, never a cached copy
    except LogError as e:
        return None, [e]


# ---------------------------------------------------------------- packing


def _pack_plan(files: list[Path], out: Path) -> tuple[dict[Path, Path], bytes | None]:
    """{log: the Parquet file to write} and the manifest's bytes; raises LogError at what pack refuses."""
    if not files:
        raise LogError("<inputs>", 0, "path", "no input files")
    campaigns: dict[tuple, list[Path]] = {}
    for f in files:
        if f.name.endswith(".parquet"):
            raise LogError(f, 0, "path", "already a block Parquet file; pack reads .jsonl and .jsonl.gz logs")
        campaigns.setdefault(campaign_key(read_manifest(f)), []).append(f)
    if len(campaigns) > 1:
        which = "; ".join(f"{k} ({', '.join(map(str, fs))})" for k, fs in campaigns.items())
        raise LogError(out, 0, "manifest", f"logs of different campaigns: {which}; pack each into its own directory")
    mans = {(f.parent / "manifest.json").read_bytes() for f in files if (f.parent / "manifest.json").is_file()}
    if len(mans) > 1:
        why = "the logs come from runs with different manifest.json files; pack each run into its own directory"
        raise LogError(out, 0, "manifest", why)
    plan = {f: out / f"{_stem(f.name)}.parquet" for f in files}
    for f, dest in plan.items():
        twin = [g for g, d in plan.items() if d == dest and g != f]
        if twin:
            raise LogError(dest, 0, "out", f"two logs would be packed into it: {f} and {twin[0]}")
        for log in (dest.with_name(dest.name[:-8] + ".jsonl"), dest.with_name(dest.name[:-8] + ".jsonl.gz")):
            if log.exists():
                why = f"{log.name} lies in that directory: it would hold one log twice; pack into another directory"
                raise LogError(dest, 0, "out", why)
    return plan, (mans.pop() if mans else None)


def pack(
    paths: Annotated[list[str], typer.Argument(help="log files, globs or directories")],
    out: Annotated[str, typer.Option("--out", help="directory to write blocks_<name>.parquet into")],
) -> None:
    """Pack block logs as Parquet: blocks_<name>.parquet per log in OUT, and the run's manifest.json.

    The logs are validated first, as a whole (as `specbandit validate` does); OUT then loads like them,
    without parsing JSON. Refuses logs of different campaigns, a symlink in OUT's place or a file's,
    and a file in OUT that already holds other content.
    """
    if not out:  # typer would make '' the working directory
        raise LogError("''", 0, "out", "an empty path (name a directory)")
    files, out = expand_paths(paths), Path(out)
    plan, manifest = _pack_plan(files, out)
    load_logs(files)
    if out.is_symlink():
        raise LogError(out, 0, "out", "is a symlink: not written through")
    out.mkdir(parents=True, exist_ok=True)
    try:
        for f, dest in plan.items():
            part = read_log(f, Drafters(None))  # its cached copy, as a rule: load_logs just wrote it
            meta = {"specbandit.source": f.name, "specbandit.sha256": part.sha256}
            write_parquet(dest, block_table(part, meta), replace_different=False)
            typer.echo(f"wrote {dest} ({part.n} records)")
        if manifest is not None:
            write_file(out / "manifest.json", lambda fh: fh.write(manifest), replace_different=False)
            typer.echo(f"wrote {out / 'manifest.json'}")
    except FileExistsError as e:
        raise LogError(e.filename, 0, "out", f"{e.strerror}; remove it or pack into another directory") from None


# ---------------------------------------------------------------- the default input


def is_complete(manifest: dict | None) -> bool:
    """A simulator's run is whole when written; a sweep's once it marked itself `complete`."""
    return bool(manifest) and (manifest.get("label") == "SIM" or manifest.get("complete") is True)


PUBLISHED = REPO / "paper" / "campaign.txt"  # names the published campaign: what an analysis reads by default


def published_campaign() -> Path | None:
    """The run named in paper/campaign.txt (relative to the repository), when it exists and is complete."""
    try:
        name = PUBLISHED.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    d = Path(name) if Path.cwd() == REPO else REPO / name  # as the shipped reports name it, from the repository
    try:
        m = read_manifest(d / "x") if name and d.is_dir() else None
    except LogError:
        return None
    return d if m and is_complete(m) else None


def default_campaign(root: str | Path = "runs", latest: bool = False) -> tuple[Path, list[Path], str]:
    """The one run an analysis reads when given no paths: (its directory, its log files, a sentence saying which).

    The published campaign (paper/campaign.txt), unless `latest` or another `root` is asked for; else the
    newest *complete* measured run under `root` (by manifest `created`, then name), else the newest simulated
    one. Never several runs pooled: pooling is explicit (give the paths). Runs without a manifest, and
    measured runs still in progress (or killed), are never chosen.
    """
    pub = published_campaign() if not latest and str(root) == "runs" else None
    if pub is not None:
        label = (read_manifest(pub / "x") or {}).get("label", "UNLABELLED")
        said = f"[{label}] campaign {pub} (the published campaign, paper/campaign.txt; --latest: the newest)"
        return pub, expand_paths([pub]), said
    root = Path(root)
    runs: dict[Path, dict | None] = {}
    for f in expand_paths([root]):
        try:
            runs.setdefault(f.parent, read_manifest(f))
        except LogError:
            runs.setdefault(f.parent, None)  # an unreadable manifest: that run is not a default
    skipped = sorted(str(d) for d, m in runs.items() if m and m.get("label") == "MEASURED" and not is_complete(m))
    for label in ("MEASURED", "SIM"):
        done = {d: m for d, m in runs.items() if m and m.get("label") == label and is_complete(m)}
        if done:
            d = Path(max((str(m.get("created", "")), str(d)) for d, m in done.items())[1])
            note = f"; incomplete, not read: {', '.join(skipped)}" if skipped else ""
            said = f"[{label}] campaign {d} (the newest complete {label.lower()} run under {root}/{note})"
            return d, expand_paths([d]), said
    raise LogError(root, 0, "path", "no complete measured or simulated run with a manifest here; give log paths")


def default_inputs(root: str | Path = "runs", latest: bool = False) -> tuple[list[Path], str]:
    """`default_campaign` without the directory: (its log files, the sentence)."""
    _, files, said = default_campaign(root, latest)
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


def cli(
    paths: Annotated[list[str], typer.Argument(help="log files, globs or directories")],  # str: '' is not '.'
    all: Annotated[bool, typer.Option("--all", help="report every problem, not only the first")] = False,
    drafters: Annotated[Optional[str], typer.Option(help="comma-separated drafters every record must hold")] = None,
) -> None:
    """Validate block logs: exit 0 and a one-line summary if valid, else exit 1 and the first error (every error with --all).

    PATHS are files (.jsonl, .jsonl.gz, .parquet), globs, or directories (meaning **/blocks_*.jsonl* and
    **/blocks_*.parquet under them). Logs of different campaigns (runs that may not be pooled) are validated
    separately, a summary each. --drafters a,b restricts to drafters present in every record.
    """
    names = drafter_names(drafters)
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


def demo(body: Callable[[list[Path], str], None], doc: str) -> None:
    """`python bandit/<module>.py [PATHS] [--latest]` through the boundary (bandit/logs/errors.py): body(files, said)."""

    def main(
        paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
        latest: Annotated[
            bool, typer.Option("--latest", help="the newest complete run, not the published one")
        ] = False,
    ) -> None:
        if paths and latest:  # one or the other
            raise LogError("--latest", 0, "paths", "--latest picks the run itself: give no paths with it")
        body(*((expand_paths(paths), f"logs {', '.join(paths)}") if paths else default_inputs(latest=latest)))

    main.__doc__ = doc + " PATHS default to the published campaign (paper/campaign.txt)."
    run(main)


if __name__ == "__main__":
    demo(lambda files, said: typer.echo(f"{said}\n{load_logs(files).summary()}"), "The logs' one-line summary.")
