"""A run's outputs: `outputs.jsonl`, one line per finished prompt, so that anyone can read what the target wrote
and regenerate it from the prompt's token ids (docs/DESIGN.md, "The run directory's outputs").

    {"workload": ..., "prompt_id": ..., "prompt_ids": [...], "output_ids": [...], "text": "..."}

in that key order, compact, ASCII (json.dumps' escapes), no timestamps: the same campaign gives the same bytes.
`prompt_ids`: the prompt's token ids as the target saw them (workloads.py's `PromptItem.token_ids`: the chat
template applied where the tokenizer has one). `output_ids`: the run's output, exactly as progress.jsonl records
it: the target's greedy tokens (at temperature > 0 its coupled samples under the run's seed), at most
max_new_tokens, ending with the EOS token when the target stopped on one (then included), without one when the
budget ran out. `text`: `tokenizer.decode(output_ids, skip_special_tokens=False,
clean_up_tokenization_spaces=False)`, the EOS token spelt out, nothing cleaned.

Each part of a run directory (harness/campaign/shards.py) has its own file, beside its block log: `outputs.jsonl` (one
process), `outputs-sIofN.jsonl` (shard I of N). The sweep appends a prompt's line (fsync'd) after its block records
and before its progress line, so every finished prompt has its line; `--resume` cuts the file back to exactly the
finished prompts' lines (`cut_back`), as it cuts the block log. `specbandit merge` copies each part's lines of
finished prompts in the order of the block logs.

`check` validates a run's outputs against its progress files and block logs (the sweep's end records it in the
manifest's `outputs`); `python -m harness.outputs RUN` reconstructs the files of a run from before them (from
progress.jsonl's outputs, the prompts tokenized again as the sweep did, and the target's tokenizer), and
`--check` validates them. Torch-free at import (merge runs on an analysis install).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from bandit.logs.schema import accepted_length

from . import shards
from .shards import CampaignError

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("workload", "prompt_id", "prompt_ids", "output_ids", "text")
MAX_SHOWN = 5  # problems named in a check's `first`


def outputs_name(tag: str) -> str:
    return shards.part_files("", tag)["outputs"]


def prompt_sha(ids) -> str:
    """The hash of a prompt's token ids that progress lines carry (`sha`): a resume with other prompts under the
    same ids is refused, and a reconstruction checks its tokenization against it."""
    return hashlib.sha256(json.dumps([int(t) for t in ids]).encode()).hexdigest()[:16]


def decode(tok, ids) -> str:
    return tok.decode([int(t) for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def line(workload: str, prompt_id: str, prompt_ids, output_ids, text: str) -> str:
    rec = dict(zip(FIELDS, (workload, prompt_id, [int(t) for t in prompt_ids], [int(t) for t in output_ids], text)))
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=True) + "\n"


class Lines:
    """The sweep's line maker: (workload, prompt_id, output) -> its outputs line (None: a prompt it does not
    know, e.g. one finished earlier under a larger --limit)."""

    def __init__(self, tok, prompts: dict):
        self.tok, self.prompts = tok, prompts  # (workload, prompt_id) -> its token ids

    def __call__(self, workload: str, prompt_id: str, output) -> str | None:
        ids = self.prompts.get((workload, prompt_id))
        return None if ids is None else line(workload, prompt_id, ids, output, decode(self.tok, output))


def read_lines(path: Path) -> list[tuple[dict, bytes]]:
    """A part's outputs lines: (record, raw line) for each whole line up to the first unreadable one."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for ln in raw.split(b"\n")[:-1]:  # after the last newline: nothing, or a line torn by a kill
        try:
            rec = json.loads(ln)
            (rec["workload"], rec["prompt_id"], rec["output_ids"])
        except (ValueError, KeyError, TypeError):
            break
        out.append((rec, ln))
    return out


