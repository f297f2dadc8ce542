"""The timing model fitted on a run's live phase, as the price of a block-set outcome in wall milliseconds.

One model for every speedup verdict where a live phase exists (docs/DESIGN.md, "Wall clock" and
"One cost model for verdicts"): bandit/wallclock.py's step-time model, its coefficients fitted by
`fit` on every live decode (bandit/live/primary.py `attach` hangs it on the table):

    wall_ms(prompt) = prefill_p + sum over its blocks [b_pass + b_token * verified_b + sum_d c_d * calls_b,d]

prefill_p = b_prefill + b_prompt * prompt_len (the live prompts' own lengths; a prompt outside the live sample
gets its workload's live mean). A block that verifies drafts A together verifies 1 + sum_{d in A} len_d tokens
(the union of the drafts in one tree) and calls every drafter in A. `fit_live` fits it. The rho/alpha cost model
(bandit/stats/costmodel.py) prices the same outcomes in verification passes; both answer `row_costs`, so the
selector's operating point and the break-even verdicts take either.

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

from bandit.live.livelog import TERMS

LABEL = "MODEL, timing fitted on MEASURED live decodes"


@dataclass(frozen=True, eq=False)
class TimingModel:
    """Milliseconds per prompt (prefill), per target pass, per verified token and per call of each drafter."""

    drafters: tuple[str, ...]  # the table's drafters, in its order
    prefill: float  # b_prefill, ms per prompt
    prompt_token: float  # b_prompt, ms per prompt token of the prefill
    pass_ms: float  # b_pass, ms per target pass (verify forward and the loop's own overhead)
    token_ms: float  # b_token, ms per token through the verify forward
    call_ms: np.ndarray  # (D,) measured mean ms per call of each drafter
    source: str = ""  # what it was fitted on, in words
    n_decodes: int = 0
    source_kind = "timing"  # (class constant) which cost model: "timing" here, Costs.source otherwise

    def select(self, names: Sequence[str]) -> "TimingModel":
        j = [self.drafters.index(n) for n in names]
        return replace(self, drafters=tuple(names), call_ms=self.call_ms[j])

    def prompt_prefill(self, prompt_len) -> np.ndarray:
        return self.prefill + self.prompt_token * np.asarray(prompt_len, float)

    def block_ms(self, verified, calls) -> np.ndarray:
        """ms of blocks verifying `verified` (n,) tokens with `calls` (n, D) drafter calls, prefill excluded."""
        return self.pass_ms + self.token_ms * np.asarray(verified, float) + np.asarray(calls, float) @ self.call_ms

    def row_costs(
        self, p: int, alts: Sequence[int], n: int, dlen: np.ndarray | None = None, prefill: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(base (n,), extra (n,)) ms of n blocks: the primary p alone (its share of the prompt's prefill `prefill`,
        one pass, 1 + len_p verified tokens, p's call), and what verifying alternatives `alts` with it adds (their
        draft tokens in the same forward, their calls). `dlen` (n, D): each drafter's draft length at the block."""
        if dlen is None:
            raise ValueError("the timing model prices verified tokens: it needs every block's draft lengths")
        L = np.asarray(dlen, float)
        pre = np.zeros(n) if prefill is None else np.asarray(prefill, float)
        base = pre + self.pass_ms + self.token_ms * (1.0 + L[:, p]) + self.call_ms[p]
        a = list(alts)
        extra = self.token_ms * L[:, a].sum(1) + float(self.call_ms[a].sum()) if a else np.zeros(n)
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
        return (
            f"costs from the timing model fitted on the live phase [{LABEL}] ({self.source}): ms per prompt "
            f"{self.prefill:.4g} + {self.prompt_token:.4g} per prompt token, per target pass {self.pass_ms:.4g}, per "
            f"verified token {self.token_ms:.4g}, per drafter call: {calls}; a union verification verifies every "
            "draft's tokens in one forward and pays every drafter's call"
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


def fit(X: np.ndarray, y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """The model's coefficients from decodes X (n, T + D) with wall times y (n,) and measured drafter times
    M (n, D). Each drafter's call costs its measured mean per call (timed around every call) plus an extra
    >= 0 fitted with the other terms by non-negative least squares on what the measured calls leave over:
    a call costs more than its own timer shows (the bookkeeping around it, and the caches it leaves cold for
    the verify forward that follows: after a draft-model call the same verify is measurably slower). The
    extras are identified by decodes that call drafters in other proportions to their passes: plain (no call),
    best-of-N (every drafter each pass) and the policies (a mix); a live phase of fixed drafters alone leaves
    the split between the per-pass term and the extras to NNLS, which changes no fixed prediction."""
    from scipy.optimize import nnls

    T = len(TERMS)
    calls = X[:, T:].sum(0)
    per_call = np.divide(M.sum(0), calls, out=np.zeros_like(calls), where=calls > 0)
    rest = y - X[:, T:] @ per_call
    b = nnls(X, rest)[0]
    return np.r_[b[:T], per_call + b[T:]]


def fit_live(live: list[dict], drafters: Sequence[str], source: str = "") -> TimingModel:
    """The model fitted by `fit` on every decode of a live phase (records of `livelog.read_live`): design
    rows [1, prompt_len, passes, verified, calls of every drafter any decode called], wall ms, measured drafter ms.
    Every drafter called anywhere gets its own column (a drafter left out of `drafters` would otherwise leave its
    call time in the fitted terms); the model keeps `drafters`' call times."""
    names = sorted({d for r in live for d in (*r["calls"], *r["draft_ms"])} | set(drafters))
    X = np.array(
        [[1.0, r["prompt_len"], r["passes"], r["verified"], *(r["calls"].get(d, 0) for d in names)] for r in live],
        float,
    )
    y = np.array([r["wall_ms"] for r in live], float)
    M = np.array([[float(r["draft_ms"].get(d, 0.0)) for d in names] for r in live])
    coef = fit(X, y, M)
    T = len(TERMS)
    call = coef[T:]
    return TimingModel(
        tuple(drafters),
        *(float(c) for c in coef[:T]),
        call_ms=np.array([call[names.index(d)] for d in drafters], float),
        source=source or f"{len(live)} live decodes",
        n_decodes=len(live),
    )


if __name__ == "__main__":
    from bandit.live.livelog import read_live
    from bandit.logs.reader import demo

    def body(files, said: str) -> None:
        run = files[0].parent
        live = read_live(run)
        drafters = sorted({d for r in live for d in r["calls"]})
        print(fit_live(live, drafters, f"the live phase of {run.name}, {len(live)} decodes").describe())

    demo(body, "The timing model fitted on the run's live phase.")
