"""Batched weighted L2 logistic regression: every bootstrap resample of one data set fitted at once.

The selector refits in bandit/ci.py fit W + W(W-1)/2 logistic models per resample (the outer fit
and its inner leave-one-workload-out folds), and a scikit-learn Pipeline spends most of each fit
on per-call overhead for these small (F = 4) problems. Here resample m is row m of a weight matrix
S, and all rows take their Newton steps together: numpy passes over (m, n), no loop over resamples.

Per row this solves what
    Pipeline([("scale", StandardScaler()), ("lr", LogisticRegression(C=C, solver="newton-cholesky"))])
        .fit(X, y, scale__sample_weight=S[m], lr__sample_weight=S[m])
solves: standardise by the S[m]-weighted mean and population std (a near-zero std -> 1, by
scikit-learn's rule), then minimise 0.5 * ||beta||^2 + C * sum_i S[m, i] * logloss_i with an
unpenalised intercept. Weight-0 rows do not count; a weight-c row counts as c copies of it.

Degenerate rows, whose positive-weight rows hold a single class (scikit-learn refuses to fit
them), get coef = 0 and intercept = +inf (all 1) or -inf (all 0, or no weight at all). decision()
is then +-inf and predict_proba() the constant class, 1.0 or 0.0: callers can use them as a
constant score with no special case.

    python bandit/stats/logistic.py    # one-line self-check against scikit-learn
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/stats/logistic.py`: import our `bandit`, not a namesake
    import pathlib, sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import contextlib
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

EPS = np.finfo(np.float64).eps
KAPPA = 0.25  # accept a step once the slope along it is <= KAPPA * |initial slope|: near the line minimum
MAX_LS = 30  # line-search trials before a resample is retired as stalled (not converged)
_blas = None  # threadpoolctl's controller, built on first use (it scans the loaded libraries once)


@dataclass(frozen=True)
class LogisticBatch:
    """m fitted models in scikit-learn's parametrisation (standardised features)."""

    mean: np.ndarray  # (m, F) weighted feature means, StandardScaler.mean_
    scale: np.ndarray  # (m, F) weighted population stds, near-constant -> 1, StandardScaler.scale_
    coef: np.ndarray  # (m, F) coefficients on standardised features, lr.coef_[0]; 0 when degenerate
    intercept: np.ndarray  # (m,) lr.intercept_[0]; +inf / -inf when degenerate
    n_iter: int  # Newton steps taken: the most that any resample needed
    converged: np.ndarray  # (m,) bool: normalised max |gradient| <= tol; degenerate rows count as converged
    degenerate: np.ndarray  # (m,) bool: one weighted class (or no weight): a constant score

    def decision(self, X: np.ndarray) -> np.ndarray:
        """X (k, F) -> (m, k) linear scores (X - mean) / scale @ coef + intercept."""
        b = self.coef / self.scale  # raw-unit coefficients, so no (m, k, F) standardised copy of X
        off = self.intercept - np.einsum("mf,mf->m", self.mean, b)
        return b @ np.asarray(X, float).T + off[:, None]

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """X (k, F) -> (m, k) P(y = 1); exactly 1.0 or 0.0 on degenerate rows."""
        const = (self.intercept > 0).astype(float)[:, None]
        return np.where(self.degenerate[:, None], const, expit(self.decision(X)))


def _eval(R: np.ndarray, XnT: np.ndarray, S: np.ndarray, D: np.ndarray, Sq: np.ndarray) -> None:
    """At raw coefficients R (m, K): D = 1 + exp(-signed margin) and Sq = S * q with q = 1 / D, in place.

    q is the probability given to the observed label. Negating the design up front leaves one
    product, an exp, an add and a division: no negation, expit or log pass over (m, n).
    """
    np.matmul(R, XnT, out=D)
    with np.errstate(over="ignore"):  # exp = inf (a hopelessly wrong row) gives q = 0, which is right
        np.exp(D, out=D)
    D += 1.0
    np.divide(S, D, out=Sq)


