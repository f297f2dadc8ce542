"""Walk a policy over a table's blocks: the replay of any policy, block by block or along its own trajectory.

A policy (the `bandit.schema.Policy` protocol) picks a drafter at a block start and is shown
what the block revealed; here every policy of bandit/policies.py and bandit/specselect.py, and
any user's, is run over a block log. Two walks (docs/DESIGN.md, "Policies"):

- "block": the table's block set B (the logged block starts of a sparse log, the primary's own
  trajectory starts of a dense one), prompts in a given order, positions ascending;
- "trajectory" (dense logs): the policy's own blocks, the next starting at pos + accepted + 1,
  which is exact because a dense log has every drafter's draft at every position.

    python bandit/walk.py [PATHS...]     # every fixed drafter walked along its own trajectory
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/walk.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from dataclasses import dataclass

import numpy as np

from bandit import trajectory
from bandit.schema import Context, Policy, Timing
from bandit.simulate import SimConfig, simulate_table
from bandit.table import BlockTable
from bandit.trajectory import TrajectoryResult


@dataclass
class FixedPolicy:
    """Always the same drafter: the best-fixed baseline and the reference for tests."""

    drafter: int
    name: str = "fixed"
    full_information: bool = False

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


def run_timing(t: BlockTable) -> Timing:
    """What `Policy.reset` gets: the manifest's timing and `k` (else the longest draft), lookups by kind."""
    m = t.manifests[0] if t.manifests else None
    return Timing.from_manifest(m, t.drafters, k=max(int(t.draft_len.max(initial=0)), 1))


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
    The feedback model: a bandit policy sees the chosen drafter's acceptance and features only
    (NaN elsewhere); a full-information one sees every drafter; a draft cut to L reveals min(a, L).
    The loop is tight (rows as Python lists, observation arrays reused) because every policy of
    `bandit/evaluate.py` runs through it over 100k+ blocks.
    """
    if mode not in ("block", "trajectory"):
        raise ValueError(f"mode must be 'block' or 'trajectory', got {mode!r}")
    if mode == "trajectory":
        trajectory.require_dense(t)
    D = len(t.drafters)
    policy.reset(t.drafters, t.workloads, run_timing(t) if timing is None else timing)
    full = bool(policy.full_information)
    A, F, DL = t.accepted.astype(float), t.features, t.draft_len
    wl, pos_of = t.workload.tolist(), t.pos.tolist()
    nanD, nanF, all_obs, one_obs = np.full(D, np.nan), np.full((D, 4), np.nan), np.ones(D, bool), np.eye(D, dtype=bool)
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
            ctx = Context(wl[r], p, pos_of[r], prev_a, prev_f, DL[r].copy())
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


def flips_demo(policies) -> None:
    """Print each policy's mean accepted per logged block on a small simulated campaign with planted ranking
    flips between workloads [SIM]: what `python bandit/<policy module>.py` shows."""
    cfg = SimConfig(
        drafter_accept=(0.72,) * 4,
        workload_shift=(0.0,) * 4,
        ranking_flips=True,
        flip_margin=0.6,
        n_prompts=30,
        out_len=120,
        dense=False,
        seed=0,
    )
    t = simulate_table(cfg)
    print(f"simulated campaign with planted ranking flips: {t.summary()}")
    for pol in policies:
        r = block_replay(t, pol)
        print(f"[SIM] {r.policy}: mean accepted per logged block {r.mean_reward:.3f} over {r.reward.size} blocks")


if __name__ == "__main__":
    from bandit.logs import default_inputs, load_logs

    files, said = default_inputs()
    t = load_logs(files)
    trajectory.require_dense(t)
    print(said)
    for d, name in enumerate(t.drafters):
        r = trajectory_replay(t, FixedPolicy(d))
        print(
            f"[{t.label}] fixed:{name} along its own trajectory: {r.tokens_per_pass:.3f} tokens per target pass "
            f"({int(r.passes.sum())} passes, {t.n_prompts} prompts)"
        )
