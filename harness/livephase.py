"""The live phase of a campaign: real speculative decoding on a seeded sample of its prompts.

After the dense phase, every live configuration decodes the same sample of prompts for real:
each fixed drafter alone (`fixed:<name>`), and best-of-N (every drafter drafts, one tree
forward verifies all drafts, the longest accepted one advances). For every (configuration,
prompt) one line goes to `live.jsonl` in the run directory (fields below); `bandit/wallclock.py`
fits its timing model on them and checks its dense-log predictions against them.

The sample: per workload, the `n_per_workload` prompts whose sha256(seed:workload:prompt_id)
is smallest, so that it does not depend on the order or the number of prompts beside them.

Drafter state carried across prompts (the suffix drafter's corpus=run of earlier outputs) is what
the dense phase had at the same prompt: the live phase walks the campaign's prompts in the
sweep's order, hands every prompt's dense output to the drafters once (sampled or not), and
decodes a sampled prompt with every configuration before that. Configurations take turns on
each prompt, so drift in the machine's speed falls on all of them alike.

The decodes run in one worker (harness/worker.py: in the sweep's process, or one Ray actor), after every
dense prompt of the campaign is done, so that the timings come from one machine; the driver writes their
lines (`run`), and a killed live phase resumes at the first sampled prompt not fully written.

live.jsonl fields (one line per configuration and prompt):
    config       "fixed:<drafter>" | "best_of_n"
    workload, prompt_id
    prompt_len   tokens in the prompt
    tokens       output tokens produced
    passes       target forwards after the prefill (one verify per block)
    verified     tokens through those verify forwards, summed (trunk + every draft)
    calls        {drafter: draft calls}
    wall_ms      the prompt's whole decode, prefill included
    prefill_ms, verify_ms, draft_ms ({drafter: summed call time}) - parts of wall_ms
    same_as_dense   whether the output equals the dense phase's (greedy: it must)
"""

from __future__ import annotations

import hashlib
import json
import sys

from .engine import Engine, RunConfig
from .target import now_ms

LIVE_FILE = "live.jsonl"


def sample(prompts: list[tuple[str, str, list[int]]], n_per_workload: int, seed: int) -> set[tuple[str, str]]:
    """The seeded live sample: (workload, prompt_id) pairs, at most n per workload."""
    by_wl: dict[str, list[tuple[str, str]]] = {}
    for wl, pid, _ in prompts:
        h = hashlib.sha256(f"{seed}:{wl}:{pid}".encode()).hexdigest()
        by_wl.setdefault(wl, []).append((h, pid))
    return {(wl, pid) for wl, hs in by_wl.items() for _, pid in sorted(hs)[:n_per_workload]}


def configurations(names: list[str]) -> list[str]:
    return [f"fixed:{n}" for n in names] + (["best_of_n"] if len(names) > 1 else [])


def _line(config, wl, pid, ids, res, wall_ms, dense_output) -> dict:
    t = res.timings
    drafts = t["draft"]
    return {
        "config": config,
        "workload": wl,
        "prompt_id": pid,
        "prompt_len": len(ids),
        "tokens": len(res.output),
        "passes": len(t["verify"]),
        "verified": int(sum(v[0] for v in t["verify"])),
        "calls": {n: len(v) for n, v in drafts.items() if v},
        "wall_ms": round(wall_ms, 3),
        "prefill_ms": round(t["prefill_ms"], 3),
        "verify_ms": round(sum(v[2] for v in t["verify"]), 3),
        "draft_ms": {n: round(sum(v), 3) for n, v in drafts.items() if v},
        "same_as_dense": res.output == list(dense_output),
    }


