"""Speed of the bootstrap, measured side by side in one run (ratios, not absolute targets, are the claim).

0. Where `python bandit/ci.py`'s time goes on the default campaign: the share spent drawing resamples
   and summing columns (bandit/stats/resample.py, plain numpy). It is why no compiled kernel is kept: a
   kernel could save at most that share (issue 14 asked for one only if it saved a fifth).
1. `python bandit/ci.py` end to end (load, every headline entry, nested selector refits included)
   with 10,000 resamples on a simulated ~10k-block, 4-drafter, 4-workload dense log; target <= 60 s.
2. The per_block_gap CI (best fixed drafter re-chosen per resample) by bandit/ci.py's engine
   (bandit/stats/resample.py) vs scipy.stats.bootstrap on the same statistic, same data, same number of
   resamples; target >= 10x. Each side is timed --repeat times, alternating, and its best time
   is compared (the machine may be shared: the best of a few runs is the least disturbed one).

3. The selector's nested refits: one fold's logistic fits for every resample at once (bandit/stats/logistic.py) vs a
   scikit-learn pipeline loop over the same weighted resamples; target >= 10x, coefficients compared.
4. Every report command (bandit/logs/outputs.py DOCUMENTED, the bandit/ ones) on the published campaign, each a
   process of its own with its default options, writing into a temporary directory (--out): its wall time, the
   machine's load average beside it; `python bandit/core.py` target < 30 s (issue 25). `--reports-only` runs this
   part alone; `bench/coverage.py` (minutes) is left out unless `--with-coverage`.

    python bench/bench_ci.py [--resamples 10000] [--prompts 104] [--repeat 5] [--reports-only] [--with-coverage]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np
import scipy.stats

from bandit import ci, selector_fit
from bandit.stats import bootstrap
from bandit.logs import progress
from bandit.stats import resample
from bandit.stats import trajectory
from bandit.logs.reader import default_inputs, load_logs
from bandit.sim.simulate import SimConfig, write_sim_run


def gap_stat(T: np.ndarray) -> np.ndarray:
    # T (n, D + 1): summed [a_1..a_D, max_d a_d]; best fixed drafter re-chosen per resample
    return (T[:, -1] / T[:, :-1].max(1) - 1)[:, None]


def resampling_share() -> None:
    """Time of bandit/ci.py's headline on the default campaign, and the part of it spent in bandit/stats/resample.py."""
    files, said = default_inputs()
    spent = {"count_chunks": 0.0, "sum_chunks": 0.0}
    inside = [0]  # sum_chunks reads count_chunks: time only the outermost call

    def timed(name, fn):
        def run(*a, **k):
            outer = inside[0] == 0
            inside[0] += 1
            try:
                it, t0 = fn(*a, **k), time.perf_counter()
                for x in it:
                    if outer:
                        spent[name] += time.perf_counter() - t0
                    inside[0] -= 1
                    yield x
                    inside[0] += 1
                    t0 = time.perf_counter()
                if outer:
                    spent[name] += time.perf_counter() - t0
            finally:
                inside[0] -= 1

        return run

    real = resample.count_chunks, resample.sum_chunks
    resample.count_chunks, resample.sum_chunks = timed("count_chunks", real[0]), timed("sum_chunks", real[1])
    progress.quiet()
    try:
        t0 = time.perf_counter()
        t = load_logs(files)
        t_load = time.perf_counter() - t0
        ci.headline(t)
        total = time.perf_counter() - t0
    finally:
        resample.count_chunks, resample.sum_chunks = real
    sums, counts = spent["sum_chunks"], spent["count_chunks"]
    print(
        f"{said}\nbandit/ci.py's load + headline: {total:.1f} s (load {t_load:.1f} s); in bandit/stats/resample.py: "
        f"column sums (draws included) {sums:.2f} s, resample counts for the refits {counts:.2f} s, together "
        f"{100 * (sums + counts) / total:.1f}% of the run (a compiled kernel would be kept only above 20%)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--prompts", type=int, default=104, help="per workload; 104 x 4 x 100 tokens ~ 10k blocks")
    ap.add_argument("--refit", type=int, default=ci.N_REFIT)
    ap.add_argument("--repeat", type=int, default=5, help="timings per side (best one counts)")
    ap.add_argument("--reports-only", action="store_true", help="time the report commands only (part 4)")
    ap.add_argument("--with-coverage", action="store_true", help="part 4 also times bench/coverage.py")
    args = ap.parse_args()
    if args.reports_only:
        return report_times(args.with_coverage)
    n = args.resamples
    resampling_share()
    with tempfile.TemporaryDirectory() as tmp:
        write_sim_run(SimConfig(n_prompts=args.prompts, out_len=100, seed=11), pathlib.Path(tmp) / "sim")
        t0 = time.perf_counter()
        ci.main([pathlib.Path(tmp) / "sim"], pathlib.Path(tmp) / "ci.json", n_resamples=n, seed=0, n_refit=args.refit)
        t_ci = time.perf_counter() - t0
        t = load_logs([pathlib.Path(tmp) / "sim"])
    b = trajectory.block_set(t)
    print(
        f"[SIM] log: {b.n_records} blocks, {t.n_records} records, {len(b.drafters)} drafters, {len(b.workloads)} workloads"
    )
    print(
        f"bandit/ci.py end to end, {n} resamples (nested selector refits: {min(args.refit, n)}): {t_ci:.1f} s "
        f"(target <= 60 s: {'met' if t_ci <= 60 else 'MISSED'})"
    )

    a = b.accepted.astype(float)
    cols = np.c_[a, a.max(1)]

    def stat(*xs, axis=-1):
        s = [x.sum(axis) for x in xs]
        return s[-1] / np.max(s[:-1], axis=0) - 1

    def ours(values: np.ndarray, unit: str):
        value, boot, _ = bootstrap.boot_totals(values, gap_stat, np.zeros(len(values), int), n, seed=0, jackknife=False)
        return bootstrap.interval(value[0], boot[:, 0], None, "percentile", unit, 0)

    def theirs(values: np.ndarray, batch: int | None):
        return scipy.stats.bootstrap(
            tuple(values.T),
            stat,
            paired=True,
            vectorized=True,
            n_resamples=n,
            batch=batch,
            method="percentile",
            random_state=0,
        ).confidence_interval

    def race(values: np.ndarray, unit: str, batch: int | None):
        t_mine, t_scipy = [], []
        for _ in range(max(1, args.repeat)):  # alternate, so that a busy spell of the machine hits both sides
            t0 = time.perf_counter()
            mine = ours(values, unit)
            t_mine.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = theirs(values, batch)
            t_scipy.append(time.perf_counter() - t0)
        med = float(np.median(t_scipy) / np.median(t_mine))
        return mine, ref, min(t_mine), min(t_scipy), med

    mine, ref, t_mine, t_scipy, med = race(cols, "block", 200)
    print(
        f"per_block_gap CI, block unit, {n} resamples: ours {t_mine:.2f} s {mine}, scipy.stats.bootstrap "
        f"{t_scipy:.2f} s [{ref.low:.4f}, {ref.high:.4f}]; speed ratio {t_scipy / t_mine:.1f}x (target >= 10x: "
        f"{'met' if t_scipy / t_mine >= 10 else 'MISSED'}; ratio of medians {med:.1f}x) [SIM]"
    )
    # the default unit: prompt clusters. scipy cannot stratify, so both resample the clusters' totals in one stratum
    units, strata = bootstrap.cluster_units(b, "prompt")
    tot = np.zeros((strata.size, cols.shape[1]))
    np.add.at(tot, units, cols)
    mine, ref, t_mine, t_scipy, med = race(tot, "prompt", None)
    print(
        f"per_block_gap CI, prompt-cluster unit ({strata.size} clusters), {n} resamples: ours {t_mine:.3f} s {mine}, "
        f"scipy.stats.bootstrap {t_scipy:.3f} s [{ref.low:.4f}, {ref.high:.4f}]; speed ratio {t_scipy / t_mine:.1f}x "
        f"(target >= 10x: {'met' if t_scipy / t_mine >= 10 else 'MISSED'}; ratio of medians {med:.1f}x) [SIM]"
    )
    # scipy's default call for a statistic without an `axis` argument: one Python call per resample
    t0 = time.perf_counter()
    scipy.stats.bootstrap(
        tuple(tot.T),
        lambda *xs: stat(*xs),
        paired=True,
        vectorized=False,
        n_resamples=n,
        method="percentile",
        random_state=0,
    )
    t_loop = time.perf_counter() - t0
    print(
        f"  same, scipy.stats.bootstrap with vectorized=False (once): {t_loop:.3f} s; speed ratio {t_loop / t_mine:.1f}x"
    )
    # the nested selector refits: every resample's logistic model at once (bandit/stats/logistic.py) vs scikit-learn's loop
    from bandit.stats import logistic
    from bench_logistic import sklearn_loop

    p0 = trajectory.primary(t)
    c = selector_fit.candidates(t, [p0])[p0]
    _, strata_p = bootstrap.cluster_units(t, "prompt")
    S = np.take(bootstrap.resample_counts(strata_p, args.refit, 0).astype(float), c.prompt, axis=1)
    y = (np.delete(c.tau, c.q, 1).max(1) > c.tau[:, c.q]).astype(float)
    t_b, t_s = [], []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        fit = logistic.fit_batched(c.X, y, S)
        t_b.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        coef, _ = sklearn_loop(c.X, y, S, tol=1e-10)
        t_s.append(time.perf_counter() - t0)
    ratio = min(t_s) / min(t_b)
    print(
        f"selector refit, {args.refit} resamples x {c.X.shape[0]} blocks: batched {min(t_b):.3f} s, scikit-learn loop "
        f"{min(t_s):.3f} s; speed ratio {ratio:.1f}x (target >= 10x: {'met' if ratio >= 10 else 'MISSED'}); "
        f"max |coef diff| {np.abs(fit.coef - coef).max():.1e} [SIM]"
    )
    print(
        f"timings: best of {max(1, args.repeat)} per side, alternating. Both sides draw P clusters per resample; ours "
        "draws 16-bit words into per-cluster counts and sums columns as counts @ values per stratum, scipy draws int64 "
        "indices and gathers each column separately"
    )
    report_times(args.with_coverage)


