"""Counterfactual replay over block logs: tables, oracles, and replay of any policy.

Every statistic follows DESIGN.md's definitions, over block starts (records with `block`;
every record when a log has none). On dense logs the replay is exact along any trajectory:
a policy picks a drafter at a block start, the block produces `accepted + 1` tokens, and
the next block starts at `pos + accepted + 1`. The trajectory oracle is the shortest path
over positions (fewest target passes), not the greedy per-block maximum.

    python bandit/replay.py [PATHS...]                 # readable tables (default: runs/)
    specbandit replay PATHS --json [--drafters a,b]    # one JSON object
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/replay.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional, Protocol, Sequence

import numpy as np
import typer

from bandit.logs import BlockTable, default_inputs, load_logs


# ---------------------------------------------------------------- static statistics

def mean_table(t: BlockTable) -> np.ndarray:
    """(W,D) mean accepted per workload and drafter over block starts (NaN: workload has none)."""
    b = t.is_block_start
    W, D = len(t.workloads), len(t.drafters)
    sums = np.zeros((W, D))
    np.add.at(sums, t.workload[b], t.accepted[b])
    n = np.bincount(t.workload[b], minlength=W).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / n[:, None]


@dataclass(frozen=True)
class ReplaySummary:
    """DESIGN.md's replay statistics of one table (accepted tokens `a`, block starts)."""
    drafters: tuple[str, ...]
    workloads: tuple[str, ...]
    label: str                        # MEASURED | SIM | UNLABELLED
    table: np.ndarray                 # (W,D) mean accepted
    n_per_workload: np.ndarray        # (W,) block starts per workload
    pooled: np.ndarray                # (D,) mean accepted over all block starts
    best_fixed: int                   # index of p: highest pooled mean (first on ties)
    workload_oracle: float            # mean accepted when each workload uses its own best drafter
    workload_headroom: float          # workload_oracle / pooled[p] - 1
    per_block_oracle: float           # mean over blocks of max_d a_d
    per_block_gap: float              # per_block_oracle / pooled[p] - 1
    n_blocks: int
    n_prompts: int
    trajectory: dict[str, float] | None  # dense logs: tokens per target pass per fixed drafter and "oracle"
    sources: tuple[tuple[str, str], ...] = ()  # (path, sha256) of the logs read
    ci: dict | None = None            # name -> bandit.ci.Interval (95%, prompt clusters), from `with_ci`

    @property
    def best_fixed_name(self) -> str:
        return self.drafters[self.best_fixed]

    def to_json(self) -> dict:
        out = {
            "label": self.label,
            "table": {w: {d: float(self.table[i, j]) for j, d in enumerate(self.drafters)}
                      for i, w in enumerate(self.workloads)},
            "pooled": {d: float(self.pooled[j]) for j, d in enumerate(self.drafters)},
            "best_fixed": self.best_fixed_name,
            "workload_oracle": self.workload_oracle,
            "workload_headroom": self.workload_headroom,
            "per_block_oracle": self.per_block_oracle,
            "per_block_gap": self.per_block_gap,
            "n_blocks": self.n_blocks,
            "n_prompts": self.n_prompts,
            "sources": [{"path": p, "sha256": h} for p, h in self.sources],
        }
        if self.trajectory is not None:
            out["trajectory"] = dict(self.trajectory)
        if self.ci is not None:
            out["ci"] = {k: {"value": c.value, "lo": c.lo, "hi": c.hi, "method": c.method, "unit": c.unit,
                             "n_resamples": c.n_resamples, "seed": c.seed} for k, c in self.ci.items()}
        return out

    def summary(self) -> str:
        tag = f"[{self.label}]" if self.label != "UNLABELLED" else "[unlabelled]"
        width = max(10, *(len(w) for w in self.workloads)) + 2
        lines = [f"{tag} mean accepted tokens per block ({self.n_blocks} blocks, {self.n_prompts} prompts)",
                 "workload".ljust(width) + "".join(f"{d:>10s}" for d in self.drafters) + f"{'blocks':>8s}"]
        for i, w in enumerate(self.workloads):
            row = self.table[i]
            lines.append(w.ljust(width) + "".join(
                f"{x:>9.3f}{'*' if j == np.nanargmax(row) else ' '}" for j, x in enumerate(row))
                + f"{int(self.n_per_workload[i]):>8d}")
        lines.append("pooled".ljust(width) + "".join(f"{x:>9.3f} " for x in self.pooled))
        p = self.best_fixed_name
        lines += [f"{tag} best fixed drafter: {p} ({self.pooled[self.best_fixed]:.3f})",
                  f"{tag} workload-level hindsight oracle: {self.workload_oracle:.3f}, "
                  f"headroom {100 * self.workload_headroom:+.1f}%{self._ci('workload_headroom')}",
                  f"{tag} per-block oracle: {self.per_block_oracle:.3f}, gap {100 * self.per_block_gap:+.1f}%"
                  f"{self._ci('per_block_gap')}"]
        if self.trajectory is not None:
            lines.append(f"{tag} trajectory replay (dense), tokens per target pass: " + ", ".join(
                f"{k} {v:.3f}" for k, v in self.trajectory.items()))
            lines.append(f"{tag} trajectory oracle gain over the best fixed drafter: "
                         f"{100 * (self.trajectory['oracle'] / self.trajectory[self.best_fixed_name] - 1):+.1f}%"
                         f"{self._ci('trajectory_oracle_gain')}")
        if self.ci:
            c = next(iter(self.ci.values()))
            lines.append(f"95% CIs: {c.method} bootstrap over {c.unit} clusters within workloads, "
                         f"{c.n_resamples} resamples, seed {c.seed}; the best fixed drafter is re-chosen in every resample")
        return "\n".join(lines)

    def _ci(self, name: str) -> str:
        c = (self.ci or {}).get(name)
        return "" if c is None else f" (95% CI [{100 * c.lo:+.1f}%, {100 * c.hi:+.1f}%])"


