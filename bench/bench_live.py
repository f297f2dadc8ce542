"""The live loop's realised speedup next to vLLM's, on equal work (issue 25, item 3).

    python bench/bench_live.py                               # the harness half (the default environment)
    python bench/bench_live.py --profile                     # + ms per live block and per plain step, by part
    python bench/bench_live.py --hf                          # + transformers' prompt lookup on the same prompts
    python bench/bench_live.py --hf-assist 10 --target DIR   # + transformers' assisted generation (first 10 layers)
    .venv-tier-vllm/bin/python bench/bench_live.py --vllm    # + vLLM's half, side by side (the vllm tier)

Both halves decode the same prompts (the first --limit of each workload, code and copy by default, tokenized as the
harness tokenizes them) on the zoo target at float32, greedy, at most --max-new-tokens tokens (stopping after EOS),
one request at a time, with ngram speculation at k = --k:

* harness: plain decoding is `Target.generate` (one forward per token), speculative decoding the live engine
  (`Engine`, mode live) with `ngram:rule=vllm` (vLLM's proposer). Its realised speedup: plain time / live time.
* vLLM: an `LLM` without and one with `speculative_config={"method": "ngram", ...}` (prompt_lookup_min 1, max 4, as
  rule=vllm's defaults), both in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni-process executor: the
  engine runs where the harness runs), one `generate` call per prompt. Its realised speedup: plain / ngram time.

Equal work: the outputs must be identical (harness plain = harness live, vLLM plain = vLLM ngram = harness plain,
prompt by prompt), else the ratio is refused. Times: --reps repetitions that alternate the two decodings of a side,
the median total of each. Per-step ms: the total over the target forwards (harness: the prefill plus one per token,
or per block; vLLM: engine steps, its prefill included; with --vllm-engine mp, the front end's step calls, about one
more per request). One torch thread count for both halves (--threads, default torch's; vLLM's CPU worker keeps the
process's, and NUMBA_NUM_THREADS is set to it, as vLLM's ngram proposer resets numba's thread count, which under
numba's OpenMP layer is torch's). The machine is shared: the 1-minute load average is printed.

Target (issue 25): the harness's realised speedup within 10% of vLLM's (harness / vLLM >= 0.90).

--hf: transformers `generate(prompt_lookup_num_tokens=k)` (its default matching, greedy, the target's eos ids) and
plain `generate()` on the same prompts against the live loop and Target.generate, equal work checked the same way.

--hf-assist L: transformers' assisted generation, k tokens per draft (schedule constant, no confidence cut-off), with
the target's first L layers drafting, against the live loop with `layerskip:layers=L` (the same drafter): as
`generate(assistant_model=M)`, M those layers (with the final norm and lm_head) as a model of their own, weights
shared; and as `generate(assistant_early_exit=L)`. Equal work checked against the live loop's outputs.

--profile: one extra pass of each decoding with wall clocks at the seams of a live block (the drafter's draft, the
model forward of trunk + draft, the rest of Target.verify, the cache moves, the prefill) and of a plain step; the
rest of the block is the engine's Python (records, bookkeeping). The clocks cost a few microseconds each.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# run as bench/bench_live.py, sys.path[0] is bench/, whose coverage.py would shadow the `coverage` package that
# numba (vLLM's ngram proposer) imports: put the repository there instead
if Path(sys.path[0] or ".").resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch

from bandit.logs import limits
from bench import bench_live_args as cli
from bench import vllm_common as vc
from harness.models import lm
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target

NGRAM = "ngram=ngram:rule=vllm"  # n_min 1, n_max 4: vLLM's prompt_lookup_min / max below
TARGET_RATIO = 0.90


def first_difference(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """'' when every prompt's output is identical, else which prompt and position first differ."""
    if len(ours) != len(theirs):
        return f"{len(ours)} vs {len(theirs)} prompts"
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if not bad:
        return ""
    at = vc.first_difference(ours[bad[0]], theirs[bad[0]])
    return f"{len(bad)} of {len(ours)} prompts differ (first: prompt {bad[0]}, position {at})"


def alternate(fns: dict, reps: int) -> dict:
    """{name: (last result, [seconds per rep])}: the contenders run in turn within every rep, so that a change of
    load hits them alike."""
    out = {n: (None, []) for n in fns}
    for _ in range(reps):
        for n, f in fns.items():
            t0 = time.perf_counter()
            r = f()
            out[n][1].append(time.perf_counter() - t0)
            out[n] = (r, out[n][1])
    return out


