"""A run directory: crash-safe appends, resume, the manifest (docs/manifest.md), and the parts that shards of
one campaign write side by side (harness/campaign/shards.py).

    runs/<run>/manifest.json        written at the start, updated (atomically, under manifest.lock) with
                                    timing, throughput and completion
    runs/<run>/blocks_<mode>.jsonl  the block records, one prompt's records per append
    runs/<run>/progress.jsonl       one line per finished prompt: its byte offset in the
                                    blocks file and its output tokens
    runs/<run>/outputs.jsonl        one line per finished prompt: its prompt and output token ids and the
                                    output's text (harness/campaign/outputs.py), written before its progress line
    runs/<run>/settings.json        the record-changing settings the manifest lacks (max_new_tokens,
                                    dtype, generator, prompt sources, ...), compared on `--resume`
    runs/<run>/live.jsonl           the live phase: one line per configuration and sampled prompt
                                    (harness/decode/livephase.py)
    runs/<run>/run.lock             held (flock) by the sweep writing the run; pid, host and start time inside
    runs/<run>/*-s<I>of<N>.*        shard I of N's part: blocks_<mode>-sIofN.jsonl, progress-sIofN.jsonl,
                                    target_check-sIofN.jsonl, outputs-sIofN.jsonl, and shard-sIofN.lock while
                                    it runs

A prompt counts as finished only once its progress line is on disk, and that line is
written after the prompt's records are flushed and fsync'd. `--resume` therefore cuts the
blocks file back to the last finished prompt's offset (this repairs a truncated last line
and drops a half-written prompt), cuts outputs.jsonl back to the finished prompts' lines,
skips finished prompts, and hands their outputs back to the drafters so that state carried
across prompts (the suffix drafter's corpus=run) is what an uninterrupted run would have had.
Each progress line also carries a hash of the prompt's tokens, so that a resume with other
prompts under the same ids is refused.

Writers: one process writing the whole campaign (a plain sweep, or a Ray driver writing every shard's part)
holds run.lock exclusively; a `--shard I/N` sweep shares run.lock with the other shards and holds its own
shard lock, so shards run side by side and a whole-campaign writer waits for none of them (it is refused).
A second writer is refused with a message naming the holder; a lock left by a dead process is taken over,
with a note. A run directory or a file of it that is a symlink is refused, and files are opened with
O_NOFOLLOW. The campaign's models are compared by the sha256 of their weights, not their paths, so a run
copied elsewhere (models too) resumes there.

The manifest's and settings.json's contents, and their checks on a resume: harness/campaign/manifest.py; the checks before
any model loads, the harness's own files and the locks' holders: harness/campaign/preflight.py.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

from . import outputs, shards
from ..models.lm import HarnessError
from .manifest import (
    SETTINGS,
    SHARD_KEYS,
    campaign_shards,
    check_campaign,
    check_settings,
    read_recorded,
    run_json,
    throughput,
)
from .preflight import as_harness, busy_message, check_symlinks, preflight, wait_for
from .shards import Shard

LOCK = shards.LOCK
_NOFOLLOW = shards.NOFOLLOW


def _open_nofollow(path: Path, flags: int) -> int:
    """os.open that never follows a symlink at `path`; a link (or any failure) is one HarnessError line."""
    with as_harness():
        return shards.open_nofollow(path, flags)


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
            raise HarnessError(
                f"{self.path}: disk full ({e.strerror}); finished prompts are kept: free space, "
                f"then continue with  python sweep.py --resume --out {run}  (same options)"
            ) from None
        if e.errno == errno.ELOOP:
            return False
        raise HarnessError(
            f"{self.path}: cannot write ({e.strerror or e}); finished prompts are kept; "
            f"continue with --resume --out {run} once it is writable"
        ) from None


def _write_bytes(path: Path, data: bytes) -> None:
    with os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as fh:
        fh.write(data)


def _open_append(path: Path):
    return os.fdopen(_open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def _atomic_write(path: Path, text: str) -> None:
    with as_harness():
        shards.atomic_write(path, text)


class Part:
    """The files of one writer's part of a run directory (harness/campaign/shards.py)."""

    def __init__(self, d: Path, mode: str, tag: str):
        self.tag = tag
        names = shards.part_files(mode, tag)
        self.blocks, self.progress, self.check = d / names["blocks"], d / names["progress"], d / names["check"]
        self.outputs = d / names["outputs"]

    def has_records(self) -> bool:
        return any(p.exists() and p.stat().st_size > 0 for p in (self.progress, self.blocks))