def summarize(t: BlockTable) -> ReplaySummary:
    """Tables, best fixed drafter, workload and per-block oracles (and trajectories on dense logs)."""
    b = t.blocks()
    if b.n_records == 0:
        raise ValueError("no block starts to replay")
    a = b.accepted.astype(float)
    table = mean_table(b)
    n_w = np.bincount(b.workload, minlength=len(b.workloads))
    pooled = a.mean(0)
    p = int(np.argmax(pooled))
    present = n_w > 0
    wl_oracle = float((n_w[present] * table[present].max(1)).sum() / n_w.sum())
    pb_oracle = float(a.max(1).mean())
    traj = None
    if t.dense:
        traj = {d: fixed_trajectory(t, j).tokens_per_pass for j, d in enumerate(t.drafters)}
        traj["oracle"] = trajectory_oracle(t).tokens_per_pass
    return ReplaySummary(drafters=t.drafters, workloads=t.workloads, label=t.label, table=table,
                         n_per_workload=n_w, pooled=pooled, best_fixed=p, workload_oracle=wl_oracle,
                         workload_headroom=wl_oracle / pooled[p] - 1, per_block_oracle=pb_oracle,
                         per_block_gap=pb_oracle / pooled[p] - 1, n_blocks=b.n_records,
                         n_prompts=len(np.unique(b.prompt)), trajectory=traj,
                         sources=tuple((s.path, s.sha256) for s in t.sources))


def with_ci(s: ReplaySummary, t: BlockTable, n_resamples: int = 2000, seed: int = 0) -> ReplaySummary:
    """`s` with 95% bootstrap CIs (bandit.ci: prompt clusters within workloads, percentile) of the
    headroom, the per-block gap and, on dense logs, the trajectory oracle gain."""
    from bandit.ci import table_stats, trajectory_stats
    entries = table_stats(t.blocks(), "prompt", n_resamples, seed, "percentile")[:2]
    if t.dense:
        entries += trajectory_stats(t, n_resamples, seed, "percentile")
    return replace(s, ci={e.name: e.ci for e in entries})


# ---------------------------------------------------------------- policies

@dataclass
class Context:
    """What a policy may see BEFORE drafting at a block start."""
    workload: int
    prompt: int
    pos: int
    prev_accepted: np.ndarray  # (D,) previous block's accepted per drafter, NaN if unobserved / first block
    prev_features: np.ndarray  # (D,4) previous block's draft features, NaN if unobserved / first block
    draft_len: np.ndarray      # (D,) draft length each drafter proposes here (known before choosing only
                               # for cheap lookup drafters; a policy using it for model drafters must say so)


class Policy(Protocol):
    name: str
    full_information: bool     # True: learns every drafter's acceptance; False: the chosen one's only

    def reset(self, drafters: Sequence[str], workloads: Sequence[str], timing: dict | None = None) -> None: ...
    def choose(self, ctx: Context) -> int | tuple[int, int]: ...  # drafter, or (drafter, cut L): accepts min(a, L)
    def update(self, ctx: Context, chosen: int, accepted: np.ndarray, observed: np.ndarray) -> None: ...


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
    chosen: np.ndarray    # (B,) int: drafter index
    cut: np.ndarray       # (B,) int: cut length L, -1 when the draft was not cut
    reward: np.ndarray    # (B,) float: accepted tokens of the chosen (cut) draft
    cluster: np.ndarray   # (B,) int: prompt index
    workload: np.ndarray  # (B,) int
    row: np.ndarray       # (B,) int: record index in the table

    @property
    def mean_reward(self) -> float:
        return float(self.reward.mean())


