"""Empirical coverage of ci.json's nominal 95% intervals: the shipped entries, code path, criterion and units.

Every interval is made by the code that makes ci.json (`replay.table_stats`, and `ci.headline` when a
selector entry is asked for: the selector's own criterion, nested threshold and refits), on the
primary's trajectory block set of a dense log, once per resampling unit (`prompt`, `block`). An
entry that ci.py keeps on the prompt unit under `--unit block` (the trajectory and tokens-per-pass
entries) has no block-unit row. Two studies:

- `sim` [SIM]: campaigns drawn from a SimConfig fitted to the shipped campaign (per-cell acceptance
  from the mean accepted, prompt random effects and the drafters' shared latent from per-prompt
  acceptance rates, confidence signal from the AUC of the first-token confidence, empty-draft rates,
  the manifest's timing; each prompt's output length drawn from its workload's measured lengths).
  Truth: the entry's value on one very large campaign of the same configuration (`--truth-prompts`
  per workload); nothing of the primary's block set has a closed form.
- `subsample` [MEASURED]: `--prompts-per-workload` prompts per workload drawn without replacement
  from the shipped campaign. Truth: the entry's value on the full campaign (same unit). Drawing
  30 of 300 prompts leaves a finite-population factor sqrt(270/299) = 0.95 on the spread, so an
  honest interval covers a little more than 95% here.

A draw counts as covering when lo <= truth <= hi; an undefined interval (NaN) counts as a miss.
Coverage has a Wilson 95% interval over the draws. <run dir>/coverage.json knows its inputs (sha256 of
the logs read), the code version, the settings and the seed; the same seed gives the same file,
whatever `--jobs`. `python bandit/ci.py` warns for every entry whose unit a row here shows
under-covering (`ci.coverage_warnings`).

    python bench/coverage.py                      # the full study (many minutes) -> <run dir>/coverage.json
    python bench/coverage.py --quick --out /tmp/coverage.json     # smoke run, under a minute
    python bench/coverage.py --studies subsample --draws 100 --entries per_block_gap,workload_headroom
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np
from scipy.special import expit, ndtr, ndtri
from scipy.stats import norm, rankdata
from tqdm import tqdm

from bandit import bootstrap, replay, schema  # moved by the layering
from bandit import ci, outputs, trajectory
from bandit.errors import UsageError
from bandit.table import ROW_FIELDS, BlockTable, is_dense
from bandit.simulate import SimConfig, manifest, simulate_table

STUDIES = ("sim", "subsample")
RES = outputs.RESAMPLES_HELP
LEVEL = 0.95
CHUNK = 400  # simulated prompts per workload generated at once (bounds the simulator's memory)
MIN_FIT_LEN = 16  # prompts at least this long enter the per-prompt rate moments of the fit
QUICK = {"draws": 16, "resamples": 300, "refit": 16, "truth_prompts": 300}
FULL = {"draws": 200, "resamples": 2000, "refit": ci.N_REFIT, "truth_prompts": 3000}  # ci.json's defaults


# ---------------------------------------------------------------- small pieces


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


def _r(x, nd: int = 6) -> float | None:
    """Rounded for the JSON; None where not finite."""
    return round(float(x), nd) if x is not None and np.isfinite(x) else None


def family(name: str) -> str:
    """An entry's family: its name without the [workload][drafter] suffix."""
    return name.split("[", 1)[0]


