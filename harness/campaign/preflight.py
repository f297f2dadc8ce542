"""A run directory before a sweep writes it: the checks that need no model (preflight: a symlink, a run already
there, a shard's records, a lock another sweep holds), which files are the harness's own (check_symlinks: none may
be a symlink), a lock's holder named (wait_for, busy_message; harness/campaign/rundir.py takes the locks), and the run that
`--resume` without --out continues (find_resumable)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from . import shards
from ..models.lm import HarnessError
from .manifest import SETTINGS
from .shards import CampaignError, Shard

LOCK = shards.LOCK
_NOFOLLOW = shards.NOFOLLOW
# files the harness writes in a run directory; none of them may be a symlink (nor those of the prefixes)
_OWN_FILES = (
    "manifest.json",
    "manifest.json.tmp",
    "progress.jsonl.tmp",
    LOCK,
    shards.MANIFEST_LOCK,
    SETTINGS,
    SETTINGS + ".tmp",
    "live_calibration.json",
    "live_calibration.json.tmp",
)
_OWN_PREFIXES = ("blocks_", "progress", "target_check", "shard-", "live", "outputs")


@contextmanager
def as_harness():
    """The torch-free helpers' CampaignError, raised as the harness's HarnessError."""
    try:
        yield
    except CampaignError as e:
        raise HarnessError(str(e)) from None


def _own_part_has_records(d: Path, shard: Shard) -> bool:
    return bool(shards.read_progress(d / shards.progress_name(shard.tag)))


def preflight(out: str | Path, resume: bool, shard: Shard | None = None) -> None:
    """Checks on the run directory that need no model: run before any work."""
    d = Path(out)
    if os.path.islink(str(out).rstrip("/") or "/"):
        raise HarnessError(
            f"{d}: the run directory is a symlink; refusing to write through it (give the real directory as --out)"
        )
    if d.exists() and not d.is_dir():
        raise HarnessError(f"{d}: exists and is not a directory")
    if d.is_dir():
        check_symlinks(d)
    if resume and not d.exists():
        raise HarnessError(f"--resume {d}: no such run directory (drop --resume to start a new run there)")
    if not resume and (d / "manifest.json").exists():
        if shard is None:
            raise HarnessError(f"{d}: already holds a run; add --resume to continue it, or choose another --out")
        if _own_part_has_records(d, shard):
            raise HarnessError(f"{d}: already holds records of shard {shard}; add --resume to continue it")
    if d.is_dir():
        _probe_lock(d, shard)


def busy_message(d: Path, path: Path, who: list[str]) -> str:
    return (
        f"{d}: in use by another sweep ({'; '.join(who)}, lock {path}); wait for it to finish or choose another --out"
    )


def _probe_lock(d: Path, shard: Shard | None) -> None:
    """Refuse early (before any model loads) when another sweep holds what this one needs."""
    wanted = [(d / LOCK, shard is not None)] + ([(d / f"shard-{shard.tag}.lock", False)] if shard else [])
    for path, shared in wanted:
        if not path.exists() or path.is_symlink():
            continue  # none (or a link: refused by check_symlinks); RunDir takes the lock for real
        who = wait_for(d, path, lambda: _could_take(path, shared))
        if who:
            raise HarnessError(busy_message(d, path, who))


def _could_take(path: Path, shared: bool) -> bool:
    """Whether the lock could be taken in this mode now (tried, and dropped at once; nothing is created)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | shards.CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def wait_for(d: Path, path: Path, attempt) -> list[str] | None:
    """Call `attempt` (take a lock, or try it) until it succeeds: None; or who holds the lock. A failure with no
    holder to name is a lock changing hands (a shard releasing, a writer starting) and is tried again, briefly."""
    who: list[str] = []
    with as_harness():
        for _ in range(40):
            if attempt():
                return None
            who = shards.holders(d) if path.name == LOCK else [shards.describe(shards.holder(path))]
            if who and who != ["unreadable holder"]:
                return who
            time.sleep(0.05)
    return who or ["unreadable holder"]


def check_symlinks(d: Path, *names: str) -> None:
    try:
        entries = list(os.scandir(d))
    except OSError as e:
        raise HarnessError(f"{d}: cannot read the run directory: {e.strerror}") from None
    for e in entries:
        ours = e.name in _OWN_FILES or e.name in names or e.name.startswith(_OWN_PREFIXES)
        if ours and e.is_symlink():
            raise HarnessError(
                f"{d / e.name}: is a symlink; refusing to write through it (a run directory's files must be its own)"
            )


def find_resumable(root: str | Path, keys) -> Path:
    """The newest run under `root` that lacks some of `keys` ((workload, prompt_id)) in its progress."""
    root = Path(root)
    keys = set(keys)
    found, seen = [], 0
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.is_symlink() or not d.is_dir() or not (d / "manifest.json").is_file():
            continue
        try:
            m = json.loads((d / "manifest.json").read_text())
            created = str(m.get("created") or "")
            if m.get("label") != "MEASURED":  # a simulator's run: nothing the sweep could continue
                continue
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable manifest is reported when that run is named with --out
        seen += 1
        done = shards.done_keys(d)
        if not keys <= done or m.get("complete") is not True:  # prompts missing, or the live phase unfinished
            found.append((created, d.stat().st_mtime, d))
    if not found:
        why = (
            f"{root} does not exist"
            if not root.is_dir()
            else f"no run under {root}"
            if not seen
            else f"all {seen} run(s) under {root} are complete"
        )
        raise HarnessError(f"--resume without --out: nothing to continue ({why}); give --out RUN_DIR")
    return max(found)[2]
