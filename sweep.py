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
speculators / EAGLE-3 / SpecForge directory), dflash (path=: z-lab's DFlash), cascade (of=a+b),
or an installed plug-in (an entry point of group specbandit.drafters; never a module:attr): see
harness/drafters.py. Models are paths or names under --models / $MACH_MODELS /
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

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer

REPO = Path(__file__).resolve().parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.errors import boundary  # after the path: our bandit, not a namesake
from harness.options import RANGE  # torch-free: the ranges --help states

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


def fail(msg: str) -> None:
    """A problem with the user's input: one line, and bandit.errors' exit code for it (typer's usage errors keep 2)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(1)


def _kv_list(items: list[str], flag: str) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            fail(f"{flag} {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


POLICY_GROUP = "specbandit.policies"  # plug-in policies: entry points of this group


def _load_policy(spec: str):
    """NAME[:key=value,...] -> the policy: a class of bandit/policies.py by its lower-case name, or an installed
    plug-in (entry point of POLICY_GROUP); never an arbitrary module:attr named on the command line."""
    from importlib.metadata import entry_points

    from bandit.policies import ALL
    from harness import options
    from harness.drafters import parse_settings

    name, _, settings = spec.partition(":")
    known = {c.__name__.lower(): c for c in ALL} | {ep.name: ep for ep in entry_points(group=POLICY_GROUP)}
    if name not in known:
        fail(f"--policy {spec!r}: unknown policy {name!r}; known: {', '.join(sorted(known))}")
    cls = known[name] if isinstance(known[name], type) else known[name].load()
    kw = parse_settings(settings, f"--policy {spec}")
    options.policy_settings(cls, kw, f"--policy {spec}")
    pol = cls(**kw)
    for m in ("reset", "choose", "update"):
        if not callable(getattr(pol, m, None)):
            fail(f"--policy {spec}: the object has no {m}() method (needs reset, choose, update)")
    return pol


def _shown_path(v):
    """Absolute paths inside the repository are recorded relative to it (manifests travel)."""
    if isinstance(v, str) and os.path.isabs(v) and Path(v).resolve().is_relative_to(REPO.resolve()):
        return os.path.relpath(Path(v).resolve(), REPO.resolve())
    return v


def _missing_zoo() -> list[str]:
    return [f for f in ZOO_FILES if not (REPO / f).is_file()]


def main(
    target: Optional[str] = typer.Option(
        None, help="target model dir or name under the models root (omit for the embedded zoo default)"
    ),
    drafter: List[str] = typer.Option(
        [],
        "--drafter",
        help="NAME=KIND[:key=value,...], repeatable (the settings' types and ranges: harness/options.py)",
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
        None, help="live: NAME[:k=v] choosing a drafter per block (a policy of bandit/policies.py, e.g. ucbspec)"
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
        help="the live phase's policies, comma-separated (default: every one of bandit/livepolicies.py's "
        "LIVE_POLICIES; an empty string: none)",
    ),
    threads: int = typer.Option(
        0,
        help="torch CPU threads (0: 1 on cpu, where small models lose more to thread hand-offs than they gain; "
        f"torch's default on cuda), {RANGE['--threads']}",
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
        exact_verify=exact_verify,
        runs_root=REPO / "runs" if default else None,
        shard=shard,
        ray=(address or "local") if ray else None,
        workers=workers,
    )


app.command(help=__doc__)(boundary(main))  # `python sweep.py`: input errors as one line, as `specbandit sweep`


def _abs(p):
    return None if p in (None, "") else _shown_path(os.path.abspath(p))


def record_settings(
    *,
    mode,
    k,
    max_new_tokens,
    temperature,
    seed,
    dtype,
    device,
    generator,
    behaviour,
    workloads,
    workload_names,
    workload_file,
    workload_path,
    data,
    live_prompts=0,
    exact_verify=False,
) -> dict:
    """The settings that change the records, beyond the manifest's (compared on --resume; --limit is not
    one: a run may be continued with more prompts)."""
    return {
        "mode": mode,
        "k": k,
        "max_new_tokens": max_new_tokens,
        "temperature": float(temperature),
        "seed": seed,
        "dtype": dtype,
        "device": device,
        "generator": generator,
        "behaviour": behaviour,
        "workloads": list(workloads),
        "workload_names": list(workload_names),
        "workload_file": _abs(workload_file),
        "workload_path": {n: _abs(f) for n, f in sorted((workload_path or {}).items())},
        "data": _abs(data),
        **({"live_prompts": live_prompts} if live_prompts else {}),
        **({"exact_verify": True} if exact_verify else {}),
    }


def _ids_sha(ids) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([int(t) for t in ids]).encode()).hexdigest()[:16]


def run_sweep(
    *,
    target,
    drafter,
    workloads=None,
    workload_file=None,
    workload_path=None,
    data=None,
    models=None,
    mode="dense",
    k=8,
    max_new_tokens=128,
    temperature=0.0,
    seed=0,
    out=None,
    resume=False,
    limit=None,
    device="cpu",
    dtype="auto",
    behaviour=None,
    generator=None,
    policy=None,
    calibrate=0,
    threads=0,
    quiet=False,
    runs_root=None,
    live_prompts=0,
    live_policies=None,
    exact_verify=False,
    shard=None,
    ray=None,
    workers=0,
):
    """Validate everything, then run. Returns the run directory. `shard`: "I/N", this process runs that shard's
    prompts into `out`; `ray`: an address ("local": a Ray of this command's own), the campaign runs on Ray
    workers (harness/raypool.py), `workers` of them (0: one per GPU or CPU slot). `live_policies`: the live phase's
    policies, comma-separated (None: every live policy; "": none)."""
    from harness import options  # torch-free: a bad number or device is refused before torch, a model, a file

    opts = dict(k=k, max_new_tokens=max_new_tokens, temp=temperature, seed_=seed, threads=threads, device_=device)
    options.check(**opts, limit=limit, live_prompts=live_prompts, calibrate=calibrate, workers=workers, ray=ray)
    import workloads as wlmod
    from harness import lm
    from harness.drafters import parse_spec
    from harness import livephase
    from harness.engine import RunConfig
    from harness.rundir import RunDir, find_resumable, make_manifest, preflight
    from harness.worker import Plan, Worker

    # 1. Everything that can be checked without loading a model.
    if not drafter:
        raise lm.HarnessError("no drafters: give at least one --drafter NAME=KIND[:key=value,...]")
    specs = [parse_spec(s) for s in drafter]
    cfg = RunConfig(mode, k, max_new_tokens, temperature, seed, behaviour, generator)
    cfg.check([s.name for s in specs])
    sh = options.campaign(shard, ray, workers, policy, calibrate, out)
    if policy and mode != "live":
        raise lm.HarnessError("--policy applies to --mode live only")
    if policy and resume:
        raise lm.HarnessError("--resume with --policy: a policy's learned state is not saved; start a new run")
    dtype = lm.resolve_dtype(dtype, device)  # recorded resolved: a resume elsewhere must not change it silently
    if live_prompts and mode != "dense":
        raise lm.HarnessError("--live-prompts: the live phase follows a dense sweep (--mode dense)")
    if live_policies is not None and not live_prompts:
        raise lm.HarnessError("--live-policies: applies to the live phase (--live-prompts N)")
    live_pols = livephase.policy_list(live_policies) if live_prompts else []
    if out is not None:
        preflight(out, resume, sh)
    names_given = [w for w in (workloads or "").split(",") if w.strip()]
    if names_given and workload_file:
        raise lm.HarnessError("give --workloads NAMES or --workload-file FILE, not both")
    target_dir = lm.resolve_model_dir(target, models, "--target")
    names = [w.strip() for w in (workloads or "").split(",") if w.strip()]
    items = wlmod.load(names, workload_file, limit, workload_path, data, models)
    options.shard_count(sh, len(items))
    pol = _load_policy(policy) if policy else None
    if resume and out is None:
        root = Path(runs_root) if runs_root is not None else Path("runs")
        out = str(find_resumable(root, [(p.workload, p.prompt_id) for p in items]))
        print(f"resume: continuing {out} (the newest incomplete run under {root})", file=sys.stderr)
        preflight(out, resume, sh)
    _suffix_corpus(specs, out)
    carried = [s.name for s in specs if s.kind == "suffix" and s.settings.get("corpus", "run") == "run"]
    if (sh or ray) and carried:  # known before any model loads (a plug-in's is known once built, below)
        _refuse_across_prompts(carried[0], sh)

    # 2. Prompts (the tokenizer only), then the workers: the models, loaded once each.
    tok = lm.load_tokenizer(target_dir)
    prompts = [(p.workload, p.prompt_id, p.token_ids(tok)) for p in items]
    for wl, pid, ids in prompts:
        if not ids:
            raise lm.HarnessError(f"{wl}/{pid}: the prompt tokenizes to nothing")
    wl_names = list(dict.fromkeys(p.workload for p in items))
    plan = Plan(
        str(target_dir), specs, mode, k, max_new_tokens, temperature, seed, behaviour, generator, device, dtype, models
    )
    plan.exact, plan.threads, plan.workloads = exact_verify, threads, wl_names
    if ray:
        from harness import raypool  # the optional extra: only a --ray sweep imports it

        runner = raypool.Pool(plan, None if ray == "local" else ray, workers)
    else:
        runner = Worker(plan, pol)
    try:
        info = runner.info
        _check_lengths(prompts, info["n_pos"], max_new_tokens, k)
        if (sh or ray) and info["across_prompts"]:
            _refuse_across_prompts(info["across_prompts"][0], sh)

        # 3. The run directory.
        tname = target_dir.name if target_dir.name != "target" else f"{target_dir.parent.name}-target"
        run_dir = Path(out or f"runs/{tname}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}")
        dinfo = {
            n: {**d, "settings": {key: _shown_path(v) for key, v in d["settings"].items()}}
            for n, d in info["drafters"].items()
        }
        shown = _shown_path(str(target_dir)) if Path(target_dir).is_absolute() else str(target)
        manifest = make_manifest(
            run_dir.name,
            mode,
            {"name": tname, "path": shown, "sha256": lm.weights_sha256(target_dir)},
            dinfo,
            k,
            temperature,
            seed,
            wl_names,
            device,
        )
        manifest["hardware"] = info["hardware"]  # the workers' (a Ray driver may have no GPU of its own)
        manifest["n_prompts"] = len(prompts)
        settings = record_settings(
            mode=mode,
            k=k,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            dtype=dtype,
            device=device,
            generator=generator,
            behaviour=behaviour,
            workloads=wl_names,
            workload_names=names,
            workload_file=workload_file,
            workload_path=workload_path,
            data=data,
            live_prompts=live_prompts,
            exact_verify=exact_verify,
        )
        prompt_sha = {(wl, pid): _ids_sha(ids) for wl, pid, ids in prompts}
        kept = livephase.stored_policy_timing(run_dir) if resume else None
        if kept is not None:  # measured once: a resumed live phase runs the same policies
            manifest["live"] = {"policy_timing": kept}
        n_shards = runner.shards_for(len(prompts)) if ray else None
        rd = RunDir(run_dir, manifest, resume, settings=settings, prompt_sha=prompt_sha, shard=sh, n_shards=n_shards)
        try:
            return _sweep(rd, prompts, runner, cfg, calibrate, quiet, live_prompts, sh, live_pols)
        finally:
            rd.close()
    finally:
        runner.close()


def _refuse_across_prompts(name, shard) -> None:
    from harness.lm import HarnessError

    raise HarnessError(
        f"--drafter {name}: its drafts depend on the prompts run before it in the same process (suffix: "
        "corpus=run), so shards would differ from one process; use corpus=prompt (the default of new runs), "
        f"or run without {'--shard' if shard else '--ray'}"
    )


def _check_lengths(prompts, n_pos, max_new_tokens, k) -> None:
    from harness.lm import HarnessError

    for wl, pid, ids in prompts:
        if n_pos and len(ids) + max_new_tokens + k > n_pos:  # refused, not truncated: a cut prompt is another prompt
            raise HarnessError(
                f"{wl}/{pid}: {len(ids)} prompt tokens + {max_new_tokens} output tokens + k {k} "
                f"exceed the target's {n_pos} positions; shorten or drop the prompt, or lower "
                "--max-new-tokens"
            )


def _suffix_corpus(specs, out) -> None:
    """The suffix drafter's corpus (harness/drafters.py, SuffixDrafter): a new campaign gets corpus=prompt, exact
    under shards and Ray; a campaign already in `out` keeps what its manifest recorded (none recorded: a run from
    before the setting, corpus=run)."""
    recorded = {}
    mpath = Path(out) / "manifest.json" if out else None
    if mpath is not None and mpath.is_file():
        try:
            recorded = json.loads(mpath.read_text()).get("drafters") or {}
        except (OSError, ValueError, AttributeError):
            recorded = {}  # RunDir reports an unreadable manifest
    for s in specs:
        if s.kind != "suffix" or "corpus" in s.settings:
            continue
        old = recorded.get(s.name) if isinstance(recorded.get(s.name), dict) else None
        if old is None or old.get("kind") != "suffix":
            s.settings["corpus"] = "prompt"
        elif "corpus" in (old.get("settings") or {}):
            s.settings["corpus"] = old["settings"]["corpus"]
        else:
            print(
                f"note: drafter {s.name}: {out} was recorded before suffix corpus= existed; it keeps "
                "corpus=run (every earlier output of the run)",
                file=sys.stderr,
            )


def _batches(rd, prompts, shard):
    """What this sweep's workers run: (part tag, items) with items (workload, prompt_id, ids, output or None).
    One process: every prompt in order, the finished ones with their output (given to the drafters, as if
    run); a shard: its unfinished prompts; a Ray driver: each shard part's unfinished prompts."""
    key = lambda p: (p[0], p[1])
    if rd.shards and shard is None:  # Ray: the campaign's every shard, one queue entry each
        from harness.shards import shard_of

        parts = {}
        for p in prompts:
            if key(p) not in rd.done:
                parts.setdefault(shard_of(p[0], p[1], rd.shards), []).append((*p, None))
        return [(f"s{i}of{rd.shards}", items) for i, items in sorted(parts.items())]
    if shard is not None:
        return [(None, [(*p, None) for p in prompts if shard.holds(p[0], p[1]) and key(p) not in rd.done])]
    return [(None, [(*p, rd.done.get(key(p))) for p in prompts])]


def _sweep(rd, prompts, runner, cfg, calibrate, quiet, live_prompts=0, shard=None, live_policies=()):
    from tqdm import tqdm

    # 4. The sweep.
    mine = [p for p in prompts if shard is None or shard.holds(p[0], p[1])]
    todo = [p for p in mine if (p[0], p[1]) not in rd.done]
    say = (lambda *a: None) if quiet else (lambda m: tqdm.write(m))
    part = f" (shard {shard}: {len(mine)} of them)" if shard else f" in {rd.shards} shards" if rd.shards else ""
    say(
        f"run {rd.dir}: {len(prompts)} prompts{part} ({len(mine) - len(todo)} already done), "
        f"{len(runner.info['drafters'])} drafters, mode {cfg.mode}, k={cfg.k}"
    )
    n_blocks, t_start = 0, time.perf_counter()
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit="prompt", disable=quiet, dynamic_ncols=True)
    live_ms: dict[str, list[float]] = {n: [] for n in runner.info["drafters"]}
    for tag, res in runner.run(_batches(rd, prompts, shard)):
        wl, pid = res["workload"], res["prompt_id"]
        rd.append(wl, pid, res["records"], res["output"], tag)
        if res["check"] is not None:
            rd.append_check(wl, pid, res["check"], tag)
        rd.count(res["worker"], res["where"], len(res["records"]), res["seconds"])
        n_blocks += len(res["records"])
        for n, v in res["draft_ms"].items():
            live_ms[n] += v
        bar.set_postfix_str(f"{n_blocks / max(1e-9, time.perf_counter() - t_start):.1f} blocks/s")
        bar.update(1)
    bar.close()
    for wid, n in getattr(runner, "failures", {}).items():
        rd.workers.setdefault(wid, {"prompts": 0, "records": 0, "seconds": 0.0})["failures"] = n
    if shard is not None:
        return _finish_shard(rd, prompts, runner, live_prompts, say)
    _after_sweep(rd, prompts, runner, cfg, calibrate, quiet, (live_prompts, live_policies), live_ms, say)
    rd.manifest["target_check"] = check = target_check(rd, runner.info)
    if check["disagreements"] and not check["exact_verify"]:
        print(
            f"warning: the target's verification forward disagreed with the run's own token on "
            f"{check['disagreements']} of {check['tokens']} output tokens ({check['prompts']} prompts, first "
            f"{check['first'][0]}) at {check['dtype']}; dense logs may differ from live runs there "
            "(--exact-verify makes them agree)",
            file=sys.stderr,
        )
    rd.manifest["complete"] = True  # every prompt (and the live phase) done: analyses read it as finished
    rd.write_manifest()
    _say_done(rd, n_blocks, say)
    return rd.dir