def read_done(rd, configs: list[str], chosen: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Prompts of the sample whose every configuration is in live.jsonl; rewrites the file to exactly
    those, one line per configuration (a killed live phase leaves at most one prompt half done, or a
    truncated last line)."""
    path = rd.dir / LIVE_FILE
    if not path.exists():
        return set()
    lines: dict[tuple[str, str], dict[str, str]] = {}
    for raw in path.read_text().splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            break
        lines.setdefault((rec["workload"], rec["prompt_id"]), {}).setdefault(rec["config"], raw)
    want = set(configs)
    done = {k for k, v in lines.items() if set(v) == want and k in chosen}
    rd.write_text(LIVE_FILE, "".join(v[c] + "\n" for k, v in lines.items() if k in done for c in configs))
    return done


def pending(rd, names: list[str], prompts, n_per_workload: int, seed: int):
    """(configurations, the sample, the sampled prompts already decoded by every configuration)."""
    configs = configurations(names)
    chosen = sample(prompts, n_per_workload, seed)
    return configs, chosen, read_done(rd, configs, chosen)


def decode(target, drafters: dict, prompts, outputs: dict, cfg: RunConfig, chosen: set, done: set):
    """The decodes themselves (a worker's part, harness/worker.py): for every sampled prompt not in `done`, in
    the sweep's order, (workload, prompt_id, its live.jsonl lines, one per configuration). `drafters`: fresh
    instances; every prompt's dense output (`outputs`) is handed to them once, sampled or not."""
    names = list(drafters)
    configs = configurations(names)
    live_cfg = RunConfig("live", cfg.k, cfg.max_new_tokens, cfg.temperature, cfg.seed)
    engines = {f"fixed:{n}": Engine(target, {n: drafters[n]}, live_cfg) for n in names}
    if "best_of_n" in configs:
        engines["best_of_n"] = Engine(target, drafters, live_cfg, best_of_n=True)
    warm = next(((wl, pid, ids) for wl, pid, ids in prompts if (wl, pid) in chosen), None)
    if warm is not None and len(done) < len(chosen):  # first calls pay one-off costs: not timed
        for c in configs:
            engines[c].run_prompt(*warm, finish=False)
    for wl, pid, ids in prompts:
        out = outputs[(wl, pid)]
        if (wl, pid) in chosen and (wl, pid) not in done:
            lines = []
            for c in configs:
                t0 = now_ms(target.device)
                res = engines[c].run_prompt(wl, pid, ids, finish=False)
                lines.append(_line(c, wl, pid, ids, res, now_ms(target.device) - t0, out))
            yield wl, pid, lines
        for d in drafters.values():
            getattr(d, "finish", lambda *a: None)(list(out))


def run(rd, decoder, prompts, names: list[str], cfg: RunConfig, n_per_workload: int, progress=None) -> dict:
    """Decode the sample live with every configuration, appending to live.jsonl as each prompt is done.
    `decoder(prompts, outputs, chosen, done)`: a worker's `live` (in this process or a Ray actor). Returns
    a summary {"n_per_workload", "prompts": n, "configs": [...], "mismatches": [...]}."""
    configs, chosen, done = pending(rd, names, prompts, n_per_workload, cfg.seed)
    outputs = {(wl, pid): rd.done[(wl, pid)] for wl, pid, _ in prompts}
    for _, _, lines in decoder(prompts, outputs, chosen, done):
        rd.append_text(LIVE_FILE, "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
        if progress:
            progress(len(lines))
    mismatches = []
    for raw in (rd.dir / LIVE_FILE).read_text().splitlines() if (rd.dir / LIVE_FILE).exists() else []:
        rec = json.loads(raw)
        if not rec["same_as_dense"]:
            mismatches.append(f"{rec['config']} on {rec['workload']}/{rec['prompt_id']}")
    return {"n_per_workload": n_per_workload, "prompts": len(chosen), "configs": configs, "mismatches": mismatches[:20]}


def warn(summary: dict, temperature: float, dtype: str, exact: bool) -> None:
    """One line on stderr when greedy live decodes parted from the dense outputs."""
    bad = summary["mismatches"]
    if not bad or temperature != 0:
        return
    low = not exact and dtype != "float32"
    why = (
        "at low precision a near-tie can flip between forward shapes; --exact-verify makes them agree"
        if low
        else "greedy decoding should not"
    )
    print(
        f"warning: live output differs from the dense phase's for {len(bad)}{'+' if len(bad) == 20 else ''} "
        f"decodes (first: {bad[0]}); {why}",
        file=sys.stderr,
    )


def verify_prefixes(rd, prompts) -> list[list[int]]:
    """The prefixes the verify timing runs on: four sampled prompts, each with half its dense output."""
    sampled = []
    for raw in (rd.dir / LIVE_FILE).read_text().splitlines():
        rec = json.loads(raw)
        if rec["config"].startswith("fixed:") and (rec["workload"], rec["prompt_id"]) not in sampled:
            sampled.append((rec["workload"], rec["prompt_id"]))
    ids = {(wl, pid): p for wl, pid, p in prompts}
    return [ids[key] + rd.done[key][: max(1, len(rd.done[key]) // 2)] for key in sampled[:4]]


def timing(rd, timer, prompts, k: int, n_drafters: int) -> dict:
    """The manifest's timing calibration from the live phase: each drafter's mean call time in its
    fixed configuration, and the target's verify time by verified tokens and by drafts per tree
    (`timer(prefixes, k, n_drafters)`: a worker's `harness.calibrate.time_verify`, on prefixes of four
    sampled prompts' outputs)."""
    calls: dict[str, int] = {}
    ms: dict[str, float] = {}
    for raw in (rd.dir / LIVE_FILE).read_text().splitlines():
        rec = json.loads(raw)
        if not rec["config"].startswith("fixed:"):
            continue
        name = rec["config"].split(":", 1)[1]
        calls[name] = calls.get(name, 0) + rec["calls"].get(name, 0)
        ms[name] = ms.get(name, 0.0) + rec["draft_ms"].get(name, 0.0)
    vm, vb = timer(verify_prefixes(rd, prompts), k, n_drafters)
    return {
        "verify_ms": vm,
        "verify_batch_ms": vb,
        "source": "live phase (live.jsonl)",
        "drafter_ms": {n: round(ms[n] / calls[n], 4) for n in calls if calls[n]},
    }
