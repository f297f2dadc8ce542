"""vLLM's engine timing (bench/vllm_crosscheck.py --timing): its verify and ngram-proposal times per engine step,
written as a manifest's timing calibration (bench/vllm_timing.json) beside our harness's own calibration.

vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni-process executor), one request at a time with ngram k = 8
on the same prompts, each proposal cut to a cycling length k, k-1, .., 0 so that every block size is measured; the
model runner's `execute_model` + `sample_tokens` per engine step (minus the ngram proposal inside it) is the
target's verify time of 1 + draft tokens, and `drafter.propose` the ngram proposal time. Written as the manifest's
timing calibration (docs/manifest.md) plus `engine` and `hardware`:

    {"label": "MEASURED", "engine": "vllm 0.32.0 cpu", "hardware": {...}, "target": "zoo/target", "k": 8,
     "drafters": {"ngram": {"kind": "ngram", "settings": {...}}},
     "timing": {"verify_ms": {"tokens": [1, 2, ...], "ms": [...], "n": [...]},
                "verify_batch_ms": {"drafts": [1, 2, 3], "ms": [...]}, "drafter_ms": {"ngram": ...}}}

plus "harness": our own sweep.py --calibrate timing on the same prompts and k, measured in the same run and printed
beside vLLM's (for comparison only). It reads as a run manifest's timing
(bandit.schema.Timing.from_manifest(json.load(f), ["ngram"])): rho_ngram = drafter_ms / verify_ms(k + 1),
alpha = verify_batch_ms(2) / verify_batch_ms(1) - 1 (docs/manifest.md).

verify_ms: median step time per number of verified tokens (draft + 1) of steps with that many; verify_batch_ms:
vLLM verifies no tree of alternative drafts, so it is measured as N concurrent requests each verifying a k-token
draft in one step (N * (k + 1) tokens), the closest production analogue of union verification.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time

from bench.vllm_common import ENGINE, REPO, hardware, make_llm, ngram_spec, run_sweep, shutdown


def _runner(llm):
    """The model runner of an in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, uni executor) LLM."""
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


def instrument(runner, cut: dict) -> list[dict]:
    """Wrap execute_model / sample_tokens / drafter.propose with wall clocks; one dict per engine step. While
    cut["lengths"] is an iterator, each proposal is cut to its next length, so that the steps verify every
    number of tokens 1 .. k + 1 (greedy output does not depend on the drafts; only the forward's size does)."""
    steps: list[dict] = []
    exe, samp, prop = runner.execute_model, runner.sample_tokens, runner.drafter.propose

    def execute_model(so, *a, **kw):
        t0 = time.perf_counter()
        r = exe(so, *a, **kw)
        spec = sum(len(v) for v in (so.scheduled_spec_decode_tokens or {}).values())
        steps.append({"tokens": so.total_num_scheduled_tokens, "spec": spec, "reqs": len(so.num_scheduled_tokens),
                      "exec": time.perf_counter() - t0, "sample": 0.0, "propose": 0.0})  # fmt: skip
        return r

    def sample_tokens(*a, **kw):
        t0 = time.perf_counter()
        r = samp(*a, **kw)
        steps[-1]["sample"] = time.perf_counter() - t0
        return r

    def propose(*a, **kw):
        t0 = time.perf_counter()
        r = prop(*a, **kw)
        steps[-1]["propose"] += time.perf_counter() - t0
        if cut.get("lengths") is not None:
            r = [d[: next(cut["lengths"])] for d in r]
        return r

    runner.execute_model, runner.sample_tokens, runner.drafter.propose = execute_model, sample_tokens, propose
    return steps


def _ms(s: dict) -> float:
    """A step's verify time: its forward and sampling, less the ngram proposal run inside sample_tokens."""
    return 1000.0 * (s["exec"] + s["sample"] - s["propose"])


def timing(args, prompts: list[list[int]]) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so it can be instrumented
    from vllm import SamplingParams, TokensPrompt

    k = args.timing_k
    rule = {"k": k, "n_min": args.n_min, "n_max": args.n_max}
    spec = ngram_spec(k, args.n_min, args.n_max)
    # no per-request metrics: the steps timed are the ones earlier calibrations timed
    kw = dict(distributed_executor_backend="uni", max_num_seqs=max(args.batch), per_request_spec_decode_metrics="none")
    llm = make_llm(spec, **kw)
    runner = _runner(llm)
    cut = {"lengths": itertools.cycle(range(k, -1, -1))}
    steps = instrument(runner, cut)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], sp, use_tqdm=False)  # warm-up
    steps.clear()
    load0 = os.getloadavg()[0]
    for _ in range(args.repeats):  # one request at a time: each decode step verifies one block of 1 + draft tokens
        for p in prompts:
            llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)
    single = [s for s in steps if s["reqs"] == 1 and s["tokens"] == s["spec"] + 1]  # decode steps, not prefill
    by_n: dict[int, list[float]] = {}
    for s in single:
        by_n.setdefault(s["tokens"], []).append(_ms(s))
    props = [1000.0 * s["propose"] for s in single]
    cut["lengths"], batch = None, {}  # whole k-token drafts from here on
    for n in args.batch:  # n concurrent requests, one step each verifying all of their drafts
        steps.clear()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:n]], sp, use_tqdm=False)
        full = [_ms(s) for s in steps if s["reqs"] == n and s["tokens"] == s["spec"] + n and s["spec"] == n * k]
        if full:
            batch[n] = (statistics.median(full), len(full))
    shutdown(llm)  # before our own calibration, which must not share the CPU with it
    toks = sorted(by_n)
    out = {
        "label": "MEASURED",
        "engine": ENGINE,
        "hardware": hardware() | {"loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)]},
        "target": "zoo/target",
        "dtype": "float32",
        "k": k,
        "drafters": {"ngram": {"kind": "ngram", "settings": rule, "rule": "vLLM's (earliest occurrence)"}},
        "timing": {
            "verify_ms": {
                "tokens": toks,
                "ms": [round(statistics.median(by_n[n]), 4) for n in toks],
                "n": [len(by_n[n]) for n in toks],
            },  # fmt: skip
            "verify_batch_ms": {
                "drafts": sorted(batch),
                "ms": [round(batch[n][0], 4) for n in sorted(batch)],
                "n": [batch[n][1] for n in sorted(batch)],
                "note": "N concurrent requests, each verifying a k-token draft in one step",
            },  # fmt: skip
            "drafter_ms": {"ngram": round(statistics.mean(props), 4) if props else None},
            "source": "vLLM model runner: execute_model + sample_tokens - drafter.propose per decode step (median)",
        },
    }
    out["harness"] = harness_timing(args, k)
    print_timing(out)
    return out


def harness_timing(args, k: int) -> dict:
    """Our harness's own timing calibration (sweep.py --calibrate) on the same prompts, k and settings, for the
    side-by-side table: its manifest's `timing`."""
    run = REPO / "bench" / "out" / "vllm-timing-harness"
    rule = {"k": k, "n_min": args.n_min, "n_max": args.n_max}
    spec = f"ngram=ngram:n_min={rule['n_min']},n_max={rule['n_max']}"
    run_sweep(args.workloads, args.limit, k, args.max_new_tokens, [spec], run, ["--calibrate", str(args.calibrate)])
    return json.loads((run / "manifest.json").read_text()).get("timing", {})


def print_timing(t: dict) -> None:
    hw, tm = t["hardware"], t["timing"]
    print(f"[MEASURED] {t['engine']} on {hw['cpu']} ({hw['cores']} cores), zoo target float32, ngram k={t['k']}")
    print(f"  1-minute load average before / after: {hw['loadavg_1min']} (a shared machine inflates every time)")
    ours = t.get("harness", {}).get("verify_ms") or {"tokens": [], "ms": []}
    mine = dict(zip(ours["tokens"], ours["ms"]))
    print(f"  verified tokens   {t['engine']} step ms (median)   steps   ours (sweep.py --calibrate) ms")
    for n, ms, c in zip(tm["verify_ms"]["tokens"], tm["verify_ms"]["ms"], tm["verify_ms"]["n"]):
        print(f"  {n:15d} {ms:30.3f} {c:7d} " + (f"{mine[n]:32.3f}" if n in mine else f"{'-':>32s}"))
    for n, ms, c in zip(tm["verify_batch_ms"]["drafts"], tm["verify_batch_ms"]["ms"], tm["verify_batch_ms"]["n"]):
        print(f"  {n} requests x {t['k']}-token drafts: {ms:.3f} ms/step ({c} steps)")
    ours_ngram = (t.get("harness", {}).get("drafter_ms") or {}).get("ngram")
    print(f"  ngram proposal: {tm['drafter_ms']['ngram']} ms per step; ours {ours_ngram} ms per draft")
