"""Bootstrap confidence intervals over prompt clusters: the units, the two engines and the intervals.

Knows nothing of drafters, selectors or reports: a statistic comes in as a function of summed
per-cluster totals (`boot_totals`, the ratio-of-sums statistics) or of row weights (`boot_weights`,
statistics that refit a model per resample), and an `Interval` goes out. The resamples themselves
(which clusters each one draws) come from bandit/stats/resample.py, one stream per (strata, n, seed),
so that every statistic of a report is computed on the same resamples.

The resampling unit is the prompt cluster (prompts drawn with replacement within each workload;
every block of a drawn prompt comes along) or single blocks within each workload (`unit="block"`;
it under-covers when blocks of a prompt are correlated, see bench/coverage.py).

Methods: percentile (default) and BCa (bias from the bootstrap, acceleration from a jackknife over
clusters, or a delete-a-group jackknife over JACK_GROUPS groups for refit statistics). Percentile
and basic intervals are compared: they coincide for a statistic whose bootstrap distribution is
symmetric about the estimate, and a max over near-tied drafters is not; when they differ by more
than DISAGREE_TOL of the width, the interval carries a warning.

    python bandit/stats/bootstrap.py     # a ratio's interval on the default campaign, against scipy.stats.bootstrap
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/stats/bootstrap.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from scipy.special import ndtr, ndtri

from bandit.stats import resample
from bandit.logs.table import BlockTable, is_dense

LEVEL = 0.95
CHUNK_CELLS = 1 << 18  # jackknife cells per chunk (left-out clusters x columns): bounds memory, amortises the loop
DISAGREE_TOL = 0.25  # |percentile - basic| endpoint shift allowed, as a fraction of the percentile width
JACK_GROUPS = 20  # delete-a-group jackknife for the BCa acceleration of refit statistics
UNITS = ("prompt", "block")
METHODS = ("percentile", "bca")


@dataclass(frozen=True)
class Interval:
    """A bootstrap confidence interval and how it was made."""

    value: float
    lo: float
    hi: float
    method: str
    unit: str
    n_resamples: int
    seed: int
    warning: str | None = None  # percentile and basic disagree (non-smooth statistic), or failed resamples

    def __str__(self) -> str:
        return f"{self.value:.4f} [{self.lo:.4f}, {self.hi:.4f}]"


# ---------------------------------------------------------------- resampling


def resample_counts(strata: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, P) int32: how often each of P clusters is drawn; clusters resampled within their stratum.

    The stream (bandit/stats/resample.py) is a function of (strata, n_resamples, seed); `boot_totals` reads the same one.
    """
    return np.concatenate(list(resample.count_chunks(strata, n_resamples, seed)))


def cluster_units(t: BlockTable, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """(units (R,) cluster index of each row, strata (U,) workload of each cluster)."""
    if unit == "prompt":
        u, of_row = np.unique(t.prompt, return_inverse=True)
        strata = np.zeros(u.size, np.int64)
        strata[of_row] = t.workload
        return of_row, strata
    if unit == "block":
        return np.arange(t.n_records), t.workload.astype(np.int64)
    raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")


# ---------------------------------------------------------------- intervals


def interval(value: float, boot: np.ndarray, jack: np.ndarray | None, method: str, unit: str, seed: int) -> Interval:
    """Interval from a bootstrap distribution `boot` (n,) and, for BCa, jackknife values `jack` (G,)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    n = boot.size
    ok = boot[~np.isnan(boot)]
    warn = None
    if ok.size < n:
        warn = f"{n - ok.size} of {n} resamples undefined (dropped)"
    if ok.size < 2 or not np.isfinite(value):
        return Interval(float(value), float("nan"), float("nan"), method, unit, n, seed, warn)
    q = np.array([(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    pct = np.percentile(ok, 100 * q)
    if method == "bca":
        q = _bca_levels(value, ok, jack, q)
    lo, hi = np.percentile(ok, 100 * q) if method == "bca" else pct
    width = pct[1] - pct[0]
    shift = abs(pct[0] + pct[1] - 2 * value)  # |basic - percentile| at either endpoint
    if width > 0 and shift > DISAGREE_TOL * width:
        w2 = f"percentile and basic intervals disagree by {shift / width:.2f} of the width (tolerance {DISAGREE_TOL}): non-smooth statistic"
        warn = w2 if warn is None else f"{warn}; {w2}"
    return Interval(float(value), float(lo), float(hi), method, unit, n, seed, warn)


def _bca_levels(value: float, boot: np.ndarray, jack: np.ndarray | None, q: np.ndarray) -> np.ndarray:
    # same conventions as scipy.stats.bootstrap: z0 from the fraction strictly below the estimate
    frac = np.mean(boot < value)
    if frac <= 0 or frac >= 1:
        return q  # degenerate: the estimate lies outside the bootstrap distribution
    z0 = ndtri(frac)
    a = 0.0
    if jack is not None:
        j = jack[np.isfinite(jack)]
        d = j.mean() - j
        den = 6.0 * np.sum(d**2) ** 1.5
        a = float(np.sum(d**3) / den) if den > 0 else 0.0
    z = ndtri(q)
    return ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))


# ---------------------------------------------------------------- the two engines


def boot_totals(
    totals: np.ndarray,
    stat: Callable[[np.ndarray], np.ndarray],
    strata: np.ndarray,
    n_resamples: int,
    seed: int,
    jackknife: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Vectorised bootstrap of stat(summed totals).

    totals (P, K) per-cluster sums; stat maps (n, K) summed totals to (n, M) statistics.
    Returns value (M,), boot (n_resamples, M), jack (P, M) (leave one cluster out; None without `jackknife`).
    """
    totals = np.asarray(totals, float)
    full = totals.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):  # a 0/0 resample is NaN, counted and reported as such
        return _boot_totals(totals, full, stat, strata, n_resamples, seed, jackknife)