def cut_back(path: Path, finished: list[dict], build=None) -> str | None:
    """Make a part's outputs file hold exactly one line per finished prompt (`finished`: its progress records, in
    order), as --resume cuts the block log: lines past them (a prompt killed before its progress line, a torn
    line) are cut; lines missing (a run from before outputs.jsonl) are made by `build` (the sweep's Lines), else
    the file keeps the finished prompts' lines it has. Returns a note to print, or None."""
    have = read_lines(path)
    n, end = 0, 0
    for (rec, raw), want in zip(have, finished):
        if (rec["workload"], rec["prompt_id"]) != (want["workload"], want["prompt_id"]):
            break
        n, end = n + 1, end + len(raw) + 1
    size = path.stat().st_size if path.exists() else 0
    if n == len(finished) or build is None:
        if size <= end:
            return None
        fd = shards.open_nofollow(path, os.O_RDWR)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"resume: cut {size - end} bytes of unfinished prompts' outputs from {path}"
    made = [build(r["workload"], r["prompt_id"], r["output"]) for r in finished[n:]]
    made = made[: made.index(None)] if None in made else made
    kept = Path(path).read_bytes()[:end] if end else b""
    shards.atomic_write(path, kept + "".join(made).encode())
    note = f"resume: {path}: made the lines of {len(made)} prompts finished before the run kept its outputs"
    if n + len(made) < len(finished):
        note += f"; {len(finished) - n - len(made)} remain unknown (python -m harness.outputs {path.parent} --check)"
    return note


# ---------------------------------------------------------------- the check


def _block_file(d: Path, mode: str, tag: str) -> Path | None:
    p = d / shards.part_files(mode, tag)["blocks"]
    return p if p.exists() else (p.with_name(p.name + ".gz") if p.with_name(p.name + ".gz").exists() else None)


class _Problems:
    def __init__(self):
        self.n, self.first = 0, []

    def add(self, what: str) -> None:
        self.n += 1
        if len(self.first) < MAX_SHOWN:
            self.first.append(what)


def _check_log(path: Path, end: int, outs: dict, dense: bool, bad: _Problems) -> int:
    """A part's block records up to byte `end` (its finished prompts) against the outputs: in a dense log a record
    at every position 0..n-1, in order, and every draft's `accepted` the common prefix of its tokens with
    output_ids[pos:]; in a sparse or live log, positions inside the output. Returns the records read."""
    at, n_rec, nxt = 0, 0, {}
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
        for raw in fh:
            if at >= end:
                break
            at += len(raw)
            n_rec += 1
            try:
                r = json.loads(raw)
                key, pos, drafts = (r["workload"], r["prompt_id"]), int(r["pos"]), r["drafts"]
            except (ValueError, KeyError, TypeError):
                bad.add(f"{path.name}: record {n_rec} is unreadable")
                continue
            y = outs.get(key)
            if y is None:
                bad.add(f"{path.name}: records of {key[0]}/{key[1]}, which outputs lack")
                outs[key] = y = []
            if (dense and pos != nxt.get(key, 0)) or not 0 <= pos < max(1, len(y)):
                bad.add(f"{key[0]}/{key[1]}@{pos}: a record where the output has no such position")
            nxt[key] = pos + 1
            for name, d in drafts.items() if dense else ():
                if d["accepted"] != accepted_length(d["tokens"], d.get("parents"), y[pos:]):
                    bad.add(f"{key[0]}/{key[1]}@{pos}: {name}'s accepted differs from its draft against output_ids")
    for key, y in outs.items() if dense else ():
        if nxt.get(key, 0) != len(y):
            bad.add(f"{key[0]}/{key[1]}: {len(y)} output tokens, {nxt.get(key, 0)} dense records")
    return n_rec


