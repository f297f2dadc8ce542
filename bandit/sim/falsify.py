"""The simulation the logs can falsify: predicted policy gains from a calibration and from a fit, against the replay.

`falsify(t)`: the gain of contextual Thompson sampling over the best fixed drafter predicted by
(a) the research README's own acceptance table (bandit/sim/calibration_assumed.toml; the README is
docs/seeds/research-readme.txt) and (b) the simulator fitted to the logs, against (c) the replay
on the logs; each campaign, simulated or logged, scored by the same `evaluate(., "block", [policy])`
of bandit/sim/evaluate.py (see `falsify`).

    python bandit/sim/falsify.py [PATHS...]     # the falsification table (default campaign)
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/sim/falsify.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import json
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from bandit.stats import trajectory
from bandit.stats.bootstrap import Interval
from bandit.logs.errors import InputError
from bandit.sim.evaluate import PolicyReport, evaluate, gain_of, pct_text, prompt_strata, tag
from bandit.policies.registry import make_policies
from bandit.sim.simulate import SimConfig, simulate_table, true_mean_accepted, true_tokens_per_pass
from bandit.logs.table import BlockTable
from bandit.policies.walk import run_timing

CALIBRATION = Path(__file__).with_name("calibration_assumed.toml")
REPLICATES = 4  # simulated campaigns per prediction


@dataclass(frozen=True)
class Calibration:
    """A calibration file read: the SimConfig, and how its arms and workloads map onto the logs'."""

    cfg: SimConfig  # at the file's design; drafters and workloads named as in the logs
    arms: dict[str, str]  # the file's drafter -> the logs' drafter
    workloads: dict[str, str]  # the file's workload -> the logs' workload
    table: np.ndarray | None  # (W, D) mean accepted per block the file states (cfg's order), else None
    source: dict
    path: str


def _cal_error(path: Path, msg: str) -> InputError:
    return InputError(f"{path}: {msg}")


def unmapped(t, cal: Calibration) -> str | None:
    """Why the calibration cannot be compared with the logs `t` (its [workloads] or [arms] do not map onto
    them), or None: the mapping is an assumption fixed before the comparison, never guessed here."""
    unmapped_w = [w for w in t.workloads if w not in cal.workloads.values()]
    if unmapped_w:
        return f"{Path(cal.path).name}: [workloads] maps no calibration workload onto the logs' {unmapped_w}"
    if sum(d in cal.arms.values() for d in t.drafters) < 2:
        return f"{Path(cal.path).name}: [arms] maps fewer than two drafters onto the logs' {list(t.drafters)}"
    return None


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
        sim.setdefault("drafter_accept", (0.5,) * len(drafters))  # unused: token_accept overrides them
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
    return replace(
        cfg, ranking_flips=False, token_accept=tuple(tuple(round(float(x), 6) for x in row) for row in (lo + hi) / 2)
    )


def logs_design(t: BlockTable) -> dict:
    """The logs' design as SimConfig keys: prompts per workload, k and, on dense logs, every prompt's output length
    (workload-major; a workload with another number of prompts gets a seeded resample of its lengths)."""
    W = len(t.workloads)
    per = max(int(np.round(t.n_prompts / W)), 1)
    k = int(run_timing(t).k)
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    if not t.dense:  # the output lengths are unknown: the median last logged position + 1
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
    cfg = replace(
        base,
        workloads=t.workloads,
        drafters=t.drafters,
        **logs_design(t),
        dense=True,
        ranking_flips=False,
        token_accept=((0.5,) * D,) * W,
        **_resize(base, W, D),
    )
    if t.dense:
        return solve_token_accept(cfg, fixed_tokens_per_pass(t))
    target = np.zeros((W, D))
    np.add.at(target, t.workload, t.accepted)
    target /= np.bincount(t.workload, minlength=W)[:, None]
    lo, hi = np.full(target.shape, 1e-4), np.full(target.shape, 1 - 1e-4)
    for _ in range(40):  # true_mean_accepted is increasing in the per-token acceptance
        mid = (lo + hi) / 2
        m = true_mean_accepted(replace(cfg, token_accept=tuple(map(tuple, mid))))
        lo, hi = np.where(m < target, mid, lo), np.where(m < target, hi, mid)
    return replace(cfg, token_accept=tuple(tuple(round(float(x), 6) for x in row) for row in (lo + hi) / 2))


