"""A run's live configurations in the formats the field reads: vLLM's and llama.cpp's speculative-decoding metrics,
and a Spec-Bench-style table (issue 34).

    specbandit export --format vllm RUN [--out DIR]       # DIR (default RUN/export): vllm_spec_decode.json and
                                                          # vllm_metrics/<config>.json (import-vllm reads each)
    specbandit export --format specbench RUN [--out DIR]  # DIR: specbench.json, specbench.md

vllm, per live configuration with one draft per step (`fixed:<d>`, `policy:<name>`; plain drafts nothing and
best-of-N verifies several drafts per step), counted along the configuration's walk on the dense log over the live
prompts in decode order (bandit/policies/walk.py `live_walk`: what the live decode did, exactly so for every timing-
free configuration) [MEASURED]: as vLLM counts them (vllm/v1/spec_decode/metrics.py) `num_drafts` (steps with a non-
empty draft), `num_draft_tokens`, `num_accepted_tokens`, `num_accepted_tokens_per_pos` (drafts accepting at least
i + 1 tokens), the mean acceptance length 1 + accepted / drafts, and the acceptance histogram of
`--per-request-spec-decode-metrics` (drafts accepting exactly j tokens, j = 0..k; pooled and per request); as llama.cpp
prints them (common/speculative.cpp): n_drafted, n_accept and the accept rate n_accept / n_drafted.

specbench, per workload and pooled, from live.jsonl alone [MEASURED]: each configuration's speedup over plain decoding
(tokens/s over plain's, ratios of sums; plain 1.00) and its mean accepted tokens per step (output tokens / target
passes, the bonus token included, Spec-Bench's #MAT), 95% percentile intervals over prompt clusters resampled within
workloads (bandit/stats/resample.py, 2000 resamples, seed 0).
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/live/export.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import json
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from bandit.live.livelog import load_live, live_order, policy_timing
from bandit.logs import outputs
from bandit.logs.errors import InputError, UsageError
from bandit.logs.reader import load_logs
from bandit.logs.schema import FIXED, PLAIN, POLICY
from bandit.logs.table import BlockTable
from bandit.policies import livepolicies
from bandit.policies.walk import FixedPolicy, live_walk
from bandit.stats import resample

FORMATS = ("vllm", "specbench")
VLLM_FILE, SPECBENCH_FILE = "vllm_spec_decode.json", "specbench.json"
N_RESAMPLES, SEED = 2000, 0


def walked(t: BlockTable, config: str, prompts: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, chosen, cut, accepted) of `config`'s live walk on dense log t over `prompts` in decode order."""
    timing = policy_timing(t)
    if config.startswith(FIXED):
        pol = FixedPolicy(t.drafters.index(config[len(FIXED) :]))
    else:
        pol = livepolicies.make(config[len(POLICY) :], t, timing)
    return live_walk(t, pol, prompts, timing)


def spec_counts(t: BlockTable, rows, chosen, cut, accepted, k: int) -> dict:
    """vLLM's and llama.cpp's counters of a walk's blocks (one draft verified per step); per request too."""
    n = t.draft_len[rows, chosen].astype(np.int64)
    n = np.where(cut >= 0, np.minimum(n, cut), n)
    a = np.asarray(accepted, np.int64)
    drafted = n > 0
    per_pos = [int(((a >= i + 1) & drafted).sum()) for i in range(k)]
    hist = np.bincount(a[drafted], minlength=k + 1)[: k + 1].tolist()
    D, T, A = int(drafted.sum()), int(n.sum()), int(a[drafted].sum())
    per_req = []
    prompt = t.prompt[rows]
    for p in dict.fromkeys(prompt.tolist()):
        m = (prompt == p) & drafted
        wl, pid = t.prompt_ids[p].split("/", 1)
        per_req.append(
            {
                "workload": wl,
                "prompt_id": pid,
                "num_drafts": int(m.sum()),
                "acceptance_histogram": np.bincount(a[m], minlength=k + 1)[: k + 1].tolist(),
            }
        )
    return {
        "label": "MEASURED",
        "num_drafts": D,
        "num_draft_tokens": T,
        "num_accepted_tokens": A,
        "num_accepted_tokens_per_pos": per_pos,
        "mean_acceptance_length": round(1 + A / D, 6) if D else None,
        "acceptance_rate_per_pos": [round(x / D, 6) if D else None for x in per_pos],
        "acceptance_histogram": hist,
        "per_request": per_req,
        "llama_cpp": {"n_drafted": T, "n_accept": A, "accept_rate": round(A / T, 6) if T else None},
    }


def safe_name(config: str) -> str:
    return config.replace(":", "-").replace("/", "-")


def vllm_files(t: BlockTable, live: list[dict], out: Path) -> list[tuple[Path, str]]:
    configs = [c for c in dict.fromkeys(r["config"] for r in live) if c.startswith((FIXED, POLICY))]
    k = max(int(policy_timing(t).k or t.draft_len.max(initial=0)), 1)  # the manifest's k: a tree's size is not one
    body, files = {}, []
    for c in configs:
        rows, chosen, cut, acc = walked(t, c, live_order(t, live, c))
        body[c] = spec_counts(t, rows, chosen, cut, acc, k)
        metrics = {"vllm:spec_decode_" + n: body[c][n] for n in ("num_drafts", "num_draft_tokens")}
        metrics["vllm:spec_decode_num_accepted_tokens"] = body[c]["num_accepted_tokens"]
        metrics["vllm:spec_decode_num_accepted_tokens_per_pos"] = body[c]["num_accepted_tokens_per_pos"]
        files.append((out / "vllm_metrics" / f"{safe_name(c)}.json", json.dumps({"metrics": metrics}, indent=1) + "\n"))
    head = {
        "what": "per live configuration, vLLM's spec-decode counters and llama.cpp's speculative metrics, counted "
        "along its walk on the dense log over the live prompts in decode order [MEASURED]",
        "k": k,
        "configs": body,
    }
    return [(out / VLLM_FILE, outputs.dumps(head) + "\n"), *files]


