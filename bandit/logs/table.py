"""The block table: every record of a set of logs as plain numpy arrays, and where they came from.

What every analysis reads; `bandit.logs.reader.load_logs` builds it from JSON lines or Parquet files: each
file's validated columns (bandit/logs/records.py, bandit/logs/columnar.py) are put together by `assemble`,
the one place that orders records and finds a record logged twice. `table_from_records` builds the
same table the slow, obvious way (the tests' reference). `LogError` is every loader's error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bandit.logs.errors import InputError, UsageError
from bandit.logs.schema import FEATURES, draft_features


class LogError(InputError):
    """A problem in a log, located: `PATH:LINE: FIELD: problem` (LINE 0 = the file as a whole)."""

    def __init__(self, path: str | Path, line: int, field: str, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        super().__init__(f"{self.path}:{line}: {field}: {problem}")

    def __reduce__(self):  # picklable with its four fields: a worker process's error reaches the parent whole
        return (type(self), (self.path, self.line, self.field, self.problem))


@dataclass(frozen=True)
class LogSource:
    """One input file: its path, content hash and record count."""

    path: str
    sha256: str
    n_records: int


@dataclass(frozen=True, eq=False)
class BlockTable:
    """Every record of a set of logs as arrays; R records, D drafters, F = 4 features.

    Records are sorted by (workload, prompt_id, pos). `prompt` indexes the prompt clusters
    (the bootstrap's default resampling unit); a prompt id is unique within its workload.
    """

    drafters: tuple[str, ...]  # D drafter names, sorted
    workloads: tuple[str, ...]  # W workload names, sorted
    prompt_ids: tuple[str, ...]  # P cluster names "workload/prompt_id", sorted
    workload: np.ndarray  # (R,) int32: index into workloads
    prompt: np.ndarray  # (R,) int32: index into prompt_ids
    pos: np.ndarray  # (R,) int64: output position of the block's first token
    block: np.ndarray  # (R,) int64: block index, -1 where the record has none
    accepted: np.ndarray  # (R, D) int32: accepted draft tokens (bonus excluded)
    draft_len: np.ndarray  # (R, D) int32: len(tokens)
    expected_accepted: np.ndarray  # (R, D) float64: NaN where not logged
    features: np.ndarray  # (R, D, F) float64: FEATURES of each draft
    ms: np.ndarray  # (R, D) float64: drafter wall ms, NaN where not logged
    target_ms: np.ndarray  # (R,) float64: verify wall ms, NaN where not logged
    label: str = "UNLABELLED"  # MEASURED | SIM | UNLABELLED (no manifest)
    manifests: tuple[dict, ...] = ()  # the manifests of the runs read
    sources: tuple[LogSource, ...] = ()
    dense: bool = False  # every prompt has a record at every position 0..n-1
    # What a run's live phase measured (bandit/live/primary.py `attach`; None without one). Per prompt, so that a
    # resample re-chooses the primary from the prompts it draws: fixed:d's output tokens and wall ms on each
    # live-sampled prompt (0 elsewhere), and the timing model fitted on every live decode with its per-prompt
    # prefill term. `primary_rule` names how the primary is chosen ("" = the token proxy of the log's kind).
    live_tokens: np.ndarray | None = None  # (P, D) float64
    live_ms: np.ndarray | None = None  # (P, D) float64
    prefill_ms: np.ndarray | None = None  # (P,) float64: the timing model's prefill term of each prompt
    timing_model: Any = None  # bandit.timingmodel.TimingModel over `drafters`, or None
    primary_rule: str = ""

    def __post_init__(self):
        # per-prompt fields must follow any re-indexing of the prompts (take_prompts does; a caller that rebuilds
        # prompt_ids by hand must drop or carry them, or every primary chosen from them would be misread)
        P = len(self.prompt_ids)
        for k in ("live_tokens", "live_ms", "prefill_ms"):
            v = getattr(self, k)
            if v is not None and v.shape[0] != P:
                raise ValueError(
                    f"BlockTable.{k} has {v.shape[0]} prompts, the table {P}: re-index it with the prompts"
                )

    @property
    def n_records(self) -> int:
        return int(self.pos.shape[0])

    @property
    def has_block_flags(self) -> bool:
        return bool((self.block >= 0).any())

    @property
    def is_block_start(self) -> np.ndarray:
        """(R,) bool: block starts; every record of a prompt none of whose records has `block`.

        Decided per prompt, so that pooling a flagged (sparse-trajectory) log with an unflagged
        one keeps the unflagged one's records as blocks.
        """
        flagged = np.zeros(len(self.prompt_ids), bool)
        flagged[self.prompt[self.block >= 0]] = True
        return (self.block >= 0) | ~flagged[self.prompt]

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_ids)

    def take(self, idx: np.ndarray) -> "BlockTable":
        """Rows `idx` (bool mask or sorted indices); names, provenance and flags kept."""
        rows = {k: getattr(self, k)[idx] for k in ROW_FIELDS}
        return replace(self, **rows, dense=is_dense(rows["prompt"], rows["pos"]))

    def take_prompts(self, keep: np.ndarray) -> "BlockTable":
        """The records of the prompts with keep[prompt] (keep: (P,) bool), prompts re-indexed 0..P'-1."""
        keep = np.asarray(keep, bool)
        new = np.cumsum(keep) - 1
        sub = self.take(keep[self.prompt])
        per_prompt = {k: getattr(self, k)[keep] for k in PROMPT_FIELDS if getattr(self, k) is not None}
        return replace(
            sub,
            prompt=new[sub.prompt].astype(np.int32),
            prompt_ids=tuple(p for p, k in zip(self.prompt_ids, keep) if k),
            **per_prompt,
        )

    def blocks(self) -> "BlockTable":
        """The block starts only (the set B of docs/DESIGN.md's definitions)."""
        return self.take(self.is_block_start)

    def select_drafters(self, names: Sequence[str]) -> "BlockTable":
        missing = [n for n in names if n not in self.drafters]
        if missing:
            raise KeyError(f"drafters not in the logs: {', '.join(missing)}; present: {', '.join(self.drafters)}")
        j = [self.drafters.index(n) for n in names]
        cols = {k: getattr(self, k)[:, j] for k in DRAFTER_FIELDS}
        cols |= {k: getattr(self, k)[:, j] for k in ("live_tokens", "live_ms") if getattr(self, k) is not None}
        tm = None if self.timing_model is None else self.timing_model.select(names)
        return replace(self, drafters=tuple(names), timing_model=tm, **cols)

    def summary(self) -> str:
        kind = "dense" if self.dense else "sparse"
        what = "one per output position" if self.dense else f"{int(self.is_block_start.sum())} block starts"
        return (
            f"{self.n_records} records ({what}), {self.n_prompts} prompts, "
            f"{len(self.workloads)} workloads ({', '.join(self.workloads)}), "
            f"{len(self.drafters)} drafters ({', '.join(self.drafters)}), {kind}, [{self.label}]"
        )


# The per-record arrays of a BlockTable, and those of them with a drafter axis
ROW_FIELDS = (
    "workload",
    "prompt",
    "pos",
    "block",
    "accepted",
    "draft_len",
    "expected_accepted",
    "features",
    "ms",
    "target_ms",
)
DRAFTER_FIELDS = ("accepted", "draft_len", "expected_accepted", "features", "ms")
PROMPT_FIELDS = ("live_tokens", "live_ms", "prefill_ms")  # per-prompt arrays (None when not attached)


def is_dense(prompt: np.ndarray, pos: np.ndarray) -> bool:
    """Every prompt's positions are exactly 0..n-1 (records are sorted by prompt, pos)."""
    if prompt.size == 0:
        return False
    starts = np.r_[0, np.flatnonzero(np.diff(prompt)) + 1]
    expect = np.arange(prompt.size) - np.repeat(starts, np.diff(np.r_[starts, prompt.size]))
    return bool(np.array_equal(pos, expect))


def first_gap(t: BlockTable) -> str:
    """The first prompt whose positions are not 0..n-1, said in words."""
    starts = np.r_[0, np.flatnonzero(np.diff(t.prompt)) + 1]
    for a, b in zip(starts, np.r_[starts[1:], t.prompt.size]):
        want = np.arange(b - a)
        if not np.array_equal(t.pos[a:b], want):
            miss = int(want[np.flatnonzero(t.pos[a:b] != want)[0]])
            return f"prompt {t.prompt_ids[t.prompt[a]]} has no record at position {miss}"
    return "its positions are not 0..n-1 in every prompt"


# ---------------------------------------------------------------- building a table


def assemble(parts: list, names: Sequence[str]) -> BlockTable:
    """One table from every file's validated records (`bandit.logs.records.Keys`, in reading order) for drafters
    `names`: codes for names, records sorted, a record logged twice located (where first logged included).

    Allocates the table's arrays once and has each part fill its rows, then drops the part (the list is
    emptied): a campaign of many files never holds more than the table and one file's columns.
    """
    uniq = sorted(set(chain.from_iterable(p.pairs for p in parts)))
    workloads = tuple(sorted({w for w, _ in uniq}))
    pmap = {k: i for i, k in enumerate(uniq)}
    wmap = {w: i for i, w in enumerate(workloads)}
    starts = np.cumsum([0] + [p.n for p in parts])
    R, D = int(starts[-1]), len(names)
    prompt, pos = np.empty(R, np.int32), np.empty(R, np.int64)
    for p, s in zip(parts, starts):
        prompt[s : s + p.n] = np.fromiter(map(pmap.__getitem__, p.pairs), np.int32, len(p.pairs))[p.code]
        pos[s : s + p.n] = p.pos
    dp = np.diff(prompt)
    inv = None  # records already in order, no key twice: the stable sort below would be the identity
    if not ((dp > 0) | ((dp == 0) & (np.diff(pos) > 0))).all():
        order = np.lexsort((pos, prompt))  # stable: equal keys keep reading order
        _no_duplicates(parts, starts, prompt, pos, order, uniq)
        prompt, pos = prompt[order], pos[order]
        inv = np.empty(R, np.int64)
        inv[order] = np.arange(R)
    del dp
    out = value_arrays(R, D)
    for k, s in enumerate(starts[:-1]):
        n = parts[k].n
        parts[k].fill(out, slice(s, s + n) if inv is None else inv[s : s + n], names)
        parts[k] = None
    parts.clear()
    out |= dict(workload=np.fromiter((wmap[w] for w, _ in uniq), np.int32, len(uniq))[prompt], prompt=prompt, pos=pos)
    ids = tuple(f"{w}/{p}" for w, p in uniq)
    return BlockTable(drafters=tuple(names), workloads=workloads, prompt_ids=ids, dense=is_dense(prompt, pos), **out)


def value_arrays(n: int, D: int) -> dict[str, np.ndarray]:
    """Uninitialised arrays for the values of n records, D drafters (the BlockTable fields a file fills)."""
    shapes = {1: (n,), 2: (n, D), 3: (n, D, len(FEATURES))}
    return {k: np.empty(shapes[r], t) for k, (t, r) in _VALUES.items()}


_VALUES = {"block": (np.int64, 1), "target_ms": (np.float64, 1), "accepted": (np.int32, 2), "draft_len": (np.int32, 2)}
_VALUES |= {"expected_accepted": (np.float64, 2), "ms": (np.float64, 2), "features": (np.float64, 3)}


def _no_duplicates(parts, starts, prompt, pos, order, uniq) -> None:
    """Raise at the first record, in reading order, whose (workload, prompt_id, pos) was read before."""
    dup = (np.diff(prompt[order]) == 0) & (np.diff(pos[order]) == 0)
    if not dup.any():
        return
    i = int(order[1:][dup].min())
    k = int(np.flatnonzero(order == i)[0])
    while k > 1 and prompt[order[k - 2]] == prompt[i] and pos[order[k - 2]] == pos[i]:
        k -= 1
    j = int(order[k - 1])  # the first record of that key (the sort is stable)
    ki, kj = (int(np.searchsorted(starts, r, "right")) - 1 for r in (i, j))  # the parts they are in
    w, p = uniq[prompt[i]]
    why = f"duplicate record for workload={w!r} prompt_id={p!r} pos={pos[i]}"
    raise parts[ki].error(i - int(starts[ki]), "pos", f"{why} (first at {parts[kj].where(j - int(starts[kj]))})")


def table_from_records(recs: list[tuple[Path, int, dict]], drafters: Sequence[str] | None) -> BlockTable:
    """The table of checked records (path, line, record) the slow, obvious way, one dict at a time."""
    if not recs:
        raise LogError("<inputs>", 0, "records", "no records: the logs are empty")
    present = [set(r["drafts"]) for _, _, r in recs]
    everywhere = set.intersection(*present)
    if drafters:
        for n in drafters:
            if n not in everywhere:
                p, ln, _ = next((p, ln, r) for (p, ln, r), s in zip(recs, present) if n not in s)
                raise LogError(p, ln, f"drafts.{n}", "requested drafter missing in this record")
        names = tuple(drafters)
    else:
        union = set.union(*present)
        if union != everywhere:
            (p, ln, _), s = next(((x, s) for x, s in zip(recs, present) if s != union))
            why = f"drafter missing in this record (present everywhere: {sorted(everywhere)}; pick a subset with --drafters)"
            raise LogError(p, ln, f"drafts.{sorted(union - s)[0]}", why)
        names = tuple(sorted(union))
    keys = {}
    for p, ln, r in recs:
        k = (r["workload"], r["prompt_id"], r["pos"])
        if k in keys:
            why = f"duplicate record for workload={k[0]!r} prompt_id={k[1]!r} pos={k[2]}"
            raise LogError(p, ln, "pos", f"{why} (first at {keys[k][0]}:{keys[k][1]})")
        keys[k] = (p, ln)
    recs = sorted(recs, key=lambda x: (x[2]["workload"], x[2]["prompt_id"], x[2]["pos"]))
    R, D = len(recs), len(names)
    workloads = tuple(sorted({r["workload"] for _, _, r in recs}))
    prompt_ids = tuple(sorted({f"{r['workload']}/{r['prompt_id']}" for _, _, r in recs}))
    widx, pidx = {w: i for i, w in enumerate(workloads)}, {p: i for i, p in enumerate(prompt_ids)}
    v = value_arrays(R, D) | {"workload": np.empty(R, np.int32), "prompt": np.empty(R, np.int32)}
    v["pos"] = np.empty(R, np.int64)
    for i, (_, _, r) in enumerate(recs):
        v["workload"][i], v["prompt"][i] = widx[r["workload"]], pidx[f"{r['workload']}/{r['prompt_id']}"]
        v["pos"][i], v["block"][i], v["target_ms"][i] = r["pos"], r.get("block", -1), r.get("target_ms", np.nan)
        for j, n in enumerate(names):
            d = r["drafts"][n]
            v["accepted"][i, j], v["draft_len"][i, j] = d["accepted"], len(d["tokens"])
            v["expected_accepted"][i, j], v["ms"][i, j] = d.get("expected_accepted", np.nan), d.get("ms", np.nan)
            v["features"][i, j] = draft_features(d["conf"], d["entropy"])
    dense = is_dense(v["prompt"], v["pos"])
    return BlockTable(drafters=names, workloads=workloads, prompt_ids=prompt_ids, dense=dense, **v)


def drafter_names(value: str | None, flag: str = "--drafters") -> list[str] | None:
    """An option's comma-separated drafter names; None when the option is absent. An empty list, or an empty name
    between commas, is refused: `--drafters ''` is a mistake, never the default (all drafters)."""
    if value is None:
        return None
    names = [d.strip() for d in value.split(",")]
    if not all(names):
        raise UsageError(f"{flag} {value!r}: expected comma-separated drafter names, e.g. ngram,eagle")
    return names
