"""Collection campaign: every drafter drafts from the identical prefix, the target verifies,
one schema-v1 JSON line per block goes to runs/<run>/ (see docs/DESIGN.md, docs/manifest.md).

\b
    python sweep.py                     # the embedded CPU default on the zoo models
    python sweep.py --target DIR --drafter NAME=KIND[:key=value,...] ... \\
        --workloads code,math | --workload-file FILE  --mode dense|sparse|live \\
        --k 8 --max-new-tokens 128 --temperature 0 --seed 0 --out runs/NAME [--resume] [--limit N] \\
        [--device cuda] [--dtype auto|float32|bfloat16|float16] [--exact-verify]
    python sweep.py ... --out DIR --shard I/N   # shard I of N, beside the other shards' sweeps
    python sweep.py ... --ray [ADDRESS] [--workers N]   # on Ray: local, or auto / HOST:PORT

Drafter kinds: ngram, suffix, draft (path=), medusa (path=), eagle (path=), eagle3 (path=: a
speculators / EAGLE-3 / SpecForge directory), dflash (path=: z-lab's DFlash), layerskip (layers=L:
the target's first L layers), cascade (of=a+b),
or an installed plug-in (an entry point of group specbandit.drafters; never a module:attr): see
harness/drafters/. Models are paths or names under --models / $MACH_MODELS /
$SPECBANDIT_MODELS. Benchmark workloads for GPU hosts: see workloads.py.

--dtype auto (the default) is bfloat16 on CUDA and float32 on CPU. Every sweep checks the target
after each prompt (one teacher-forced verification forward vs the run's own tokens) and records the
disagreements in the manifest's target_check, warning when there are any; at bfloat16 a near-tie
can flip between forward shapes, and --exact-verify (one token per target forward, bit-identical to
generation) makes dense logs equal live runs at any dtype. A short GPU-host check: bench/gpu_smoke.py.

Beyond one process (docs/DESIGN.md, "Campaigns beyond one process"): --shard I/N runs the prompts of
shard I (by a hash of workload and prompt id) into the campaign directory --out, where the other
shards' sweeps write beside it; the pooled records are those of one process. --ray runs the whole
campaign on Ray workers (one per GPU, or per CPU slot), each loading the models once and taking shards
from a queue; a failed shard is retried. `specbandit merge` combines shards written to separate
directories.
"""

from __future__ import annotations
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer

REPO = Path(__file__).resolve().parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs.errors import boundary
from harness.campaign.campaign import fail, run_sweep  # torch-free at import: run_sweep loads the campaign
from harness.models.options import RANGE  # torch-free: the ranges --help states

# ---- The embedded default (the zoo issue provides the models; tune the sizes here) ----
DEFAULT_PROMPTS_PER_WORKLOAD = 240  # prompts per workload in the dense phase of `python sweep.py`; sized to leave room for the live phase: both together took about 10 min on 2 CPU cores
DEFAULT_MAX_NEW_TOKENS = 128  # output tokens per prompt
DEFAULT_K = 8
DEFAULT_LIVE_PROMPTS = 30  # live phase: prompts per workload decoded for real by every configuration
DEFAULT_GENERATOR = "ngram"  # dense: the target's output comes from speculative decoding with it (exact)
DEFAULT_TARGET = "zoo/target"
DEFAULT_DRAFTERS = [
    "ngram=ngram",
    "suffix=suffix",
    "draft=draft:path=zoo/draft",
    "medusa=medusa:path=zoo/medusa",
    "eagle=eagle:path=zoo/eagle",
    "cascade=cascade:of=draft+ngram",
]
DEFAULT_WORKLOADS = ["code", "math", "chat", "copy"]
ZOO_FILES = [
    "zoo/target/config.json",
    "zoo/target/model.safetensors",
    "zoo/target/tokenizer.json",
    "zoo/draft/config.json",
    "zoo/draft/model.safetensors",
    "zoo/draft/tokenizer.json",
    "zoo/medusa/config.json",
    "zoo/medusa/model.safetensors",
    "zoo/eagle/config.json",
    "zoo/eagle/model.safetensors",
] + [f"zoo/workloads/{w}.jsonl" for w in DEFAULT_WORKLOADS]

