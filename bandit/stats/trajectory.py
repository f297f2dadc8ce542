"""Which blocks a statistic is computed on: trajectories of fixed drafters on dense logs, and the primary.

A dense log holds a record at every output position. Averaging over every position counts
a position inside a long accepted run as many times as it is revisited, so the mean is
length-biased. The project's definitions (docs/DESIGN.md, "Which blocks") therefore fix the
block set B before any statistic:

- sparse log: B = the logged behaviour trajectory's block starts (records with `block`; every
  record of a prompt none of whose records has one);
- dense log: B = the *primary's own trajectory starts*. The primary is the fixed drafter with the
  highest measured tokens/s pooled over the run's live phase where one is attached (bandit/live/primary.py:
  output tokens summed over the live sample / wall time summed), else the token proxy: the most output
  tokens per target pass along its own trajectory (the fewest passes in total). First in name order
  on ties. Its trajectory starts at position 0 and each block starts at pos + accepted + 1. Any
  `block` marks in a dense log are ignored.

Every caller that re-chooses the primary in a resample does it through `choose_primary` on its
resampled sums, so the rule is the same in the full data and in every resample.

Everything here is vectorised over prompts; `python bandit/stats/trajectory.py [PATHS]` prints each
fixed drafter's tokens per pass and which drafter is the primary.
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/stats/trajectory.py`: import our `bandit`, not a namesake
    import pathlib, sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import sys
from dataclasses import dataclass, replace

import numpy as np

from bandit.logs.table import BlockTable


def require_dense(t: BlockTable) -> None:
    if not t.dense:
        raise ValueError(
            "trajectory replay needs a dense log (a record at every position 0..n-1 of every "
            "prompt); this one is sparse"
        )


def prompt_rows(t: BlockTable) -> tuple[np.ndarray, np.ndarray]:
    """(start (P,), length (P,)) of each prompt's rows (records are sorted by prompt, pos)."""
    starts = np.searchsorted(t.prompt, np.arange(t.n_prompts))
    ends = np.searchsorted(t.prompt, np.arange(t.n_prompts), side="right")
    return starts, ends - starts


def output_lengths(t: BlockTable) -> np.ndarray:
    """(P,) int64 output tokens of each prompt of a dense log (its number of positions)."""
    require_dense(t)
    return prompt_rows(t)[1].astype(np.int64)


def remaining(t: BlockTable) -> np.ndarray | None:
    """(R,) tokens left in the output from each record on (n - pos) on a dense log; None on a sparse one."""
    return output_lengths(t)[t.prompt] - t.pos if t.dense else None


def fixed_starts(t: BlockTable) -> np.ndarray:
    """(R, D) bool: row r is a block start of always-drafter-d's trajectory (dense logs)."""
    require_dense(t)
    return (
        np.stack([walk(t, lambda r, d=d: t.accepted[r, d])[0] for d in range(len(t.drafters))], 1)
        if t.drafters
        else np.zeros((t.n_records, 0), bool)
    )


def fixed_passes(t: BlockTable, starts: np.ndarray | None = None) -> np.ndarray:
    """(P, D) int64 target passes of each fixed drafter's trajectory, per prompt (dense logs)."""
    s = fixed_starts(t) if starts is None else starts
    out = np.zeros((t.n_prompts, s.shape[1]), np.int64)
    np.add.at(out, t.prompt, s.astype(np.int64))
    return out


MEASURED_RULE = "fastest fixed drafter measured live [MEASURED]"
TIMED_RULE = "fastest fixed drafter under the run's measured step timing, no live phase [MODEL]"
DENSE_PROXY_RULE = "most tokens per target pass (token proxy)"
SPARSE_PROXY_RULE = "highest mean accepted over the logged block starts (token proxy)"


def primary_index(passes: np.ndarray) -> np.ndarray:
    """Token-proxy primary per row of summed passes: (n, D) -> (n,) argmin (most tokens per pass; first on ties)."""
    return np.argmin(np.asarray(passes), axis=-1)