def specbench(t: BlockTable, live: list[dict], n_resamples: int = N_RESAMPLES, seed: int = SEED) -> dict:
    """{scope: {config: {speedup, speedup_ci, mat, mat_ci}}}, scope "all" and each workload; plain at 1.00."""
    if not any(r["config"] == PLAIN for r in live):
        raise InputError(f"{t.sources[0].path.parent}: the live phase decoded no `plain`: no speedup over it")
    configs = list(dict.fromkeys(r["config"] for r in live))
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    clusters = sorted({index[f"{r['workload']}/{r['prompt_id']}"] for r in live})
    col = {p: i for i, p in enumerate(clusters)}
    strata = wl_of[clusters]
    tot = np.zeros((len(clusters), len(configs), 3))  # tokens, wall ms, passes
    for r in live:
        tot[col[index[f"{r['workload']}/{r['prompt_id']}"]], configs.index(r["config"])] += (
            r["tokens"],
            r["wall_ms"],
            r["passes"],
        )
    draws = np.concatenate(list(resample.count_chunks(strata, n_resamples, seed))).astype(float)
    ip = configs.index(PLAIN)

    def iv(v):
        v = v[np.isfinite(v)]
        return [round(float(np.percentile(v, 2.5)), 4), round(float(np.percentile(v, 97.5)), 4)] if v.size > 1 else None

    out = {}
    for scope in ["all"] + sorted({t.workloads[w] for w in strata.tolist()}):
        m = np.ones(len(clusters), bool) if scope == "all" else strata == t.workloads.index(scope)
        S = tot[m].sum(0)
        B = np.einsum("bp,pcx->bcx", draws[:, m], tot[m])
        with np.errstate(divide="ignore", invalid="ignore"):
            rate, brate = S[:, 0] / S[:, 1], B[:, :, 0] / B[:, :, 1]
            out[scope] = {
                c: {
                    "speedup": round(float(rate[j] / rate[ip]), 4),
                    "speedup_ci": iv(brate[:, j] / brate[:, ip]),
                    "mat": round(float(S[j, 0] / S[j, 2]), 4),
                    "mat_ci": iv(B[:, j, 0] / B[:, j, 2]),
                    "n_prompts": int(m.sum()),
                }
                for j, c in enumerate(configs)
            }
    return out


def specbench_files(t: BlockTable, live: list[dict], out: Path) -> list[tuple[Path, str]]:
    tab = specbench(t, live)
    how = f"95% percentile bootstrap over prompt clusters within workloads, {N_RESAMPLES} resamples, seed {SEED}"
    head = {"what": "Spec-Bench-style table from live.jsonl [MEASURED]", "ci": how, "scopes": tab}
    scopes = list(tab)
    lines = [
        "Spec-Bench-style table [MEASURED]: speedup over plain decoding (tokens/s ratio) and mean accepted tokens per",
        f"step (#MAT, output tokens / target passes); {how}.",
        "",
        "| config | " + " | ".join(f"{s} speedup | {s} #MAT" for s in scopes) + " |",
        "|---|" + "---|---|" * len(scopes),
    ]
    for c in tab["all"]:
        cells = []
        for s in scopes:
            e = tab[s][c]
            ci = lambda v: f" [{v[0]:.2f}, {v[1]:.2f}]" if v else ""
            cells += [f"{e['speedup']:.2f}x{ci(e['speedup_ci'])}", f"{e['mat']:.2f}{ci(e['mat_ci'])}"]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return [(out / SPECBENCH_FILE, outputs.dumps(head) + "\n"), (out / "specbench.md", "\n".join(lines) + "\n")]


def export(run: str | Path, fmt: str, out: str | Path | None = None) -> list[Path]:
    """Write `fmt` of run directory `run` into `out` (default run/export); the paths written."""
    outputs.choice("--format", fmt, FORMATS)
    run = Path(run)
    if not run.is_dir():
        raise InputError(f"{run}: not a run directory")
    dest = run / "export" if out is None else Path(out)
    if dest.is_symlink():
        raise InputError(f"--out {dest}: is a symlink: not written through")
    t = load_logs([run])
    if not (run / "live.jsonl").is_file():
        raise InputError(f"{run}: no live phase (live.jsonl): nothing decoded to export")
    live = load_live(run, t)
    files = vllm_files(t, live, dest) if fmt == "vllm" else specbench_files(t, live, dest)
    return outputs.write_all(files)


def cli(
    run: Annotated[str, typer.Argument(help="a run directory with a live phase")],
    fmt: Annotated[str, typer.Option("--format", help="vllm | specbench")] = "vllm",
    out: Annotated[Optional[str], typer.Option("--out", help="directory to write into (default RUN/export)")] = None,
) -> None:
    """Export a run's live configurations as vLLM/llama.cpp speculative metrics or a Spec-Bench-style table."""
    outputs.choice("--format", fmt, FORMATS)
    if not run:
        raise UsageError("RUN '': an empty path (name a run directory)")
    for p in export(run, fmt, outputs.path_arg(out, "--out")):
        typer.echo(f"wrote {p}")


if __name__ == "__main__":
    from bandit.logs.errors import run as _run

    _run(cli)
