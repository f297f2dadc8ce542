"""Exact stratified bootstrap draws, and the resamples' column sums at one table lookup per draw.

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
2**bits of the draws. The stream is a function of (strata, n_resamples, seed) alone, and two
consumers read it:

- `count_chunks`: how often each cluster is drawn, (m, P) per chunk (refit statistics);
- `sum_chunks`: the resamples' column sums, (m, K) per chunk, equal to counts @ values. For
  integer columns (those of every ratio-of-sums statistic in ci.py) a stratum's columns,
  minus their minimum, are packed as bit fields into one uint64 per cluster (or a few, if
  they do not fit), with one more field that counts accepted words, and a 2**16-entry table
  maps a word to its cluster's packed value (0 for a rejected word). A level's sums are then
  one `take` per word read and packed word, and integer sums over runs of L rows, where every
  field is wide enough for L times its column's largest value (so no field can carry into
  the next); the run sums are added up in two halves of alternate fields (each field then
  has its neighbour's bits to grow into) and unpacked once per resample (run by run where
  those bits would not do). Fractional columns, or columns whose sums would not be exact
  in float64, are summed through the counts.

A level's packed run sums are computed by the optional compiled kernel `bandit._resample_kernel`
(bandit/_resample_kernel.c, built by `pip install -e .` where a C compiler exists) when it is
importable: it reads the same words (from the bit generator's next_raw, the function behind
random_raw, through numpy's BitGenerator capsule), rejects and skips them by the same rule and adds
the same table entries into the same runs, in one pass per word instead of numpy's five (generate,
reject, cast, `take`, sum), so the sums, and the generator's state after them, are bit-identical.
Without it the numpy path below runs (the reference).

    python bandit/resample.py      # self-check: packed sums == counts @ values, and the time of both
"""
from __future__ import annotations

import sys
from typing import Callable, Iterator

import numpy as np

CHUNK_CELLS = 1 << 21  # draws per chunk of resamples (resamples x clusters): bounds memory, amortises the loop
MAX_CHUNK = 8192       # resamples per chunk at most
TILE_CELLS = 1 << 15   # draws looked up at a time (bounds the buffers; does not change the stream)
SLAB_CELLS = 1 << 18   # random words fetched at a time (does not change the stream)
MAX_RUN = 4096         # most draws summed inside a packed word before unpacking
MIN_RUN = 8            # below this, one more packed word costs less than unpacking every few draws
EXACT = 2.0 ** 53      # integer sums below this are exact in float64
_LITTLE = sys.byteorder == "little"

try:   # optional: the compiled kernel for the packed run sums (bit-identical to the numpy path)
    from bandit import _resample_kernel as _kernel
except ImportError:
    _kernel = None

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
        self.spare = np.empty(0, np.dtype(f"<u{self.size // 8}"))   # the rest of the last raw output

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
        ok = (words < self.cut) & (np.arange(len(words))[:, None] < need)   # accepted, and read
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


# ---------------------------------------------------------------- packed sums

def _layout(spans: list[int], run: int) -> list[list[tuple[int, int]]] | None:
    """First-fit of the fields [accepted count] + columns (largest values `spans`) into 64-bit words,
    each field wide enough for the sum of `run` draws: per word, a list of (field, width)."""
    words: list[list[tuple[int, int]]] = []
    used: list[int] = []
    for f, top in enumerate([1] + spans):
        width = (run * top).bit_length()
        if width > 64:
            return None
        w = next((i for i, u in enumerate(used) if u + width <= 64), len(used))
        if w == len(used):
            words.append([])
            used.append(0)
        words[w].append((f, width))
        used[w] += width
    return words