def side(plain: tuple, spec: tuple, steps_plain: int, steps_spec: int, tokens: int, equal: str) -> dict:
    """One engine's row: median seconds, per-step ms, the realised speedup (None when the work differs)."""
    tp, ts = statistics.median(plain[1]), statistics.median(spec[1])
    return {
        "plain_s": tp,
        "spec_s": ts,
        "plain_reps_s": plain[1],
        "spec_reps_s": spec[1],
        "steps_plain": steps_plain,
        "steps_spec": steps_spec,
        "tokens": tokens,
        "plain_ms_per_step": 1000 * tp / steps_plain,
        "spec_ms_per_step": 1000 * ts / steps_spec,
        "tokens_per_spec_step": tokens / steps_spec,
        "equal_work": equal or "yes",
        "speedup": tp / ts if not equal else None,
    }


# ------------------------------------------------------------------------------------------------------- harness
class Harness:
    def __init__(self, args, prompts: list[list[int]]):
        self.prompts, self.n = prompts, args.max_new_tokens
        self.model, self.tok = lm.load_lm(args.target), lm.load_tokenizer(args.target)
        self.target = Target(self.model, self.tok)
        self.drafters = build_drafters([parse_spec(args.ngram)], DrafterEnv(self.model, self.tok, args.target))
        self.engine = Engine(self.target, self.drafters, RunConfig("live", args.k, args.max_new_tokens))

    def plain(self) -> list[list[int]]:
        return [self.target.generate(p, self.n, 0, feats=False)[0] for p in self.prompts]

    def live(self) -> list:
        return [self.engine.run_prompt("bench", str(i), p) for i, p in enumerate(self.prompts)]

    def forwards(self, p: list[int], n: int) -> int:
        return n + (len(p) > 1)  # the prefill of prompt[:-1], then one forward per token or per block

    def run(self, reps: int) -> dict:
        self.plain(), self.live()  # warm-up
        r = alternate({"plain": self.plain, "live": self.live}, reps)
        outs, res = r["plain"][0], r["live"][0]
        equal = first_difference([x.output for x in res], outs)
        sp = sum(self.forwards(p, len(y)) for p, y in zip(self.prompts, outs))
        sl = sum(self.forwards(p, len(x.records)) for p, x in zip(self.prompts, res))
        row = side(r["plain"], r["live"], sp, sl, sum(map(len, outs)), equal)
        return row | {"outputs": outs}