REPORT_OUT = {  # each documented report command and the option that sends its files elsewhere
    "python bandit/ci.py": ["--out", "{tmp}/ci.json"],
    "python bandit/replay.py": ["--out", "{tmp}/replay.txt"],
    "python bandit/selector.py": ["--out-dir", "{tmp}"],
    "python bandit/breakeven.py": ["--out", "{tmp}/breakeven.txt"],
    "python bandit/wallclock.py": ["--out", "{tmp}/wallclock.json"],
    "python bandit/core.py": ["--out", "{tmp}/core.txt"],
    "python bench/coverage.py": ["--out", "{tmp}/coverage.json"],
}


def report_times(with_coverage: bool) -> None:
    """Part 4: each report command's wall time on the published campaign, one process each, default options."""
    import os
    import subprocess

    from bandit.logs.outputs import DOCUMENTED

    root = pathlib.Path(__file__).resolve().parents[1]
    commands = sorted(set(DOCUMENTED.values()), key=list(REPORT_OUT).index)
    missing = [c for c in commands if c not in REPORT_OUT]
    assert not missing, f"bench_ci.py REPORT_OUT lacks {missing}"
    print(f"report commands on the published campaign ({default_inputs()[1]}), {os.cpu_count()} cores:")
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in commands:
            if cmd.endswith("coverage.py") and not with_coverage:
                print(f"  {cmd:<28} (skipped: --with-coverage)")
                continue
            argv = [sys.executable, *cmd.split()[1:], *(a.format(tmp=tmp) for a in REPORT_OUT[cmd])]
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            p = subprocess.run(argv, cwd=root, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
            dt = time.perf_counter() - t0
            status = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode}: {p.stderr.strip()[-200:]})"
            target = ""
            if cmd == "python bandit/core.py":
                target = f" (target < 30 s: {'met' if dt < 30 else 'MISSED'})"
            print(f"  {cmd:<28} {dt:7.1f} s{target}  load before {load:.2f}  {status}")


if __name__ == "__main__":
    main()
