"""A short smoke run for a GPU host: what the harness does there, in one screen.

    python bench/gpu_smoke.py                              # the zoo models (zoo/), 2 workloads x 3 prompts
    python bench/gpu_smoke.py --target DIR --drafter NAME=KIND:... [--workloads code,chat] [--prompts 3]
    python bench/gpu_smoke.py --device cpu --dtype float32 --json out.json

Reports, for the chosen device and dtype (default: cuda if present, `--dtype auto` = bfloat16 there):

* the attention backend: the target's `attn_implementation`, and which SDPA kernels accept the
  harness's two kinds of forward (plain causal generation, and tree verification with a custom mask);
* the disagreement rate: over a dense pass, how often one teacher-forced verification forward picks
  another token than generation did (the manifest's `target_check`), and how many live decodes end
  with an output other than the dense one, without and with `--exact-verify` (Target(exact=True));
* tokens/s of plain greedy generation and of live speculative decoding with each drafter, and the mean
  accepted length per block;
* peak memory (CUDA: max allocated; CPU: the process's peak RSS).

Without --drafter it uses the zoo drafters plus a random EAGLE-3 head (as a chain and as a tree of drafts) and a
random DFlash head written on the zoo target (to exercise those loaders, their tapped layers and the tree-masked
verify on the device; they are not trained, so their acceptance is near 0). On a machine without CUDA it runs on the CPU and says so.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.models import dflash, eagle3, lm
from harness.drafters import DrafterEnv, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.target import Target, now_ms
import workloads
from bandit.logs import limits
from bandit.logs.errors import UsageError
from harness.models import options

MAX_PROMPTS = 100_000

ZOO_DRAFTERS = [
    "ngram=ngram",
    "suffix=suffix",
    "draft=draft:path=zoo/draft",
    "medusa=medusa:path=zoo/medusa",
    "eagle=eagle:path=zoo/eagle",
]


def sdpa_probe(model, device: str) -> dict:
    """Which SDPA kernels run a plain causal forward and a custom-mask (tree) forward of the target."""
    if not device.startswith("cuda"):
        return {"note": "cpu: torch picks its CPU SDPA kernels"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ids = torch.arange(16, device=device) % model.config.vocab_size
    allow = torch.ones(16, 16, dtype=torch.bool, device=device).tril()
    out = {}
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        row = {}
        for kind, kw in (("causal", {}), ("tree_mask", {"allow": allow})):
            try:
                with sdpa_kernel([b]):
                    lm.forward(model, ids, lm.new_cache(), **kw)
                row[kind] = True
            except RuntimeError:
                row[kind] = False
        out[b.name.lower()] = row
    return out


def peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def default_drafters(model, tmp: Path) -> list[str]:
    e3 = eagle3.write_random(tmp / "eagle3", model, [1, 2, int(model.config.num_hidden_layers)], seed=1)
    df = dflash.write_random(tmp / "dflash", model, [0, int(model.config.num_hidden_layers) - 2], block_size=9, seed=2)
    return [s.replace("path=zoo/", f"path={REPO}/zoo/") for s in ZOO_DRAFTERS] + [
        f"eagle3=eagle3:path={e3}",
        f"eagle3_tree=eagle3:path={e3},tree=16,width=4",  # a tree of drafts: the tree-masked verify on the device
        f"dflash=dflash:path={df}",
    ]


def disagreement(model, tok, drafters: dict, prompts, k: int, max_new: int, exact: bool) -> dict:
    """Dense pass with the target check, then every drafter live: counts of differing tokens and outputs."""
    for d in drafters.values():
        d.env.exact = exact
    tgt = Target(model, tok, str(next(model.parameters()).device), exact=exact)
    dense = Engine(tgt, drafters, RunConfig("dense", k, max_new), check=True)
    tokens = disagree = mismatched = decodes = 0
    for wl, pid, ids in prompts:
        res = dense.run_prompt(wl, pid, ids, finish=False)
        tokens += res.check["tokens"]
        disagree += res.check["disagreements"]
        for n, d in drafters.items():
            if exact and getattr(d, "tree", 0):
                continue  # a tree is verified in one forward only (harness/models/target.py)
            live = Engine(tgt, {n: d}, RunConfig("live", k, max_new)).run_prompt(wl, pid, ids, finish=False)
            mismatched += live.output != res.output
            decodes += 1
    return {
        "check_tokens": tokens,
        "check_disagreements": disagree,
        "rate": round(disagree / max(1, tokens), 6),
        "live_decodes": decodes,
        "live_outputs_differing_from_dense": mismatched,
    }


def speed(model, tok, drafters: dict, prompts, k: int, max_new: int, device: str) -> dict:
    """Tokens/s of plain generation and of live decoding per drafter (after one untimed warm-up prompt)."""
    tgt = Target(model, tok, device)
    out = {}
    for name, run in [("generate", None)] + [(n, d) for n, d in drafters.items()]:
        eng = None if run is None else Engine(tgt, {name: run}, RunConfig("live", k, max_new))
        toks, ms, acc, blocks = 0, 0.0, 0, 0
        for i, (wl, pid, ids) in enumerate(prompts):
            t0 = now_ms(device)
            if eng is None:
                y = tgt.generate(ids, max_new, 0)[0]
            else:
                res = eng.run_prompt(wl, pid, ids, finish=False)
                y = res.output
                acc += sum(r["drafts"][name]["accepted"] for r in res.records)
                blocks += len(res.records)
            if i:  # the first prompt pays one-off costs (kernels, caches)
                toks, ms = toks + len(y), ms + now_ms(device) - t0
        out[name] = {
            "tokens_per_s": round(toks / max(ms, 1e-9) * 1000, 1),
            "mean_accepted": None if eng is None else round(acc / max(1, blocks), 3),
        }
    return out


def check(a) -> tuple[Path, str, list, list]:
    """Every option before any model loads: (target, dtype, drafter specs, prompts' items); one line naming the
    option otherwise."""
    options.device(a.device)
    dtype = lm.resolve_dtype(a.dtype, a.device)
    limits.integer("--k", a.k, *options.BOUNDS["--k"])
    limits.integer("--prompts", a.prompts, 1, MAX_PROMPTS)
    limits.integer("--max-new-tokens", a.max_new_tokens, *options.BOUNDS["--max-new-tokens"])
    a.json = limits.out_file("--json", a.json)
    tpath = limits.path_value("--target", a.target)
    if not tpath.is_dir():
        raise UsageError(f"--target {tpath}: no such model directory")
    lm.refuse_drafter_dir(tpath, "--target")
    npos = lm.read_config(tpath).get("max_position_embeddings")
    if isinstance(npos, int) and npos > 1:
        limits.integer("--max-new-tokens", a.max_new_tokens, 1, npos - 1, f" (the target has {npos} positions)")
    specs = [parse_spec(s) for s in a.drafter]
    if len({s.name for s in specs}) != len(specs):
        raise UsageError("--drafter: a name is used twice")
    names = [w for w in a.workloads.split(",") if w]
    if not names:
        raise UsageError(f"--workloads {a.workloads!r}: name at least one workload")
    items = workloads.load(names, None, a.prompts)
    if len(items) < 2:  # speed() times every prompt after the first (which pays the one-off costs)
        raise UsageError(f"--prompts {a.prompts} of --workloads {a.workloads}: {len(items)} prompt, the speed needs 2")
    return tpath, dtype, specs, items


def main(argv=None) -> dict:
    ap = limits.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REPO / "zoo" / "target"))
    ap.add_argument("--drafter", action="append", default=[], help="NAME=KIND[:key=value,...], repeatable")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu) | float32 | bfloat16")
    ap.add_argument("--workloads", default="code,chat")
    ap.add_argument("--prompts", type=int, default=3, help=f"prompts per workload: 1..{MAX_PROMPTS}")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="1..the target's positions - 1")
    ap.add_argument("--k", type=int, default=8, help="draft length: {}..{}".format(*options.BOUNDS["--k"]))
    ap.add_argument("--no-exact", action="store_true", help="skip the exact-mode disagreement pass (slow on CPU)")
    ap.add_argument("--json", help="also write the report here (its folder must exist)")
    a = ap.parse_args(argv)
    tpath, dtype, parsed, items = check(a)
    if not a.device.startswith("cuda"):
        print(
            f"note: ran on CPU (no CUDA device{' asked for' if torch.cuda.is_available() else ''}); "
            "numbers are CPU numbers",
            file=sys.stderr,
        )
    t_start = time.perf_counter()
    model, tok = lm.load_lm(tpath, a.device, dtype, "--target"), lm.load_tokenizer(tpath)
    prompts = [(p.workload, p.prompt_id, p.token_ids(tok)) for p in items]
    with tempfile.TemporaryDirectory() as tmp:
        specs = a.drafter or default_drafters(model, Path(tmp))
        env = DrafterEnv(model, tok, tpath, a.device, dtype)
        drafters = build_drafters(parsed or [parse_spec(s) for s in specs], env)
        report = {
            "device": a.device,
            "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None,
            "dtype": dtype,
            "torch": torch.__version__,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "sdpa_kernels": sdpa_probe(model, a.device),
            "prompts": len(prompts),
            "k": a.k,
            "max_new_tokens": a.max_new_tokens,
            "drafters": specs,
            "disagreement": {"plain": disagreement(model, tok, drafters, prompts, a.k, a.max_new_tokens, False)},
        }
        if not a.no_exact:
            report["disagreement"]["exact_verify"] = disagreement(
                model, tok, drafters, prompts, a.k, a.max_new_tokens, True
            )
        for d in drafters.values():
            d.env.exact = False
        report["speed"] = speed(model, tok, drafters, prompts, a.k, a.max_new_tokens, a.device)
    report["peak_memory_mb"] = peak_mb(a.device)
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(report, indent=2))
    if a.json:
        limits.write_json(a.json, report)
    return report


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
