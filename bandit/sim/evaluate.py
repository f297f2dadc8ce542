"""Every policy replayed on block logs, scored in tokens per target pass with 95% CIs.

`evaluate(t, mode)`: every policy walked over the logs (bandit/policies/walk.py), prompts in seeded random
orders, per-prompt totals averaged over the seeds. One accounting throughout (docs/DESIGN.md,
"Definitions"): **tokens per target pass**, output tokens over target passes with nothing counted
past the end of an output, for every fixed drafter, every policy, the greedy per-block oracle and
the shortest-path oracle.

- block mode: every policy meets the same blocks, the block set B (`trajectory.block_mask`): on a
  dense log the primary's own trajectory starts, on a sparse log the logged behaviour trajectory's
  block starts. A block's tokens are min(accepted + 1, n - pos) on dense logs (n the output's
  length) and accepted + 1 on sparse logs, where n is unknown; tokens per pass = sum over the met
  blocks / blocks.
- trajectory mode (dense logs): each policy follows its own block boundaries (the next block starts
  at pos + accepted + 1); tokens per pass = output tokens / the policy's passes.

Per policy, each with a 95% percentile bootstrap CI over prompt clusters within workloads
(bandit/stats/bootstrap.py): tokens per pass; gain against the best fixed drafter (the primary: dense
logs, fewest passes along its own trajectory; sparse logs, highest mean accepted) in tokens per
pass; regret (per-prompt best fixed - policy sums: tokens in block mode, target passes in
trajectory mode); modelled tokens/s [MODEL] (per-prompt tokens over per-prompt modelled ms) where
the manifest has timings; the mean accepted per block as logged. Also the multi-sequence replay
(several sequences sharing one step) and the regret curve.

    python bandit/sim/evaluate.py [PATHS...]     # the block-mode table of every policy (default campaign)
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/sim/evaluate.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import math
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from tqdm import tqdm

from bandit.stats import trajectory
from bandit.stats.bootstrap import Interval, boot_totals, interval
from bandit.policies.registry import StepTime, make_policies
from bandit.logs.schema import Context, Timing
from bandit.logs.table import BlockTable
from bandit.stats.trajectory import trajectory_oracle
from bandit.policies.walk import block_rows, context_lengths, run_timing, walk

BASELINES = ("best_fixed", "workload_oracle", "per_block_oracle")


def tag(label: str) -> str:
    return f"[{label}]" if label != "UNLABELLED" else "[unlabelled]"


def pct_text(iv: Interval) -> str:
    return f"{100 * iv.value:+.1f}% [{100 * iv.lo:+.1f}, {100 * iv.hi:+.1f}]"


def num_text(iv: Interval, fmt: str = ".3f") -> str:
    return f"{iv.value:{fmt}} [{iv.lo:{fmt}}, {iv.hi:{fmt}}]"


def prompt_strata(t: BlockTable) -> np.ndarray:
    strata = np.zeros(t.n_prompts, np.int64)
    strata[t.prompt] = t.workload
    return strata


def block_set_text(t: BlockTable, mode: str = "block") -> str:
    """Which blocks a replay of `t` in `mode` meets, in words."""
    if mode == "trajectory":
        return "each policy's own trajectory (its next block starts where its last one ends)"
    if not t.dense:
        return (
            f"B = the logged behaviour trajectory's {int(t.is_block_start.sum())} block starts (sparse log; "
            "output lengths unknown, so a block's tokens are accepted + 1)"
        )
    p = trajectory.primary(t)
    return (
        f"B = the primary {t.drafters[p]}'s own trajectory starts, {int(trajectory.block_mask(t).sum())} blocks "
        f"(dense log of {t.n_records} positions; a block's tokens are min(accepted + 1, n - pos))"
    )


# ---------------------------------------------------------------- replay loop


@dataclass(frozen=True)
class Trace:
    """One policy's pass over the logs: one row per block it met (B rows), in the order met."""

    policy: str
    row: np.ndarray  # (B,) int64: record index in the table
    chosen: np.ndarray  # (B,) int64: drafter index
    cut: np.ndarray  # (B,) int64: cut length L, -1 when the draft was verified whole
    reward: np.ndarray  # (B,) float64: accepted tokens of the chosen (cut) draft
    full_information: bool = False


