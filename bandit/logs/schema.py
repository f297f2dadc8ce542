"""What the collection harness and the analysis share: the block log's schema version, the draft
features, which drafters are lookups, what a policy sees and is told, and the code version.

The bottom layer of the project (docs/DESIGN.md, "Layout"): it imports no other module of
`bandit` or `harness`, and both packages import it, so a feature or a lookup kind is defined here
and nowhere else.

    python bandit/logs/schema.py      # the schema constants and the features of an example draft
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/logs/schema.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence

import numpy as np

SCHEMA_VERSION = 1  # the `v` of every block-log record this code writes and reads
FEATURES = ("conf_mean", "conf_min", "conf_first", "ent_mean")  # per draft, docs/DESIGN.md "Draft features"
# An empty draft (no proposal) has zero confidence and zero entropy: a selector then sees "no
# confidence" for a drafter that had nothing to say, which is what it is.
EMPTY_DRAFT_FEATURES = (0.0, 0.0, 0.0, 0.0)
LABELS = ("MEASURED", "SIM", "UNLABELLED")  # a run's label (manifest `label`); UNLABELLED: no manifest
# Drafter kinds whose draft costs next to nothing and is known before a policy chooses: the
# harness's n-gram and suffix lookups (harness/drafters/lookup.py, suffix.py), decided by kind, never by name.
LOOKUP_KINDS = ("ngram", "suffix")


# ---------------------------------------------------------------- draft features


def features(conf: np.ndarray, entropy: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(n, 4) FEATURES of n drafts whose confidences and entropies lie end to end, `lengths` (n,) long.

    The one implementation: the log readers call it on whole columns and the harness on one draft
    (`draft_features`), so that a feature seen live equals the one replayed to the last bit.
    """
    conf, entropy = np.asarray(conf, np.float64), np.asarray(entropy, np.float64)
    lengths = np.asarray(lengths, np.int64)
    f = np.tile(np.asarray(EMPTY_DRAFT_FEATURES), (len(lengths), 1))
    nz = lengths > 0
    if nz.any():
        start = (np.cumsum(lengths) - lengths)[nz]  # empty drafts add no values, so reduceat's segments are exact
        f[nz, 0] = np.add.reduceat(conf, start) / lengths[nz]
        f[nz, 1] = np.minimum.reduceat(conf, start)
        f[nz, 2] = conf[start]
        f[nz, 3] = np.add.reduceat(entropy, start) / lengths[nz]
    return f


def draft_features(conf: Sequence[float], entropy: Sequence[float]) -> tuple[float, float, float, float]:
    """FEATURES of one draft (EMPTY_DRAFT_FEATURES when it is empty); `features` on a single row."""
    row = features(np.asarray(conf, np.float64), np.asarray(entropy, np.float64), np.array([len(conf)]))[0]
    return (float(row[0]), float(row[1]), float(row[2]), float(row[3]))


def _positive_setting(drafters: Sequence[str], entries: Mapping[str, Mapping] | None, key: str) -> tuple[str, ...]:
    """The drafters of `drafters` whose manifest entry (`entries`) sets `key` to a number > 0."""
    out = []
    for d in drafters:
        e = (entries or {}).get(d) or {}
        settings = e.get("settings") if isinstance(e, Mapping) else None
        v = settings.get(key) if isinstance(settings, Mapping) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out.append(d)
    return tuple(out)


def stopping_drafters(drafters: Sequence[str], entries: Mapping[str, Mapping] | None) -> tuple[str, ...]:
    """The drafters of `drafters` whose manifest entry sets `stop_below` > 0: chain drafters that end a draft
    early at a low-confidence token (harness/drafters/model.py), so that their logged draft length is known only
    after they draft."""
    return _positive_setting(drafters, entries, "stop_below")


def tree_drafters(drafters: Sequence[str], entries: Mapping[str, Mapping] | None) -> tuple[str, ...]:
    """The drafters of `drafters` whose manifest entry sets `tree` > 0: drafters of a tree of that many tokens
    (harness/drafters/eagle3.py), whose logged draft length is the tree's size, known before they draft, not the
    depth a chain drafter is asked for."""
    return _positive_setting(drafters, entries, "tree")


def lookup_drafters(drafters: Sequence[str], entries: Mapping[str, Mapping] | None) -> tuple[str, ...]:
    """The drafters of `drafters` that are lookups, by a run manifest's drafter entries (`entries`).

    An entry's explicit `lookup` (true or false) decides; else a drafter is a lookup when its `kind`
    or its name is one of LOOKUP_KINDS (exact words: a name that merely contains one is not).
    """
    out = []
    for d in drafters:
        e = (entries or {}).get(d) or {}
        flag = e.get("lookup") if isinstance(e, Mapping) else None
        if isinstance(flag, bool):
            if flag:
                out.append(d)
            continue
        kind = str(e.get("kind", "")).lower() if isinstance(e, Mapping) else ""
        if kind in LOOKUP_KINDS or d.lower() in LOOKUP_KINDS:
            out.append(d)
    return tuple(out)