def choose_primary(
    proxy: np.ndarray, live_tokens: np.ndarray | None = None, live_ms: np.ndarray | None = None
) -> np.ndarray:
    """The primary per row of sums (n, D) -> (n,): the highest measured tokens/s (live_tokens / live_ms, the live
    sample's sums) where given, else the highest `proxy` (the token proxy as a score, higher better: -passes on
    dense logs, summed accepted on sparse ones). First in drafter order on ties. A row whose live sums are all 0
    (a resample that drew no live prompt) falls back to the proxy."""
    proxy = np.asarray(proxy, float)
    out = np.argmax(proxy, axis=-1)
    if live_tokens is None or live_ms is None:
        return out
    ms = np.asarray(live_ms, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(ms > 0, np.asarray(live_tokens, float) / ms, -np.inf)
    timed = (ms > 0).any(axis=-1)
    return np.where(timed, np.argmax(rate, axis=-1), out)


def rule_name(t: BlockTable) -> str:
    """How t's primary is chosen, in words (every report that says "over the primary" names it)."""
    if t.primary_rule:
        return t.primary_rule
    return DENSE_PROXY_RULE if t.dense else SPARSE_PROXY_RULE


def proxy_key(t: BlockTable, starts: np.ndarray | None = None) -> np.ndarray:
    """(P, D) per-prompt token-proxy score summed by `choose_primary`: dense logs -passes of each fixed drafter's
    own trajectory, sparse logs the accepted tokens over the logged block starts."""
    if t.dense:
        return -fixed_passes(t, starts).astype(float)
    b = t.is_block_start
    out = np.zeros((t.n_prompts, len(t.drafters)))
    np.add.at(out, t.prompt[b], t.accepted[b].astype(float))
    return out


def primary(t: BlockTable, starts: np.ndarray | None = None) -> int:
    """Index of the primary (`rule_name`): the fastest fixed drafter measured live where t carries its live phase;
    else dense logs, most tokens per target pass along its own trajectory; sparse logs, the highest mean accepted
    over the logged block starts. `starts`: fixed_starts(t), when the caller has it already."""
    return int(choose_primary(proxy_key(t, starts).sum(0), *live_sums(t))[()])


def live_sums(t: BlockTable, weights: np.ndarray | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(tokens (D,), ms (D,)) of the fixed drafters over t's live sample (weights (m, P): (m, D) each), or
    (None, None) without a live phase."""
    if t.live_tokens is None or t.live_ms is None:
        return None, None
    if weights is None:
        return t.live_tokens.sum(0), t.live_ms.sum(0)
    return weights @ t.live_tokens, weights @ t.live_ms


def block_set(t: BlockTable, p: int | None = None) -> BlockTable:
    """The table restricted to its block set B: dense logs, drafter p's (default: the primary's) own
    trajectory starts with `block` numbered along it; sparse logs, the logged block starts."""
    if not t.dense:
        if p is not None:
            raise ValueError("a sparse log has one block set, the logged trajectory's; no drafter can be chosen")
        return t.blocks()
    starts = fixed_starts(t)
    p = primary(t, starts) if p is None else p
    keep = starts[:, p]
    b = t.take(keep)
    # number the blocks within each prompt, 0, 1, ... (rows are sorted by prompt, pos)
    first = np.searchsorted(b.prompt, b.prompt)
    return replace(b, block=(np.arange(b.n_records) - first).astype(np.int64))


def block_mask(t: BlockTable) -> np.ndarray:
    """(R,) bool: the rows of t's block set B (see `block_set`)."""
    if not t.dense:
        return t.is_block_start
    starts = fixed_starts(t)
    return starts[:, primary(t, starts)]


def block_tokens(t: BlockTable, rows: np.ndarray) -> np.ndarray:
    """(B, D) tokens each drafter's block would produce at records `rows` (indices or a mask) of t, capped at the
    output's end on dense logs (nothing is counted past the end of an output): min(a + 1, n - pos)."""
    tau = t.accepted[rows].astype(np.int64) + 1
    if not t.dense:
        return tau
    rem = output_lengths(t)[t.prompt[rows]] - t.pos[rows]
    return np.minimum(tau, rem[:, None])


def describe(t: BlockTable) -> str:
    if not t.dense:
        b = t.blocks()
        p = primary(t)
        return (
            f"[{t.label}] sparse log: block set = the logged trajectory's {b.n_records} block starts; "
            f"primary {t.drafters[p]} ({rule_name(t)})"
        )
    s = fixed_starts(t)
    passes = fixed_passes(t, s).sum(0)
    tokens = int(output_lengths(t).sum())
    p = primary(t, s)
    lines = [
        f"[{t.label}] dense log: {tokens} output tokens in {t.n_prompts} prompts; "
        "tokens per target pass along each fixed drafter's own trajectory:"
    ]
    for d, name in enumerate(t.drafters):
        lines.append(
            f"  {name:10s} {tokens / passes[d]:7.3f}  ({int(passes[d])} passes){'  <- primary' if d == p else ''}"
        )
    lines.append(f"primary {t.drafters[p]}: {rule_name(t)}")
    if t.live_tokens is None:  # this layer reads no live phase; the module that does says what it changes
        lines.append(
            "(where the run has a live phase, `python bandit/live/primary.py` gives the primary by measured speed)"
        )
    lines.append(f"block set B = the primary's {int(passes[p])} trajectory starts (not all {t.n_records} positions)")
    return "\n".join(lines)


@dataclass(frozen=True)
class TrajectoryResult:
    """Trajectory replay on a dense log: tokens and target passes per prompt (P prompts)."""

    policy: str
    label: str
    tokens: np.ndarray  # (P,) int: output tokens produced (the output's length)
    passes: np.ndarray  # (P,) int: target passes (blocks) used
    workload: np.ndarray  # (P,) int
    chosen: np.ndarray  # (B,) int: drafter per block, prompt by prompt ([] for the vectorised oracle)
    cluster: np.ndarray  # (B,) int: prompt of each block

    @property
    def tokens_per_pass(self) -> float:
        return float(self.tokens.sum() / self.passes.sum())


def walk(t: BlockTable, accepted_at) -> tuple[np.ndarray, np.ndarray]:
    """Walk every prompt from position 0, the next block at pos + accepted_at(rows) + 1; (starts (R,) bool, passes (P,))."""
    require_dense(t)
    starts, lengths = prompt_rows(t)
    pos = np.zeros(t.n_prompts, np.int64)
    passes = np.zeros(t.n_prompts, np.int64)
    mask = np.zeros(t.n_records, bool)
    live = pos < lengths
    while live.any():
        r = starts[live] + pos[live]
        mask[r] = True
        pos[live] += np.asarray(accepted_at(r), np.int64) + 1
        passes[live] += 1
        live = pos < lengths
    return mask, passes


def _result(t: BlockTable, policy: str, passes: np.ndarray) -> TrajectoryResult:
    starts, lengths = prompt_rows(t)
    return TrajectoryResult(
        policy=policy,
        label=t.label,
        tokens=lengths.astype(np.int64),
        passes=passes,
        workload=t.workload[starts].astype(np.int64),
        chosen=np.zeros(0, np.int64),
        cluster=np.zeros(0, np.int64),
    )


def fixed_trajectory(t: BlockTable, d: int) -> TrajectoryResult:
    """`trajectory_replay` of always-drafter-d, vectorised over prompts (same result, no Python per block)."""
    return _result(t, f"fixed:{t.drafters[d]}", walk(t, lambda r: t.accepted[r, d])[1])


def greedy_oracle_trajectory(t: BlockTable) -> TrajectoryResult:
    """The greedy per-block oracle as a trajectory: at every block start the drafter that accepts most
    (first on ties), the next block where it ends. A real trajectory, so never above the shortest path."""
    return _result(t, "greedy_oracle", walk(t, lambda r: t.accepted[r].max(1))[1])


def trajectory_oracle(t: BlockTable) -> TrajectoryResult:
    """Fewest target passes per prompt when any drafter may run at any block start, its draft verified
    whole or cut to any shorter length (a cut draft of L tokens accepts min(a, L)).

    A block starting at pos can therefore end anywhere from pos + 1 to pos + max_d a_d(pos) + 1, so the
    shortest path bounds every policy, cutting or not. Dynamic programming backwards over positions, all
    prompts at once: f(pos) = 0 for pos >= n, else 1 + min over j in (pos, pos + max_d a_d(pos) + 1] of f(j).
    """
    require_dense(t)
    starts, lengths = prompt_rows(t)
    P, N = t.n_prompts, int(lengths.max())
    pr = np.arange(P)
    reach = int(t.accepted.max(initial=0)) + 1
    f = np.zeros((P, N + 1), np.int64)  # f[:, N] = 0: past every output's end
    for pos in range(N - 1, -1, -1):
        live = pr[pos < lengths]
        far = t.accepted[starts[live] + pos].max(1).astype(np.int64) + 1  # (live,) longest block
        best = np.full(live.size, np.iinfo(np.int64).max)
        for o in range(1, reach + 1):
            ok = o <= far
            best = np.where(ok, np.minimum(best, f[live, min(pos + o, N)]), best)
        f[live, pos] = 1 + best
    # a position past a prompt's end holds f = 0 only if nothing wrote it: positions >= n stay 0
    return TrajectoryResult(
        policy="oracle",
        label=t.label,
        tokens=lengths.astype(np.int64),
        passes=f[:, 0],
        workload=t.workload[starts].astype(np.int64),
        chosen=np.zeros(0, np.int64),
        cluster=np.zeros(0, np.int64),
    )


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        print(said)
        print(describe(load_logs(files)))

    demo(body, "The block set: fixed-drafter trajectories, the primary, the oracles.")
