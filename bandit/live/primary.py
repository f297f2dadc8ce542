"""The primary by measured speed: a run's live phase attached to its table, and what it says of the fixed drafters.

`attach(t, run_dir)` reads the run's live.jsonl (bandit/live/livelog.py) and, when it holds `fixed:<d>`
decodes of every drafter of the table, hangs on the table (docs/DESIGN.md, "Which blocks"):

- the per-prompt matrices `live_tokens` / `live_ms` (P, D): fixed:d's output tokens and wall ms on each
  live-sampled prompt, 0 elsewhere. The primary is then the fixed drafter with the highest measured
  tokens/s pooled over the live sample (output tokens summed / wall time summed), re-chosen from the
  resampled sums in every resample (`trajectory.choose_primary`); the rule is named
  `trajectory.MEASURED_RULE`;
- the run's timing model (bandit/live/timingmodel.py) and each prompt's prefill term: the cost model of
  every speedup verdict.

Without a live phase the table is returned as it is (the token proxy: most tokens per target pass).
Also here: the fixed drafters' measured tokens/s per workload (`fastest_by_workload`, `primary_lines`) and
the rho/alpha cost model's error against the live phase beside the timing model's (`model_check_lines`).

    python bandit/live/primary.py [PATHS...]     # the default campaign's primary, per workload, and the models' errors
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/live/primary.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

from dataclasses import replace
from pathlib import Path

import numpy as np

from bandit.stats import trajectory
from bandit.stats.costmodel import costs_for
from bandit.live.livelog import LIVE_FILE, load_live
from bandit.stats.resample import count_chunks
from bandit.logs.schema import Timing
from bandit.logs.table import BlockTable
from bandit.live.timingmodel import LABEL, fit_live, prefill_per_prompt


def attach(t: BlockTable, run_dir: Path | str | None) -> BlockTable:
    """t with its run's live phase attached (module docstring); t unchanged when run_dir is None or has no
    live.jsonl. A live phase lacking fixed:<d> for some drafter of t keeps the token proxy, and the rule says why.
    A malformed live.jsonl raises bandit.logs.LogError (located by line)."""
    if run_dir is None or not t.drafters:
        return t
    if not (Path(run_dir) / LIVE_FILE).is_file():
        return modelled(t)
    live = load_live(Path(run_dir), t)
    have = {r["config"] for r in live}
    missing = [d for d in t.drafters if f"fixed:{d}" not in have]
    if missing:
        why = f"the live phase has no fixed:{', fixed:'.join(missing)} decodes"
        m = modelled(t)
        return replace(m, primary_rule=f"{trajectory.rule_name(m)}; {why}")
    if not t.dense:  # the model's pass sizes come from the walk of each live decode on the dense log
        m = modelled(t)
        why = "the live phase's timing model needs the dense log it was decoded beside"
        return replace(m, primary_rule=f"{trajectory.rule_name(m)}; {why}")
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    P, D = t.n_prompts, len(t.drafters)
    tokens, ms, plen = np.zeros((P, D)), np.zeros((P, D)), np.zeros(P)
    col = {f"fixed:{d}": j for j, d in enumerate(t.drafters)}
    mine = []  # the live decodes of this table's prompts (the run's workloads may be more)
    for r in live:
        p = index.get(f"{r['workload']}/{r['prompt_id']}")
        if p is None:  # a live prompt outside this table (a subset of the run's workloads): not in its sample
            continue
        mine.append(r)
        plen[p] = r["prompt_len"]
        j = col.get(r["config"])
        if j is not None:
            tokens[p, j] += r["tokens"]
            ms[p, j] += r["wall_ms"]
    if not ms.any():
        why = "none of the live phase's prompts is in these logs"
        return replace(t, primary_rule=f"{trajectory.rule_name(replace(t, primary_rule=''))}; {why}")
    model = run_model(t, live, mine, f"the live phase of {Path(run_dir).name}")
    wl_of = np.zeros(P, np.int64)
    wl_of[t.prompt] = t.workload
    pre = prefill_per_prompt(model, plen, wl_of, len(t.workloads))
    return replace(
        t,
        live_tokens=tokens,
        live_ms=ms,
        prefill_ms=pre,
        timing_model=model,
        primary_rule=trajectory.MEASURED_RULE,
    )


def run_model(t: BlockTable, live: list[dict], mine: list[dict], source: str):
    """The run's timing model, over t's drafters. A table that is the run's dense log fits it on its live decodes;
    one that holds only some of the run's drafters or prompts (`--drafters`, a workload subset) reloads the run's
    dense log (t.sources) and fits there, so that a subset is priced by the same model as the whole."""
    named = {d for r in live for d in (*r["calls"], *(r.get("chosen") or {}))}
    if (named <= set(t.drafters) and len(mine) == len(live)) or not t.sources:  # (in memory: what it can walk)
        return fit_live(t, mine, source)
    from bandit.logs.reader import load_logs

    return fit_live(load_logs([s.path for s in t.sources]), live, source).select(t.drafters)


def modelled(t: BlockTable) -> BlockTable:
    """A measured dense run with no live phase, but step timing measured on the run's own host (the manifest's `timing`: verification ms by
    verified tokens and each drafter's ms per call, e.g. from `sweep.py --calibrate N`): the primary is the fixed
    drafter fastest under it [MODEL], each fixed trajectory of the dense log priced block by block (one verify of
    1 + the draft's length, one call), re-chosen in every resample like a measured one. Else t as it is (the
    token proxy)."""
    m = t.manifests[0] if t.manifests else None
    timing = Timing.from_manifest(m, t.drafters)
    if (
        t.label != "MEASURED"
        or not t.dense
        or not timing.measured
        or any(d not in timing.drafter_ms for d in t.drafters)
    ):
        return t  # a simulated run's timing was never measured on any host
    starts = trajectory.fixed_starts(t)
    P, D = t.n_prompts, len(t.drafters)
    ms = np.zeros((P, D))
    for d, name in enumerate(t.drafters):
        r = starts[:, d]
        np.add.at(ms[:, d], t.prompt[r], timing.verify(1.0 + t.draft_len[r, d]) + timing.drafter_ms[name])
    tokens = np.repeat(trajectory.output_lengths(t).astype(float)[:, None], D, 1)
    return replace(t, live_tokens=tokens, live_ms=ms, primary_rule=trajectory.TIMED_RULE)


def attach_own(t: BlockTable) -> BlockTable:
    """`attach` with the run directory the table's logs lie in (none for several runs pooled)."""
    dirs = {Path(s.path).parent for s in t.sources}
    return attach(t, next(iter(dirs))) if len(dirs) == 1 else t


