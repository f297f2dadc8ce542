"""`specbandit merge RUNS... --out DIR`: shards or runs of one campaign, combined into one campaign directory.

Inputs are run directories of the sweep (a whole run, one shard's directory, a campaign directory holding
several shards' parts). They must be one campaign: the same manifest campaign fields (models by the sha256
of their weights, not their paths), the same settings.json, the same shard count and prompt count; and no
prompt may be finished in two of them. Each input part's finished prompts (those with a whole progress
line) are copied into the part of the same name in DIR, byte for byte, in the order given: their block records,
progress, target check and outputs lines (harness/campaign/outputs.py; a part is given an outputs file when every input
of it has every finished prompt's line, else none: `python -m harness.outputs DIR` makes it); the manifest is
the first input's with the union of the workers' throughput, the parts, the target check recomputed over
every prompt, and `complete` when every prompt of the campaign is there (and its live phase, if it has one,
is: a live phase is carried over from the one input that has it, else it remains to be run by
`sweep.py --resume --out DIR`). DIR is then read back with `load_logs`, which must hold every record.

Torch-free (an analysis install has none): it reads and writes files only.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from bandit.logs.reader import load_logs

from . import outputs, shards
from .shards import CampaignError

LIVE_FILE = "live.jsonl"  # harness/decode/livephase.py's
SETTINGS = "settings.json"  # harness/campaign/manifest.py's


@dataclass
class Part:
    """One input part: its finished prompts' progress records, and how many bytes of its blocks file they cover."""

    blocks: Path
    progress: list[dict]
    end: int
    checks: dict = field(default_factory=dict)  # (workload, prompt_id) -> its target check line
    outputs: dict = field(default_factory=dict)  # (workload, prompt_id) -> its outputs line (outputs.py)


@dataclass
class Source:
    dir: Path
    manifest: dict
    settings: dict | None
    parts: dict[str, Part]


