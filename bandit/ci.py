"""Every headline number with a 95% bootstrap CI -> runs/ci.json.

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
  `n_resamples`): each one fits W + W(W-1) logistic models.

Methods: percentile (default) and BCa (bias from the bootstrap, acceleration from a jackknife
over clusters; refit statistics use a delete-a-group jackknife over JACK_GROUPS groups of
clusters). Percentile and basic intervals are compared: they coincide for a statistic whose
bootstrap distribution is symmetric about the estimate, and a max over near-tied drafters is
not. When they differ by more than DISAGREE_TOL of the interval's width a warning is printed.

    python bandit/ci.py                          # default campaign under runs/ -> runs/ci.json
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

from bandit import __version__, resample
from bandit.logs import BlockTable, _is_dense

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
                "n_clusters": self.n_clusters, "label": self.label, "inputs": inputs, "code_version": code_version}


def _num(x: float) -> float | None:
    # fixed formatting: 6 significant digits; NaN/inf have no JSON number, they become null
    return float(f"{x:.6g}") if np.isfinite(x) else None


def table_stats(b: BlockTable, unit: str, n_resamples: int, seed: int, method: str) -> list[Entry]:
    """per_block_gap, workload_headroom and the mean accepted table, from per-cluster totals."""
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
        p = np.argmax(pooled, 1)                              # best fixed drafter, remade per resample
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


def trajectory_stats(t: BlockTable, n_resamples: int, seed: int, method: str) -> list[Entry]:
    """trajectory_oracle_gain: oracle tokens per pass / best fixed drafter's - 1 (prompt unit always:
    a trajectory lives inside one prompt)."""
    from bandit.replay import fixed_trajectory, trajectory_oracle
    b = t.blocks()
    oracle = trajectory_oracle(t).passes
    fixed = np.stack([fixed_trajectory(t, d).passes for d in range(len(t.drafters))], 1)   # (P, D)
    P, D = fixed.shape
    sel = np.zeros((P, D))
    np.add.at(sel, b.prompt, b.accepted.astype(float))   # block-start accepted: picks the best fixed drafter
    totals = np.c_[oracle, fixed, sel]

    def stat(T: np.ndarray) -> np.ndarray:
        p = np.argmax(T[:, 1 + D:], 1)
        return (T[np.arange(len(p)), 1 + p] / T[:, 0] - 1)[:, None]

    strata = np.zeros(P, np.int64)
    strata[t.prompt] = t.workload
    value, boot, jack = boot_totals(totals, stat, strata, n_resamples, seed, jackknife=method == "bca")
    return [Entry("trajectory_oracle_gain", interval(value[0], boot[:, 0], None if jack is None else jack[:, 0], method,
                                                     "prompt", seed),
                  b.n_records, P, t.label)]


def selector_entries(b: BlockTable, unit: str, n_refit: int, seed: int, method: str,
                     criterion: str = "speedup") -> list[Entry]:
    """The LOWO selector's pooled numbers and per-workload skill, refit (primary, model, threshold) per resample."""
    from bandit import selector
    units, strata = _units(b, unit)
    stat = selector.nested_stat(b, criterion=criterion, random_state=seed)
    value, boot, jack = boot_weights(stat, units, strata, n_refit, seed, jackknife=method == "bca")
    out = []
    for i, name in enumerate(selector.STAT_NAMES + tuple(f"selector_skill[{w}]" for w in b.workloads)):
        label = "MODEL" if name == "breakeven_rho" else b.label
        keep = slice(None) if not name.startswith("selector_skill[") else b.workload == b.workloads.index(name[15:-1])
        nb = int(np.count_nonzero(np.ones(b.n_records, bool)[keep]))
        nc = int(np.unique(units[keep]).size)
        out.append(Entry(name, interval(value[i], boot[:, i], None if jack is None else jack[:, i], method, unit, seed),
                         nb, nc, label))
    return out


def headline(t: BlockTable, unit: str = "prompt", method: str = "percentile", n_resamples: int = 2000, seed: int = 0,
             n_refit: int = N_REFIT, criterion: str = "speedup") -> list[Entry]:
    """Every headline entry of ci.json for one campaign's table."""
    b = t.blocks()
    entries = table_stats(b, unit, n_resamples, seed, method)
    if t.dense:
        entries += trajectory_stats(t, n_resamples, seed, method)
    if len(b.workloads) >= 2 and len(b.drafters) >= 2:
        entries += selector_entries(b, unit, min(n_refit, n_resamples), seed, method, criterion)
    return sorted(entries, key=lambda e: e.name)


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
        lines.append(f"{e.name:<36} {c.value:>9.4f}  [{c.lo:.4f}, {c.hi:.4f}]".ljust(70)
                     + f" [{tag}]".ljust(13) + f"{c.method}/{c.unit}/{c.n_resamples}, seed {c.seed}")
    warns = [f"warning: {e.name}: {e.ci.warning}" for e in entries if e.ci.warning]
    return "\n".join(lines + warns) + "\n"


def main(paths: Sequence[Path] = (), out: Path = Path("runs/ci.json"), n_resamples: int = 2000, seed: int = 0,
         unit: str = "prompt", method: str = "percentile", n_refit: int = N_REFIT, criterion: str = "speedup") -> str:
    from bandit.logs import default_inputs, load_logs
    said = f"read: {', '.join(str(p) for p in paths)}"
    if not paths:
        paths, said = default_inputs()
        said = f"read: {said}"
    t = load_logs(paths)
    entries = headline(t, unit, method, n_resamples, seed, n_refit, criterion)
    write_ci(entries, t, out)
    return f"{said}\n{t.summary()}\n" + render(entries) + f"wrote {out}\n"


def cli(paths: Annotated[Optional[list[Path]], typer.Argument()] = None, out: Path = Path("runs/ci.json"),
        resamples: int = 2000, seed: int = 0, unit: str = "prompt", method: str = "percentile",
        refit_resamples: int = N_REFIT, criterion: str = "speedup") -> None:
    """Every headline number with a 95% bootstrap CI -> OUT (ci.json) and a table on stdout.

    PATHS: logs (default: the default campaign under runs/). --unit prompt (clusters, default) or block;
    --method percentile (default) or bca; --refit-resamples: resamples of the nested selector refits
    (at most --resamples); --criterion speedup|skill|net picks the selector's inner-LOWO threshold.
    """
    if unit not in UNITS or method not in METHODS:
        raise typer.BadParameter(f"--unit must be one of {UNITS} and --method one of {METHODS}")
    typer.echo(main(paths or [], out, resamples, seed, unit, method, refit_resamples, criterion), nl=False)


if __name__ == "__main__":
    typer.run(cli)
