"""How far one target forward is from the hardware's floor, by the tokens it carries, on each kernel path (issue 32).

    python bench/floor.py [--target DIR] [--threads N] [--context 300] [--q 1,2,3,4,5,8,9,16,33] [--reps 9]
        [--dtypes float32,bfloat16] [--kernels aten,mkldnn[,compile]] [--drafters eagle,eagle3,medusa,dflash,layerskip]
        [--k 4] [--bw-mib 1024] [--no-profile] [--json FILE]

In one run, so that every ratio compares figures taken side by side on the same machine state:

1. the host's read bandwidth: a torch sum over a 1 GiB float32 tensor (less when memory is short), the best of 4
   rounds' medians of 7 (after two untimed sums: a first round can run at one thread's speed), read before and
   after the forwards, the higher reading taken (the host's bandwidth moves with its other tenants);
2. for each dtype and kernel path (harness/models/kernels.py: "aten" is plain transformers; "mkldnn-hf" every
   linear on prepacked oneDNN weights under transformers' own forward and DynamicCache; "mkldnn" the harness's
   path: those linears, q/k/v and gate/up fused, under the lean forward and the cache that grows in place
   (harness/models/fastpath.py, bitwise the same logits); "compile" torch.compile with freezing, asked for by
   name: its compiles take minutes on a small CPU): a prefill of `--context` positions, then
   the verify forward (harness.models.lm.forward, causal=True) of Q tokens, `--reps` times per Q with the cache
   cropped back between, median ms; its ratio to Q=1; and its ratio to the floor, the bytes the forward must read
   (every weight once, a tied embedding once, an untied one Q rows, plus the KV cache of context+Q positions)
   over the measured bandwidth;
   and where a Q=1 forward's time goes on each path (torch.profiler: the linears' products, attention, every
   other op, and the wall time no op accounts for), beside the linears' share measured against the whole floor;
3. one live draft call of `--k` tokens of each model drafter on that path (aten and mkldnn), each call's prefix one
   token longer than the last as in live decoding; random-weight heads of the target's shapes (their cost is
   their shape's, not their weights'), and layerskip on a quarter of the target's layers;
4. whether the issue's targets are met: float32 every Q <= 9 within 1.15x of Q=1, float32 Q=1 at most 2.5x the
   float32 floor, bfloat16 Q=1 at most 3.0x its floor (on each dtype's best path: the least summed ms over Q <= 9).

`--json FILE` writes the float32 best path's record at the top level ({"ms": {"<Q>": {"median": ..}}, "floor_ms",
"dtype", "threads", "kernels", "host"}) and every (dtype, kernels) record under "runs". Nothing else may run beside
it: on a shared machine read the ratios (taken side by side), not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs.errors import InputError, UsageError, guarded
from bench.floor_probe import bandwidth, profile

QS = "1,2,3,4,5,8,9,16,33"
DRAFTERS = ("eagle", "eagle3", "medusa", "dflash", "layerskip")
# the bench's paths -> harness.models.kernels' ("mkldnn-hf": those linears under transformers' forward and cache)
KERNEL_OF = {"aten": "aten", "mkldnn-hf": "mkldnn", "mkldnn": "mkldnn", "compile": "compile"}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def host() -> dict:
    """The host as a run's manifest records it (harness/campaign/manifest.py `hardware`), with its cores."""
    import torch

    from harness.campaign.manifest import hardware

    return {**hardware("cpu"), "cores": cores(), "mkldnn": torch.backends.mkldnn.is_available()}


