"""The resampling engine (bandit/stats/resample.py) against a word-by-word reading of its stream, and against scipy."""

import numpy as np
import pytest
import scipy.stats

from bandit.stats import bootstrap
from bandit.stats import resample

PINNED = [
    [2, 0, 1, 2, 0, 1, 1],
    [2, 0, 1, 2, 2, 0, 0],
    [1, 1, 1, 2, 0, 1, 1],
]  # count_chunks(3 + 4 clusters, 3, seed 0)


def brute_force_draws(strata: np.ndarray, n_resamples: int, seed: int) -> list[list[int]]:
    """Each resample's drawn clusters, reading the stream exactly as resample.py's docstring defines it,
    one word at a time in plain Python."""
    bitgen = np.random.SFC64(seed)
    m_full = resample.chunk_size(strata.size)
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    out: list[list[int]] = []
    for start in range(0, n_resamples, m_full):
        m = min(m_full, n_resamples - start)
        chunk: list[list[int]] = [[] for _ in range(m)]
        for g in groups:
            k = g.size
            size = 16 if k <= 1 << 16 else 32
            cut = (1 << size) // k * k
            need = [k] * m
            while any(need):  # a level: every resample still lacking draws gets D words, interleaved
                live = [b for b in range(m) if need[b]]
                D = max(need)
                n = D * len(live)
                raw = bitgen.random_raw(-(-n * size // 64))
                words = [(int(r) >> (size * i)) & ((1 << size) - 1) for r in raw for i in range(64 // size)][:n]
                lacking = list(need)
                for i, w in enumerate(words):
                    j, b = divmod(i, len(live))  # word j * len(live) + i is live[i]'s j-th
                    b = live[b]
                    if j < lacking[b] and w < cut:  # a resample reads only as many words as it lacks draws
                        chunk[b].append(int(g[w % k]))
                        need[b] -= 1
        out += chunk
    return out


def check(vals: np.ndarray, strata: np.ndarray, n: int, seed: int, exact: bool = True) -> None:
    draws = brute_force_draws(strata, n, seed)
    assert all(sorted(np.asarray(strata)[d].tolist()) == sorted(np.asarray(strata).tolist()) for d in draws)
    want = np.array([vals[d].sum(0) for d in draws])
    sums = np.concatenate(list(resample.sum_chunks(vals, strata, n, seed)))
    counts = np.concatenate(list(resample.count_chunks(strata, n, seed)))
    assert np.array_equal(counts, np.array([np.bincount(d, minlength=strata.size) for d in draws]))
    if exact:
        assert np.array_equal(sums, want)
    else:
        assert np.allclose(sums, want, rtol=1e-12)


def test_sums_equal_brute_force_small_strata_many_chunks(monkeypatch):
    monkeypatch.setattr(resample, "CHUNK_CELLS", 40)  # many chunks (2 resamples each)
    rng = np.random.default_rng(0)
    strata = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    vals = np.c_[rng.integers(0, 9, (18, 4)), rng.integers(-50, 50, 18), np.full(18, 7), rng.integers(0, 2**40, 18)]
    check(vals.astype(float), strata, 9, seed=3)


def test_sums_equal_brute_force_with_redraws():
    # 40000 clusters: 16-bit words are rejected 39% of the time, so several redraw levels
    rng = np.random.default_rng(1)
    k = 40_000
    vals = np.c_[rng.integers(0, 9, (k, 2)), rng.integers(0, 2**20, (k, 6))].astype(float)
    check(vals, np.zeros(k, int), 3, seed=5)


def test_sums_equal_brute_force_32bit_words_and_fractional_columns():
    rng = np.random.default_rng(2)
    k = 70_000  # > 2**16 clusters: 32-bit words
    check(rng.integers(0, 9, (k, 3)).astype(float), np.zeros(k, int), 2, seed=7)
    vals = np.r_[rng.integers(0, 5, (6, 2)).astype(float), rng.gamma(2.0, 1.0, (5, 2))]
    check(vals, np.repeat([0, 1], [6, 5]), 11, seed=8, exact=False)


def test_stream_is_deterministic_and_seeded():
    strata = np.repeat([0, 1, 2], [30, 20, 50])
    vals = np.random.default_rng(0).integers(0, 9, (100, 3)).astype(float)
    a = np.concatenate(list(resample.sum_chunks(vals, strata, 50, 1)))
    assert np.array_equal(a, np.concatenate(list(resample.sum_chunks(vals, strata, 50, 1))))
    assert not np.array_equal(a, np.concatenate(list(resample.sum_chunks(vals, strata, 50, 2))))
    assert np.array_equal(a, np.concatenate([c @ vals for c in resample.count_chunks(strata, 50, 1)]))


def test_a_known_stream_is_pinned():
    """The first resamples of one small stream, as numbers: a change to the stream (and so to every CI
    published from it) fails here rather than silently."""
    counts = np.concatenate(list(resample.count_chunks(np.repeat([0, 1], [3, 4]), 3, 0)))
    assert counts.sum(1).tolist() == [7, 7, 7]
    assert (counts[:, :3].sum(1) == 3).all() and (counts[:, 3:].sum(1) == 4).all()
    assert counts.tolist() == PINNED


def test_packed_gap_interval_agrees_with_scipy_bootstrap():
    """per_block_gap-style statistic on integer columns (the packed path) vs scipy.stats.bootstrap."""
    rng = np.random.default_rng(4)
    a = np.minimum(rng.geometric(rng.uniform(0.2, 0.5, 4), (600, 4)) - 1, 8)
    cols = np.c_[a, a.max(1)].astype(float)
    n = 4000

    def gap(T):
        return (T[:, -1] / T[:, :-1].max(1) - 1)[:, None]

    value, boot, _ = bootstrap.boot_totals(cols, gap, np.zeros(len(cols), int), n, seed=1, jackknife=False)
    mine = bootstrap.interval(value[0], boot[:, 0], None, "percentile", "block", 1)

    def stat(*xs, axis=-1):
        s = [x.sum(axis) for x in xs]
        return s[-1] / np.max(s[:-1], axis=0) - 1

    ref = scipy.stats.bootstrap(
        tuple(cols.T), stat, paired=True, vectorized=True, n_resamples=n, method="percentile", random_state=2
    ).confidence_interval
    width = ref.high - ref.low
    assert mine.value == pytest.approx(cols[:, -1].sum() / cols[:, :-1].sum(0).max() - 1)
    # Monte-Carlo error of an endpoint with 4000 resamples is a few percent of the width
    assert abs(mine.lo - ref.low) < 0.08 * width and abs(mine.hi - ref.high) < 0.08 * width, (mine, ref)
    # and the bootstrap distribution itself: mean and spread agree with a plain numpy bootstrap
    idx = np.random.default_rng(3).integers(0, len(cols), (n, len(cols)))
    plain = gap(cols[idx].sum(1))[:, 0]
    assert abs(boot.mean() - plain.mean()) < 4 * plain.std() / np.sqrt(n) * np.sqrt(2)
    assert boot.std() == pytest.approx(plain.std(), rel=0.06)
