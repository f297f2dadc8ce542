"""One collection campaign, checked and set up (`sweep.py`'s work below its command line): every option and input
that can be refused without a model, the prompts, the workers (in this process or on Ray), the run directory
(harness/campaign/rundir.py) and the manifest; then harness/campaign/collect.py runs it. Torch-free at import, like sweep.py:
torch, the models and the workloads load only when `run_sweep` runs."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import typer

from . import collect, shards
from ..models import options

REPO = Path(__file__).resolve().parents[2]


def fail(msg: str) -> None:
    """A problem with the user's input: one line, and bandit.errors' exit code for it (typer's usage errors keep 2)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(1)


POLICY_GROUP = "specbandit.policies"  # plug-in policies: entry points of this group


def _load_policy(spec: str):
    """NAME[:key=value,...] -> the policy: a class of bandit/policies/registry.py by its lower-case name, or an installed
    plug-in (entry point of POLICY_GROUP); never an arbitrary module:attr named on the command line."""
    from importlib.metadata import entry_points

    from bandit.policies.registry import ALL
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


def shard_options(shard, ray, workers, policy, calibrate, out):
    """--shard / --ray / --workers against each other and the rest; returns the parsed shard (or None)."""
    try:
        sh = shards.parse_shard(shard) if shard is not None else None
    except shards.CampaignError as e:
        options.fail(str(e))
    if sh and ray:
        options.fail("--shard with --ray: Ray splits the campaign itself; give one of them")
    if workers and not ray:
        options.fail(f"--workers {workers}: applies to --ray only")
    if policy and (sh or ray):
        options.fail("--policy learns from the prompts in their order: run it in one process (no --shard, --ray)")
    if sh and calibrate:
        options.fail("--calibrate with --shard: calibrate in the final --resume without --shard")
    if sh and out is None:
        options.fail(f"--shard {sh}: give --out, the campaign directory every shard writes into")
    return sh


def shard_count(sh, n_prompts: int) -> None:
    """More shards than prompts leaves shards with nothing to run: refused with the count."""
    if sh is not None and sh.count > n_prompts:
        options.fail(
            f"--shard {sh}: {sh.count} shards for a campaign of {n_prompts} prompts; N must be at most {n_prompts}"
        )


def _shown_path(v):
    """Absolute paths inside the repository are recorded relative to it (manifests travel)."""
    if isinstance(v, str) and os.path.isabs(v) and Path(v).resolve().is_relative_to(REPO.resolve()):
        return os.path.relpath(Path(v).resolve(), REPO.resolve())
    return v


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
    verify_pad=None,
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
        **({"verify_pad": verify_pad} if verify_pad else {}),
    }


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
    threads=None,
    kernels="default",
    verify_pad=None,
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
    workers (harness/campaign/raypool.py), `workers` of them (0: one per GPU or CPU slot). `live_policies`: the live phase's
    policies, comma-separated (None: every live policy; "": none)."""
    # torch-free (options): a bad number or device is refused before torch, a model, a file
    opts = dict(k=k, max_new_tokens=max_new_tokens, temp=temperature, seed_=seed, threads=threads, device_=device)
    if kernels not in options.KERNEL_CHOICES:
        options.fail(f"--kernels {kernels!r}: expected one of {', '.join(options.KERNEL_CHOICES)}")
    options.check(**opts, limit=limit, live_prompts=live_prompts, calibrate=calibrate, workers=workers, ray=ray)
    verify_pad = options.verify_pad(verify_pad)
    if verify_pad and exact_verify:
        options.fail("--verify-pad with --exact-verify: an exact verify feeds one token per forward, nothing to pad")
    if verify_pad and verify_pad != "auto" and max(options.pad_of(verify_pad).values()) > k + 1:
        options.fail(f"--verify-pad {verify_pad}: a verify is at most k + 1 = {k + 1} tokens; pad to no more")
    import workloads as wlmod
    from harness.models import lm
    from harness.drafters import parse_spec
    from harness.decode import livephase
    from harness.decode.engine import RunConfig
    from harness.campaign.manifest import make_manifest
    from harness.campaign.outputs import Lines, prompt_sha
    from harness.campaign.preflight import find_resumable, preflight
    from harness.campaign.rundir import RunDir
    from harness.campaign.worker import Plan, Worker

    # 1. Everything that can be checked without loading a model.
    if not drafter:
        raise lm.HarnessError("no drafters: give at least one --drafter NAME=KIND[:key=value,...]")
    specs = [parse_spec(s) for s in drafter]
    cfg = RunConfig(mode, k, max_new_tokens, temperature, seed, behaviour, generator)
    cfg.check([s.name for s in specs])
    sh = shard_options(shard, ray, workers, policy, calibrate, out)
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
    shard_count(sh, len(items))
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
    if threads is None and device == "cpu" and ray not in (None, "local"):
        threads = 1  # another cluster's nodes: this host's cores say nothing of theirs (an actor must fit a node)
    elif threads is None and device == "cpu":  # every core, shared among the processes that run side by side
        threads = max(1, options.CORES // (sh.count if sh else max(workers, 1) if ray else 1))
    plan.exact, plan.threads, plan.workloads, plan.kernels = exact_verify, threads, wl_names, kernels
    plan.verify_pad = None if sh else verify_pad  # a shard runs dense work only, which never verifies one chain
    if plan.verify_pad == "auto" and resume and out is not None:  # measured once: a resumed run keeps its table
        plan.verify_pad, plan.pad_ms = _recorded_pad(Path(out), verify_pad)
    if ray:
        from harness.campaign import raypool  # the optional extra: only a --ray sweep imports it

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
            {"name": tname, "path": shown, "sha256": lm.weights_sha256(target_dir), **converted_from(target_dir)},
            dinfo,
            k,
            temperature,
            seed,
            wl_names,
            device,
        )
        manifest["hardware"] = info["hardware"]  # the workers' (a Ray driver may have no GPU of its own)
        if info.get("kernels"):  # what the target's forward ran on: dtype, kernel path, threads, the probe's figures
            manifest["kernels"] = info["kernels"]
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
            verify_pad=verify_pad,
        )
        shas = {(wl, pid): prompt_sha(ids) for wl, pid, ids in prompts}
        lines = Lines(tok, {(wl, pid): ids for wl, pid, ids in prompts})  # outputs.jsonl (harness/campaign/outputs.py)
        kept = livephase.stored_policy_timing(run_dir) if resume else None
        if kept is not None:  # measured once: a resumed live phase runs the same policies
            manifest["live"] = {"policy_timing": kept}
        n_shards = runner.shards_for(len(prompts)) if ray else None
        rd = RunDir(run_dir, manifest, resume, settings, shas, sh, n_shards, lines)
        try:
            return collect.run(rd, prompts, runner, cfg, calibrate, quiet, live_prompts, sh, live_pols)
        finally:
            rd.close()
    finally:
        runner.close()


def _refuse_across_prompts(name, shard) -> None:
    from harness.models.lm import HarnessError

    raise HarnessError(
        f"--drafter {name}: its drafts depend on the prompts run before it in the same process (suffix: "
        "corpus=run), so shards would differ from one process; use corpus=prompt (the default of new runs), "
        f"or run without {'--shard' if shard else '--ray'}"
    )


def _recorded_pad(out: Path, spec: str) -> tuple[str, dict | None]:
    """The padding table an earlier session of the run measured (the manifest's kernels), as --verify-pad text, and
    the forward times it came from; (spec, None) when there is none yet."""
    from harness.campaign.shards import read_json

    kern = (read_json(out / "manifest.json") or {}).get("kernels") or {}
    try:
        table = {int(q): int(v) for q, v in kern["verify_pad"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return spec, None
    text = ",".join(f"{q}:{table[q]}" for q in sorted(table))
    return text or "none", kern.get("pass_ms")


def _check_lengths(prompts, n_pos, max_new_tokens, k) -> None:
    from harness.models.lm import HarnessError

    for wl, pid, ids in prompts:
        if n_pos and len(ids) + max_new_tokens + k > n_pos:  # refused, not truncated: a cut prompt is another prompt
            raise HarnessError(
                f"{wl}/{pid}: {len(ids)} prompt tokens + {max_new_tokens} output tokens + k {k} "
                f"exceed the target's {n_pos} positions; shorten or drop the prompt, or lower "
                "--max-new-tokens"
            )


def _suffix_corpus(specs, out) -> None:
    """The suffix drafter's corpus (harness/drafters/suffix.py, SuffixDrafter): a new campaign gets corpus=prompt,
    exact under shards and Ray; a campaign already in `out` keeps what its manifest recorded (none recorded: a run
    from before the setting, corpus=run)."""
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


def converted_from(target_dir) -> dict:
    """`converted_from`: the GGUF a target directory was converted from (harness/models/gguf.py's conversion.json: the
    source file's sha256 and package, the converted weights' sha256), for the manifest; nothing for other targets."""
    from harness.models import gguf

    from harness.models import lm

    src = gguf.conversion_source(target_dir)  # its weights named by their identity now, whatever the record's scheme
    return {"converted_from": {**src, "weights_sha256": lm.weights_sha256(Path(target_dir))}} if src else {}
