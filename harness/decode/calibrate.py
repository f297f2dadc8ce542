"""Timing calibration from a short live phase: what turns rho and alpha into measurements.

Each drafter in turn decodes a few prompts live (real speculative decoding, its own KV
caches warm as in production); its median call time is `drafter_ms`. On prefixes taken
from those live outputs, the target's verification forward is then timed for 1..k+1
verified tokens (`verify_ms`) and for N = 1..D drafts of length k in one tree forward
(`verify_batch_ms`), medians over prefixes and repeats. Drafter instances used here keep
the state the live phase gives them: run this after a dense sweep, not before.
"""

from __future__ import annotations

import statistics

import torch

from ..models import lm
from .engine import Engine, RunConfig
from ..models.target import Target, now_ms


PAD_GAIN = 0.05  # a size is padded only where a larger one is measured at least this much cheaper


def time_passes(model, qs: list[int], context: int = 300, reps: int = 15, seed: int = 0) -> dict[int, float]:
    """Median ms of one cached causal forward of q tokens after `context` positions (a one-chain verify's shape),
    the sizes taking turns rep by rep so that drift falls on all of them (the first round warms them up)."""
    dev = str(next(model.parameters()).device)
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    cache = lm.new_cache()
    lm.forward(model, torch.randint(0, vocab, (context,), generator=g).to(dev), cache, last_logits=True)
    ms: dict[int, list[float]] = {q: [] for q in qs}
    for rep in range(reps + 1):
        for q in qs:
            ids = torch.randint(0, vocab, (q,), generator=g).to(dev)
            t0 = now_ms(dev)
            lm.forward(model, ids, cache, causal=True)
            if rep:
                ms[q].append(now_ms(dev) - t0)
            lm.crop(cache, context)
    return {q: statistics.median(v) for q, v in ms.items()}


def pad_table(ms: dict[int, float], gain: float = PAD_GAIN) -> dict[int, int]:
    """{Q: Q'}: each size from 2 run as the cheapest measured size at or above it, where that saves at least
    `gain` of its own time (a forward of one token, plain decoding's, is never padded)."""
    out = {}
    for q in sorted(ms):
        if q < 2:
            continue
        best = min((x for x in ms if x >= q), key=lambda x: (ms[x], x))
        if best > q and ms[best] <= (1 - gain) * ms[q]:
            out[q] = best
    return out


def _sizes(k: int) -> list[int]:
    s, t = [], 1
    while t < k + 1:
        s.append(t)
        t *= 2
    return sorted(set(s + [k, k + 1]))


def time_verify(target: Target, prefixes: list[list[int]], k: int, n_drafts: int, reps: int = 5):
    """(verify_ms, verify_batch_ms) in the manifest's form, measured on these prefixes."""
    dev = target.device
    V = target.model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    by_tokens: dict[int, list[float]] = {t: [] for t in _sizes(k)}
    by_drafts: dict[int, list[float]] = {n: [] for n in range(1, max(1, n_drafts) + 1)}
    for ids in prefixes:
        cache = lm.new_cache()
        lm.forward(target.model, torch.tensor(ids[:-1], device=dev), cache)
        c = lm.cache_len(cache)
        rand = lambda n: torch.randint(0, V, (n,), generator=g).tolist()
        target.verify(cache, ids[-1:], [rand(k)], len(ids), 0)  # warm-up, untimed
        lm.crop(cache, c)
        for _ in range(reps):
            for t in by_tokens:
                chains = [rand(t - 1)]
                t0 = now_ms(dev)
                target.verify(cache, ids[-1:], chains, len(ids), 0, want_p=False)
                by_tokens[t].append(now_ms(dev) - t0)
                lm.crop(cache, c)
            for n in by_drafts:
                chains = [rand(k) for _ in range(n)]
                t0 = now_ms(dev)
                target.verify(cache, ids[-1:], chains, len(ids), 0, want_p=False)
                by_drafts[n].append(now_ms(dev) - t0)
                lm.crop(cache, c)
    med = lambda xs: round(statistics.median(xs), 4)
    return (
        {"tokens": list(by_tokens), "ms": [med(v) for v in by_tokens.values()]},
        {"drafts": list(by_drafts), "ms": [med(v) for v in by_drafts.values()]},
    )


def live_phase(
    target: Target, drafters: dict, prompts: list[tuple[str, str, list[int]]], cfg: RunConfig, progress=None
) -> tuple[dict, dict]:
    """Run each drafter live on `prompts`; returns (timing for the manifest, raw numbers)."""
    draft_ms, tokens_per_s, prefixes = {}, {}, []
    for name, d in drafters.items():
        eng = Engine(target, {name: d}, RunConfig("live", cfg.k, cfg.max_new_tokens, cfg.temperature, cfg.seed))
        calls, toks, wall = [], 0, 0.0
        for wl, pid, ids in prompts:
            t0 = now_ms(target.device)
            res = eng.run_prompt(wl, pid, ids)
            wall += now_ms(target.device) - t0
            calls += res.timings["draft"][name]
            toks += len(res.output)
            if name == next(iter(drafters)):
                prefixes.append(ids + res.output[: max(1, len(res.output) // 2)])
            if progress:
                progress(1)
        draft_ms[name] = round(statistics.median(calls), 4) if calls else None
        tokens_per_s[name] = round(toks / (wall / 1000.0), 2) if wall else None
    verify_ms, verify_batch_ms = time_verify(target, prefixes, cfg.k, len(drafters))
    timing = {"verify_ms": verify_ms, "verify_batch_ms": verify_batch_ms, "drafter_ms": draft_ms}
    raw = {
        "live_tokens_per_s": tokens_per_s,
        "prompts": [[w, p] for w, p, _ in prompts],
        "max_new_tokens": cfg.max_new_tokens,
    }
    return timing, raw