def run_policy(
    t: BlockTable, policy, mode: str = "block", prompt_order: np.ndarray | None = None, timing: Timing | None = None
) -> Trace:
    """Replay `policy` over `t` through `walk.walk` (the one loop, and its feedback model)."""
    rows, chosen, cut, reward = walk(t, policy, mode, prompt_order, timing)
    return Trace(policy.name, rows, chosen, cut, reward, bool(policy.full_information))


def trace_tokens(t: BlockTable, tr: Trace, rem: np.ndarray | None = None) -> np.ndarray:
    """(B,) output tokens each met block produced: min(reward + 1, n - pos) on dense logs (nothing past the
    output's end), reward + 1 on sparse logs (n unknown)."""
    rem = trajectory.remaining(t) if rem is None else rem
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
        picks = {
            "best_fixed": np.full(len(rows), p),
            "workload_oracle": best_w[t.workload[rows]],
            "per_block_oracle": A.argmax(1),
        }
        neg = np.full(len(rows), -1)
        return {k: Trace(k, rows, c.astype(np.int64), neg, A[np.arange(len(rows)), c]) for k, c in picks.items()}
    trajectory.require_dense(t)
    starts = trajectory.fixed_starts(t)
    passes = trajectory.fixed_passes(t, starts)  # (P, D)
    out = {}
    rows = np.flatnonzero(starts[:, p])
    out["best_fixed"] = Trace(
        "best_fixed", rows, np.full(len(rows), p, np.int64), np.full(len(rows), -1), t.accepted[rows, p].astype(float)
    )
    wl_of = t.workload[trajectory.prompt_rows(t)[0]]
    pw = np.zeros((len(t.workloads), len(t.drafters)))
    np.add.at(pw, wl_of, passes)
    best_w = pw.argmin(1)  # fewest passes, first on ties
    out["workload_oracle"] = _greedy_trajectory(t, best_w[t.workload], "workload_oracle")
    out["per_block_oracle"] = _greedy_trajectory(t, t.accepted.argmax(1), "per_block_oracle")
    return out


def _greedy_trajectory(t: BlockTable, pick: np.ndarray, name: str) -> Trace:
    """Trajectory that runs drafter pick[r] at every block start r, all prompts at once."""
    rows = np.flatnonzero(trajectory.walk(t, lambda r: t.accepted[r, pick[r]])[0])
    c = pick[rows].astype(np.int64)
    return Trace(name, rows, c, np.full(len(rows), -1), t.accepted[rows, c].astype(float))


# ---------------------------------------------------------------- modelled time


def step_ms(t: BlockTable, tr: Trace, timing: Timing) -> np.ndarray | None:
    """(B,) modelled wall ms of each block of a trace: the live phase's timing model where the table carries one
    (bandit/live/timingmodel.py), else the manifest's timing; None without either. Verify time of the verified draft
    tokens + 1, plus the chosen drafter's call. Full-information learners need every drafter's draft verified at
    every block (panoramic feedback): every call and a union verification of D drafts (`verify_batch_ms`, else D
    separate passes; the timing model: all drafts' tokens in one forward). spec-select also pays its lookups."""
    D = len(t.drafters)
    look = np.array([d in timing.lookup for d in t.drafters], bool)
    m = t.timing_model  # the live phase's timing model where attached: the one model of every verdict
    if m is not None:
        union = tr.full_information and tr.policy != "spec_select"
        n = t.draft_len[tr.row].sum(1) if union else np.where(tr.cut >= 0, tr.cut, t.draft_len[tr.row, tr.chosen])
        return m.steps_ms(tr.chosen, n, t.draft_len[tr.row], np.full(D, union) | (look & (tr.policy == "spec_select")))
    if not timing.measured:
        return None
    st = StepTime.from_timing(t.drafters, look, timing)
    n = np.where(tr.cut >= 0, tr.cut, t.draft_len[tr.row, tr.chosen])
    if tr.full_information and tr.policy != "spec_select":
        k1 = st.verify(float(t.draft_len.max()) + 1)
        union = np.interp(D, timing.batch_drafts, timing.batch_ms) if timing.batch_ms else D * k1
        return np.full(len(tr.row), union + st.drafter_ms.sum())
    calls = st.drafter_ms[tr.chosen]
    if tr.policy == "spec_select":
        calls = np.where(look[tr.chosen], 0.0, calls) + st.drafter_ms[look].sum()
    return st.verify(n + 1.0) + calls


