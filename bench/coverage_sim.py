"""bench/coverage.py's [SIM] study: a simulator configuration fitted to a campaign, and its simulated campaigns.

`fit_config` fits a SimConfig shaped like a dense campaign (per-cell acceptance from the mean accepted, prompt
random effects and the drafters' shared latent from per-prompt acceptance rates, the confidence signal from the
AUC of the first-token confidence, empty-draft rates, the manifest's timing); `sim_table` draws one campaign of
it, each prompt cut to an output length drawn from its workload's measured lengths. `derive` makes every seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import expit, ndtr, ndtri
from scipy.stats import norm, rankdata

from bandit.logs.table import ROW_FIELDS, BlockTable, is_dense
from bandit.sim.simulate import SimConfig, manifest, simulate_table
from bandit.stats import trajectory

CHUNK = 400  # simulated prompts per workload generated at once (bounds the simulator's memory)
MIN_FIT_LEN = 16  # prompts at least this long enter the per-prompt rate moments of the fit


def derive(*key: int) -> int:
    """A 63-bit seed from integers (draw seeds independent of each other and of the order they run in)."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, np.uint64)[0] >> np.uint64(1))


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
    """A SimConfig whose campaigns look like t (dense): see the module docstring and bench/coverage.py's."""
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