def merge(
    runs: Annotated[list[Path], typer.Argument(help="run directories of one campaign: shards' or whole runs'")],
    out: Annotated[Path, typer.Option("--out", help="the campaign directory to write (new, or empty)")],
) -> None:
    """Combine shards or runs of one campaign into one campaign directory (docs/DESIGN.md, "Campaigns beyond
    one process").

    RUNS must be one campaign (same models by weights hash, drafters, k, temperature, seed, workloads,
    record-changing settings, shard count) with no prompt finished in two of them: mixed campaigns and
    duplicate prompts are refused, naming them. Every finished prompt's records are copied byte for byte
    into OUT, whose load_logs is the union of the inputs'; OUT is a campaign directory the sweep can
    continue with --resume (e.g. to run its live phase).
    """
    sources = [read_source(Path(d)) for d in runs]
    if not sources:
        raise CampaignError("merge: no run directories given")
    check_one_campaign(sources)
    owner = check_no_duplicates(sources)
    if not owner:
        raise CampaignError(
            f"merge: {', '.join(str(s.dir) for s in sources)} hold no finished prompt; nothing to merge"
        )
    out = prepare_out(Path(out), sources)
    lock = shards.Lock(out / shards.LOCK)
    lock.take()
    try:
        n_records = write_parts(out, sources)
        manifest = merged_manifest(out, sources, len(owner))
        if sources[0].settings is not None:
            shards.atomic_write(out / SETTINGS, json.dumps(sources[0].settings, indent=2) + "\n")
        shards.atomic_write(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    finally:
        lock.close()
    table = load_logs([out])
    if table.n_records != n_records:
        raise CampaignError(f"{out}: load_logs reads {table.n_records} records, the inputs hold {n_records}")
    state = "complete" if manifest.get("complete") else "not complete"
    typer.echo(f"merged {len(owner)} prompts ({n_records} records) of {len(sources)} run(s) into {out}: {state}")
    if manifest["outputs"]["problems"]:
        typer.echo(f"outputs: {manifest['outputs']['first'][0]}; make them with  python -m harness.outputs {out}")
    if not manifest.get("complete") and len(owner) == manifest.get("n_prompts"):
        typer.echo(f"the live phase remains: python sweep.py --resume --out {out} (the campaign's options)")


def read_source(d: Path) -> Source:
    if not d.is_dir():
        raise CampaignError(f"{d}: not a directory")
    m = shards.read_json(d / "manifest.json")
    if m is None:
        raise CampaignError(f"{d}: no manifest.json; not a run directory of the sweep")
    if m.get("label") != "MEASURED" or "mode" not in m:
        raise CampaignError(f"{d}: label {m.get('label')!r}; merge combines the sweep's runs (MEASURED)")
    if shards.held(d / shards.LOCK):
        who = "; ".join(shards.holders(d)) or "a sweep"
        raise CampaignError(f"{d}: being written ({who}); merge it once that sweep has finished")
    parts = {tag: read_part(d, m["mode"], tag) for tag in shards.find_parts(d)}
    return Source(d, m, shards.read_json(d / SETTINGS), parts)


def read_part(d: Path, mode: str, tag: str) -> Part:
    names = shards.part_files(mode, tag)
    progress = [rec for rec, _ in shards.read_progress(d / names["progress"])]
    blocks = d / names["blocks"]
    end = progress[-1]["end"] if progress else 0
    size = blocks.stat().st_size if blocks.exists() else 0
    ends = [r["end"] for r in progress]
    if size < end or ends != sorted(ends):
        raise CampaignError(f"{blocks}: does not hold what {names['progress']} records (the directory was edited)")
    checks = {}
    check = d / names["check"]
    for raw in check.read_text().splitlines() if check.exists() else []:
        try:
            rec = json.loads(raw)
        except ValueError:
            break  # a truncated last line: that prompt is unfinished or re-run
        checks[(rec["workload"], rec["prompt_id"])] = raw
    lines = {}
    for rec, raw in outputs.read_lines(d / names["outputs"]):
        lines.setdefault((rec["workload"], rec["prompt_id"]), raw.decode())
    return Part(blocks, progress, end, checks, lines)


def check_one_campaign(sources: list[Source]) -> None:
    """Refuse inputs of different campaigns, naming the first field that differs."""
    first = sources[0]
    for s in sources[1:]:
        f = shards.campaign_difference(first.manifest, s.manifest)
        diff = (f, first.manifest.get(f), s.manifest.get(f)) if f else None
        for key in ("shards", "n_prompts"):
            a, b = first.manifest.get(key), s.manifest.get(key)
            if diff is None and a is not None and b is not None and a != b:
                diff = (key, a, b)
        sa, sb = first.settings or {}, s.settings or {}
        for key in sorted(set(sa) | set(sb)):
            if diff is None and sa.get(key) != sb.get(key):
                diff = (f"setting {key}", sa.get(key), sb.get(key))
        if diff is not None:
            raise CampaignError(
                f"{s.dir}: another campaign than {first.dir}: {diff[0]!r} differs ({diff[1]!r} vs {diff[2]!r}); "
                "merge combines shards or runs of one campaign only"
            )


def check_no_duplicates(sources: list[Source]) -> dict:
    """(workload, prompt_id) -> where it is finished; a prompt finished in two places is refused."""
    owner: dict = {}
    for s in sources:
        for tag, part in s.parts.items():
            where = s.dir / shards.progress_name(tag)
            for rec in part.progress:
                key = (rec["workload"], rec["prompt_id"])
                if key in owner:
                    raise CampaignError(
                        f"prompt {key[0]}/{key[1]} is in both {owner[key]} and {where}; merge refuses duplicate "
                        "records (leave one of those runs out)"
                    )
                owner[key] = where
    return owner


def prepare_out(out: Path, sources: list[Source]) -> Path:
    if out.is_symlink():
        raise CampaignError(f"{out}: is a symlink; give the real directory as --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CampaignError(f"{out}: exists and is not empty; merge writes a new campaign directory")
    resolved = out.resolve()
    for s in sources:
        if s.dir.resolve() == resolved:
            raise CampaignError(f"{out}: is one of the inputs; merge writes a new campaign directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_parts(out: Path, sources: list[Source]) -> int:
    """Every part of the inputs into the part of the same name in `out`, in input order; returns the records."""
    mode = sources[0].manifest["mode"]
    tags = sorted({t for s in sources for t, p in s.parts.items() if p.progress}, key=lambda t: (t != "", t))
    n_records = 0
    for tag in tags:
        names = shards.part_files(mode, tag)
        blocks, progress, checks, lines, offset = out / names["blocks"], [], [], [], 0
        fd = shards.open_nofollow(blocks, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as dst:
            for s in sources:
                part = s.parts.get(tag)
                if part is None or not part.progress:
                    continue
                with open(part.blocks, "rb") as src:
                    _copy(src, dst, part.end)
                for rec in part.progress:
                    progress.append(json.dumps({**rec, "end": rec["end"] + offset}, separators=(",", ":")) + "\n")
                    key = (rec["workload"], rec["prompt_id"])
                    checks += [part.checks[key] + "\n"] if key in part.checks else []
                    lines.append(part.outputs[key] + "\n" if key in part.outputs else None)
                    n_records += int(rec.get("n", 0))
                offset += part.end
            dst.flush()
            os.fsync(dst.fileno())
        shards.atomic_write(out / names["progress"], "".join(progress))
        shards.atomic_write(out / names["check"], "".join(checks))
        if None not in lines:  # a part without every finished prompt's line gets none (above)
            shards.atomic_write(out / names["outputs"], "".join(lines))
    return n_records


def _copy(src, dst, n: int) -> None:
    """The first n bytes of src into dst, in chunks (a campaign's logs need not fit in memory)."""
    while n > 0:
        chunk = src.read(min(n, 1 << 20))
        if not chunk:
            raise CampaignError(f"{src.name}: shorter than its progress file records")
        dst.write(chunk)
        n -= len(chunk)


def merged_manifest(out: Path, sources: list[Source], n_done: int) -> dict:
    first = sources[0].manifest
    m = {k: v for k, v in first.items() if k not in ("complete", "timing", "live", "target_check")}
    m["run"] = out.name
    m["created"] = min(str(s.manifest.get("created") or "") for s in sources) or first.get("created")
    m["throughput"] = {"workers": {}}
    for s in sources:
        m["throughput"] = shards.merge_throughput(m["throughput"], s.manifest.get("throughput"))
    parts = {}
    for s in sources:
        for tag, part in s.parts.items():
            if tag:
                parts.setdefault(tag, {"done": 0})["done"] += len(part.progress)
    if parts:
        m["parts"] = dict(sorted(parts.items(), key=lambda kv: shards.parse_tag(kv[0]).index))
    live = [s for s in sources if (s.dir / LIVE_FILE).exists()]
    if len(live) > 1:
        raise CampaignError(f"{live[0].dir} and {live[1].dir} both hold a live phase; merge one of them only")
    if live:
        shutil.copyfile(live[0].dir / LIVE_FILE, out / LIVE_FILE)
        m.update({k: live[0].manifest[k] for k in ("timing", "live") if k in live[0].manifest})
    m["target_check"] = target_check(out, sources)
    m["outputs"] = outputs.check(out, mode=first["mode"])
    live_needed = int((sources[0].settings or {}).get("live_prompts", 0)) > 0
    if m.get("n_prompts") is not None:
        m["complete"] = n_done >= m["n_prompts"] and (not live_needed or bool(live))
    else:  # runs from before n_prompts was recorded: complete when every input was
        m["complete"] = all(s.manifest.get("complete") is True for s in sources)
    if not m["complete"]:
        m.pop("complete")
    return m


def target_check(out: Path, sources: list[Source]) -> dict:
    """The manifest's target_check over the merged prompts (harness/campaign/collect.py's `target_check`, from the copied lines)."""
    seen = [json.loads(raw) for s in sources for part in s.parts.values() for raw in part.checks.values()]
    done = {(r["workload"], r["prompt_id"]) for s in sources for part in s.parts.values() for r in part.progress}
    seen = [r for r in seen if (r["workload"], r["prompt_id"]) in done]
    old = next((s.manifest["target_check"] for s in sources if "target_check" in s.manifest), {})
    return shards.check_summary(seen, old.get("dtype"), old.get("exact_verify", False))
