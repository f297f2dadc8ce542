"""A run directory: crash-safe appends, resume, and the manifest (docs/manifest.md).

    runs/<run>/manifest.json        written at the start, rewritten (atomically) with timing
    runs/<run>/blocks_<mode>.jsonl  the block records, one prompt's records per append
    runs/<run>/progress.jsonl       one line per finished prompt: its byte offset in the
                                    blocks file and its output tokens

A prompt counts as finished only once its progress line is on disk, and that line is
written after the prompt's records are flushed and fsync'd. `--resume` therefore cuts the
blocks file back to the last finished prompt's offset (this repairs a truncated last line
and drops a half-written prompt), skips finished prompts, and hands their outputs back to
the drafters so that state carried across prompts (the suffix drafter's corpus) is what an
uninterrupted run would have had.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunDir:
    def __init__(self, out: str | Path, manifest: dict, resume: bool):
        self.dir = Path(out)
        self.manifest = manifest
        self.blocks = self.dir / f"blocks_{manifest['mode']}.jsonl"
        self.progress = self.dir / "progress.jsonl"
        self.done: dict[tuple[str, str], list[int]] = {}  # finished prompt -> its output
        mpath = self.dir / "manifest.json"
        if mpath.exists() and not resume:
            raise HarnessError(f"{self.dir}: already holds a run; add --resume to continue it, or choose another --out")
        if resume and mpath.exists():
            old = json.loads(mpath.read_text())
            for f in CAMPAIGN_FIELDS:
                if old.get(f) != manifest.get(f):
                    raise HarnessError(f"--resume {self.dir}: manifest field {f!r} differs from this command's: "
                                       f"{old.get(f)!r} vs {manifest.get(f)!r}")
            self.manifest = {**manifest, "created": old.get("created", manifest["created"])}
            self._recover()
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            for p in (self.blocks, self.progress):
                p.write_bytes(b"")
            self.write_manifest()

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
                self.done[(rec["workload"], rec["prompt_id"])] = rec["output"]
                end = rec["end"]
                good += line + b"\n"
            _atomic_write(self.progress, good.decode())
        size = self.blocks.stat().st_size if self.blocks.exists() else 0
        if size < end:
            raise HarnessError(f"{self.blocks}: shorter ({size} bytes) than {self.progress} records ({end}); "
                               "the run directory was edited; start a new run")
        if size > end:
            with open(self.blocks, "r+b") as fh:
                fh.truncate(end)
            print(f"resume: cut {size - end} bytes of unfinished records from {self.blocks}")
        if not self.blocks.exists():
            self.blocks.write_bytes(b"")

    def write_manifest(self) -> None:
        _atomic_write(self.dir / "manifest.json", json.dumps(self.manifest, indent=2) + "\n")

    def append(self, workload: str, prompt_id: str, records: list[dict], output: list[int]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with open(self.blocks, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            end = fh.tell()
        line = json.dumps({"workload": workload, "prompt_id": prompt_id, "end": end, "n": len(records),
                           "output": output}, separators=(",", ":")) + "\n"
        with open(self.progress, "a") as fh:
            fh.write(line)
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