def regret_curve(
    t: BlockTable, policy, order: np.ndarray | None = None, checkpoints: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
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
    choose, update, DL = policy.choose, policy.update, context_lengths(t)
    for i, r in enumerate(rows.tolist()):
        ctx = Context(wl[i], pr[i], ps[i], nanD, nanF, DL[r])
        d = choose(ctx)
        w = np.asarray(policy.w_)
        exp_r[i] = w @ tau[i] / w.sum()
        update(ctx, int(d), A[i], allobs)
    T = np.asarray(
        checkpoints
        if checkpoints is not None
        else np.unique(np.geomspace(min(100, max(len(rows) // 4, 1)), max(len(rows), 1), 8).astype(int))
    )
    reg = np.cumsum(tau, 0).max(1)[T - 1] - np.cumsum(exp_r)[T - 1]
    ok = reg > 0
    slope = float(np.polyfit(np.log(T[ok]), np.log(reg[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")
    return T, reg, slope


# ---------------------------------------------------------------- evaluation

TOTALS = ("tokens", "passes", "accepted", "ms")  # per-prompt columns of PolicyResult.totals


@dataclass(frozen=True)
class PolicyResult:
    """One policy on one table, averaged over seeded prompt orders; 95% CIs over prompt clusters."""

    name: str
    label: str
    mode: str  # block | trajectory
    tokens_per_pass: Interval  # the headline: output tokens / target passes (nothing past an output's end)
    gain: Interval  # tokens per pass / best fixed's - 1
    regret: Interval  # block mode: best fixed - policy tokens; trajectory mode: policy - best fixed passes
    regret_unit: str  # "tokens" | "target passes"
    tokens_per_s: Interval | None  # [MODEL] per-prompt tokens / per-prompt modelled ms; None without timing
    mean_accepted: Interval | None  # accepted tokens per met block as logged (None for the shortest path)
    n_blocks: float  # blocks met, seed average
    totals: np.ndarray = field(default=None, repr=False, compare=False)  # (P, 4) TOTALS per prompt, seed average

    def to_json(self) -> dict:
        def pair(iv):
            return (None, [None, None]) if iv is None else (json_num(iv.value), [json_num(iv.lo), json_num(iv.hi)])

        tpp, tpp_ci = pair(self.tokens_per_pass)
        g, g_ci = pair(self.gain)
        reg, reg_ci = pair(self.regret)
        tps, tps_ci = pair(self.tokens_per_s)
        ma, ma_ci = pair(self.mean_accepted)
        c = self.tokens_per_pass
        return {
            "tokens_per_pass": tpp,
            "tokens_per_pass_ci": tpp_ci,
            "gain_vs_best_fixed": g,
            "gain_ci": g_ci,
            "gain_unit": "tokens per target pass",
            "regret_vs_best_fixed": reg,
            "regret_ci": reg_ci,
            "regret_unit": self.regret_unit,
            "tokens_per_s_model": tps,
            "tokens_per_s_model_ci": tps_ci,
            "mean_accepted": ma,
            "ci": ma_ci,
            "n_blocks": self.n_blocks,
            "label": self.label,
            "mode": self.mode,
            "ci_method": c.method,
            "ci_unit": c.unit,
            "n_resamples": c.n_resamples,
            "ci_seed": c.seed,
        }


def json_num(x: float) -> float | None:
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
    primary_rule: str = ""  # how the best fixed drafter (the primary) was chosen
    ms_source: str = "the manifest's timing"  # what the tok/s [MODEL] column prices blocks with

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
        head = (
            "tokens/pass = the met blocks' tokens / blocks"
            if self.mode == "block"
            else "tokens/pass = output tokens / the trajectory's target passes"
        )
        regret = (
            "regret = best fixed - policy tokens over the same blocks, summed over prompts"
            if self.mode == "block"
            else "regret = policy - best fixed target passes, summed over prompts"
        )
        lines = [
            f"{g} policy replay, {self.mode} mode; blocks: {self.block_set}",
            f"  {self.n_prompts} prompts, prompt orders seeded {list(self.seeds)} (per-prompt totals averaged "
            f"over them); best fixed = the primary {self.best_fixed} ({self.primary_rule}); {head}; {regret}; tok/s "
            f"[MODEL] from {self.ms_source}; accepted/block as logged. 95% CIs: {self.n_resamples}-resample percentile "
            f"bootstrap over prompt clusters within workloads, seed {self.seed}",
            f"{'':{len(g) + 1}s}{'policy':18s}{'tokens/pass':>22s}{'gain vs best fixed':>26s}{f'regret ({unit})':>30s}"
            f"{'tok/s [MODEL]':>25s}{'accepted/block':>22s}",
        ]
        for k, r in self.results.items():
            tp, gn, rg = r.tokens_per_pass, r.gain, r.regret
            tps = f"{num_text(r.tokens_per_s, '.1f'):>25s}" if r.tokens_per_s is not None else f"{'-':>25s}"
            ma = f"{num_text(r.mean_accepted):>22s}" if r.mean_accepted is not None else f"{'-':>22s}"
            lines.append(f"{g} {k:18s}{num_text(tp):>22s}{pct_text(gn):>26s}{num_text(rg, '.1f'):>30s}{tps}{ma}")
        return "\n".join(lines)


def _totals(t: BlockTable, trs: Sequence[Trace], timing: Timing, rem: np.ndarray | None) -> np.ndarray:
    """(P, 4) per-prompt TOTALS of traces, averaged over them (seeds); ms NaN without timing."""
    out = np.zeros((len(trs), t.n_prompts, len(TOTALS)))
    for i, tr in enumerate(trs):
        pr = t.prompt[tr.row]
        out[i, :, 0] = np.bincount(pr, trace_tokens(t, tr, rem), minlength=t.n_prompts)
        out[i, :, 1] = np.bincount(pr, minlength=t.n_prompts)
        out[i, :, 2] = np.bincount(pr, tr.reward, minlength=t.n_prompts)
        ms = step_ms(t, tr, timing)
        out[i, :, 3] = np.nan if ms is None else np.bincount(pr, ms, minlength=t.n_prompts)
        if ms is not None and t.prefill_ms is not None:  # the timing model's per-prompt prefill
            out[i, :, 3] += np.where(out[i, :, 1] > 0, t.prefill_ms, 0.0)
    return out.mean(0)


def _intervals(
    tot: np.ndarray, bf: np.ndarray, strata: np.ndarray, mode: str, n_resamples: int, seed: int, accepted: bool = True
) -> dict[str, Interval | None]:
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
    return {
        "tokens_per_pass": ivs[0],
        "gain": ivs[1],
        "regret": ivs[2],
        "tokens_per_s": ivs[3] if timed else None,
        "mean_accepted": ivs[4] if accepted else None,
    }


def evaluate(
    t: BlockTable,
    mode: str = "block",
    policies: Sequence | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    n_resamples: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> PolicyReport:
    """Replay every policy (default: all of bandit/policies/registry.py) plus the hindsight baselines.

    Per seed s the prompts come in the order rng(s).permutation(P) and each policy gets
    random_state = s; per-prompt totals are averaged over seeds before the bootstrap. Tokens per
    target pass is the one accounting of every row (module docstring); in trajectory mode the
    shortest-path oracle (`trajectory_oracle`) is the last row, and every row lies at or below it.
    """
    if mode not in ("block", "trajectory"):
        raise ValueError(f"mode must be 'block' or 'trajectory', got {mode!r}")
    if mode == "trajectory" and not t.dense:
        raise ValueError(
            "trajectory mode needs a dense log (a record at every position of every prompt); "
            "this one is sparse: use --mode block"
        )
    timing = run_timing(t)
    strata = prompt_strata(t)
    rem = trajectory.remaining(t)
    hind = hindsight_traces(t, mode)
    traces: dict[str, list[Trace]] = {k: [v] for k, v in hind.items()}
    jobs = [
        (s, pol)
        for s in seeds
        for pol in (make_policies(random_state=s) if policies is None else [p.clone(random_state=s) for p in policies])
    ]
    for s, pol in tqdm(jobs, desc=f"{t.label} {mode} replay", disable=not progress, file=sys.stderr, leave=False):
        traces.setdefault(pol.name, []).append(
            run_policy(t, pol, mode, np.random.default_rng(s).permutation(t.n_prompts), timing)
        )
    bf = _totals(t, traces["best_fixed"], timing, rem)
    unit = "tokens" if mode == "block" else "target passes"
    results = {}
    for name, trs in traces.items():
        tot = _totals(t, trs, timing, rem)
        iv = _intervals(tot, bf, strata, mode, n_resamples, seed)
        results[name] = PolicyResult(
            name,
            t.label,
            mode,
            iv["tokens_per_pass"],
            iv["gain"],
            iv["regret"],
            unit,
            iv["tokens_per_s"],
            iv["mean_accepted"],
            float(tot[:, 1].sum()),
            tot,
        )
    if mode == "trajectory":
        o = trajectory_oracle(t)
        tot = np.column_stack([o.tokens, o.passes, np.full(t.n_prompts, np.nan), np.full(t.n_prompts, np.nan)]).astype(
            float
        )
        iv = _intervals(tot, bf, strata, mode, n_resamples, seed, accepted=False)
        results["trajectory_oracle"] = PolicyResult(
            "trajectory_oracle",
            t.label,
            mode,
            iv["tokens_per_pass"],
            iv["gain"],
            iv["regret"],
            unit,
            None,
            None,
            float(o.passes.sum()),
            tot,
        )
    return PolicyReport(
        t.label,
        mode,
        tuple(seeds),
        n_resamples,
        seed,
        results,
        tuple((s.path, s.sha256) for s in t.sources),
        t.n_prompts,
        block_set_text(t, mode),
        t.drafters[trajectory.primary(t)],
        trajectory.rule_name(t),
        "the timing model fitted on the live phase [MODEL, timing fitted on MEASURED live decodes]"
        if t.timing_model is not None
        else "the manifest's timing",
    )


def gain_of(totals: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], n_resamples: int, seed: int) -> Interval:
    """Gain in tokens per pass of pooled per-prompt totals: [(policy totals (P, 4), best fixed totals (P, 4),
    strata (P,)), ...] of one or several campaigns, one prompt-cluster bootstrap over all their prompts."""
    tot = np.concatenate([a for a, _, _ in totals])
    bf = np.concatenate([b for _, b, _ in totals])
    strata = np.concatenate([s for _, _, s in totals])
    return _intervals(tot, bf, strata, "block", n_resamples, seed, accepted=False)["gain"]


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs
    from bandit.live.primary import attach_own

    def body(files, said: str) -> None:
        print(said, evaluate(attach_own(load_logs(files)), "block", None, (0,), 1000, 0).summary(), sep="\n")

    demo(body, "Every policy replayed in block mode (one prompt order, 1000 resamples).")