def _boot_totals(totals, full, stat, strata, n_resamples, seed, jackknife):
    value = stat(full[None])[0]
    boot = np.concatenate([stat(sums) for sums in resample.sum_chunks(totals, strata, n_resamples, seed)])
    if not jackknife:
        return value, boot, None
    step = max(1, CHUNK_CELLS // max(totals.shape[1], 1) // 8)
    jack = np.concatenate([stat(full[None] - totals[i : i + step]) for i in range(0, totals.shape[0], step)])
    return value, boot, jack


def boot_weights(
    stat: Callable[[np.ndarray], np.ndarray],
    units: np.ndarray,
    strata: np.ndarray,
    n_resamples: int,
    seed: int,
    jackknife: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Bootstrap of a refit statistic: stat(weights (R,)) -> (M,), rows weighted by their unit's draw count.

    units (R,) the cluster of each row; strata (U,) the stratum of each cluster. With `jackknife`
    also a delete-a-group jackknife over min(U, JACK_GROUPS) groups of clusters (for BCa).
    """
    units = np.asarray(units)
    value = np.asarray(stat(np.ones(units.size)), float)
    rows = [
        np.asarray(stat(c[units].astype(float)), float)
        for ch in resample.count_chunks(strata, n_resamples, seed)
        for c in ch
    ]
    jack = None
    if jackknife:
        U = np.asarray(strata).size
        group = np.arange(U) % min(U, JACK_GROUPS)
        jack = np.array([stat((group[units] != g).astype(float)) for g in range(group.max() + 1)], float)
    return value, np.array(rows).reshape(n_resamples, -1), jack


def bootstrap_ratio(
    num: np.ndarray,
    den: np.ndarray,
    strata: np.ndarray,
    n_resamples: int,
    seed: int,
    method: str = "percentile",
    unit: str = "prompt",
) -> Interval:
    """CI of sum(num) / sum(den) over P clusters (num, den: (P,) per-cluster totals)."""
    totals = np.stack([np.asarray(num, float), np.asarray(den, float)], 1)
    value, boot, jack = boot_totals(
        totals, lambda T: (T[:, 0] / T[:, 1])[:, None], strata, n_resamples, seed, jackknife=method == "bca"
    )
    return interval(value[0], boot[:, 0], None if jack is None else jack[:, 0], method, unit, seed)


def resample_table(t: BlockTable, counts: np.ndarray, units: np.ndarray) -> BlockTable:
    """The table with unit u's rows repeated counts[u] times; each copy of a prompt becomes its own cluster."""
    reps = counts[units]
    idx = np.repeat(np.arange(t.n_records), reps)
    copy = np.concatenate([np.arange(r) for r in reps]) if idx.size else idx
    m = int(reps.max(initial=1)) + 1
    # a cluster is (prompt, copy number); ordering rows by it keeps the table sorted by (workload, prompt, pos)
    key = t.prompt[idx].astype(np.int64) * m + copy
    order = np.lexsort((t.pos[idx], key))
    idx, key = idx[order], key[order]
    uniq, new_prompt = np.unique(key, return_inverse=True)
    names = tuple(f"{t.prompt_ids[int(k) // m]}#{int(k) % m}" for k in uniq)
    sub = t.take(idx)
    return replace(sub, prompt=new_prompt.astype(np.int32), prompt_ids=names, dense=is_dense(new_prompt, sub.pos))


def bootstrap_refit(
    t: BlockTable,
    stat: Callable[[BlockTable], float],
    unit: str = "prompt",
    n_resamples: int = 200,
    seed: int = 0,
    method: str = "percentile",
) -> Interval:
    """General (slow) bootstrap: re-runs stat on every resampled table (prompt clusters or records, within workload)."""
    units, strata = cluster_units(t, unit)
    value = float(stat(t))
    boot = np.array(
        [stat(resample_table(t, c, units)) for ch in resample.count_chunks(strata, n_resamples, seed) for c in ch],
        float,
    )
    jack = None
    if method == "bca":
        group = np.arange(strata.size) % min(strata.size, JACK_GROUPS)
        jack = np.array([stat(resample_table(t, (group != g).astype(np.int64), units)) for g in range(group.max() + 1)])
    return interval(value, boot, jack, method, unit, seed)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Entry:
    """One number of ci.json (the field names are the file's)."""

    name: str
    ci: Interval
    n_blocks: int
    n_clusters: int
    label: str

    def to_json(self, inputs: list[dict], code_version: str) -> dict:
        c = self.ci
        return {
            "name": self.name,
            "value": _num(c.value),
            "ci": [_num(c.lo), _num(c.hi)],
            "method": c.method,
            "unit": c.unit,
            "n_resamples": c.n_resamples,
            "seed": c.seed,
            "n_blocks": self.n_blocks,
            "n_clusters": self.n_clusters,
            "label": self.label,
            "inputs": inputs,
            "code_version": code_version,
            **({"warning": c.warning} if c.warning else {}),
        }


def _num(x: float) -> float | None:
    # fixed formatting: 6 significant digits; NaN/inf have no JSON number, they become null
    return float(f"{x:.6g}") if np.isfinite(x) else None


def no_variation(t: BlockTable, unit: str = "prompt") -> str | None:
    """Why no bootstrap interval exists on `t` at all (every resample is the data itself), else None."""
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    if unit == "prompt" and np.bincount(wl_of).max(initial=0) < 2:
        return f"no CI: one prompt per workload, so every resample is the campaign itself ({t.n_prompts} in all)"
    return None


def degenerate(e: Entry, flat: str | None) -> Entry:
    """An interval the bootstrap cannot make says so instead of showing zero width or nan; `flat` is
    `no_variation`'s reason, when the table has one."""
    c = e.ci
    why = None
    if not np.isfinite(c.value):
        why = (
            c.warning
            if c.warning and c.warning.startswith("undefined")
            else "undefined: a ratio with nothing in its denominator on this block set (no blocks, or none accepted)"
        )
    elif flat:
        why = flat
    elif not (np.isfinite(c.lo) and np.isfinite(c.hi)):
        why = c.warning or "no CI: the statistic is undefined in the resamples"
    if why is None:
        return e
    return replace(e, ci=Interval(c.value, float("nan"), float("nan"), c.method, c.unit, c.n_resamples, c.seed, why))


def fmt(x: float, pct: bool = False, nd: int = 4) -> str:
    """A number for text output; a non-finite one is 'undefined', never 'nan' or '+nan%'."""
    if not np.isfinite(x):
        return "undefined"
    return f"{100 * x:+.1f}%" if pct else f"{x:.{nd}f}"


def fmt_ci(c: Interval, pct: bool = False, nd: int = 4) -> str:
    if not (np.isfinite(c.lo) and np.isfinite(c.hi)):
        return "no CI"
    return f"[{fmt(c.lo, pct, nd)}, {fmt(c.hi, pct, nd)}]"


if __name__ == "__main__":
    from scipy.stats import bootstrap

    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files).blocks()
        u, strata = cluster_units(t, "prompt")
        num = np.bincount(u, t.accepted[:, 0].astype(float), minlength=strata.size)
        den = np.bincount(u, minlength=strata.size).astype(float)
        iv = bootstrap_ratio(num, den, strata, 2000, 0)
        print(said)
        print(
            f"mean accepted of {t.drafters[0]} per logged block, 95% percentile CI over prompt clusters within "
            f"workloads, 2000 resamples: {iv}"
        )
        ref = bootstrap(
            (num, den),
            lambda a, b, axis=-1: a.sum(axis) / b.sum(axis),
            paired=True,
            vectorized=True,
            n_resamples=2000,
            method="percentile",
            random_state=0,
        ).confidence_interval
        print(f"scipy.stats.bootstrap (unstratified, for scale): [{ref.low:.4f}, {ref.high:.4f}]")

    demo(body, "The first drafter's mean accepted with its stratified bootstrap CI, and scipy's for scale.")
