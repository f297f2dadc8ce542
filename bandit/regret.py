"""The regret view: every policy and engine rule against the best fixed drafter in hindsight, and against the
per-block oracle's choices -> <run dir>/regret.txt, regret.png (issue 34).

For every policy (bandit/policies/registry.py) and live policy (bandit/policies/livepolicies.py, the engines' rules
among them), walked as the live engine runs it on the dense log over every prompt (`walk.live_walk`):

- tokens/s under the run's timing model [MODEL, timing fitted on MEASURED live decodes] over the best fixed drafter
  in hindsight (the fixed drafter of highest modelled tokens/s on the same prompts, re-chosen in every resample),
  per workload and pooled: a ratio below 1 is regret; where the live phase decoded the policy, the same ratio
  measured [MEASURED] (tokens summed / wall time summed over the live sample; the best fixed among the live fixed:<d>);
- its choices against the per-block oracle's (the drafter accepting most at each block the policy met, ties all
  agreeing): the agreement rate, and the tokens lost per block where it chose differently (oracle tau - its tau).

Intervals: 95% percentile bootstrap over prompt clusters resampled within workloads (bandit/stats/bootstrap.py).

    python bandit/regret.py [RUN] [--out DIR] [--resamples N] [--seed S]   # headline numbers; the files
    specbandit regret [RUN] ...                                            # the same
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/regret.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from bandit.live.livelog import load_live, policy_timing
from bandit.live.primary import attach, fixed_ms
from bandit.logs import outputs
from bandit.logs.errors import InputError
from bandit.logs.reader import load_logs
from bandit.logs.schema import FIXED, POLICY
from bandit.logs.table import BlockTable
from bandit.policies import livepolicies
from bandit.policies.registry import make_policies
from bandit.policies.walk import live_walk
from bandit.stats import trajectory
from bandit.stats.bootstrap import boot_totals, interval

RESAMPLES, SEED = 1000, 0


def policies(t: BlockTable, timing) -> dict[str, object]:
    """Every policy by name: the live policies (the engines' rules among them), then the registry's others."""
    out = {f"policy:{n}": livepolicies.make(n, t, timing) for n in livepolicies.LIVE_POLICIES}
    for p in make_policies():
        out.setdefault(f"policy:{p.name}", p)
    return out


def policy_totals(t: BlockTable, pol, timing) -> np.ndarray:
    """(P, 5) per prompt: modelled ms, blocks, blocks agreeing with the per-block oracle, blocks differing, tokens
    lost at those (oracle tau - chosen tau)."""
    m = t.timing_model
    rows, chosen, cut, _ = live_walk(t, pol, np.arange(t.n_prompts), timing)
    c = livepolicies.counts(t, rows, chosen, cut, timing, m.knots)
    ms = t.prefill_ms + c.steps @ np.asarray(m.step_ms, float) + c.calls @ m.call_ms
    tau = trajectory.block_tokens(t, rows).astype(float)
    a = np.where(cut >= 0, np.minimum(tau[np.arange(len(rows)), chosen], cut + 1), tau[np.arange(len(rows)), chosen])
    best = tau.max(1)
    agree = a >= best
    p = t.prompt[rows]
    P = t.n_prompts
    return np.column_stack(
        [
            ms,
            np.bincount(p, minlength=P),
            np.bincount(p, agree, minlength=P),
            np.bincount(p, ~agree, minlength=P),
            np.bincount(p, np.where(agree, 0.0, best - a), minlength=P),
        ]
    )


def evaluate(t: BlockTable, live: list[dict] | None, n_resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """{"model": {scope: {policy: {...}}}, "measured": {...}, "how": ...} (module docstring)."""
    if t.timing_model is None:
        raise InputError("regret: the run has no live phase with every fixed drafter: no timing model to price with")
    timing = policy_timing(t)
    tok = trajectory.output_lengths(t).astype(float)
    fms = fixed_ms(t)  # (P, D)
    D = len(t.drafters)
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    scopes = ["all", *t.workloads]
    model: dict = {s: {} for s in scopes}
    for name, pol in policies(t, timing).items():
        X = policy_totals(t, pol, timing)
        for s in scopes:
            m = np.ones(t.n_prompts, bool) if s == "all" else wl_of == t.workloads.index(s)
            cols = np.column_stack([tok[m], fms[m], X[m]])

            def stat(T):  # T (n, 1 + D + 5)
                fixed = T[:, [0]] / T[:, 1 : 1 + D]
                pol_rate = T[:, 0] / T[:, 1 + D]
                b = T[:, 1 + D :]
                return np.column_stack([pol_rate / fixed.max(1), b[:, 2] / b[:, 1], b[:, 4] / np.maximum(b[:, 3], 1)])

            v, boot, _ = boot_totals(cols, stat, wl_of[m], n_resamples, seed, jackknife=False)
            iv = [interval(v[j], boot[:, j], None, "percentile", "prompt", seed) for j in range(3)]
            best = t.drafters[int(np.argmax(cols[:, 0].sum() / cols[:, 1 : 1 + D].sum(0)))]
            model[s][name] = {
                "over_best_fixed": [round(iv[0].value, 4), round(iv[0].lo, 4), round(iv[0].hi, 4)],
                "best_fixed": best,
                "oracle_agreement": [round(iv[1].value, 4), round(iv[1].lo, 4), round(iv[1].hi, 4)],
                "tokens_lost_per_differing_block": [round(iv[2].value, 4), round(iv[2].lo, 4), round(iv[2].hi, 4)],
            }
    return {"model": model, "measured": measured(t, live or [], n_resamples, seed)}


def measured(t: BlockTable, live: list[dict], n_resamples: int, seed: int) -> dict:
    """{scope: {config: [ratio, lo, hi]}}: each live policy's measured tokens/s over the best live fixed drafter's."""
    configs = list(dict.fromkeys(r["config"] for r in live))
    fixed = [c for c in configs if c.startswith(FIXED)]
    pols = [c for c in configs if c.startswith(POLICY)]
    if not fixed or not pols:
        return {}
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    clusters = sorted({index[f"{r['workload']}/{r['prompt_id']}"] for r in live})
    col = {p: i for i, p in enumerate(clusters)}
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    strata = wl_of[clusters]
    order = fixed + pols
    T = np.zeros((len(clusters), 2 * len(order)))
    for r in live:
        if r["config"] in order:
            j = order.index(r["config"])
            i = col[index[f"{r['workload']}/{r['prompt_id']}"]]
            T[i, 2 * j] += r["tokens"]
            T[i, 2 * j + 1] += r["wall_ms"]
    F = len(fixed)

    def stat(S):
        rate = S[:, 0::2] / S[:, 1::2]
        return rate[:, F:] / rate[:, :F].max(1, keepdims=True)

    out = {}
    for s in ["all", *t.workloads]:
        m = np.ones(len(clusters), bool) if s == "all" else strata == t.workloads.index(s)
        if not m.any():
            continue
        v, boot, _ = boot_totals(T[m], stat, strata[m], n_resamples, seed, jackknife=False)
        out[s] = {}
        for j, c in enumerate(pols):
            iv = interval(v[j], boot[:, j], None, "percentile", "prompt", seed)
            out[s][c] = [round(iv.value, 4), round(iv.lo, 4), round(iv.hi, 4)]
    return out


def _ci(x) -> str:
    return f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"


def report(r: dict, said: str, n_resamples: int, seed: int) -> str:
    how = f"95% percentile bootstrap over prompt clusters within workloads, {n_resamples} resamples, seed {seed}"
    lines = [said, f"Regret view ({how}); tok/s over the best fixed drafter in hindsight (< 1: regret)."]
    lines.append(
        f"{'':10} {'policy':28} {'tok/s over best fixed [MODEL]':>30} {'over best fixed [MEASURED]':>28} "
        f"{'oracle agreement [MODEL]':>26} {'tokens lost/differing block':>28}"
    )
    for s, rows in r["model"].items():
        lines.append(f"[{s}] best fixed in hindsight [MODEL]: {next(iter(rows.values()))['best_fixed']}")
        for name, e in sorted(rows.items(), key=lambda kv: -kv[1]["over_best_fixed"][0]):
            meas = r["measured"].get(s, {}).get(name)
            lines.append(
                f"[MODEL]    {name:28} {_ci(e['over_best_fixed']):>30} {(_ci(meas) if meas else '-'):>28} "
                f"{_ci(e['oracle_agreement']):>26} {_ci(e['tokens_lost_per_differing_block']):>28}"
            )
    return "\n".join(lines) + "\n"


def figure(r: dict, cmd: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = r["model"]["all"]
    names = sorted(rows, key=lambda n: rows[n]["over_best_fixed"][0])
    fig, ax = plt.subplots(1, 2, figsize=(12, 0.3 * len(names) + 1.5), sharey=True)
    y = np.arange(len(names))
    for a, key, title in (
        (ax[0], "over_best_fixed", "tok/s over best fixed in hindsight [MODEL]"),
        (ax[1], "oracle_agreement", "agreement with the per-block oracle [MODEL]"),
    ):
        v = np.array([rows[n][key] for n in names])
        a.errorbar(v[:, 0], y, xerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]], fmt="o", ms=3)
        a.set_title(title, fontsize=9)
    ax[0].axvline(1.0, color="grey", lw=0.8)
    ax[0].set_yticks(y, [n.removeprefix("policy:") for n in names], fontsize=7)
    fig.tight_layout()
    data = outputs.png(fig, cmd)
    plt.close(fig)
    return data


FILES = ["regret.json", "regret.txt", "regret.png"]  # a run's default outputs (bandit/logs/outputs.py DOCUMENTED)


def main(
    paths: Annotated[
        Optional[list[str]], typer.Argument(help="a run directory (default: the published campaign)")
    ] = None,
    out: Annotated[
        Optional[str],
        typer.Option(
            "--out",
            help="JSON file, its .txt and .png beside it (default: <run dir>/regret.json beside the run read, with "
            "every option at its default; else nothing)",
        ),
    ] = None,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples, {outputs.RESAMPLES_HELP}")] = RESAMPLES,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = SEED,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """The regret view: every policy and engine rule against the best fixed drafter in hindsight and the per-block
    oracle -> regret.txt, regret.json, regret.png."""
    outputs.resamples(resamples), outputs.seed(seed)
    inp = outputs.resolve(paths, latest)
    opts = [("--resamples", resamples, RESAMPLES), ("--seed", seed, SEED)]
    differs = outputs.changed(opts)
    dest, why = outputs.destination(inp, FILES[0], outputs.path_arg(out, "--out"), differs, "bandit/regret.py")
    files = outputs.siblings(dest, (".txt", ".png"))
    if out is not None:
        outputs.guard_out(dest, [f.name for f in files], inp, FILES, differs)
    t = attach(load_logs(inp.files), inp.dir)
    trajectory.require_dense(t)
    live = load_live(inp.dir, t) if inp.dir is not None and (Path(inp.dir) / "live.jsonl").is_file() else None
    r = evaluate(t, live, resamples, seed)
    cmd = outputs.command("bandit/regret.py", inp, opts)
    text = f"{outputs.HEADER}{cmd}\n" + report(r, inp.said or f"logs {inp.named}", resamples, seed)
    typer.echo(text, nl=False)
    if dest is None:
        typer.echo(why)
        return
    done = outputs.write_all(list(zip(files, (outputs.dumps(r | {"command": cmd}) + "\n", text, figure(r, cmd)))), text)
    typer.echo(outputs.wrote(files, done), nl=False)


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(main)
