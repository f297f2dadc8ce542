"""The policies decoded live (`policy:<name>` configurations of the live phase) and their replay on the dense log.

`make` builds each policy as the live phase runs it; `replay` walks it along its own trajectory on the dense
log with the live engine's feedback (bandit/policies/walk.py's `live_walk`: ctx.prompt the running index over the
decoded prompts, the lookups' drafts and FEATURES before choosing, censored lookup feedback for
full-information policies, `observe_step` with the Timing's verify time) and counts what the live decode
counts: target passes, verified tokens, draft calls (every lookup at every block it drafts, plus the chosen
model drafter) and blocks per chosen drafter. A timing-free policy decoded live equals its replay exactly.

    python bandit/policies/livepolicies.py [RUN]   # each live policy replayed on the run's live sample [MODEL counts]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/livepolicies.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bandit.policies import choice, engines
from bandit.stats import steps
from bandit.policies.published import EXP3Spec, HedgeQuery, ThompsonCtx, UCBSpec
from bandit.logs.schema import Policy, Timing
from bandit.policies.specselect import SpecSelect
from bandit.logs.table import BlockTable
from bandit.policies.walk import arms_table, live_walk, lookup_flags, lookups_drafted

LIVE_POLICIES: tuple[str, ...] = (
    "selector",
    "specselect",
    "ucbspec",
    "exp3spec",
    "hedge_query",
    "thompson_ctx",
) + engines.RULE_NAMES  # the engines' own rules (bandit/policies/engines.py) last


def make(name: str, t: BlockTable, timing: Timing, random_state: int = 0) -> Policy:
    """Policy `name` of LIVE_POLICIES as the live phase decodes it, given the dense log t and the policies' Timing.

    "selector": bandit/policies/choice.py's rule fitted leave-one-workload-out on t (each workload is routed, by name,
    to the rule fitted on the other workloads; a workload t lacks to the rule fitted on all of them);
    "specselect": spec-select learning its step times from the steps it observes, told censored lookups;
    the engines' rules (bandit/policies/engines.py) with their sources' default settings;
    the others: their published definitions (bandit/policies/published.py) with default settings.
    """
    if name == "selector":  # fitted on the drafters it may choose (walk.arms_only hides a tree from it)
        return choice.routed(arms_table(t), timing, random_state=random_state)
    if name == "specselect":
        return SpecSelect(step_time="learned", censored=True, random_state=random_state)
    if name in engines.RULE_NAMES:
        return engines.make_rule(name, random_state)
    makers = {"ucbspec": UCBSpec, "exp3spec": EXP3Spec, "hedge_query": HedgeQuery, "thompson_ctx": ThompsonCtx}
    if name not in makers:
        raise ValueError(f"unknown live policy {name!r}; known: {', '.join(LIVE_POLICIES)}")
    return makers[name](random_state=random_state)


@dataclass(frozen=True)
class Counts:
    """What a live decode counts, per table prompt (P prompts, D drafters; 0 for prompts not walked)."""

    passes: np.ndarray  # (P,) int64 target passes
    verified: (
        np.ndarray
    )  # (P,) int64 tokens through the verify forwards (1 trunk + the chosen draft's length, per pass)
    calls: (
        np.ndarray
    )  # (P, D) int64 draft calls per drafter (lookups at every pass they draft + the chosen model drafter)
    chosen: np.ndarray  # (P, D) int64 blocks per chosen drafter
    steps: np.ndarray | None = None  # (P, K) the passes in the step basis of `knots` (bandit/stats/steps.py), summed


def counts(
    t: BlockTable,
    rows: np.ndarray,
    chosen: np.ndarray,
    cut: np.ndarray,
    timing: Timing | None = None,
    knots: Sequence[int] | None = None,
) -> Counts:
    """Counts of a walk's blocks (rows, chosen drafter, cut length or -1) on dense log t, as the live engine counts.

    At a block whose draft length k is above 0 every lookup drafts before the choice (one call each, the
    chosen lookup's included); the chosen drafter is called otherwise (a model drafter, or any drafter at
    k = 0, which returns an empty draft); a cut draft verifies min(length, cut) tokens.
    """
    P, D = t.n_prompts, len(t.drafters)
    p = t.prompt[rows].astype(np.int64)
    n = t.draft_len[rows, chosen].astype(np.int64)
    n = np.where(cut >= 0, np.minimum(n, cut), n)
    one = np.zeros((len(rows), D), np.int64)
    one[np.arange(len(rows)), chosen] = 1
    called = one | (lookup_flags(t, timing)[None, :] & lookups_drafted(t)[rows][:, None])
    by = np.zeros((P, D), np.int64)
    calls, picks = by.copy(), by.copy()
    np.add.at(calls, p, called.astype(np.int64))
    np.add.at(picks, p, one)
    return Counts(
        passes=np.bincount(p, minlength=P).astype(np.int64),
        verified=np.bincount(p, 1 + n, minlength=P).astype(np.int64),
        calls=calls,
        chosen=picks,
        steps=None if knots is None else steps.summed(1 + n, p, P, knots),
    )


def replay(
    t: BlockTable,
    name: str | Policy,
    prompts: Sequence[int],
    timing: Timing,
    random_state: int = 0,
    knots: Sequence[int] | None = None,
) -> Counts:
    """Policy `name` (or a Policy instance) walked along its own trajectory on dense log t over table prompts
    `prompts` in the live decode order, with the live feedback rules (`walk.live_walk`), counted as live (and
    its passes in the step basis of `knots` where given)."""
    pol = make(name, t, timing, random_state) if isinstance(name, str) else name
    rows, chosen, cut, _ = live_walk(t, pol, prompts, timing)
    return counts(t, rows, chosen, cut, timing, knots)


if __name__ == "__main__":
    import time

    from bandit.logs.reader import demo, load_logs, read_manifest

    def body(files, said: str) -> None:
        t = load_logs(files)
        m = read_manifest(files[0]) or {}
        pt = (m.get("live") or {}).get("policy_timing")
        timing = Timing.from_manifest({"k": m.get("k"), "timing": pt} if pt else m, t.drafters)
        prompts = np.arange(t.n_prompts)
        print(f"[{t.label}] {said}: {t.summary()}; every prompt in table order")
        for name in LIVE_POLICIES:
            t0 = time.perf_counter()
            c = replay(t, name, prompts, timing)
            mix = ", ".join(f"{d} {x / c.passes.sum():.0%}" for d, x in zip(t.drafters, c.chosen.sum(0)) if x)
            tok = t.n_records  # a dense log: one record per output token
            print(
                f"  policy:{name}: {tok / c.passes.sum():.3f} tokens per pass, {int(c.calls.sum())} draft calls; "
                f"chosen {mix} ({time.perf_counter() - t0:.1f} s)"
            )

    demo(body, "Every live policy replayed on the dense log, every prompt in table order.")
