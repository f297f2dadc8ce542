"""A run directory: crash-safe appends, resume, and the manifest (docs/manifest.md).

    runs/<run>/manifest.json        written at the start, rewritten (atomically) with timing
    runs/<run>/blocks_<mode>.jsonl  the block records, one prompt's records per append
    runs/<run>/progress.jsonl       one line per finished prompt: its byte offset in the
                                    blocks file and its output tokens
    runs/<run>/settings.json        the record-changing settings the manifest lacks (max_new_tokens,
                                    dtype, generator, prompt sources, ...), compared on `--resume`
    runs/<run>/live.jsonl           the live phase: one line per configuration and sampled prompt
                                    (harness/livephase.py)
    runs/<run>/run.lock             held (flock) by the sweep writing the run; pid and host inside

A prompt counts as finished only once its progress line is on disk, and that line is
written after the prompt's records are flushed and fsync'd. `--resume` therefore cuts the
blocks file back to the last finished prompt's offset (this repairs a truncated last line
and drops a half-written prompt), skips finished prompts, and hands their outputs back to
the drafters so that state carried across prompts (the suffix drafter's corpus) is what an
uninterrupted run would have had. Each progress line also carries a hash of the prompt's
tokens, so that a resume with other prompts under the same ids is refused.

A run directory is one sweep's alone (the lock; a second sweep is refused, a lock left by a
dead process is taken over) and is written only through its own files: a run directory or a
file of it that is a symlink is refused, and files are opened with O_NOFOLLOW.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from .lm import HarnessError

REPO = Path(__file__).resolve().parents[1]
CAMPAIGN_FIELDS = ("mode", "target", "drafters", "k", "temperature", "seed", "workloads")


def code_version() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if rev:
            return rev
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version
        return "specbandit-" + version("specbandit")
    except Exception:  # noqa: BLE001 - not installed: say so rather than fail a run
        return "unknown"


def hardware(device: str) -> dict:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"device": device, "torch": torch.__version__.split("+")[0], "cpu": cpu, "gpu": gpu}


LOCK = "run.lock"
SETTINGS = "settings.json"  # the record-changing settings not in the manifest (compared on --resume)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# files the harness writes in a run directory; none of them may be a symlink (nor blocks_*)
_OWN_FILES = ("manifest.json", "manifest.json.tmp", "progress.jsonl", "progress.jsonl.tmp", LOCK, SETTINGS,
              SETTINGS + ".tmp", "live_calibration.json", "live_calibration.json.tmp")


def _refuse_link(path: Path, e: OSError):
    if e.errno == errno.ELOOP:
        raise HarnessError(f"{path}: is a symlink; refusing to write through it") from None
    raise HarnessError(f"{path}: cannot write: {e.strerror}") from None


def _open_nofollow(path: Path, flags: int) -> int:
    """os.open that never follows a symlink at `path`; a link (or any failure) is one HarnessError line."""
    try:
        return os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError as e:
        _refuse_link(path, e)


class _Writing:
    """An OSError while writing the run directory becomes one HarnessError line; a full disk says how to
    go on (what was flushed before stays, and --resume cuts a half-written prompt)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if not isinstance(e, OSError) or isinstance(e, HarnessError):
            return False
        run = self.path.parent
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise HarnessError(f"{self.path}: disk full ({e.strerror}); finished prompts are kept: free space, "
                               f"then continue with  python sweep.py --resume --out {run}  (same options)") from None
        if e.errno == errno.ELOOP:
            return False
        raise HarnessError(f"{self.path}: cannot write ({e.strerror or e}); finished prompts are kept; "
                           f"continue with --resume --out {run} once it is writable") from None


def _write_bytes(path: Path, data: bytes) -> None:
    with os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as fh:
        fh.write(data)


def _open_append(path: Path):
    return os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.unlink()  # a stale temporary (or a planted link): unlink removes the link, not its target
    except FileNotFoundError:
        pass
    fd = _open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # replaces a link at `path` itself, never what it points to


def preflight(out: str | Path, resume: bool) -> None:
    """Checks on the run directory that need no model: run before any work."""
    d = Path(out)
    if os.path.islink(str(out).rstrip("/") or "/"):
        raise HarnessError(f"{d}: the run directory is a symlink; refusing to write through it "
                           "(give the real directory as --out)")
    if d.exists() and not d.is_dir():
        raise HarnessError(f"{d}: exists and is not a directory")
    if d.is_dir():
        check_symlinks(d)
    if resume and not d.exists():
        raise HarnessError(f"--resume {d}: no such run directory (drop --resume to start a new run there)")
    if not resume and (d / "manifest.json").exists():
        raise HarnessError(f"{d}: already holds a run; add --resume to continue it, or choose another --out")
    if d.is_dir():
        _probe_lock(d)


def _probe_lock(d: Path) -> None:
    """Refuse early (before any model loads) when another sweep holds the run directory's lock."""
    path = d / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return  # none (or a link: refused by check_symlinks); RunDir takes the lock for real
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise HarnessError(f"{d}: in use by another sweep ({_describe(path)}, lock {path}); "
                           "wait for it to finish or choose another --out") from None
    finally:
        os.close(fd)  # closing drops a lock we may just have taken


