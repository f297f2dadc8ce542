"""Collection campaign: every drafter drafts from the identical prefix, the target verifies,
one schema-v1 JSON line per block goes to runs/<run>/ (see docs/DESIGN.md, docs/manifest.md).

\b
    python sweep.py                     # the embedded CPU default on the zoo models
    python sweep.py --target DIR --drafter NAME=KIND[:key=value,...] ... \\
        --workloads code,math | --workload-file FILE  --mode dense|sparse|live \\
        --k 8 --max-new-tokens 128 --temperature 0 --seed 0 --out runs/NAME [--resume] [--limit N]

Drafter kinds: ngram, suffix, draft (path=), medusa (path=), eagle (path=), cascade (of=a+b),
or a plug-in (module.path:Class, or an entry point of group specbandit.drafters): see
harness/drafters.py. Models are paths or names under --models / $MACH_MODELS /
$SPECBANDIT_MODELS. Benchmark workloads for GPU hosts: see workloads.py.
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

# ---- The embedded default (the zoo issue provides the models; tune the sizes here) ----
DEFAULT_PROMPTS_PER_WORKLOAD = 240  # prompts per workload in the dense phase of `python sweep.py`; sized to leave room for the live phase: both together took about 10 min on 2 CPU cores
DEFAULT_MAX_NEW_TOKENS = 128  # output tokens per prompt
DEFAULT_K = 8
DEFAULT_LIVE_PROMPTS = 30  # live phase: prompts per workload decoded for real by every configuration
DEFAULT_GENERATOR = "ngram"  # dense: the target's output comes from speculative decoding with it (exact)
DEFAULT_TARGET = "zoo/target"
DEFAULT_DRAFTERS = ["ngram=ngram", "suffix=suffix", "draft=draft:path=zoo/draft", "medusa=medusa:path=zoo/medusa",
                    "eagle=eagle:path=zoo/eagle", "cascade=cascade:of=draft+ngram"]
DEFAULT_WORKLOADS = ["code", "math", "chat", "copy"]
ZOO_FILES = ["zoo/target/config.json", "zoo/target/model.safetensors", "zoo/target/tokenizer.json",
             "zoo/draft/config.json", "zoo/draft/model.safetensors", "zoo/draft/tokenizer.json",
             "zoo/medusa/config.json", "zoo/medusa/model.safetensors",
             "zoo/eagle/config.json", "zoo/eagle/model.safetensors"] + [
             f"zoo/workloads/{w}.jsonl" for w in DEFAULT_WORKLOADS]

app = typer.Typer(add_completion=False, help=__doc__, rich_markup_mode=None)


def fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def _kv_list(items: list[str], flag: str) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            fail(f"{flag} {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def _load_policy(spec: str):
    """module.path:Class[:key=value,...] -> Class(**settings)."""
    from harness.drafters import _settings, resolve_class
    parts = spec.split(":", 2)
    if len(parts) < 2:
        fail(f"--policy {spec!r}: expected module.path:ClassName[:key=value,...]")
    cls = resolve_class(f"{parts[0]}:{parts[1]}")
    pol = cls(**_settings(parts[2] if len(parts) > 2 else "", f"--policy {spec}"))
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


@app.command(help=__doc__)
def main(
    target: Optional[str] = typer.Option(None, help="target model dir or name under the models root "
                                         "(omit for the embedded zoo default)"),
    drafter: List[str] = typer.Option([], "--drafter", help="NAME=KIND[:key=value,...], repeatable"),
    workloads: Optional[str] = typer.Option(None, help="comma-separated workload names (see workloads.py)"),
    workload_file: Optional[str] = typer.Option(None, help="JSONL of {workload, prompt_id, prompt|messages}"),
    workload_path: List[str] = typer.Option([], "--workload-path", help="NAME=FILE: a benchmark file, repeatable"),
    data: Optional[str] = typer.Option(None, help="root of local benchmark files"),
    models: Optional[str] = typer.Option(None, help="models root (else $MACH_MODELS, $SPECBANDIT_MODELS)"),
    mode: str = typer.Option("dense", help="dense | sparse | live"),
    k: int = typer.Option(DEFAULT_K, help="maximum draft length"),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="output tokens per prompt"),
    temperature: float = typer.Option(0.0, help="0 = greedy; > 0 = Gumbel-max coupled sampling"),
    seed: int = typer.Option(0, help="keys all sampling noise"),
    out: Optional[str] = typer.Option(None, help="run directory (default runs/<name>-<UTC time>)"),
    resume: bool = typer.Option(False, help="continue the run in --out, skipping finished prompts "
                                "(without --out: the newest incomplete run under runs/)"),
    limit: Optional[int] = typer.Option(None, help="at most N prompts per workload"),
    device: str = typer.Option("cpu", help="cpu | cuda"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    behaviour: Optional[str] = typer.Option(None, help="sparse: the drafter whose draft advances the output"),
    generator: Optional[str] = typer.Option(None, help="dense: make the target's output by speculative decoding "
                                            "with this drafter (identical output, fewer target passes)"),
    policy: Optional[str] = typer.Option(None, help="live: module.path:Class[:k=v] choosing a drafter per block"),
    calibrate: int = typer.Option(0, help="prompts per drafter in a short live timing calibration after the sweep "
                                  "(ignored when --live-prompts is given)"),
    live_prompts: int = typer.Option(0, help="live phase after a dense sweep: a seeded sample of N prompts per "
                                     "workload decoded for real by every fixed drafter and by best-of-N "
                                     "(live.jsonl; the embedded default uses 30)"),
    threads: int = typer.Option(0, help="torch CPU threads (0: 1 on cpu, where small models lose more to "
                                "thread hand-offs than they gain; torch's default on cuda)"),
):
    from harness.lm import HarnessError
    from workloads import WorkloadError
    default = target is None
    if default:
        missing = _missing_zoo()
        if missing:
            fail("the embedded default runs on the zoo models, and these files are missing:\n  "
                 + "\n  ".join(missing) + "\nmake them with:  python -m zoo.train all\n"
                 "or give your own --target DIR --drafter ... --workloads ...")
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
    try:
        run_sweep(target=target, drafter=drafter, workloads=workloads, workload_file=workload_file,
                  workload_path=_kv_list(workload_path, "--workload-path"), data=data, models=models, mode=mode,
                  k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, out=out, resume=resume,
                  limit=limit, device=device, dtype=dtype, behaviour=behaviour, generator=generator, policy=policy,
                  calibrate=calibrate, live_prompts=live_prompts, threads=threads,
                  runs_root=REPO / "runs" if default else None)
    except (HarnessError, WorkloadError) as e:
        fail(str(e))


def _abs(p):
    return None if p in (None, "") else _shown_path(os.path.abspath(p))


def record_settings(*, mode, k, max_new_tokens, temperature, seed, dtype, device, generator, behaviour, workloads,
                    workload_names, workload_file, workload_path, data, live_prompts=0) -> dict:
    """The settings that change the records, beyond the manifest's (compared on --resume; --limit is not
    one: a run may be continued with more prompts)."""
    return {"mode": mode, "k": k, "max_new_tokens": max_new_tokens, "temperature": float(temperature),
            "seed": seed, "dtype": dtype, "device": device, "generator": generator, "behaviour": behaviour,
            "workloads": list(workloads), "workload_names": list(workload_names),
            "workload_file": _abs(workload_file),
            "workload_path": {n: _abs(f) for n, f in sorted((workload_path or {}).items())}, "data": _abs(data),
            **({"live_prompts": live_prompts} if live_prompts else {})}


def _ids_sha(ids) -> str:
    import hashlib
    return hashlib.sha256(json.dumps([int(t) for t in ids]).encode()).hexdigest()[:16]


def run_sweep(*, target, drafter, workloads=None, workload_file=None, workload_path=None, data=None, models=None,
              mode="dense", k=8, max_new_tokens=128, temperature=0.0, seed=0, out=None, resume=False, limit=None,
              device="cpu", dtype="float32", behaviour=None, generator=None, policy=None, calibrate=0, threads=0,
              quiet=False, runs_root=None, live_prompts=0):
    """Validate everything, then run. Returns the run directory."""
    import torch
    import workloads as wlmod
    from harness import lm
    from harness.drafters import DrafterEnv, build_drafters, parse_spec
    from harness.engine import Engine, RunConfig
    from harness.rundir import RunDir, find_resumable, make_manifest, preflight
    from harness.target import Target

    # 1. Everything that can be checked without loading a model.
    if not drafter:
        raise lm.HarnessError("no drafters: give at least one --drafter NAME=KIND[:key=value,...]")
    specs = [parse_spec(s) for s in drafter]
    cfg = RunConfig(mode, k, max_new_tokens, temperature, seed, behaviour, generator)
    cfg.check([s.name for s in specs])
    if policy and mode != "live":
        raise lm.HarnessError("--policy applies to --mode live only")
    if policy and resume:
        raise lm.HarnessError("--resume with --policy: a policy's learned state is not saved; start a new run")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise lm.HarnessError(f"--device {device}: CUDA is not available on this machine")
    if limit is not None and limit < 1:
        raise lm.HarnessError(f"--limit {limit}: must be >= 1")
    if live_prompts < 0 or calibrate < 0:
        raise lm.HarnessError(f"--live-prompts {live_prompts} / --calibrate {calibrate}: must be >= 0")
    if live_prompts and mode != "dense":
        raise lm.HarnessError("--live-prompts: the live phase follows a dense sweep (--mode dense)")
    if out is not None:
        preflight(out, resume)
    names_given = [w for w in (workloads or "").split(",") if w.strip()]
    if names_given and workload_file:
        raise lm.HarnessError("give --workloads NAMES or --workload-file FILE, not both")
    target_dir = lm.resolve_model_dir(target, models, "--target")
    names = [w.strip() for w in (workloads or "").split(",") if w.strip()]
    items = wlmod.load(names, workload_file, limit, workload_path, data, models)
    pol = _load_policy(policy) if policy else None
    if resume and out is None:
        root = Path(runs_root) if runs_root is not None else Path("runs")
        out = str(find_resumable(root, [(p.workload, p.prompt_id) for p in items]))
        print(f"resume: continuing {out} (the newest incomplete run under {root})", file=sys.stderr)
        preflight(out, resume)

    # 2. Models (tokenizer and path checks happen while building drafters).
    if threads or device == "cpu":
        torch.set_num_threads(threads or 1)
    torch.manual_seed(seed)
    tok = lm.load_tokenizer(target_dir)
    model = lm.load_lm(target_dir, device, dtype)
    env = DrafterEnv(model, tok, target_dir, device, dtype, models, temperature, seed)
    drafters = build_drafters(specs, env)
    tgt = Target(model, tok, device, temperature)
    prompts = [(p.workload, p.prompt_id, p.token_ids(tok)) for p in items]
    n_pos = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    for wl, pid, ids in prompts:
        if not ids:
            raise lm.HarnessError(f"{wl}/{pid}: the prompt tokenizes to nothing")
        if n_pos and len(ids) + max_new_tokens + k > n_pos:  # refused, not truncated: a cut prompt is another prompt
            raise lm.HarnessError(f"{wl}/{pid}: {len(ids)} prompt tokens + {max_new_tokens} output tokens + k {k} "
                                  f"exceed the target's {n_pos} positions; shorten or drop the prompt, or lower "
                                  "--max-new-tokens")
    wl_names = list(dict.fromkeys(p.workload for p in items))
    engine = Engine(tgt, drafters, cfg, pol, wl_names)

    # 3. The run directory.
    tname = target_dir.name if target_dir.name != "target" else f"{target_dir.parent.name}-target"
    run_dir = Path(out or f"runs/{tname}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}")
    dinfo = {}
    for s in specs:
        d = drafters[s.name]
        info = getattr(d, "info", lambda: {"settings": s.settings, "sha256": None})()
        settings = {k: _shown_path(v) for k, v in info.get("settings", s.settings).items()}
        dinfo[s.name] = {"kind": s.kind, "settings": settings, "sha256": info.get("sha256")}
    shown = _shown_path(str(target_dir)) if Path(target_dir).is_absolute() else str(target)
    manifest = make_manifest(run_dir.name, mode, {"name": tname, "path": shown, "sha256": lm.weights_sha256(target_dir)},
                             dinfo, k, temperature, seed, wl_names, device)
    settings = record_settings(mode=mode, k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                               dtype=dtype, device=device, generator=generator, behaviour=behaviour,
                               workloads=wl_names, workload_names=names, workload_file=workload_file,
                               workload_path=workload_path, data=data, live_prompts=live_prompts)
    prompt_sha = {(wl, pid): _ids_sha(ids) for wl, pid, ids in prompts}
    rd = RunDir(run_dir, manifest, resume, settings=settings, prompt_sha=prompt_sha)
    make = lambda: build_drafters(specs, env)  # noqa: E731 - fresh drafters for the live phase
    try:
        return _sweep(rd, prompts, drafters, engine, tgt, k, max_new_tokens, temperature, seed, mode, calibrate,
                      quiet, live_prompts, make)
    finally:
        rd.close()


def _sweep(rd, prompts, drafters, engine, tgt, k, max_new_tokens, temperature, seed, mode, calibrate, quiet,
           live_prompts=0, make_drafters=None):
    from tqdm import tqdm

    from harness.calibrate import live_phase, time_verify
    from harness.engine import RunConfig

    # 4. The sweep.
    todo = [p for p in prompts if (p[0], p[1]) not in rd.done]
    say = (lambda *a: None) if quiet else (lambda m: tqdm.write(m))
    say(f"run {rd.dir}: {len(prompts)} prompts ({len(prompts) - len(todo)} already done), "
        f"{len(drafters)} drafters, mode {mode}, k={k}")
    n_blocks, t_start = 0, time.perf_counter()
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), unit="prompt", disable=quiet, dynamic_ncols=True)
    live_ms: dict[str, list[float]] = {n: [] for n in drafters}
    for wl, pid, ids in prompts:
        if (wl, pid) in rd.done:  # finished before a restart: only give its output to the drafters
            engine.skip(rd.done[(wl, pid)])
            continue
        res = engine.run_prompt(wl, pid, ids)
        rd.append(wl, pid, res.records, res.output)
        n_blocks += len(res.records)
        for n, v in res.timings.get("draft", {}).items():
            live_ms[n] += v
        rate = n_blocks / max(1e-9, time.perf_counter() - t_start)
        bar.set_postfix_str(f"{rate:.1f} blocks/s")
        bar.update(1)
    bar.close()

    # 5. Timing calibration (after the sweep: the live phase changes drafter state).
    import statistics
    timing, raw = None, None
    if mode == "live":
        pre = [ids + rd.done[(wl, pid)][: max(1, len(rd.done[(wl, pid)]) // 2)] for wl, pid, ids in prompts[:4]]
        vm, vb = time_verify(tgt, pre, k, len(drafters))
        timing = {"verify_ms": vm, "verify_batch_ms": vb,
                  "drafter_ms": {n: (round(statistics.median(v), 4) if v else None) for n, v in live_ms.items()}}
    elif live_prompts > 0:
        from harness import livephase
        n_live = len(livephase.sample(prompts, live_prompts, seed))
        configs = livephase.configurations(list(drafters))
        say(f"live phase: {n_live} prompts x {len(configs)} configurations ({', '.join(configs)})")
        lbar = tqdm(total=n_live * len(configs), unit="decode", desc="live", disable=quiet, dynamic_ncols=True)
        summary = livephase.run(rd, tgt, make_drafters, prompts, RunConfig("live", k, max_new_tokens, temperature,
                                                                            seed), live_prompts, lbar.update)
        lbar.close()
        timing = livephase.timing(rd, tgt, prompts, k, len(drafters))
        rd.manifest["live"] = summary
    elif calibrate > 0:
        say(f"live calibration phase: {calibrate} prompt(s) per drafter")
        cal = prompts[:calibrate]
        cbar = tqdm(total=len(cal) * len(drafters), unit="prompt", desc="calibration", disable=quiet)
        timing, raw = live_phase(tgt, drafters, cal, RunConfig("live", k, min(max_new_tokens, 64), temperature, seed),
                                 cbar.update)
        cbar.close()
    if timing is not None:
        timing["drafter_ms"] = {n: v for n, v in timing["drafter_ms"].items() if v is not None}
        rd.manifest["timing"] = timing
        rd.write_manifest()
        if raw is not None:
            rd.write_text("live_calibration.json", json.dumps(raw, indent=2) + "\n")
    rd.manifest["complete"] = True  # every prompt (and the live phase) done: analyses read it as finished
    rd.write_manifest()
    shown = rd.dir.resolve()
    if shown.is_relative_to(Path.cwd()):  # the short form the analysis commands are usually typed with
        shown = shown.relative_to(Path.cwd())
    say(f"logs: {shown / rd.blocks.name} ({n_blocks} new records), manifest: {shown / 'manifest.json'}")
    say(f"analyse with:\n  python bandit/replay.py {shown}\n  python bandit/ci.py {shown}")
    return rd.dir


if __name__ == "__main__":
    app()