def _resize(base: SimConfig, W: int, D: int) -> dict:
    """Per-workload / per-drafter knobs of `base` resized to the logs' W and D (cycled)."""

    def cyc(x, n):
        return tuple(x[i % len(x)] for i in range(n))

    return {
        "drafter_accept": cyc(base.drafter_accept, D),
        "empty_rate": cyc(base.empty_rate, D),
        "drafter_ms": cyc(base.drafter_ms, D),
        "workload_shift": cyc(base.workload_shift, W),
        "signal": cyc(base.signal, W),
        "conf_base": cyc(base.conf_base, W),
        "behaviour": min(base.behaviour, D - 1),
    }


def _subset(cfg: SimConfig, workloads: Sequence[str], drafters: Sequence[str]) -> SimConfig:
    """`cfg` restricted to some of its workloads and drafters (every per-workload / per-drafter knob with them)."""
    wi = [cfg.workloads.index(w) for w in workloads]
    di = [cfg.drafters.index(d) for d in drafters]
    pick = lambda x, ix: tuple(x[i] for i in ix)
    ta = None if cfg.token_accept is None else tuple(pick(cfg.token_accept[w], di) for w in wi)
    return replace(
        cfg,
        workloads=tuple(workloads),
        drafters=tuple(drafters),
        token_accept=ta,
        out_lens=None,
        drafter_accept=pick(cfg.drafter_accept, di),
        empty_rate=pick(cfg.empty_rate, di),
        drafter_ms=pick(cfg.drafter_ms, di),
        workload_shift=pick(cfg.workload_shift, wi),
        signal=pick(cfg.signal, wi),
        conf_base=pick(cfg.conf_base, wi),
        behaviour=min(cfg.behaviour, len(di) - 1),
    )


# ---------------------------------------------------------------- the falsification


def _policy(name: str):
    pols = {p.name: p for p in make_policies()}
    if name not in pols:
        raise ValueError(f"no policy named {name!r}; policies: {', '.join(pols)}")
    return pols[name]


def predict_gain(
    cfg: SimConfig,
    policy: str = "thompson_ctx",
    seeds: Sequence[int] = (0, 1, 2),
    n_resamples: int = 1000,
    seed: int = 0,
    replicates: int = REPLICATES,
    progress: bool = False,
) -> tuple[Interval, tuple[str, ...]]:
    """[SIM] gain of `policy` over best fixed in tokens per pass on `replicates` dense campaigns simulated from
    `cfg`, each scored by `evaluate(campaign, "block", [policy])` exactly as the logs are (its own primary, its
    own block set); (pooled gain over one prompt-cluster bootstrap of all replicates' prompts, each
    replicate's best fixed drafter).

    An online learner's gain depends on its horizon (exploration is paid once per campaign), so each
    replicate is a whole campaign of the given design, replayed on its own.
    """
    pol = _policy(policy)
    parts, prim = [], []
    for rep in tqdm(
        range(replicates), desc=f"[SIM] campaigns ({policy})", disable=not progress, file=sys.stderr, leave=False
    ):
        ts = simulate_table(replace(cfg, seed=cfg.seed + 1000 * rep, dense=True))
        r = evaluate(ts, "block", [pol], seeds, n_resamples, seed)
        parts.append((r.results[policy].totals, r.results["best_fixed"].totals, prompt_strata(ts)))
        prim.append(r.best_fixed)
    return gain_of(parts, n_resamples, seed), tuple(prim)


