"""Every headline number with a 95% bootstrap CI -> <run dir>/ci.json.

The resampling unit is the prompt cluster (prompts drawn with replacement within each
workload; every block of a drawn prompt comes along) or, with `--unit block`, single blocks
within each workload (the research README's choice; it under-covers when blocks of a prompt
are correlated, see bench/coverage.py). Every data-dependent choice is remade inside every
resample: the best fixed drafter, and for the selector its model fit and its inner-LOWO
threshold.

Two engines:
- ratio-of-sums statistics (gap, headroom, mean table, trajectory gain) are functions of
  per-cluster totals, so a resample is the sum of its drawn clusters' totals; bandit/resample.py
  sums all resamples, chunk by chunk, with no Python loop over resamples (integer totals, the
  usual case, at one table lookup per draw through bit-packed columns);
- refit statistics (the selector) run once per resample on the same resamples (the same
  stream), with each cluster's draw count as its rows' sample weight (a weight-c row is that
  row drawn c times). They use `n_refit` resamples (default 200, recorded as the entry's
  `n_resamples`): each one fits W + W(W-1)/2 logistic models, all resamples at once (bandit/logistic.py).

Methods: percentile (default) and BCa (bias from the bootstrap, acceleration from a jackknife
over clusters; refit statistics use a delete-a-group jackknife over JACK_GROUPS groups of
clusters). Percentile and basic intervals are compared: they coincide for a statistic whose
bootstrap distribution is symmetric about the estimate, and a max over near-tied drafters is
not. When they differ by more than DISAGREE_TOL of the interval's width a warning is printed.

    python bandit/ci.py                          # the default campaign under runs/ -> runs/<run>/ci.json
    specbandit ci PATHS --out F --resamples N --seed S --unit prompt|block --method percentile|bca
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/ci.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import json
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional, Sequence

import numpy as np
import typer
from scipy.special import ndtr, ndtri

from bandit import __version__, resample, trajectory
from bandit.logs import BlockTable, _is_dense
from bandit.trajectory import greedy_oracle_trajectory, trajectory_oracle

LEVEL = 0.95
CHUNK_CELLS = 1 << 18  # jackknife cells per chunk (left-out clusters x columns): bounds memory, amortises the loop
DISAGREE_TOL = 0.25  # |percentile - basic| endpoint shift allowed, as a fraction of the percentile width
JACK_GROUPS = 20     # delete-a-group jackknife for the BCa acceleration of refit statistics
N_REFIT = 200        # resamples for the nested selector refits
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
    warning: str | None = None   # percentile and basic disagree (non-smooth statistic), or failed resamples

    def __str__(self) -> str:
        return f"{self.value:.4f} [{self.lo:.4f}, {self.hi:.4f}]"


# ---------------------------------------------------------------- resampling

def _count_chunks(strata: np.ndarray, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Stratified resample counts, a chunk of resamples at a time: (m, P) int32, each stratum's total preserved.

    The stream (bandit/resample.py) is a function of (strata, n_resamples, seed); `boot_totals` reads the same one.
    """
    return resample.count_chunks(strata, n_resamples, seed)


def resample_counts(strata: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, P) int32: how often each of P clusters is drawn; clusters resampled within their stratum."""
    return np.concatenate(list(_count_chunks(strata, n_resamples, seed)))


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
        den = 6.0 * np.sum(d ** 2) ** 1.5
        a = float(np.sum(d ** 3) / den) if den > 0 else 0.0
    z = ndtri(q)
    return ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))


# ---------------------------------------------------------------- the two engines

def boot_totals(totals: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], strata: np.ndarray,
                n_resamples: int, seed: int, jackknife: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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
    jack = np.concatenate([stat(full[None] - totals[i:i + step]) for i in range(0, totals.shape[0], step)])
    return value, boot, jack


def boot_weights(stat: Callable[[np.ndarray], np.ndarray], units: np.ndarray, strata: np.ndarray,
                 n_resamples: int, seed: int, jackknife: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Bootstrap of a refit statistic: stat(weights (R,)) -> (M,), rows weighted by their unit's draw count.

    units (R,) the cluster of each row; strata (U,) the stratum of each cluster. With `jackknife`
    also a delete-a-group jackknife over min(U, JACK_GROUPS) groups of clusters (for BCa).
    """
    units = np.asarray(units)
    value = np.asarray(stat(np.ones(units.size)), float)
    rows = [np.asarray(stat(c[units].astype(float)), float) for ch in _count_chunks(strata, n_resamples, seed) for c in ch]
    jack = None
    if jackknife:
        U = np.asarray(strata).size
        group = np.arange(U) % min(U, JACK_GROUPS)
        jack = np.array([stat((group[units] != g).astype(float)) for g in range(group.max() + 1)], float)
    return value, np.array(rows).reshape(n_resamples, -1), jack