def detach(t: BlockTable) -> BlockTable:
    """t without its live phase: the token proxy's primary (for comparisons with campaigns that have none, such
    as the simulated ones of bandit/sim/falsify.py, which must be scored by the same rule)."""
    return replace(t, live_tokens=None, live_ms=None, prefill_ms=None, timing_model=None, primary_rule="")


def live_prompts(t: BlockTable) -> np.ndarray:
    """(P,) bool: the prompts of the live sample (every fixed drafter decoded them)."""
    return np.zeros(t.n_prompts, bool) if t.live_ms is None else (t.live_ms > 0).all(1)


def measured_rates(t: BlockTable) -> np.ndarray:
    """(W + 1, D) measured tokens/s of every fixed drafter per workload, then pooled (NaN where none decoded)."""
    W, D = len(t.workloads), len(t.drafters)
    out = np.full((W + 1, D), np.nan)
    if t.live_tokens is None:
        return out
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    for w in range(W + 1):
        m = (wl_of == w) if w < W else np.ones(t.n_prompts, bool)
        tok, ms = t.live_tokens[m].sum(0), t.live_ms[m].sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[w] = np.where(ms > 0, 1000.0 * tok / ms, np.nan)
    return out


def fastest_by_workload(t: BlockTable) -> dict[str, tuple[str, float]]:
    """{workload: (fastest fixed drafter measured live, its tokens/s)}, and "pooled" (the primary's rule); {}
    without a live phase. Ties go to the first drafter in name order, as the primary's do."""
    if t.live_tokens is None:
        return {}
    rates = measured_rates(t)
    out = {}
    for w, name in enumerate((*t.workloads, "pooled")):
        if np.isfinite(rates[w]).any():
            j = int(np.nanargmax(rates[w]))
            out[name] = (t.drafters[j], float(rates[w, j]))
    return out


def choice_shares(t: BlockTable, n_resamples: int = 2000, seed: int = 0) -> np.ndarray:
    """(D,) share of prompt-cluster resamples (within workloads, the project's stream) in which each drafter is the
    primary under t's rule: how firmly the data choose it."""
    strata = np.zeros(t.n_prompts, np.int64)
    strata[t.prompt] = t.workload
    key = trajectory.proxy_key(t)
    hits = np.zeros(len(t.drafters))
    for c in count_chunks(strata, n_resamples, seed):
        w = c.astype(float)
        p = trajectory.choose_primary(w @ key, *trajectory.live_sums(t, w))
        hits += np.bincount(p, minlength=len(t.drafters))
    return hits / max(n_resamples, 1)