def floor_bytes(model, q: int, context: int) -> int:
    """Bytes one forward of q tokens after `context` cached positions must read: each parameter once (the
    embedding's q rows only when the output head does not reuse it) and every layer's keys and values."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is emb
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():
        n = p.numel() if (p is not emb or tied) else q * p.shape[1]
        total += n * p.element_size()
    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    kv = 2 * int(cfg.num_hidden_layers) * heads * head_dim * (context + q) * emb.element_size()
    return total + kv


def prefilled(model, kern: str, context: int, seed: int = 0):
    """A cache holding `context` random positions, of the kind the path runs with."""
    import torch
    from transformers import DynamicCache

    from harness.models import lm

    ids = torch.randint(0, int(model.config.vocab_size), (context,), generator=torch.Generator().manual_seed(seed))
    cache = lm.new_cache() if kern == "mkldnn" else DynamicCache()
    lm.forward(model, ids, cache, last_logits=True)
    return cache


def time_forwards(models: dict, context: int, qs: list[int], reps: int, seed: int = 0) -> dict:
    """{path: {q: [ms of each rep]}}: one cached forward of q tokens after `context` positions on each path's own
    model. The paths and sizes are interleaved (rep by rep, the paths' order rotated) so that a load that comes
    and goes on a shared machine falls on every path alike: the ratios are taken side by side."""
    import torch

    from transformers import DynamicCache

    from harness.models import lm

    g = torch.Generator().manual_seed(seed)
    vocab = int(next(iter(models.values())).config.vocab_size)
    prompt = torch.randint(0, vocab, (context,), generator=g)
    inputs = {q: torch.randint(0, vocab, (q,), generator=g) for q in qs}
    caches = {}
    for kern, model in models.items():
        caches[kern] = lm.new_cache() if kern == "mkldnn" else DynamicCache()  # (the others: transformers' own)
        lm.forward(model, prompt, caches[kern], last_logits=True)
        for q in qs:  # one unmeasured per size: first-call allocations (and a compile's compiles)
            lm.forward(model, inputs[q], caches[kern], causal=True)
            lm.crop(caches[kern], context)
    out = {kern: {q: [] for q in qs} for kern in models}
    order = list(models)
    for r in range(reps):
        for q in qs:
            for kern in order[r % len(order) :] + order[: r % len(order)]:
                t0 = time.perf_counter()
                lm.forward(models[kern], inputs[q], caches[kern], causal=True)
                out[kern][q].append(1000 * (time.perf_counter() - t0))
                lm.crop(caches[kern], context)
    return out


def make_drafters(model, tok, target: Path, kinds: list[str], tmp: Path) -> dict:
    """Each model drafter of `kinds` over `model`, random-weight heads written under tmp (built after the
    target's kernels are applied: heads hold the target's modules by reference)."""
    import torch

    from harness.drafters.base import DrafterEnv
    from harness.drafters.registry import build_drafters, parse_spec
    from harness.models import dflash, eagle3
    from harness.models.heads import EagleHead, MedusaHeads

    n = int(model.config.num_hidden_layers)
    specs = []
    torch.manual_seed(0)
    for kind in kinds:
        path = tmp / kind
        if kind == "eagle" and not path.exists():
            EagleHead.from_target(model).save(path)
        elif kind == "medusa" and not path.exists():
            MedusaHeads.from_target(model, num_heads=4).save(path)
        elif kind == "eagle3" and not path.exists():
            eagle3.write_random(path, model, sorted({min(2, n - 1), n // 2, max(0, n - 3)}), seed=1)
        elif kind == "dflash" and not path.exists():
            dflash.write_random(path, model, sorted({1 % n, max(0, n - 2)}), block_size=8, seed=2)
        setting = f"layers={max(1, n // 4)}" if kind == "layerskip" else f"path={path}"
        specs.append(parse_spec(f"{kind}={kind}:{setting}"))
    env = DrafterEnv(target=model, tokenizer=tok, target_path=target, dtype=str(model.dtype).removeprefix("torch."))
    return build_drafters(specs, env)


def time_drafts(model, drafters: dict, context: int, k: int, reps: int, seed: int = 0) -> dict[str, float]:
    """Median ms of one live draft call of k tokens per drafter, each call's prefix one token longer."""
    import torch

    from harness.drafters.base import Prefix, feature_layers
    from harness.models import lm

    keys = sorted(set().union(*(feature_layers(d) for d in drafters.values())) | {lm.LAST})
    g = torch.Generator().manual_seed(seed)
    n = context + reps + 2
    ids = torch.randint(0, int(model.config.vocab_size), (n,), generator=g)
    _, hidden = lm.forward(model, ids, lm.new_cache(), taps=keys)  # the target's states at every position
    out = {}
    for name, d in drafters.items():
        d.start("bench", "p0")
        times = []
        for i in range(reps + 1):  # the first call unmeasured: it reads the whole prefix into the head's cache
            m = context + i
            pre = Prefix(ids[: m + 1].tolist(), context, hidden[lm.LAST], 0, 0.0, 0, hidden)
            t0 = time.perf_counter()
            d.draft(pre, k)
            if i:
                times.append(1000 * (time.perf_counter() - t0))
        out[name] = round(statistics.median(times), 3)
    return out


def record(ms: dict[int, list[float]], floors: dict[int, float], dtype: str, kernels: str, threads: int, hst) -> dict:
    med = {q: statistics.median(t) for q, t in ms.items()}
    m1 = med[min(med)] if med else None
    return {
        "ms": {
            str(q): {
                "median": round(v, 3),
                "ratio_q1": round(v / m1, 3),
                "floor_ms": round(floors[q], 3),
                "ratio_floor": round(v / floors[q], 3),
                "times": [round(x, 3) for x in ms[q]],
            }
            for q, v in med.items()
        },
        "floor_ms": round(floors[min(floors)], 3) if floors else None,
        "dtype": dtype,
        "threads": threads,
        "kernels": kernels,
        "host": hst,
    }


def best(runs: list[dict], dtype: str) -> dict | None:
    """The dtype's path with the least summed median over Q <= 9 (the verify regime)."""
    mine = [r for r in runs if r["dtype"] == dtype and r["ms"]]
    return min(mine, key=lambda r: sum(v["median"] for q, v in r["ms"].items() if int(q) <= 9), default=None)


def targets(runs: list[dict]) -> list[dict]:
    """The issue's three targets, each on its dtype's best path: (name, kernels, value, limit, met)."""
    out = []
    f32, b16 = best(runs, "float32"), best(runs, "bfloat16")
    if f32:
        worst = max(v["ratio_q1"] for q, v in f32["ms"].items() if int(q) <= 9)
        out.append(_target("float32 every Q<=9 within 1.15x of Q=1", f32, worst, 1.15))
    for r, limit in ((f32, 2.5), (b16, 3.0)):
        if r and "1" in r["ms"]:
            out.append(_target(f"{r['dtype']} Q=1 at most {limit}x its floor", r, r["ms"]["1"]["ratio_floor"], limit))
    return out


def _target(name: str, r: dict, value: float, limit: float) -> dict:
    return {"target": name, "kernels": r["kernels"], "value": value, "limit": limit, "met": value <= limit}


def render(runs: list[dict], bw: dict, drafts: dict, tg: list[dict], a) -> str:
    hst = runs[0]["host"] if runs else host()
    lines = [
        f"# host: {hst['cpu']}, {a.threads} threads (of {hst['cores']} cores), torch {hst['torch']}",
        f"# read bandwidth: {bw['gbs']} GB/s (sum over {bw['bytes'] >> 20} MiB; the best of {len(bw['rounds_gbs'])} "
        f"rounds' medians of {bw['reps']}, read before the forwards ({bw['before_gbs']}) and after them "
        f"({bw['after_gbs']}))",
        f"# one verify forward of Q tokens after {a.context} cached positions, {a.target}, median of {a.reps} "
        "[MEASURED]; floor = bytes read (weights + KV cache) / bandwidth",
        "| dtype | kernels | Q | ms | / Q=1 | floor ms | / floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for q, v in r["ms"].items():
            lines.append(
                f"| {r['dtype']} | {r['kernels']} | {q} | {v['median']:.2f} | {v['ratio_q1']:.3f} "
                f"| {v['floor_ms']:.2f} | {v['ratio_floor']:.2f} |"
            )
        if r.get("skipped"):
            lines.append(f"| {r['dtype']} | {r['kernels']} | - | skipped: {r['skipped']} | | | |")
    profiled = [r for r in runs if r.get("profile")]
    if profiled:
        cols = ("linear", "attention", "other ops", "python and dispatch")
        lines += [
            "",
            "# where a Q=1 forward's time goes (torch.profiler, self CPU ms per forward; the last column is the wall "
            "time no op accounts for, the profiler's own cost included) [MEASURED]",
            "| dtype | kernels | " + " | ".join(cols) + " | profiled ms | unprofiled ms | linears / floor |",
            "|---|---|" + "---|" * (len(cols) + 3),
        ]
        for r in profiled:
            p = r["profile"]
            share = f"{p['linear'] / r['floor_ms']:.2f}" if r["floor_ms"] else "-"
            lines.append(
                f"| {r['dtype']} | {r['kernels']} | "
                + " | ".join(f"{p[c]:.2f}" for c in cols)
                + f" | {p['profiled_ms']:.2f} | {p['ms']:.2f} | {share} |"
            )
    if drafts:
        lines += [
            "",
            f"# one live draft call of {a.k} tokens, median of {a.reps} [MEASURED]; RANDOM-weight heads of the "
            "target's shapes (the cost is the shape's), layerskip on a quarter of the layers",
            "| dtype | kernels | " + " | ".join(f"{d} ms" for d in a.drafters) + " |",
            "|---|---|" + "---|" * len(a.drafters),
        ]
        for (dt, kern), got in drafts.items():
            lines.append(f"| {dt} | {kern} | " + " | ".join(str(got.get(d, "-")) for d in a.drafters) + " |")
    lines += ["", "# targets (issue 32), on each dtype's best path"]
    for t in tg:
        lines.append(
            f"- {t['target']}: {t['value']:.3f} on {t['kernels']} (limit {t['limit']}): "
            + ("met" if t["met"] else "MISSED")
        )
    return "\n".join(lines)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="models/smollm2-135m-instruct", help="a model directory (safetensors)")
    ap.add_argument("--threads", type=int, default=cores(), help="torch threads (default: every core)")
    ap.add_argument("--context", type=int, default=300, help="cached positions before the measured forward")
    ap.add_argument("--q", default=QS, help="forward sizes (tokens), comma-separated")
    ap.add_argument("--reps", type=int, default=9, help="timed forwards per size (the median is printed)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    ap.add_argument(
        "--kernels",
        default="aten,mkldnn-hf,mkldnn",
        help="comma-separated kernel paths: aten, mkldnn-hf, mkldnn, compile (minutes)",
    )
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help="model drafters to time ('' for none)")
    ap.add_argument("--k", type=int, default=4, help="tokens per timed draft call")
    ap.add_argument("--bw-mib", type=int, default=1024, help="MiB summed to measure the read bandwidth")
    ap.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the profile of a Q=1 forward on each path"
    )
    ap.add_argument("--json", help="write the records to this file")
    return ap.parse_args(argv)


