"""The live phase's log read and checked: live.jsonl, one line per configuration and prompt, against the dense log.

`load_live` is the one reader every command shares (ci, the live verdicts, wallclock, breakeven): `read_live`
type-checks every field of every line, `check_against` what the run's dense log can refute (errors name the run's
file and line);
`decodes` pairs each live decode with what the dense log says of the same prompt along the same
configuration's trajectory: the design rows of bandit/wallclock.py's timing model. Configurations
(bandit/logs/schema.py): `plain` (the target's own greedy loop), `fixed:<drafter>`, `best_of_n` and
`policy:<name>` (a policy of bandit/policies/livepolicies.py choosing the drafter per block, replayed on the
dense log over the same prompts in the same order).

    python bandit/live/livelog.py [RUN]     # how many decodes of each configuration the run's live phase holds
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/live/livelog.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from bandit.stats import steps, trajectory
from bandit.logs.reader import LogError
from bandit.logs.schema import BEST_OF_N, FIXED, PLAIN, POLICY, Timing
from bandit.logs.table import BlockTable

LIVE_FILE = "live.jsonl"
COUNTS = ("decode", "prompt_len", "passes", "verified")  # a decode's count row, then its calls of each drafter
FIELDS = (
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
)


@dataclass(frozen=True)
class Decode:
    """One live decode (a line of live.jsonl) beside what the dense log says of the same one."""

    config: str
    cluster: int  # index into BlockTable.prompt_ids
    workload: int
    tokens: int  # live output tokens
    dense_tokens: int  # the dense log's output tokens for the prompt (the prediction's numerator)
    wall_ms: float
    x_live: np.ndarray  # (len(COUNTS) + D,) count row of the live decode: 1, prompt length, passes, verified, calls
    x_dense: np.ndarray  # (len(COUNTS) + D,) the same counts of the dense log's trajectory
    draft_ms: np.ndarray  # (D,) measured time in each drafter's calls, summed over the decode
    same_as_dense: bool
    chosen_live: np.ndarray | None = None  # (D,) policies: blocks per chosen drafter live (the line's `chosen`)
    chosen_dense: np.ndarray | None = None  # (D,) policies: the same in the replay on the dense log
    step_times: bool = False  # a policy told the measured step times live (`observe_step`): the replay is told
    # the Timing's instead, so its choices may differ from the live ones; every other configuration's may not
    steps: np.ndarray | None = None  # (K,) the dense trajectory's passes in the step basis, summed (stats/steps.py)

    @property
    def agrees(self) -> bool:
        """The live decode repeats its dense-log walk: the same output, passes, verified tokens and calls."""
        return self.same_as_dense and bool(np.array_equal(self.x_live, self.x_dense))


def design(d: Decode) -> np.ndarray:
    """The timing model's design row of decode d along its dense-log walk (bandit/live/timingmodel.py `fit`):
    1, prompt length, the step basis of its passes summed, its calls of each drafter."""
    return np.r_[d.x_dense[:2], d.steps, d.x_dense[len(COUNTS) :]]


class Walked(NamedTuple):
    """A configuration's counts along its own trajectory on the dense log, per table prompt."""

    passes: np.ndarray  # (P,)
    verified: np.ndarray  # (P,)
    calls: np.ndarray  # (P, D)
    chosen: np.ndarray | None  # (P, D) blocks per chosen drafter (policies), else None
    step_times: bool = False  # a policy that learns from measured step times (see Decode)
    steps: np.ndarray | None = None  # (P, K) its passes in the step basis (`steps.table_knots`), summed per prompt


def live_policies() -> tuple[str, ...]:
    """The policy names a `policy:<name>` line may carry (imported when a line has one: the policies'
    module is needed only for runs that decoded policies)."""
    from bandit.policies import livepolicies

    return tuple(livepolicies.LIVE_POLICIES)


def _config_problem(config: str, policies) -> str | None:
    """Why `config` is not a live configuration's name, or None. policies: a callable giving LIVE_POLICIES."""
    if config in (PLAIN, BEST_OF_N) or (config.startswith(FIXED) and len(config) > len(FIXED)):
        return None
    if config.startswith(POLICY):
        known = policies()
        if config[len(POLICY) :] in known:
            return None
        return f"{config!r} is not a live policy (bandit/policies/livepolicies.py LIVE_POLICIES: {', '.join(known)})"
    return f"{config!r} is none of {PLAIN}, {FIXED}<drafter>, {BEST_OF_N}, {POLICY}<policy>"