def profile(h: Harness, reps: int) -> dict:
    """Milliseconds per live block and per plain step, by part (module doc), the median over `reps` passes."""
    acc, depth = {}, [0]
    saved = []

    def wrap(obj, name, part):
        f = getattr(obj, name)
        saved.append((obj, name, f))

        @functools.wraps(f)
        def g(*a, **kw):
            if depth[0]:  # a part inside another (crop inside move_span): counted once, by the outer
                return f(*a, **kw)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                acc[part] = acc.get(part, 0.0) + time.perf_counter() - t0
                depth[0] -= 1

        setattr(obj, name, g)

    wrap(lm, "forward", "forward")
    wrap(lm, "move_span", "cache moves")
    wrap(lm, "crop", "cache moves")
    wrap(next(iter(h.drafters.values())), "draft", "draft")  # the --ngram drafter, whatever its name
    verify = Target.verify

    def timed_verify(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return verify(self, *a, **kw)
        finally:
            acc["verify"] = acc.get("verify", 0.0) + time.perf_counter() - t0

    Target.verify = timed_verify
    live, plain = [], []
    try:
        for _ in range(reps + 1):  # the first pass warms up
            acc.clear()
            t0 = time.perf_counter()
            res = h.live()
            total = time.perf_counter() - t0
            blocks = sum(len(x.records) for x in res)
            pre = sum(x.timings["prefill_ms"] for x in res) / 1000
            fwd = acc.get("forward", 0.0) - pre  # lm.forward also ran the prefills
            parts = {"draft": acc.get("draft", 0.0), "forward": fwd, "verify, rest": acc.get("verify", 0.0) - fwd}
            parts |= {"cache moves": acc.get("cache moves", 0.0), "prefill": pre}
            parts["engine Python"] = total - sum(parts.values())
            live.append({k: 1000 * v / blocks for k, v in (parts | {"total": total}).items()})
            acc.clear()
            t0 = time.perf_counter()
            outs = h.plain()
            total = time.perf_counter() - t0
            toks = sum(map(len, outs))
            plain.append({"forward": 1000 * acc["forward"] / toks, "Python": 1000 * (total - acc["forward"]) / toks})
            plain[-1]["total"] = 1000 * total / toks
    finally:
        Target.verify = verify
        for obj, name, f in saved:
            setattr(obj, name, f)
    med = lambda rows: {k: statistics.median(r[k] for r in rows[1:]) for k in rows[0]}
    return {"live_ms_per_block": med(live), "plain_ms_per_token": med(plain), "blocks": blocks, "tokens": toks}


def hf_generate(h: Harness, **extra) -> list[list[int]]:
    """transformers' greedy `generate` on every prompt (at most h.n new tokens, stopping on the target's EOS ids), with
    `extra` generate() arguments; the new tokens of each."""
    eos = sorted(h.target.eos)
    pad = h.tok.pad_token_id if h.tok.pad_token_id is not None else (eos[0] if eos else None)
    kw = dict(max_new_tokens=h.n, do_sample=False, eos_token_id=eos or None, pad_token_id=pad)
    out = []
    with torch.inference_mode():
        for p in h.prompts:
            t = torch.tensor([p])
            out.append(h.model.generate(t, attention_mask=torch.ones_like(t), **kw, **extra)[0, len(p) :].tolist())
    return out


def hf_compare(h: Harness, args, live_outputs: list[list[int]]) -> dict:
    """transformers' prompt lookup and plain generate() against the live loop and Target.generate, equal work."""
    import transformers

    transformers.logging.set_verbosity_error()  # generate()'s deprecation chatter is not a result
    fns = {
        "hf_lookup": lambda: hf_generate(h, prompt_lookup_num_tokens=args.k),
        "live": lambda: [x.output for x in h.live()],
        "hf_plain": lambda: hf_generate(h),
        "plain": h.plain,
    }
    for f in fns.values():
        f()  # warm-up
    r = alternate(fns, args.reps)
    med = {n: statistics.median(v[1]) for n, v in r.items()}
    lookup_eq = first_difference(r["live"][0], r["hf_lookup"][0])
    plain_eq = first_difference(r["plain"][0], r["hf_plain"][0])
    theirs_eq = first_difference(r["hf_lookup"][0], r["hf_plain"][0])
    return {
        "transformers": transformers.__version__,
        "seconds": med,
        "equal_work_lookup": lookup_eq or "yes",
        "equal_work_plain": plain_eq or "yes",
        "live_over_hf_lookup": med["hf_lookup"] / med["live"] if not lookup_eq else None,
        "plain_over_hf_plain": med["hf_plain"] / med["plain"] if not plain_eq else None,
        "hf_lookup_over_hf_plain": med["hf_plain"] / med["hf_lookup"] if not theirs_eq else None,
        "tokens": sum(map(len, r["live"][0])),
    }


@contextmanager
def _assistant_settings(model, k: int):
    """transformers reads an assistant's draft length from the assistant's own generation_config: k drafted tokens
    at every step (schedule constant, no confidence cut-off), as the live loop drafts; restored after."""
    gc = model.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {n: getattr(gc, n, None) for n in keys}
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(gc, n, v)


def hf_assist(h: Harness, args, live_plain: list[list[int]]) -> dict:
    """transformers' assisted generation with the target's first L layers drafting, against the live loop with
    `layerskip:layers=L` (the same drafter: those layers, the final norm and lm_head, its own cache), k tokens per
    draft on both sides, equal work checked: `generate(assistant_model=M)` with M the first L layers as a model of
    their own (weights shared, harness.drafters.layerskip.early_exit_model), and `generate(assistant_early_exit=L)`
    (transformers' self-speculation, the target's own object with L layers)."""
    import transformers

    from harness.drafters.layerskip import early_exit_model

    transformers.logging.set_verbosity_error()
    L, k = args.hf_assist, args.k
    env = DrafterEnv(h.model, h.tok, args.target)
    engine = Engine(h.target, build_drafters([parse_spec(f"ls=layerskip:layers={L}")], env), RunConfig("live", k, h.n))
    assistant = early_exit_model(h.model, L, "--hf-assist")

    def gen(drafter, **extra):
        def go():
            with _assistant_settings(drafter, k):
                return hf_generate(h, **extra)

        return go

    def live():
        res = [engine.run_prompt("bench", str(i), p) for i, p in enumerate(h.prompts)]
        live.blocks = sum(len(x.records) for x in res)
        return [x.output for x in res]

    fns = {
        "hf_assistant_model": gen(assistant, assistant_model=assistant),
        "live_layerskip": live,
        "hf_early_exit": gen(h.model, assistant_early_exit=L),
    }
    for f in fns.values():
        f()  # warm-up
    r = alternate(fns, args.reps)
    med = {n: statistics.median(v[1]) for n, v in r.items()}
    eq = {
        n: first_difference(r["live_layerskip"][0], r[n][0]) or "yes" for n in ("hf_assistant_model", "hf_early_exit")
    }
    eq["plain"] = first_difference(r["live_layerskip"][0], live_plain) or "yes"
    tokens = sum(map(len, r["live_layerskip"][0]))
    return {
        "layers": L,
        "seconds": med,
        "equal_work": eq,
        "tokens": tokens,
        "live_blocks": live.blocks,
        "live_over_hf_assistant_model": med["hf_assistant_model"] / med["live_layerskip"]
        if eq["hf_assistant_model"] == "yes"
        else None,
        "live_over_hf_early_exit": med["hf_early_exit"] / med["live_layerskip"]
        if eq["hf_early_exit"] == "yes"
        else None,
    }


# ---------------------------------------------------------------------------------------------------------- vLLM
def vllm_half(args, prompts: list[list[int]], reference: list[list[int]]) -> dict:
    """vLLM plain and vLLM ngram, one request at a time; outputs checked against the harness's. In-process by
    default (--vllm-engine inproc); `mp`: LLM's default, the engine core in a process of its own."""
    # vLLM's ngram proposer (numba) restores numba's own thread count after each proposal, and with numba's OpenMP
    # layer that is also torch's: numba's count is the process's, or the forwards would change threads mid-run
    os.environ.setdefault("NUMBA_NUM_THREADS", str(torch.get_num_threads()))
    kw = dict(max_num_seqs=1)
    if args.vllm_engine == "inproc":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process (read when an LLM is made)
        kw["distributed_executor_backend"] = "uni"
    from vllm import SamplingParams, TokensPrompt

    plain = vc.make_llm(None, **kw)
    spec = vc.make_llm(vc.ngram_spec(args.k, 1, 4), per_request_spec_decode_metrics="none", **kw)
    steps = {}

    def counted(name, llm):  # engine steps (prefill and decode), one forward each
        step = llm.llm_engine.step

        def g(*a, **k):
            steps[name] = steps.get(name, 0) + 1
            return step(*a, **k)

        llm.llm_engine.step = g

    counted("plain", plain)
    counted("spec", spec)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)

    def decode(llm):
        return lambda: [
            list(llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0].outputs[0].token_ids)
            for p in prompts
        ]

    decode(plain)(), decode(spec)()  # warm-up
    steps.clear()
    r = alternate({"plain": decode(plain), "spec": decode(spec)}, args.reps)
    threads = torch.get_num_threads()
    for llm in (plain, spec):
        vc.shutdown(llm)
    equal = first_difference(r["spec"][0], r["plain"][0]) or first_difference(r["plain"][0], reference)
    n = args.reps
    row = side(r["plain"], r["spec"], steps["plain"] // n, steps["spec"] // n, sum(map(len, r["plain"][0])), equal)
    return row | {"engine": f"{vc.ENGINE} ({args.vllm_engine})", "threads": threads}


# ---------------------------------------------------------------------------------------------------------- main
def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_report(out: dict) -> None:
    s = out["settings"]
    print(
        f"bench_live: target {s['target']} float32, {s['prompts']} prompts ({s['workloads']}: {s['limit']} each), greedy, "
        f"k={s['k']}, <= {s['max_new_tokens']} new tokens, {s['ngram']}, one request at a time, "
        f"torch threads {s['threads']}, median of {s['reps']} reps, load {s['load_before']} -> {s['load_after']}"
    )
    print(f"{'':40}{'plain ms/step':>14}{'spec ms/step':>13}{'steps plain':>12}{'steps spec':>11}"
          f"{'tokens/step':>12}{'speedup':>9}  equal work")  # fmt: skip
    for name in ("harness", "vllm"):
        r = out.get(name)
        if r is None:
            continue
        label = "harness (Target.generate | live)" if name == "harness" else f"{r['engine']} plain | ngram"
        print(
            f"{label:40}{r['plain_ms_per_step']:>14.3f}{r['spec_ms_per_step']:>13.3f}{r['steps_plain']:>12d}"
            f"{r['steps_spec']:>11d}{r['tokens_per_spec_step']:>12.3f}{_fmt(r['speedup'], '>8.2f')}x  {r['equal_work']}"
        )
    if out.get("ratio") is not None:
        ok = "met" if out["ratio"] >= TARGET_RATIO else "NOT met"
        print(f"harness / vLLM realised speedup: {out['ratio']:.3f} (target >= {TARGET_RATIO}: {ok})")
    hf = out.get("hf")
    if hf:
        sec = hf["seconds"]
        print(f"transformers {hf['transformers']}, same prompts, greedy, {hf['tokens']} tokens (median seconds):")
        print(f"  live loop {sec['live']:.3f} s vs generate(prompt_lookup_num_tokens={s['k']}) {sec['hf_lookup']:.3f} s: "
              f"{_fmt(hf['live_over_hf_lookup'], '.2f')}x (target >= 1.0x; equal work: {hf['equal_work_lookup']})")  # fmt: skip
        print(f"  Target.generate {sec['plain']:.3f} s vs generate() {sec['hf_plain']:.3f} s: "
              f"{_fmt(hf['plain_over_hf_plain'], '.2f')}x (equal work: {hf['equal_work_plain']}); transformers' own "
              f"prompt lookup over its plain generate(): {_fmt(hf['hf_lookup_over_hf_plain'], '.2f')}x")  # fmt: skip
    ha = out.get("hf_assist")
    if ha:
        sec, eq = ha["seconds"], ha["equal_work"]
        print(f"transformers assisted generation, the target's first {ha['layers']} layers drafting {s['k']} tokens, "
              f"{ha['tokens']} tokens (median seconds; live loop: layerskip:layers={ha['layers']}, {ha['live_blocks']} blocks):")  # fmt: skip
        print(f"  live loop {sec['live_layerskip']:.3f} s vs generate(assistant_model=first {ha['layers']} layers) "
              f"{sec['hf_assistant_model']:.3f} s: {_fmt(ha['live_over_hf_assistant_model'], '.2f')}x "
              f"(target >= 1.0x; equal work: {eq['hf_assistant_model']})")  # fmt: skip
        print(f"  live loop vs generate(assistant_early_exit={ha['layers']}) {sec['hf_early_exit']:.3f} s: "
              f"{_fmt(ha['live_over_hf_early_exit'], '.2f')}x (target >= 1.0x; equal work: {eq['hf_early_exit']}); "
              f"outputs equal to plain decoding: {eq['plain']}")  # fmt: skip
    prof = out.get("profile")
    if prof:
        lb, pt = prof["live_ms_per_block"], prof["plain_ms_per_token"]
        print(f"profile: ms per live block ({prof['blocks']} blocks) | per plain step ({prof['tokens']} tokens)")
        for k, v in lb.items():
            print(f"  live  {k:16}{v:8.3f}")
        for k, v in pt.items():
            print(f"  plain {k:16}{v:8.3f}")


def main(argv=None) -> int:
    a = cli.parser(__doc__, NGRAM, vc.TARGET).parse_args(argv)
    cli.check(a, NGRAM, vc.TARGET)
    if a.threads:
        torch.set_num_threads(a.threads)
    items = vc.load_prompts(a.workloads, a.limit, a.target)
    prompts = [ids for _, _, ids in items]
    load0 = os.getloadavg()[0]
    h = Harness(a, prompts)
    out = {"settings": {"target": a.target.name, "ngram": a.ngram, "workloads": ",".join(a.workloads), "limit": a.limit, "prompts": len(prompts), "k": a.k,
                        "max_new_tokens": a.max_new_tokens, "reps": a.reps, "threads": torch.get_num_threads(),
                        "prompt_ids": [f"{w}:{p}" for w, p, _ in items]}}  # fmt: skip
    out["harness"] = h.run(a.reps)
    if a.profile:
        out["profile"] = profile(h, max(1, a.reps // 2))
    if a.hf:
        out["hf"] = hf_compare(h, a, out["harness"]["outputs"])
    if a.hf_assist is not None:
        out["hf_assist"] = hf_assist(h, a, out["harness"]["outputs"])
    if a.vllm:
        out["vllm"] = vllm_half(a, prompts, out["harness"]["outputs"])
        hs, vs = out["harness"]["speedup"], out["vllm"]["speedup"]
        out["ratio"] = hs / vs if hs and vs else None
    out["settings"] |= {"load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    print_report(out)
    if a.json:
        limits.write_json(a.json, out, indent=1)
    return 0


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
