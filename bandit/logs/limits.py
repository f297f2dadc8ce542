"""The limits of the entry points outside bandit/ (`python -m zoo.heads`, bench/*.py), checked before any work.

Every bounded option states its range in --help and is refused by one `UsageError` naming it (bandit/logs/errors.py:
`error: ...` on one line, exit 2): thread counts in 1..THREADS_MAX (4 x the cores; 0 and negatives refused), seeds
in [0, 2^63) (bandit/logs/outputs.py), counts in their ranges. Sizes that multiply memory (a batch, heads, windows)
are estimated in bytes and refused when this machine's available memory cannot hold them (`fits`). An output file
(`out_file`) is checked before the work: not empty, not a symlink, not a directory, its folder existing; it is then
written through bandit/logs/safeio.py (`write_json`): atomically, never through a symlink. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bandit.logs.errors import UsageError
from bandit.logs.outputs import SEED_END
from bandit.logs.safeio import write_text

CORES = os.cpu_count() or 1
THREADS_MAX = 4 * CORES
THREADS_RANGE = f"1..{THREADS_MAX} (4 x {CORES} cores)"
SEED_RANGE = "0..2^63-1"


class Parser(argparse.ArgumentParser):
    """argparse whose own refusals (a bad type, a missing option) are one `error: ...` line through the boundary."""

    def error(self, message: str):
        raise UsageError(message)


def integer(flag: str, value: int | None, lo: int, hi: int, what: str = "") -> int | None:
    """`value` (None passes) if lo <= value <= hi, else a UsageError naming the option and its range."""
    if value is not None and not lo <= value <= hi:
        raise UsageError(f"{flag} {value}: expected an integer in {lo}..{hi}{what}")
    return value


def threads(flag: str, value: int | None) -> int | None:
    if value is not None and not 1 <= value <= THREADS_MAX:
        raise UsageError(f"{flag} {value}: expected a thread count in {THREADS_RANGE}")
    return value


def seed(flag: str, value: int) -> int:
    if not 0 <= value < SEED_END:
        raise UsageError(f"{flag} {value}: expected a seed in {SEED_RANGE}")
    return value


def available_bytes() -> int:
    """The memory this machine can give now (psutil's `available`, else /proc/meminfo, else free pages)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def fits(what: str, need: float) -> None:
    """A UsageError when `need` bytes (an estimate) exceed the memory available now; `what` names the options."""
    have = available_bytes()
    if need > have:
        raise UsageError(f"{what}: needs about {gib(need)} of memory, this machine has {gib(have)} available")


def path_value(flag: str, value: str | Path | None) -> Path | None:
    """An option's path ('' refused: it would be the current directory), relative to the current directory."""
    if value is None:
        return None
    if not str(value):
        raise UsageError(f"{flag} '': an empty path (name one)")
    return Path(value)


def out_file(flag: str, value: str | Path | None) -> Path | None:
    """An output file's option checked before the work: not empty, not a symlink, not a directory, its folder there."""
    p = path_value(flag, value)
    if p is None:
        return None
    if p.is_symlink():
        raise UsageError(f"{flag} {p}: a symlink stands there (not written through)")
    if p.is_dir():
        raise UsageError(f"{flag} {p}: a directory (name a file)")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: no folder {parent} (make it first)")
    return p


def out_dir(flag: str, value: str | Path | None) -> Path | None:
    """An output directory's option: not empty, not a symlink, not a file (made when missing, later)."""
    p = path_value(flag, value)
    if p is None:
        return None
    if p.is_symlink():
        raise UsageError(f"{flag} {p}: a symlink stands there (not written through)")
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {p}: a file, not a directory")
    return p


def no_symlinks(flag: str, paths) -> None:
    """A UsageError naming the first of `paths` (files a command will write) that is a symlink."""
    for p in paths:
        if Path(p).is_symlink():
            raise UsageError(f"{flag}: {p} is a symlink (not written through)")


def write_json(path: Path, obj, indent: int = 2) -> None:
    """`obj` as JSON at `path`, atomically and never through a symlink (bandit/logs/safeio.py)."""
    write_text(path, json.dumps(obj, indent=indent) + "\n")
