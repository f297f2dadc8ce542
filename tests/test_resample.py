"""The resampling engine (bandit/resample.py) against a word-by-word reading of its stream, and against scipy."""
import numpy as np
import pytest
import scipy.stats

from bandit import ci, resample

KERNEL = resample._kernel   # the compiled kernel, or None where it was not built


@pytest.fixture(params=["kernel", "numpy"])
def engine(request, monkeypatch):
    """Run a test through the compiled kernel and again through the numpy path (the reference)."""
    if request.param == "kernel" and KERNEL is None:
        pytest.skip("bandit._resample_kernel not built")
    monkeypatch.setattr(resample, "_kernel", KERNEL if request.param == "kernel" else None)
    return request.param


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
            while any(need):   # a level: every resample still lacking draws gets D words, interleaved
                live = [b for b in range(m) if need[b]]
                D = max(need)
                n = D * len(live)
                raw = bitgen.random_raw(-(-n * size // 64))
                words = [(int(r) >> (size * i)) & ((1 << size) - 1) for r in raw for i in range(64 // size)][:n]
                lacking = list(need)
                for i, w in enumerate(words):
                    j, b = divmod(i, len(live))   # word j * len(live) + i is live[i]'s j-th
                    b = live[b]
                    if j < lacking[b] and w < cut:   # a resample reads only as many words as it lacks draws
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


def test_packed_sums_equal_brute_force_small_strata(monkeypatch, engine):
    # many chunks (2 resamples each) and tiles of a few words: every tile/run boundary case
    monkeypatch.setattr(resample, "CHUNK_CELLS", 40)
    monkeypatch.setattr(resample, "TILE_CELLS", 4)
    rng = np.random.default_rng(0)
    strata = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    vals = np.c_[rng.integers(0, 9, (18, 4)), rng.integers(-50, 50, 18), np.full(18, 7), rng.integers(0, 2 ** 40, 18)]
    check(vals.astype(float), strata, 9, seed=3)


def test_packed_sums_equal_brute_force_with_redraws_and_several_words(engine):
    # 40000 clusters: 16-bit words are rejected 39% of the time, so several redraw levels; wide
    # columns need several packed words and runs shorter than a resample, in level 0 and in the redraws
    rng = np.random.default_rng(1)
    k = 40_000
    vals = np.c_[rng.integers(0, 9, (k, 2)), rng.integers(0, 2 ** 20, (k, 6))].astype(float)
    run, layout = resample._plan([int(s) for s in vals.max(0)], k)
    assert len(layout) >= 2 and run < 20_000
    check(vals, np.zeros(k, int), 3, seed=5)


def test_sums_equal_brute_force_32bit_words_and_fractional_columns(engine):
    rng = np.random.default_rng(2)
    k = 70_000   # > 2**16 clusters: 32-bit words, the packed lookup goes through the drawn cluster
    check(rng.integers(0, 9, (k, 3)).astype(float), np.zeros(k, int), 2, seed=7)
    # fractional columns go through the counts; a stratum of integers next to one of fractions
    vals = np.r_[rng.integers(0, 5, (6, 2)).astype(float), rng.gamma(2.0, 1.0, (5, 2))]
    check(vals, np.repeat([0, 1], [6, 5]), 11, seed=8, exact=False)


def test_stream_is_deterministic_and_seeded(engine):
    strata = np.repeat([0, 1, 2], [30, 20, 50])
    vals = np.random.default_rng(0).integers(0, 9, (100, 3)).astype(float)
    a = np.concatenate(list(resample.sum_chunks(vals, strata, 50, 1)))
    assert np.array_equal(a, np.concatenate(list(resample.sum_chunks(vals, strata, 50, 1))))
    assert not np.array_equal(a, np.concatenate(list(resample.sum_chunks(vals, strata, 50, 2))))
    assert np.array_equal(a, np.concatenate([c @ vals for c in resample.count_chunks(strata, 50, 1)]))


CASES = [   # (values, strata, resamples, seed, monkeypatched sizes): tiles, chunks, runs, words, redraws
    (np.random.default_rng(0).integers(0, 9, (18, 5)), np.repeat([0, 1, 2], [3, 2, 13]), 9, 3,
     {"CHUNK_CELLS": 40, "TILE_CELLS": 4}),
    (np.c_[np.random.default_rng(1).integers(0, 9, (40_000, 2)), np.random.default_rng(2).integers(0, 2 ** 20, (40_000, 6))],
     np.zeros(40_000, int), 3, 5, {}),
    (np.random.default_rng(3).integers(0, 9, (70_000, 3)), np.zeros(70_000, int), 2, 7, {}),
    (np.c_[np.random.default_rng(4).integers(0, 2 ** 30, (70_000, 3)), np.zeros(70_000)], np.zeros(70_000, int), 2, 8, {}),
    (np.random.default_rng(5).integers(0, 9, (10_000, 5)), np.repeat([0, 1, 2, 3], 2500), 700, 1, {}),
    (np.random.default_rng(6).integers(0, 9, (416, 5)), np.zeros(416, int), 5100, 2, {}),   # chunks of 5041 resamples
    (np.random.default_rng(7).integers(0, 2 ** 40, (3001, 4)), np.repeat([0, 1], [1, 3000]), 37, 4,
     {"CHUNK_CELLS": 3001 * 5, "TILE_CELLS": 64, "MAX_RUN": 16}),
    (np.random.default_rng(8).integers(0, 2, (65_536, 1)), np.zeros(65_536, int), 3, 9, {}),   # cut == 2**16, no redraws
    (np.random.default_rng(9).integers(0, 3, (65_537, 2)), np.zeros(65_537, int), 3, 9, {}),   # the first 32-bit stratum
]


@pytest.mark.skipif(KERNEL is None, reason="bandit._resample_kernel not built")
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_bit_identical_to_numpy_path(monkeypatch, case):
    vals, strata, n, seed, sizes = CASES[case]
    for name, v in sizes.items():
        monkeypatch.setattr(resample, name, v)
    vals = vals.astype(float)
    got = np.concatenate(list(resample.sum_chunks(vals, strata, n, seed)))
    monkeypatch.setattr(resample, "_kernel", None)
    want = np.concatenate(list(resample.sum_chunks(vals, strata, n, seed)))
    assert got.tobytes() == want.tobytes()


@pytest.mark.skipif(KERNEL is None, reason="bandit._resample_kernel not built")
@pytest.mark.parametrize("k, n", [(10_000, 7), (12, 5), (70_000, 3), (65_535, 2), (300, 4000)])
def test_kernel_level_reads_random_raw_words_and_leaves_the_same_state(k, n):
    """One redraw level (uneven needs: only where words can be rejected, k not a power of two) through both paths:
    the same run sums, and the generator left in the same state."""
    rng = np.random.default_rng(k)
    vals = np.c_[rng.integers(0, 9, (k, 2)), rng.integers(0, 2 ** 30, (k, 2))]
    packed = resample._Packed(vals, n)
    L = packed.run
    need = rng.integers(0, min(k, 2 * L + 3), n).astype(np.int64)
    need[0] = need.max() + 1
    D = int(need.max())
    out = {}
    for path in ("kernel", "numpy"):
        bitgen = np.random.SFC64(11)
        bitgen.random_raw(3)
        parts = [np.zeros((-(-D // L), n), np.uint64) for _ in packed.tables]
        words = resample._Words(bitgen, D * n, k)
        (packed._kernel_sums if path == "kernel" else packed._numpy_sums)(need.copy(), words, D, n, parts)
        assert words.n == 0
        out[path] = parts, bitgen.random_raw(2).tolist()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(out["kernel"][0], out["numpy"][0]))
    assert out["kernel"][1] == out["numpy"][1]


@pytest.mark.skipif(KERNEL is None, reason="bandit._resample_kernel not built")
def test_kernel_checks_its_arguments():
    bitgen = np.random.SFC64(0)
    need = np.array([4, 2], np.int64)
    table, parts = np.zeros(1 << 16, np.uint64), np.zeros((2, 2), np.uint64)
    ok = (bitgen.capsule, 4, need, 2, 10, 65530, (table,), (parts,))
    KERNEL.level_sums(*ok)
    bad = [
        dict(i=5, v=(np.zeros(100, np.uint64),)),            # table too short for 16-bit words
        dict(i=7, v=(np.zeros((1, 2), np.uint64),)),         # parts too short for 2 runs
        dict(i=3, v=0),                                      # run length 0
        dict(i=5, v=(table.astype(np.int64),)),              # signed table
        dict(i=2, v=need.astype(np.int32)),                  # need not int64
        dict(i=1, v=5),                                      # D != max(need)
        dict(i=2, v=np.array([4, -1], np.int64)),            # negative need
        dict(i=5, v=65536),                                  # wrong cut
        dict(i=0, v=object()),                               # not a capsule
        dict(i=6, v=(table, table)),                         # tables and parts differ in number
    ]
    for b in bad:
        args = list(ok)
        args[b["i"]] = b["v"]
        with pytest.raises((ValueError, TypeError)):
            KERNEL.level_sums(*args)
    wide = (bitgen.capsule, 4, need, 2, 70_000, 70_000 * (2 ** 32 // 70_000), (np.zeros(70_000, np.uint64),), (parts,))
    with pytest.raises(ValueError):   # 32-bit words: the table needs k + 1 entries
        KERNEL.level_sums(*wide)


def test_works_without_the_kernel(monkeypatch):
    monkeypatch.setattr(resample, "_kernel", None)
    vals = np.random.default_rng(0).integers(0, 9, (30, 3)).astype(float)
    check(vals, np.repeat([0, 1], [10, 20]), 7, seed=2)


def test_packed_gap_interval_agrees_with_scipy_bootstrap():
    """per_block_gap-style statistic on integer columns (the packed path) vs scipy.stats.bootstrap."""
    rng = np.random.default_rng(4)
    a = np.minimum(rng.geometric(rng.uniform(0.2, 0.5, 4), (600, 4)) - 1, 8)
    cols = np.c_[a, a.max(1)].astype(float)
    n = 4000

    def gap(T):
        return (T[:, -1] / T[:, :-1].max(1) - 1)[:, None]

    value, boot, _ = ci.boot_totals(cols, gap, np.zeros(len(cols), int), n, seed=1, jackknife=False)
    mine = ci.interval(value[0], boot[:, 0], None, "percentile", "block", 1)

    def stat(*xs, axis=-1):
        s = [x.sum(axis) for x in xs]
        return s[-1] / np.max(s[:-1], axis=0) - 1

    ref = scipy.stats.bootstrap(tuple(cols.T), stat, paired=True, vectorized=True, n_resamples=n,
                                method="percentile", random_state=2).confidence_interval
    width = ref.high - ref.low
    assert mine.value == pytest.approx(cols[:, -1].sum() / cols[:, :-1].sum(0).max() - 1)
    # Monte-Carlo error of an endpoint with 4000 resamples is a few percent of the width
    assert abs(mine.lo - ref.low) < 0.08 * width and abs(mine.hi - ref.high) < 0.08 * width, (mine, ref)
    # and the bootstrap distribution itself: mean and spread agree with a plain numpy bootstrap
    idx = np.random.default_rng(3).integers(0, len(cols), (n, len(cols)))
    plain = gap(cols[idx].sum(1))[:, 0]
    assert abs(boot.mean() - plain.mean()) < 4 * plain.std() / np.sqrt(n) * np.sqrt(2)
    assert boot.std() == pytest.approx(plain.std(), rel=0.06)
