"""Several sequences sharing one step: spec-select deciding every sequence's draft jointly, replayed on block logs.

Each step verifies one block of every sequence in flight; a step's modelled time is the slowest
sequence's verification plus every drafter call made (bandit/sim/evaluate.py's step-time model).

    python bandit/sim/multiseq.py [PATHS...]     # 1 and 4 sequences per step on the default campaign [MODEL]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/sim/multiseq.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from bandit.stats import trajectory
from bandit.policies.registry import SpecSelect
from bandit.logs.schema import Context
from bandit.logs.table import BlockTable
from bandit.policies.walk import arms_table, block_rows, context_lengths, run_timing


@dataclass(frozen=True)
class MultiSeqResult:
    """Several sequences decoded in lockstep, one target step each, for one selection rule."""

    policy: str
    label: str
    n_seq: int
    tokens: np.ndarray  # (P,) output tokens produced per prompt (nothing past an output's end on dense logs)
    ms: np.ndarray  # (P,) modelled ms of the steps each prompt took part in (its own wait)
    share: np.ndarray  # (P,) its share of those steps (step time / sequences in the step): sums to total_ms
    steps: int
    total_ms: float

    @property
    def tokens_per_s(self) -> float:
        return float(self.tokens.sum() / self.total_ms * 1000.0)


def multi_sequence_replay(
    t: BlockTable,
    policy: SpecSelect | None,
    n_seq: int = 4,
    mode: str = "trajectory",
    prompt_order: np.ndarray | None = None,
    fixed: int | None = None,
    progress: bool = False,
) -> MultiSeqResult:
    """`n_seq` prompts decoded together (a finished one is replaced by the next: continuous batching).

    Each step, spec-select's `choose_batch` picks every sequence's draft jointly (or every
    sequence runs drafter `fixed`); the step's modelled time is `SpecSelect.batch_step_ms`
    (one verify pass per distinct verified length, each model drafter called once). Per prompt:
    tokens (min(accepted + 1, n - pos) on dense logs), and the batch time of the steps it took
    part in (its own tokens/s as it sees it).
    """
    if fixed is None:
        t = arms_table(t)  # spec-select chooses and cuts chains: a tree is no policy's arm (schema.ArmsOnly)
    timing = run_timing(t)
    pol = policy if policy is not None else SpecSelect()
    pol.reset(t.drafters, t.workloads, timing)
    D = len(t.drafters)
    A = t.accepted.astype(float)
    rem = trajectory.remaining(t)
    rem = None if rem is None else rem.tolist()
    order = (np.arange(t.n_prompts) if prompt_order is None else np.asarray(prompt_order)).tolist()
    if mode == "block":
        seqs = [r.tolist() for r in block_rows(t)]
    elif t.dense:
        seqs = None
        first, lengths = trajectory.prompt_rows(t)
        starts, ends = first.tolist(), (first + lengths).tolist()
    else:
        raise ValueError("trajectory mode needs a dense log")
    tokens, ms, share = np.zeros(t.n_prompts), np.zeros(t.n_prompts), np.zeros(t.n_prompts)
    nanD, nanF, allobs = np.full(D, np.nan), np.full((D, 4), np.nan), np.ones(D, bool)
    live: list[list] = []  # [prompt, cursor (row or index), prev_a, prev_f]
    steps, total, DL = 0, 0.0, context_lengths(t)  # what a policy sees before choosing (stop_below drafters)
    order.reverse()  # pop() from the end: prompts still come in `order`
    bar = tqdm(
        total=t.n_prompts,
        desc=f"{n_seq} sequence(s) per step, {'fixed' if fixed is not None else pol.name}",
        disable=not progress,
        file=sys.stderr,
        leave=False,
    )
    while order or live:
        while order and len(live) < n_seq:
            p = order.pop()
            live.append([p, 0 if seqs is not None else starts[p], nanD, nanF])
        rows = [seqs[p][c] if seqs is not None else c for p, c, _, _ in live]
        ctxs = [Context(int(t.workload[r]), p, int(t.pos[r]), pa, pf, DL[r]) for (p, _, pa, pf), r in zip(live, rows)]
        picks = pol.choose_batch(ctxs) if fixed is None else [fixed] * len(live)
        pairs = []
        for (p, c, _, _), r, ctx, pick in zip(live, rows, ctxs, picks):
            d, L = (pick[0], pick[1]) if isinstance(pick, tuple) else (pick, -1)
            rew = A[r, d] if L < 0 else min(A[r, d], L)
            acc = A[r].copy()
            acc[d] = rew
            pol.cut_ = (d, L)
            pol.update(ctx, d, acc, allobs)
            pairs.append((d, int(t.draft_len[r, d]) if L < 0 else L))
            tokens[p] += rew + 1 if rem is None else min(rew + 1, rem[r])
        step = pol.batch_step_ms(pairs)
        steps, total = steps + 1, total + step
        nxt = []
        for (p, c, _, _), r, (d, _), pick in zip(live, rows, pairs, picks):
            ms[p] += step
            share[p] += step / len(live)
            adv = A[r, d] if not isinstance(pick, tuple) else min(A[r, d], pick[1])
            c = c + 1 if seqs is not None else c + int(adv) + 1
            done = c >= len(seqs[p]) if seqs is not None else c >= ends[p]
            if not done:
                nxt.append([p, c, A[r].copy(), t.features[r]])
            else:
                bar.update(1)
        live = nxt
    bar.close()
    name = pol.name + "_multi" if fixed is None else f"fixed:{t.drafters[fixed]}"
    return MultiSeqResult(name, t.label, n_seq, tokens, ms, share, steps, total)


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs
    from bandit.live.primary import attach_own

    def body(files, said: str) -> None:
        t = attach_own(load_logs(files))
        print(said)
        p = trajectory.primary(t)
        print(f"primary {t.drafters[p]}: the {trajectory.rule_name(t)}; step times from the manifest's timing")
        mode = "trajectory" if t.dense else "block"
        for n in (1, 4):
            a = multi_sequence_replay(t, SpecSelect(), n, mode)
            b = multi_sequence_replay(t, None, n, mode, fixed=p)
            print(
                f"[MODEL] {n} sequence(s) per step: spec_select {1000 * a.tokens.sum() / a.ms.sum():.1f} tokens/s, "
                f"all on {t.drafters[p]} {1000 * b.tokens.sum() / b.ms.sum():.1f} (point values; CIs: "
                "python bandit/core.py)"
            )

    demo(body, "Several sequences per step: spec-select against every sequence on the primary [MODEL].")
