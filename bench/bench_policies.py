"""Speed of the policy replay, measured side by side in one run.

1. Every policy of bandit/policies/registry.py replayed on ~100k simulated blocks in per-block mode
   through evaluate.run_policy, plus the hindsight baselines; target: all together <= 30 s.
2. The replay loop's own share: `Random` (a policy that does almost nothing) replayed again,
   as a fraction of the total, so the loop's per-block cost is visible next to the learners'.
3. The bootstraps of `evaluate.evaluate` (every statistic of every row on one set of resamples),
   timed apart from the replays.

Each policy's tokens per target pass is printed beside its time ([SIM], point values: a
speed benchmark, not a result; the sparse campaign's tokens are accepted + 1).

    python bench/bench_policies.py [--prompts 1000] [--out-len 100]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np

from bandit.sim import evaluate
from bandit.policies import walk
from bandit.policies.registry import Random, make_policies
from bandit.sim.simulate import SimConfig, simulate_table

TARGET_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=1000, help="per workload; 1000 x 4 x 100 tokens ~ 100k blocks")
    ap.add_argument("--out-len", type=int, default=100)
    args = ap.parse_args()
    t = simulate_table(SimConfig(n_prompts=args.prompts, out_len=args.out_len, dense=False, seed=0))
    n = int(t.is_block_start.sum())
    print(f"[SIM] {t.summary()}")
    order = np.random.default_rng(0).permutation(t.n_prompts)
    timing = walk.run_timing(t)
    # wall and CPU time side by side: on a shared machine the wall clock also measures the neighbours
    total, cpu_total = 0.0, 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    evaluate.hindsight_traces(t, "block")
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    total, cpu_total = total + dt, cpu_total + dc
    print(f"{'hindsight baselines':20s}{dt:8.2f} s wall {dc:8.2f} s cpu")
    for pol in make_policies(0):
        t0, c0 = time.perf_counter(), time.process_time()
        tr = evaluate.run_policy(t, pol, "block", order, timing)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        total, cpu_total = total + dt, cpu_total + dc
        print(
            f"{pol.name:20s}{dt:8.2f} s wall {dc:8.2f} s cpu {1e6 * dc / n:6.1f} us/block (cpu)  "
            f"tokens/pass {evaluate.trace_tokens(t, tr).mean():.3f} [SIM]"
        )
    for what, x in (("wall", total), ("cpu", cpu_total)):
        print(
            f"all policies, {n} blocks: {x:.1f} s {what} (target <= {TARGET_S:.0f} s: "
            f"{'met' if x <= TARGET_S else 'MISSED'}, {x / TARGET_S:.2f} of budget)"
        )
    t0 = time.perf_counter()
    evaluate.run_policy(t, Random(0), "block", order, timing)
    loop = time.perf_counter() - t0
    print(
        f"replay loop alone (random policy): {loop:.2f} s = {loop / total:.2f} of the total; "
        f"{1e6 * loop / n:.1f} us/block"
    )
    t0 = time.perf_counter()
    rep = evaluate.evaluate(t, "block", [Random(0)], seeds=(0,), n_resamples=1000)
    ev = time.perf_counter() - t0
    print(
        f"evaluate.evaluate with one policy (3 hindsight rows + 1, 1000 resamples each): {ev:.2f} s, "
        f"of which the replay of random {loop:.2f} s; {len(rep.results)} rows"
    )


if __name__ == "__main__":
    main()
