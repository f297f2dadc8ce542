"""The policies report: every policy replayed, the Hedge regret slope, the multi-sequence replay and the
falsification experiment, in one labelled text -> <run dir>/core.txt.

The numbers come from bandit/sim/evaluate.py (the policy replays) and bandit/sim/falsify.py (the simulation
the logs falsify). `python bandit/core.py` also prints the full-information Hedge regret's log-log
slope, with a 95% order-seed interval (percentiles over 20 seeded prompt orders: not a bootstrap),
and the multi-sequence tokens/s [MODEL] with prompt-cluster CIs. Every line is labelled
[MEASURED], [SIM] or [MODEL] (or is an indented continuation of a labelled line) and names its
block set.

    python bandit/core.py [PATHS...] [--out FILE]   # -> <run dir>/core.txt beside the one run read (the
                                                    # published campaign's without PATHS; with every option at
                                                    # its default; else only --out); tqdm progress on stderr
    specbandit policies PATHS --json [--mode block|trajectory]
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/core.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

import builtins
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional, Sequence

import numpy as np
import typer
from tqdm import tqdm

from bandit.logs import outputs
from bandit.stats import trajectory
from bandit.stats.bootstrap import boot_totals, interval
from bandit.sim.evaluate import block_set_text, evaluate, num_text, pct_text, prompt_strata, regret_curve, tag
from bandit.sim.multiseq import multi_sequence_replay
from bandit.sim.falsify import REPLICATES, falsify, read_calibration, unmapped
from bandit.logs import parallel
from bandit.logs.reader import load_logs
from bandit.policies.registry import Hedge, SpecSelect
from bandit.live.primary import attach, detach
from bandit.logs.schema import code_version
from bandit.logs.table import BlockTable
from bandit.policies.walk import run_timing

ORDER_SEEDS = 20  # seeded prompt orders for the Hedge regret slope's order-seed interval


def _load(paths: Sequence[str | Path] | None, latest: bool = False) -> tuple[BlockTable, str, outputs.Inputs]:
    """The logs with their run's live phase attached (bandit/live/primary.py: the primary by measured speed, the
    timing model of the tok/s [MODEL] column), the sentence naming them, and the inputs (bandit/logs/outputs.py)."""
    inp = outputs.resolve(paths, latest)
    t = attach(load_logs(inp.files), inp.dir)
    return t, inp.said or f"{tag(t.label)} logs {inp.named}", inp


def _check(seeds: int, n_resamples: int, seed: int, order_seeds: int = 1, replicates: int = 1) -> None:
    outputs.bounded("--seeds", seeds, 1, 1000), outputs.resamples(n_resamples), outputs.seed(seed)
    outputs.bounded("--order-seeds", order_seeds, 1, 10_000), outputs.bounded("--replicates", replicates, 1, 1000)


def cli(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    mode: Annotated[str, typer.Option(help="block | trajectory (dense logs)")] = "block",
    seeds: Annotated[int, typer.Option(help="number of seeded prompt orders to average over, in [1, 1000]")] = 3,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples, {outputs.RESAMPLES_HELP}")] = 1000,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """Replay every drafter-selection policy on block logs, with 95% bootstrap CIs over prompt clusters.

    Policies: best_fixed (the primary), workload_oracle, per_block_oracle (hindsight), every policy of
    bandit/policies/registry.py; trajectory_oracle (the shortest path) in trajectory mode. One accounting:
    tokens per target pass (nothing counted past an output's end); block mode meets the block set B
    (dense logs: the primary's own trajectory starts), trajectory mode each policy's own blocks.

    --json prints {policy: {"tokens_per_pass", "tokens_per_pass_ci", "gain_vs_best_fixed", "gain_ci",
    "regret_vs_best_fixed", "regret_ci", "regret_unit", "tokens_per_s_model", "tokens_per_s_model_ci",
    "mean_accepted", "ci" (mean accepted's), "block_set", ...}}.

    PATHS default to the published campaign (paper/campaign.txt; --latest: the newest complete run). Prints only
    (`python bandit/core.py` writes core.txt).
    """
    _check(seeds, resamples, seed)
    outputs.choice("--mode", mode, ("block", "trajectory"))
    t, said, _ = _load(paths, latest)
    rep = evaluate(t, mode, None, tuple(range(seeds)), resamples, seed)
    if json_out:
        typer.echo(json.dumps(rep.to_json(), sort_keys=True))
    else:
        typer.echo(said)
        typer.echo(rep.summary())


def default_out(paths: Sequence[str | Path]) -> Path | None:
    """Where `main` writes with every option at its default: core.txt beside the campaign it describes (<run
    dir>/core.txt; the published campaign's when no PATHS are given); nowhere for several runs pooled."""
    run = outputs.resolve(paths).run
    return None if run is None else run / "core.txt"


def multi_sequence_lines(
    t: BlockTable, n_resamples: int, seed: int, sizes: Sequence[int] = (1, 4), progress: bool = False
) -> list[str]:
    """[MODEL] lines: spec-select deciding every sequence's draft jointly vs every sequence on the primary."""
    g = tag(t.label)
    p = trajectory.primary(t)
    mode = "trajectory" if t.dense else "block"
    strata = prompt_strata(t)
    out = []
    for n in sizes:
        a = multi_sequence_replay(t, SpecSelect(random_state=seed), n, mode, progress=progress)
        b = multi_sequence_replay(t, None, n, mode, fixed=p, progress=progress)
        slower = ((a.tokens / a.ms) < (b.tokens / b.ms)).astype(float)
        cols = np.column_stack([a.tokens, a.share, b.tokens, b.share, slower, np.ones(t.n_prompts)])

        def stat(T):
            return np.column_stack(
                [
                    1000 * T[:, 0] / T[:, 1],
                    1000 * T[:, 2] / T[:, 3],
                    (T[:, 0] / T[:, 1]) / (T[:, 2] / T[:, 3]),
                    T[:, 4] / T[:, 5],
                ]
            )

        v, boot, _ = boot_totals(cols, stat, strata, n_resamples, seed, jackknife=False)
        iv = [interval(v[j], boot[:, j], None, "percentile", "prompt", seed) for j in range(4)]
        blocks = "each sequence along its own trajectory" if mode == "trajectory" else f"block set {block_set_text(t)}"
        out.append(
            f"[MODEL] {n} sequence(s) per step from the {g} logs ({blocks}; timing from the manifest; tokens "
            f"counted to each output's end), tokens/s, 95% CI over prompt clusters: spec_select "
            f"{num_text(iv[0], '.1f')}, all on {t.drafters[p]} (the primary: the {trajectory.rule_name(t)}) "
            f"{num_text(iv[1], '.1f')}, ratio "
            f"{num_text(iv[2], '.3f')}x; share of prompts slower than all on {t.drafters[p]} (their own tokens/s): "
            f"{pct_text(iv[3]).replace('+', '')} (the 10% rule binds expected rates at each step, not realised ones)"
        )
    return out


def hedge_slope_line(t: BlockTable, order_seeds: int = ORDER_SEEDS, progress: bool = False) -> str:
    """[label] the full-information Hedge regret slope, with its order-seed interval."""
    slopes = np.array(
        [
            regret_curve(t, Hedge(random_state=s), np.random.default_rng(s).permutation(t.n_prompts))[2]
            for s in tqdm(
                range(order_seeds),
                desc="Hedge regret over prompt orders",
                disable=not progress,
                file=sys.stderr,
                leave=False,
            )
        ]
    )
    ok = slopes[np.isfinite(slopes)]
    if ok.size == 0:
        return f"{tag(t.label)} full-information Hedge (hedge_stream): regret slope undefined (too few blocks)"
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return (
        f"{tag(t.label)} full-information Hedge (hedge_stream) on {block_set_text(t)}: log-log slope of its "
        f"pseudo-regret (tokens) against the best fixed drafter in hindsight over blocks, mean "
        f"{ok.mean():.2f}, 95% order-seed interval [{lo:.2f}, {hi:.2f}] (2.5th-97.5th percentile over "
        f"{ok.size} seeded prompt orders, policy seed = order seed: the spread over orders, not a "
        f"bootstrap); < 1 is sublinear"
    )


def main(
    paths: Sequence[str] = (),
    seeds: Sequence[int] = (0, 1, 2),
    n_resamples: int = 1000,
    seed: int = 0,
    out: str | Path | None = "auto",
    order_seeds: int = ORDER_SEEDS,
    replicates: int = REPLICATES,
    progress: bool = False,
    latest: bool = False,
) -> str:
    """Print the policy replays and the falsification experiment; also write them to `out` with provenance.

    out "auto": <run dir>/core.txt when every option is at its default (bandit/logs/outputs.py); None: write nothing.
    """
    _check(len(seeds), n_resamples, seed, order_seeds, replicates)
    lines: list[str] = []

    def print(s) -> None:
        lines.append(str(s))
        builtins.print(s, flush=True)

    t, said, inp = _load(paths, latest)
    opts = [("--seeds", len(seeds), 3), ("--resamples", n_resamples, 1000), ("--seed", seed, 0)]
    opts += [("--order-seeds", order_seeds, ORDER_SEEDS), ("--replicates", replicates, REPLICATES)]
    differs = outputs.changed(opts)
    given = None if out in (None, "auto") else Path(out)
    dest, why = outputs.destination(inp, "core.txt", given, differs, "bandit/core.py")
    if given is not None:
        outputs.guard_out(dest, [dest.name], inp, ["core.txt"], differs)
    print(outputs.HEADER + outputs.command("bandit/core.py", inp, opts))
    print(said)
    print(f"{tag(t.label)} {t.summary()}")
    n_sections = 3 + int(t.dense) + int(bool(run_timing(t).verify_ms))
    par = parallel.workers_for(n_sections) > 1
    bars, progress = (progress and par), (progress and not par)  # in parallel: one bar over the sections
    sections = [lambda: evaluate(t, "block", None, seeds, n_resamples, seed, progress).summary()]
    if t.dense:
        sections.append(lambda: evaluate(t, "trajectory", None, seeds, n_resamples, seed, progress).summary())
    sections.append(lambda: hedge_slope_line(t, order_seeds, progress))
    if run_timing(t).verify_ms:
        sections.append(lambda: "\n".join(multi_sequence_lines(t, n_resamples, seed, progress=progress)))
    skip = unmapped(t, read_calibration()) if t.dense else None
    if skip:  # e.g. logs whose workloads the research README's table does not name: no mapping is guessed
        sections.append(lambda: f"{tag(t.label)} falsification skipped: {skip}")
    elif t.dense:  # the simulated campaigns have no live phase: the logs' primary by the same token proxy
        sections.append(
            lambda: falsify(
                detach(t), seeds=seeds, n_resamples=n_resamples, seed=seed, replicates=replicates, progress=progress
            ).summary()
        )
    else:
        sections.append(
            lambda: f"{tag(t.label)} falsification skipped: it needs a dense log (see bandit/core.py falsify)"
        )
    # independent sections (each fixes its own seeds) on the machine's cores, the longest first; same bytes
    assert len(sections) == n_sections
    for text in parallel.in_order(sections, first=(len(sections) - 1, 0), desc="core.py sections" if bars else ""):
        if text:
            print(text)
    print("inputs: " + ", ".join(f"{s.path} sha256:{s.sha256}" for s in t.sources) + f"; code {code_version('bandit')}")
    text = "\n".join(lines) + "\n"
    if out is None:
        return text
    if dest is None:
        builtins.print(why)
    else:
        builtins.print(outputs.wrote([dest], outputs.write_all([(dest, text)])), end="")
    return text


def script(
    paths: Annotated[Optional[list[str]], typer.Argument(help="log files, globs or directories")] = None,
    out: Annotated[
        Optional[str],
        typer.Option(
            help="output file (default: <run dir>/core.txt beside the one run read, with every option at its default)"
        ),
    ] = None,
    seeds: Annotated[int, typer.Option(help="seeded prompt orders to average over, in [1, 1000]")] = 3,
    resamples: Annotated[int, typer.Option(help=f"bootstrap resamples, {outputs.RESAMPLES_HELP}")] = 1000,
    seed: Annotated[int, typer.Option(help=outputs.SEED_HELP)] = 0,
    order_seeds: Annotated[
        int, typer.Option(help="prompt orders for the Hedge slope's interval, in [1, 10000]")
    ] = ORDER_SEEDS,
    replicates: Annotated[int, typer.Option(help="simulated campaigns per prediction, in [1, 1000]")] = REPLICATES,
    progress: Annotated[bool, typer.Option(help="tqdm progress on stderr")] = True,
    latest: Annotated[bool, typer.Option("--latest", help=outputs.LATEST_HELP)] = False,
) -> None:
    """The policy replays and the falsification experiment -> <run dir>/core.txt (see the module docstring)."""
    t0 = time.perf_counter()
    dest = outputs.path_arg(out, "--out")
    main(paths or (), tuple(range(seeds)), resamples, seed, dest or "auto", order_seeds, replicates, progress, latest)
    typer.echo(f"took {time.perf_counter() - t0:.0f} s", err=True)


if __name__ == "__main__":
    from bandit.logs.errors import run

    run(script)