DAY_MS = 86_400_000.0  # no decode of one prompt takes a day
MIN_PASS_MS = 1e-3  # nor does a target pass take under a microsecond: a smaller wall_ms is corrupt, not fast
MAX_TOKENS = 2**20  # the output budget when the run records none
MAX_PROMPT_LEN = 2**31


def max_new_tokens(run: Path) -> int:
    """The run's output budget per prompt: the manifest's max_new_tokens, else settings.json's, else MAX_TOKENS."""
    for name in ("manifest.json", "settings.json"):
        try:
            v = json.loads((Path(run) / name).read_text()).get("max_new_tokens")
        except (OSError, ValueError, AttributeError):
            continue
        if _count(v) and 0 < v <= MAX_TOKENS:
            return v
    return MAX_TOKENS


def _check_ranges(rec: dict, path: Path, i: int, budget: int) -> None:
    """Every field within what one decode can be (located by line and field), beyond its type."""
    if rec["prompt_len"] >= MAX_PROMPT_LEN:
        raise LogError(path, i, "prompt_len", f"{rec['prompt_len']} is not below 2^31")
    if rec["tokens"] > budget:
        raise LogError(path, i, "tokens", f"{rec['tokens']} exceeds the run's max_new_tokens {budget}")
    if rec["passes"] > rec["tokens"]:  # every target pass emits at least one token
        raise LogError(path, i, "passes", f"{rec['passes']} target passes for {rec['tokens']} tokens")
    if rec["verified"] < rec["passes"]:  # every pass verifies at least its own token
        raise LogError(path, i, "verified", f"{rec['verified']} verified tokens in {rec['passes']} passes")
    if rec["wall_ms"] < MIN_PASS_MS * max(rec["passes"], 1):
        raise LogError(path, i, "wall_ms", f"{rec['wall_ms']!r} ms is under {MIN_PASS_MS} ms a target pass")
    if rec["wall_ms"] >= DAY_MS:
        raise LogError(path, i, "wall_ms", f"{rec['wall_ms']!r} ms is a day or more for one prompt")
    if any(v >= DAY_MS for v in rec["draft_ms"].values()):
        raise LogError(path, i, "draft_ms", f"{rec['draft_ms']!r}: a day or more of drafting for one prompt")
    if "same_as_dense" in rec and not isinstance(rec["same_as_dense"], bool):
        raise LogError(path, i, "same_as_dense", f"{rec['same_as_dense']!r} is not a boolean (true or false)")


