"""Speed of bandit/stats/logistic.py's batched fit vs the scikit-learn loop it replaces (target >= 10x).

Synthetic data shaped like the selector's: 4 features (3 confidences in [0, 1], an entropy-like
value up to 7), labels from a weak logistic signal, rows grouped into ~300 prompt clusters, and
bootstrap-count weights from a multinomial over the clusters (every row of a drawn cluster comes
along). The scikit-learn side is the loop as bandit/selector.py runs it: one
StandardScaler + LogisticRegression(solver="newton-cholesky") pipeline per resample, zero-weight
rows dropped, parameter validation off. The weights are built C-ordered (np.take(counts, cluster,
axis=1)); counts[:, cluster] is column-major, which fit_batched copies once: that case is timed
too, on its own line. Each side is timed --repeat times, alternating, and its best time counts
(the machine may be shared: the best of a few runs is the least disturbed one).

    python bench/bench_logistic.py [--resamples 200] [--rows 15000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np
import sklearn
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from bandit.stats.logistic import fit_batched

TARGET = 10.0


def synthetic(rows: int, resamples: int, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X (rows, 4), y (rows,) 0/1, S (resamples, rows) bootstrap counts of each row's cluster."""
    rng = np.random.default_rng(seed)
    conf = rng.beta(5, 2, size=(rows, 3))  # conf_mean, conf_min, conf_first
    ent = 7 * rng.beta(2, 5, size=rows)  # ent_mean
    X = np.c_[conf, ent]
    y = (rng.random(rows) < expit(1.2 * conf[:, 0] - 0.8 * conf[:, 1] + 0.15 * ent - 0.9)).astype(int)
    cluster = np.sort(rng.integers(0, clusters, rows))
    counts = rng.multinomial(clusters, np.full(clusters, 1 / clusters), size=resamples)
    return X, y, np.take(counts, cluster, axis=1).astype(float)


def sklearn_loop(X: np.ndarray, y: np.ndarray, S: np.ndarray, tol: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    coef, icpt = np.empty((len(S), X.shape[1])), np.empty(len(S))
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        for k, w in enumerate(S):
            keep = w > 0
            p = Pipeline([("scale", StandardScaler()), ("lr", LogisticRegression(solver="newton-cholesky", tol=tol))])
            p.fit(X[keep], y[keep], scale__sample_weight=w[keep], lr__sample_weight=w[keep])
            coef[k], icpt[k] = p[-1].coef_[0], p[-1].intercept_[0]
    return coef, icpt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--rows", type=int, default=15000)
    ap.add_argument("--clusters", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="timings per side (best one counts)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    X, y, S = synthetic(args.rows, args.resamples, args.clusters, args.seed)
    fit_batched(X[:500], y[:500], S[:2, :500])  # warm-up: BLAS threads, first-touch pages
    tb, ts = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        fit = fit_batched(X, y, S)
        tb.append(time.perf_counter() - t)
        t = time.perf_counter()
        coef, icpt = sklearn_loop(X, y, S)
        ts.append(time.perf_counter() - t)
    b, s = min(tb), min(ts)
    SF = np.asfortranarray(S)
    tf = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        fit_batched(X, y, SF)
        tf.append(time.perf_counter() - t)
    dcoef, dicpt = np.abs(fit.coef - coef).max(), np.abs(fit.intercept - icpt).max()
    # scikit-learn's default tol=1e-4 stops short of the optimum; a tight-tol check on a few resamples
    # separates that from any disagreement in the optimum itself
    few = slice(0, min(5, len(S)))
    c12, i12 = sklearn_loop(X, y, S[few], tol=1e-12)
    tight = max(np.abs(fit.coef[few] - c12).max(), np.abs(fit.intercept[few] - i12).max())
    print(
        f"data: {args.rows} rows x 4 features, {args.clusters} clusters, {args.resamples} resamples, "
        f"{y.mean():.2f} positive; best of {args.repeat}"
    )
    print(
        f"batched {b:.3f} s ({fit.n_iter} Newton steps, {int(fit.converged.sum())}/{len(S)} converged), "
        f"sklearn loop {s:.2f} s, ratio {s / b:.1f}x (target >= {TARGET:.0f}x)"
    )
    print(f"column-major S (counts[:, cluster]): batched {min(tf):.3f} s, one copy included")
    print(
        f"max |coef diff| {dcoef:.1e}, max |intercept diff| {dicpt:.1e} vs scikit-learn at its default tol=1e-4; "
        f"{tight:.1e} vs tol=1e-12 on {few.stop} resamples"
    )


if __name__ == "__main__":
    main()
