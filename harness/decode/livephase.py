"""The live phase of a campaign: real speculative decoding on a seeded sample of its prompts.

After the dense phase, every live configuration decodes the same sample of prompts for real
(configuration names: bandit/logs/schema.py): `plain`, the target's own greedy loop (Target.generate:
prefill, then one 1-token forward per output token); each fixed drafter alone (`fixed:<name>`);
best-of-N (every drafter drafts, one tree forward verifies all drafts, the longest accepted one
advances); and each live policy (`policy:<name>`, bandit/policies/livepolicies.py, `--live-policies`)
choosing the drafter per block. For every (configuration, prompt) one line goes to `live.jsonl` in
the run directory (fields below); `bandit/wallclock.py` fits its timing model on them and checks
its dense-log predictions against them.

The sample: per workload, the `n_per_workload` prompts whose sha256(seed:workload:prompt_id)
is smallest, so that it does not depend on the order or the number of prompts beside them.

Drafter state carried across prompts (the suffix drafter's corpus=run of earlier outputs) is what
the dense phase had at the same prompt: the live phase walks the campaign's prompts in the
sweep's order, hands every prompt's dense output to the drafters once (sampled or not), and
decodes a sampled prompt with every configuration before that. Configurations take turns on
each prompt, so drift in the machine's speed falls on all of them alike.

A policy is built once by `bandit.policies.livepolicies.make(name, t, timing)` on the run's dense log t, with
the policies' Timing: `policy_timing`, measured before the decodes (verify forwards timed on
prefixes of sampled prompts' dense outputs, each drafter's mean call time from a timed warm-up
decode of its fixed configuration) and kept in the manifest's `live`, also across resumes, so that
a resumed live phase runs the same policies (its lookups by drafter kind: `policies_timing`). It
sees the drafters in sorted-name order and the campaign's workloads sorted; its state runs on
across the sampled prompts in decode order (ctx.prompt counts them); the warm-up decode uses a
throwaway copy. A resumed live phase decodes the prompts finished earlier again with the policies
alone (untimed, not written), so that their state is what it was.

The decodes run in one worker (harness/campaign/worker.py: in the sweep's process, or one Ray actor), after every
dense prompt of the campaign is done, so that the timings come from one machine; the driver writes their
lines (`run`), and a killed live phase resumes at the first sampled prompt not fully written. A changed
configuration list (new policies) redoes the whole sample.

live.jsonl fields (one line per configuration and prompt):
    config       "plain" | "fixed:<drafter>" | "best_of_n" | "policy:<name>"
    workload, prompt_id
    prompt_len   tokens in the prompt
    tokens       output tokens produced
    passes       target forwards after the prefill (one verify per block; plain: one per token)
    verified     tokens through those verify forwards, summed (trunk + every draft)
    calls        {drafter: draft calls} (a policy: every lookup's at every block with room for a draft, chosen
                 or not)
    chosen       policies only: {drafter: blocks whose draft was verified}
    wall_ms      the prompt's whole decode, prefill included
    prefill_ms, verify_ms, draft_ms ({drafter: summed call time}) - parts of wall_ms
    same_as_dense   whether the output equals the dense phase's (greedy: it must)
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import sys
from pathlib import Path

from bandit.logs.schema import BEST_OF_N, FIXED, PLAIN, POLICY, Timing

from .calibrate import time_verify
from .engine import Engine, PromptResult, RunConfig
from ..models.lm import HarnessError
from ..models.sampling import prompt_key
from ..models.target import now_ms

LIVE_FILE = "live.jsonl"


def sample(prompts: list[tuple[str, str, list[int]]], n_per_workload: int, seed: int) -> set[tuple[str, str]]:
    """The seeded live sample: (workload, prompt_id) pairs, at most n per workload."""
    by_wl: dict[str, list[tuple[str, str]]] = {}
    for wl, pid, _ in prompts:
        h = hashlib.sha256(f"{seed}:{wl}:{pid}".encode()).hexdigest()
        by_wl.setdefault(wl, []).append((h, pid))
    return {(wl, pid) for wl, hs in by_wl.items() for _, pid in sorted(hs)[:n_per_workload]}


def configurations(names: list[str], policies=(), best_of_n: bool = True) -> list[str]:
    """The live configurations, in the order they take turns on each prompt (choosing needs two drafters;
    best_of_n=False leaves best-of-N out, as a bench of fixed drafters does)."""
    several = len(names) > 1
    return (
        [PLAIN]
        + [FIXED + n for n in names]
        + ([BEST_OF_N] if several and best_of_n else [])
        + ([POLICY + p for p in policies] if several else [])
    )


def _lib():
    """bandit/policies/livepolicies.py (LIVE_POLICIES, make); the tests put a stand-in here."""
    from bandit.policies import livepolicies

    return livepolicies


def policy_list(spec: str | None) -> list[str]:
    """`--live-policies`: None, every live policy; "", none; else the names given, checked, in LIVE_POLICIES order."""
    known = list(_lib().LIVE_POLICIES)
    if spec is None:
        return known
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad:
        raise HarnessError(
            f"--live-policies {spec}: {bad[0]!r} is not a live policy (known: {', '.join(known)}; empty for none)"
        )
    return [x for x in known if x in names]


def _line(config, wl, pid, ids, res, wall_ms, dense_output) -> dict:
    t = res.timings
    drafts = t["draft"]
    chosen = t.get("chosen")
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
        **({"chosen": {n: chosen.count(n) for n in drafts if n in chosen}} if chosen is not None else {}),
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


def pending(rd, names: list[str], prompts, n_per_workload: int, seed: int, policies=()):
    """(configurations, the sample, the sampled prompts already decoded by every configuration)."""
    configs = configurations(names, policies)
    chosen = sample(prompts, n_per_workload, seed)
    return configs, chosen, read_done(rd, configs, chosen)


class Plain:
    """The `plain` configuration: the target's own loop (Target.generate), timed as the engine times its forwards."""

    def __init__(self, target, cfg: RunConfig):
        self.target, self.cfg = target, cfg

    def run_prompt(self, wl, pid, ids, finish: bool = False) -> PromptResult:
        timings: dict = {}
        pkey = prompt_key(self.cfg.seed, wl, pid)
        y, _, _ = self.target.generate(list(ids), self.cfg.max_new_tokens, pkey, timings=timings, feats=False)
        return PromptResult([], y, timings)