@dataclass(frozen=True)
class Falsification:
    """(a) the research README's table's prediction, (b) the fitted simulator's, (c) the logs' replay: like for like."""

    policy: str
    label: str
    replicates: int  # simulated campaigns per prediction
    compared: tuple[str, ...]  # the logs' drafters with an arm in the calibration
    left_out: tuple[str, ...]  # the logs' drafters without one
    calibration: Calibration
    assumed: SimConfig  # the calibration at the logs' design (compared drafters)
    fitted: SimConfig  # fitted to the logs' compared drafters
    predicted_assumed: Interval  # [SIM] (a)
    predicted_assumed_own: Interval  # [SIM] (a) at the calibration's own design
    predicted_fitted: Interval  # [SIM] (b)
    observed: Interval  # (c), the logs' label
    primaries: dict  # prediction -> the best fixed drafter of each simulated campaign
    observed_report: PolicyReport
    fitted_all: SimConfig | None = None  # every drafter of the logs (when some were left out)
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
            + ", ".join(f"{ms[d]}={d}" for d in self.compared)
            + "); left out: "
            + (", ".join(self.left_out) + " (no arm in the calibration)" if self.left_out else "none")
            + "".join(
                f"; calibration arm {k} (= {v}) has no drafter in the logs"
                for k, v in cal.arms.items()
                if v not in self.compared
            )
            + "; workloads "
            + ", ".join(f"{mw[w]}={w}" for w in a.workloads),
        ]
        rows = [
            (
                "(a) the research README's table" if cal.source else "(a) the assumed calibration",
                "[SIM]",
                self.predicted_assumed,
                "a",
            ),
            ("(b) simulator fitted to the logs", "[SIM]", self.predicted_fitted, "b"),
            ("(c) replay on the logs", g, self.observed, None),
        ]
        for name, lab, iv, key in rows:
            bf = (
                f"   best fixed in the campaigns: {', '.join(self.primaries[key])}"
                if key
                else f"   best fixed: {self.observed_report.best_fixed}; {self.observed_report.block_set}"
            )
            lines.append(f"  {name:34s}{lab:13s}{pct_text(iv):>26s}{bf}")
        for name, _, iv, _ in rows[:2]:
            verdict = "EXCLUDES" if self.excludes(iv) else "does not exclude"
            lines.append(f"  {g} the logs' CI {verdict} prediction {name.split()[0]} ({100 * iv.value:+.1f}%)")
        o = self.predicted_assumed_own
        lines.append(
            f"  (a) at the calibration's own design ({own.n_prompts} prompts per workload x {own.out_len} "
            f"tokens, k={own.k}, assumed: the README states neither): [SIM] {pct_text(o)}, best fixed in the "
            f"campaigns: {', '.join(self.primaries['a_own'])}. The research README's own prediction, quoted "
            f"from it: {cal.source.get('readme_prediction', '+19.4% for contextual Thompson sampling')}; "
            "it came from a simulation that assumed ranking flips between workloads, which the README's "
            "table does not show"
        )
        if self.predicted_fitted_all is not None:
            lines.append(
                f"  on every drafter of the logs ({', '.join(self.fitted_all.drafters)}; no README "
                f"prediction there): (b) fitted [SIM] {pct_text(self.predicted_fitted_all)}, (c) replay {g} "
                f"{pct_text(self.observed_all)}; the logs' CI "
                f"{'EXCLUDES' if self.excludes(self.predicted_fitted_all, self.observed_all) else 'does not exclude'}"
                " prediction (b)"
            )
        lines.append(
            f"  [SIM] simulation inputs (point values, not results: no CI): per-token acceptance solved from "
            f"{src}'s mean accepted table at its assumed design: " + _fmt_accept(own)
        )
        lines.append(
            "  [SIM] simulation inputs (point values, not results: no CI): per-token acceptance fitted to the "
            "logs' tokens per pass per workload x drafter: " + _fmt_accept(self.fitted)
        )
        return "\n".join(lines)


def _fmt_accept(cfg: SimConfig) -> str:
    return "; ".join(
        f"{w}: " + ", ".join(f"{d} {x:.3f}" for d, x in zip(cfg.drafters, row))
        for w, row in zip(cfg.workloads, cfg.token_accept)
    )


def falsify(
    t: BlockTable,
    calibration: str | Path = CALIBRATION,
    policy: str = "thompson_ctx",
    seeds: Sequence[int] = (0, 1, 2),
    n_resamples: int = 1000,
    seed: int = 0,
    replicates: int = REPLICATES,
    all_drafters: bool = True,
    progress: bool = False,
) -> Falsification:
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
        raise ValueError(
            "the falsification needs a dense log (predictions and replay are scored on the primary's "
            "block set, which a sparse log does not have)"
        )
    cal = read_calibration(calibration)
    why = unmapped(t, cal)
    if why:
        raise ValueError(why)
    compared = tuple(d for d in t.drafters if d in cal.arms.values())
    left_out = tuple(d for d in t.drafters if d not in cal.arms.values())
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
    return Falsification(
        policy,
        t.label,
        replicates,
        compared,
        left_out,
        replace(cal, cfg=cal_sub),
        assumed,
        fitted,
        pred_a,
        pred_own,
        pred_b,
        rep.results[policy].gain,
        {"a": prim_a, "a_own": prim_own, "b": prim_b},
        rep,
        **extra,
    )


# ---------------------------------------------------------------- entry points


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        print(said)
        print(falsify(t).summary())

    demo(body, "The calibrated simulation and whether the logs falsify it.")