def bootstrap_ratio(num: np.ndarray, den: np.ndarray, strata: np.ndarray, n_resamples: int, seed: int,
                    method: str = "percentile", unit: str = "prompt") -> Interval:
    """CI of sum(num) / sum(den) over P clusters (num, den: (P,) per-cluster totals)."""
    totals = np.stack([np.asarray(num, float), np.asarray(den, float)], 1)
    value, boot, jack = boot_totals(totals, lambda T: (T[:, 0] / T[:, 1])[:, None], strata, n_resamples, seed,
                                    jackknife=method == "bca")
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
    return replace(sub, prompt=new_prompt.astype(np.int32), prompt_ids=names, dense=_is_dense(new_prompt, sub.pos))


def bootstrap_refit(t: BlockTable, stat: Callable[[BlockTable], float], unit: str = "prompt", n_resamples: int = 200,
                    seed: int = 0, method: str = "percentile") -> Interval:
    """General (slow) bootstrap: re-runs stat on every resampled table (prompt clusters or records, within workload)."""
    units, strata = _units(t, unit)
    value = float(stat(t))
    boot = np.array([stat(resample_table(t, c, units)) for ch in _count_chunks(strata, n_resamples, seed) for c in ch], float)
    jack = None
    if method == "bca":
        group = np.arange(strata.size) % min(strata.size, JACK_GROUPS)
        jack = np.array([stat(resample_table(t, (group != g).astype(np.int64), units)) for g in range(group.max() + 1)])
    return interval(value, boot, jack, method, unit, seed)


def _units(t: BlockTable, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """(units (R,) cluster index of each row, strata (U,) workload of each cluster)."""
    if unit == "prompt":
        u, units = np.unique(t.prompt, return_inverse=True)
        strata = np.zeros(u.size, np.int64)
        strata[units] = t.workload
        return units, strata
    if unit == "block":
        return np.arange(t.n_records), t.workload.astype(np.int64)
    raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")


# ---------------------------------------------------------------- the headline numbers

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
        return {"name": self.name, "value": _num(c.value), "ci": [_num(c.lo), _num(c.hi)], "method": c.method,
                "unit": c.unit, "n_resamples": c.n_resamples, "seed": c.seed, "n_blocks": self.n_blocks,
                "n_clusters": self.n_clusters, "label": self.label, "inputs": inputs, "code_version": code_version,
                **({"warning": c.warning} if c.warning else {})}


def _num(x: float) -> float | None:
    # fixed formatting: 6 significant digits; NaN/inf have no JSON number, they become null
    return float(f"{x:.6g}") if np.isfinite(x) else None


def table_stats(t: BlockTable, unit: str, n_resamples: int, seed: int, method: str) -> list[Entry]:
    """The replay's headline numbers on t's block set, from per-cluster totals (docs/DESIGN.md).

    Sparse logs: per_block_gap, workload_headroom and mean_accepted[w][d] over the logged block
    starts, the best fixed drafter (highest pooled mean accepted) re-chosen per resample.
    Dense logs, prompt unit: the primary (fewest target passes along its own trajectory) is re-chosen
    in every resample and every statistic is computed on its block set: per_block_gap and
    mean_accepted[w][d] over its trajectory starts; workload_headroom, trajectory_oracle_gain,
    greedy_oracle_gain and tokens_per_pass[w][d] in tokens per target pass. Dense logs, block unit:
    single blocks of the full data's primary's block set are resampled for per_block_gap and the mean
    accepted table (the primary is then fixed); trajectories live inside a prompt, so the
    tokens-per-pass entries (workload_headroom included) stay on the prompt unit.
    """
    if not t.dense:
        return accepted_entries(t.blocks(), unit, n_resamples, seed, method, rechoose=True)
    out = _dense_stats(t, n_resamples, seed, method)
    if unit == "block":
        b = trajectory.block_set(t)
        blk = {e.name: e for e in accepted_entries(b, unit, n_resamples, seed, method, rechoose=False,
                                                 primary=trajectory.primary(t))}
        # only the accepted-token statistics of the block set are resampled by block; the tokens-per-pass ones
        # (headroom, oracle gains, tokens_per_pass) are trajectories, which live inside a prompt
        keep = {n for n in blk if n == "per_block_gap" or n.startswith("mean_accepted[")}
        out = [blk[e.name] if e.name in keep else e for e in out]
    return out


def accepted_entries(b: BlockTable, unit: str, n_resamples: int, seed: int, method: str, rechoose: bool,
                    primary: int | None = None) -> list[Entry]:
    """per_block_gap, workload_headroom (accepted tokens) and the mean accepted table over the rows of b."""
    units, strata = _units(b, unit)
    W, D = len(b.workloads), len(b.drafters)
    a = b.accepted.astype(float)
    # per row: for its workload w, columns [count, a_1..a_D, max_d a_d] in slot w: (R, W*(D+2))
    row = np.zeros((b.n_records, W, D + 2))
    row[np.arange(b.n_records), b.workload] = np.c_[np.ones(b.n_records), a, a.max(1)]
    totals = np.zeros((strata.size, W * (D + 2)))
    np.add.at(totals, units, row.reshape(b.n_records, -1))

    def stat(T: np.ndarray) -> np.ndarray:
        T = T.reshape(-1, W, D + 2)
        pooled = T[:, :, 1:D + 1].sum(1)                      # (n, D)
        p = np.argmax(pooled, 1) if rechoose else np.full(len(T), primary)
        ap = pooled[np.arange(len(p)), p]
        gap = T[:, :, D + 1].sum(1) / ap - 1
        head = T[:, :, 1:D + 1].max(2).sum(1) / ap - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            means = T[:, :, 1:D + 1] / T[:, :, :1]            # (n, W, D)
        return np.c_[gap, head, means.reshape(len(p), -1)]

    value, boot, jack = boot_totals(totals, stat, strata, n_resamples, seed, jackknife=method == "bca")
    names = ["per_block_gap", "workload_headroom"] + [f"mean_accepted[{w}][{d}]" for w in b.workloads for d in b.drafters]
    nb = [b.n_records, b.n_records] + [int((b.workload == i).sum()) for i in range(W) for _ in range(D)]
    nc = [strata.size, strata.size] + [int((strata == i).sum()) for i in range(W) for _ in range(D)]
    return [Entry(n, interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, unit, seed),
                  nb[i], nc[i], b.label)
            for i, n in enumerate(names)]