def _live_cfg(cfg: RunConfig) -> RunConfig:
    return RunConfig("live", cfg.k, cfg.max_new_tokens, cfg.temperature, cfg.seed)


def _prefixes(keys, prompts, outputs) -> list[list[int]]:
    """Each prompt with half its dense output: what the verify forwards are timed on."""
    ids = {(wl, pid): p for wl, pid, p in prompts}
    return [ids[key] + list(outputs[key])[: max(1, len(outputs[key]) // 2)] for key in keys]


def measure(target, drafters: dict, prompts, outputs: dict, cfg: RunConfig, chosen: set) -> dict:
    """The policies' timing (manifest live.policy_timing, the shape of the manifest's `timing`), before the
    live decodes (a worker's part): the verify forwards timed on four sampled prompts' prefixes, and each
    drafter's mean call time in a timed decode of its fixed configuration on the warm-up prompt (the first
    sampled one; decoded once untimed before, for the one-off costs). `drafters`: fresh instances."""
    sampled = [(wl, pid, ids) for wl, pid, ids in prompts if (wl, pid) in chosen]
    drafter_ms = {}
    for name, d in drafters.items():
        eng = Engine(target, {name: d}, _live_cfg(cfg))
        eng.run_prompt(*sampled[0], finish=False)
        calls = eng.run_prompt(*sampled[0], finish=False).timings["draft"][name]
        if calls:
            drafter_ms[name] = round(sum(calls) / len(calls), 4)
    keys = [(wl, pid) for wl, pid, _ in sampled[:4]]
    vm, vb = time_verify(target, _prefixes(keys, prompts, outputs), cfg.k, len(drafters))
    source = "live phase, before its decodes (warm-up prompt and sampled prefixes)"
    return {"verify_ms": vm, "verify_batch_ms": vb, "source": source, "drafter_ms": drafter_ms}


def policies_timing(manifest: dict, drafters) -> Timing:
    """The Timing the live policies get (and their replays): the manifest's live.policy_timing; a run
    without one (from before it), the manifest's own timing."""
    pt = (manifest.get("live") or {}).get("policy_timing")
    if pt is None:
        return Timing.from_manifest(manifest, drafters)
    return Timing.from_manifest({"k": manifest.get("k"), "drafters": manifest.get("drafters"), "timing": pt}, drafters)


def stored_policy_timing(out) -> dict | None:
    """The policy timing recorded in run directory `out` (kept on resume; None: none or unreadable)."""
    try:
        m = json.loads((Path(out) / "manifest.json").read_text())
        return (m.get("live") or {}).get("policy_timing") if isinstance(m, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def dense_logs(d: Path) -> list[Path]:
    """The run's dense block logs: blocks_dense*.jsonl, and the .jsonl.gz of any not there uncompressed."""
    plain = sorted(Path(d).glob("blocks_dense*.jsonl"))
    return plain + [p for p in sorted(Path(d).glob("blocks_dense*.jsonl.gz")) if p.with_suffix("") not in plain]


def dense_table(d: Path):
    """The run's dense log as a BlockTable (what the policies are made on), without the loader's note that
    the run is incomplete: its dense phase is done, only the live phase is under way."""
    from bandit.logs.reader import load_logs

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        t = load_logs(dense_logs(d))
    for line in err.getvalue().splitlines():
        if "is an incomplete run" not in line:
            print(line, file=sys.stderr)
    return t


def decode(
    target,
    drafters: dict,
    prompts,
    outputs: dict,
    cfg: RunConfig,
    chosen: set,
    done: set,
    policies=None,
    workloads=(),
    timing=None,
    best_of_n: bool = True,
):
    """The decodes themselves (a worker's part, harness/campaign/worker.py): for every sampled prompt not in `done`, in
    the sweep's order, (workload, prompt_id, its live.jsonl lines, one per configuration). `drafters`: fresh
    instances; every prompt's dense output (`outputs`) is handed to them once, sampled or not. `policies`:
    {name: a policy fresh from livepolicies.make}, in configuration order; `workloads`: what they are reset
    with (the campaign's, sorted); `timing`: their Timing; `best_of_n`: whether best-of-N is one of them."""
    names = list(drafters)
    pols = dict(policies or {})
    configs = configurations(names, list(pols), best_of_n)
    live_cfg = _live_cfg(cfg)
    engines = {PLAIN: Plain(target, live_cfg)}
    engines.update({FIXED + n: Engine(target, {n: drafters[n]}, live_cfg) for n in names})
    if BEST_OF_N in configs:
        engines[BEST_OF_N] = Engine(target, drafters, live_cfg, best_of_n=True)
    ordered = {n: drafters[n] for n in sorted(names)}  # a policy sees the drafters by name, as its replay does
    with_policy = lambda pol: Engine(target, ordered, live_cfg, pol, list(workloads), timing=timing)
    todo = len(done) < len(chosen)
    warm = next(((wl, pid, ids) for wl, pid, ids in prompts if (wl, pid) in chosen), None)
    if warm is not None and todo:  # first calls pay one-off costs: not timed
        for c in configs:
            eng = with_policy(copy.deepcopy(pols[c[len(POLICY) :]])) if c.startswith(POLICY) else engines[c]
            eng.run_prompt(*warm, finish=False)
    for p, pol in pols.items():  # the measured instances: fresh state, their prompt count from 0
        engines[POLICY + p] = with_policy(pol)
    for wl, pid, ids in prompts:
        out = outputs[(wl, pid)]
        if (wl, pid) in chosen and (wl, pid) not in done:
            lines = []
            for c in configs:
                t0 = now_ms(target.device)
                res = engines[c].run_prompt(wl, pid, ids, finish=False)
                lines.append(_line(c, wl, pid, ids, res, now_ms(target.device) - t0, out))
            yield wl, pid, lines
        elif (wl, pid) in chosen and todo:  # written by an earlier session: the policies learn from it again
            for p in pols:
                engines[POLICY + p].run_prompt(wl, pid, ids, finish=False)
        for d in drafters.values():
            getattr(d, "finish", lambda *a: None)(list(out))


def run(rd, runner, prompts, names: list[str], cfg: RunConfig, n_per_workload: int, progress=None, policies=()) -> dict:
    """Decode the sample live with every configuration, appending to live.jsonl as each prompt is done.
    `runner`: a worker (harness/campaign/worker.py, in this process or a Ray pool: `live`, `policy_timing`); `policies`:
    the live policies' names (policy_list). Returns the manifest's `live`: {"n_per_workload", "prompts": n,
    "configs": [...], "mismatches": [...], "policy_timing": {...} (when measured)}."""
    configs, chosen, done = pending(rd, names, prompts, n_per_workload, cfg.seed, policies)
    outputs = {(wl, pid): rd.done[(wl, pid)] for wl, pid, _ in prompts}
    pols = [c[len(POLICY) :] for c in configs if c.startswith(POLICY)]
    live = dict(rd.manifest.get("live") or {})
    built, workloads, timing = None, sorted(rd.manifest["workloads"]), None
    if pols and len(done) < len(chosen):
        if live.get("policy_timing") is None:  # once per run: a resumed live phase keeps it
            live["policy_timing"] = runner.policy_timing(prompts, outputs, chosen)
            rd.manifest["live"] = live
            rd.write_manifest()
        timing = policies_timing(rd.manifest, sorted(names))
        t, lib = dense_table(rd.dir), _lib()
        built = {p: lib.make(p, t, timing) for p in pols}
    for _, _, lines in runner.live(prompts, outputs, chosen, done, built, workloads, timing):
        rd.append_text(LIVE_FILE, "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
        if progress:
            progress(len(lines))
    mismatches = []
    for raw in (rd.dir / LIVE_FILE).read_text().splitlines() if (rd.dir / LIVE_FILE).exists() else []:
        rec = json.loads(raw)
        if not rec["same_as_dense"]:
            mismatches.append(f"{rec['config']} on {rec['workload']}/{rec['prompt_id']}")
    summary = {"n_per_workload": n_per_workload, "prompts": len(chosen), "configs": configs}
    summary["mismatches"] = mismatches[:20]
    if live.get("policy_timing") is not None:
        summary["policy_timing"] = live["policy_timing"]
    return summary


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
        if rec["config"].startswith(FIXED) and (rec["workload"], rec["prompt_id"]) not in sampled:
            sampled.append((rec["workload"], rec["prompt_id"]))
    return _prefixes(sampled[:4], prompts, rd.done)


def timing(rd, timer, prompts, k: int, n_drafters: int) -> dict:
    """The manifest's timing calibration from the live phase: each drafter's mean call time in its
    fixed configuration, and the target's verify time by verified tokens and by drafts per tree
    (`timer(prefixes, k, n_drafters)`: a worker's `harness.decode.calibrate.time_verify`, on prefixes of four
    sampled prompts' outputs)."""
    calls: dict[str, int] = {}
    ms: dict[str, float] = {}
    for raw in (rd.dir / LIVE_FILE).read_text().splitlines():
        rec = json.loads(raw)
        if not rec["config"].startswith(FIXED):
            continue
        name = rec["config"][len(FIXED) :]
        calls[name] = calls.get(name, 0) + rec["calls"].get(name, 0)
        ms[name] = ms.get(name, 0.0) + rec["draft_ms"].get(name, 0.0)
    vm, vb = timer(verify_prefixes(rd, prompts), k, n_drafters)
    return {
        "verify_ms": vm,
        "verify_batch_ms": vb,
        "source": "live phase (live.jsonl)",
        "drafter_ms": {n: round(ms[n] / calls[n], 4) for n in calls if calls[n]},
    }
