"""Spec-select: the production rule of docs/seeds/spec-select-pr.txt, adapted to block logs.

Learns each drafter's acceptance per draft position, and picks the drafter and cut length of most
expected tokens per modelled step time (bandit/policies/bandits.py's `StepTime`, from the run's timing).

    python bandit/policies/specselect.py      # spec-select on a small simulated campaign with ranking flips [SIM]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/policies/specselect.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bandit.policies.bandits import BasePolicy, StepTime, lookup_mask


@dataclass
class SpecTables:
    """Decayed (hits, trials) per drafter and draft position, D lists of k floats.

    Decay is lazy: each drafter's row holds counts divided by a running scale `c` (true count =
    c * stored), so decaying a row is one multiply and an observation touches only the positions
    it reached; the acceptance estimate hits / trials is scale-free.
    """

    h: list[list[float]]
    t: list[list[float]]
    c: list[float]

    @staticmethod
    def empty(D: int, k: int, h0: float, t0: float) -> "SpecTables":
        return SpecTables([[h0] * k for _ in range(D)], [[t0] * k for _ in range(D)], [1.0] * D)

    def add(self, d: int, hits: int, trials: int, decay: float) -> None:
        """Decay row d, then one hit at positions < hits and one trial at positions < trials."""
        c = self.c[d] = self.c[d] * decay
        if c < 1e-200:  # renormalise before the scale underflows
            self.h[d] = [x * c for x in self.h[d]]
            self.t[d] = [x * c for x in self.t[d]]
            c = self.c[d] = 1.0
        inc, H, T = 1.0 / c, self.h[d], self.t[d]
        for i in range(hits):
            H[i] += inc
        for i in range(trials):
            T[i] += inc

    def counts(self) -> np.ndarray:
        """(D, 2, k) true decayed (hits, trials)."""
        c = np.array(self.c)[:, None]
        return np.stack([np.array(self.h) * c, np.array(self.t) * c], axis=1)


class SpecSelect(BasePolicy):
    """The spec-select rule (the production PR, docs/seeds/spec-select-pr.txt) adapted to block logs.

    Learns each drafter's acceptance per draft position (decayed hits and trials per position),
    per prompt as the PR does per slot (a new prompt starts from the pooled estimate, worth
    `prior` pseudo-trials), from the drafts used, from lookup drafts not used and from the
    cut-off part of a used lookup draft: lookup drafts are compared with the text that follows
    at no cost, so their full acceptance is always seen; an unused model drafter is never
    called, so it is never seen (the class asks for full information and then ignores unused
    model drafters). Options: each lookup draft cut to its best length L (its length is known
    before choosing: `ctx.draft_len` is read for lookup drafters only), each model drafter's
    whole draft (assumed k long), or no draft (L = 0). It maximises log(expected tokens / step
    time) under `StepTime` (the manifest's timing, or stated defaults). A model drafter that
    looks worse than a lookup draft is never called again, so its estimate would never recover
    from an unlucky start: with probability `explore` a random model drafter runs (our
    extension; the PR relies on lookup drafts rarely winning outside copy-heavy text). `choose_batch` is the
    multi-sequence rule: maximise the sum over the step's sequences of log(tokens / step time),
    no sequence more than `max_slowdown` slower than with every sequence on the model drafter.

    step_time "model": the verify time per verified tokens is the Timing's (fixed); "learned": as the PR,
    learned from the steps observed (`observe_step`, called by the live engine after every verify
    forward and by the live replay with the Timing's time): a running mean per verified-token count,
    starting from the Timing's value worth `time_prior` steps (steps of one pass with one draft only,
    as the PR learns from clean steps). censored: a lookup draft not used is told only what the block
    revealed, its accepted capped at the used draft's accepted + 1 (the live feedback); one that reaches
    the cap matched everything revealed, so it counts no rejection (the PR compares it with the text
    "as it comes"). The live policy (bandit/policies/livepolicies.py) uses both; the replay reports the defaults.
    """

    name = "spec_select"
    full_information = True

    def __init__(
        self,
        decay: float = 0.98,
        prior: float = 4.0,
        explore: float = 0.02,
        lookup: Sequence[str] | None = None,
        max_slowdown: float = 0.10,
        pass_per_length: bool = True,
        step_time: str = "model",
        time_prior: float = 1.0,
        censored: bool = False,
        random_state: int | None = 0,
    ):
        super().__init__(random_state)
        if step_time not in ("model", "learned"):
            raise ValueError(f"step_time must be 'model' or 'learned', got {step_time!r}")
        self.decay, self.prior, self.explore, self.lookup = decay, prior, explore, lookup
        self.max_slowdown, self.pass_per_length = max_slowdown, pass_per_length
        self.step_time, self.time_prior, self.censored = step_time, time_prior, censored

    def reset(self, drafters, workloads, timing=None) -> None:
        super().reset(drafters, workloads, timing)
        if self.lookup is not None:
            self.is_lookup_ = np.array([d in set(self.lookup) for d in self.drafters_], bool)
        else:
            self.is_lookup_ = lookup_mask(self.drafters_, timing)
        self.time_ = StepTime.from_timing(self.drafters_, self.is_lookup_, timing)
        self.state_: dict[int, SpecTables] = {}  # prompt -> decayed (hits, trials) per drafter and position
        self.B_ = 0  # draft positions tracked: k, fixed at the first block
        self.cut_ = (-1, -1)

    def _init_tables(self, ctx) -> None:
        k = self.B_ = int(self._scale(ctx))
        D = self.n_arms_
        self.G_ = SpecTables.empty(D, k, 0.0, 0.0)  # pooled over prompts
        calls = float(self.time_.drafter_ms[self.is_lookup_].sum()) + np.where(
            self.is_lookup_, 0.0, self.time_.drafter_ms
        )
        # log step time of drafter d verifying L = 0..k draft tokens (+1 bonus); lookup drafts are always computed
        self.log_step_ = np.log(self.time_.verify(np.arange(k + 1) + 1.0)[None, :] + calls[:, None]).tolist()
        self.calls_ = calls.tolist()
        # learned step times: (sum of ms, steps) per verified-token count 1..k+1, the Timing's worth time_prior steps
        v0 = self.time_.verify(np.arange(k + 2, dtype=float)).tolist()
        self.vsum_, self.vn_ = [self.time_prior * x for x in v0], [self.time_prior] * (k + 2)
        self.lookup_list_ = self.is_lookup_.tolist()
        self.models_ = np.flatnonzero(~self.is_lookup_)

    def _state(self, prompt: int) -> "SpecTables":
        """This prompt's tables; a new prompt starts from the pooled estimate with `prior`
        pseudo-trials per position (a slot carries what it learned into the next request)."""
        s = self.state_.get(prompt)
        if s is None:
            G, pr = self.G_, self.prior
            hits = [[pr * (c * h + 1.0) / (c * t + 2.0) for h, t in zip(H, T)] for H, T, c in zip(G.h, G.t, G.c)]
            s = self.state_[prompt] = SpecTables(hits, [[pr] * self.B_ for _ in hits], [1.0] * len(hits))
        return s

    def expected_tokens(self, prompt: int) -> np.ndarray:
        """(D, k + 1) expected tokens of each drafter's draft cut to L = 0..k, for this prompt.

        A draft cut to L accepts min(A, L), and E[min(A, L)] = sum_{j <= L} prod_{i < j} p_i with
        p_i the acceptance at draft position i given the earlier ones were accepted.
        """
        s = self._state(prompt)
        p = np.array(s.h) / np.array(s.t)
        return np.c_[np.ones(len(p)), 1.0 + np.cumsum(np.cumprod(p, axis=1), axis=1)]

    def choose(self, ctx):
        if not self.B_:
            self._init_tables(ctx)
        if self.models_.size and self.rng_.random() < self.explore:
            d = int(self.models_[self.rng_.integers(self.models_.size)])
            self.cut_ = (d, -1)
            return d
        s, k, log = self._state(ctx.prompt), self.B_, math.log
        best, arg = -math.inf, (0, 0)
        # plain floats: D x k ~ 32 values, where numpy's per-call overhead would dominate
        for d, (H, T, ls, look, n) in enumerate(
            zip(s.h, s.t, self.log_step_, self.lookup_list_, ctx.draft_len.tolist())
        ):
            prod, tok = 1.0, 1.0
            if look:  # a lookup draft may be cut to any L <= its length, L = 0 being no draft
                n = min(n, k)
                if -ls[0] > best:
                    best, arg = -ls[0], (d, 0)
                for i in range(n):
                    prod *= H[i] / T[i]
                    tok += prod
                    v = log(tok) - ls[i + 1]
                    if v > best:
                        best, arg = v, (d, i + 1)
            else:  # a model draft is verified whole (its length, k, is not known before drafting)
                for i in range(k):
                    prod *= H[i] / T[i]
                    tok += prod
                v = log(tok) - ls[k]
                if v > best:
                    best, arg = v, (d, k)
        d, L = arg
        if not self.lookup_list_[d]:
            self.cut_ = (d, -1)
            return d
        self.cut_ = (d, L if L < ctx.draft_len[d] else -1)
        return (d, L)

    def update(self, ctx, chosen, accepted, observed) -> None:
        if not self.B_:
            self._init_tables(ctx)
        s, G, k = self._state(ctx.prompt), self.G_, self.B_
        cd, cL = self.cut_
        seen = float(accepted[chosen]) + 1.0  # the block's new tokens: the used draft's accepted + the bonus
        for d, (a, o, n, look) in enumerate(
            zip(accepted.tolist(), observed.tolist(), ctx.draft_len.tolist(), self.lookup_list_)
        ):
            if not o or not (look or d == chosen) or n == 0:
                continue  # unseen, or an unused model drafter (never called), or no draft
            a, n = int(a), min(n, k)
            if d == chosen and d == cd and 0 <= cL <= a:
                n = cL  # the replay reveals a cut draft only up to the cut: censored, no rejection at L
            elif self.censored and d != chosen and a >= seen:
                n = min(a, n)  # matched every token the block revealed: censored there, no rejection
            # positions 0..a-1 accepted, position a (when drafted) rejected, later ones never reached
            s.add(d, min(a, n), min(a, n - 1) + 1, self.decay)
            G.add(d, min(a, n), min(a, n - 1) + 1, self.decay)

    def observe_step(self, n_verified: int, n_drafts: int, ms: float) -> None:
        """A verify forward of `n_verified` tokens (trunk + drafts) holding `n_drafts` drafts took `ms`: with
        step_time "learned", the running mean of that token count moves and with it every drafter's step time."""
        n = int(n_verified)
        if self.step_time != "learned" or not self.B_ or n_drafts != 1 or not 1 <= n <= self.B_ + 1:
            return
        self.vsum_[n] += float(ms)
        self.vn_[n] += 1.0
        v = self.vsum_[n] / self.vn_[n]
        for row, c in zip(self.log_step_, self.calls_):
            row[n - 1] = math.log(v + c)

    # ---------------------------------------------------------------- several sequences per step

    def batch_step_ms(self, choices: Sequence[tuple[int, int]]) -> float:
        """Step time of one batch: (drafter, verified draft tokens) per sequence.

        One verify pass per distinct verified length when `pass_per_length` (ubatches of a
        hybrid/recurrent target, the PR's case), else one pass at the longest; each model
        drafter used by any sequence is called once (batched), lookup drafters always.
        """
        vl, look_ms, call, look = self._batch_tables()
        lens = sorted({L + 1 for _, L in choices})
        # the same floats added in the same order as from `time_` directly: tables only save numpy's per-call cost
        if self.pass_per_length:
            verify = sum(vl[n] if n < len(vl) else float(self.time_.verify(n)) for n in lens)
        else:
            verify = vl[lens[-1]] if lens[-1] < len(vl) else float(self.time_.verify(lens[-1]))
        models = {d for d, L in choices if not look[d] and L > 0}
        return verify + look_ms + sum(call[d] for d in models)

    def _batch_tables(self) -> tuple[list[float], float, list[float], list[bool]]:
        """(verify ms of n = 0..k+1 tokens, the lookups' calls, each drafter's call, lookup flags) as floats,
        computed once per k: `choose_batch` prices thousands of combinations per step."""
        key = (self.B_, id(self.time_))
        if getattr(self, "batch_key_", None) != key:
            t = self.time_
            self.batch_key_ = key
            self.batch_tables_ = (
                [float(t.verify(n)) for n in range(self.B_ + 2)],
                float(t.drafter_ms[self.is_lookup_].sum()),
                [float(t.drafter_ms[d]) for d in range(self.n_arms_)],
                self.is_lookup_.tolist(),
            )
        return self.batch_tables_

    def choose_batch(self, ctxs: Sequence) -> list:
        """Joint choice for S sequences in one step, by brute force over each one's candidates.

        Candidates per sequence: every model drafter's whole draft, every lookup draft at its
        single-sequence best cut and at L = 0. Reference: everyone on the model drafter with the
        highest expected tokens; no sequence's tokens / step time may fall below (1 - max_slowdown)
        times its reference rate.
        """
        if not self.B_:
            self._init_tables(ctxs[0])
        per_seq, ref = [], []
        for ctx in ctxs:
            et = self.expected_tokens(ctx.prompt)
            n = np.where(self.is_lookup_, np.minimum(ctx.draft_len, self.B_), self.B_)
            cands = {}
            for d in range(self.n_arms_):
                if self.is_lookup_[d]:
                    v = np.log(et[d, : n[d] + 1]) - np.asarray(self.log_step_[d][: n[d] + 1])
                    L = int(np.argmax(v))
                    cands[(d, L)], cands[(d, 0)] = float(et[d, L]), float(et[d, 0])
                else:
                    cands[(d, int(n[d]))] = float(et[d, n[d]])
            per_seq.append(list(cands.items()))
            models = [(c, e) for c, e in cands.items() if not self.is_lookup_[c[0]]]
            ref.append(max(models, key=lambda x: x[1]) if models else per_seq[-1][0])
        base_ms = self.batch_step_ms([c for c, _ in ref])
        floor = [(1.0 - self.max_slowdown) * e / base_ms - 1e-12 for _, e in ref]
        best, best_v = [c for c, _ in ref], -math.inf
        for combo in self._shortlist(per_seq, floor):
            ms = self.batch_step_ms([c for c, _ in combo])
            rates = [e / ms for _, e in combo]
            if all(r >= f for r, f in zip(rates, floor)):
                v = sum(math.log(r) for r in rates)
                if v > best_v:
                    best, best_v = [c for c, _ in combo], v
        out = []
        for d, L in best:  # the same exploration as `choose`, per sequence
            if self.models_.size and self.rng_.random() < self.explore:
                d = int(self.models_[self.rng_.integers(self.models_.size)])
            out.append((d, L) if self.is_lookup_[d] else d)
        return out

    def _shortlist(self, per_seq: list, floor: list[float]):
        """The combinations of `choose_batch`'s brute force that can be its answer, in product order.

        Every combination's step time and feasibility are computed at once with numpy, with the same float
        operations in the same order as `batch_step_ms` (present verify lengths added in ascending order,
        then the lookups, then the model drafters used in ascending index, as a set of small ints iterates),
        so they are the same numbers; the sum of log rates (numpy's log may differ from math.log in the last
        bit) only shortlists the feasible combinations within 1e-9 of the best, which the caller then scores
        exactly with math.log. The answer is therefore the plain brute force's, found ~10x faster.
        """
        vl, look_ms, call, look = self._batch_tables()
        if len(per_seq) > 6 or any(L + 1 >= len(vl) for c in per_seq for (_, L), _ in c):
            yield from itertools.product(*per_seq)  # too many to hold at once, or lengths past the tables
            return
        idx = np.indices([len(c) for c in per_seq]).reshape(len(per_seq), -1)  # C order = itertools.product's
        N = idx.shape[1]
        present = np.zeros((len(vl), N), bool)
        used = np.zeros((len(call), N), bool)
        E = np.empty((len(per_seq), N))
        for s, cands in enumerate(per_seq):
            d = np.array([c[0][0] for c in cands])[idx[s]]
            L = np.array([c[0][1] for c in cands])[idx[s]]
            present[L + 1, np.arange(N)] = True
            used[d, np.arange(N)] |= ~np.array(look)[d] & (L > 0)
            E[s] = np.array([e for _, e in cands])[idx[s]]
        if self.pass_per_length:
            verify = np.zeros(N)
            for n in range(len(vl)):
                verify = verify + np.where(present[n], vl[n], 0.0)
        else:
            verify = np.array(vl)[len(vl) - 1 - np.argmax(present[::-1], axis=0)]
        models = np.zeros(N)
        for d in range(len(call)):
            models = models + np.where(used[d], call[d], 0.0)
        R = E / ((verify + look_ms) + models)
        ok = np.all(R >= np.array(floor)[:, None], axis=0)
        if not ok.any():
            return
        V = np.where(ok, np.log(np.where(ok, R, 1.0)).sum(0), -np.inf)
        top = V.max()
        for i in np.flatnonzero(V >= top - 1e-9 * (1.0 + abs(top))).tolist():
            yield tuple(per_seq[s][idx[s, i]] for s in range(len(per_seq)))


if __name__ == "__main__":
    from bandit.policies.walk import policies_demo

    policies_demo([SpecSelect()], "specselect")
