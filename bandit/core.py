"""Policies replayed on block logs, and the simulation that the logs falsify (or not).

Re-exports the simulator (bandit/simulate.py) and the policies (bandit/policies.py). Two jobs:

1. `evaluate(t, mode)`: every policy replayed over the logs, prompts in seeded random orders,
   per-prompt totals averaged over the seeds. One accounting throughout (docs/DESIGN.md,
   "Definitions"): **tokens per target pass**, output tokens over target passes with nothing
   counted past the end of an output, for every fixed drafter, every policy, the greedy per-block
   oracle and the shortest-path oracle.
   - block mode: every policy meets the same blocks, the block set B (`trajectory.block_mask`):
     on a dense log the primary's own trajectory starts, on a sparse log the logged behaviour
     trajectory's block starts. A block's tokens are min(accepted + 1, n - pos) on dense logs
     (n the output's length) and accepted + 1 on sparse logs, where n is unknown; tokens per
     pass = sum over the met blocks / blocks.
   - trajectory mode (dense logs): each policy follows its own block boundaries (the next block
     starts at pos + accepted + 1); tokens per pass = output tokens / the policy's passes.
   Per policy, each with a 95% percentile bootstrap CI over prompt clusters within workloads
   (bandit/ci.py): tokens per pass; gain against the best fixed drafter (the primary: dense logs,
   fewest passes along its own trajectory; sparse logs, highest mean accepted) in tokens per
   pass; regret (per-prompt best fixed - policy sums: tokens in block mode, target passes in
   trajectory mode); modelled tokens/s [MODEL] (per-prompt tokens over per-prompt modelled ms)
   where the manifest has timings; the mean accepted per block as logged.
2. `falsify(t)`: the gain of contextual Thompson sampling over the best fixed drafter predicted
   by (a) the research README's own acceptance table (bandit/calibration_assumed.toml) and
   (b) the simulator fitted to the logs, against (c) the replay on the logs; like for like:
   see `falsify`.

`python bandit/core.py` also prints the full-information Hedge regret's log-log slope, with a
95% order-seed interval (percentiles over 20 seeded prompt orders: not a bootstrap), and the
multi-sequence tokens/s [MODEL] with prompt-cluster CIs. Every line is labelled [MEASURED],
[SIM] or [MODEL] (or is an indented continuation of a labelled line) and names its block set.

    python bandit/core.py [PATHS...] [--out FILE]   # -> <run dir>/core.txt beside the one run read (the
                                                    # default campaign's without PATHS; nothing for several
                                                    # runs pooled); tqdm progress on stderr
    specbandit policies PATHS --json [--mode block|trajectory]
"""
from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/core.py`: import our `bandit`, not a namesake
    import pathlib, sys
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import builtins
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer
from tqdm import tqdm

from bandit import trajectory
from bandit.ci import Interval, boot_totals, bootstrap_ratio, interval  # noqa: F401 (bootstrap_ratio: re-exported)
from bandit.logs import BlockTable, LogError, default_inputs, load_logs
from bandit.policies import (EXP3, UCB1, Fixed, Hedge, HedgeCtx, LinUCB, NormalHedge, Random,  # noqa: F401
                             SpecSelect, StepTime, ThompsonCtx, make_policies)
from bandit.replay import LOOKUP_KINDS, Context, block_rows, policy_timing, trajectory_oracle, walk  # noqa: F401
from bandit.simulate import (SimConfig, simulate, simulate_table, true_mean_accepted,  # noqa: F401
                             true_tokens_per_pass, write_sim_run)

CALIBRATION = Path(__file__).with_name("calibration_assumed.toml")
BASELINES = ("best_fixed", "workload_oracle", "per_block_oracle")
ORDER_SEEDS = 20      # seeded prompt orders for the Hedge regret slope's order-seed interval
REPLICATES = 4        # simulated campaigns per prediction


def tag(label: str) -> str:
    return f"[{label}]" if label != "UNLABELLED" else "[unlabelled]"


def _pct(iv: Interval) -> str:
    return f"{100 * iv.value:+.1f}% [{100 * iv.lo:+.1f}, {100 * iv.hi:+.1f}]"


def _num(iv: Interval, fmt: str = ".3f") -> str:
    return f"{iv.value:{fmt}} [{iv.lo:{fmt}}, {iv.hi:{fmt}}]"


def _strata(t: BlockTable) -> np.ndarray:
    strata = np.zeros(t.n_prompts, np.int64)
    strata[t.prompt] = t.workload
    return strata


def block_set_text(t: BlockTable, mode: str = "block") -> str:
    """Which blocks a replay of `t` in `mode` meets, in words."""
    if mode == "trajectory":
        return "each policy's own trajectory (its next block starts where its last one ends)"
    if not t.dense:
        return (f"B = the logged behaviour trajectory's {int(t.is_block_start.sum())} block starts (sparse log; "
                "output lengths unknown, so a block's tokens are accepted + 1)")
    p = trajectory.primary(t)
    return (f"B = the primary {t.drafters[p]}'s own trajectory starts, {int(trajectory.block_mask(t).sum())} blocks "
            f"(dense log of {t.n_records} positions; a block's tokens are min(accepted + 1, n - pos))")


# ---------------------------------------------------------------- replay loop

@dataclass(frozen=True)
class Trace:
    """One policy's pass over the logs: one row per block it met (B rows), in the order met."""
    policy: str
    row: np.ndarray       # (B,) int64: record index in the table
    chosen: np.ndarray    # (B,) int64: drafter index
    cut: np.ndarray       # (B,) int64: cut length L, -1 when the draft was verified whole
    reward: np.ndarray    # (B,) float64: accepted tokens of the chosen (cut) draft
    full_information: bool = False


run_timing = policy_timing  # what policies get at reset: manifest timing, k, lookup drafters


def run_policy(t: BlockTable, policy, mode: str = "block", prompt_order: np.ndarray | None = None,
               timing: dict | None = None) -> Trace:
    """Replay `policy` over `t` through `replay.walk` (the one loop, and its feedback model)."""
    rows, chosen, cut, reward = walk(t, policy, mode, prompt_order, timing)
    return Trace(policy.name, rows, chosen, cut, reward, bool(policy.full_information))


def _remaining(t: BlockTable) -> np.ndarray | None:
    """(R,) tokens left in the output from each record on (n - pos) on a dense log; None on a sparse one."""
    return trajectory.output_lengths(t)[t.prompt] - t.pos if t.dense else None


def trace_tokens(t: BlockTable, tr: Trace, rem: np.ndarray | None = None) -> np.ndarray:
    """(B,) output tokens each met block produced: min(reward + 1, n - pos) on dense logs (nothing past the
    output's end), reward + 1 on sparse logs (n unknown)."""
    rem = _remaining(t) if rem is None else rem
    tau = tr.reward + 1.0
    return tau if rem is None else np.minimum(tau, rem[tr.row])


def hindsight_traces(t: BlockTable, mode: str) -> dict[str, Trace]:
    """Baselines that peek: best fixed drafter (the primary), workload-level oracle, per-block (greedy) oracle.

    Block mode: on the block set B (`trajectory.block_mask`); the workload oracle takes each workload's
    drafter of most tokens on B, the per-block oracle each block's drafter of most accepted tokens.
    Trajectory mode: each baseline follows its own trajectory; the workload oracle runs each workload's
    drafter of fewest passes, the per-block oracle is the greedy trajectory (most accepted at every start).
    """
    p = trajectory.primary(t)
    if mode == "block":
        rows = np.flatnonzero(trajectory.block_mask(t))
        A = t.accepted[rows].astype(float)
        tok = trajectory.block_tokens(t, rows)
        W = len(t.workloads)
        wsum = np.zeros((W, A.shape[1]))
        np.add.at(wsum, t.workload[rows], tok)
        best_w = wsum.argmax(1)
        picks = {"best_fixed": np.full(len(rows), p), "workload_oracle": best_w[t.workload[rows]],
                 "per_block_oracle": A.argmax(1)}
        neg = np.full(len(rows), -1)
        return {k: Trace(k, rows, c.astype(np.int64), neg, A[np.arange(len(rows)), c]) for k, c in picks.items()}
    trajectory.require_dense(t)
    starts = trajectory.fixed_starts(t)
    passes = trajectory.fixed_passes(t, starts)                                  # (P, D)
    out = {}
    rows = np.flatnonzero(starts[:, p])
    out["best_fixed"] = Trace("best_fixed", rows, np.full(len(rows), p, np.int64), np.full(len(rows), -1),
                              t.accepted[rows, p].astype(float))
    wl_of = t.workload[trajectory.prompt_rows(t)[0]]
    pw = np.zeros((len(t.workloads), len(t.drafters)))
    np.add.at(pw, wl_of, passes)
    best_w = pw.argmin(1)                                                        # fewest passes, first on ties
    out["workload_oracle"] = _greedy_trajectory(t, best_w[t.workload], "workload_oracle")
    out["per_block_oracle"] = _greedy_trajectory(t, t.accepted.argmax(1), "per_block_oracle")
    return out


def _greedy_trajectory(t: BlockTable, pick: np.ndarray, name: str) -> Trace:
    """Trajectory that runs drafter pick[r] at every block start r, all prompts at once."""
    rows = np.flatnonzero(trajectory.walk(t, lambda r: t.accepted[r, pick[r]])[0])
    c = pick[rows].astype(np.int64)
    return Trace(name, rows, c, np.full(len(rows), -1), t.accepted[rows, c].astype(float))


# ---------------------------------------------------------------- modelled time

def step_ms(t: BlockTable, tr: Trace, timing: dict) -> np.ndarray | None:
    """(B,) modelled wall ms of each block of a trace, from the manifest's timing; None without one.

    Verify time of the verified draft tokens + 1, plus the chosen drafter's call. Full-information
    learners need every drafter's draft verified at every block (that is what panoramic feedback
    is): they pay every call and a union verification of D drafts (`verify_batch_ms`, else D
    separate passes). spec-select also pays its always-computed lookup drafts.
    """
    if "verify_ms" not in timing or "drafter_ms" not in timing:
        return None
    D = len(t.drafters)
    look = np.array([d in timing.get("lookup", ()) for d in t.drafters])
    st = StepTime.from_timing(t.drafters, look, timing)
    n = np.where(tr.cut >= 0, tr.cut, t.draft_len[tr.row, tr.chosen])
    if tr.full_information and tr.policy != "spec_select":
        vb = timing.get("verify_batch_ms")
        k1 = st.verify(float(t.draft_len.max()) + 1)
        union = (np.interp(D, vb["drafts"], vb["ms"]) if vb else D * k1)
        return np.full(len(tr.row), union + st.drafter_ms.sum())
    calls = st.drafter_ms[tr.chosen]
    if tr.policy == "spec_select":
        calls = np.where(look[tr.chosen], 0.0, calls) + st.drafter_ms[look].sum()
    return st.verify(n + 1.0) + calls


def regret_curve(t: BlockTable, policy, order: np.ndarray | None = None,
                 checkpoints: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(T checkpoints, pseudo-regret at each, log-log slope) of a full-information policy exposing `w_`.

    Over the block set B (`block_rows`), prompts in `order`. Pseudo-regret after T blocks, in
    tokens (min(a + 1, n - pos) on dense logs): max_d sum_{t<T} tau_d(t) - sum_{t<T} E_{w_t}[tau(t)],
    the best fixed drafter in hindsight on the prefix against the policy's expected reward (its
    sampling noise removed, so the slope measures learning, not luck). Sublinear regret: slope < 1.
    """
    per_prompt = block_rows(t)
    rows = np.concatenate([per_prompt[p] for p in (range(t.n_prompts) if order is None else order)])
    A = t.accepted[rows].astype(float)
    tau = trajectory.block_tokens(t, rows).astype(float)
    policy.reset(t.drafters, t.workloads, run_timing(t))
    D, allobs = len(t.drafters), np.ones(len(t.drafters), bool)
    nanD, nanF = np.full(D, np.nan), np.full((D, 4), np.nan)
    exp_r = np.empty(len(rows))
    wl, pr, ps = t.workload[rows].tolist(), t.prompt[rows].tolist(), t.pos[rows].tolist()
    choose, update = policy.choose, policy.update
    for i, r in enumerate(rows.tolist()):
        ctx = Context(wl[i], pr[i], ps[i], nanD, nanF, t.draft_len[r])
        d = choose(ctx)
        w = np.asarray(policy.w_)
        exp_r[i] = w @ tau[i] / w.sum()
        update(ctx, int(d), A[i], allobs)
    T = np.asarray(checkpoints if checkpoints is not None else
                   np.unique(np.geomspace(min(100, max(len(rows) // 4, 1)), max(len(rows), 1), 8).astype(int)))
    reg = np.cumsum(tau, 0).max(1)[T - 1] - np.cumsum(exp_r)[T - 1]
    ok = reg > 0
    slope = float(np.polyfit(np.log(T[ok]), np.log(reg[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")
    return T, reg, slope


@dataclass(frozen=True)
class MultiSeqResult:
    """Several sequences decoded in lockstep, one target step each, for one selection rule."""
    policy: str
    label: str
    n_seq: int
    tokens: np.ndarray      # (P,) output tokens produced per prompt (nothing past an output's end on dense logs)
    ms: np.ndarray          # (P,) modelled ms of the steps each prompt took part in (its own wait)
    share: np.ndarray       # (P,) its share of those steps (step time / sequences in the step): sums to total_ms
    steps: int
    total_ms: float

    @property
    def tokens_per_s(self) -> float:
        return float(self.tokens.sum() / self.total_ms * 1000.0)


def multi_sequence_replay(t: BlockTable, policy: SpecSelect | None, n_seq: int = 4, mode: str = "trajectory",
                          prompt_order: np.ndarray | None = None, fixed: int | None = None,
                          progress: bool = False) -> MultiSeqResult:
    """`n_seq` prompts decoded together (a finished one is replaced by the next: continuous batching).

    Each step, spec-select's `choose_batch` picks every sequence's draft jointly (or every
    sequence runs drafter `fixed`); the step's modelled time is `SpecSelect.batch_step_ms`
    (one verify pass per distinct verified length, each model drafter called once). Per prompt:
    tokens (min(accepted + 1, n - pos) on dense logs), and the batch time of the steps it took
    part in (its own tokens/s as it sees it).
    """
    timing = run_timing(t)
    pol = policy if policy is not None else SpecSelect()
    pol.reset(t.drafters, t.workloads, timing)
    D = len(t.drafters)
    A = t.accepted.astype(float)
    rem = _remaining(t)
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
    live: list[list] = []      # [prompt, cursor (row or index), prev_a, prev_f]
    steps, total = 0, 0.0
    order.reverse()            # pop() from the end: prompts still come in `order`
    bar = tqdm(total=t.n_prompts, desc=f"{n_seq} sequence(s) per step, {'fixed' if fixed is not None else pol.name}",
               disable=not progress, file=sys.stderr, leave=False)
    while order or live:
        while order and len(live) < n_seq:
            p = order.pop()
            live.append([p, 0 if seqs is not None else starts[p], nanD, nanF])
        rows = [seqs[p][c] if seqs is not None else c for p, c, _, _ in live]
        ctxs = [Context(int(t.workload[r]), p, int(t.pos[r]), pa, pf, t.draft_len[r])
                for (p, _, pa, pf), r in zip(live, rows)]
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


# ---------------------------------------------------------------- evaluation

TOTALS = ("tokens", "passes", "accepted", "ms")   # per-prompt columns of PolicyResult.totals


@dataclass(frozen=True)
class PolicyResult:
    """One policy on one table, averaged over seeded prompt orders; 95% CIs over prompt clusters."""
    name: str
    label: str
    mode: str                         # block | trajectory
    tokens_per_pass: Interval         # the headline: output tokens / target passes (nothing past an output's end)
    gain: Interval                    # tokens per pass / best fixed's - 1
    regret: Interval                  # block mode: best fixed - policy tokens; trajectory mode: policy - best fixed passes
    regret_unit: str                  # "tokens" | "target passes"
    tokens_per_s: Interval | None     # [MODEL] per-prompt tokens / per-prompt modelled ms; None without timing
    mean_accepted: Interval | None    # accepted tokens per met block as logged (None for the shortest path)
    n_blocks: float                   # blocks met, seed average
    totals: np.ndarray = field(default=None, repr=False, compare=False)  # (P, 4) TOTALS per prompt, seed average

    def to_json(self) -> dict:
        def pair(iv):
            return (None, [None, None]) if iv is None else (_json_num(iv.value), [_json_num(iv.lo), _json_num(iv.hi)])
        tpp, tpp_ci = pair(self.tokens_per_pass)
        g, g_ci = pair(self.gain)
        reg, reg_ci = pair(self.regret)
        tps, tps_ci = pair(self.tokens_per_s)
        ma, ma_ci = pair(self.mean_accepted)
        c = self.tokens_per_pass
        return {"tokens_per_pass": tpp, "tokens_per_pass_ci": tpp_ci,
                "gain_vs_best_fixed": g, "gain_ci": g_ci, "gain_unit": "tokens per target pass",
                "regret_vs_best_fixed": reg, "regret_ci": reg_ci, "regret_unit": self.regret_unit,
                "tokens_per_s_model": tps, "tokens_per_s_model_ci": tps_ci,
                "mean_accepted": ma, "ci": ma_ci, "n_blocks": self.n_blocks, "label": self.label, "mode": self.mode,
                "ci_method": c.method, "ci_unit": c.unit, "n_resamples": c.n_resamples, "ci_seed": c.seed}


def _json_num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class PolicyReport:
    """Every policy on one table: inputs, settings and results (statsmodels-like summary)."""
    label: str
    mode: str
    seeds: tuple[int, ...]
    n_resamples: int
    seed: int
    results: dict[str, PolicyResult]
    sources: tuple[tuple[str, str], ...]
    n_prompts: int
    block_set: str = ""
    best_fixed: str = ""

    def to_json(self) -> dict:
        out = {k: r.to_json() for k, r in self.results.items()}
        for v in out.values():
            v["sources"] = [{"path": p, "sha256": h} for p, h in self.sources]
            v["order_seeds"] = list(self.seeds)
            v["block_set"] = self.block_set
            v["best_fixed"] = self.best_fixed
        return out

    def summary(self) -> str:
        g = tag(self.label)
        unit = next(iter(self.results.values())).regret_unit
        head = ("tokens/pass = the met blocks' tokens / blocks"
                if self.mode == "block" else "tokens/pass = output tokens / the trajectory's target passes")
        regret = ("regret = best fixed - policy tokens over the same blocks, summed over prompts"
                  if self.mode == "block" else "regret = policy - best fixed target passes, summed over prompts")
        lines = [f"{g} policy replay, {self.mode} mode; blocks: {self.block_set}",
                 f"  {self.n_prompts} prompts, prompt orders seeded {list(self.seeds)} (per-prompt totals averaged "
                 f"over them); best fixed = the primary {self.best_fixed}; {head}; {regret}; tok/s [MODEL] from the "
                 f"manifest's timing; accepted/block as logged. 95% CIs: {self.n_resamples}-resample percentile "
                 f"bootstrap over prompt clusters within workloads, seed {self.seed}",
                 f"{'':{len(g) + 1}s}{'policy':18s}{'tokens/pass':>22s}{'gain vs best fixed':>26s}{f'regret ({unit})':>30s}"
                 f"{'tok/s [MODEL]':>25s}{'accepted/block':>22s}"]
        for k, r in self.results.items():
            tp, gn, rg = r.tokens_per_pass, r.gain, r.regret
            tps = f"{_num(r.tokens_per_s, '.1f'):>25s}" if r.tokens_per_s is not None else f"{'-':>25s}"
            ma = f"{_num(r.mean_accepted):>22s}" if r.mean_accepted is not None else f"{'-':>22s}"
            lines.append(f"{g} {k:18s}{_num(tp):>22s}{_pct(gn):>26s}{_num(rg, '.1f'):>30s}{tps}{ma}")
        return "\n".join(lines)


def _totals(t: BlockTable, trs: Sequence[Trace], timing: dict, rem: np.ndarray | None) -> np.ndarray:
    """(P, 4) per-prompt TOTALS of traces, averaged over them (seeds); ms NaN without timing."""
    out = np.zeros((len(trs), t.n_prompts, len(TOTALS)))
    for i, tr in enumerate(trs):
        pr = t.prompt[tr.row]
        out[i, :, 0] = np.bincount(pr, trace_tokens(t, tr, rem), minlength=t.n_prompts)
        out[i, :, 1] = np.bincount(pr, minlength=t.n_prompts)
        out[i, :, 2] = np.bincount(pr, tr.reward, minlength=t.n_prompts)
        ms = step_ms(t, tr, timing)
        out[i, :, 3] = np.nan if ms is None else np.bincount(pr, ms, minlength=t.n_prompts)
    return out.mean(0)


def _intervals(tot: np.ndarray, bf: np.ndarray, strata: np.ndarray, mode: str, n_resamples: int, seed: int,
               accepted: bool = True) -> dict[str, Interval | None]:
    """Every statistic of one policy from its and the best fixed's per-prompt totals, on the same resamples."""
    timed = bool(np.isfinite(tot[:, 3]).all())
    cols = np.column_stack([tot[:, 0], tot[:, 1], tot[:, 2], np.nan_to_num(tot[:, 3]), bf[:, 0], bf[:, 1]])

    def stat(T: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            tpp = T[:, 0] / T[:, 1]
            gain = tpp / (T[:, 4] / T[:, 5]) - 1
            reg = T[:, 4] - T[:, 0] if mode == "block" else T[:, 1] - T[:, 5]
            return np.column_stack([tpp, gain, reg, T[:, 0] / T[:, 3] * 1000.0, T[:, 2] / T[:, 1]])

    value, boot, _ = boot_totals(cols, stat, strata, n_resamples, seed, jackknife=False)
    ivs = [interval(value[j], boot[:, j], None, "percentile", "prompt", seed) for j in range(5)]
    return {"tokens_per_pass": ivs[0], "gain": ivs[1], "regret": ivs[2],
            "tokens_per_s": ivs[3] if timed else None, "mean_accepted": ivs[4] if accepted else None}


def evaluate(t: BlockTable, mode: str = "block", policies: Sequence | None = None, seeds: Sequence[int] = (0, 1, 2),
             n_resamples: int = 1000, seed: int = 0, progress: bool = False) -> PolicyReport:
    """Replay every policy (default: all of bandit/policies.py) plus the hindsight baselines.

    Per seed s the prompts come in the order rng(s).permutation(P) and each policy gets
    random_state = s; per-prompt totals are averaged over seeds before the bootstrap. Tokens per
    target pass is the one accounting of every row (module docstring); in trajectory mode the
    shortest-path oracle (`trajectory_oracle`) is the last row, and every row lies at or below it.
    """
    if mode not in ("block", "trajectory"):
        raise ValueError(f"mode must be 'block' or 'trajectory', got {mode!r}")
    if mode == "trajectory" and not t.dense:
        raise ValueError("trajectory mode needs a dense log (a record at every position of every prompt); "
                         "this one is sparse: use --mode block")
    timing = run_timing(t)
    strata = _strata(t)
    rem = _remaining(t)
    hind = hindsight_traces(t, mode)
    traces: dict[str, list[Trace]] = {k: [v] for k, v in hind.items()}
    jobs = [(s, pol) for s in seeds
            for pol in (make_policies(random_state=s) if policies is None else [p.clone(random_state=s) for p in policies])]
    for s, pol in tqdm(jobs, desc=f"{t.label} {mode} replay", disable=not progress, file=sys.stderr, leave=False):
        traces.setdefault(pol.name, []).append(run_policy(t, pol, mode, np.random.default_rng(s).permutation(t.n_prompts),
                                                          timing))
    bf = _totals(t, traces["best_fixed"], timing, rem)
    unit = "tokens" if mode == "block" else "target passes"
    results = {}
    for name, trs in traces.items():
        tot = _totals(t, trs, timing, rem)
        iv = _intervals(tot, bf, strata, mode, n_resamples, seed)
        results[name] = PolicyResult(name, t.label, mode, iv["tokens_per_pass"], iv["gain"], iv["regret"], unit,
                                     iv["tokens_per_s"], iv["mean_accepted"], float(tot[:, 1].sum()), tot)
    if mode == "trajectory":
        o = trajectory_oracle(t)
        tot = np.column_stack([o.tokens, o.passes, np.full(t.n_prompts, np.nan), np.full(t.n_prompts, np.nan)]).astype(float)
        iv = _intervals(tot, bf, strata, mode, n_resamples, seed, accepted=False)
        results["trajectory_oracle"] = PolicyResult("trajectory_oracle", t.label, mode, iv["tokens_per_pass"], iv["gain"],
                                                    iv["regret"], unit, None, None, float(o.passes.sum()), tot)
    return PolicyReport(t.label, mode, tuple(seeds), n_resamples, seed, results,
                        tuple((s.path, s.sha256) for s in t.sources), t.n_prompts, block_set_text(t, mode),
                        t.drafters[trajectory.primary(t)])


def gain_of(totals: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], n_resamples: int, seed: int) -> Interval:
    """Gain in tokens per pass of pooled per-prompt totals: [(policy totals (P, 4), best fixed totals (P, 4),
    strata (P,)), ...] of one or several campaigns, one prompt-cluster bootstrap over all their prompts."""
    tot = np.concatenate([a for a, _, _ in totals])
    bf = np.concatenate([b for _, b, _ in totals])
    strata = np.concatenate([s for _, _, s in totals])
    return _intervals(tot, bf, strata, "block", n_resamples, seed, accepted=False)["gain"]


# ---------------------------------------------------------------- the calibrations

@dataclass(frozen=True)
class Calibration:
    """A calibration file read: the SimConfig, and how its arms and workloads map onto the logs'."""
    cfg: SimConfig                  # at the file's design; drafters and workloads named as in the logs
    arms: dict[str, str]            # the file's drafter -> the logs' drafter
    workloads: dict[str, str]       # the file's workload -> the logs' workload
    table: np.ndarray | None        # (W, D) mean accepted per block the file states (cfg's order), else None
    source: dict
    path: str


def _cal_error(path: Path, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


def read_calibration(path: str | Path = CALIBRATION) -> Calibration:
    """Read a calibration file (TOML or JSON): `[sim]` SimConfig keys; then either `[mean_accepted]` (a table
    of mean accepted tokens per block, workload x drafter, with `[arms]` and `[workloads]` mapping its names
    onto the logs'; the per-token acceptance is solved from it at the `[sim]` design, see `solve_token_accept`)
    or `[token_accept]` rows (per-token acceptance given directly)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise _cal_error(path, f"not valid {path.suffix[1:].upper()}: {e}") from None
    sim = dict(raw.get("sim") or {})
    known = set(SimConfig.__dataclass_fields__)
    bad = sorted(set(sim) - known)
    if bad:
        raise _cal_error(path, f"[sim]: unknown keys {bad}; known: {sorted(known)}")
    sim = {k: tuple(v) if isinstance(v, list) else v for k, v in sim.items()}
    ma, ta = raw.get("mean_accepted"), raw.get("token_accept")
    if ma is not None and ta is not None:
        raise _cal_error(path, "give [mean_accepted] or [token_accept], not both")
    table = None
    if ma is not None:
        cols = sorted({d for row in ma.values() for d in row})
        arms = dict(raw.get("arms") or {d: d for d in cols})
        wmap = dict(raw.get("workloads") or {w: w for w in ma})
        for what, m in (("[arms]", arms), ("[workloads]", wmap)):
            if len(set(m.values())) != len(m):
                raise _cal_error(path, f"{what}: two names map onto the same one: {m}")
        missing = [w for w in wmap if w not in ma]
        if missing:
            raise _cal_error(path, f"[mean_accepted]: no row for workloads {missing}")
        for w in wmap:
            lack = [a for a in arms if a not in ma[w]]
            if lack:
                raise _cal_error(path, f"[mean_accepted].{w}: no value for drafters {lack}")
        drafters, workloads = tuple(sorted(arms.values())), tuple(sorted(wmap.values()))
        for key, names in (("drafters", drafters), ("workloads", workloads)):
            if key in sim and tuple(sim[key]) != names:
                raise _cal_error(path, f"[sim].{key} = {list(sim[key])} disagrees with the mapping's {list(names)}")
        inv_a, inv_w = {v: k for k, v in arms.items()}, {v: k for k, v in wmap.items()}
        table = np.array([[float(ma[inv_w[w]][inv_a[d]]) for d in drafters] for w in workloads])
        sim.update(workloads=workloads, drafters=drafters, token_accept=((0.5,) * len(drafters),) * len(workloads))
        sim.setdefault("drafter_accept", (0.5,) * len(drafters))     # unused: token_accept overrides them
        sim.setdefault("workload_shift", (0.0,) * len(workloads))
    else:
        arms = {d: d for d in sim.get("drafters", SimConfig.drafters)}
        wmap = {w: w for w in sim.get("workloads", SimConfig.workloads)}
        if ta is not None:
            wls = sim.get("workloads", SimConfig.workloads)
            missing = [w for w in wls if w not in ta]
            if missing:
                raise _cal_error(path, f"[token_accept]: no row for workloads {missing}")
            sim["token_accept"] = tuple(tuple(float(x) for x in ta[w]) for w in wls)
    try:
        cfg = SimConfig(**sim)
    except (TypeError, ValueError) as e:
        raise _cal_error(path, str(e)) from None
    if table is not None:
        cfg = solve_token_accept(cfg, table + 1.0)
    return Calibration(cfg, arms, wmap, table, dict(raw.get("source") or {}), str(path))


def load_calibration(path: str | Path = CALIBRATION) -> SimConfig:
    """The SimConfig of a calibration file (`read_calibration`)."""
    return read_calibration(path).cfg


def solve_token_accept(cfg: SimConfig, tokens_per_pass: np.ndarray, iters: int = 40) -> SimConfig:
    """`cfg` with the per-token acceptance (W, D) whose planted tokens per pass along each drafter's own
    trajectory (`true_tokens_per_pass`, at cfg's design) equals `tokens_per_pass`, by bisection (all cells
    at once: the statistic increases with the per-token acceptance). Targets beyond reach saturate."""
    target = np.asarray(tokens_per_pass, float)
    lo, hi = np.full(target.shape, 1e-4), np.full(target.shape, 1 - 1e-4)
    for _ in range(iters):
        mid = (lo + hi) / 2
        m = true_tokens_per_pass(replace(cfg, token_accept=tuple(map(tuple, mid)), ranking_flips=False), n_nodes=48)
        lo, hi = np.where(m < target, mid, lo), np.where(m < target, hi, mid)
    return replace(cfg, ranking_flips=False,
                   token_accept=tuple(tuple(round(float(x), 6) for x in row) for row in (lo + hi) / 2))


def logs_design(t: BlockTable) -> dict:
    """The logs' design as SimConfig keys: prompts per workload, k and, on dense logs, every prompt's output length
    (workload-major; a workload with another number of prompts gets a seeded resample of its lengths)."""
    W = len(t.workloads)
    per = max(int(np.round(t.n_prompts / W)), 1)
    k = int(run_timing(t)["k"])
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    if not t.dense:   # the output lengths are unknown: the median last logged position + 1
        n = int(np.round(np.median([t.pos[t.prompt == p].max() + 1 for p in range(t.n_prompts)])))
        return dict(n_prompts=per, out_len=max(n, 2), out_lens=None, k=k)
    n = trajectory.output_lengths(t)
    rng = np.random.default_rng(0)
    lens = []
    for w in range(W):
        x = n[wl_of == w]
        lens += (x if x.size == per else rng.choice(x, per)).tolist()
    return dict(n_prompts=per, out_len=int(max(lens)), out_lens=tuple(int(v) for v in lens), k=k)


def fixed_tokens_per_pass(t: BlockTable) -> np.ndarray:
    """(W, D) tokens per target pass of each fixed drafter along its own trajectory, per workload (dense logs)."""
    passes = trajectory.fixed_passes(t)
    wl_of = t.workload[trajectory.prompt_rows(t)[0]]
    W = len(t.workloads)
    pw = np.zeros((W, len(t.drafters)))
    np.add.at(pw, wl_of, passes)
    return np.bincount(wl_of, trajectory.output_lengths(t), minlength=W)[:, None] / pw


def fit_simulator(t: BlockTable, base: SimConfig | None = None) -> SimConfig:
    """The simulator's parameters estimated from a table (method of moments) at the logs' design (`logs_design`).

    Dense logs: per workload x drafter the per-token acceptance is solved so that the simulator's
    planted tokens per pass along the drafter's own trajectory (`true_tokens_per_pass`, with the logs'
    output lengths) equals the logs' (`fixed_tokens_per_pass`): the statistic the assumed calibration
    reproduces from the research README's table. Sparse logs (output lengths unknown): so that the
    planted per-position mean accepted equals the logs' mean over the logged block starts (an
    approximation). The correlation structure (shared difficulty, prompt effects) and confidence model
    are kept from `base` (cycled to the logs' workloads and drafters), because mean acceptance does not
    identify them. No ranking flips are assumed: any flip is in the fitted table itself.
    """
    base = base or load_calibration()
    W, D = len(t.workloads), len(t.drafters)
    cfg = replace(base, workloads=t.workloads, drafters=t.drafters, **logs_design(t), dense=True, ranking_flips=False,
                  token_accept=((0.5,) * D,) * W, **_resize(base, W, D))
    if t.dense:
        return solve_token_accept(cfg, fixed_tokens_per_pass(t))
    target = np.zeros((W, D))
    np.add.at(target, t.workload, t.accepted)
    target /= np.bincount(t.workload, minlength=W)[:, None]
    lo, hi = np.full(target.shape, 1e-4), np.full(target.shape, 1 - 1e-4)
    for _ in range(40):     # true_mean_accepted is increasing in the per-token acceptance
        mid = (lo + hi) / 2
        m = true_mean_accepted(replace(cfg, token_accept=tuple(map(tuple, mid))))
        lo, hi = np.where(m < target, mid, lo), np.where(m < target, hi, mid)
    return replace(cfg, token_accept=tuple(tuple(round(float(x), 6) for x in row) for row in (lo + hi) / 2))


def _resize(base: SimConfig, W: int, D: int) -> dict:
    """Per-workload / per-drafter knobs of `base` resized to the logs' W and D (cycled)."""
    def cyc(x, n):
        return tuple(x[i % len(x)] for i in range(n))
    return {"drafter_accept": cyc(base.drafter_accept, D), "empty_rate": cyc(base.empty_rate, D),
            "drafter_ms": cyc(base.drafter_ms, D), "workload_shift": cyc(base.workload_shift, W),
            "signal": cyc(base.signal, W), "conf_base": cyc(base.conf_base, W),
            "behaviour": min(base.behaviour, D - 1)}


def _subset(cfg: SimConfig, workloads: Sequence[str], drafters: Sequence[str]) -> SimConfig:
    """`cfg` restricted to some of its workloads and drafters (every per-workload / per-drafter knob with them)."""
    wi = [cfg.workloads.index(w) for w in workloads]
    di = [cfg.drafters.index(d) for d in drafters]
    pick = lambda x, ix: tuple(x[i] for i in ix)  # noqa: E731
    ta = None if cfg.token_accept is None else tuple(pick(cfg.token_accept[w], di) for w in wi)
    return replace(cfg, workloads=tuple(workloads), drafters=tuple(drafters), token_accept=ta, out_lens=None,
                   drafter_accept=pick(cfg.drafter_accept, di), empty_rate=pick(cfg.empty_rate, di),
                   drafter_ms=pick(cfg.drafter_ms, di), workload_shift=pick(cfg.workload_shift, wi),
                   signal=pick(cfg.signal, wi), conf_base=pick(cfg.conf_base, wi),
                   behaviour=min(cfg.behaviour, len(di) - 1))


# ---------------------------------------------------------------- the falsification

def _policy(name: str):
    pols = {p.name: p for p in make_policies()}
    if name not in pols:
        raise ValueError(f"no policy named {name!r}; policies: {', '.join(pols)}")
    return pols[name]


def predict_gain(cfg: SimConfig, policy: str = "thompson_ctx", seeds: Sequence[int] = (0, 1, 2),
                 n_resamples: int = 1000, seed: int = 0, replicates: int = REPLICATES,
                 progress: bool = False) -> tuple[Interval, tuple[str, ...]]:
    """[SIM] gain of `policy` over best fixed in tokens per pass on `replicates` dense campaigns simulated from
    `cfg`, each scored by `evaluate(campaign, "block", [policy])` exactly as the logs are (its own primary, its
    own block set); (pooled gain over one prompt-cluster bootstrap of all replicates' prompts, each
    replicate's best fixed drafter).

    An online learner's gain depends on its horizon (exploration is paid once per campaign), so each
    replicate is a whole campaign of the given design, replayed on its own.
    """
    pol = _policy(policy)
    parts, prim = [], []
    for rep in tqdm(range(replicates), desc=f"[SIM] campaigns ({policy})", disable=not progress, file=sys.stderr,
                    leave=False):
        ts = simulate_table(replace(cfg, seed=cfg.seed + 1000 * rep, dense=True))
        r = evaluate(ts, "block", [pol], seeds, n_resamples, seed)
        parts.append((r.results[policy].totals, r.results["best_fixed"].totals, _strata(ts)))
        prim.append(r.best_fixed)
    return gain_of(parts, n_resamples, seed), tuple(prim)


@dataclass(frozen=True)
class Falsification:
    """(a) the research README's table's prediction, (b) the fitted simulator's, (c) the logs' replay: like for like."""
    policy: str
    label: str
    replicates: int                      # simulated campaigns per prediction
    compared: tuple[str, ...]            # the logs' drafters with an arm in the calibration
    left_out: tuple[str, ...]            # the logs' drafters without one
    calibration: Calibration
    assumed: SimConfig                   # the calibration at the logs' design (compared drafters)
    fitted: SimConfig                    # fitted to the logs' compared drafters
    predicted_assumed: Interval          # [SIM] (a)
    predicted_assumed_own: Interval      # [SIM] (a) at the calibration's own design
    predicted_fitted: Interval           # [SIM] (b)
    observed: Interval                   # (c), the logs' label
    primaries: dict                      # prediction -> the best fixed drafter of each simulated campaign
    observed_report: PolicyReport
    fitted_all: SimConfig | None = None          # every drafter of the logs (when some were left out)
    predicted_fitted_all: Interval | None = None
    observed_all: Interval | None = None

    def excludes(self, pred: Interval, obs: Interval | None = None) -> bool:
        obs = self.observed if obs is None else obs
        return not (obs.lo <= pred.value <= obs.hi)

    def summary(self) -> str:
        g = tag(self.label)
        cal, a = self.calibration, self.assumed
        ms = {v: k for k, v in cal.arms.items()}
        mw = {v: k for k, v in cal.workloads.items()}
        src = cal.source.get("document", cal.path)
        own = cal.cfg
        lines = [
            f"[SIM] vs {g} falsification: gain of {self.policy} over the best fixed drafter, in tokens per target pass. "
            f"Every campaign, simulated or logged, is scored by the same evaluate(campaign, 'block', [{self.policy}]) "
            f"on its own block set B (dense campaigns: its primary's own trajectory starts; best fixed = that "
            f"primary). Predictions: {self.replicates} simulated dense campaigns each, of the logs' design "
            f"({a.n_prompts} prompts per workload with the logs' output lengths, up to {a.out_len} tokens, k={a.k}), "
            f"pooled into one prompt-cluster bootstrap; 95% CIs: {self.observed.n_resamples}-resample percentile "
            f"bootstrap over prompt clusters within workloads, seed {self.observed.seed}.",
            f"  drafters compared: {', '.join(self.compared)} (calibration arms "
            + ", ".join(f"{ms[d]}={d}" for d in self.compared) + "); left out: "
            + (", ".join(self.left_out) + " (no arm in the calibration)" if self.left_out else "none")
            + "".join(f"; calibration arm {k} (= {v}) has no drafter in the logs"
                      for k, v in cal.arms.items() if v not in self.compared)
            + "; workloads " + ", ".join(f"{mw[w]}={w}" for w in a.workloads)]
        rows = [("(a) the research README's table" if cal.source else "(a) the assumed calibration", "[SIM]",
                 self.predicted_assumed, "a"),
                ("(b) simulator fitted to the logs", "[SIM]", self.predicted_fitted, "b"),
                ("(c) replay on the logs", g, self.observed, None)]
        for name, lab, iv, key in rows:
            bf = (f"   best fixed in the campaigns: {', '.join(self.primaries[key])}" if key else
                  f"   best fixed: {self.observed_report.best_fixed}; {self.observed_report.block_set}")
            lines.append(f"  {name:34s}{lab:13s}{_pct(iv):>26s}{bf}")
        for name, _, iv, _ in rows[:2]:
            verdict = "EXCLUDES" if self.excludes(iv) else "does not exclude"
            lines.append(f"  {g} the logs' CI {verdict} prediction {name.split()[0]} ({100 * iv.value:+.1f}%)")
        o = self.predicted_assumed_own
        lines.append(f"  (a) at the calibration's own design ({own.n_prompts} prompts per workload x {own.out_len} "
                     f"tokens, k={own.k}, assumed: the README states neither): [SIM] {_pct(o)}, best fixed in the "
                     f"campaigns: {', '.join(self.primaries['a_own'])}. The research README's own prediction, quoted "
                     f"from it: {cal.source.get('readme_prediction', '+19.4% for contextual Thompson sampling')}; "
                     "it came from a simulation that assumed ranking flips between workloads, which the README's "
                     "table does not show")
        if self.predicted_fitted_all is not None:
            lines.append(f"  on every drafter of the logs ({', '.join(self.fitted_all.drafters)}; no README "
                         f"prediction there): (b) fitted [SIM] {_pct(self.predicted_fitted_all)}, (c) replay {g} "
                         f"{_pct(self.observed_all)}; the logs' CI "
                         f"{'EXCLUDES' if self.excludes(self.predicted_fitted_all, self.observed_all) else 'does not exclude'}"
                         " prediction (b)")
        lines.append(f"  [SIM] simulation inputs (point values, not results: no CI): per-token acceptance solved from "
                     f"{src}'s mean accepted table at its assumed design: " + _fmt_accept(own))
        lines.append("  [SIM] simulation inputs (point values, not results: no CI): per-token acceptance fitted to the "
                     "logs' tokens per pass per workload x drafter: " + _fmt_accept(self.fitted))
        return "\n".join(lines)


def _fmt_accept(cfg: SimConfig) -> str:
    return "; ".join(f"{w}: " + ", ".join(f"{d} {x:.3f}" for d, x in zip(cfg.drafters, row))
                     for w, row in zip(cfg.workloads, cfg.token_accept))


def falsify(t: BlockTable, calibration: str | Path = CALIBRATION, policy: str = "thompson_ctx",
            seeds: Sequence[int] = (0, 1, 2), n_resamples: int = 1000, seed: int = 0, replicates: int = REPLICATES,
            all_drafters: bool = True, progress: bool = False) -> Falsification:
    """The predictions of the calibration and of the fitted simulator against the logs, like for like.

    Like for like means: (1) the same drafters: the calibration's arms are mapped onto the logs'
    drafters (`[arms]`), predictions and replay use only those (`select_drafters`); (2) the same
    design: the simulated campaigns have the logs' prompts per workload, output lengths and k;
    (3) the same statistic on the same kind of block set: every campaign, simulated or logged, is a
    dense campaign scored by the very same `evaluate(., "block", [policy])`, on its own primary's
    trajectory starts, gain in tokens per target pass against that primary. The calibration and the
    fit are themselves matched on one statistic: each drafter's tokens per pass along its own
    trajectory per workload (the README's table + 1 at the README's design; the logs' own at theirs).
    Needs a dense log: a sparse log has one block set (its behaviour's), which no simulated
    campaign can share without knowing how the behaviour was chosen.
    """
    if not t.dense:
        raise ValueError("the falsification needs a dense log (predictions and replay are scored on the primary's "
                         "block set, which a sparse log does not have)")
    cal = read_calibration(calibration)
    unmapped_w = [w for w in t.workloads if w not in cal.workloads.values()]
    if unmapped_w:
        raise ValueError(f"{cal.path}: [workloads] maps no calibration workload onto the logs' {unmapped_w}")
    compared = tuple(d for d in t.drafters if d in cal.arms.values())
    left_out = tuple(d for d in t.drafters if d not in cal.arms.values())
    if len(compared) < 2:
        raise ValueError(f"{cal.path}: [arms] maps fewer than two drafters onto the logs' {list(t.drafters)}")
    tm = t.select_drafters(compared)
    cal_sub = _subset(cal.cfg, t.workloads, compared)
    assumed = replace(cal_sub, **logs_design(tm), dense=True)
    fitted = fit_simulator(tm, cal_sub)
    kw = dict(policy=policy, seeds=seeds, n_resamples=n_resamples, seed=seed, replicates=replicates, progress=progress)
    pred_a, prim_a = predict_gain(assumed, **kw)
    pred_own, prim_own = predict_gain(replace(cal_sub, dense=True), **kw)
    pred_b, prim_b = predict_gain(fitted, **kw)
    rep = evaluate(tm, "block", [_policy(policy)], seeds, n_resamples, seed)
    extra = {}
    if all_drafters and left_out:
        fitted_all = fit_simulator(t, cal_sub)
        pred_all, _ = predict_gain(fitted_all, **kw)
        obs_all = evaluate(t, "block", [_policy(policy)], seeds, n_resamples, seed).results[policy].gain
        extra = dict(fitted_all=fitted_all, predicted_fitted_all=pred_all, observed_all=obs_all)
    return Falsification(policy, t.label, replicates, compared, left_out, replace(cal, cfg=cal_sub), assumed, fitted, pred_a,
                         pred_own, pred_b, rep.results[policy].gain, {"a": prim_a, "a_own": prim_own, "b": prim_b},
                         rep, **extra)


# ---------------------------------------------------------------- entry points

def _load(paths: Sequence[Path] | None) -> tuple[BlockTable, str]:
    if paths:
        t = load_logs(paths)
        return t, f"{tag(t.label)} logs {', '.join(str(p) for p in paths)}"
    files, said = default_inputs()
    return load_logs(files), said


def cli(paths: Annotated[Optional[list[Path]], typer.Argument(help="log files, globs or directories")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        mode: Annotated[str, typer.Option(help="block | trajectory (dense logs)")] = "block",
        seeds: Annotated[int, typer.Option(help="number of seeded prompt orders to average over")] = 3,
        resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 1000,
        seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0) -> None:
    """Replay every drafter-selection policy on block logs, with 95% bootstrap CIs over prompt clusters.

    Policies: best_fixed (the primary), workload_oracle, per_block_oracle (hindsight), every policy of
    bandit/policies.py; trajectory_oracle (the shortest path) in trajectory mode. One accounting:
    tokens per target pass (nothing counted past an output's end); block mode meets the block set B
    (dense logs: the primary's own trajectory starts), trajectory mode each policy's own blocks.

    --json prints {policy: {"tokens_per_pass", "tokens_per_pass_ci", "gain_vs_best_fixed", "gain_ci",
    "regret_vs_best_fixed", "regret_ci", "regret_unit", "tokens_per_s_model", "tokens_per_s_model_ci",
    "mean_accepted", "ci" (mean accepted's), "block_set", ...}}.

    PATHS default to the newest measured campaign under runs/ (else the shipped simulated one).
    """
    try:
        t, said = _load(paths)
        rep = evaluate(t, mode, None, tuple(range(seeds)), resamples, seed)
    except (LogError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if json_out:
        typer.echo(json.dumps(rep.to_json(), sort_keys=True))
    else:
        typer.echo(said)
        typer.echo(rep.summary())


def default_out(paths: Sequence[str | Path]) -> Path | None:
    """Where `main` writes: core.txt beside the campaign it describes (<run dir>/core.txt; the default campaign's
    when no PATHS are given); nowhere for several runs pooled."""
    from bandit.logs import default_inputs, output_path
    return output_path(paths or default_inputs()[0], "core.txt")


def multi_sequence_lines(t: BlockTable, n_resamples: int, seed: int, sizes: Sequence[int] = (1, 4),
                         progress: bool = False) -> list[str]:
    """[MODEL] lines: spec-select deciding every sequence's draft jointly vs every sequence on the primary."""
    g = tag(t.label)
    p = trajectory.primary(t)
    mode = "trajectory" if t.dense else "block"
    strata = _strata(t)
    out = []
    for n in sizes:
        a = multi_sequence_replay(t, SpecSelect(random_state=seed), n, mode, progress=progress)
        b = multi_sequence_replay(t, None, n, mode, fixed=p, progress=progress)
        slower = ((a.tokens / a.ms) < (b.tokens / b.ms)).astype(float)
        cols = np.column_stack([a.tokens, a.share, b.tokens, b.share, slower, np.ones(t.n_prompts)])

        def stat(T):
            return np.column_stack([1000 * T[:, 0] / T[:, 1], 1000 * T[:, 2] / T[:, 3],
                                    (T[:, 0] / T[:, 1]) / (T[:, 2] / T[:, 3]), T[:, 4] / T[:, 5]])
        v, boot, _ = boot_totals(cols, stat, strata, n_resamples, seed, jackknife=False)
        iv = [interval(v[j], boot[:, j], None, "percentile", "prompt", seed) for j in range(4)]
        blocks = ("each sequence along its own trajectory" if mode == "trajectory" else f"block set {block_set_text(t)}")
        out.append(f"[MODEL] {n} sequence(s) per step from the {g} logs ({blocks}; timing from the manifest; tokens "
                   f"counted to each output's end), tokens/s, 95% CI over prompt clusters: spec_select "
                   f"{_num(iv[0], '.1f')}, all on {t.drafters[p]} (the primary) {_num(iv[1], '.1f')}, ratio "
                   f"{_num(iv[2], '.3f')}x; share of prompts slower than all on {t.drafters[p]} (their own tokens/s): "
                   f"{_pct(iv[3]).replace('+', '')} (the 10% rule binds expected rates at each step, not realised ones)")
    return out


def hedge_slope_line(t: BlockTable, order_seeds: int = ORDER_SEEDS, progress: bool = False) -> str:
    """[label] the full-information Hedge regret slope, with its order-seed interval."""
    slopes = np.array([regret_curve(t, Hedge(random_state=s), np.random.default_rng(s).permutation(t.n_prompts))[2]
                       for s in tqdm(range(order_seeds), desc="Hedge regret over prompt orders", disable=not progress,
                                     file=sys.stderr, leave=False)])
    ok = slopes[np.isfinite(slopes)]
    if ok.size == 0:
        return f"{tag(t.label)} full-information Hedge (hedge_stream): regret slope undefined (too few blocks)"
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return (f"{tag(t.label)} full-information Hedge (hedge_stream) on {block_set_text(t)}: log-log slope of its "
            f"pseudo-regret (tokens) against the best fixed drafter in hindsight over blocks, mean "
            f"{ok.mean():.2f}, 95% order-seed interval [{lo:.2f}, {hi:.2f}] (2.5th-97.5th percentile over "
            f"{ok.size} seeded prompt orders, policy seed = order seed: the spread over orders, not a "
            f"bootstrap); < 1 is sublinear")


def main(paths: Sequence[str] = (), seeds: Sequence[int] = (0, 1, 2), n_resamples: int = 1000, seed: int = 0,
         out: str | Path | None = "auto", order_seeds: int = ORDER_SEEDS, replicates: int = REPLICATES,
         progress: bool = False) -> str:
    """Print the policy replays and the falsification experiment; also write them to `out` with provenance.

    out "auto": `default_out(paths)`; None: write nothing.
    """
    from bandit.ci import code_version
    lines: list[str] = []

    def print(s) -> None:  # noqa: A001 - everything printed is also the derived output file
        lines.append(str(s))
        builtins.print(s, flush=True)

    t, said = _load([Path(p) for p in paths] or None)
    print(said)
    print(f"{tag(t.label)} {t.summary()}")
    print(evaluate(t, "block", None, seeds, n_resamples, seed, progress).summary())
    if t.dense:
        print(evaluate(t, "trajectory", None, seeds, n_resamples, seed, progress).summary())
    print(hedge_slope_line(t, order_seeds, progress))
    if "verify_ms" in run_timing(t):
        for s in multi_sequence_lines(t, n_resamples, seed, progress=progress):
            print(s)
    if t.dense:
        print(falsify(t, seeds=seeds, n_resamples=n_resamples, seed=seed, replicates=replicates,
                      progress=progress).summary())
    else:
        print(f"{tag(t.label)} falsification skipped: it needs a dense log (see bandit/core.py falsify)")
    print("inputs: " + ", ".join(f"{s.path} sha256:{s.sha256}" for s in t.sources) + f"; code {code_version()}")
    text = "\n".join(lines) + "\n"
    if out is not None:
        dest = default_out(paths) if out == "auto" else Path(out)
        if dest is None:
            builtins.print("not written (several runs pooled: pass --out FILE)")
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            builtins.print(f"wrote {dest}")
    return text


def script(paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
           out: Annotated[Optional[Path], typer.Option(help="output file (default: <run dir>/core.txt beside the one "
                                                       "run read; nothing for several runs pooled)")] = None,
           seeds: Annotated[int, typer.Option(help="seeded prompt orders to average over")] = 3,
           resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 1000,
           seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
           order_seeds: Annotated[int, typer.Option(help="prompt orders for the Hedge slope's interval")] = ORDER_SEEDS,
           replicates: Annotated[int, typer.Option(help="simulated campaigns per prediction")] = REPLICATES,
           progress: Annotated[bool, typer.Option(help="tqdm progress on stderr")] = True) -> None:
    """The policy replays and the falsification experiment -> <run dir>/core.txt (see the module docstring)."""
    t0 = time.perf_counter()
    try:
        main(paths or (), tuple(range(seeds)), resamples, seed, out if out is not None else "auto", order_seeds,
             replicates, progress)
    except (LogError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    typer.echo(f"took {time.perf_counter() - t0:.0f} s", err=True)


if __name__ == "__main__":
    from bandit.errors import run
    run(script)