def read_live(run: Path) -> list[dict]:
    path = Path(run) / LIVE_FILE
    if not path.is_file():
        raise LogError(path, 0, "live.jsonl", "no live phase in this run (sweep.py --live-prompts N writes it)")
    budget = max_new_tokens(run)
    out = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise LogError(path, line, "line", "not UTF-8 text") from None
    known: list[tuple[str, ...]] = []  # LIVE_POLICIES, imported at the first policy line

    def policies() -> tuple[str, ...]:
        if not known:
            known.append(live_policies())
        return known[0]

    for i, raw in enumerate(text.splitlines(), 1):
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise LogError(path, i, "line", f"not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise LogError(path, i, "line", "not a JSON object")
        for f in FIELDS:
            if f not in rec:
                raise LogError(path, i, f, "missing field")
        for f in ("config", "workload", "prompt_id"):
            if not isinstance(rec[f], str) or not rec[f] or not rec[f].isprintable():
                raise LogError(path, i, f, f"{rec[f]!r} is not a name (printable text, no control characters)")
        why = _config_problem(rec["config"], policies)
        if why:
            raise LogError(path, i, "config", why)
        for f in ("prompt_len", "tokens", "passes", "verified"):
            if not _count(rec[f]):
                raise LogError(path, i, f, f"{rec[f]!r} is not a count")
        w = rec["wall_ms"]
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            raise LogError(path, i, "wall_ms", f"{w!r} is not a positive number")
        # chosen: optional, a policy's blocks per drafter whose draft was verified
        for f, what in (("calls", "call counts"), ("chosen", "block counts per drafter")):
            if f in rec and not (isinstance(rec[f], dict) and all(_count(v) for v in rec[f].values())):
                raise LogError(path, i, f, f"{rec[f]!r} is not an object of {what}")
        dm = rec["draft_ms"]
        if not isinstance(dm, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in dm.values()
        ):
            raise LogError(path, i, "draft_ms", f"{dm!r} is not an object of times in ms (finite, >= 0)")
        if rec["config"] == PLAIN and any(rec["calls"].values()):  # the target's own loop drafts nothing
            raise LogError(path, i, "calls", f"{rec['calls']!r}: a plain decode calls no drafter")
        _check_ranges(rec, path, i, budget)
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


def load_live(run: Path, t: BlockTable) -> list[dict]:
    """The one reader of a run's live.jsonl every command shares (ci, the live verdicts, wallclock, breakeven):
    `read_live`'s per-line checks, then `check_against` the run's dense log t. A LogError names the line."""
    path = Path(run) / LIVE_FILE
    live = read_live(Path(run))
    check_against(t, live, path)
    return live


def _run_drafters(t: BlockTable) -> set[str]:
    """The drafters of the run t was read from (its manifest's; t's own when it has none): a table of some of them
    (`--drafters`) still reads live lines naming the others."""
    named = set(t.drafters)
    for m in t.manifests:
        if isinstance(m.get("drafters"), dict):
            named |= set(m["drafters"])
    return named


def prompt_lengths(run: Path) -> dict[str, int]:
    """Each prompt's length in tokens as the run's outputs*.jsonl record it (`workload/prompt_id` -> length;
    {} when the run has none or a line is unreadable: then only the live lines' agreement is checked)."""
    out: dict[str, int] = {}
    for f in sorted(Path(run).glob("outputs*.jsonl")):
        try:
            for raw in f.read_text(encoding="utf-8").splitlines():
                r = json.loads(raw)
                out[f"{r['workload']}/{r['prompt_id']}"] = len(r["prompt_ids"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return {}
    return out


def check_against(t: BlockTable, live: Sequence[dict], path: Path | str) -> None:
    """What a live line says that the run's dense log can refute, located by line: a `fixed:` drafter, `calls`,
    `chosen` or `draft_ms` key naming no drafter of the run; a prompt length that differs between configurations
    of one prompt or from the run's outputs; a decode marked the dense log's output with another token count."""
    drafters = _run_drafters(t)
    lengths = prompt_lengths(Path(path).parent)
    seen: dict[str, int] = {}
    for r in live:
        i, key = r.get("_line", 0), f"{r['workload']}/{r['prompt_id']}"
        if r["config"].startswith(FIXED) and r["config"][len(FIXED) :] not in drafters:
            raise LogError(path, i, "config", f"{r['config']!r} names no drafter of the run {sorted(drafters)}")
        for f in ("calls", "chosen", "draft_ms"):
            bad = sorted(set(r.get(f) or {}) - drafters)
            if bad:
                raise LogError(path, i, f, f"names {bad}, not among the run's drafters {sorted(drafters)}")
        want = lengths.get(key, seen.get(key))
        if want is not None and r["prompt_len"] != want:
            raise LogError(path, i, "prompt_len", f"{r['prompt_len']} for {key}, whose prompt has {want} tokens")
        seen.setdefault(key, r["prompt_len"])
    check_tokens(t, live, path)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def policy_timing(t: BlockTable) -> Timing:
    """The Timing a live policy was given at reset: the live phase's own `policy_timing` (measured before its
    decodes), else, for runs without one, the manifest's timing (docs/DESIGN.md, "Wall clock")."""
    m = t.manifests[0] if t.manifests else {}
    k = max(int(t.draft_len.max(initial=0)), 1)
    pt = (m.get("live") or {}).get("policy_timing")
    if pt:
        # lookups by the manifest's drafter kinds, as harness/decode/livephase.py builds the live policies' Timing
        return Timing.from_manifest({"k": m.get("k"), "drafters": m.get("drafters"), "timing": pt}, t.drafters, k=k)
    return Timing.from_manifest(m, t.drafters, k=k)


def live_order(t: BlockTable, live: Sequence[dict], config: str) -> list[int]:
    """Table prompt indices of `config`'s decodes in the order live.jsonl holds them (the decode order)."""
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    return [index[f"{r['workload']}/{r['prompt_id']}"] for r in live if r["config"] == config]


def _trajectory_counts(t: BlockTable, config: str, prompts: Sequence[int] = (), timing: Timing | None = None) -> Walked:
    """`config` walked on the dense log; a policy over `prompts` (in live order) with `timing`, as
    bandit/policies/livepolicies.py replays it."""
    D = len(t.drafters)
    knots = steps.table_knots(t)
    if config == PLAIN:  # one 1-token forward per output token, nothing drafted
        n = trajectory.output_lengths(t)
        return Walked(
            n, n.copy(), np.zeros((t.n_prompts, D), np.int64), None, steps=np.outer(n, steps.basis([1], knots)[0])
        )
    if config.startswith(POLICY):
        from bandit.policies import livepolicies

        timing = timing or policy_timing(t)
        policy = livepolicies.make(config[len(POLICY) :], t, timing)  # built once: it may fit a model
        c = livepolicies.replay(t, policy, list(prompts), timing, knots=knots)
        as_int = lambda a: np.asarray(a, np.int64)
        return Walked(
            as_int(c.passes),
            as_int(c.verified),
            as_int(c.calls),
            as_int(c.chosen),
            hasattr(policy, "observe_step"),
            c.steps,
        )
    if config == BEST_OF_N:
        starts, passes = trajectory.walk(t, lambda r: t.accepted[r].max(1))
        used = np.ones(D, bool)
    elif config.startswith(FIXED) and config[len(FIXED) :] in t.drafters:
        d = t.drafters.index(config[len(FIXED) :])
        starts, passes = trajectory.walk(t, lambda r: t.accepted[r, d])
        used = np.arange(D) == d
    else:
        raise LogError(LIVE_FILE, 0, "config", f"{config!r} names none of this log's drafters {list(t.drafters)}")
    q = 1 + t.draft_len[starts][:, used].sum(1)
    verified = np.bincount(t.prompt[starts], q, minlength=t.n_prompts)
    basis = steps.summed(q, t.prompt[starts], t.n_prompts, knots)
    return Walked(passes, verified.astype(np.int64), passes[:, None] * used[None, :], None, steps=basis)


def check_tokens(t: BlockTable, live: Sequence[dict], path: Path | str = LIVE_FILE) -> None:
    """A decode marked equal to the dense log's output (`same_as_dense`, the default) has its length: refused
    otherwise, located (prompts outside the table are not checked here)."""
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    lengths = trajectory.output_lengths(t) if t.dense else None
    for r in live:
        p = index.get(f"{r['workload']}/{r['prompt_id']}")
        if lengths is not None and p is not None and r.get("same_as_dense", True) and r["tokens"] != lengths[p]:
            raise LogError(
                path,
                r.get("_line", 0),
                "tokens",
                f"{r['tokens']} tokens, but the output is marked the dense log's, which has {lengths[p]}",
            )


def decodes(t: BlockTable, live: list[dict], path: Path | str = LIVE_FILE) -> list[Decode]:
    trajectory.require_dense(t)
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    for r in live:
        key = f"{r['workload']}/{r['prompt_id']}"
        if key not in index:
            raise LogError(path, r.get("_line", 0), "prompt_id", f"prompt {key} is not in the dense log")
        for f in ("calls", "chosen"):
            bad = sorted(set(r.get(f) or {}) - set(t.drafters))
            if bad:
                raise LogError(path, r.get("_line", 0), f, f"names {bad}, not among the dense log's drafters")
    check_tokens(t, live, path)
    counts = {}
    timing = policy_timing(t) if any(r["config"].startswith(POLICY) for r in live) else None
    for r in live:
        if r["config"] not in counts:
            try:
                counts[r["config"]] = _trajectory_counts(t, r["config"], live_order(t, live, r["config"]), timing)
            except LogError as e:
                raise LogError(path, r.get("_line", 0), "config", e.problem) from None
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    lengths = trajectory.output_lengths(t)
    out = []
    for r in live:
        p = index[f"{r['workload']}/{r['prompt_id']}"]
        passes, verified, calls, chosen, step_times, basis = counts[r["config"]]
        x_live = np.r_[
            1.0, r["prompt_len"], r["passes"], r["verified"], [r["calls"].get(d, 0) for d in t.drafters]
        ].astype(float)
        x_dense = np.r_[1.0, r["prompt_len"], passes[p], verified[p], calls[p]].astype(float)
        dms = np.array([float(r.get("draft_ms", {}).get(d, 0.0)) for d in t.drafters])
        live_chosen = r.get("chosen")
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
                None if live_chosen is None else np.array([live_chosen.get(d, 0) for d in t.drafters], np.int64),
                None if chosen is None else chosen[p].copy(),
                step_times,
                basis[p].copy(),
            )
        )
    return out


if __name__ == "__main__":
    from bandit.logs.reader import demo
    from collections import Counter

    from bandit.logs.reader import load_logs

    def body(files, said: str) -> None:
        live = load_live(files[0].parent, load_logs(files))
        print(
            f"{files[0].parent / LIVE_FILE}: {len(live)} decodes; "
            + ", ".join(f"{c} {n}" for c, n in sorted(Counter(r["config"] for r in live).items()))
        )

    demo(body, "How many decodes of each configuration the run's live phase holds.")