def _dense_stats(t: BlockTable, n_resamples: int, seed: int, method: str) -> list[Entry]:
    starts = trajectory.fixed_starts(t)                               # (R, D): each drafter's own trajectory
    _, strata = _units(t, "prompt")
    W, D, P = len(t.workloads), len(t.drafters), t.n_prompts
    a = t.accepted.astype(np.int64)
    # per prompt, in its workload's slot, for every candidate primary q: [blocks, a_1..a_D, max a] over
    # q's trajectory starts; then passes of every fixed drafter, of the shortest path, of the greedy oracle,
    # and output tokens. All integers, so the resampled sums are exact.
    per_q = np.zeros((P, D, D + 2), np.int64)
    for q in range(D):
        r = starts[:, q]
        np.add.at(per_q[:, q], t.prompt[r], np.c_[np.ones(int(r.sum()), np.int64), a[r], a[r].max(1)])
    passes = trajectory.fixed_passes(t, starts)
    oracle = trajectory_oracle(t).passes
    greedy = greedy_oracle_trajectory(t).passes
    tokens = trajectory.output_lengths(t)
    K = D * (D + 2) + D + 3
    cols = np.c_[per_q.reshape(P, -1), passes, oracle, greedy, tokens]
    totals = np.zeros((P, W, K), np.int64)
    totals[np.arange(P), strata] = cols
    totals = totals.reshape(P, -1)
    o_pass, o_orc, o_gr, o_tok = D * (D + 2), D * (D + 2) + D, D * (D + 2) + D + 1, D * (D + 2) + D + 2

    def stat(T: np.ndarray) -> np.ndarray:
        n = len(T)
        T = T.reshape(n, W, K)
        pw = T[:, :, o_pass:o_pass + D]                               # (n, W, D) passes
        p = trajectory.primary_index(pw.sum(1))                       # primary, re-chosen per resample
        ix = np.arange(n)
        q = T[:, :, :o_pass].reshape(n, W, D, D + 2)[ix, :, p]         # (n, W, D+2) on p's block set
        ap = q[:, :, 1:D + 1].sum(1)[ix, p]
        gap = q[:, :, D + 1].sum(1) / ap - 1
        pp = pw.sum(1)[ix, p]
        head = pp / pw.min(2).sum(1) - 1
        orc = pp / T[:, :, o_orc].sum(1) - 1
        gre = pp / T[:, :, o_gr].sum(1) - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            means = q[:, :, 1:D + 1] / q[:, :, :1]                      # (n, W, D)
            tpp = T[:, :, o_tok:o_tok + 1] / pw                         # (n, W, D)
        return np.c_[gap, head, orc, gre, means.reshape(n, -1), tpp.reshape(n, -1)]

    value, boot, jack = boot_totals(totals.astype(float), stat, strata, n_resamples, seed, jackknife=method == "bca")
    p0 = trajectory.primary(t, starts)
    nb_all = int(starts[:, p0].sum())
    nb_w = np.bincount(t.workload[starts[:, p0]], minlength=W)
    nc_w = np.bincount(strata, minlength=W)
    names = (["per_block_gap", "workload_headroom", "trajectory_oracle_gain", "greedy_oracle_gain"]
             + [f"mean_accepted[{w}][{d}]" for w in t.workloads for d in t.drafters]
             + [f"tokens_per_pass[{w}][{d}]" for w in t.workloads for d in t.drafters])
    nb = [nb_all] * 4 + [int(nb_w[i]) for i in range(W) for _ in range(D)] * 2
    nc = [P] * 4 + [int(nc_w[i]) for i in range(W) for _ in range(D)] * 2
    return [Entry(n, interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, "prompt", seed),
                  nb[i], nc[i], t.label)
            for i, n in enumerate(names)]


