"""Campaigns beyond one process: shards of a campaign's prompts, the parts of a run directory, its locks,
and what makes two runs one campaign (docs/DESIGN.md, "Campaigns beyond one process").

A shard `I/N` is the prompts whose hash of (workload, prompt id) is I modulo N: deterministic, balanced up
to chance, and a prompt added to a workload never moves another prompt to another shard.

The parts of a run directory: each writer appends to files of its own part,

    part ""        blocks_<mode>.jsonl         progress.jsonl         target_check.jsonl         outputs.jsonl
    part "s0of2"   blocks_<mode>-s0of2.jsonl   progress-s0of2.jsonl   target_check-s0of2.jsonl   outputs-s0of2.jsonl

and the campaign's records are those of every part together (`load_logs` on the directory reads every
`blocks_*` file). One manifest.json and one settings.json describe them all.

Locks (flock; the kernel drops them with their process, so a lock file left by a dead process is stale
and is taken over, with a note):

    run.lock              the campaign: held exclusively by a writer of the whole campaign (one process,
                          or a Ray driver), shared by shard writers, which so run side by side
    shard-s0of2.lock      one shard's part: held exclusively by its writer
    manifest.lock         held for the few milliseconds of a manifest update (read, merge, replace)

Each holder writes its pid, host and start time into its lock file, for the refusal messages.
Torch-free: `specbandit merge` (harness/campaign/merge.py) runs on an analysis install.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bandit.logs.errors import InputError

LOCK = "run.lock"
MANIFEST_LOCK = "manifest.lock"
CAMPAIGN_FIELDS = ("mode", "target", "drafters", "k", "temperature", "seed", "workloads")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class CampaignError(InputError):
    """A problem with a run directory, a shard or a campaign, in one line (the sweep raises it as a HarnessError)."""


# ---------------------------------------------------------------- shards


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @property
    def tag(self) -> str:
        return f"s{self.index}of{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, workload: str, prompt_id: str) -> bool:
        return shard_of(workload, prompt_id, self.count) == self.index


MAX_SHARDS = 1 << 16  # shards of one campaign; the sweep also refuses more shards than prompts


def parse_shard(text: str) -> Shard:
    """`I/N` with 0 <= I < N."""
    i, sep, n = str(text).partition("/")
    digits = sep and all(x.isascii() and x.isdigit() and len(x) <= 6 for x in (i, n))  # not 1_0, not ٣
    shard = Shard(int(i), int(n)) if digits else None
    if shard is None or not 0 <= shard.index < shard.count <= MAX_SHARDS:
        raise CampaignError(
            f"--shard {text if str(text).isprintable() else ascii(text)}: expected I/N with 0 <= I < N <= "
            f"{MAX_SHARDS}, N at most the campaign's prompts (e.g. 0/2)"
        )
    return shard


def shard_of(workload: str, prompt_id: str, n: int) -> int:
    """The shard of a prompt among n: its own hash only, so adding prompts moves no other prompt."""
    h = hashlib.sha256(f"{workload}\0{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") % n


def parse_tag(tag: str) -> Shard | None:
    """`s0of2` -> Shard(0, 2); anything else -> None."""
    if not tag.startswith("s") or "of" not in tag:
        return None
    i, _, n = tag[1:].partition("of")
    return Shard(int(i), int(n)) if i.isdigit() and n.isdigit() and int(i) < int(n) else None


# ---------------------------------------------------------------- parts


def part_files(mode: str, tag: str) -> dict[str, str]:
    """The file names of one part: blocks, progress, target check, outputs (harness/campaign/outputs.py)."""
    sfx = f"-{tag}" if tag else ""
    return {
        "blocks": f"blocks_{mode}{sfx}.jsonl",
        "progress": progress_name(tag),
        "check": f"target_check{sfx}.jsonl",
        "outputs": f"outputs{sfx}.jsonl",
    }


def find_parts(d: Path) -> list[str]:
    """The parts a run directory holds, by their progress files ("" first, then shard tags in order)."""
    tags = []
    for p in sorted(Path(d).glob("progress*.jsonl")):
        tag = p.name[len("progress") : -len(".jsonl")]
        if tag == "":
            tags.append("")
        elif tag.startswith("-") and parse_tag(tag[1:]) is not None:
            tags.append(tag[1:])
    return sorted(tags, key=lambda t: (t != "", parse_tag(t).count if t else 0, parse_tag(t).index if t else 0))


def read_progress(path: Path) -> list[tuple[dict, bytes]]:
    """The finished prompts of a progress file: (record, raw line) up to its first unreadable line (a kill can
    leave a truncated last line; a prompt counts as finished only once its line is whole)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            rec = json.loads(line)
            (rec["workload"], rec["prompt_id"], rec["end"])
        except (ValueError, KeyError, TypeError):
            break
        out.append((rec, line))
    return out


