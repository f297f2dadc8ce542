"""bandit/stats/logistic.py against the scikit-learn pipeline it replaces.

Every reference is a real StandardScaler + LogisticRegression(solver="newton-cholesky") fit on the
same weighted data, run to tol=1e-12 so that the comparison measures our optimum, not where
scikit-learn's default tol=1e-4 happens to stop (that gap, ~1e-6, is reported by
bench/bench_logistic.py).
"""

import warnings

import numpy as np
import pytest
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from bandit.stats.logistic import LogisticBatch, fit_batched, fit_one

ATOL = 1e-6


def sk_fit(X, y, w, C=1.0):
    p = Pipeline(
        [
            ("scale", StandardScaler()),
            ("lr", LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000)),
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reference that did not converge is no reference
        p.fit(X, y, scale__sample_weight=w, lr__sample_weight=w)
    return p


def selector_like(rng, n, signal=1.0):
    """4 features like the selector's (3 confidences in [0, 1], an entropy up to 7), weak labels."""
    X = np.c_[rng.random((n, 3)), 7 * rng.random(n) ** 2]
    y = (rng.random(n) < expit(signal * (X @ [1.5, -1.0, 0.5, 0.2] - 0.8))).astype(int)
    return X, y


def cluster_counts(rng, n, m, clusters=60):
    """(m, n) bootstrap counts: clusters drawn with replacement, every row of a cluster with it (zeros included)."""
    cl = rng.integers(0, clusters, n)
    return rng.multinomial(clusters, np.full(clusters, 1 / clusters), size=m)[:, cl].astype(float)


def assert_matches(fit: LogisticBatch, X, y, S, C=1.0, rows=None, atol=ATOL):
    for k in range(len(S)) if rows is None else rows:
        p = sk_fit(X, y, S[k], C)
        sc, lr = p.named_steps["scale"], p.named_steps["lr"]
        np.testing.assert_allclose(fit.mean[k], sc.mean_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(fit.scale[k], sc.scale_, rtol=1e-9)
        np.testing.assert_allclose(fit.coef[k], lr.coef_[0], rtol=0, atol=atol)
        np.testing.assert_allclose(fit.intercept[k], lr.intercept_[0], rtol=0, atol=atol)
    assert fit.converged.all() and not fit.degenerate.any()


def test_bootstrap_counts_match_sklearn():
    rng = np.random.default_rng(1)
    X, y = selector_like(rng, 1500)
    S = cluster_counts(rng, 1500, 8)
    assert (S == 0).any(axis=1).all()  # every resample leaves some rows out
    assert not S.flags.c_contiguous  # the column-major layout ci.py's fancy indexing makes
    fit = fit_batched(X, y, S)
    assert_matches(fit, X, y, S)
    assert fit.coef.shape == fit.mean.shape == fit.scale.shape == (8, 4) and fit.intercept.shape == (8,)


def test_continuous_weights_with_zeros_match_sklearn():
    rng = np.random.default_rng(2)
    X, y = selector_like(rng, 800)
    S = rng.exponential(size=(5, 800)) * (rng.random((5, 800)) > 0.3)
    S[0] = rng.poisson(1.0, 800)
    assert_matches(fit_batched(X, y, S), X, y, S)


def test_unequal_feature_scales_and_offsets():
    rng = np.random.default_rng(3)
    X, y = selector_like(rng, 1000)
    X = X * [1e-3, 1.0, 1e3, 1.0] + [0.0, 1e4, -50.0, 3.0]
    S = cluster_counts(rng, 1000, 4)
    assert_matches(fit_batched(X, y, S), X, y, S)


@pytest.mark.parametrize("v", [0.75, 0.35, 0.123])  # one-pass variance rounds to <0, >0, >0 (-> the rounding term)
def test_constant_features_get_scale_one(v):
    rng = np.random.default_rng(4)
    X, y = selector_like(rng, 900)
    X = np.c_[X, np.full(900, 0.3)]  # constant everywhere
    S = cluster_counts(rng, 900, 4)
    X[S[1] > 0, 2] = v  # constant on resample 1's rows only (its left-out rows vary)
    fit = fit_batched(X, y, S)
    assert (fit.scale[:, 4] == 1.0).all() and fit.scale[1, 2] == 1.0 and (fit.scale[[0, 2, 3], 2] != 1.0).all()
    assert_matches(fit, X, y, S)
    Xt = rng.random((50, 5))  # off the training rows too: the constant column's coef is ~0 in both
    for k in range(4):
        np.testing.assert_allclose(fit.predict_proba(Xt)[k], sk_fit(X, y, S[k]).predict_proba(Xt)[:, 1], atol=1e-7)


def test_strongly_separated_data():
    rng = np.random.default_rng(5)
    n = 600
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(int)  # perfectly separable: only the penalty keeps beta finite
    S = cluster_counts(rng, n, 4, clusters=40)
    for C in (1.0, 100.0):
        fit = fit_batched(X, y, S, C=C)
        assert_matches(fit, X, y, S, C=C)
        assert np.abs(fit.coef).max() > (8 if C == 100.0 else 2)  # really is far from the start


@pytest.mark.parametrize("C", [0.05, 20.0])
def test_other_C(C):
    rng = np.random.default_rng(6)
    X, y = selector_like(rng, 700, signal=3.0)
    S = cluster_counts(rng, 700, 3)
    assert_matches(fit_batched(X, y, S, C=C), X, y, S, C=C)


def test_predict_proba_and_decision_match_pipeline():
    rng = np.random.default_rng(7)
    X, y = selector_like(rng, 1000)
    S = cluster_counts(rng, 1000, 4)
    Xt, _ = selector_like(rng, 300)
    fit = fit_batched(X, y, S)
    P, Z = fit.predict_proba(Xt), fit.decision(Xt)
    assert P.shape == Z.shape == (4, 300)
    for k in range(4):
        p = sk_fit(X, y, S[k])
        np.testing.assert_allclose(P[k], p.predict_proba(Xt)[:, 1], rtol=0, atol=1e-7)
        np.testing.assert_allclose(Z[k], p.decision_function(Xt), rtol=0, atol=1e-6)


def test_degenerate_single_class_resamples():
    rng = np.random.default_rng(8)
    X, y = selector_like(rng, 600)
    S = cluster_counts(rng, 600, 5)
    S[1] = np.where(y == 1, S[1], 0.0)  # only positives weighted
    S[2] = np.where(y == 0, S[2], 0.0)  # only negatives weighted
    S[3] = 0.0  # no weight at all
    with pytest.raises(ValueError):  # scikit-learn would refuse resample 1 (as the selector fits it)
        sk_fit(X[S[1] > 0], y[S[1] > 0], S[1][S[1] > 0])
    fit = fit_batched(X, y, S)
    assert fit.degenerate.tolist() == [False, True, True, True, False]
    assert (fit.coef[1:4] == 0).all() and fit.converged.all()
    P = fit.predict_proba(X[:20])
    assert (P[1] == 1.0).all() and (P[2] == 0.0).all() and (P[3] == 0.0).all()
    assert np.isposinf(fit.decision(X[:3])[1]).all() and np.isneginf(fit.decision(X[:3])[2]).all()
    assert_matches(
        LogisticBatch(
            *(f[[0, 4]] for f in (fit.mean, fit.scale, fit.coef, fit.intercept)),
            fit.n_iter,
            fit.converged[[0, 4]],
            fit.degenerate[[0, 4]],
        ),
        X,
        y,
        S[[0, 4]],
    )


def test_fit_one_equals_batch_row():
    rng = np.random.default_rng(9)
    X, y = selector_like(rng, 900)
    S = cluster_counts(rng, 900, 6)
    batch = fit_batched(X, y, S)
    one = fit_one(X, y, S[3])
    assert one.coef.shape == (1, 4) and one.converged.all()
    np.testing.assert_allclose(one.coef[0], batch.coef[3], rtol=0, atol=1e-8)
    np.testing.assert_allclose(one.intercept[0], batch.intercept[3], rtol=0, atol=1e-8)
    np.testing.assert_allclose(one.predict_proba(X[:50])[0], batch.predict_proba(X[:50])[3], rtol=0, atol=1e-9)
    unweighted = fit_one(X, y)
    p = sk_fit(X, y, np.ones(900))
    np.testing.assert_allclose(unweighted.coef[0], p[-1].coef_[0], rtol=0, atol=ATOL)


def test_bad_inputs_rejected():
    X, y = selector_like(np.random.default_rng(10), 50)
    with pytest.raises(ValueError):
        fit_batched(X, y, -np.ones((2, 50)))
    with pytest.raises(ValueError):
        fit_batched(X, y + 1, np.ones((2, 50)))
    with pytest.raises(ValueError):
        fit_batched(X, y, np.ones((2, 49)))


def test_full_size_batch():
    """m = 200 resamples of n = 20000 rows (the brief's memory case) in one call, spot-checked."""
    rng = np.random.default_rng(11)
    X, y = selector_like(rng, 20000, signal=0.5)
    S = cluster_counts(rng, 20000, 200, clusters=300)
    fit = fit_batched(X, y, S)
    assert fit.converged.all() and fit.n_iter <= 10
    assert_matches(fit, X, y, S, rows=[0, 199])