class RunDir:
    """One sweep's run directory. Construct, then use as a context manager (or call close()): the
    directory is locked (run.lock, and a shard's own lock) from construction until close().

    `shard`: this process writes that shard's part only, beside the other shards' writers. `n_shards`: this
    process writes the whole campaign as that many shard parts (a Ray driver; a count the campaign already
    records wins, see `self.shards`). Neither: the one-process part ("" : blocks_<mode>.jsonl, ...). `lines`:
    (workload, prompt_id, output) -> the prompt's outputs.jsonl line (harness/campaign/outputs.py's Lines; None: no
    outputs are written)."""

    def __init__(
        self,
        out: str | Path,
        manifest: dict,
        resume: bool,
        settings: dict | None = None,
        prompt_sha: dict | None = None,
        shard: Shard | None = None,
        n_shards: int | None = None,
        lines=None,
    ):
        self.dir = Path(out)
        self.lines = lines
        self.manifest = manifest
        self.settings = settings
        self.prompt_sha = prompt_sha or {}  # (workload, prompt_id) -> hash of its token ids
        self.shard, self.shards = shard, shard.count if shard else n_shards
        self.exclusive = shard is None  # writes the whole campaign: holds run.lock exclusively
        self.mode = manifest["mode"]
        self.parts: dict[str, Part] = {}
        self.part = self._part(shard.tag if shard else "") if not n_shards else None
        self.blocks = self.part.blocks if self.part else None
        self.progress = self.part.progress if self.part else None
        self.done: dict[tuple[str, str], list[int]] = {}  # finished prompt (in any part) -> its output
        self.where: dict[tuple[str, str], str] = {}  # finished prompt -> the part holding it
        self.workers: dict[str, dict] = {}  # this session's workers: throughput (docs/manifest.md)
        self._locks: list = []
        self._verb = f"--shard {shard} into {self.dir}" if shard else f"--resume {self.dir}"
        run_json(manifest, "manifest.json"), run_json(settings, SETTINGS)  # checked before anything is written
        preflight(self.dir, resume, shard)
        created = not self.dir.exists()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HarnessError(f"{self.dir}: cannot create the run directory: {e.strerror}") from None
        check_symlinks(self.dir, *(f.name for f in (self.blocks, self.progress, self.part and self.part.outputs) if f))
        try:
            self._take_locks()
            self._open(resume)
        except BaseException:
            self.close()
            if created:
                try:
                    self.dir.rmdir()
                except OSError:
                    pass
            raise

    def _part(self, tag: str) -> Part:
        if tag not in self.parts:
            self.parts[tag] = Part(self.dir, self.mode, tag)
        return self.parts[tag]

    # ---- the locks ----
    def _take_locks(self) -> None:
        """run.lock (shared by shards, else exclusive), then a shard's own lock. The kernel drops a lock when
        its process dies, so a lock file left by a killed sweep is stale and is taken over."""
        wanted = [shards.Lock(self.dir / LOCK, shared=not self.exclusive)]
        if self.shard:
            wanted.append(shards.Lock(self.dir / f"shard-{self.shard.tag}.lock"))
        for lock in wanted:
            who = wait_for(self.dir, lock.path, lock.take)
            if who:
                raise HarnessError(busy_message(self.dir, lock.path, who))
            self._locks.append(lock)

    def close(self) -> None:
        """Release the locks (each file is removed while still held)."""
        for lock in reversed(getattr(self, "_locks", [])):
            lock.close()
        self._locks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):  # a RunDir dropped without close() (e.g. by a caller of the old API)
        try:
            self.close()
        except Exception:
            pass

    # ---- opening: new run, resume, or a shard joining its campaign ----
    def _open(self, resume: bool) -> None:
        with as_harness(), shards.manifest_lock(self.dir):
            old = read_recorded(self.dir)
            if old is not None:
                self._continue(old, resume)
                return
            self._start(resume)

    def _continue(self, old: dict, resume: bool) -> None:
        joining = self.shard is not None and not self.part.has_records()
        if not resume and not joining:
            raise HarnessError(f"{self.dir}: already holds a run; add --resume to continue it, or choose another --out")
        check_campaign(self.dir, self._verb, old, self.manifest)
        check_settings(self.dir, self.settings, self._verb)
        self.shards = campaign_shards(self.dir, self.shard, self.shards, old.get("shards"))
        carried = {k: old[k] for k in ("shards", "parts", "throughput") if k in old}
        self.manifest = {**self.manifest, "created": old.get("created", self.manifest["created"]), **carried}
        if self.shards:
            self.manifest["shards"] = self.shards
        self._recover_all()
        if self.settings is not None:
            _atomic_write(self.dir / SETTINGS, run_json(self.settings, SETTINGS))
        if self.exclusive:  # the whole campaign's writer: the manifest afresh (complete, timing: once redone)
            self._write_manifest(fresh=True)
        else:  # one shard among others: the campaign's manifest stays, only no longer complete
            self._write_manifest(drop=("complete", "outputs"))

    def _start(self, resume: bool) -> None:
        found = [self._part(t) for t in shards.find_parts(self.dir)] + ([self.part] if self.part else [])
        with_records = next((p for p in found if p.has_records()), None)
        if with_records is not None:
            raise HarnessError(
                f"{self.dir}: holds records ({with_records.progress.name}/{with_records.blocks.name}) but its "
                f"manifest.json is missing; refusing to {'resume' if resume else 'overwrite'} it "
                "(restore manifest.json, or choose another --out)"
            )
        if resume:
            print(f"note: --resume {self.dir}: holds no run yet; starting it", file=sys.stderr)
        if self.part is not None:
            for p in (self.part.blocks, self.part.progress, self.part.outputs):
                _write_bytes(p, b"")
        if self.shards:
            self.manifest["shards"] = self.shards
        if self.settings is not None:
            _atomic_write(self.dir / SETTINGS, run_json(self.settings, SETTINGS))
        self._write_manifest(fresh=True)

    # ---- recovery: what is finished, in every part ----
    def _recover_all(self) -> None:
        tags = shards.find_parts(self.dir) + [p.tag for p in ([self.part] if self.part else [])]
        for tag in dict.fromkeys(tags):
            part = self._part(tag)
            self._recover(part, cut=self.exclusive or part is self.part)

    def refresh(self) -> None:
        """Read the other shards' finished prompts again (they may have finished more since we started)."""
        for tag in shards.find_parts(self.dir):
            if self._part(tag) is not self.part:
                self._recover(self._part(tag), cut=False)

    def _recover(self, part: Part, cut: bool) -> None:
        """Read a part's finished prompts; `cut` (a part this process writes): also cut its blocks file back to
        the last finished prompt, rewrite its progress file to exactly those lines, and cut its outputs file to
        theirs (harness/campaign/outputs.py `cut_back`)."""
        end, good, finished = 0, b"", []
        for rec, line in shards.read_progress(part.progress):
            key = (rec["workload"], rec["prompt_id"])
            sha = rec.get("sha")
            if sha is not None and key in self.prompt_sha and self.prompt_sha[key] != sha:
                raise HarnessError(
                    f"--resume {self.dir}: prompt {key[0]}/{key[1]} differs from the one "
                    "recorded (its tokens changed: another workload file or tokenizer?)"
                )
            if self.where.get(key, part.tag) != part.tag:
                raise HarnessError(
                    f"{self.dir}: prompt {key[0]}/{key[1]} is finished in two parts "
                    f"({shards.progress_name(self.where[key])} and {part.progress.name}); keep one"
                )
            self.done[key], self.where[key] = rec["output"], part.tag
            end = rec["end"]
            good += line + b"\n"
            finished.append(rec)
        if not cut:
            return
        if part.progress.exists():
            _atomic_write(part.progress, good.decode())
        size = part.blocks.stat().st_size if part.blocks.exists() else 0
        if size < end:
            raise HarnessError(
                f"{part.blocks}: shorter ({size} bytes) than {part.progress} records ({end}); "
                "the run directory was edited; start a new run"
            )
        if size > end:
            fd = os.open(part.blocks, os.O_RDWR | _NOFOLLOW)
            try:
                os.ftruncate(fd, end)
                os.fsync(fd)
            finally:
                os.close(fd)
            print(f"resume: cut {size - end} bytes of unfinished records from {part.blocks}")
        note = outputs.cut_back(part.outputs, finished, self.lines)  # its lines: the finished prompts', one each
        if note:
            print(note)

    # ---- the manifest ----
    def _write_manifest(self, fresh: bool = False, drop: tuple = ()) -> None:
        """Replace manifest.json: `fresh`, this writer's manifest alone; else merged into the file's current
        content (another shard may have written since), each writer contributing its own fields. The caller
        holds manifest.lock."""
        mpath = self.dir / "manifest.json"
        cur = {} if fresh else (shards.read_json(mpath) or {})
        if fresh or self.exclusive:
            new = {**cur, **self.manifest}
        else:
            new = {**cur, **{k: self.manifest[k] for k in SHARD_KEYS if k in self.manifest}}
        for k in drop:
            new.pop(k, None)
        new["throughput"] = shards.merge_throughput(
            cur.get("throughput") or self.manifest.get("throughput"), throughput(self.workers)
        )
        parts = self._parts_info()
        if parts:
            merged = {**(cur.get("parts") or self.manifest.get("parts") or {}), **parts}
            new["parts"] = dict(sorted(merged.items(), key=lambda kv: shards.parse_tag(kv[0]).index))
        with _Writing(mpath):
            _atomic_write(mpath, run_json(new, "manifest.json"))
        self.manifest.update({k: new[k] for k in ("throughput", "parts") if k in new})

    def _parts_info(self) -> dict:
        """Per shard part this process writes: how many prompts it has finished."""
        if not self.shards:
            return {}
        tags = [self.shard.tag] if self.shard else [t for t in self.parts if t]
        return {t: {"done": sum(1 for w in self.where.values() if w == t)} for t in tags}

    def write_manifest(self) -> None:
        with _Writing(self.dir / "manifest.json"), as_harness(), shards.manifest_lock(self.dir):
            self._write_manifest()

    def update_manifest(self, fn):
        """`fn(self.manifest)` on what every part has finished by now (read again), then the manifest written,
        both under manifest.lock: of two shards finishing together, the later one sees the other's prompts.
        Returns what `fn` returns."""
        with _Writing(self.dir / "manifest.json"), as_harness(), shards.manifest_lock(self.dir):
            self.refresh()
            out = fn(self.manifest)
            self._write_manifest()
        return out

    def count(self, worker: str, meta: dict, records: int, seconds: float) -> None:
        """One finished prompt of a worker, for the manifest's throughput."""
        w = self.workers.setdefault(worker, {**meta, "prompts": 0, "records": 0, "seconds": 0.0})
        w["prompts"] += 1
        w["records"] += records
        w["seconds"] += seconds

    # ---- appends ----
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

    def append_check(self, workload: str, prompt_id: str, check: dict, tag: str | None = None) -> None:
        """A prompt's target check line, in its part's check file."""
        part = self.part if tag is None else self._part(tag)
        self.append_text(part.check.name, json.dumps({"workload": workload, "prompt_id": prompt_id, **check}) + "\n")

    def check_lines(self) -> list[dict]:
        """Every part's target check lines of finished prompts (a prompt re-run after a kill: the last line)."""
        seen = {}
        for tag in dict.fromkeys(list(self.parts) + shards.find_parts(self.dir)):
            path = self._part(tag).check
            for raw in path.read_text().splitlines() if path.exists() else []:
                try:
                    rec = json.loads(raw)
                except ValueError:
                    break  # a truncated last line (a killed sweep): that prompt is re-run, and checked again
                if (rec["workload"], rec["prompt_id"]) in self.done:
                    seen[(rec["workload"], rec["prompt_id"])] = rec
        return list(seen.values())

    def append(self, workload: str, prompt_id: str, records: list[dict], output: list[int], tag=None) -> None:
        with _Writing(self.blocks if tag is None else self._part(tag).blocks):
            if tag is None:
                self._append(workload, prompt_id, records, output)
            else:
                self._append(workload, prompt_id, records, output, tag)

    def _append(self, workload: str, prompt_id: str, records: list[dict], output: list[int], tag=None) -> None:
        part = self.part if tag is None else self._part(tag)
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with _open_append(part.blocks) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            end = fh.tell()
        text = self.lines(workload, prompt_id, output) if self.lines is not None else None
        if text is not None:  # before the progress line: every finished prompt has its outputs line
            with _open_append(part.outputs) as fh:
                fh.write(text.encode())
                fh.flush()
                os.fsync(fh.fileno())
        rec = {"workload": workload, "prompt_id": prompt_id, "end": end, "n": len(records), "output": output}
        sha = self.prompt_sha.get((workload, prompt_id))
        if sha is not None:
            rec["sha"] = sha
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with _open_append(part.progress) as fh:
            fh.write(line.encode())
            fh.flush()
            os.fsync(fh.fileno())
        self.done[(workload, prompt_id)] = output
        self.where[(workload, prompt_id)] = part.tag