def done_keys(d: Path) -> set[tuple[str, str]]:
    """(workload, prompt_id) of every finished prompt in any part of a run directory."""
    return {(r["workload"], r["prompt_id"]) for t in find_parts(d) for r, _ in read_progress(d / progress_name(t))}


def progress_name(tag: str) -> str:
    return f"progress-{tag}.jsonl" if tag else "progress.jsonl"


# ---------------------------------------------------------------- files, never through a symlink


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open that never follows a symlink at `path`; a link (or any failure) is one CampaignError line."""
    try:
        return os.open(path, flags | NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CampaignError(f"{path}: is a symlink; refusing to write through it") from None
        raise CampaignError(f"{path}: cannot write: {e.strerror}") from None


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file whole or not at all: a fresh temporary (a stale one, or a planted link, is unlinked
    first), fsync'd, then renamed over `path` (which replaces a link at `path`, never what it points to)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """A JSON object file, None when absent; unreadable or not an object is a CampaignError."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text())
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise CampaignError(f"{path} is unreadable ({e})") from None
    return obj


# ---------------------------------------------------------------- locks


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def holder(path: Path) -> dict | None:
    """The holder record (pid, host, started) in a lock file, or None when it holds none."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        with os.fdopen(fd) as fh:
            rec = json.loads(fh.read())
        return {"pid": int(rec["pid"]), "host": str(rec["host"]), "started": rec.get("started")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def describe(h: dict | None) -> str:
    if h is None:
        return "unreadable holder"
    return f"pid {h['pid']} on {h['host']}" + (f", started {h['started']}" if h.get("started") else "")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except OSError:
        return False


def _flock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def held(path: Path) -> bool:
    """Whether some process holds the lock file now (probed without taking it for long)."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | CLOEXEC)
    except OSError:
        return False
    try:
        return not _flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)  # closing drops a lock the probe may have taken


def holders(d: Path) -> list[str]:
    """Who writes a run directory now: the campaign lock's exclusive holder, else every shard lock's."""
    if held(d / LOCK) and holder(d / LOCK) is not None:
        return [describe(holder(d / LOCK))]
    return [
        f"shard {p.stem[len('shard-') :]}: {describe(holder(p))}" for p in sorted(d.glob("shard-*.lock")) if held(p)
    ]


class Lock:
    """One flock on a lock file: exclusive (the holder's pid, host and start time written inside) or shared.
    Released by close(): the file is removed while still held (a shared holder removes it only if it is
    the last one), so that a waiter which opened the old file notices and opens the new one."""

    def __init__(self, path: Path, shared: bool = False):
        self.path, self.shared, self.fd = Path(path), shared, None

    def take(self) -> bool:
        """Take it without waiting; False when another process holds it."""
        how = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        for _ in range(20):
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT | CLOEXEC)
            if not _flock(fd, how):
                os.close(fd)
                return False
            if _same_file(fd, self.path):
                self.fd = fd
                self._claim()
                return True
            os.close(fd)  # its holder released (unlinked) it between our open and flock: try again
        raise CampaignError(f"{self.path}: could not take the lock (it keeps changing); is another sweep starting?")

    def _claim(self) -> None:
        old = holder(self.path)
        if old is not None and (old["pid"], old["host"]) != (os.getpid(), socket.gethostname()):
            print(
                f"note: {self.path}: taking over a stale lock of {describe(old)} (no longer running)", file=sys.stderr
            )
        if self.shared:  # several holders: none writes its name here (each shard names itself in its own lock)
            if old is not None:
                os.ftruncate(self.fd, 0)
            return
        os.ftruncate(self.fd, 0)
        rec = {"pid": os.getpid(), "host": socket.gethostname(), "started": now_utc()}
        os.pwrite(self.fd, (json.dumps(rec) + "\n").encode(), 0)
        os.fsync(self.fd)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            last = not self.shared or _flock(fd, fcntl.LOCK_EX)  # a shared holder: the last one removes it
            if last and _same_file(fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)