def selector_entries(t: BlockTable, unit: str, n_refit: int, seed: int, method: str) -> list[Entry]:
    """The LOWO selector's entries: frontier areas of every score (headline) and the logistic score's operating
    point, with every fit, primary, alternatives set and threshold remade in every resample (bandit/selector.py)."""
    from bandit import selector
    W, P = len(t.workloads), t.n_prompts
    point = selector.nested(t, np.ones((1, P)))
    fixed = row_w = None
    if unit == "prompt":
        _, strata = _units(t, "prompt")
        wp = resample_counts(strata, n_refit, seed).astype(float)
    else:   # single blocks of each fold's block set (its primary chosen on its training workloads, then fixed)
        fixed = selector.primaries(t)
        cands = selector.candidates(t, sorted(set(fixed)))
        row_w = {q: resample_counts(cands[q].workload, n_refit, seed).astype(float) for q in set(fixed)}
        wp = np.ones((n_refit, P))
    boot = selector.nested(t, wp, fold_primaries=fixed, row_weights=row_w,
                           progress=f"selector refits: {wp.shape[0]} resamples, held-out workload")
    jack = None
    if method == "bca":
        if unit == "prompt":
            G = min(P, JACK_GROUPS)
            group = np.arange(P) % G
            jack = selector.nested(t, (group[None, :] != np.arange(G)[:, None]).astype(float))
        else:
            jw = {}
            for q in set(fixed):
                n = cands[q].rows.size
                G = min(n, JACK_GROUPS)
                jw[q] = ((np.arange(n) % G)[None, :] != np.arange(JACK_GROUPS)[:, None]).astype(float)
            jack = selector.nested(t, np.ones((JACK_GROUPS, P)), fold_primaries=fixed, row_weights=jw)
    n_w = [int(point.sums["logistic"][g].w[0]) for g in range(W)]
    c_w = np.bincount(t.workload[trajectory.prompt_rows(t)[0]], minlength=W)
    out: list[Entry] = []

    def add(name: str, v: np.ndarray, bt: np.ndarray, jk: np.ndarray | None, g: int | None, label: str) -> None:
        nb = sum(n_w) if g is None else n_w[g]
        nc = P if g is None else int(c_w[g])
        out.append(Entry(name, interval(float(v[0]), bt, jk, method, unit, seed), nb, nc, label))

    for sc in selector.SCORES:
        pre = "selector_frontier_area" + ("" if sc == "logistic" else f"_{sc}")
        for j in range(W + 1):
            name = pre if j == W else f"{pre}[{t.workloads[j]}]"
            add(name, point.areas[sc][:, j], boot.areas[sc][:, j], None if jack is None else jack.areas[sc][:, j],
                None if j == W else j, t.label)
    for g in [None, *range(W)]:
        o, ob = point.outcome("logistic", g), boot.outcome("logistic", g)
        oj = None if jack is None else jack.outcome("logistic", g)
        sfx = "" if g is None else f"[{t.workloads[g]}]"
        for key, name in (("capture", "selector_capture"), ("redraft_rate", "selector_redraft_rate"),
                          ("skill", "selector_skill"), ("token_gain", "selector_token_gain"),
                          ("speedup", "selector_speedup")):
            why = None
            if key == "skill" and not 0 < o["redraft_rate"][0] < 1:  # listed with the reason, not dropped
                why = ("undefined: the selector re-drafts " + ("every block" if o["redraft_rate"][0] >= 1 else
                       "no block") + ", so capture per re-draft says nothing about its ranking")
            if key == "capture" and not np.isfinite(o["capture"][0]):
                why = "undefined: the alternatives have no gap to capture on this block set"
            if why is not None:
                nan = float("nan")
                out.append(Entry(f"{name}{sfx}", Interval(nan, nan, nan, method, unit, n_refit, seed, why), 0,
                                 t.n_prompts, t.label))
                continue
            add(f"{name}{sfx}", o[key], ob[key], None if oj is None else oj[key], g,
                "MODEL" if key == "speedup" else t.label)
    return out


