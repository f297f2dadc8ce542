"""A run directory's manifest (docs/manifest.md) and settings.json: building them (the manifest's fields, the host's
hardware), their JSON (run_json: a NaN or an infinity is refused), and checking what a run directory records against
this command when a sweep resumes it or a shard joins it (the campaign's fields, the record-changing settings, the
shard count). harness/campaign/rundir.py reads and writes them; nothing here writes a file."""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

from bandit.logs.schema import code_version

from . import shards
from ..models.lm import HarnessError
from .shards import Shard

SETTINGS = "settings.json"  # the record-changing settings not in the manifest (compared on --resume)
# what a shard writer may change in the campaign's manifest (the rest is its creator's)
SHARD_KEYS = ("shards", "n_prompts", "target_check", "outputs", "complete")


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
    threads = torch.get_num_threads()  # what the forwards ran with (harness/campaign/worker.py sets it)
    return {"device": device, "torch": torch.__version__.split("+")[0], "cpu": cpu, "gpu": gpu, "threads": threads}


def _not_finite(v, where: str = "") -> str | None:
    """The first field of `v` holding a NaN or an infinity (JSON has neither), or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where or "a value"
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else ()
    return next((w for k, x in items if (w := _not_finite(x, f"{where}.{k}" if where else str(k)))), None)


def run_json(obj, name: str) -> str:
    """A run file's indented JSON; a NaN or an infinity anywhere is one HarnessError line naming its field."""
    bad = _not_finite(obj)
    if bad:
        raise HarnessError(f"{name}: {bad} is not a finite number; refusing to write it")
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def make_manifest(
    run: str,
    mode: str,
    target: dict,
    drafters: dict,
    k: int,
    temperature: float,
    seed: int,
    workloads: list[str],
    device: str,
) -> dict:
    """The manifest of docs/manifest.md, field for field (timing is added after the live phase)."""
    return {
        "v": 1,
        "label": "MEASURED",
        "run": run,
        "created": shards.now_utc(),
        "mode": mode,
        "target": target,
        "drafters": drafters,
        "k": k,
        "temperature": temperature,
        "seed": seed,
        "workloads": workloads,
        "hardware": hardware(device),
        "code_version": code_version(),  # the whole repository's last commit
    }


def read_recorded(d: Path) -> dict | None:
    """The manifest `d` records (None: none yet); an unreadable one is one HarnessError line."""
    mpath = d / "manifest.json"
    if not mpath.exists():
        return None
    try:
        old = json.loads(mpath.read_text())
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise HarnessError(
            f"--resume {d}: {mpath} is unreadable ({e}); the finished work cannot "
            "be checked against this command; repair it or start a new run"
        ) from None
    return old


def check_campaign(d: Path, verb: str, old: dict, new: dict) -> None:
    """The recorded manifest's campaign fields against this command's (`verb`: how the command is named in the
    error); a model found at another path with the same weights is a note, not a difference."""
    f = shards.campaign_difference(old, new)
    if f is not None:
        raise HarnessError(f"{verb}: setting {f!r} differs: recorded {old.get(f)!r}, this command {new.get(f)!r}")
    for note in shards.moved_models(old, new):
        print(f"note: {d}: {note}; the same weights, so the campaign continues", file=sys.stderr)


def check_settings(d: Path, settings: dict | None, verb: str) -> None:
    """This command's record-changing settings against those `d` records in settings.json (None: not compared)."""
    spath = d / SETTINGS
    if settings is None:
        return
    if not spath.exists():
        print(
            f"note: --resume {d}: no {SETTINGS} (a run from before settings were recorded); "
            "only the manifest's fields were checked",
            file=sys.stderr,
        )
        return
    try:
        old = json.loads(spath.read_text())
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise HarnessError(f"--resume {d}: {spath} is unreadable ({e}); repair it or start a new run") from None
    for f, new in settings.items():
        if f in old and old[f] != new:
            raise HarnessError(f"{verb}: setting {f!r} differs: recorded {old[f]!r}, this command {new!r}")
    for f in old:
        if f not in settings:
            raise HarnessError(f"{verb}: setting {f!r} differs: recorded {old[f]!r}, this command has none")


def campaign_shards(d: Path, shard: Shard | None, n_shards: int | None, recorded) -> int | None:
    """A campaign is split one way: shard parts of another count are refused (their prompts would overlap).
    Returns the shard count the writer goes on with: a Ray driver (`n_shards`, no `shard`) continues the
    campaign's split; otherwise `n_shards`."""
    counts = {shards.parse_tag(t).count for t in shards.find_parts(d) if t}
    if recorded:
        counts.add(int(recorded))
    if shard is not None and counts - {shard.count}:
        n = sorted(counts - {shard.count})[0]
        raise HarnessError(f"--shard {shard}: the campaign in {d} is split into {n} shards; give --shard I/{n}")
    if n_shards and not shard and counts:  # a Ray driver continues the campaign's split
        if len(counts) > 1:
            raise HarnessError(f"{d}: holds shard parts of several counts {sorted(counts)}")
        return counts.pop()
    return n_shards


def throughput(workers: dict) -> dict:
    """The manifest's throughput of this session's workers (docs/manifest.md)."""
    out = {}
    for wid, w in workers.items():
        secs = w["seconds"]
        out[wid] = {
            **w,
            "seconds": round(secs, 3),
            "records_per_s": round(w["records"] / secs, 2) if secs else None,
        }
    return {"workers": out}