# ---------------------------------------------------------------- live configurations (live.jsonl `config`)

PLAIN = "plain"  # the target's own greedy loop, no drafter
FIXED = "fixed:"  # + drafter name: that drafter alone
BEST_OF_N = "best_of_n"  # every drafter drafts, one tree forward verifies all, the longest accepted advances
POLICY = "policy:"  # + policy name (bandit/policies/livepolicies.py): the policy chooses the drafter per block


# ---------------------------------------------------------------- what a policy sees and is told


@dataclass
class Context:
    """What a policy may see BEFORE drafting at a block start (NaN = unknown), live and in replay alike."""

    workload: int  # index into the workloads given to `Policy.reset` (-1: not among them)
    prompt: int  # running prompt index
    pos: int  # output position of the block's first token
    prev_accepted: np.ndarray  # (D,) previous block's accepted per drafter; NaN if unobserved or the first block
    prev_features: np.ndarray  # (D, 4) previous block's FEATURES per drafter; NaN if unobserved or the first block
    draft_len: np.ndarray  # (D,) lookups: their actual draft length here; others: the length asked for
    draft_features: np.ndarray | None = None  # (D, 4) lookups: FEATURES of their draft here (known before
    # choosing); NaN for the other drafters. None: not given (a caller that predates it)


@dataclass(frozen=True)
class Timing:
    """What a policy is told at reset: the draft length and the measured step costs of the run.

    From a run manifest's `timing` (docs/manifest.md) by `Timing.from_manifest`; `Timing()` when a
    run has none (then `measured` is False and a cost-aware policy falls back to its proxy).
    """

    k: int = 0  # maximum draft length; 0: unknown (a policy learns it from the first drafts)
    lookup: tuple[str, ...] = ()  # drafters whose draft is known before choosing (LOOKUP_KINDS)
    verify_tokens: tuple[float, ...] = ()  # verified tokens of the timed verification passes, ascending
    verify_ms: tuple[float, ...] = ()  # ms of one verification pass of that many tokens
    batch_drafts: tuple[float, ...] = ()  # drafts verified together in the timed union-verification passes
    batch_ms: tuple[float, ...] = ()  # ms of one such pass
    drafter_ms: Mapping[str, float] = field(default_factory=dict)  # drafter name -> ms of one draft call

    @property
    def measured(self) -> bool:
        """Verification and drafter times were measured (a cost model can divide by them)."""
        return bool(self.verify_ms) and bool(self.drafter_ms)

    def verify(self, n_tokens) -> np.ndarray:
        """ms of one verification pass of `n_tokens` (linear between the timed sizes, flat outside)."""
        if not self.verify_ms:
            raise ValueError("no verification timing in this run's manifest")
        return np.interp(n_tokens, self.verify_tokens, self.verify_ms)

    @staticmethod
    def from_manifest(manifest: Mapping | None, drafters: Sequence[str], k: int = 0) -> "Timing":
        """The Timing of a run: its manifest's `timing` and `k` (else `k` given), lookups by drafter kind."""
        m = manifest or {}
        tm = m.get("timing") or {}
        v = tm.get("verify_ms") or {}
        tok = np.asarray(v.get("tokens", ()), float)
        ms = np.asarray(v.get("ms", ()), float)
        o = np.argsort(tok, kind="stable")
        return Timing(
            k=int(m.get("k") or k),
            lookup=lookup_drafters(drafters, m.get("drafters")),
            verify_tokens=tuple(float(x) for x in tok[o]),
            verify_ms=tuple(float(x) for x in ms[o]),
            batch_drafts=tuple(float(x) for x in (tm.get("verify_batch_ms") or {}).get("drafts", ())),
            batch_ms=tuple(float(x) for x in (tm.get("verify_batch_ms") or {}).get("ms", ())),
            drafter_ms={str(d): float(x) for d, x in (tm.get("drafter_ms") or {}).items()},
        )


class Policy(Protocol):
    """A drafter-choosing policy, as the replay (bandit/policies/walk.py) and the live engine run it."""

    name: str
    full_information: bool  # True: learns every drafter's acceptance; False: the chosen one's only

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: Timing = ...) -> None: ...

    def choose(self, ctx: Context) -> int | tuple[int, int]: ...  # drafter, or (drafter, cut L): accepts min(a, L)

    def update(self, ctx: Context, chosen: int, accepted: np.ndarray, observed: np.ndarray) -> None: ...