def _plan(spans: list[int], longest: int) -> tuple[int, list[list[tuple[int, int]]]]:
    """(run L, layout): the fewest packed words that allow a run of min(longest, MIN_RUN), then the longest run."""
    shortest = min(longest, MIN_RUN)
    fewest = len(_layout(spans, shortest))   # spans < 2**53: one field per word always fits
    # a field's width only changes just past (2**w - 1) // top, so the best run is one of these (or `longest`);
    # widths grow with the run, so bisect for the longest run that still packs into `fewest` words
    runs = sorted({longest, shortest} | {r for top in [1] + spans if top for w in range(1, 65)
                                         if shortest <= (r := (2 ** w - 1) // top) <= longest})
    lo, hi = 0, len(runs) - 1     # runs[lo] fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lay = _layout(spans, runs[mid])
        lo, hi = (mid, hi) if lay is not None and len(lay) <= fewest else (lo, mid - 1)
    return runs[lo], _layout(spans, runs[lo])


class _Packed:
    """Consumer: the (m, 1 + F) sums of [accepted count] + one stratum's non-negative integer columns."""

    def __init__(self, vals: np.ndarray, m: int):
        k, F = vals.shape
        self.k, self.F, self.cut = k, F, _cut(k)
        self.lookup_word = _size(k) == 16    # index the table by the word itself (else by the drawn cluster)
        rows = max(1, TILE_CELLS // m)   # a tile: rows x (at most m) words, looked up at once
        tops = [1] + [int(s) for s in vals.max(0)]   # each field's largest value per draw (the count's is 1)
        self.run, layout = _plan(tops[1:], min(k, MAX_RUN))
        if self.run <= rows:             # tiles and runs align: whole runs per tile, or whole tiles per run
            self.rows = rows // self.run * self.run
        else:
            self.rows, self.run = rows, self.run // rows * rows
        self.fields, self.halves, self.tables = [], [], []
        for word in layout:
            packed, at, fields = np.zeros(k, np.uint64), 0, []
            for f, width in word:
                packed += (np.ones(k, np.uint64) if f == 0 else vals[:, f - 1].astype(np.uint64)) << np.uint64(at)
                fields.append((f, at, width))
                at += width
            if self.lookup_word:   # a rejected word finds 0
                table = np.zeros(1 << 16, np.uint64)
                table[:self.cut] = np.tile(packed, (1 << 16) // k)
            else:                 # look up the drawn cluster: a rejected word finds the 0 at index k
                table = np.append(packed, np.uint64(0))
            self.fields.append([(f, np.uint64(at), np.uint64((1 << w) - 1)) for f, at, w in fields])
            self.halves.append(self._halves(fields, tops))
            self.tables.append(table)
        self._idx = np.empty(self.rows * m, np.intp)
        self._g = np.empty(self.rows * m, np.uint64)

    def reset(self, m: int) -> "_Packed":
        self.m, self.acc = m, np.zeros((m, 1 + self.F), np.int64)
        return self

    def _index(self, words: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.lookup_word:
            np.copyto(out, words, casting="unsafe")
        else:
            np.remainder(words, self.k, out=out, casting="unsafe")
            out[words >= self.cut] = self.k
        return out

    def _halves(self, fields: list[tuple[int, int, int]], tops: list[int]) -> tuple[list, float]:
        """A packed word's fields in two alternating halves. Shifted down and masked, a half leaves each of its
        fields the bits up to the next field of the half (or to the top of the word), so up to `most` run sums
        add up in one uint64 without a carry: ([(shift, mask, [(field, shift in the half, mask)])], most)."""
        halves, most = [], float("inf")
        for half in (fields[0::2], fields[1::2]):
            if not half:
                continue
            base = half[0][1]
            out = []
            for i, (f, at, width) in enumerate(half):
                room = (half[i + 1][1] if i + 1 < len(half) else 64 + base) - at
                out.append((f, np.uint64(at - base), np.uint64((1 << room) - 1)))
                if tops[f]:
                    most = min(most, ((1 << room) - 1) // (self.run * tops[f]))
            mask = sum(((1 << width) - 1) << (at - base) for _, at, width in half)
            halves.append((np.uint64(base), np.uint64(mask), out))
        return halves, most

    def _unpack(self, parts: list[np.ndarray]) -> np.ndarray:
        """Per packed word, its run sums (runs, n) -> (n, 1 + F) int64 field sums."""
        out = np.empty((parts[0].shape[1], 1 + self.F), np.int64)
        for p, fields, (halves, most) in zip(parts, self.fields, self.halves):
            if len(p) <= most:     # add the runs up half by half, then unpack once
                for shift, mask, half in halves:
                    q = ((p >> shift) & mask).sum(0)
                    for f, at, room in half:
                        out[:, f] = (q >> at) & room
            else:
                for f, shift, mask in fields:
                    out[:, f] = ((p >> shift) & mask).sum(0)
        return out

    def __call__(self, live: np.ndarray, need: np.ndarray, source: _Words) -> np.ndarray:
        """The level's words as (D, n): row j holds every live resample's j-th word, so a run of L draws is L rows."""
        D, n, L = int(need.max()), live.size, self.run
        parts = [np.zeros((-(-D // L), n), np.uint64) for _ in self.tables]
        if _kernel is not None:
            self._kernel_sums(need, source, D, n, parts)
        else:
            self._numpy_sums(need, source, D, n, parts)
        s = self._unpack(parts)
        if live.size == self.m:
            self.acc += s
        else:
            self.acc[live] += s
        return s[:, 0]

    def _kernel_sums(self, need: np.ndarray, source: _Words, D: int, n: int, parts: list[np.ndarray]) -> None:
        """The compiled kernel: the level's D * n words straight from the bit generator's next_raw (random_raw's
        words, leaving its state as random_raw would); word j of resample i, if j < need[i], adds into run j // L."""
        if source.n != D * n or source.spare.size:
            raise RuntimeError("the kernel reads a whole level's words")
        with source.bitgen.lock:
            _kernel.level_sums(source.bitgen.capsule, D, np.ascontiguousarray(need, np.int64), self.run, self.k,
                               self.cut, tuple(self.tables), tuple(parts))
        source.n = 0

    def _numpy_sums(self, need: np.ndarray, source: _Words, D: int, n: int, parts: list[np.ndarray]) -> None:
        """The reference path: reject, cast, `take` and sum, a tile of words at a time."""
        L, rows = self.run, self.rows
        slab = rows * max(1, SLAB_CELLS // (rows * n))   # rows of words fetched at a time
        for s0 in range(0, D, slab):
            words = source.next((min(D, s0 + slab) - s0) * n).reshape(-1, n)
            if need.min() < s0 + words.shape[0]:   # words past their resample's need are not read: reject them
                words[np.arange(s0, s0 + words.shape[0])[:, None] >= need] = np.iinfo(words.dtype).max
            for j0 in range(s0, min(D, s0 + slab), rows):
                j1 = min(D, j0 + rows)
                c, full = (j1 - j0) * n, (j1 - j0) // L
                idx = self._index(words[j0 - s0:j1 - s0].ravel(), self._idx[:c])
                for table, p in zip(self.tables, parts):
                    g = table.take(idx, out=self._g[:c], mode="clip").reshape(j1 - j0, n)   # clip: in range; unbuffered
                    if L > j1 - j0:     # a tile within a run
                        p[j0 // L] += g.sum(0)
                        continue
                    g[:full * L].reshape(full, L, n).sum(1, out=p[j0 // L:j0 // L + full])
                    if full * L < j1 - j0:   # the last, short run (last tile only)
                        g[full * L:].sum(0, out=p[-1])


def _exact_integers(vals: np.ndarray) -> bool:
    """Integer columns whose resample sums (and the sums of their offsets from the minimum) are exact in float64."""
    if not np.isfinite(vals).all() or not np.array_equal(vals, np.floor(vals)):
        return False
    return vals.shape[0] * float(np.abs(vals).max(initial=0.0)) * 2 < EXACT


def sum_chunks(values: np.ndarray, strata: np.ndarray, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """The resamples' column sums, a chunk at a time: (m, K) float64, equal to count_chunks(...) @ values
    (same arguments, same resamples). A stratum with integer columns is summed through packed tables."""
    values = np.asarray(values, float)
    strata = np.asarray(strata)
    bitgen = np.random.SFC64(seed)
    m_full = chunk_size(strata.size)
    plans = []   # per stratum: its clusters, its column minima, and a packed consumer (None: use the counts)
    for g in _groups(strata):
        v = values[g]
        lo = v.min(0)
        packed = _Packed((v - lo).astype(np.int64), max(1, min(m_full, n_resamples))) if _exact_integers(v) else None
        plans.append((g, lo, packed))
    for start in range(0, n_resamples, m_full):
        m = min(m_full, n_resamples - start)
        out = np.zeros((m, values.shape[1]))
        for g, lo, packed in plans:
            if packed is not None:
                _draw(bitgen, m, g.size, packed.reset(m))
                out += g.size * lo + packed.acc[:, 1:]
            else:
                c = _Counts(m, g.size)
                _draw(bitgen, m, g.size, c)
                out += c.counts.reshape(m, g.size).astype(float) @ values[g]
        yield out


if __name__ == "__main__":
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
    print(f"compiled kernel: {'used' if _kernel is not None else 'not built (numpy path)'}")
    print(f"{B} resamples of {P} clusters in 4 strata: packed sums {t1 - t0:.3f} s, counts @ values {t2 - t1:.3f} s, "
          f"equal: {np.array_equal(sums, ref)}")