def headline(t: BlockTable, unit: str = "prompt", method: str = "percentile", n_resamples: int = 2000, seed: int = 0,
             n_refit: int = N_REFIT) -> list[Entry]:
    """Every headline entry of ci.json for one campaign's table."""
    b = trajectory.block_set(t)
    entries = table_stats(t, unit, n_resamples, seed, method)
    if len(b.workloads) >= 2 and len(b.drafters) >= 2:
        entries += selector_entries(t, unit, min(n_refit, n_resamples), seed, method)
    else:  # listed with the reason, not dropped
        why = (f"undefined: the selector is evaluated leave-one-workload-out between drafters, and this table has "
               f"{len(b.workloads)} workload(s) and {len(b.drafters)} drafter(s) (it needs 2 of each)")
        nan = float("nan")
        entries += [Entry(n, Interval(nan, nan, nan, method, unit, 0, seed, why), 0, t.n_prompts, t.label)
                    for n in SELECTOR_HEADLINE]
    flat = no_variation(t, unit)
    entries = [degenerate(e, flat) for e in entries]
    return sorted(entries, key=lambda e: e.name)


SELECTOR_HEADLINE = ("selector_capture", "selector_frontier_area", "selector_redraft_rate", "selector_skill",
                     "selector_speedup", "selector_token_gain")


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
        why = c.warning if c.warning and c.warning.startswith("undefined") else \
            "undefined: a ratio with nothing in its denominator on this block set (no blocks, or none accepted)"
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


def coverage_warnings(entries: Sequence[Entry], path: Path) -> list[str]:
    """A warning line for every entry whose unit bench/coverage.py's study shows under-covering: a row for that
    entry, or else for its family (the name without [..]), on the entry's unit whose coverage CI lies wholly
    below LEVEL (the row of lowest upper bound is quoted). Empty when the file is missing or unreadable."""
    try:
        bad = []
        for r in json.loads(Path(path).read_text())["rows"]:
            name, cc = r.get("entry", r.get("statistic")), r.get("coverage_ci", r.get("coverage_ci95"))
            if isinstance(name, str) and cc and cc[1] is not None and float(cc[1]) < LEVEL:
                bad.append((name, r["unit"], float(r["coverage"]), float(cc[0]), float(cc[1]), r.get("study")))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return []
    found: dict[tuple, list[str]] = {}   # the quoted study row -> the entries it applies to
    for e in entries:
        hits = [b for b in bad if b[1] == e.ci.unit and b[0] == e.name] or \
               [b for b in bad if b[1] == e.ci.unit and b[0].split("[", 1)[0] == e.name.split("[", 1)[0]]
        if hits:
            found.setdefault(min(hits, key=lambda b: b[4]), []).append(e.name)
    out = []
    for (name, unit, cov, lo, hi, study), names in found.items():
        more = f" (and {len(names) - 1} more of its family, by that row)" if len(names) > 1 else ""
        row = f"; row {name}" if name != names[0] else ""
        out.append(f"warning: unit {unit} under-covers for {names[0]}{more} in {path}: {100 * cov:.0f}% "
                   f"[{100 * lo:.0f}, {100 * hi:.0f}]" + (f" (study {study}{row})" if study else ""))
    return out


