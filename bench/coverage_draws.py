"""bench/coverage.py's draws: ci.json's intervals on a drawn campaign, the truth, and the coverage rows.

A draw is a campaign simulated from the fitted configuration (`sim`, bench/coverage_sim.py) or a subsample of
prompts of the measured one (`subsample`); its intervals are made by ci.json's code path (`intervals`) once per
resampling unit, in worker processes (`run_study`; one BLAS thread each, so the file does not depend on the
machine or on `--jobs`). `rows_of` counts the draws whose interval covers the truth, with a Wilson interval.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri
from tqdm import tqdm

from bandit import ci, replay
from bandit.logs.table import BlockTable
from bandit.stats import bootstrap, trajectory
from bench.coverage_sim import derive, sim_table

STUDIES = ("sim", "subsample")
LEVEL = 0.95


def wilson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (scipy's binomtest(k, n).proportion_ci('wilson'))."""
    if n <= 0:
        return float("nan"), float("nan")
    z = float(ndtri(0.5 + level / 2))
    p = k / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, c - h), min(1.0, c + h)


def rounded(x, nd: int = 6) -> float | None:
    """Rounded for the JSON; None where not finite."""
    return round(float(x), nd) if x is not None and np.isfinite(x) else None


def intervals(
    t: BlockTable, unit: str, names: Sequence[str], resamples: int, refit: int, seed: int, method: str
) -> dict[str, bootstrap.Interval]:
    """ci.json's intervals of `names` on t for one unit, by ci.json's code path; entries whose interval ci.py makes
    on another unit are left out."""
    if any(n.startswith("selector") for n in names):
        entries = ci.headline(t, unit, method, resamples, seed, refit, live=False)
    else:
        entries = replay.table_stats(t, unit, resamples, seed, method)
    want = set(names)
    return {e.name: e.ci for e in entries if e.name in want and e.ci.unit == unit}


def subsample(t: BlockTable, n: int, seed: int) -> BlockTable:
    """n prompts per workload of t, drawn without replacement; prompts re-indexed."""
    rng = np.random.default_rng(seed)
    starts, _ = trajectory.prompt_rows(t)
    pw = t.workload[starts]
    keep = np.zeros(t.n_prompts, bool)
    for w in range(len(t.workloads)):
        idx = np.nonzero(pw == w)[0]
        if n >= idx.size:
            raise ValueError(f"--prompts-per-workload {n}: workload {t.workloads[w]} has only {idx.size} prompts")
        keep[rng.choice(idx, n, replace=False)] = True
    return t.take_prompts(keep)


# ---------------------------------------------------------------- the studies


@dataclass(frozen=True)
class Plan:
    study: str
    source: object  # BlockTable (subsample) or Fit (sim)
    names: tuple[str, ...]
    units: tuple[str, ...]
    n: int  # prompts per workload of a draw
    resamples: int
    refit: int
    method: str
    seed: int


_PLAN: Plan | None = None


def one_thread() -> None:
    """One BLAS thread: a threaded reduction would make the logistic fits, hence the file, depend on the machine."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover
        pass


def _init(plan: Plan) -> None:
    global _PLAN
    _PLAN = plan
    one_thread()


def one_draw(i: int, plan: Plan | None = None) -> dict[str, dict[str, list[float]]]:
    """Draw i of a study: {unit: {entry: [value, lo, hi]}}."""
    plan = plan or _PLAN
    sid = STUDIES.index(plan.study)
    if plan.study == "sim":
        t = sim_table(plan.source, plan.n, derive(plan.seed, sid, i))
    else:
        t = subsample(plan.source, plan.n, derive(plan.seed, sid, i))
    out = {}
    for unit in plan.units:
        ivs = intervals(t, unit, plan.names, plan.resamples, plan.refit, derive(plan.seed, sid, i, 2), plan.method)
        out[unit] = {k: [v.value, v.lo, v.hi] for k, v in ivs.items()}
    return out


def run_study(plan: Plan, draws: int, jobs: int) -> list[dict]:
    it = range(draws)
    desc = f"{plan.study} ({plan.n} prompts/workload)"
    if jobs > 1 and draws > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_init, initargs=(plan,)) as ex:
            return list(tqdm(ex.map(one_draw, it), total=draws, desc=desc, file=sys.stderr))
    return [one_draw(i, plan) for i in tqdm(it, desc=desc, file=sys.stderr)]


def truth_of(t: BlockTable, names: Sequence[str], units: Sequence[str], method: str) -> dict[str, dict[str, float]]:
    """{unit: {entry: value}} on t (the value does not depend on the resamples)."""
    return {u: {k: v.value for k, v in intervals(t, u, names, 4, 2, 0, method).items()} for u in units}


def rows_of(study: str, label: str, draws: list[dict], truth: dict[str, dict[str, float]]) -> list[dict]:
    rows = []
    for unit, tv in truth.items():
        for name, tru in tv.items():
            got = [d[unit][name] for d in draws if name in d.get(unit, {})]
            v = np.array(got, float).reshape(-1, 3)
            ok = np.isfinite(v[:, 1]) & np.isfinite(v[:, 2])
            hit = ok & (v[:, 1] <= tru) & (tru <= v[:, 2])
            n, k = len(v), int(hit.sum())
            lo, hi = wilson(k, n)
            r = {
                "study": study,
                "entry": name,
                "unit": unit,
                "label": label,
                "coverage": round(k / n, 4) if n else None,
                "coverage_ci": [round(lo, 4), round(hi, 4)] if n else None,
                "draws": n,
                "mean_width": rounded(np.mean(v[ok, 2] - v[ok, 1])) if ok.any() else None,
                "truth": rounded(tru),
                "mean_estimate": rounded(np.nanmean(v[:, 0])) if np.isfinite(v[:, 0]).any() else None,
                "miss_below": int((ok & (tru < v[:, 1])).sum()),
                "miss_above": int((ok & (tru > v[:, 2])).sum()),
                "undefined": int((~ok).sum()),
                "absent": len(draws) - n,
            }
            # the names paper/build.py reads
            r["statistic"], r["coverage_ci95"] = f"{name} ({study})", r["coverage_ci"]
            rows.append(r)
    return rows
