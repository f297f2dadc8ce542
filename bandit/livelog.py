"""The live phase's log read and checked: live.jsonl, one line per configuration and prompt, against the dense log.

`read_live` type-checks every field of every line (errors name the run's file and line);
`decodes` pairs each live decode with what the dense log says of the same prompt along the same
configuration's trajectory: the design rows of bandit/wallclock.py's timing model.

    python bandit/livelog.py [RUN]     # how many decodes of each configuration the run's live phase holds
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/livelog.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
import sys
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bandit import trajectory
from bandit.logs import LogError
from bandit.table import BlockTable

LIVE_FILE = "live.jsonl"
TERMS = ("prefill", "prompt_token", "pass", "verified_token")  # then one call-time term per drafter


@dataclass(frozen=True)
class Decode:
    """One live decode (a line of live.jsonl) beside what the dense log says of the same one."""

    config: str
    cluster: int  # index into BlockTable.prompt_ids
    workload: int
    tokens: int  # live output tokens
    dense_tokens: int  # the dense log's output tokens for the prompt (the prediction's numerator)
    wall_ms: float
    x_live: np.ndarray  # (len(TERMS) + D,) design row from the live decode
    x_dense: np.ndarray  # (len(TERMS) + D,) design row from the dense log's trajectory
    draft_ms: np.ndarray  # (D,) measured time in each drafter's calls, summed over the decode
    same_as_dense: bool


def read_live(run: Path) -> list[dict]:
    path = Path(run) / LIVE_FILE
    if not path.is_file():
        raise LogError(path, 0, "live.jsonl", "no live phase in this run (sweep.py --live-prompts N writes it)")
    out = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise LogError(path, line, "line", "not UTF-8 text") from None
    for i, raw in enumerate(text.splitlines(), 1):
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise LogError(path, i, "line", f"not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise LogError(path, i, "line", "not a JSON object")
        for f in (
            "config",
            "workload",
            "prompt_id",
            "prompt_len",
            "tokens",
            "passes",
            "verified",
            "calls",
            "wall_ms",
            "draft_ms",
        ):
            if f not in rec:
                raise LogError(path, i, f, "missing field")
        for f in ("config", "workload", "prompt_id"):
            if not isinstance(rec[f], str) or not rec[f]:
                raise LogError(path, i, f, f"{rec[f]!r} is not a name")
        for f in ("prompt_len", "tokens", "passes", "verified"):
            if not _count(rec[f]):
                raise LogError(path, i, f, f"{rec[f]!r} is not a count")
        w = rec["wall_ms"]
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            raise LogError(path, i, "wall_ms", f"{w!r} is not a positive number")
        if not isinstance(rec["calls"], dict) or not all(_count(v) for v in rec["calls"].values()):
            raise LogError(path, i, "calls", f"{rec['calls']!r} is not an object of call counts")
        dm = rec["draft_ms"]
        if not isinstance(dm, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in dm.values()
        ):
            raise LogError(path, i, "draft_ms", f"{dm!r} is not an object of times in ms (finite, >= 0)")
        rec["_line"] = i
        out.append(rec)
    if not out:
        raise LogError(path, 0, "live.jsonl", "empty")
    seen: dict[tuple[str, str], set[str]] = {}
    for i, rec in enumerate(out, 1):
        key = (rec["workload"], rec["prompt_id"])
        if rec["config"] in seen.setdefault(key, set()):
            raise LogError(path, i, "config", f"{rec['config']} on {key[0]}/{key[1]} a second time")
        seen[key].add(rec["config"])
    configs = set().union(*seen.values())
    for key, got in seen.items():
        if got != configs:
            raise LogError(
                path,
                0,
                "config",
                f"{key[0]}/{key[1]} lacks {sorted(configs - got)}: every prompt of the "
                "live phase needs every configuration (an unfinished live phase: resume the sweep)",
            )
    return out


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _trajectory_counts(t: BlockTable, config: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(passes (P,), verified tokens (P,), calls (P, D)) of `config` walked on the dense log."""
    D = len(t.drafters)
    if config == "best_of_n":
        starts, passes = trajectory.walk(t, lambda r: t.accepted[r].max(1))
        used = np.ones(D, bool)
    elif config.startswith("fixed:") and config[6:] in t.drafters:
        d = t.drafters.index(config[6:])
        starts, passes = trajectory.walk(t, lambda r: t.accepted[r, d])
        used = np.arange(D) == d
    else:
        raise LogError(LIVE_FILE, 0, "config", f"{config!r} names none of this log's drafters {list(t.drafters)}")
    verified = np.bincount(t.prompt[starts], 1 + t.draft_len[starts][:, used].sum(1), minlength=t.n_prompts)
    return passes, verified.astype(np.int64), passes[:, None] * used[None, :]


def decodes(t: BlockTable, live: list[dict], path: Path | str = LIVE_FILE) -> list[Decode]:
    trajectory.require_dense(t)
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    counts = {}
    for r in live:
        if r["config"] not in counts:
            try:
                counts[r["config"]] = _trajectory_counts(t, r["config"])
            except LogError as e:
                raise LogError(path, r.get("_line", 0), "config", e.problem) from None
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    lengths = trajectory.output_lengths(t)
    out = []
    for r in live:
        key = f"{r['workload']}/{r['prompt_id']}"
        if key not in index:
            raise LogError(path, r.get("_line", 0), "prompt_id", f"prompt {key} is not in the dense log")
        p = index[key]
        passes, verified, calls = counts[r["config"]]
        x_live = np.r_[
            1.0, r["prompt_len"], r["passes"], r["verified"], [r["calls"].get(d, 0) for d in t.drafters]
        ].astype(float)
        x_dense = np.r_[1.0, r["prompt_len"], passes[p], verified[p], calls[p]].astype(float)
        dms = np.array([float(r.get("draft_ms", {}).get(d, 0.0)) for d in t.drafters])
        out.append(
            Decode(
                r["config"],
                p,
                int(wl_of[p]),
                int(r["tokens"]),
                int(lengths[p]),
                float(r["wall_ms"]),
                x_live,
                x_dense,
                dms,
                bool(r.get("same_as_dense", True)),
            )
        )
    return out


if __name__ == "__main__":
    from collections import Counter

    from bandit.logs import default_campaign

    run = Path(sys.argv[1]) if len(sys.argv) > 1 else default_campaign()[0]
    live = read_live(run)
    print(
        f"{run / LIVE_FILE}: {len(live)} decodes; "
        + ", ".join(f"{c} {n}" for c, n in sorted(Counter(r["config"] for r in live).items()))
    )
