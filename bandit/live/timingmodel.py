"""The timing model fitted on a run's live phase, as the price of a block-set outcome in wall milliseconds.

One model for every speedup verdict where a live phase exists (docs/DESIGN.md, "Wall clock" and
"One cost model for verdicts"): bandit/wallclock.py's step-time model, its coefficients fitted by
`fit` on the live decodes (bandit/live/primary.py `attach` hangs it on the table):

    wall_ms(prompt) = prefill_p + sum over its blocks [step(verified_b) + sum_d c_d * calls_b,d]

prefill_p = b_prefill + b_prompt * prompt_len (the live prompts' own lengths; a prompt outside the live sample
gets its workload's live mean). step(Q) is the cost of one target pass verifying Q tokens: piecewise linear
and non-decreasing in Q, its values at the knots of bandit/stats/steps.py fitted (a CPU's matrix kernels make
a pass of 1-3 tokens far cheaper per token than one of 4-5, which a line in Q cannot follow). A block that
verifies drafts A together verifies 1 + sum_{d in A} len_d tokens (the union of the drafts in one tree) and
calls every drafter in A. The rho/alpha cost model (bandit/stats/costmodel.py) prices the same outcomes in
verification passes; both answer `row_costs`, so the selector's operating point and the break-even verdicts
take either.

The live log counts each decode's passes, not the size of each: the fit takes every pass's size from the
decode's walk on the dense log (bandit/live/livelog.py `decodes`), on the decodes that repeat that walk
(the same output, passes, verified tokens and calls), which a deterministic configuration does.

    python bandit/live/timingmodel.py [RUN]     # the default campaign's timing model, as fitted on its live phase
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/live/timingmodel.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import sys
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from bandit.live.livelog import decodes, design
from bandit.logs.table import LogError
from bandit.stats import steps

LABEL = "MODEL, timing fitted on MEASURED live decodes"
FIXED_TERMS = ("prefill", "prompt_token")  # then one term per knot of the step cost, then one per drafter call


def term_names(knots: Sequence[int], drafters: Sequence[str]) -> list[str]:
    """The coefficients' names in design-row order: prefill, prompt_token, pass@Q per knot, call:d per drafter."""
    return [*FIXED_TERMS, *(f"pass@{q}" for q in knots), *(f"call:{d}" for d in drafters)]