class ArmsOnly:
    """A policy that chooses among some of the drafters only: `arms`, indices into the drafters it is reset with.

    A tree of drafts (`tree_drafters`) is not a policy's arm: the policies here reason about a chain (a draft of
    k tokens asked for, cut to L, accepting min(a, L)), which a tree is not. The live engine and the replays both
    hide the trees behind this wrapper, so that a policy decoded live still equals its replay; a tree is measured
    as a fixed drafter, in best-of-N and in the oracles. The wrapped policy sees the arms' columns of every
    Context and is reset with the arms' names."""

    FORWARDED = ("name", "full_information", "observe_step")  # what callers read of a policy; none names a drafter

    def __init__(self, policy, arms: Sequence[int]):
        if not arms:
            raise ValueError("no drafter a policy may choose: every drafter is a tree of drafts")
        self.policy, self.arms = policy, list(arms)
        self._idx = np.asarray(self.arms, dtype=np.int64)

    def __getattr__(self, name):
        # only what carries no drafter index: a method taking or returning one (choose_batch, rule_for) would
        # bypass the mapping, so it is not there
        if name in ArmsOnly.FORWARDED and "policy" in self.__dict__:
            return getattr(self.policy, name)
        raise AttributeError(name)

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: Timing | None = None) -> None:
        names = [drafters[i] for i in self.arms]
        self.policy.reset(names, workloads) if timing is None else self.policy.reset(names, workloads, timing)

    def _ctx(self, ctx: Context) -> Context:
        i = self._idx
        f = None if ctx.draft_features is None else ctx.draft_features[i]
        return Context(
            ctx.workload, ctx.prompt, ctx.pos, ctx.prev_accepted[i], ctx.prev_features[i], ctx.draft_len[i], f
        )

    def choose(self, ctx: Context):
        c = self.policy.choose(self._ctx(ctx))
        return (self.arms[int(c[0])], c[1]) if isinstance(c, tuple) else self.arms[int(c)]

    def update(self, ctx: Context, chosen: int, accepted: np.ndarray, observed: np.ndarray) -> None:
        i = self._idx
        self.policy.update(self._ctx(ctx), self.arms.index(int(chosen)), accepted[i], observed[i])


def chain_arms(drafters: Sequence[str], entries: Mapping[str, Mapping] | None) -> list[int]:
    """The indices of `drafters` a policy may choose: all but the trees (`ArmsOnly`)."""
    trees = set(tree_drafters(drafters, entries))
    return [i for i, d in enumerate(drafters) if d not in trees]


# ---------------------------------------------------------------- provenance

REPO = Path(__file__).resolve().parents[2]


def code_version(subdir: str | None = None) -> str:
    """The package version + the last git commit touching `subdir` of the repository (all of it: None).

    No dirty flag and no time, so that two runs of one commit agree. The harness stamps its runs
    with the whole repository's commit; the analysis stamps its outputs with the last commit that
    touched `bandit/`, so that committing derived outputs under runs/ does not change it.
    """
    from bandit import __version__

    where = [str(REPO / subdir)] if subdir else []
    try:
        head = subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", *where], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return f"{__version__}+g{head[:12]}" if head else __version__


def _describe() -> None:
    """The schema version, the labels, the lookup kinds and one draft's features."""
    conf, ent = [0.9, 0.5, 0.7], [0.2, 1.1, 0.6]
    print(f"schema v{SCHEMA_VERSION}; labels {', '.join(LABELS)}; lookup kinds {', '.join(LOOKUP_KINDS)}")
    print(
        f"features of a draft with conf {conf}, entropy {ent}:",
        ", ".join(f"{n} {x:.4f}" for n, x in zip(FEATURES, draft_features(conf, ent))),
    )
    print("analysis code version:", code_version("bandit"))


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(_describe)


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences (an accepted draft, a reusable cache)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tree_depths(parents: Sequence[int]) -> list[int]:
    """The depth (1 = a child of the root) of each node of a draft tree whose node i has parent
    parents[i] (-1: the root, the prefix's last token; otherwise an earlier node: i > parents[i])."""
    depth: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}: parent {p} is not -1 or an earlier node")
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def accepted_length(tokens: Sequence[int], parents: Sequence[int] | None, y: Sequence[int]) -> int:
    """Draft tokens a greedy verification accepts against the target's tokens y after the prefix: a chain's
    (parents None) common prefix with y, a tree's accepted path (`tree_path`)."""
    return common_prefix(tokens, y) if parents is None else len(tree_path(tokens, parents, y))


def tree_path(tokens: Sequence[int], parents: Sequence[int], y: Sequence[int]) -> list[int]:
    """The nodes a greedy verification of a draft tree accepts against the target's tokens y (its
    tokens after the prefix): from the root, the child whose token is y's next, as deep as it goes.
    A chain (parents i - 1) accepts its common prefix with y; siblings with equal tokens: the first."""
    path, at = [], -1
    for want in y:
        nxt = next((i for i, p in enumerate(parents) if p == at and tokens[i] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        at = nxt
    return path