def check(d: Path, tok=None, lines: dict | None = None, mode: str | None = None) -> dict:
    """Validate a run's outputs: every part's lines are its finished prompts', one each, in order, with the
    progress file's output (and prompt hash where recorded); against the block log (above); with `tok`, each text
    is its output decoded. `lines`: tag -> lines to check instead of the files (a reconstruction before writing);
    `mode`: the run's (default: its manifest's). Returns the manifest's `outputs` (docs/manifest.md)."""
    d = Path(d)
    mode = mode or (shards.read_json(d / "manifest.json") or {}).get("mode", "dense")
    bad, n, tokens, logs = _Problems(), 0, 0, []
    for tag in shards.find_parts(d):
        done = [rec for rec, _ in shards.read_progress(d / shards.progress_name(tag))]
        name = outputs_name(tag)
        got = [json.loads(x) for x in lines[tag]] if lines is not None else [r for r, _ in read_lines(d / name)]
        if len(got) != len(done):
            bad.add(f"{name}: {len(got)} lines, {len(done)} finished prompts")
        outs = {}
        for rec, p in zip(got, done):
            key = (p["workload"], p["prompt_id"])
            if (rec["workload"], rec["prompt_id"]) != key:
                bad.add(f"{name}: {rec['workload']}/{rec['prompt_id']} where progress has {key[0]}/{key[1]}")
                continue
            if "output" in p and rec["output_ids"] != p["output"]:
                bad.add(f"{key[0]}/{key[1]}: output_ids differ from {shards.progress_name(tag)}")
            if p.get("sha") is not None and prompt_sha(rec["prompt_ids"]) != p["sha"]:
                bad.add(f"{key[0]}/{key[1]}: prompt_ids differ from the prompt {shards.progress_name(tag)} hashed")
            if tok is not None and rec["text"] != decode(tok, rec["output_ids"]):
                bad.add(f"{key[0]}/{key[1]}: text is not output_ids decoded")
            outs[key] = rec["output_ids"]
            n, tokens = n + 1, tokens + len(rec["output_ids"])
        log = _block_file(d, mode, tag)
        if log is None:
            bad.add(f"no block log {shards.part_files(mode, tag)['blocks']}[.gz] beside {name}")
        elif done:
            _check_log(log, done[-1]["end"], outs, mode == "dense", bad)
            logs.append(log.name)
    return {"prompts": n, "tokens": tokens, "logs": logs, "problems": bad.n, "first": bad.first}


# ---------------------------------------------------------------- reconstruction of a run from before outputs


def _repo_path(p):
    """A path as the manifest and settings.json record it: relative ones are the repository's."""
    return None if p in (None, "") else str(p if os.path.isabs(p) else REPO / p)


def _prompts(d: Path, m: dict, models, data) -> dict:
    """The campaign's prompts as the sweep loaded them (settings.json's workload sources; every prompt, the
    --limit unrecorded): (workload, prompt_id) -> its item."""
    import workloads as wlmod

    s = shards.read_json(d / "settings.json") or {}
    names = s.get("workload_names") or ([] if s.get("workload_file") else list(m.get("workloads") or []))
    paths = {k: _repo_path(v) for k, v in (s.get("workload_path") or {}).items()}
    items = wlmod.load(
        names, _repo_path(s.get("workload_file")), None, paths, data or _repo_path(s.get("data")), models
    )
    out = {}
    for p in items:
        out.setdefault((p.workload, p.prompt_id), p)
    return out