def _after_sweep(rd, prompts, runner, cfg, calibrate, quiet, live, live_ms, say) -> None:
    """5. Timing calibration (after the sweep: the live phase changes drafter state), on one worker. `live`:
    (prompts per workload, policies) of the live phase."""
    import statistics

    from tqdm import tqdm

    from harness import livephase

    names, k, info = list(runner.info["drafters"]), cfg.k, runner.info
    (live_prompts, policies), timing, raw = live, None, None
    if cfg.mode == "live":
        pre = [ids + rd.done[(wl, pid)][: max(1, len(rd.done[(wl, pid)]) // 2)] for wl, pid, ids in prompts[:4]]
        vm, vb = runner.time_verify(pre, k, len(names))
        timing = {
            "verify_ms": vm,
            "verify_batch_ms": vb,
            "drafter_ms": {n: (round(statistics.median(v), 4) if v else None) for n, v in live_ms.items()},
        }
    elif live_prompts > 0:
        n_live = len(livephase.sample(prompts, live_prompts, cfg.seed))
        configs = livephase.configurations(names, policies)
        say(f"live phase: {n_live} prompts x {len(configs)} configurations ({', '.join(configs)})")
        lbar = tqdm(total=n_live * len(configs), unit="decode", desc="live", disable=quiet, dynamic_ncols=True)
        summary = livephase.run(rd, runner, prompts, names, cfg, live_prompts, lbar.update, policies)
        lbar.close()
        livephase.warn(summary, cfg.temperature, info["dtype"], info["exact"])
        timing = livephase.timing(rd, runner.time_verify, prompts, k, len(names))
        rd.manifest["live"] = summary
    elif calibrate > 0:
        say(f"live calibration phase: {calibrate} prompt(s) per drafter")
        cal = prompts[:calibrate]
        cbar = tqdm(total=len(cal) * len(names), unit="prompt", desc="calibration", disable=quiet)
        timing, raw = runner.calibrate(cal, cbar.update)
        cbar.close()
    if timing is not None:
        timing["drafter_ms"] = {n: v for n, v in timing["drafter_ms"].items() if v is not None}
        rd.manifest["timing"] = timing
        rd.write_manifest()
        if raw is not None:
            rd.write_text("live_calibration.json", json.dumps(raw, indent=2) + "\n")


def _finish_shard(rd, prompts, runner, live_prompts, say):
    """A shard's end: its throughput and the campaign's target check so far into the manifest, and, when every
    prompt of the campaign is done (the last shard to finish) and no live phase remains, `complete`."""

    def update(m):
        missing = sum(1 for p in prompts if (p[0], p[1]) not in rd.done)
        m["target_check"] = target_check(rd, runner.info)
        if not missing and not live_prompts:
            m["complete"] = True
        return missing

    missing = rd.update_manifest(update)
    if missing:
        say(f"shard {rd.shard} done; the campaign still lacks {missing} prompts of other shards")
    elif live_prompts:
        say(
            f"every prompt of the campaign is done; the live phase remains: python sweep.py --resume --out {rd.dir} "
            "(the same options, without --shard)"
        )
    _say_done(rd, None, say)
    return rd.dir


def _say_done(rd, n_blocks, say) -> None:
    shown = rd.dir.resolve()
    if shown.is_relative_to(Path.cwd()):  # the short form the analysis commands are usually typed with
        shown = shown.relative_to(Path.cwd())
    several = rd.blocks is None or len([p for p in rd.parts.values() if p.blocks.exists()]) > 1
    logs = shown / (f"blocks_{rd.mode}*.jsonl" if several else rd.blocks.name)
    new = "" if n_blocks is None else f" ({n_blocks} new records)"
    say(f"logs: {logs}{new}, manifest: {shown / 'manifest.json'}")
    say(f"analyse with:\n  python bandit/replay.py {shown}\n  python bandit/ci.py {shown}")


def target_check(rd, info) -> dict:
    """The manifest's `target_check` from every part's target check lines (finished prompts only)."""
    from harness import shards

    return shards.check_summary(rd.check_lines(), info["dtype"], info["exact"])


if __name__ == "__main__":
    app()
