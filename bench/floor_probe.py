"""The two probes bench/floor.py makes besides its timed forwards: how fast this machine reads memory (the floor's
denominator), and where one forward's time goes (torch.profiler). bench/pass_cost.py reads the bandwidth too."""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def bandwidth(mib: int = 1024, reps: int = 7, rounds: int = 4) -> dict:
    """The host's read bandwidth, GB/s: a sum over a float32 tensor of `mib` MiB (at most a quarter of free
    memory), far larger than the caches so that it reads memory; `rounds` rounds of `reps` after two untimed sums,
    the best round's median. A first round right after start-up can run at about one thread's speed (seen on the AMD
    host of 2026-12-05), which would put the floor too high and flatter every ratio to it: the best round is what
    the machine can read, the floor a forward could reach."""
    import torch

    size = mib << 20
    try:
        avail = next(
            int(x.split()[1]) * 1024 for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvail" in x
        )
        size = min(size, avail // 4)
    except (OSError, StopIteration):
        pass
    x = torch.ones(size // 4, dtype=torch.float32)
    x.sum()  # pages touched and the thread pool up before timing
    x.sum()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            x.sum()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    del x
    t = min(medians)
    return {
        "gbs": round(size / t / 1e9, 2),
        "bytes": size,
        "median_ms": round(1000 * t, 3),
        "reps": reps,
        "rounds_gbs": [round(size / m / 1e9, 2) for m in medians],
    }


LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm")  # a linear's product
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                 "aten::_efficient_attention_forward", "aten::_scaled_dot_product_efficient_attention")  # fmt: skip


def profile(model, cache, context: int, reps: int = 5, seed: int = 1) -> dict:
    """Where one Q=1 forward's time goes (torch.profiler, `reps` forwards): the self CPU ms per forward of the
    linears' products, of attention and of every other op, and the rest of the wall time (Python, dispatch, the
    profiler's own cost: an upper bound), with the wall ms of the same forwards unprofiled beside it."""
    import torch

    ids = torch.randint(0, int(model.config.vocab_size), (1,), generator=torch.Generator().manual_seed(seed))
    timed_forwards(model, ids, cache, context, 2)  # untimed: first-call allocations
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        timed_forwards(model, ids, cache, context, reps)
    wall = 1000 * (time.perf_counter() - t0) / reps
    plain = timed_forwards(model, ids, cache, context, reps)
    part = {"linear": 0.0, "attention": 0.0, "other ops": 0.0}
    for ev in prof.key_averages():
        kind = "linear" if ev.key in LINEAR_OPS else "attention" if ev.key in ATTENTION_OPS else "other ops"
        part[kind] += ev.self_cpu_time_total / 1000 / reps
    part = {k: round(v, 3) for k, v in part.items()}
    return {**part, "python and dispatch": round(wall - sum(part.values()), 3), "profiled_ms": round(wall, 3),
            "ms": round(statistics.median(plain), 3)}  # fmt: skip


def timed_forwards(model, ids, cache, context: int, reps: int) -> list[float]:
    """The ms of `reps` verify forwards of ids (harness.models.lm.forward, causal) after the cache's first
    `context` positions, the cache cropped back after each."""
    from harness.models import lm

    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.forward(model, ids, cache, causal=True)
        out.append(1000 * (time.perf_counter() - t0))
        lm.crop(cache, context)
    return out