def reconstruct(d: Path, target=None, models=None, data=None) -> str:
    """Every part's outputs file of run `d`, from its progress files, its prompts tokenized again and the
    manifest's target tokenizer; checked (`check`) before anything is written. Returns what it did."""
    from harness.models import lm

    d = Path(d)
    m = shards.read_json(d / "manifest.json")
    if m is None or m.get("label") != "MEASURED":
        raise CampaignError(f"{d}: no manifest.json of a measured run; not a run directory of the sweep")
    if shards.held(d / shards.LOCK):
        raise CampaignError(f"{d}: being written ({'; '.join(shards.holders(d)) or 'a sweep'}); wait for it")
    tags = shards.find_parts(d)
    there = [outputs_name(t) for t in tags if (d / outputs_name(t)).exists()]
    if there:
        raise CampaignError(f"{d}: already has {there[0]}; check it with  python -m harness.outputs {d} --check")
    done = {t: [rec for rec, _ in shards.read_progress(d / shards.progress_name(t))] for t in tags}
    if not any(done.values()):
        raise CampaignError(f"{d}: no finished prompt in a progress file; the run's outputs are not recorded")
    lacking = next((r for recs in done.values() for r in recs if not isinstance(r.get("output"), list)), None)
    if lacking is not None:
        raise CampaignError(f"{d}: progress line of {lacking['workload']}/{lacking['prompt_id']} has no output")
    tdir = lm.resolve_model_dir(target or _repo_path(m["target"]["path"]), models, "the target")
    if m["target"].get("sha256") and lm.weights_sha256(tdir) != m["target"]["sha256"]:
        raise CampaignError(f"{tdir}: not the run's target (its weights' sha256 differs from the manifest's)")
    tok, items = lm.load_tokenizer(tdir), _prompts(d, m, models, data)
    lines = {}
    for tag, recs in done.items():
        lines[tag] = []
        for r in recs:
            item = items.get((r["workload"], r["prompt_id"]))
            if item is None:
                raise CampaignError(f"{d}: prompt {r['workload']}/{r['prompt_id']} is not among the workloads now")
            ids = item.token_ids(tok)
            if r.get("sha") is not None and prompt_sha(ids) != r["sha"]:
                raise CampaignError(
                    f"{d}: prompt {r['workload']}/{r['prompt_id']} tokenizes to other ids than the run's (another "
                    "workload source or tokenizer?)"
                )
            lines[tag].append(line(r["workload"], r["prompt_id"], ids, r["output"], decode(tok, r["output"])))
    res = check(d, tok, lines)
    if res["problems"]:
        raise CampaignError(
            f"{d}: the logs disagree with the outputs ({res['problems']} problems, first: {res['first'][0]})"
        )
    n_prompts = m.get("n_prompts")
    for tag, ls in lines.items():
        shards.atomic_write(d / outputs_name(tag), "".join(ls))
    whole = "" if n_prompts in (None, res["prompts"]) else f" (of the campaign's {n_prompts}: not finished)"
    return (
        f"wrote {', '.join(outputs_name(t) for t in lines)} in {d}: {res['prompts']} prompts{whole}, "
        f"{res['tokens']} output tokens, agreeing with {', '.join(res['logs'])}"
    )


def cli(
    run: Annotated[Path, typer.Argument(help="a run directory of the sweep")],
    check_only: Annotated[
        bool, typer.Option("--check", help="validate the run's outputs files, write nothing")
    ] = False,
    target: Annotated[Optional[str], typer.Option(help="the target's directory (default: the manifest's path)")] = None,
    models: Annotated[Optional[str], typer.Option(help="models root, as the sweep's --models")] = None,
    data: Annotated[Optional[str], typer.Option(help="data root, as the sweep's --data")] = None,
) -> None:
    """Write a run's outputs.jsonl (each part's) from its logs, or, with --check, validate them."""
    if not check_only:
        typer.echo(reconstruct(run, target, models, data))
        return
    from harness.models import lm

    m = shards.read_json(Path(run) / "manifest.json") or {}
    path = target or _repo_path((m.get("target") or {}).get("path"))
    tok = lm.load_tokenizer(lm.resolve_model_dir(path, models, "the target")) if path else None
    res = check(Path(run), tok)
    if res["problems"]:
        raise CampaignError(f"{run}: outputs: {res['problems']} problems, first: {'; '.join(res['first'])}")
    typer.echo(f"{run}: {res['prompts']} prompts, {res['tokens']} output tokens; agree with {', '.join(res['logs'])}")


def main() -> None:
    """The command, under bandit.logs.errors' exit codes."""
    from bandit.logs.errors import run

    run(cli)


if __name__ == "__main__":
    main()
