"""What a report reads, where it writes, and the command each file records (docs/DESIGN.md, "Outputs").

A run's default outputs (`<run dir>/ci.json`, `replay.txt`, ...) are made by one documented command each
(`DOCUMENTED`) and by nothing else: an analysis with any non-default option (a drafter subset, other resamples or
seed, another unit or method, another engine timing) prints its report, or writes where `--out` says, and an
`--out` naming a run's default output is refused. Every file records the command that remakes it byte for byte: a
`command` field in JSON, a first line `# made by: <command>` in text, the PNG's `Description` text; a CSV's is in
its .txt. The command is the canonical one (`python <script>`, the inputs unless they are the published campaign,
each option that differs from its default), whichever entry point (`specbandit <cmd>`, `python bandit/<cmd>.py`)
ran; where the file was written (--out) is not part of it, so the same analysis gives the same bytes anywhere.
Every file goes through bandit/logs/safeio.py (no write through a symlink, temp file and atomic rename), text encoded
UTF-8 with backslashreplace so that a path with a non-UTF-8 byte is written escaped.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bandit.logs.errors import UsageError
from bandit.logs.reader import default_campaign, expand_paths, published_campaign
from bandit.logs.safeio import write_file

REPO = Path(__file__).resolve().parents[2]
HEADER = "# made by: "
MAX_RESAMPLES = 1_000_000
SEED_END = 2**63  # seeds lie in [0, 2^63)
RESAMPLES_HELP = f"in [1, {MAX_RESAMPLES}]"
SEED_HELP = "bootstrap seed, in [0, 2^63)"
LATEST_HELP = "read the newest complete run under runs/, not the published campaign (paper/campaign.txt)"

DOCUMENTED = {  # a run's default outputs and the one command that writes each (the published campaign's)
    "ci.json": "python bandit/ci.py",
    "replay.txt": "python bandit/replay.py",
    "selector.txt": "python bandit/selector.py",
    "selector_frontier.csv": "python bandit/selector.py",
    "selector_frontier.png": "python bandit/selector.py",
    "breakeven.txt": "python bandit/breakeven.py",
    "breakeven.csv": "python bandit/breakeven.py",
    "breakeven.png": "python bandit/breakeven.py",
    "wallclock.json": "python bandit/wallclock.py",
    "wallclock.txt": "python bandit/wallclock.py",
    "wallclock.png": "python bandit/wallclock.py",
    "core.txt": "python bandit/core.py",
    "coverage.json": "python bench/coverage.py",
    "regret.json": "python bandit/regret.py",
    "regret.txt": "python bandit/regret.py",
    "regret.png": "python bandit/regret.py",
}
RECORDED_IN = {"selector_frontier.csv": "selector.txt", "breakeven.csv": "breakeven.txt"}  # a CSV's record


# ---------------------------------------------------------------- option values


def bounded(flag: str, value: int, lo: int, hi: int) -> int:
    """`value` if lo <= value <= hi, else a UsageError naming the option and its range."""
    if not lo <= value <= hi:
        raise UsageError(f"{flag} {value}: must be in [{lo}, {hi}]")
    return value


def resamples(value: int, flag: str = "--resamples", allow_zero: bool = False) -> int:
    return bounded(flag, value, 0 if allow_zero else 1, MAX_RESAMPLES)


def seed(value: int, flag: str = "--seed") -> int:
    if not 0 <= value < SEED_END:
        raise UsageError(f"{flag} {value}: must be in [0, 2^63)")
    return value


def finite(flag: str, value: float, lo: float | None = None, hi: float | None = None, above: bool = False) -> float:
    """`value` if finite and within [lo, hi] (above: > lo), else a UsageError naming the option."""
    ok = math.isfinite(value) and (lo is None or (value > lo if above else value >= lo)) and (hi is None or value <= hi)
    if not ok:
        rng = f"{'>' if above else '>='} {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise UsageError(f"{flag} {value}: must be a finite number {rng}")
    return value


def choice(flag: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UsageError(f"{flag} {value!r}: must be one of {', '.join(allowed)}")
    return value


def path_arg(value: str | None, flag: str) -> Path | None:
    """An option's path, '' refused (typer would make it '.', the working directory)."""
    if value is None:
        return None
    if not value:
        raise UsageError(f"{flag} '': an empty path (name a file)")
    return Path(value)


# ---------------------------------------------------------------- inputs and the recorded command


def show(p: str | Path) -> str:
    """A path as a recorded command names it: relative to the repository when inside it, else absolute."""
    a = Path(os.path.abspath(p))
    return a.relative_to(REPO).as_posix() if a.is_relative_to(REPO) else str(a)


def _same(a: Path | None, b: Path | None) -> bool:
    return a is not None and b is not None and os.path.abspath(a) == os.path.abspath(b)


