"""Prompt lookup: the n-gram drafter (`ngram`), which copies forward what followed the prefix's suffix
n-gram earlier in the prompt + output."""

from __future__ import annotations

from collections import Counter

from ..models.lm import HarnessError
from .base import Draft, Drafter, Prefix, count_entropy


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output: the most recent earlier occurrence of the longest
    suffix n-gram (n_max down to n_min) is copied forward (overlapping copies continue a
    repeated span, LZ77-style). conf[j]: the fraction of the n-gram's occurrences whose
    continuation agrees with the draft up to and including j (carried forward past the
    known continuations); entropy[j]: of those occurrences' next tokens.

    `rule=vllm` drafts as vLLM's ngram proposer does (bench/vllm_crosscheck.py measured both):
    the *earliest* occurrence, and only the tokens that exist after it (no overlapping copy).
    The default `rule=latest` is not recorded in the settings, so older runs resume unchanged."""

    kind = "ngram"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.n_min = self._setting("n_min", 1, int)  # shortest suffix pattern tried
        self.n_max = self._setting("n_max", 4, int)  # longest suffix pattern tried (tried first)
        self.max_occ = self._setting("max_occ", 64, int)  # most recent occurrences used for conf
        self.rule = str(self.settings.get("rule", "latest"))  # latest (ours) | vllm (vLLM's proposer)
        self._check_settings({"n_min", "n_max", "max_occ", "rule"})
        if self.rule not in ("latest", "vllm"):
            raise HarnessError(f"--drafter {name}=ngram: rule={self.rule!r}; expected latest or vllm")
        if not 1 <= self.n_min <= self.n_max:
            raise HarnessError(f"--drafter {name}=ngram: need 1 <= n_min <= n_max, got {self.n_min}, {self.n_max}")

    def draft(self, pre: Prefix, k: int) -> Draft:
        ids = pre.ids if isinstance(pre.ids, list) else list(pre.ids)
        n, after = self.match(ids, self.n_min, self.n_max)
        if not n:
            return Draft.empty()
        if self.rule == "vllm":
            return self._copy(ids, after[: self.max_occ], k, first=True)
        return self._copy(ids, after[-self.max_occ :], k)

    @staticmethod
    def match(ids: list[int], n_min: int, n_max: int) -> tuple[int, list[int]]:
        """(n, after): the longest n in n_min..n_max whose suffix n-gram ids[P-n:] occurs earlier, as a window
        ids[s:s+n] with s + n <= P - 1, and the position after each such occurrence (s + n, ascending); (0, [])
        when none does. The occurrences of the last token are found in one pass and only they are extended
        backwards. Plain lists: between two target forwards a handful of numpy calls cost more than this."""
        P = len(ids)
        hi = min(n_max, P - 1)
        if hi < n_min:
            return 0, []
        last = ids[P - 1]
        best, after = 0, []
        for e in [i for i, t in enumerate(ids[: P - 1]) if t == last]:  # windows ending at e <= P - 2
            n = 1
            while n < hi and e >= n and ids[e - n] == ids[P - 1 - n]:
                n += 1
            if n > best:
                best, after = n, [e + 1]
            elif n == best:
                after.append(e + 1)
        return (best, after) if best >= n_min else (0, [])

    @staticmethod
    def _copy(ids: list[int], starts: list[int], k: int, first: bool = False) -> Draft:
        P = len(ids)
        if first:  # vLLM: the earliest occurrence, and only the tokens after it that exist
            src = starts[0]
            toks = ids[src : min(P, src + k)]
            k = len(toks)
        else:
            src = starts[-1]
            seq = list(ids)
            for j in range(k):  # overlapping copy: may read tokens it has just drafted
                seq.append(seq[src + j])
            toks = seq[P:]
        same = [ids[s : min(P, s + k)] for s in starts]  # at j: the continuations c with c[:j] == toks[:j]
        conf, ent, c_prev = [], [], 1.0
        for j in range(k):
            if j:
                same = [c for c in same if len(c) >= j and c[j - 1] == toks[j - 1]]
            alive = [c for c in same if len(c) > j]
            if alive:
                cnt = Counter(c[j] for c in alive)
                c_prev = cnt[toks[j]] / len(alive)
                conf.append(c_prev)
                ent.append(count_entropy(cnt.values()))
            else:
                conf.append(c_prev)
                ent.append(0.0)
        return Draft([int(t) for t in toks], conf, ent, None)
