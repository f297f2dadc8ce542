"""Exact stratified bootstrap draws: which clusters each resample draws, and the resamples' column sums.

A resample draws, within every stratum of k clusters, k clusters uniformly with replacement
(the nonparametric bootstrap: scipy.stats.bootstrap's distribution, stratified).

The stream (`np.random.SFC64(seed)`). Chunk after chunk of m = `chunk_size(P)` resamples,
stratum after stratum (sorted by stratum value), level after level: a level gives every
resample that still lacks draws the same number D of random words (D: the most any of them
lacks; level 0: D = k for all m), interleaved, so word j*n + i is the i-th such resample's
j-th, and a resample reads only its first d words, d the draws it lacks. Words are 16-bit
(32-bit when k > 2**16), the first D*n of the raw 64-bit outputs read little-endian. A read
word r is accepted when r < cut = k * (2**bits // k) and then draws cluster r % k (exactly
uniform); a rejected word draws nothing, so redraw levels carry a fraction (2**bits % k) /
2**bits of the draws. The stream is a function of (strata, n_resamples, seed) alone, so it is
the same on every machine and numpy version that keeps SFC64's raw output, and two consumers
read it: `count_chunks` (how often each cluster is drawn, for refit statistics) and
`sum_chunks` (the resamples' column sums, for ratio-of-sums statistics).

Plain numpy: on the shipped campaign every column sum of `python bandit/ci.py` together takes
well under a second of its run (bench/bench_ci.py prints the share), so no compiled kernel.

    python bandit/stats/resample.py      # self-check: sums == counts @ values, and the time of both
"""

from __future__ import annotations

import sys
from typing import Callable, Iterator

import numpy as np

CHUNK_CELLS = 1 << 21  # draws per chunk of resamples (resamples x clusters): bounds memory, amortises the loop
MAX_CHUNK = 8192  # resamples per chunk at most
_LITTLE = sys.byteorder == "little"

Consumer = Callable[[np.ndarray, np.ndarray, "_Words"], np.ndarray]


def chunk_size(n_clusters: int) -> int:
    """Resamples per chunk: depends only on P, so the stream is a function of (strata, n_resamples, seed)."""
    return max(1, min(MAX_CHUNK, CHUNK_CELLS // max(int(n_clusters), 1)))


def _groups(strata: np.ndarray) -> list[np.ndarray]:
    strata = np.asarray(strata)
    return [np.flatnonzero(strata == s) for s in np.unique(strata)]


def _size(k: int) -> int:
    """Bits per random word for a stratum of k clusters."""
    if k > 1 << 32:
        raise ValueError(f"a stratum of {k} clusters is too large to resample")
    return 16 if k <= 1 << 16 else 32


def _cut(k: int) -> int:
    return (1 << _size(k)) // k * k


class _Words:
    """One level's n words, handed out in order by `next`, in pieces or at once: either way they are
    the first n words of ceil(n * size / 64) raw 64-bit outputs, read little-endian."""

    def __init__(self, bitgen: np.random.BitGenerator, n: int, k: int):
        self.bitgen, self.n, self.size = bitgen, n, _size(k)
        self.spare = np.empty(0, np.dtype(f"<u{self.size // 8}"))  # the rest of the last raw output

    def next(self, n: int) -> np.ndarray:
        if n > self.n:
            raise ValueError("more words than the level holds")
        self.n -= n
        new = n - self.spare.size
        if new <= 0:
            out, self.spare = self.spare[:n], self.spare[n:]
            return out
        raw = self.bitgen.random_raw(-(-new * self.size // 64))
        raw = (raw if _LITTLE else raw.astype("<u8")).view(self.spare.dtype)
        out = np.concatenate([self.spare, raw[:new]]) if self.spare.size else raw[:new]
        self.spare = raw[new:]
        return out


def _draw(bitgen: np.random.BitGenerator, m: int, k: int, consume: Consumer) -> None:
    """Draw m resamples of k clusters from one stratum, level by level. consume(live, need, words) reads
    a level's words as (need.max(), live.size) row-major (row j: the j-th word of every resample in
    `live`), uses only the first need[i] words of column i, and returns how many of those it accepted."""
    live, need = np.arange(m), np.full(m, k, np.int64)
    while live.size:
        need = need - consume(live, need, _Words(bitgen, int(need.max()) * live.size, k))
        keep = need > 0
        live, need = live[keep], need[keep]


class _Counts:
    """Consumer: (m, k) draw counts of one stratum's clusters."""

    def __init__(self, m: int, k: int):
        self.m, self.k, self.cut = m, k, _cut(k)
        self.counts = np.zeros(m * k, np.int64)

    def __call__(self, live: np.ndarray, need: np.ndarray, source: _Words) -> np.ndarray:
        words = source.next(int(need.max()) * live.size).reshape(-1, live.size)
        ok = (words < self.cut) & (np.arange(len(words))[:, None] < need)  # accepted, and read
        owner = np.broadcast_to(live, words.shape)[ok]
        self.counts += np.bincount(owner * self.k + words[ok] % self.k, minlength=self.m * self.k)
        return ok.sum(0)


def count_chunks(strata: np.ndarray, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Stratified resample counts, a chunk of resamples at a time: (m, P) int32, each stratum's total preserved."""
    strata = np.asarray(strata)
    bitgen = np.random.SFC64(seed)
    groups = _groups(strata)
    m_full = chunk_size(strata.size)
    for start in range(0, n_resamples, m_full):
        m = min(m_full, n_resamples - start)
        out = np.empty((m, strata.size), np.int32)
        for g in groups:
            c = _Counts(m, g.size)
            _draw(bitgen, m, g.size, c)
            # strata of sorted tables are contiguous: a slice avoids a fancy-index scatter
            out[:, slice(g[0], g[-1] + 1) if g[-1] - g[0] + 1 == g.size else g] = c.counts.reshape(m, g.size)
        yield out


def sum_chunks(values: np.ndarray, strata: np.ndarray, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """The resamples' column sums, a chunk at a time: (m, K) float64, count_chunks(...) @ values (same
    arguments, same resamples), added up stratum by stratum in stratum order."""
    values = np.asarray(values, float)
    groups = _groups(strata)
    for counts in count_chunks(strata, n_resamples, seed):
        out = np.zeros((counts.shape[0], values.shape[1]))
        for g in groups:
            out += counts[:, g].astype(float) @ values[g]
        yield out


def _bench() -> None:
    """Time the two ways of drawing 2000 resamples of 10,000 clusters in 4 strata, and check they agree."""
    import time

    rng = np.random.default_rng(1)
    P, B = 10_000, 2_000
    a = rng.integers(0, 9, (P, 4)).astype(float)
    vals, strata = np.c_[a, a.max(1)], np.repeat(np.arange(4), P // 4)
    t0 = time.perf_counter()
    sums = np.concatenate(list(sum_chunks(vals, strata, B, 0)))
    t1 = time.perf_counter()
    ref = np.concatenate([c.astype(float) @ vals for c in count_chunks(strata, B, 0)])
    t2 = time.perf_counter()
    print(
        f"{B} resamples of {P} clusters in 4 strata: sums by stratum {t1 - t0:.3f} s, counts @ values "
        f"{t2 - t1:.3f} s, equal: {np.array_equal(sums, ref)}"
    )


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(_bench)