def _newton(
    Xn: np.ndarray,
    Qtri: np.ndarray,
    S: np.ndarray,
    W: np.ndarray,
    SXs: np.ndarray,
    A: np.ndarray,
    theta: np.ndarray,
    C: float,
    max_iter: int,
    tol: float,
    first: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Damped Newton in scikit-learn's coordinates theta = (beta0, beta), all rows of S together.

    Xn (n, K): minus the signed centred design (2y - 1) * [1, X - c], K = F + 1. Qtri (n, T): the
    upper triangle of each row's [1, X - c] outer product. S (m, n) weights, W (m,) their sums,
    SXs (m, K) = -S @ Xn. A (m, K, K) maps theta to raw coefficients on [1, X - c] (the data are
    never standardised per resample). theta (m, K): the start. first: the raw gradient (m, K) and
    Hessian triangle (m, T) at the start, when the caller has them cheaper. Returns theta (m, K),
    converged (m,) bool and the number of Newton steps.
    """
    m, K = theta.shape
    iu = np.triu_indices(K)
    XnT = np.ascontiguousarray(Xn.T)
    pen = np.r_[0.0, np.ones(K - 1)]  # the intercept is not penalised
    out, conv = theta.copy(), np.zeros(m, bool)
    act, live, stuck = np.arange(m), np.ones(m, bool), np.zeros(m, bool)

    def raw(A, th):  # theta -> raw coefficients, (m, K)
        return np.einsum("mij,mj->mi", A, th)

    def grad(A, graw, th):  # raw gradient -> theta gradient, plus the penalty's
        return np.einsum("mji,mj->mi", A, graw) + pen * th

    D, Sq = np.empty_like(S), np.empty_like(S)  # reused throughout: fresh (m, n) arrays cost page faults
    if first is None:
        _eval(raw(A, theta), XnT, S, D, Sq)
        first = (C * (-(XnT @ Sq.T).T - SXs), None)
    g, Htri = grad(A, first[0], theta), first[1]
    steps = 0
    for it in range(max_iter + 1):
        gmax = np.abs(g).max(1) / (C * W)  # scikit-learn's test, on its objective / (C W)
        done = live & (gmax <= tol)
        fin = live & (done | stuck | (it == max_iter))
        out[act[fin]], conv[act[done]] = theta[fin], True
        live &= ~fin
        if not live.any():
            break
        if 2 * live.sum() <= live.size:  # compact once at most half is live: the copy then costs less than it saves
            act, stuck, theta, g, W, A, SXs = act[live], stuck[live], theta[live], g[live], W[live], A[live], SXs[live]
            S, D, Sq = S[live], D[live], Sq[live]
            Htri = None if Htri is None else Htri[live]
            live = live[live]
        steps = it + 1
        if Htri is None:
            np.divide(Sq, D, out=D)  # S q^2, then the Hessian weights S q (1 - q): D is free until the next _eval
            np.subtract(Sq, D, out=D)
            Htri = C * (D @ Qtri)
        H = np.empty((len(W), K, K))
        H[:, iu[0], iu[1]] = Htri
        H[:, iu[1], iu[0]] = Htri
        H = np.einsum("mji,mjl,mlk->mik", A, H, A) + np.diag(pen)
        H[:, 0, 0] += 1e-12 * C * W  # every margin saturated: keep the solve nonsingular
        Htri = None
        d = -np.linalg.solve(H, g[:, :, None])[:, :, 0]
        d[~live] = 0.0  # finished rows ride along unchanged until the next compaction
        a = -np.einsum("mi,mi->m", g, d)  # minus the initial slope; > 0 as H is positive definite
        slack = 1e3 * EPS * C * W * np.abs(d).sum(1)  # the slope's rounding floor: never reject a rounding-size step
        # Line search on the slope phi'(t) = g(theta + t d) . d alone, which needs no log-loss pass:
        # phi is convex, so phi'(t) <= 0 means f went down, and a small positive phi'(t) means t is
        # just past the line minimum. Overshoots (separable data, far starts) retry at the secant root.
        t = np.ones(len(W))
        _eval(raw(A, theta + d), XnT, S, D, Sq)
        gn = grad(A, C * (-(XnT @ Sq.T).T - SXs), theta + d)  # (K, n) x (n, m): faster than (m, n) x (n, K)
        rows = np.arange(len(W))
        for trial in range(MAX_LS):
            slope = np.einsum("mi,mi->m", gn[rows], d[rows])
            bad = slope > KAPPA * a[rows] + slack[rows]
            rows, slope = rows[bad], slope[bad]
            if rows.size == 0:
                break
            if trial < MAX_LS - 1:
                t[rows] *= np.clip(a[rows] / (a[rows] + slope), 0.1, 1.0)
            else:  # no acceptable step: stay put, retire as not converged
                t[rows], stuck[rows] = 0.0, True
            th, Dr, Sqr = theta[rows] + t[rows, None] * d[rows], D[rows], Sq[rows]
            _eval(raw(A[rows], th), XnT, S[rows], Dr, Sqr)
            D[rows], Sq[rows] = Dr, Sqr
            gn[rows] = grad(A[rows], C * (-(XnT @ Sqr.T).T - SXs[rows]), th)
        theta, g = theta + t[:, None] * d, gn
    return out, conv, steps


def _blas_threads(threads: int | None) -> contextlib.AbstractContextManager:
    global _blas
    if threads is None:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import ThreadpoolController  # a scikit-learn dependency
    except ImportError:
        return contextlib.nullcontext()
    _blas = _blas or ThreadpoolController()
    return _blas.limit(limits=threads, user_api="blas")


def fit_batched(
    X: np.ndarray,
    y: np.ndarray,
    S: np.ndarray,
    C: float = 1.0,
    max_iter: int = 50,
    tol: float = 1e-10,
    threads: int | None = 1,
) -> LogisticBatch:
    """One weighted fit per row of S: X (n, F), y (n,) 0/1, S (m, n) nonnegative weights.

    tol bounds max |gradient| of scikit-learn's normalised objective (scikit-learn's own default
    is 1e-4). A C-ordered float S is used as is; any other S is copied once. threads: BLAS threads
    during the fit (None: leave them alone). One by default: the products here are thin and
    memory-bound (n x K, K <= 36), so a second thread gained little in bench/bench_logistic.py,
    and on a busy 2-core machine OpenBLAS's spinning threads made the fit ~20x slower.
    """
    with _blas_threads(threads):
        return _fit(X, y, S, C, max_iter, tol)


def _fit(X: np.ndarray, y: np.ndarray, S: np.ndarray, C: float, max_iter: int, tol: float) -> LogisticBatch:
    X = np.asarray(X, float)
    y = np.asarray(y).astype(float).ravel()
    # S from fancy indexing (counts[:, cluster]) is column-major, and every pass against the
    # C-ordered buffers would then run strided, several times slower: copy once instead
    S = np.ascontiguousarray(np.atleast_2d(S), dtype=float)
    n, F = X.shape
    m, K = S.shape[0], F + 1
    if y.shape != (n,) or S.shape[1] != n:
        raise ValueError(f"shapes: X {X.shape}, y {y.shape}, S {S.shape}")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("y must be 0/1")
    if m and not S.min() >= 0:  # also catches NaN
        raise ValueError("weights must be nonnegative")
    # centre on the mean-weight mean: resample means then sit near it, so the one-pass variance
    # m2 - shift^2 cancels little; the mean weights also give the warm start below
    Sp = S.mean(0, keepdims=True) if m else np.ones((1, n))
    c = (Sp @ X)[0] / Sp.sum() if Sp.sum() > 0 else X.mean(0)
    Xc = X - c
    Xn = -(2.0 * y - 1.0)[:, None] * np.c_[np.ones(n), Xc]
    iu = np.triu_indices(K)
    Qtri = Xn[:, iu[0]] * Xn[:, iu[1]]  # (2y - 1)^2 = 1: the outer products of [1, X - c]
    M = np.c_[np.ones(n), y, 1.0 - y, Xc, Xc**2, -Xn]  # weight sum, classes, moments, S @ Xs
    J = M.shape[1]

    def moments(sums):  # -> W (r,), shift = weighted mean - c (r, F), scale (r, F)
        W = sums[:, 0]
        Wd = np.where(W > 0, W, 1.0)[:, None]
        shift, m2 = sums[:, 3 : 3 + F] / Wd, sums[:, 3 + F : 3 + 2 * F] / Wd
        var = np.maximum(m2 - shift**2, 0.0)
        mean = c + shift
        # scikit-learn's near-constant rule, plus the worst-case rounding of the one-pass formula
        const = var <= W[:, None] * EPS * var + (W[:, None] * mean * EPS) ** 2 + n * EPS * m2
        return W, shift, np.where(const, 1.0, np.sqrt(var))

    def to_raw(shift, scale):  # (r, K, K): theta -> raw coefficients on [1, X - c]
        A = np.zeros((len(scale), K, K))
        A[:, 0, 0] = 1.0
        A[:, 0, 1:] = -shift / scale
        A[:, np.arange(1, K), np.arange(1, K)] = 1.0 / scale
        return A

    # Warm start: the fit under the mean weights. Every row starts from its predictions, so the
    # probabilities q are one (n,) vector there and each row's gradient and Hessian are products
    # of S with fixed matrices, taken in the same pass over S as the weighted moments.
    rp, sp = np.zeros(K), Sp @ M
    if m and sp[0, 1] > 0 and sp[0, 2] > 0:
        Wp, shp, scp = moments(sp)
        Ap = to_raw(shp, scp)
        th0 = np.r_[np.log(sp[0, 1] / sp[0, 2]), np.zeros(F)][None]
        thp = _newton(Xn, Qtri, Sp, Wp, sp[:, J - K :], Ap, th0, C, max_iter, 1e-8)[0]
        rp = Ap[0] @ thp[0]
    with np.errstate(over="ignore"):
        qp = 1.0 / (1.0 + np.exp(Xn @ rp))
    sums = (np.c_[M, qp[:, None] * Xn, (qp * (1.0 - qp))[:, None] * Qtri].T @ S.T).T
    if not np.isfinite(sums[:, 0]).all():
        raise ValueError("weights must be finite")
    W, shift, scale = moments(sums)
    pos, neg = sums[:, 1], sums[:, 2]  # exact zeros when a class has no weight
    degenerate = ~((pos > 0) & (neg > 0))
    theta, conv, steps = np.zeros((m, K)), np.ones(m, bool), 0
    ok = np.flatnonzero(~degenerate)
    if ok.size:
        Sok, sok = (S, sums) if ok.size == m else (S[ok], sums[ok])
        sh, sc = shift[ok], scale[ok]
        start = np.c_[rp[0] + sh @ rp[1:], rp[1:] * sc]  # the pooled predictions in each row's units
        first = (C * (-sok[:, J : J + K] - sok[:, J - K : J]), C * sok[:, J + K :])
        th, cv, steps = _newton(Xn, Qtri, Sok, W[ok], sok[:, J - K : J], to_raw(sh, sc), start, C, max_iter, tol, first)
        theta[ok], conv[ok] = th, cv
    intercept = np.where(degenerate, np.where(pos > 0, np.inf, -np.inf), theta[:, 0])
    coef = np.where(degenerate[:, None], 0.0, theta[:, 1:])
    return LogisticBatch(c + shift, scale, coef, intercept, steps, conv, degenerate)


def fit_one(X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None, C: float = 1.0, **kw) -> LogisticBatch:
    """One weighted fit, w (n,) (default all ones), as a batch with m = 1."""
    w = np.ones(len(X)) if w is None else np.asarray(w, float)
    return fit_batched(X, y, w[None, :], C, **kw)


def _self_check() -> str:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    n = 3000
    X = np.c_[rng.random((n, 3)), 7 * rng.random(n)]
    y = (rng.random(n) < expit(X @ [1.0, -2.0, 0.5, 0.3] - 0.5)).astype(int)
    S = rng.multinomial(100, np.full(100, 0.01), size=8)[:, rng.integers(0, 100, n)].astype(float)
    fit = fit_batched(X, y, S)
    diff = 0.0
    for w, coef, icpt in zip(S, fit.coef, fit.intercept):
        p = Pipeline([("scale", StandardScaler()), ("lr", LogisticRegression(solver="newton-cholesky", tol=1e-12))])
        p.fit(X, y, scale__sample_weight=w, lr__sample_weight=w)
        diff = max(diff, np.abs(p[-1].coef_[0] - coef).max(), abs(p[-1].intercept_[0] - icpt))
    ok = diff < 1e-6 and fit.converged.all()
    return (
        f"logistic self-check {'ok' if ok else 'FAILED'}: {len(S)} resamples, n={n}, "
        f"max |coef, intercept diff| vs scikit-learn {diff:.1e}, {fit.n_iter} Newton steps"
    )


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(lambda: print(_self_check()))