@dataclass(frozen=True, eq=False)
class TimingModel:
    """Milliseconds per prompt (prefill), per target pass of Q verified tokens and per call of each drafter."""

    drafters: tuple[str, ...]  # the table's drafters, in its order
    prefill: float  # b_prefill, ms per prompt
    prompt_token: float  # b_prompt, ms per prompt token of the prefill
    knots: tuple[int, ...]  # (K,) pass sizes Q where the step cost is fitted (bandit/stats/steps.py)
    step_ms: np.ndarray  # (K,) ms of one target pass verifying knots[j] tokens (the loop's own overhead included)
    call_ms: np.ndarray  # (D,) measured mean ms per call of each drafter, plus its fitted extra
    source: str = ""  # what it was fitted on, in words
    n_decodes: int = 0
    source_kind = "timing"  # (class constant) which cost model: "timing" here, Costs.source otherwise

    def select(self, names: Sequence[str]) -> "TimingModel":
        j = [self.drafters.index(n) for n in names]
        return replace(self, drafters=tuple(names), call_ms=self.call_ms[j])

    def prompt_prefill(self, prompt_len) -> np.ndarray:
        return self.prefill + self.prompt_token * np.asarray(prompt_len, float)

    def step(self, verified) -> np.ndarray:
        """(n,) ms of target passes verifying `verified` (n,) tokens each."""
        return steps.basis(verified, self.knots) @ np.asarray(self.step_ms, float)

    def block_ms(self, verified, calls) -> np.ndarray:
        """ms of blocks verifying `verified` (n,) tokens with `calls` (n, D) drafter calls, prefill excluded."""
        return self.step(verified) + np.asarray(calls, float) @ self.call_ms

    def row_costs(
        self, p: int, alts: Sequence[int], n: int, dlen: np.ndarray | None = None, prefill: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(base (n,), extra (n,)) ms of n blocks: the primary p alone (its share of the prompt's prefill `prefill`,
        one pass of 1 + len_p verified tokens, p's call), and what verifying alternatives `alts` with it adds (the
        larger pass of their draft tokens in the same forward, their calls). `dlen` (n, D): each drafter's draft
        length at the block."""
        if dlen is None:
            raise ValueError("the timing model prices verified tokens: it needs every block's draft lengths")
        L = np.asarray(dlen, float)
        pre = np.zeros(n) if prefill is None else np.asarray(prefill, float)
        alone = self.step(1.0 + L[:, p])
        base = pre + alone + self.call_ms[p]
        a = list(alts)
        extra = self.step(1.0 + L[:, p] + L[:, a].sum(1)) - alone + float(self.call_ms[a].sum()) if a else np.zeros(n)
        return base, extra

    def steps_ms(self, chosen: np.ndarray, n_draft: np.ndarray, dlen: np.ndarray, called: np.ndarray) -> np.ndarray:
        """(B,) ms of a policy's blocks (prefill apart): `chosen` drafter's draft of n_draft tokens verified with the
        trunk token; `called` (D,) bool drafters also called at every block (lookups drafted before choosing).
        A union verification (every drafter's draft in one forward) is n_draft = dlen.sum(1), called all."""
        calls = np.zeros((chosen.size, self.call_ms.size))
        calls[np.arange(chosen.size), chosen] = 1.0
        calls[:, np.asarray(called, bool)] = 1.0
        return self.block_ms(1.0 + np.asarray(n_draft, float), calls)

    def describe(self) -> str:
        calls = ", ".join(f"{d} {c:.4g}" for d, c in zip(self.drafters, self.call_ms))
        passes = ", ".join(f"{q}: {v:.4g}" for q, v in zip(self.knots, self.step_ms))
        return (
            f"costs from the timing model fitted on the live phase [{LABEL}] ({self.source}): ms per prompt "
            f"{self.prefill:.4g} + {self.prompt_token:.4g} per prompt token, per target pass by tokens verified "
            f"(linear between) {passes}, per drafter call: {calls}; a union verification verifies every draft's "
            "tokens in one forward and pays every drafter's call"
        )


def prefill_per_prompt(
    model: TimingModel, prompt_len: np.ndarray, workload_of_prompt: np.ndarray, n_workloads: int
) -> np.ndarray:
    """(P,) prefill ms of every prompt: its own length where known (prompt_len > 0), else the mean prefill of the
    known prompts of its workload (of all known prompts when its workload has none)."""
    known = np.asarray(prompt_len) > 0
    own = model.prompt_prefill(prompt_len)
    out = np.where(known, own, np.nan)
    pooled = float(own[known].mean()) if known.any() else model.prefill
    for w in range(n_workloads):
        k = known & (workload_of_prompt == w)
        out[(workload_of_prompt == w) & ~known] = float(own[k].mean()) if k.any() else pooled
    return out


def rows_share(prompt: np.ndarray, prefill_ms: np.ndarray | None) -> np.ndarray:
    """(n,) each row's share of its prompt's prefill (prefill / the prompt's rows among these): summed over the
    rows of a block set, every prompt's prefill once."""
    if prefill_ms is None:
        return np.zeros(prompt.size)
    n_of = np.bincount(prompt, minlength=prefill_ms.size)
    return prefill_ms[prompt] / np.maximum(n_of[prompt], 1)


def pricer(t):
    """The cost model of a table's verdicts: its live phase's timing model when attached, else the rho/alpha
    model of its manifest's timing (bandit/stats/costmodel.py), else that model's documented what-if."""
    from bandit.stats.costmodel import costs_for

    if t.timing_model is not None:
        return t.timing_model
    return costs_for(t.drafters, t.manifests[0] if t.manifests else None)


def fit(X: np.ndarray, y: np.ndarray, M: np.ndarray, n_knots: int) -> np.ndarray:
    """The model's coefficients from decodes X (n, 2 + K + D) (design rows: 1, prompt length, the step basis of
    its passes summed (bandit/stats/steps.py), its calls of each drafter) with wall times y (n,) and measured
    drafter times M (n, D). The step cost at the knots is fitted non-decreasing (as increments >= 0). Each
    drafter's call costs its measured mean per call (timed around every call) plus an extra >= 0 fitted with the
    other terms by non-negative least squares on what the measured calls leave over: a call costs more than its
    own timer shows (the bookkeeping around it, and the caches it leaves cold for the verify forward that
    follows: after a draft-model call the same verify is measurably slower). The extras are identified by
    decodes that call drafters in other proportions to their passes: plain (no call), best-of-N (every drafter
    each pass) and the policies (a mix); a live phase of fixed drafters alone leaves the split between the
    step cost and the extras to NNLS, which changes no fixed prediction."""
    from scipy.optimize import nnls

    if not len(X):
        raise LogError(
            "live.jsonl",
            0,
            "passes",
            "no live decode repeats its walk on the dense log (its output, passes, verified tokens and calls): "
            "the timing model has no pass sizes to fit on",
        )
    T = len(FIXED_TERMS) + n_knots
    calls = X[:, T:].sum(0)
    per_call = np.divide(M.sum(0), calls, out=np.zeros_like(calls), where=calls > 0)
    rest = y - X[:, T:] @ per_call
    up = np.tril(np.ones((n_knots, n_knots)))  # step at knot j = the sum of the increments 0..j
    A = X.copy()
    A[:, len(FIXED_TERMS) : T] = X[:, len(FIXED_TERMS) : T] @ up
    b = nnls(A, rest)[0]
    b[len(FIXED_TERMS) : T] = up @ b[len(FIXED_TERMS) : T]
    return np.r_[b[:T], per_call + b[T:]]


def from_coef(coef: np.ndarray, knots: Sequence[int], drafters: Sequence[str], source: str, n: int) -> TimingModel:
    """The TimingModel of `fit`'s coefficients."""
    F, K = len(FIXED_TERMS), len(knots)
    return TimingModel(
        tuple(drafters),
        float(coef[0]),
        float(coef[1]),
        tuple(int(q) for q in knots),
        np.asarray(coef[F : F + K], float),
        call_ms=np.asarray(coef[F + K :], float),
        source=source,
        n_decodes=n,
    )


def fit_live(t, live: list[dict], source: str = "") -> TimingModel:
    """The model fitted by `fit` on the decodes of live phase `live` (records of `livelog.read_live`, every
    prompt in dense table t) that repeat their walk on t (`livelog.decodes`: design rows from the walk)."""
    dec = decodes(t, live)
    use = [d for d in dec if d.agrees]
    X = np.array([design(d) for d in use])
    y = np.array([d.wall_ms for d in use])
    M = np.array([d.draft_ms for d in use])
    knots = steps.table_knots(t)
    coef = fit(X, y, M, len(knots))
    return from_coef(coef, knots, t.drafters, source or f"{len(use)} of {len(dec)} live decodes", len(use))


if __name__ == "__main__":
    from bandit.live.livelog import load_live
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        run = files[0].parent
        live = load_live(run, load_logs(files))
        print(said)
        print(fit_live(load_logs(files), live, f"the live phase of {run.name}").describe())

    demo(body, "The timing model fitted on the run's live phase.")