def check_symlinks(d: Path, *names: str) -> None:
    try:
        entries = list(os.scandir(d))
    except OSError as e:
        raise HarnessError(f"{d}: cannot read the run directory: {e.strerror}") from None
    for e in entries:
        if (e.name in _OWN_FILES or e.name in names or e.name.startswith("blocks_")) and e.is_symlink():
            raise HarnessError(f"{d / e.name}: is a symlink; refusing to write through it "
                               "(a run directory's files must be its own)")


def _lock_holder(path: Path):
    """(pid, host) of a lock file, or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd) as fh:
            rec = json.loads(fh.read())
        return int(rec["pid"]), str(rec["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _describe(path: Path) -> str:
    h = _lock_holder(path)
    return f"pid {h[0]} on {h[1]}" if h else "unreadable holder"


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
        done = set()
        try:
            for line in (d / "progress.jsonl").read_bytes().split(b"\n"):
                try:
                    rec = json.loads(line)
                    done.add((rec["workload"], rec["prompt_id"]))
                except (ValueError, KeyError, TypeError):
                    break
        except OSError:
            pass
        if not keys <= done or m.get("complete") is not True:  # prompts missing, or the live phase unfinished
            found.append((created, d.stat().st_mtime, d))
    if not found:
        why = (f"{root} does not exist" if not root.is_dir() else
               f"no run under {root}" if not seen else f"all {seen} run(s) under {root} are complete")
        raise HarnessError(f"--resume without --out: nothing to continue ({why}); give --out RUN_DIR")
    return max(found)[2]


class RunDir:
    """One sweep's run directory. Construct, then use as a context manager (or call close()):
    the directory is locked (run.lock) from construction until close()."""

    def __init__(self, out: str | Path, manifest: dict, resume: bool, settings: dict | None = None,
                 prompt_sha: dict | None = None):
        self.dir = Path(out)
        self.manifest = manifest
        self.settings = settings
        self.prompt_sha = prompt_sha or {}  # (workload, prompt_id) -> hash of its token ids
        self.blocks = self.dir / f"blocks_{manifest['mode']}.jsonl"
        self.progress = self.dir / "progress.jsonl"
        self.done: dict[tuple[str, str], list[int]] = {}  # finished prompt -> its output
        self._lock: Path | None = None
        self._lock_fd: int | None = None
        preflight(self.dir, resume)
        created = not self.dir.exists()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HarnessError(f"{self.dir}: cannot create the run directory: {e.strerror}") from None
        check_symlinks(self.dir, self.blocks.name)
        self._take_lock()
        try:
            self._open(resume)
        except BaseException:
            self.close()
            if created:
                try:
                    self.dir.rmdir()
                except OSError:
                    pass
            raise

    # ---- the lock ----
    def _take_lock(self) -> None:
        """An exclusive flock on run.lock (pid and host inside, for the messages). The kernel drops the
        lock when its process dies, so a lock file left by a killed sweep is stale and is taken over."""
        path = self.dir / LOCK
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as e:
                _refuse_link(path, e)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise HarnessError(f"{self.dir}: in use by another sweep ({_describe(path)}, lock {path}); "
                                   "wait for it to finish or choose another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except OSError:
                same = False
            if not same:  # the holder released (unlinked) it between our open and flock: try again
                os.close(fd)
                continue
            old = _lock_holder(path)
            if old is not None and old != (os.getpid(), socket.gethostname()):
                print(f"note: {path}: taking over a stale lock of pid {old[0]} on {old[1]} (no longer running)",
                      file=sys.stderr)
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n").encode(), 0)
            os.fsync(fd)
            self._lock, self._lock_fd = path, fd
            return
        raise HarnessError(f"{path}: could not take the lock (it keeps changing); is another sweep starting?")

    def close(self) -> None:
        """Release the lock: remove the file while still holding it, then drop it."""
        fd, path = getattr(self, "_lock_fd", None), getattr(self, "_lock", None)
        self._lock, self._lock_fd = None, None
        if fd is None:
            return
        try:
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):  # a RunDir dropped without close() (e.g. by a caller of the old API)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # ---- opening: new run or resume ----
    def _open(self, resume: bool) -> None:
        mpath = self.dir / "manifest.json"
        spath = self.dir / SETTINGS
        has_records = any(p.exists() and p.stat().st_size > 0 for p in (self.progress, self.blocks))
        if mpath.exists():
            if not resume:
                raise HarnessError(f"{self.dir}: already holds a run; add --resume to continue it, "
                                   "or choose another --out")
            try:
                old = json.loads(mpath.read_text())
                if not isinstance(old, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                raise HarnessError(f"--resume {self.dir}: {mpath} is unreadable ({e}); the finished work cannot "
                                   "be checked against this command; repair it or start a new run") from None
            for f in CAMPAIGN_FIELDS:
                if old.get(f) != self.manifest.get(f):
                    raise HarnessError(f"--resume {self.dir}: setting {f!r} differs: recorded {old.get(f)!r}, "
                                       f"this command {self.manifest.get(f)!r}")
            self._check_settings(spath)
            self.manifest = {**self.manifest, "created": old.get("created", self.manifest["created"])}
            self._recover()
            if self.settings is not None:
                _atomic_write(spath, json.dumps(self.settings, indent=2) + "\n")
            return
        if has_records:
            why = "missing" if not mpath.exists() else "unreadable"
            raise HarnessError(f"{self.dir}: holds records ({self.progress.name}/{self.blocks.name}) but its "
                               f"manifest.json is {why}; refusing to {'resume' if resume else 'overwrite'} it "
                               "(restore manifest.json, or choose another --out)")
        if resume:
            print(f"note: --resume {self.dir}: holds no run yet; starting it", file=sys.stderr)
        for p in (self.blocks, self.progress):
            _write_bytes(p, b"")
        if self.settings is not None:
            _atomic_write(spath, json.dumps(self.settings, indent=2) + "\n")
        self.write_manifest()

    def _check_settings(self, spath: Path) -> None:
        if self.settings is None:
            return
        if not spath.exists():
            print(f"note: --resume {self.dir}: no {SETTINGS} (a run from before settings were recorded); "
                  "only the manifest's fields were checked", file=sys.stderr)
            return
        try:
            old = json.loads(spath.read_text())
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            raise HarnessError(f"--resume {self.dir}: {spath} is unreadable ({e}); repair it or start a new run") \
                from None
        for f, new in self.settings.items():
            if f in old and old[f] != new:
                raise HarnessError(f"--resume {self.dir}: setting {f!r} differs: recorded {old[f]!r}, "
                                   f"this command {new!r}")
        for f in old:
            if f not in self.settings:
                raise HarnessError(f"--resume {self.dir}: setting {f!r} differs: recorded {old[f]!r}, "
                                   "this command has none")

    def _recover(self) -> None:
        end = 0
        good = b""
        if self.progress.exists():
            raw = self.progress.read_bytes()
            for line in raw.split(b"\n"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # a truncated last progress line: that prompt is not finished
                key = (rec["workload"], rec["prompt_id"])
                sha = rec.get("sha")
                if sha is not None and key in self.prompt_sha and self.prompt_sha[key] != sha:
                    raise HarnessError(f"--resume {self.dir}: prompt {key[0]}/{key[1]} differs from the one "
                                       "recorded (its tokens changed: another workload file or tokenizer?)")
                self.done[key] = rec["output"]
                end = rec["end"]
                good += line + b"\n"
            _atomic_write(self.progress, good.decode())
        size = self.blocks.stat().st_size if self.blocks.exists() else 0
        if size < end:
            raise HarnessError(f"{self.blocks}: shorter ({size} bytes) than {self.progress} records ({end}); "
                               "the run directory was edited; start a new run")
        if size > end:
            fd = os.open(self.blocks, os.O_RDWR | _NOFOLLOW)
            try:
                os.ftruncate(fd, end)
                os.fsync(fd)
            finally:
                os.close(fd)
            print(f"resume: cut {size - end} bytes of unfinished records from {self.blocks}")
        if not self.blocks.exists():
            _write_bytes(self.blocks, b"")

    def write_manifest(self) -> None:
        with _Writing(self.dir / "manifest.json"):
            _atomic_write(self.dir / "manifest.json", json.dumps(self.manifest, indent=2) + "\n")

    def write_text(self, name: str, text: str) -> None:
        """Another file of the run directory (never through a symlink)."""
        with _Writing(self.dir / name):
            _atomic_write(self.dir / name, text)

    def append_text(self, name: str, text: str) -> None:
        """Append to another file of the run directory, durably (never through a symlink)."""
        with _Writing(self.dir / name), _open_append(self.dir / name) as fh:
            fh.write(text.encode())
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, workload: str, prompt_id: str, records: list[dict], output: list[int]) -> None:
        with _Writing(self.blocks):
            self._append(workload, prompt_id, records, output)

    def _append(self, workload: str, prompt_id: str, records: list[dict], output: list[int]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with _open_append(self.blocks) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            end = fh.tell()
        rec = {"workload": workload, "prompt_id": prompt_id, "end": end, "n": len(records), "output": output}
        sha = self.prompt_sha.get((workload, prompt_id))
        if sha is not None:
            rec["sha"] = sha
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with _open_append(self.progress) as fh:
            fh.write(line.encode())
            fh.flush()
            os.fsync(fh.fileno())
        self.done[(workload, prompt_id)] = output


def make_manifest(run: str, mode: str, target: dict, drafters: dict, k: int, temperature: float, seed: int,
                  workloads: list[str], device: str) -> dict:
    """The manifest of docs/manifest.md, field for field (timing is added after the live phase)."""
    return {
        "v": 1,
        "label": "MEASURED",
        "run": run,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": mode,
        "target": target,
        "drafters": drafters,
        "k": k,
        "temperature": temperature,
        "seed": seed,
        "workloads": workloads,
        "hardware": hardware(device),
        "code_version": code_version(),
    }