def code_version() -> str:
    """Package version + the last git commit that touched bandit/ (no dirty flag, no time: two runs of one commit
    agree, and committing derived outputs under runs/ does not change it)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "log", "-1", "--format=%H", "--", str(here)], cwd=here, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return f"{__version__}+g{head[:12]}" if head else __version__


def write_ci(entries: Sequence[Entry], t: BlockTable, out: Path) -> str:
    """Write ci.json (a list of entries, sorted keys, fixed float formatting); return the text."""
    inputs = [{"path": s.path, "sha256": s.sha256} for s in t.sources]
    cv = code_version()
    text = json.dumps([e.to_json(inputs, cv) for e in entries], sort_keys=True, indent=1) + "\n"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def render(entries: Sequence[Entry]) -> str:
    lines = [f"{'name':<36} {'value':>9}  95% CI                 label       method/unit/resamples"]
    for e in entries:
        c = e.ci
        tag = "unlabelled" if e.label == "UNLABELLED" else e.label
        lines.append(f"{e.name:<36} {fmt(c.value):>9}  {fmt_ci(c)}".ljust(70)
                     + f" [{tag}]".ljust(13) + f"{c.method}/{c.unit}/{c.n_resamples}, seed {c.seed}")
    by: dict[str, list[str]] = {}
    for e in entries:
        if e.ci.warning:
            by.setdefault(e.ci.warning, []).append(e.name)
    warns = [f"warning: {names[0]}: {w}" if len(names) == 1 else
             f"warning: {names[0]} and {len(names) - 1} more entries: {w}" for w, names in by.items()]
    return "\n".join(lines + warns) + "\n"


def main(paths: Sequence[Path] = (), out: Path | None = None, n_resamples: int = 2000, seed: int = 0,
         unit: str = "prompt", method: str = "percentile", n_refit: int = N_REFIT) -> str:
    """Compute every entry; write OUT (default: ci.json next to the campaign it describes, `<run dir>/ci.json`,
    when the logs are one run; nothing for several runs pooled unless `out` is given)."""
    from bandit.logs import default_inputs, load_logs, output_path
    said = f"read: {', '.join(str(p) for p in paths)}"
    if not paths:
        paths, said = default_inputs()
        said = f"read: {said}"
    out = output_path(paths, "ci.json", out)
    t = load_logs(paths)
    entries = headline(t, unit, method, n_resamples, seed, n_refit)
    tail = "not written (several runs pooled: pass --out FILE to write ci.json)\n"
    if out is not None:
        write_ci(entries, t, out)
        tail = f"wrote {out}\n"
    cov = out.parent / "coverage.json" if out is not None else None
    warns = "".join(w + "\n" for w in coverage_warnings(entries, cov)) if cov is not None else ""
    return f"{said}\n{t.summary()}\n" + render(entries) + warns + tail


def cli(paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories")] = None,
        out: Annotated[Optional[Path], typer.Option(help="ci.json to write (default: <run dir>/ci.json beside the "
                                                        "one run read; nothing for several runs pooled)")] = None,
        resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples of the ratio statistics")] = 2000,
        seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
        unit: Annotated[str, typer.Option(help="resampling unit: prompt (clusters, default) or block")] = "prompt",
        method: Annotated[str, typer.Option(help="percentile (default) or bca")] = "percentile",
        refit_resamples: Annotated[int, typer.Option(min=1, help="resamples of the nested selector refits")] = N_REFIT,
        quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False) -> None:
    """Every headline number with a 95% bootstrap CI -> OUT (ci.json) and a table on stdout.

    Block sets: sparse logs, the logged block starts; dense logs, the primary's own trajectory starts (the
    primary: most output tokens per target pass along its own trajectory), re-chosen in every resample.
    Trajectories are counted in tokens per target pass (nothing past an output's end). PATHS: logs (default: the default campaign under runs/). --unit prompt (clusters, default) or block;
    --method percentile (default) or bca; --refit-resamples: resamples of the nested selector refits
    (at most --resamples). The selector's operating point is chosen inside every fold by the cost model's speedup
    (measured costs from the manifest's timing, else the documented what-if).
    """
    from bandit import progress
    progress.quiet(quiet)
    if unit not in UNITS or method not in METHODS:
        raise typer.BadParameter(f"--unit must be one of {UNITS} and --method one of {METHODS}")
    typer.echo(main(paths or [], out, resamples, seed, unit, method, refit_resamples), nl=False)


if __name__ == "__main__":
    from bandit.errors import run
    run(cli)
