"""The replay's headline statistics with bootstrap CIs, from per-cluster totals on the campaign's block set.

What ci.json's replay entries are (docs/DESIGN.md, "Definitions"): per_block_gap, workload_headroom,
the trajectory and greedy oracle gains, and the mean accepted and tokens-per-pass tables, each with
the primary and its block set re-chosen in every resample (bandit/stats/bootstrap.py's ratio engine).

    python bandit/replay_stats.py [PATHS...]     # the entries on the default campaign
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/replay_stats.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import numpy as np

from bandit.stats import trajectory
from bandit.stats.bootstrap import Entry, boot_totals, cluster_units, interval
from bandit.logs.table import BlockTable
from bandit.stats.trajectory import greedy_oracle_trajectory, trajectory_oracle


def table_stats(t: BlockTable, unit: str, n_resamples: int, seed: int, method: str) -> list[Entry]:
    """The replay's headline numbers on t's block set, from per-cluster totals (docs/DESIGN.md).

    Sparse logs: per_block_gap, workload_headroom and mean_accepted[w][d] over the logged block
    starts, the best fixed drafter (highest pooled mean accepted) re-chosen per resample.
    Dense logs, prompt unit: the primary (`trajectory.rule_name`: measured tokens/s over the live sample
    where a live phase is attached, else the fewest target passes along its own trajectory) is re-chosen
    in every resample and every statistic is computed on its block set: per_block_gap and
    mean_accepted[w][d] over its trajectory starts; workload_headroom, trajectory_oracle_gain,
    greedy_oracle_gain and tokens_per_pass[w][d] in tokens per target pass. Dense logs, block unit:
    single blocks of the full data's primary's block set are resampled for per_block_gap and the mean
    accepted table (the primary is then fixed); trajectories live inside a prompt, so the
    tokens-per-pass entries (workload_headroom included) stay on the prompt unit.
    """
    if not t.dense:
        return accepted_entries(t.blocks(), unit, n_resamples, seed, method, rechoose=True, live=True)
    out = _dense_stats(t, n_resamples, seed, method)
    if unit == "block":
        b = trajectory.block_set(t)
        blk = {
            e.name: e
            for e in accepted_entries(b, unit, n_resamples, seed, method, rechoose=False, primary=trajectory.primary(t))
        }
        # only the accepted-token statistics of the block set are resampled by block; the tokens-per-pass ones
        # (headroom, oracle gains, tokens_per_pass) are trajectories, which live inside a prompt
        keep = {n for n in blk if n == "per_block_gap" or n.startswith("mean_accepted[")}
        out = [blk[e.name] if e.name in keep else e for e in out]
    return out


def accepted_entries(
    b: BlockTable,
    unit: str,
    n_resamples: int,
    seed: int,
    method: str,
    rechoose: bool,
    primary: int | None = None,
    live: bool = False,
) -> list[Entry]:
    """per_block_gap, workload_headroom (accepted tokens) and the mean accepted table over the rows of b.

    rechoose: the primary re-chosen in every resample, by the highest pooled accepted (the sparse token proxy) or,
    with `live` and a live phase attached, by measured tokens/s (each prompt's live sums ride on its first row, so
    a prompt cluster brings them along; single blocks bring them with that row)."""
    units, strata = cluster_units(b, unit)
    W, D = len(b.workloads), len(b.drafters)
    a = b.accepted.astype(float)
    # per row: for its workload w, columns [count, a_1..a_D, max_d a_d] in slot w: (R, W*(D+2))
    row = np.zeros((b.n_records, W, D + 2))
    row[np.arange(b.n_records), b.workload] = np.c_[np.ones(b.n_records), a, a.max(1)]
    row = row.reshape(b.n_records, -1)
    timed = live and rechoose and b.live_tokens is not None
    if timed:
        first = np.r_[True, b.prompt[1:] != b.prompt[:-1]] if b.n_records else np.zeros(0, bool)
        extra = np.zeros((b.n_records, 2 * D))
        extra[first] = np.c_[b.live_tokens, b.live_ms][b.prompt[first]]
        row = np.c_[row, extra]
    totals = np.zeros((strata.size, row.shape[1]))
    np.add.at(totals, units, row)

    def stat(T: np.ndarray) -> np.ndarray:
        L = T[:, W * (D + 2) :]
        T = T[:, : W * (D + 2)].reshape(-1, W, D + 2)
        pooled = T[:, :, 1 : D + 1].sum(1)  # (n, D)
        if not rechoose:
            p = np.full(len(T), primary)
        else:
            p = trajectory.choose_primary(pooled, *((L[:, :D], L[:, D:]) if timed else (None, None)))
        ap = pooled[np.arange(len(p)), p]
        gap = T[:, :, D + 1].sum(1) / ap - 1
        head = T[:, :, 1 : D + 1].max(2).sum(1) / ap - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            means = T[:, :, 1 : D + 1] / T[:, :, :1]  # (n, W, D)
        return np.c_[gap, head, means.reshape(len(p), -1)]

    value, boot, jack = boot_totals(totals, stat, strata, n_resamples, seed, jackknife=method == "bca")
    names = ["per_block_gap", "workload_headroom"] + [
        f"mean_accepted[{w}][{d}]" for w in b.workloads for d in b.drafters
    ]
    nb = [b.n_records, b.n_records] + [int((b.workload == i).sum()) for i in range(W) for _ in range(D)]
    nc = [strata.size, strata.size] + [int((strata == i).sum()) for i in range(W) for _ in range(D)]
    return [
        Entry(
            n,
            interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, unit, seed),
            nb[i],
            nc[i],
            b.label,
        )
        for i, n in enumerate(names)
    ]


def _dense_stats(t: BlockTable, n_resamples: int, seed: int, method: str) -> list[Entry]:
    starts = trajectory.fixed_starts(t)  # (R, D): each drafter's own trajectory
    _, strata = cluster_units(t, "prompt")
    W, D, P = len(t.workloads), len(t.drafters), t.n_prompts
    a = t.accepted.astype(np.int64)
    # per prompt, in its workload's slot, for every candidate primary q: [blocks, a_1..a_D, max a] over
    # q's trajectory starts; then passes of every fixed drafter, of the shortest path, of the greedy oracle,
    # and output tokens; then the live phase's tokens and ms of every fixed drafter (zeros without one), from which
    # the primary is re-chosen by measured speed where the table carries a live phase. Integers but the live ms.
    per_q = np.zeros((P, D, D + 2), np.int64)
    for q in range(D):
        r = starts[:, q]
        np.add.at(per_q[:, q], t.prompt[r], np.c_[np.ones(int(r.sum()), np.int64), a[r], a[r].max(1)])
    passes = trajectory.fixed_passes(t, starts)
    oracle = trajectory_oracle(t).passes
    greedy = greedy_oracle_trajectory(t).passes
    tokens = trajectory.output_lengths(t)
    K = D * (D + 2) + D + 3 + 2 * D
    live = t.live_tokens is not None
    lt = np.c_[t.live_tokens, t.live_ms] if live else np.zeros((P, 2 * D))
    cols = np.c_[per_q.reshape(P, -1), passes, oracle, greedy, tokens, lt]
    totals = np.zeros((P, W, K))
    totals[np.arange(P), strata] = cols
    totals = totals.reshape(P, -1)
    o_pass, o_orc, o_gr, o_tok = D * (D + 2), D * (D + 2) + D, D * (D + 2) + D + 1, D * (D + 2) + D + 2

    def stat(T: np.ndarray) -> np.ndarray:
        n = len(T)
        T = T.reshape(n, W, K)
        pw = T[:, :, o_pass : o_pass + D]  # (n, W, D) passes
        L = T[:, :, o_tok + 1 :].sum(1)  # (n, 2D) live tokens, live ms
        p = trajectory.choose_primary(-pw.sum(1), *((L[:, :D], L[:, D:]) if live else (None, None)))  # per resample
        ix = np.arange(n)
        q = T[:, :, :o_pass].reshape(n, W, D, D + 2)[ix, :, p]  # (n, W, D+2) on p's block set
        ap = q[:, :, 1 : D + 1].sum(1)[ix, p]
        gap = q[:, :, D + 1].sum(1) / ap - 1
        pp = pw.sum(1)[ix, p]
        head = pp / pw.min(2).sum(1) - 1
        orc = pp / T[:, :, o_orc].sum(1) - 1
        gre = pp / T[:, :, o_gr].sum(1) - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            means = q[:, :, 1 : D + 1] / q[:, :, :1]  # (n, W, D)
            tpp = T[:, :, o_tok : o_tok + 1] / pw  # (n, W, D)
        return np.c_[gap, head, orc, gre, means.reshape(n, -1), tpp.reshape(n, -1)]

    value, boot, jack = boot_totals(totals, stat, strata, n_resamples, seed, jackknife=method == "bca")
    p0 = trajectory.primary(t, starts)
    nb_all = int(starts[:, p0].sum())
    nb_w = np.bincount(t.workload[starts[:, p0]], minlength=W)
    nc_w = np.bincount(strata, minlength=W)
    names = (
        ["per_block_gap", "workload_headroom", "trajectory_oracle_gain", "greedy_oracle_gain"]
        + [f"mean_accepted[{w}][{d}]" for w in t.workloads for d in t.drafters]
        + [f"tokens_per_pass[{w}][{d}]" for w in t.workloads for d in t.drafters]
    )
    nb = [nb_all] * 4 + [int(nb_w[i]) for i in range(W) for _ in range(D)] * 2
    nc = [P] * 4 + [int(nc_w[i]) for i in range(W) for _ in range(D)] * 2
    return [
        Entry(
            n,
            interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, "prompt", seed),
            nb[i],
            nc[i],
            t.label,
        )
        for i, n in enumerate(names)
    ]


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs
    from bandit.live.primary import attach_own

    def body(files, said: str) -> None:
        t = attach_own(load_logs(files))
        print(said)
        for e in table_stats(t, "prompt", 2000, 0, "percentile"):
            print(f"[{e.label}] {e.name}: {e.ci}")

    demo(body, "Every replay statistic with its 95% CI (2000 resamples, seed 0).")