@contextmanager
def manifest_lock(d: Path, timeout_s: float = 60.0):
    """Serialise read-merge-replace updates of a campaign's manifest among its writers."""
    lock, t0 = Lock(Path(d) / MANIFEST_LOCK), time.monotonic()
    while not lock.take():
        if time.monotonic() - t0 > timeout_s:
            raise CampaignError(f"{lock.path}: held for over {timeout_s:.0f} s by {describe(holder(lock.path))}")
        time.sleep(0.01)
    try:
        yield
    finally:
        lock.close()


# ---------------------------------------------------------------- what makes runs one campaign


def identity(field: str, value):
    """A campaign field as compared between runs: models by the sha256 of their weights, not by path (a run
    copied to another path or host, models included, is the same campaign); the rest as recorded."""
    if field == "target" and isinstance(value, dict) and value.get("sha256"):
        return {"sha256": value["sha256"]}
    if field == "drafters" and isinstance(value, dict):
        out = {}
        for name, d in value.items():
            if not isinstance(d, dict):
                out[name] = d
                continue
            settings = dict(d.get("settings") or {})
            if d.get("sha256"):
                settings.pop("path", None)
            out[name] = {"kind": d.get("kind"), "settings": settings, "sha256": d.get("sha256")}
        return out
    return value


def campaign_difference(old: dict, new: dict) -> str | None:
    """The first campaign field on which two manifests differ, or None."""
    for f in CAMPAIGN_FIELDS:
        if identity(f, old.get(f)) != identity(f, new.get(f)):
            return f
    return None


def moved_models(old: dict, new: dict) -> list[str]:
    """Models found at another path than recorded (same weights): one note each."""
    notes = []
    ot, nt = old.get("target") or {}, new.get("target") or {}
    if ot.get("path") != nt.get("path"):
        notes.append(
            f"the target (sha256 {str(nt.get('sha256'))[:12]}) is at {nt.get('path')} (recorded {ot.get('path')})"
        )
    for name, d in (new.get("drafters") or {}).items():
        was = ((old.get("drafters") or {}).get(name) or {}).get("settings", {}).get("path")
        now = (d.get("settings") or {}).get("path")
        if was != now:
            notes.append(f"drafter {name} (sha256 {str(d.get('sha256'))[:12]}) is at {now} (recorded {was})")
    return notes


def merge_throughput(old: dict | None, new: dict | None) -> dict:
    """The manifest's throughput: every worker of every session, named by host and pid (a writer rewrites its
    own workers' entries; another writer's stay)."""
    workers = dict((old or {}).get("workers") or {})
    workers.update((new or {}).get("workers") or {})
    return {"workers": dict(sorted(workers.items()))}


def check_summary(seen: list[dict], dtype, exact: bool) -> dict:
    """The manifest's `target_check` from the target check lines of finished prompts (sweep and merge alike)."""
    bad = [r for r in seen if r["disagreements"]]
    return {
        "prompts_checked": len(seen),
        "tokens": sum(r["tokens"] for r in seen),
        "disagreements": sum(r["disagreements"] for r in seen),
        "prompts": len(bad),
        "first": [f"{r['workload']}/{r['prompt_id']}@{r['first']}" for r in bad[:5]],
        "dtype": dtype,
        "exact_verify": bool(exact),
    }