app = typer.Typer(add_completion=False, help=__doc__, rich_markup_mode=None)


def _kv_list(items: list[str], flag: str) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            fail(f"{flag} {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def _missing_zoo() -> list[str]:
    return [f for f in ZOO_FILES if not (REPO / f).is_file()]


def main(
    target: Optional[str] = typer.Option(
        None, help="target model dir or name under the models root (omit for the embedded zoo default)"
    ),
    drafter: List[str] = typer.Option(
        [],
        "--drafter",
        help="NAME=KIND[:key=value,...], repeatable (the settings' types and ranges: harness/models/options.py)",
    ),
    workloads: Optional[str] = typer.Option(None, help="comma-separated workload names (see workloads.py)"),
    workload_file: Optional[str] = typer.Option(None, help="JSONL of {workload, prompt_id, prompt|messages}"),
    workload_path: List[str] = typer.Option([], "--workload-path", help="NAME=FILE: a benchmark file, repeatable"),
    data: Optional[str] = typer.Option(None, help="root of local benchmark files"),
    models: Optional[str] = typer.Option(None, help="models root (else $MACH_MODELS, $SPECBANDIT_MODELS)"),
    mode: str = typer.Option("dense", help="dense | sparse | live"),
    k: int = typer.Option(DEFAULT_K, help=f"maximum draft length, {RANGE['--k']}"),
    max_new_tokens: int = typer.Option(
        DEFAULT_MAX_NEW_TOKENS, help=f"output tokens per prompt, {RANGE['--max-new-tokens']}"
    ),
    temperature: float = typer.Option(0.0, help=f"{RANGE['--temperature']}; > 0: Gumbel-max coupled sampling"),
    seed: int = typer.Option(0, help=f"keys all sampling noise, {RANGE['--seed']}"),
    out: Optional[str] = typer.Option(None, help="run directory (default runs/<name>-<UTC time>)"),
    resume: bool = typer.Option(
        False,
        help="continue the run in --out, skipping finished prompts "
        "(without --out: the newest incomplete run under runs/)",
    ),
    limit: Optional[int] = typer.Option(None, help=f"at most N prompts per workload, {RANGE['--limit']}"),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bfloat16 on cuda, float32 on cpu) | float32 | bfloat16 | float16"),
    kernels: str = typer.Option(
        "default",
        help="the target's and model drafters' linears on cpu (harness/models/kernels.py): default (prepacked "
        "oneDNN where the CPU has it, else aten; with it a Llama target runs the lean forward of "
        "harness/models/fastpath.py, bitwise transformers' logits) | auto (the faster by a short probe at "
        "start-up) | aten (transformers' own forward) | mkldnn | compile; the manifest records what ran",
    ),
    exact_verify: bool = typer.Option(
        False,
        "--exact-verify",
        help="verify one token per target forward, the forwards "
        "generation makes, so that dense logs equal live runs bit for bit at any dtype "
        "(bf16 near-ties otherwise flip between forward shapes; the manifest's "
        "target_check counts them); costs up to k+1 target forwards per block",
    ),
    behaviour: Optional[str] = typer.Option(None, help="sparse: the drafter whose draft advances the output"),
    generator: Optional[str] = typer.Option(
        None,
        help="dense: make the target's output by speculative decoding "
        "with this drafter (identical output, fewer target passes)",
    ),
    policy: Optional[str] = typer.Option(
        None,
        help="live: NAME[:k=v] choosing a drafter per block (a policy of bandit/policies/registry.py, e.g. ucbspec)",
    ),
    calibrate: int = typer.Option(
        0,
        help="prompts per drafter in a short live timing calibration after the sweep "
        f"(ignored when --live-prompts is given), {RANGE['--calibrate']}",
    ),
    live_prompts: int = typer.Option(
        0,
        help="live phase after a dense sweep: a seeded sample of N prompts per "
        "workload decoded for real by the target alone, every fixed drafter, best-of-N and each live policy "
        f"(live.jsonl; the embedded default uses 30), {RANGE['--live-prompts']}",
    ),
    live_policies: Optional[str] = typer.Option(
        None,
        help="the live phase's policies, comma-separated (default: every one of bandit/policies/livepolicies.py's "
        "LIVE_POLICIES; an empty string: none)",
    ),
    verify_pad: Optional[str] = typer.Option(
        None,
        help="Q:Q'[,...]: every one-chain verify forward of Q tokens runs as Q' (its extra rows dropped: "
        "harness/models/target.py), where a CPU's kernels make Q' rows cheaper than Q; auto: the forwards of 1..k+1 "
        "tokens are timed at start-up and each size runs as the cheapest at or above it; the manifest records "
        "the table",
    ),
    threads: Optional[int] = typer.Option(
        None,
        help=f"torch CPU threads, exactly this many, {RANGE['--threads']} (default: every core on cpu, divided "
        "among the --shard processes or --ray workers; torch's own on cuda); the manifest records the count",
    ),
    shard: Optional[str] = typer.Option(
        None,
        help="I/N: run only shard I of N of the prompts (by a hash of workload and prompt id) into --out, beside "
        "the other shards' sweeps, 0 <= I < N <= the campaign's prompts (and <= 65536); the live phase then "
        "runs in one final --resume without --shard",
    ),
    ray: bool = typer.Option(
        False,
        "--ray",
        help="run the campaign on Ray: one worker per GPU (per CPU slot on a CPU host), each loading the models "
        "once and taking shards from a queue; a local Ray unless ADDRESS is given (pip install 'specbandit[ray]')",
    ),
    address: Optional[str] = typer.Argument(
        None,
        metavar="ADDRESS",
        help="with --ray: the Ray cluster to join (auto, or HOST:PORT); without one a local Ray is started",
    ),
    workers: int = typer.Option(
        0, help=f"with --ray: the number of workers (0: one per GPU, or per CPU slot), {RANGE['--workers']}"
    ),
):
    if address is not None and not ray:
        fail(f"{address!r}: an address is given only with --ray (sweep.py --ray [ADDRESS])")

    default = target is None
    if default:
        missing = _missing_zoo()
        if missing:
            fail(
                "the embedded default runs on the zoo models, and these files are missing:\n  "
                + "\n  ".join(missing)
                + "\nmake them with:  python -m zoo.train all\n"
                "or give your own --target DIR --drafter ... --workloads ..."
            )
        target = str(REPO / DEFAULT_TARGET)
        if not drafter:
            drafter = [s.replace("path=zoo/", f"path={REPO}/zoo/") for s in DEFAULT_DRAFTERS]
            generator = generator or DEFAULT_GENERATOR
        if not workload_file:
            workloads = workloads or ",".join(DEFAULT_WORKLOADS)
        limit = limit if limit is not None else DEFAULT_PROMPTS_PER_WORKLOAD
        live_prompts = live_prompts or DEFAULT_LIVE_PROMPTS
        if not (resume and out is None):  # --resume alone: the newest incomplete run under runs/
            out = out or str(REPO / "runs" / f"zoo-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}")
    run_sweep(  # an input problem: one line through bandit.errors.boundary (app below, and `specbandit sweep`)
        target=target,
        drafter=drafter,
        workloads=workloads,
        workload_file=workload_file,
        workload_path=_kv_list(workload_path, "--workload-path"),
        data=data,
        models=models,
        mode=mode,
        k=k,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        out=out,
        resume=resume,
        limit=limit,
        device=device,
        dtype=dtype,
        behaviour=behaviour,
        generator=generator,
        policy=policy,
        calibrate=calibrate,
        live_prompts=live_prompts,
        live_policies=live_policies,
        threads=threads,
        kernels=kernels,
        verify_pad=verify_pad,
        exact_verify=exact_verify,
        runs_root=REPO / "runs" if default else None,
        shard=shard,
        ray=(address or "local") if ray else None,
        workers=workers,
    )


app.command(help=__doc__)(boundary(main))  # `python sweep.py`: input errors as one line, as `specbandit sweep`

if __name__ == "__main__":
    app()
