"""Walk a policy over a table's blocks: the replay of any policy, block by block or along its own trajectory.

A policy (the `bandit.logs.schema.Policy` protocol) picks a drafter at a block start and is shown
what the block revealed; here every policy of bandit/policies/registry.py and bandit/policies/specselect.py, and
any user's, is run over a block log. The walks (docs/DESIGN.md, "Policies"):

- "block": the table's block set B (the logged block starts of a sparse log, the primary's own
  trajectory starts of a dense one), prompts in a given order, positions ascending;
- "trajectory" (dense logs): the policy's own blocks, the next starting at pos + accepted + 1,
  which is exact because a dense log has every drafter's draft at every position;
- "live" (dense logs): the trajectory walk told what harness/decode/engine.py tells a policy it decodes
  live (`live_walk`), so that a timing-free policy decoded live equals its replay token for token.

    python bandit/policies/walk.py [PATHS...]     # every fixed drafter walked along its own trajectory
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/walk.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

from dataclasses import dataclass

import numpy as np

from bandit.stats import trajectory
from bandit.logs.schema import (
    ArmsOnly,
    Context,
    Policy,
    Timing,
    chain_arms,
    lookup_drafters,
    stopping_drafters,
    tree_drafters,
)
from bandit.logs.table import BlockTable
from bandit.stats.trajectory import TrajectoryResult


@dataclass
class FixedPolicy:
    """Always the same drafter: the best-fixed baseline and the reference for tests."""

    drafter: int
    name: str = "fixed"
    full_information: bool = False
    all_drafters = True  # a baseline, not a learner: its index is into every drafter, trees included (arms_only)

    def reset(self, drafters, workloads, timing=None) -> None:
        self.name = f"fixed:{drafters[self.drafter]}"

    def choose(self, ctx: Context) -> int:
        return self.drafter

    def update(self, ctx, chosen, accepted, observed) -> None:
        pass


@dataclass(frozen=True)
class BlockReplayResult:
    """Per-block replay: one row per block start, in the order the policy met them (B rows)."""

    policy: str
    label: str
    chosen: np.ndarray  # (B,) int: drafter index
    cut: np.ndarray  # (B,) int: cut length L, -1 when the draft was not cut
    reward: np.ndarray  # (B,) float: accepted tokens of the chosen (cut) draft
    cluster: np.ndarray  # (B,) int: prompt index
    workload: np.ndarray  # (B,) int
    row: np.ndarray  # (B,) int: record index in the table

    @property
    def mean_reward(self) -> float:
        return float(self.reward.mean())


def arms_only(t: BlockTable, policy: Policy) -> Policy:
    """`policy` behind schema.ArmsOnly when the run has trees of drafts (not a policy's arm), else itself; a
    baseline that names its drafter among all of them (`all_drafters`: a fixed drafter, a hindsight oracle) is not
    wrapped."""
    arms = chain_arms(t.drafters, t.manifests[0].get("drafters") if t.manifests else None)
    if len(arms) == len(t.drafters) or isinstance(policy, ArmsOnly) or getattr(policy, "all_drafters", False):
        return policy
    return ArmsOnly(policy, arms)


def arms_table(t: BlockTable) -> BlockTable:
    """The table of the drafters a policy may choose (all but the trees: schema.ArmsOnly)."""
    arms = chain_arms(t.drafters, t.manifests[0].get("drafters") if t.manifests else None)
    return t if len(arms) == len(t.drafters) else t.select_drafters([t.drafters[i] for i in arms])


def run_timing(t: BlockTable) -> Timing:
    """What `Policy.reset` gets: the manifest's timing and `k` (else the longest draft), lookups by kind."""
    m = t.manifests[0] if t.manifests else None
    return Timing.from_manifest(m, t.drafters, k=max(int(t.draft_len.max(initial=0)), 1))


def policies_timing(manifest: dict | None, drafters, k: int = 0) -> Timing:
    """The Timing the live policies are given (live and in replay alike): the live phase's `policy_timing`
    (measured before its decodes, manifest["live"]) when the run has one, else the manifest's `timing`."""
    m = manifest or {}
    pt = (m.get("live") or {}).get("policy_timing")
    return Timing.from_manifest({"k": m.get("k") or k, "timing": pt} if pt else m, drafters, k)


def block_rows(t: BlockTable) -> list[np.ndarray]:
    """Rows of the block set B of each prompt (P arrays, ascending positions): the logged block starts of a
    sparse log, the primary's own trajectory starts of a dense one."""
    rows = np.flatnonzero(trajectory.block_mask(t))
    return np.split(rows, np.searchsorted(t.prompt[rows], np.arange(1, t.n_prompts)))


def walk(
    t: BlockTable,
    policy: Policy,
    mode: str = "block",
    prompt_order: np.ndarray | None = None,
    timing: Timing | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run `policy` over `t`; (rows, chosen, cut, reward), each (B,), one entry per block it met, in order.

    mode "block": the logged block starts, prompts in `prompt_order`, positions ascending.
    mode "trajectory" (dense logs): the policy's own blocks, the next starting at pos + reward + 1.
    mode "live" (dense logs): `live_walk`, the trajectory with the live engine's feedback.
    In every mode ctx.draft_features holds the lookups' FEATURES at the row (NaN for the other drafters).
    The feedback model of "block" and "trajectory": a bandit policy sees the chosen drafter's acceptance and features only
    (NaN elsewhere); a full-information one sees every drafter; a draft cut to L reveals min(a, L).
    The loop is tight (rows as Python lists, observation arrays reused) because every policy of
    `bandit/sim/evaluate.py` runs through it over 100k+ blocks.
    """
    if mode not in ("block", "trajectory", "live"):
        raise ValueError(f"mode must be 'block', 'trajectory' or 'live', got {mode!r}")
    if mode != "block":
        trajectory.require_dense(t)
    if mode == "live":
        return live_walk(t, policy, np.arange(t.n_prompts) if prompt_order is None else prompt_order, timing)
    D = len(t.drafters)
    policy = arms_only(t, policy)
    policy.reset(t.drafters, t.workloads, run_timing(t) if timing is None else timing)
    full = bool(policy.full_information)
    A, F, DL = t.accepted.astype(float), t.features, context_lengths(t, timing)
    wl, pos_of = t.workload.tolist(), t.pos.tolist()
    nanD, nanF, all_obs, one_obs = np.full(D, np.nan), np.full((D, 4), np.nan), np.ones(D, bool), np.eye(D, dtype=bool)
    LF = np.where(lookup_flags(t, timing)[None, :, None], F, np.nan)  # the lookups' FEATURES, known before choosing
    order = np.arange(t.n_prompts) if prompt_order is None else np.asarray(prompt_order)
    starts, lengths = trajectory.prompt_rows(t)
    if mode == "block":
        per_prompt = block_rows(t)
    rows, chosen, cuts, rewards = [], [], [], []
    choose, update = policy.choose, policy.update
    for p in order.tolist():
        prev_a, prev_f = nanD, nanF
        it = iter(per_prompt[p].tolist()) if mode == "block" else None
        r, end = int(starts[p]), int(starts[p] + lengths[p])
        while True:
            if it is not None:
                r = next(it, -1)
                if r < 0:
                    break
            elif r >= end:
                break
            ctx = Context(wl[r], p, pos_of[r], prev_a, prev_f, DL[r].copy(), LF[r])
            c = choose(ctx)
            d, cut = (int(c[0]), int(c[1])) if isinstance(c, tuple) else (int(c), -1)
            a_row = A[r]
            rew = a_row[d] if cut < 0 or a_row[d] <= cut else float(cut)
            if full:
                acc = a_row
                if rew != a_row[d]:
                    acc = a_row.copy()
                    acc[d] = rew
                obs, feats = all_obs, F[r]
            else:
                acc, feats = nanD.copy(), nanF.copy()
                acc[d], feats[d] = rew, F[r, d]
                obs = one_obs[d]
            update(ctx, d, acc, obs)
            prev_a, prev_f = acc, feats
            rows.append(r)
            chosen.append(d)
            cuts.append(cut)
            rewards.append(rew)
            if it is None:
                r += int(rew) + 1
    return (
        np.asarray(rows, np.int64),
        np.asarray(chosen, np.int64),
        np.asarray(cuts, np.int64),
        np.asarray(rewards, float),
    )


def lookup_flags(t: BlockTable, timing: Timing | None = None) -> np.ndarray:
    """(D,) bool: t's lookup drafters, by `timing.lookup` (the policies' Timing), else by the run's drafter kinds."""
    names = (timing.lookup if timing is not None else ()) or lookup_drafters(
        t.drafters, t.manifests[0].get("drafters") if t.manifests else None
    )
    return np.array([d in set(names) for d in t.drafters], bool)


def context_lengths(t: BlockTable, timing: Timing | None = None) -> np.ndarray:
    """(R, D) the draft lengths a policy sees before choosing (Context.draft_len): the log's, except for a drafter
    that stops its own chain early (`stop_below`, schema.stopping_drafters): its logged length is known only after it
    drafts, and live it is told the length it is asked for, as every model drafter is. That is the longest draft of
    the model drafters that do not stop (they draft what they are asked), else k capped by the tokens left."""
    entries = t.manifests[0].get("drafters") if t.manifests else None
    stop = [t.drafters.index(d) for d in stopping_drafters(t.drafters, entries)]
    DL = t.draft_len
    if not stop:
        return DL
    look = lookup_flags(t, timing)
    trees = [t.drafters.index(d) for d in tree_drafters(t.drafters, entries)]  # a tree's size is not a depth
    full = [d for d in range(len(t.drafters)) if not look[d] and d not in stop and d not in trees]
    if full:
        asked = DL[:, full].max(1)
    else:
        k = int(t.manifests[0].get("k", DL.max(initial=0))) if t.manifests else int(DL.max(initial=0))
        rem = trajectory.remaining(t)
        asked = np.full(len(DL), k) if rem is None else np.clip(np.minimum(k, rem - 1), 0, None)
    out = DL.copy()
    out[:, stop] = asked[:, None].astype(DL.dtype)
    return out


def lookups_drafted(t: BlockTable) -> np.ndarray:
    """(R,) bool: the live engine drafts the lookups before choosing at this row of a dense log.

    It does so when the block's draft length k = min(k_max, max_new_tokens - 1 - pos) is above 0; k is 0
    only at the output budget's last position, which is an output's last position (n - pos = 1) where
    every drafter's logged draft is empty (a model drafter drafts k tokens when asked for k > 0).
    """
    return (trajectory.remaining(t) > 1) | (t.draft_len.max(1, initial=0) > 0)


def live_walk(
    t: BlockTable, policy: Policy, prompts, timing: Timing | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`policy` along its own trajectory on dense log t over table prompts `prompts` (in decode order), told
    what harness/decode/engine.py tells a policy it decodes live (the rules both follow):

    - ctx.prompt: the running index 0, 1, ... over `prompts`; ctx.draft_len: the log's draft lengths;
      ctx.draft_features: the lookups' FEATURES at the row, NaN for the other drafters;
    - feedback: the chosen drafter's accepted (min(a, L) for a draft cut to L); a full-information policy is
      also told every lookup drafted before choosing (`lookups_drafted`), censored to what the block
      revealed, min(a, reward + 1, n - pos): its common prefix with the block's new tokens; model drafters
      not run stay NaN, unobserved; the next block's prev_features are the observed drafters' FEATURES;
    - `policy.observe_step(n_verified, 1, timing.verify(n_verified))` after each verify, when the policy has
      it and the timing has verification times (n_verified: the trunk's 1 + the verified draft's length).

    Returns (rows, chosen, cut, reward) like `walk`.
    """
    trajectory.require_dense(t)
    D = len(t.drafters)
    timing = run_timing(t) if timing is None else timing
    policy = arms_only(t, policy)
    policy.reset(t.drafters, t.workloads, timing)
    full = bool(policy.full_information)
    look = lookup_flags(t, timing)
    look_idx = np.flatnonzero(look).tolist()
    observe = getattr(policy, "observe_step", None) if timing.verify_ms else None
    vms = timing.verify(np.arange(int(t.draft_len.max(initial=0)) + 2)).tolist() if observe else []
    A, F, DL = t.accepted.astype(float), t.features, context_lengths(t, timing)
    dl_list, wl, pos_of = t.draft_len.tolist(), t.workload.tolist(), t.pos.tolist()
    rem, drafted = trajectory.remaining(t).tolist(), lookups_drafted(t).tolist()
    nanD, nanF = np.full(D, np.nan), np.full((D, 4), np.nan)
    starts, lengths = trajectory.prompt_rows(t)
    rows, chosen, cuts, rewards = [], [], [], []
    choose, update = policy.choose, policy.update
    for i, p in enumerate(np.asarray(prompts, np.int64).tolist()):
        prev_a, prev_f = nanD, nanF
        r, end = int(starts[p]), int(starts[p] + lengths[p])
        while r < end:
            df = nanF.copy()
            df[look] = F[r, look]
            ctx = Context(wl[r], i, pos_of[r], prev_a, prev_f, DL[r].copy(), df)
            c = choose(ctx)
            d, cut = (int(c[0]), int(c[1])) if isinstance(c, tuple) else (int(c), -1)
            a_row = A[r]
            rew = a_row[d] if cut < 0 or a_row[d] <= cut else float(cut)
            acc, feats, obs = nanD.copy(), nanF.copy(), np.zeros(D, bool)
            acc[d], feats[d], obs[d] = rew, F[r, d], True
            if full and drafted[r]:
                seen = min(rew + 1.0, float(rem[r]))  # the block's new tokens: accepted + the bonus, to the end
                for j in look_idx:
                    if j != d:
                        acc[j], feats[j], obs[j] = min(a_row[j], seen), F[r, j], True
            if observe is not None:
                n = 1 + (dl_list[r][d] if cut < 0 else min(dl_list[r][d], cut))
                observe(n, 1, vms[n])
            update(ctx, d, acc, obs)
            prev_a, prev_f = acc, feats
            rows.append(r)
            chosen.append(d)
            cuts.append(cut)
            rewards.append(rew)
            r += int(rew) + 1
    return (
        np.asarray(rows, np.int64),
        np.asarray(chosen, np.int64),
        np.asarray(cuts, np.int64),
        np.asarray(rewards, float),
    )


def block_replay(t: BlockTable, policy: Policy, prompt_order: np.ndarray | None = None) -> BlockReplayResult:
    """Run `policy` over every block start: prompts in `prompt_order` (default: table order), positions ascending.

    The reward is the chosen drafter's accepted tokens at that block start, wherever the
    policy's own choices would have led (the logged block starts are reused as they are).
    """
    rows, chosen, cuts, rewards = walk(t, policy, "block", prompt_order)
    return BlockReplayResult(
        policy=policy.name,
        label=t.label,
        chosen=chosen,
        cut=cuts,
        reward=rewards,
        cluster=t.prompt[rows].astype(np.int64),
        workload=t.workload[rows].astype(np.int64),
        row=rows,
    )


def trajectory_replay(t: BlockTable, policy: Policy, prompt_order: np.ndarray | None = None) -> TrajectoryResult:
    """Replay `policy` along its own trajectory: the next block starts at pos + accepted + 1."""
    rows, chosen, _, _ = walk(t, policy, "trajectory", prompt_order)
    starts, lengths = trajectory.prompt_rows(t)
    cluster = t.prompt[rows].astype(np.int64)
    return TrajectoryResult(
        policy=policy.name,
        label=t.label,
        tokens=lengths.astype(np.int64),
        passes=np.bincount(cluster, minlength=t.n_prompts).astype(np.int64),
        workload=t.workload[starts].astype(np.int64),
        chosen=chosen,
        cluster=cluster,
    )


# ---------------------------------------------------------------- entry points


def policies_demo(policies, name: str) -> None:
    """`python bandit/policies/<name>.py [PATHS] [--latest]`: each policy's mean accepted per logged block on a
    campaign (by default the published one), every block start in table order."""
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        print(said)
        for pol in policies:
            r = block_replay(t, pol)
            print(
                f"[{t.label}] {r.policy}: mean accepted per logged block {r.mean_reward:.3f} over {r.reward.size} blocks"
            )

    demo(body, f"The policies of bandit/policies/{name}.py on logged blocks.")


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        trajectory.require_dense(t)
        print(said)
        for d, name in enumerate(t.drafters):
            r = trajectory_replay(t, FixedPolicy(d))
            print(
                f"[{t.label}] fixed:{name} along its own trajectory: {r.tokens_per_pass:.3f} tokens per target pass "
                f"({int(r.passes.sum())} passes, {t.n_prompts} prompts)"
            )

    demo(body, "Each fixed drafter walked along its own trajectory of a dense log.")