@dataclass(frozen=True)
class Inputs:
    """The logs a command reads: `files`; `run`, the one run directory whose logs are all of them (else None);
    `said`, the sentence naming the published campaign (None for any other: a report then names its paths, as
    its recorded command does, so that the command remakes it byte for byte);
    `args`, the inputs as the recorded command names them (none for the published campaign)."""

    files: list[Path]
    run: Path | None
    said: str | None
    args: tuple[str, ...]
    dir: Path | None = None  # the one directory the logs lie in (a run's live phase is read from it), else None

    @property
    def named(self) -> str:
        return ", ".join(self.args) if self.args else str(self.run)


def resolve(paths: Sequence[str | Path] | None, latest: bool = False) -> Inputs:
    """The inputs of an analysis: PATHS, else the published campaign (`latest`: the newest complete run)."""
    pub = published_campaign()
    if paths:
        if latest:
            raise UsageError("--latest picks the run itself: give no paths with it")
        files = expand_paths(paths)
        dirs = {f.parent for f in files}
        run = next(iter(dirs)) if len(dirs) == 1 else None
        if run is not None and {f.resolve() for f in expand_paths([run])} != {f.resolve() for f in files}:
            run = None  # part of a run's logs: not the run
        one = next(iter(dirs)) if len(dirs) == 1 else None
        if run is not None and _same(run, pub):
            return Inputs(files, run, default_campaign()[2], (), one)
        args = (show(run),) if run is not None else tuple(show(p) for p in paths)
        return Inputs(files, run, None, args, one)
    run, files, said = default_campaign(latest=latest)
    if _same(run, pub):
        return Inputs(files, run, default_campaign()[2], (), run)
    print(said, file=sys.stderr)  # which run --latest chose; the report names it as its command does
    return Inputs(files, run, None, (show(run),), run)


def command(script: str, inp: Inputs | None, options: Sequence[tuple[str, object, object]] = ()) -> str:
    """`python <script>`, the inputs unless the published campaign, and each (flag, value, default) that differs
    (a flag whose value is True alone; None omitted)."""
    words = ["python", script, *(inp.args if inp is not None else ())]
    for flag, value, default in options:
        if value is None or value == default:
            continue
        words += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(w) for w in words)


def changed(options: Sequence[tuple[str, object, object]]) -> list[str]:
    return [flag for flag, value, default in options if value is not None and value != default]


def _is_run_dir(d: Path) -> bool:
    return (d / "manifest.json").exists() or any(d.glob("blocks_*"))


def guard_out(out: Path, names: Sequence[str], inp: Inputs | None, own: Sequence[str], differs: Sequence[str]):
    """Refuse an --out whose files (`names`, beside it) would overwrite an input, a file of a run (its logs,
    manifest, live phase), or a run's default output unless they are this command's own defaults (`own`) for the
    run it reads with every option at its default."""
    inputs = {f.resolve() for f in inp.files} if inp is not None else set()
    for name in names:
        if (out.parent / name).resolve() in inputs:
            raise UsageError(f"--out {out}: {out.parent / name} is an input of this command; choose another file")
        if not _is_run_dir(out.parent):
            continue
        if name not in DOCUMENTED and (out.parent / name).exists():  # a run's log, manifest, live phase...
            raise UsageError(f"--out {out}: {out.parent / name} is a file of the run; choose another file")
        if name not in DOCUMENTED:
            continue
        mine = inp is not None and inp.run is not None and _same(out.parent, inp.run) and name in own
        if not mine or differs:
            raise UsageError(
                f"--out {out}: {out.parent / name} is a run's default output, written only by "
                f"`{DOCUMENTED[name]}` (with the run's path unless it is the published campaign) with default "
                "options; choose another file"
            )


def destination(
    inp: Inputs, name: str, out: Path | None, differs: Sequence[str], script: str
) -> tuple[Path | None, str]:
    """Where a command writes `name`: `out` if given; else beside the one run it reads when every option is its
    default; else nowhere, and the line saying why."""
    if out is not None:
        return Path(out), ""
    if differs:
        return None, (
            f"not written: {', '.join(differs)} not at the default; a run's {name} is written only by "
            f"`python {script}` with every option at its default (pass --out FILE to write this one)"
        )
    if inp.run is None:
        return None, f"not written (several runs pooled, or part of a run: pass --out FILE to write {name})"
    return inp.run / name, ""


def siblings(dest: Path | None, suffixes: Sequence[str], flag: str = "--out") -> list[Path]:
    """`dest` and the files written beside it (its name with each suffix); refused when two would coincide."""
    if dest is None:
        return []
    files = [dest, *(dest.with_suffix(x) for x in suffixes)]
    if len(set(files)) < len(files):
        raise UsageError(f"{flag} {dest}: its {', '.join(suffixes)} files would be the file itself; name another")
    return files


# ---------------------------------------------------------------- writing


class WriteFailed(OSError):
    """A report computed whole whose files could not be written: the boundary prints `report`, then this error."""

    def __init__(self, e: OSError, report: str):
        super().__init__(e.errno, e.strerror, e.filename)
        self.report = report