def derive(*key: int) -> int:
    """A 63-bit seed from integers (draw seeds independent of each other and of the order they run in)."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def default_entries(t: BlockTable) -> list[str]:
    w, d = t.workloads[0], t.drafters[trajectory.primary(t) if t.dense else 0]
    return [
        "per_block_gap",
        "workload_headroom",
        "trajectory_oracle_gain",
        "greedy_oracle_gain",
        f"mean_accepted[{w}][{d}]",
        f"tokens_per_pass[{w}][{d}]",
        "selector_frontier_area",
        "selector_capture",
    ]


def resolve(patterns: Sequence[str], names: Sequence[str]) -> list[str]:
    """Entry names matching the patterns (names; `*` and `?` are wildcards), in the patterns' order."""
    out: list[str] = []
    for p in patterns:
        rx = re.compile(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."))  # brackets are literal
        hit = [n for n in names if rx.fullmatch(n)]
        if not hit:
            print(f"note: no entry of ci.json matches {p!r}; skipped", file=sys.stderr)
        out += [n for n in hit if n not in out]
    return out


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


def all_names(t: BlockTable, refit: bool) -> list[str]:
    es = (
        ci.headline(t, "prompt", "percentile", 4, 0, 2)
        if refit
        else replay.table_stats(t, "prompt", 4, 0, "percentile")
    )
    return [e.name for e in es]


# ---------------------------------------------------------------- the simulator fitted to the shipped campaign


@dataclass(frozen=True)
class Fit:
    """A SimConfig shaped like a campaign, the measured output lengths to draw from, and the manifest's timing."""

    cfg: SimConfig
    lengths: tuple[tuple[int, ...], ...]  # (W,) measured output lengths per workload
    timing: dict | None

    def to_json(self) -> dict:
        return {
            "sim_config": dataclasses.asdict(self.cfg),
            "output_lengths": {
                "mean": round(float(np.mean(np.concatenate(self.lengths))), 3),
                "per_workload_prompts": [len(x) for x in self.lengths],
            },
        }


def _gh(n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / w.sum()


def _cap_hist(lengths: Sequence[np.ndarray], k: int) -> np.ndarray:
    """(W, k+1): share of a workload's records whose acceptance is capped at c = min(k, L-1-t)."""
    out = np.zeros((len(lengths), k + 1))
    for w, L in enumerate(lengths):
        caps = np.minimum(k, np.concatenate([np.arange(int(n))[::-1] for n in L]))
        out[w] = np.bincount(caps, minlength=k + 1) / caps.size
    return out


def _mean_accepted(mu: np.ndarray, sd: float, hist: np.ndarray, k: int) -> np.ndarray:
    """(W, D) model mean of `accepted` over all records, given the cap histogram (W, k+1)."""
    x, wq = _gh()
    q = ndtr(mu[..., None] + sd * x)  # (W, D, nodes)
    cum = np.concatenate([np.zeros(q.shape + (1,)), np.cumsum(q[..., None] ** np.arange(1, k + 1), -1)], -1)
    return np.einsum("wdnc,wc,n->wd", cum, hist, wq)


def _joint(m1: np.ndarray, m2: np.ndarray, rho: float) -> np.ndarray:
    """P(L1 > 0, L2 > 0) for standard bivariate normal latents of correlation rho >= 0 and means m1, m2."""
    x, wq = _gh(24)
    s = math.sqrt(1 - rho)
    return (ndtr((m1[..., None] + math.sqrt(rho) * x) / s) * ndtr((m2[..., None] + math.sqrt(rho) * x) / s)) @ wq


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return 0.5
    r = rankdata(score)
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def fit_config(t: BlockTable, n_prompts: int, seed: int = 0) -> Fit:
    """A SimConfig whose campaigns look like t (dense): see the module docstring."""
    trajectory.require_dense(t)
    W, D = len(t.workloads), len(t.drafters)
    k = int(t.manifests[0].get("k", 8)) if t.manifests else int(t.draft_len.max())
    k = max(k, int(t.accepted.max()))
    starts, lens = trajectory.prompt_rows(t)
    pw = t.workload[starts]
    lengths = [lens[pw == w] for w in range(W)]
    c = t.accepted >= 1  # the first draft token is right

    # per-prompt acceptance rates of the longer prompts, on the probit scale: prompt effects, shared latent
    rows = []
    for p in np.nonzero(lens >= MIN_FIT_LEN)[0]:
        cp = c[starts[p] : starts[p] + lens[p]].astype(float)
        n = cp.shape[0]
        r = np.clip(cp.mean(0), 0.5 / n, 1 - 0.5 / n)
        rows.append((pw[p], ndtri(r), np.cov(cp.T) / n, (cp.T @ cp) / n))
    diag, off = [], []
    for w in range(W):
        rw = [r for r in rows if r[0] == w]
        if len(rw) < 3:
            continue
        z = np.array([r[1] for r in rw])  # (Pw, D)
        g = 1 / norm.pdf(z)
        noise = np.mean([np.outer(gi, gi) * r[2] for gi, r in zip(g, rw)], 0)  # delta-method sampling covariance
        sig = np.cov(z.T) - noise
        diag.append(np.mean(np.diag(sig)))
        off.append(np.mean(sig[~np.eye(D, dtype=bool)]))
    tot = max(float(np.mean(diag)) if diag else 0.1, 0.0)
    sd_p = math.sqrt(min(max(float(np.mean(off)) if off else 0.0, 0.0), tot))
    sd_pd = math.sqrt(max(tot - sd_p**2, 0.0))
    sd_p, sd_pd = min(sd_p, 1.0), min(sd_pd, 1.0)

    # shared latent: prompt-conditional joint rates of drafter pairs, tetrachoric on a grid
    iu = np.triu_indices(D, 1)
    m = np.array([r[1] for r in rows]) if rows else np.zeros((0, D))
    jo = np.array([r[3][iu] for r in rows]) if rows else np.zeros((0, len(iu[0])))
    grid = np.linspace(0.0, 0.98, 50)
    err = [np.mean((jo - _joint(m[:, iu[0]], m[:, iu[1]], g)) ** 2) if len(m) else 0.0 for g in grid]
    shared = float(grid[int(np.argmin(err))])

    # per-cell acceptance: the model's mean accepted over all records (measured length mix) equals the measured one
    hist = _cap_hist(lengths, k)
    obs = np.array([t.accepted[t.workload == w].mean(0) for w in range(W)], float)
    lo, hi = np.full((W, D), -6.0), np.full((W, D), 6.0)
    sd = math.hypot(sd_p, sd_pd)
    for _ in range(60):
        mid = (lo + hi) / 2
        up = _mean_accepted(mid, sd, hist, k) < obs
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    mu = (lo + hi) / 2
    token_accept = tuple(tuple(round(float(x), 6) for x in row) for row in np.clip(ndtr(mu), 1e-4, 1 - 1e-4))

    # confidence: signal strength by the AUC of the first-token confidence, offset by its mean
    rng = np.random.default_rng(derive(seed, 7))
    signal, base = [], []
    for w in range(W):
        sel = (t.workload == w)[:, None] & (t.draft_len > 0)
        conf0, y = t.features[..., 2][sel], c[sel]
        auc = _auc(conf0, y) if conf0.size else 0.5
        dd = rng.integers(0, D, 20000)
        L = mu[w, dd] + math.sqrt(1 + sd * sd) * rng.normal(size=dd.size)
        eps = rng.normal(size=dd.size)
        ss = np.linspace(0, 1, 41)
        aucs = [_auc(2 * s * L + math.sqrt(1 - s * s) * eps, L > 0) for s in ss]
        s = float(ss[int(np.argmin(np.abs(np.array(aucs) - auc)))]) if auc > 0.5 else 0.0
        target = float(np.mean(conf0)) if conf0.size else 0.5
        b0, b1 = -10.0, 10.0
        for _ in range(50):
            b = (b0 + b1) / 2
            if np.mean(expit(b + 2 * s * L + math.sqrt(1 - s * s) * eps)) < target:
                b0 = b
            else:
                b1 = b
        signal.append(round(s, 4))
        base.append(round((b0 + b1) / 2, 4))

    miss = ~c
    empty = tuple(
        round(float(((t.draft_len[:, d] == 0) & miss[:, d]).sum() / max(miss[:, d].sum(), 1)), 4) for d in range(D)
    )
    timing = (t.manifests[0].get("timing") if t.manifests else None) or None
    dms = (
        tuple(float(timing["drafter_ms"].get(d, 1.0)) for d in t.drafters)
        if timing and "drafter_ms" in timing
        else (1.0,) * D
    )
    vms = float(timing["verify_ms"]["ms"][-1]) if timing and "verify_ms" in timing else 10.0
    cfg = SimConfig(
        workloads=tuple(t.workloads),
        drafters=tuple(t.drafters),
        drafter_accept=(0.5,) * D,
        workload_shift=(0.0,) * W,
        token_accept=token_accept,
        shared=round(shared, 4),
        prompt_sd=round(sd_p, 4),
        prompt_drafter_sd=round(sd_pd, 4),
        signal=tuple(signal),
        conf_base=tuple(base),
        empty_rate=empty,
        n_prompts=n_prompts,
        out_len=int(lens.max()),
        k=k,
        dense=True,
        behaviour=0,
        drafter_ms=dms,
        verify_ms=vms,
        seed=seed,
    )
    return Fit(cfg, tuple(tuple(int(x) for x in L) for L in lengths), timing)


def _truncate(tb: BlockTable, lengths: np.ndarray) -> BlockTable:
    """Each prompt cut to its output length (P,), acceptance re-capped at the new end (the chain property holds)."""
    L = lengths[tb.prompt]
    sub = tb.take(tb.pos < L)
    cap = (lengths[sub.prompt] - 1 - sub.pos)[:, None]
    return replace(sub, accepted=np.minimum(sub.accepted, cap).astype(np.int32), block=np.full(sub.n_records, -1))


def _concat(parts: Sequence[BlockTable]) -> BlockTable:
    """Tables of the same names as one campaign; prompt ids made unique by part and sorted (workload, part, id)."""
    if len(parts) == 1:
        return parts[0]
    cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in ROW_FIELDS}
    part = np.concatenate([np.full(p.n_records, j, np.int64) for j, p in enumerate(parts)])
    off = np.cumsum([0] + [p.n_prompts for p in parts])
    gp = cols["prompt"].astype(np.int64) + off[part]  # global prompt index
    ids = [
        f"{pid.split('/', 1)[0]}/s{j:04d}-{pid.split('/', 1)[1]}" for j, p in enumerate(parts) for pid in p.prompt_ids
    ]
    wl = np.zeros(len(ids), np.int64)
    wl[gp] = cols["workload"]
    order_p = np.lexsort((np.arange(len(ids)), wl))  # workload, then part, then id
    rank = np.empty_like(order_p)
    rank[order_p] = np.arange(order_p.size)
    newp = rank[gp]
    order = np.lexsort((cols["pos"], newp))
    cols = {f: v[order] for f, v in cols.items()}
    cols["prompt"] = newp[order].astype(np.int32)
    return replace(
        parts[0], **cols, prompt_ids=tuple(ids[i] for i in order_p), dense=is_dense(cols["prompt"], cols["pos"])
    )


def sim_table(fit: Fit, n_prompts: int, seed: int) -> BlockTable:
    """One simulated campaign of n_prompts per workload, shaped like the fitted campaign (dense)."""
    parts = []
    for j, s in enumerate(range(0, n_prompts, CHUNK)):
        m = min(CHUNK, n_prompts - s)
        cfg = replace(fit.cfg, n_prompts=m, seed=derive(seed, j))
        tb = simulate_table(cfg)
        rng = np.random.default_rng(derive(seed, j, 1))
        lengths = np.concatenate([rng.choice(np.asarray(L), m) for L in fit.lengths])
        tb = _truncate(tb, lengths)
        if fit.timing:
            tb = replace(tb, manifests=({**manifest(cfg), "timing": fit.timing},))
        parts.append(tb)
    return _concat(parts)


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


def _one_thread() -> None:
    """One BLAS thread: a threaded reduction would make the logistic fits, hence the file, depend on the machine."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover
        pass


def _init(plan: Plan) -> None:
    global _PLAN
    _PLAN = plan
    _one_thread()


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
                "mean_width": _r(np.mean(v[ok, 2] - v[ok, 1])) if ok.any() else None,
                "truth": _r(tru),
                "mean_estimate": _r(np.nanmean(v[:, 0])) if np.isfinite(v[:, 0]).any() else None,
                "miss_below": int((ok & (tru < v[:, 1])).sum()),
                "miss_above": int((ok & (tru > v[:, 2])).sum()),
                "undefined": int((~ok).sum()),
                "absent": len(draws) - n,
            }
            # the names paper/build.py reads
            r["statistic"], r["coverage_ci95"] = f"{name} ({study})", r["coverage_ci"]
            rows.append(r)
    return rows


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def render(rows: list[dict]) -> str:
    head = (
        f"{'study':<10}{'entry':<34}{'unit':<7}{'coverage':>9}  {'Wilson 95%':<16}{'draws':>6}"
        f"{'mean width':>12}{'truth':>10}  miss lo/hi  label"
    )
    lines = [head]
    for r in rows:
        cv = "n/a" if r["coverage"] is None else f"{100 * r['coverage']:.1f}%"
        cc = (
            "n/a" if r["coverage_ci"] is None else f"[{100 * r['coverage_ci'][0]:.1f}, {100 * r['coverage_ci'][1]:.1f}]"
        )
        mw = "n/a" if r["mean_width"] is None else f"{r['mean_width']:.4f}"
        lines.append(
            f"{r['study']:<10}{r['entry']:<34}{r['unit']:<7}{cv:>9}  {cc:<16}{r['draws']:>6}{mw:>12}"
            f"{_f(r['truth']):>10}  {r['miss_below']:>4}/{r['miss_above']:<5} [{r['label']}]"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="logs (default: the published campaign, paper/campaign.txt)")
    ap.add_argument("--latest", action="store_true", help=outputs.LATEST_HELP)
    ap.add_argument("--quick", action="store_true", help=f"smoke run (< 1 min): defaults {QUICK}")
    ap.add_argument(
        "--draws", type=int, help=f"draws per study, in [1, 100000] (default {FULL['draws']}; quick {QUICK['draws']})"
    )
    ap.add_argument(
        "--resamples", type=int, help=f"bootstrap resamples, {RES} (default {FULL['resamples']}, ci.json's)"
    )
    ap.add_argument("--refit", type=int, help=f"selector refit resamples, {RES} (default {FULL['refit']}, ci.json's)")
    ap.add_argument(
        "--prompts-per-workload",
        type=int,
        default=30,
        help="prompts per workload of a draw, in [1, 100000] (default 30)",
    )
    ap.add_argument(
        "--truth-prompts",
        type=int,
        help=f"per workload, the large [SIM] campaign of the truth, in [1, 100000] (default {FULL['truth_prompts']})",
    )
    ap.add_argument("--entries", help="comma-separated entry names or globs (default: a representative subset)")
    ap.add_argument("--studies", default=",".join(STUDIES), help="sim,subsample (default both)")
    ap.add_argument("--units", default=",".join(bootstrap.UNITS), help="prompt,block (default both)")
    ap.add_argument("--method", default="percentile", choices=bootstrap.METHODS)
    ap.add_argument("--seed", type=int, default=0, help=outputs.SEED_HELP)
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="worker processes (no effect on results), in [1, 256]",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="output (default: <run dir>/coverage.json beside the one run read, with every option at its default)",
    )
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    studies = [s for s in args.studies.split(",") if s]
    units = [u for u in args.units.split(",") if u]
    if set(studies) - set(STUDIES) or set(units) - set(bootstrap.UNITS):
        ap.error(f"--studies from {STUDIES}, --units from {bootstrap.UNITS}")
    for k, hi in (("draws", 100_000), ("prompts_per_workload", 100_000), ("truth_prompts", 100_000), ("jobs", 256)):
        outputs.bounded("--" + k.replace("_", "-"), getattr(args, k), 1, hi)
    outputs.resamples(args.resamples), outputs.resamples(args.refit, "--refit"), outputs.seed(args.seed)
    t0 = time.perf_counter()

    from bandit.logs import load_logs

    inp = outputs.resolve(args.paths, args.latest)
    said = inp.said or inp.named
    opts = [("--quick", args.quick, False), *((f"--{k.replace('_', '-')}", getattr(args, k), base[k]) for k in base)]
    opts += [("--prompts-per-workload", args.prompts_per_workload, 30), ("--entries", args.entries, None)]
    opts += [("--studies", args.studies, ",".join(STUDIES)), ("--units", args.units, ",".join(bootstrap.UNITS))]
    opts += [("--method", args.method, "percentile"), ("--seed", args.seed, 0)]
    differs = outputs.changed(opts)
    args.out, why = outputs.destination(
        inp, "coverage.json", outputs.path_arg(args.out, "--out"), differs, "bench/coverage.py"
    )
    if args.out is None:  # nothing computed for nothing: the study takes minutes
        raise UsageError(why.replace("not written", "refused", 1))
    outputs.guard_out(args.out, [args.out.name], inp, ["coverage.json"], differs)
    if args.out.is_symlink():  # refused now, not after the study's minutes
        raise UsageError(f"{args.out}: a symlink stands there: not written through")
    args.command = outputs.command("bench/coverage.py", inp, opts)
    paths = inp.files
    from bandit.primary import attach_own

    t = attach_own(load_logs(paths))  # the run's live phase: the primary by measured speed, as ci.json's
    print(f"read: {said}\n{t.summary()}")
    return study(t, studies, units, args, t0)


def study(t: BlockTable, studies: Sequence[str], units: Sequence[str], args, t0: float | None = None) -> dict:
    """Run the studies on campaign t with argparse-like settings; write and return the results object."""
    t0 = time.perf_counter() if t0 is None else t0
    _one_thread()
    pats = args.entries.split(",") if args.entries else default_entries(t)
    need_sel = any(p.startswith("selector") for p in pats)
    names = tuple(resolve(pats, all_names(t, need_sel)))
    if not names:
        raise SystemExit("no entries to study")
    rows, truths, fit_json = [], {}, None
    for s in studies:
        if s == "subsample":
            src, label = t, t.label
            truths[s] = truth_of(t, names, units, args.method)
        else:
            src, label = fit_config(t, args.prompts_per_workload, args.seed), "SIM"
            fit_json = src.to_json()
            big = sim_table(src, args.truth_prompts, derive(args.seed, 99))
            truths[s] = truth_of(big, names, units, args.method)
            full = truth_of(t, names, units[:1], args.method)[units[0]]
            print(
                f"[SIM] fitted config: shared {src.cfg.shared}, prompt_sd {src.cfg.prompt_sd}, prompt_drafter_sd "
                f"{src.cfg.prompt_drafter_sd}, signal {src.cfg.signal}; truth from {big.n_prompts} prompts "
                f"({big.n_records} records)"
            )
            for n in names:
                if n in truths[s][units[0]]:
                    print(
                        f"  {n:<34} truth [SIM] {truths[s][units[0]][n]:9.4f}   campaign [{t.label}] "
                        f"{full.get(n, float('nan')):9.4f}   ({units[0]} unit)"
                    )
        plan = Plan(
            s, src, names, tuple(units), args.prompts_per_workload, args.resamples, args.refit, args.method, args.seed
        )
        rows += rows_of(s, label, run_study(plan, args.draws, args.jobs), truths[s])
    rows.sort(key=lambda r: (r["study"], r["entry"], bootstrap.UNITS.index(r["unit"])))
    res = {
        "what": "empirical coverage of ci.json's nominal 95% intervals (bench/coverage.py)",
        "inputs": [{"path": s.path, "sha256": s.sha256} for s in t.sources],
        "code_version": schema.code_version("bandit"),
        "seed": args.seed,
        "settings": {
            "draws": args.draws,
            "resamples": args.resamples,
            "refit": args.refit,
            "prompts_per_workload": args.prompts_per_workload,
            "truth_prompts": args.truth_prompts,
            "method": args.method,
            "level": LEVEL,
            "studies": list(studies),
            "units": list(units),
            "entries": list(names),
            "quick": bool(args.quick),
        },
        "sim": fit_json,
        "truth": {s: {u: {k: _r(v) for k, v in tv.items()} for u, tv in d.items()} for s, d in truths.items()},
        "rows": rows,
    }
    print(render(rows))
    if getattr(args, "command", None):
        res["command"] = args.command
    out = pathlib.Path(args.out)
    outputs.write_all([(out, json.dumps(res, indent=1, sort_keys=True, allow_nan=False) + "\n")])
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return res


if __name__ == "__main__":
    from bandit.errors import guarded

    guarded(main)
