"""Running a set-up campaign (harness/campaign/campaign.py): the prompts through the workers into the run directory, then
the timing calibration or the live phase, the target check, the outputs' check, and the manifest's completion; a
shard's own end (its part finished, the campaign complete once every shard is). Torch-free at import."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _batches(rd, prompts, shard):
    """What this sweep's workers run: (part tag, items) with items (workload, prompt_id, ids, output or None).
    One process: every prompt in order, the finished ones with their output (given to the drafters, as if
    run); a shard: its unfinished prompts; a Ray driver: each shard part's unfinished prompts."""
    key = lambda p: (p[0], p[1])
    if rd.shards and shard is None:  # Ray: the campaign's every shard, one queue entry each
        from harness.campaign.shards import shard_of

        parts = {}
        for p in prompts:
            if key(p) not in rd.done:
                parts.setdefault(shard_of(p[0], p[1], rd.shards), []).append((*p, None))
        return [(f"s{i}of{rd.shards}", items) for i, items in sorted(parts.items())]
    if shard is not None:
        return [(None, [(*p, None) for p in prompts if shard.holds(p[0], p[1]) and key(p) not in rd.done])]
    return [(None, [(*p, rd.done.get(key(p))) for p in prompts])]


def run(rd, prompts, runner, cfg, calibrate, quiet, live_prompts=0, shard=None, live_policies=()):
    """Steps 4-5 of a campaign: the sweep over this process's prompts, then its end. Returns the run directory."""
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
    rd.manifest["outputs"] = outputs_check(rd)
    rd.manifest["complete"] = True  # every prompt (and the live phase) done: analyses read it as finished
    rd.write_manifest()
    _say_done(rd, n_blocks, say)
    return rd.dir


def _after_sweep(rd, prompts, runner, cfg, calibrate, quiet, live, live_ms, say) -> None:
    """5. Timing calibration (after the sweep: the live phase changes drafter state), on one worker. `live`:
    (prompts per workload, policies) of the live phase."""
    import statistics

    from tqdm import tqdm

    from harness.decode import livephase

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
        if not missing:  # the campaign's every prompt: its outputs checked once, by the last shard to finish
            m["outputs"] = outputs_check(rd)
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
    from harness.campaign import shards

    return shards.check_summary(rd.check_lines(), info["dtype"], info["exact"])


def outputs_check(rd) -> dict:
    """The manifest's `outputs`: every part's outputs file checked against its progress and block log
    (harness/campaign/outputs.py `check`); a disagreement is a warning (the logs stand)."""
    from harness.campaign import outputs

    res = outputs.check(rd.dir)
    if res["problems"]:
        print(
            f"warning: {rd.dir}: outputs.jsonl disagrees with the run's logs ({res['problems']} problems, first: "
            f"{res['first'][0]}); check it with  python -m harness.outputs {rd.dir} --check",
            file=sys.stderr,
        )
    return res
