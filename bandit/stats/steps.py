"""The cost of one target pass as a function of how many tokens it verifies: knots and their basis.

A verify forward of Q tokens does not cost a fixed amount plus a constant per token: on a CPU the matrix kernels
change regime with the row count, so that a pass of 2 or 3 tokens costs about what a 1-token one does and one of
4 or 5 markedly more (SmolLM2-135M on aten's linears: bench/pass_cost_smollm2_aten.json, by bench/pass_cost.py). A
line in Q overcharges single-token passes and undercharges longer ones, which is what made the linear timing
model miss plain decoding on that campaign (NEGATIVE_RESULTS.md, 16). So the timing model (bandit/live/timingmodel.py) prices a pass of Q
tokens by a piecewise-linear function of Q, non-decreasing, with a knot at every Q a single drafter's block can
verify (1 .. k + 1) and then at doubling sizes up to the largest union verification (1 + D k), extrapolated
linearly from its last segment beyond it. A pass is a point of that function, so a decode's pass cost is linear
in the knots' values: the basis weights summed over its passes (`basis`), which NNLS fits.

    python bandit/stats/steps.py [PATHS]      # the knots for the default campaign's drafters, a few passes' basis
"""

from __future__ import annotations

import numpy as np


def knots_for(k: int, n_drafters: int) -> tuple[int, ...]:
    """Knots (Q values) for drafts of at most k tokens from n_drafters drafters: 1 .. k + 1, then 2q - 1 from
    q = k + 1 while below 1 + n_drafters * k (the union of every draft), that bound included."""
    k = max(int(k), 1)
    top = 1 + max(int(n_drafters), 1) * k
    out = list(range(1, k + 2))
    q = k + 1
    while q < top:
        q = min(2 * q - 1, top)
        out.append(q)
    return tuple(out)


def table_knots(t) -> tuple[int, ...]:
    """The knots for a BlockTable t: its longest draft and its number of drafters."""
    return knots_for(int(t.draft_len.max(initial=0)), len(t.drafters))


def basis(q, knots) -> np.ndarray:
    """(n, K) hat-function weights of passes verifying q (n,) tokens: f(Q) = basis(Q) @ f(knots) is the linear
    interpolation of f between knots, and beyond the last knot the extension of its last segment (with a single
    knot, f is that constant)."""
    x = np.asarray(q, float).reshape(-1)
    kn = np.asarray(knots, float)
    K = kn.size
    W = np.zeros((x.size, K))
    if K == 1:
        W[:, 0] = 1.0
        return W
    j = np.clip(np.searchsorted(kn, x, side="right") - 1, 0, K - 2)  # the segment [kn[j], kn[j+1]] of each q
    s = (x - kn[j]) / (kn[j + 1] - kn[j])  # beyond the last knot s > 1: the last segment extended
    s = np.where(x < kn[0], 0.0, s)  # below the first knot: its value (no pass verifies fewer than 1 token)
    rows = np.arange(x.size)
    W[rows, j] = 1.0 - s
    W[rows, j + 1] += s
    return W


def summed(q, groups, n_groups: int, knots) -> np.ndarray:
    """(n_groups, K) basis weights of passes q (n,) summed per group (n,) (a decode's or a prompt's passes)."""
    out = np.zeros((n_groups, len(knots)))
    np.add.at(out, np.asarray(groups, np.int64), basis(q, knots))
    return out


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        k, d, kn = int(t.draft_len.max(initial=0)), len(t.drafters), table_knots(t)
        print(f"{said}: drafts of up to {k} tokens from {d} drafters; the step cost's knots {kn}")
        for q in sorted({1, k + 1, (k + 1 + kn[-1]) // 2, kn[-1]}):
            w = basis([q], kn)[0]
            print(f"  a pass of {q} tokens: " + ", ".join(f"{x:.2f} of knot {k_}" for x, k_ in zip(w, kn) if x))

    demo(body, "The knots of the step cost for the run's drafters and draft lengths, and the basis of a few passes.")