def primary_lines(t: BlockTable, n_resamples: int = 2000, seed: int = 0) -> list[str]:
    """The primary, the rule that chose it, how often every resample chooses it, and each workload's fastest."""
    p = trajectory.primary(t)
    sh = choice_shares(t, n_resamples, seed)
    out = [
        f"primary: {t.drafters[p]}, the {trajectory.rule_name(t)}; re-chosen in every resample: "
        + ", ".join(f"{t.drafters[j]} {100 * sh[j]:.1f}%" for j in np.argsort(-sh) if sh[j] > 0)
        + f" of {n_resamples} (prompt clusters within workloads, seed {seed})"
    ]
    if t.live_tokens is None:
        return out
    n = int(live_prompts(t).sum())
    rates = measured_rates(t)
    fast = fastest_by_workload(t)
    if t.primary_rule.startswith(trajectory.TIMED_RULE):
        out.append(
            f"modelled tokens/s of every fixed drafter over every prompt ({n}) under the run's step timing [MODEL]:"
        )
    else:
        out.append(
            f"measured tokens/s of every fixed drafter over the live sample ({n} prompts; output tokens summed / wall "
            "time summed) [MEASURED]:"
        )
    out.append("| workload | " + " | ".join(t.drafters) + " | fastest |")
    out.append("|---|" + "---|" * (len(t.drafters) + 1))
    for w, name in enumerate((*t.workloads, "pooled")):
        cells = " | ".join("-" if not np.isfinite(x) else f"{x:.1f}" for x in rates[w])
        out.append(f"| {name} | {cells} | {fast.get(name, ('-', 0))[0]} |")
    return out


# ---------------------------------------------------------------- the two cost models against the live phase


def fixed_counts(t: BlockTable) -> tuple[np.ndarray, np.ndarray]:
    """(passes (P, D), ms of their target passes and calls (P, D)) of every fixed drafter's own trajectory walked
    on the dense log, priced by the timing model: one pass of 1 + the draft's length and one call per block."""
    m = t.timing_model
    starts = trajectory.fixed_starts(t)
    passes = trajectory.fixed_passes(t, starts)
    ms = np.zeros(passes.shape)
    for d in range(len(t.drafters)):
        r = starts[:, d]
        np.add.at(ms[:, d], t.prompt[r], m.step(1.0 + t.draft_len[r, d]) + m.call_ms[d])
    return passes, ms


def fixed_ms(t: BlockTable) -> np.ndarray:
    """(P, D) the timing model's wall ms of every fixed drafter on every prompt (prefill included), summed over
    its trajectory's blocks."""
    return t.prefill_ms[:, None] + fixed_counts(t)[1]


def model_check(t: BlockTable) -> list[dict] | None:
    """Each fixed drafter's speedup over the fastest fixed drafter on the live sample: measured, predicted by the
    timing model (dense-log walk priced by it) and by the rho/alpha model (tokens / (passes (1 + rho))), the
    latter only where the manifest has timing. None without a live phase or on a sparse log."""
    if t.live_tokens is None or t.timing_model is None or not t.dense:
        return None
    live = live_prompts(t)
    tokens = trajectory.output_lengths(t).astype(float)
    passes, _ = fixed_counts(t)
    meas = t.live_tokens[live].sum(0) / t.live_ms[live].sum(0)
    tm = tokens[live].sum() / fixed_ms(t)[live].sum(0)
    costs = costs_for(t.drafters, t.manifests[0] if t.manifests else None)
    ra = tokens[live].sum() / (passes[live].sum(0) * (1.0 + costs.rho)) if costs.source == "measured" else None
    f = int(np.argmax(meas))
    rows = []
    for j, d in enumerate(t.drafters):
        row = {"drafter": d, "fastest": t.drafters[f], "measured": float(meas[j] / meas[f])}
        row["timing_model"] = float(tm[j] / tm[f])
        row["rho_alpha"] = None if ra is None else float(ra[j] / ra[f])
        rows.append(row)
    return rows


def model_check_lines(t: BlockTable) -> list[str]:
    rows = model_check(t)
    if rows is None:
        return []
    n = int(live_prompts(t).sum())
    out = [
        f"the cost models against the live phase ({n} prompts): each fixed drafter's speedup over the fastest fixed "
        f"drafter {rows[0]['fastest']}, measured [MEASURED] and predicted from the dense log by the timing model "
        f"[{LABEL}] and by the rho/alpha model of the manifest's timing [MODEL] (error = predicted / measured - 1)",
        "| drafter | measured | timing model | error | rho/alpha model | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ra = r["rho_alpha"]
        ra = "- | -" if ra is None else f"{ra:.3f} | {100 * (ra / r['measured'] - 1):+.1f}%"
        tm = f"{r['timing_model']:.3f} | {100 * (r['timing_model'] / r['measured'] - 1):+.1f}%"
        out.append(f"| {r['drafter']} | {r['measured']:.3f} | {tm} | {ra} |")
    if rows[0]["rho_alpha"] is None:
        out.append("(no rho/alpha model: the manifest has no timing)")
    return out


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = attach_own(load_logs(files))
        print(said)
        print("\n".join(primary_lines(t) + model_check_lines(t)))
        if t.timing_model is not None:
            print(t.timing_model.describe())

    demo(body, "The primary, by which rule, and the cost models against the live phase.")