def encode(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


def png(fig, cmd: str, dpi: int = 120) -> bytes:
    """A matplotlib figure as PNG bytes, its command in the `Description` text (ASCII, escaped)."""
    buf = io.BytesIO()
    desc = (HEADER[2:] + cmd).encode("ascii", "backslashreplace").decode("ascii")
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None, "Description": desc})
    return buf.getvalue()


STAMP = re.compile(rb"(\d+\.\d+\.\d+)\+g[0-9a-f]{7,40}")  # bandit/logs/schema.py code_version's commit part


def same_numbers(path: Path, data: bytes) -> bool:
    """True when the file at `path` holds `data` but for the code-version stamps: the same numbers, made at another
    commit. Such a file is kept as it is, so that it records the code version that first computed its numbers and a
    rerun of a documented command at any later commit leaves a shipped file byte-identical (docs/DESIGN.md, Outputs)."""
    try:
        old = path.read_bytes()
    except OSError:
        return False
    return old == data or STAMP.sub(rb"\1+g", old) == STAMP.sub(rb"\1+g", data)


def write_all(files: Sequence[tuple[Path, bytes | str]], report: str = "", stamps: bool = False) -> list[Path]:
    """Write every (path, content) through bandit/logs/safeio.py; none if any path is a symlink. A file system refusal
    raises WriteFailed carrying `report` (so a command prints what it computed before the error line). A file whose
    content differs only in its code-version stamp is left untouched (`same_numbers`), unless `stamps` (a text that
    quotes other files' stamps, as paper/build.py's do: there a stamp is content). Returns the paths written, not
    those left untouched (`wrote` says which were which)."""
    written = []
    try:
        for path, _ in files:
            if Path(path).is_symlink():
                raise FileExistsError(17, "a symlink stands there: not written through", str(path))
        for path, content in files:
            data = encode(content) if isinstance(content, str) else content
            if not stamps and same_numbers(Path(path), data):
                continue
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_file(Path(path), lambda f, d=data: f.write(d))
            written.append(Path(path))
    except OSError as e:
        raise WriteFailed(e, report) from None
    return written


def wrote(paths: Sequence[Path], written: Sequence[Path]) -> str:
    """The line a command prints after `write_all(paths)` returned `written`: the files it wrote, and those it kept
    because they hold the same numbers (a rerun must not say it wrote a shipped file it left byte for byte)."""
    done = {Path(p) for p in written}
    new, kept = [str(p) for p in paths if Path(p) in done], [str(p) for p in paths if Path(p) not in done]
    said = [f"wrote {_and(new)}"] if new else []
    said += [f"kept {_and(kept)}: the same numbers"] if kept else []
    return "; ".join(said) + "\n"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def dumps(obj) -> str:
    """JSON text that is valid JSON (no NaN, no Infinity: a ValueError names the bug)."""
    return json.dumps(obj, allow_nan=False)


# ---------------------------------------------------------------- reading what a file records


def _png_text(data: bytes) -> dict[str, str]:
    out, i = {}, 8
    while i + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[i : i + 8])
        body = data[i + 8 : i + 8 + n]
        if kind == b"tEXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            out[k.decode("latin-1")] = v.decode("latin-1")
        elif kind == b"zTXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            out[k.decode("latin-1")] = zlib.decompress(v[1:]).decode("latin-1")
        i += 12 + n
    return out


def recorded(path: Path) -> str | None:
    """The command a generated file records, or None (no record, or unreadable)."""
    path = Path(path)
    if path.name in RECORDED_IN:
        path = path.with_name(RECORDED_IN[path.name])
    try:
        if path.suffix == ".png":
            d = _png_text(path.read_bytes()).get("Description", "")
            return d[len(HEADER) - 2 :] if d.startswith(HEADER[2:]) else None
        if path.suffix == ".json":
            obj = json.loads(path.read_text())
            cmds = {e.get("command") for e in obj} if isinstance(obj, list) else {obj.get("command")}
            return cmds.pop() if len(cmds) == 1 and isinstance(next(iter(cmds)), str) else None
        first = path.read_text(errors="replace").split("\n", 1)[0]
        return first[len(HEADER) :] if first.startswith(HEADER) else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def check_commands(run: Path, published: bool = True) -> list[str]:
    """A problem line for each of a campaign's generated files whose recorded command is not the documented one:
    the published campaign's names no path; any other run's (`published=False`: a further campaign README shows)
    names the run's path as `command()` records it, so a file made for the published campaign is stale there."""
    named = "" if published else " " + shlex.quote(show(run))
    out = []
    for name, doc in DOCUMENTED.items():
        cmd = doc + named
        p = Path(run) / name
        if not p.exists():
            continue
        got = recorded(p)
        if got != cmd:
            said = "records no command" if got is None else f"was made by `{got}`"
            out.append(f"{show(p)} {said}; its documented command is `{cmd}` (run it to remake the file)")
    return out