@dataclass(frozen=True)
class TrajectoryResult:
    """Trajectory replay on a dense log: tokens and target passes per prompt (P prompts)."""
    policy: str
    label: str
    tokens: np.ndarray    # (P,) int: output tokens produced (the output's length)
    passes: np.ndarray    # (P,) int: target passes (blocks) used
    workload: np.ndarray  # (P,) int
    chosen: np.ndarray    # (B,) int: drafter per block, prompt by prompt ([] for the vectorised oracle)
    cluster: np.ndarray   # (B,) int: prompt of each block

    @property
    def tokens_per_pass(self) -> float:
        return float(self.tokens.sum() / self.passes.sum())


def _timing(t: BlockTable) -> dict | None:
    return next((m["timing"] for m in t.manifests if m.get("timing")), None)


def _prompt_rows(t: BlockTable) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each prompt's rows (records are sorted by prompt, pos)."""
    starts = np.searchsorted(t.prompt, np.arange(t.n_prompts))
    ends = np.searchsorted(t.prompt, np.arange(t.n_prompts), side="right")
    return starts, ends - starts


def _decode(choice) -> tuple[int, int]:
    if isinstance(choice, tuple):
        return int(choice[0]), int(choice[1])
    return int(choice), -1


def _observe(t: BlockTable, r: int, d: int, cut: int, full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(accepted (D,), features (D,4), observed (D,), reward) as the feedback model reveals them.

    A cut draft only reveals min(a, L) (the target never saw the rest)."""
    D = len(t.drafters)
    a = t.accepted[r].astype(float)
    reward = min(a[d], cut) if cut >= 0 else a[d]
    observed = np.ones(D, bool) if full else np.arange(D) == d
    acc = np.where(observed, a, np.nan)
    acc[d] = reward
    feats = np.where(observed[:, None], t.features[r], np.nan)
    return acc, feats, observed, float(reward)


def block_replay(t: BlockTable, policy: Policy, prompt_order: np.ndarray | None = None) -> BlockReplayResult:
    """Run `policy` over every block start: prompts in `prompt_order` (default: table order), positions ascending.

    The reward is the chosen drafter's accepted tokens at that block start, wherever the
    policy's own choices would have led (the logged block starts are reused as they are).
    """
    D = len(t.drafters)
    policy.reset(t.drafters, t.workloads, _timing(t))
    starts, lengths = _prompt_rows(t)
    is_block = t.is_block_start
    order = np.arange(t.n_prompts) if prompt_order is None else np.asarray(prompt_order)
    rows, chosen, cuts, rewards = [], [], [], []
    for p in order:
        prev_a, prev_f = np.full(D, np.nan), np.full((D, 4), np.nan)
        for r in range(starts[p], starts[p] + lengths[p]):
            if not is_block[r]:
                continue
            ctx = Context(int(t.workload[r]), int(p), int(t.pos[r]), prev_a, prev_f, t.draft_len[r].copy())
            d, cut = _decode(policy.choose(ctx))
            acc, feats, obs, rew = _observe(t, r, d, cut, policy.full_information)
            policy.update(ctx, d, acc, obs)
            prev_a, prev_f = acc, feats
            rows.append(r); chosen.append(d); cuts.append(cut); rewards.append(rew)
    rows = np.asarray(rows, np.int64)
    return BlockReplayResult(policy=policy.name, label=t.label, chosen=np.asarray(chosen, np.int64),
                             cut=np.asarray(cuts, np.int64), reward=np.asarray(rewards, float),
                             cluster=t.prompt[rows].astype(np.int64), workload=t.workload[rows].astype(np.int64),
                             row=rows)


def _require_dense(t: BlockTable) -> None:
    if not t.dense:
        raise ValueError("trajectory replay needs a dense log (a record at every position 0..n-1 of every "
                         "prompt); this one is sparse")


def trajectory_replay(t: BlockTable, policy: Policy, prompt_order: np.ndarray | None = None) -> TrajectoryResult:
    """Replay `policy` along its own trajectory: the next block starts at pos + accepted + 1."""
    _require_dense(t)
    D = len(t.drafters)
    policy.reset(t.drafters, t.workloads, _timing(t))
    starts, lengths = _prompt_rows(t)
    order = np.arange(t.n_prompts) if prompt_order is None else np.asarray(prompt_order)
    passes = np.zeros(t.n_prompts, np.int64)
    chosen, cluster = [], []
    for p in order:
        prev_a, prev_f = np.full(D, np.nan), np.full((D, 4), np.nan)
        pos = 0
        while pos < lengths[p]:
            r = starts[p] + pos
            ctx = Context(int(t.workload[r]), int(p), pos, prev_a, prev_f, t.draft_len[r].copy())
            d, cut = _decode(policy.choose(ctx))
            acc, feats, obs, rew = _observe(t, r, d, cut, policy.full_information)
            policy.update(ctx, d, acc, obs)
            prev_a, prev_f = acc, feats
            pos += int(rew) + 1
            passes[p] += 1
            chosen.append(d); cluster.append(p)
    return TrajectoryResult(policy=policy.name, label=t.label, tokens=lengths.astype(np.int64), passes=passes,
                            workload=t.workload[starts].astype(np.int64), chosen=np.asarray(chosen, np.int64),
                            cluster=np.asarray(cluster, np.int64))


def fixed_trajectory(t: BlockTable, d: int) -> TrajectoryResult:
    """`trajectory_replay` of always-drafter-d, vectorised over prompts (same result, no Python per block)."""
    _require_dense(t)
    starts, lengths = _prompt_rows(t)
    pos = np.zeros(t.n_prompts, np.int64)
    passes = np.zeros(t.n_prompts, np.int64)
    live = pos < lengths
    while live.any():
        r = starts[live] + pos[live]
        pos[live] += t.accepted[r, d] + 1
        passes[live] += 1
        live = pos < lengths
    return TrajectoryResult(policy=f"fixed:{t.drafters[d]}", label=t.label, tokens=lengths.astype(np.int64),
                            passes=passes, workload=t.workload[starts].astype(np.int64),
                            chosen=np.zeros(0, np.int64), cluster=np.zeros(0, np.int64))


def trajectory_oracle(t: BlockTable) -> TrajectoryResult:
    """Fewest target passes per prompt when any drafter may run at any block start.

    Dynamic programming backwards over positions, all prompts at once:
    f(pos) = 0 for pos >= n, else 1 + min_d f(pos + a_d(pos) + 1).
    """
    _require_dense(t)
    starts, lengths = _prompt_rows(t)
    P, N = t.n_prompts, int(lengths.max())
    pr = np.arange(P)
    f = np.zeros((P, N + 1), np.int64)           # f[:, N] = 0: past every output's end
    for pos in range(N - 1, -1, -1):
        live = pos < lengths
        r = starts[live] + pos
        nxt = np.minimum(pos + t.accepted[r].astype(np.int64) + 1, N)       # (live, D)
        f[live, pos] = 1 + f[pr[live][:, None], nxt].min(1)
    # a position past a prompt's end holds f = 0 only if nothing wrote it: positions >= n stay 0
    return TrajectoryResult(policy="oracle", label=t.label, tokens=lengths.astype(np.int64), passes=f[:, 0],
                            workload=t.workload[starts].astype(np.int64),
                            chosen=np.zeros(0, np.int64), cluster=np.zeros(0, np.int64))


# ---------------------------------------------------------------- entry points

def _load(paths: Sequence[Path] | None, drafters: str = "") -> tuple[BlockTable, str]:
    names = [d for d in drafters.split(",") if d] or None
    if paths:
        t = load_logs(paths, names)
        return t, f"[{t.label}] logs {', '.join(str(p) for p in paths)}"
    files, said = default_inputs()
    return load_logs(files, names), said


def cli(paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        drafters: Annotated[str, typer.Option(help="comma-separated subset of drafters")] = "",
        resamples: Annotated[int, typer.Option(help="bootstrap resamples for the 95% CIs (0: none)")] = 2000,
        seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0) -> None:
    """Counterfactual replay: mean accepted table, best fixed drafter, workload and per-block oracles, trajectories.

    PATHS default to the newest measured campaign under runs/ (else the shipped simulated one).
    --json prints one JSON object (keys: label, table, pooled, best_fixed, workload_headroom,
    per_block_gap, n_blocks, trajectory on dense logs, ci); --drafters a,b restricts the drafters.
    """
    from bandit.logs import LogError
    try:
        t, said = _load(paths, drafters)
    except LogError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1)
    s = summarize(t)
    if resamples > 0:
        s = with_ci(s, t, resamples, seed)
    if json_out:
        typer.echo(json.dumps(s.to_json(), sort_keys=True))
    else:
        typer.echo(said)
        typer.echo(t.summary())
        typer.echo(s.summary())


if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    app.command()(cli)
    app()