def check(a) -> list[int]:
    """Every setting checked before anything is measured: one line naming the problem."""
    from harness.models import kernels

    if a.threads < 1:
        raise UsageError(f"--threads {a.threads}: expected at least 1 (default: every core, {cores()} here)")
    try:
        qs = sorted({int(x) for x in a.q.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--q {a.q!r}: expected comma-separated token counts") from None
    if not qs or qs[0] < 1 or a.context < 1 or a.reps < 1 or a.k < 1 or a.bw_mib < 1:
        raise UsageError("--q, --context, --reps, --k and --bw-mib must be positive")
    for name, value, known in (("--dtypes", a.dtypes, kernels.DTYPES), ("--kernels", a.kernels, KERNEL_OF)):
        bad = [x for x in value if x not in known]
        if bad or not value:
            raise UsageError(f"{name}: unknown {bad or 'none given'}; known: {', '.join(known)}")
    bad = [d for d in a.drafters if d not in DRAFTERS]
    if bad:
        raise UsageError(f"--drafters: unknown {bad}; known: {', '.join(DRAFTERS)}")
    target = Path(a.target)
    if not (target / "config.json").is_file():
        raise InputError(f"--target {target}: no model directory (no config.json there)")
    cfg = json.loads((target / "config.json").read_text())
    n_pos = cfg.get("max_position_embeddings")
    if n_pos and a.context + qs[-1] > int(n_pos):
        raise UsageError(
            f"--q {qs[-1]} after --context {a.context}: {a.context + qs[-1]} positions, past the model's {n_pos}"
        )
    if a.json:
        out = Path(a.json)
        if not out.parent.is_dir():
            raise InputError(f"--json {out}: the folder {out.parent} does not exist")
        if out.is_symlink():
            raise InputError(f"--json {out}: a symlink stands there: not written through")
    return qs


def run_all(a, qs: list[int]):
    """Every path timed, then every ratio to the floor made with the best bandwidth read before and after them: the
    machine's bandwidth moves with what else its host runs (37 and 53 GB/s minutes apart on 2026-12-05's host), and
    the highest reading is the floor a forward could have reached during the run."""
    import torch

    from harness.models import fastpath, kernels, lm

    torch.set_num_threads(a.threads)
    hst = host()
    bw_before = bandwidth(a.bw_mib)
    timed, drafts = [], {}  # timed: (dtype, kern, ms, floor bytes per q, profile, skipped)
    target = Path(a.target)
    tok = lm.load_tokenizer(target) if a.drafters else None
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        for dtype in a.dtypes:
            models, skipped = {}, {}
            for kern in a.kernels:  # a model per path, so that the paths' forwards can alternate
                why = kernels.unavailable(KERNEL_OF[kern], dtype)
                if why:
                    skipped[kern] = why
                else:
                    model = lm.load_lm(target, dtype=dtype, what="--target")
                    models[kern] = kernels.apply_kernels(model, KERNEL_OF[kern], dtype)
                    if kern == "mkldnn-hf":
                        fastpath.uninstall(model)
            any_model = next(iter(models.values()), None)
            nbytes = {q: floor_bytes(any_model, q, a.context) for q in qs} if models else {}
            t0 = time.perf_counter()
            ms = time_forwards(models, a.context, qs, a.reps) if models else {}
            print(f"  {dtype}: {', '.join(models)} timed in {time.perf_counter() - t0:.0f} s", flush=True)
            for kern in a.kernels:
                prof = None
                if kern in models and a.profile and kern != "compile":
                    prof = profile(models[kern], prefilled(models[kern], kern, a.context), a.context)
                timed.append((dtype, kern, ms.get(kern, {}), nbytes, prof, skipped.get(kern)))
                if a.drafters and kern in models and kern in ("aten", "mkldnn"):  # compile skips the heads' own methods
                    ds = make_drafters(models[kern], tok, target, a.drafters, Path(tmp) / dtype)
                    for d in ds.values():
                        kernels.apply_drafter(d, KERNEL_OF[kern], dtype)
                    drafts[(dtype, kern)] = time_drafts(models[kern], ds, a.context, a.k, a.reps)
            del models, any_model
    bw_after = bandwidth(a.bw_mib)
    bw = max(bw_before, bw_after, key=lambda b: b["gbs"])
    bw = {**bw, "before_gbs": bw_before["gbs"], "after_gbs": bw_after["gbs"]}
    runs = []
    for dtype, kern, ms, nbytes, prof, why in timed:
        floors = {q: n / (bw["gbs"] * 1e9) * 1000 for q, n in nbytes.items()}
        rec = record(ms, floors, dtype, kern, a.threads, hst)
        if prof is not None:
            rec["profile"] = prof
        runs.append({**rec, "skipped": why} if why else rec)
    return runs, bw, drafts


def main(argv=None) -> int:
    a = parse(argv)
    a.dtypes = [x for x in a.dtypes.split(",") if x.strip()]
    a.kernels = [x for x in a.kernels.split(",") if x.strip()]
    a.drafters = [x for x in a.drafters.split(",") if x.strip()]
    qs = check(a)
    runs, bw, drafts = run_all(a, qs)
    tg = targets(runs)
    print(render(runs, bw, drafts, tg, a))
    if a.json:
        from bandit.logs.safeio import write_text

        top = best(runs, "float32") or best(runs, a.dtypes[0]) or runs[0]
        obj = {
            **{k: top[k] for k in ("ms", "floor_ms", "dtype", "threads", "kernels", "host")},
            "command": " ".join(["python bench/floor.py", *(sys.argv[1:] if argv is None else argv)]),
            "target": a.target,
            "context": a.context,
            "reps": a.reps,
            "bandwidth": bw,
            "runs": runs,
            "drafters": {f"{dt}/{kern}": got for (dt, kern), got in drafts.items()},
            "drafter_weights": "random, of the target's shapes",
            "targets": tg,
        }
        write_text(a.json, json.dumps(obj, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    guarded(main)
