"""Which tree of drafts (`eagle3:tree=N,width=W`) for the campaign: tokens per target pass of EAGLE-3's dynamic tree by
its size and width, beside the chain, on prompts the head never saw (issue 33).

    python bench/tree_width.py [--models models] [--head smollm2-eagle3] [--prompts 24] [--trees 16x4,16x8,24x4,24x6,24x8,32x8]
        [--resamples 2000] [--seed 0] [--threads N] [--json FILE]

The prompts are the self-distillation pool's (`<models>/smollm2-distill/prompts.jsonl`) that have no generated row in
its `tokens.parquet`: the heads never trained on them, and the pool is disjoint from the campaign's prompts by hash
(zoo/distill_prompts.py), so choosing the tree here tunes nothing on the prompts the campaign judges it on. Every
`--prompts`-th such prompt is decoded greedily by the target once (128 tokens, its chat template), every drafter
drafts densely at every position (harness/decode/engine.py, dense mode), and tokens per pass follow each drafter's
own trajectory, as replay.txt counts them. Intervals: 95% percentile bootstrap over prompts. [MEASURED] on this host;
the verify cost a tree adds is not here (the campaign's live phase measures it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError
from bandit.logs.outputs import show

MAX_NEW, K = 128, 4


def trees(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        n, _, w = part.strip().partition("x")
        if not (n.isdigit() and w.isdigit() and 1 <= int(n) <= 4096 and 1 <= int(w) <= 64):
            raise UsageError(f"--trees {spec!r}: {part!r} is not NxW (N tokens in [1, 4096], W wide in [1, 64])")
        out.append((int(n), int(w)))
    return out


def unseen(distill: Path, n: int) -> list[dict]:
    """Every n-th pool prompt without a generated row (module doc), n spread over the pool."""
    import pyarrow.parquet as pq

    try:
        used = set(pq.read_table(distill / "tokens.parquet", columns=["prompt_id"]).column(0).to_pylist())
        lines = [json.loads(x) for x in (distill / "prompts.jsonl").read_text().splitlines()[1:]]
    except (OSError, ValueError) as e:
        raise InputError(f"{distill}: not a self-distillation dataset (python -m zoo.distill): {e}") from None
    free = [r for r in lines if isinstance(r, dict) and r.get("prompt_id") not in used and r.get("messages")]
    if len(free) < n:
        raise InputError(f"{distill}: {len(free)} pool prompts without a generated row, fewer than --prompts {n}")
    return free[:: len(free) // n][:n]


def per_pass(records: list[dict], name: str) -> tuple[int, int]:
    """(output tokens, target passes) along drafter `name`'s own trajectory over one prompt's dense records."""
    pos = passes = 0
    while pos < len(records):
        pos += records[pos]["drafts"][name]["accepted"] + 1
        passes += 1
    return len(records), passes


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python bench/tree_width.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models")
    ap.add_argument("--head", default="smollm2-eagle3", help="the EAGLE-3 head's directory under --models")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--trees", default="16x4,16x8,24x4,24x6,24x8,32x8")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    configs = trees(a.trees)
    limits.threads("--threads", a.threads)
    limits.integer("--prompts", a.prompts, 2, 1000)
    limits.integer("--resamples", a.resamples, 1, 1_000_000)
    limits.seed("--seed", a.seed)
    models = Path(a.models)
    prompts = unseen(models / "smollm2-distill", a.prompts)

    import numpy as np
    import torch
    from tqdm import tqdm

    from harness.campaign.manifest import hardware
    from harness.decode.engine import Engine, RunConfig
    from harness.drafters import DrafterEnv, build_drafters, parse_spec
    from harness.models import kernels, lm
    from harness.models.target import Target

    if a.threads:
        torch.set_num_threads(a.threads)
    tpath = lm.resolve_model_dir("smollm2-135m-instruct", str(models), "the target")
    target = lm.load_lm(tpath)
    kernels.apply_kernels(target, "mkldnn")  # the campaign's forwards
    tok = lm.load_tokenizer(tpath)
    specs = [f"chain=eagle3:path={a.head}"] + [
        f"tree{n}x{w}=eagle3:path={a.head},tree={n},width={w}" for n, w in configs
    ]
    drafters = build_drafters([parse_spec(s) for s in specs], DrafterEnv(target, tok, tpath, models_root=str(models)))
    eng = Engine(Target(target, tok), drafters, RunConfig("dense", K, MAX_NEW))
    counts = np.zeros((len(prompts), len(drafters), 2))
    t0 = time.time()
    for i, r in enumerate(tqdm(prompts, desc="tree_width", unit="prompt")):
        ids = tok.apply_chat_template(r["messages"], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        res = eng.run_prompt(r.get("source", "pool"), r["prompt_id"], ids)
        counts[i] = [per_pass(res.records, n) for n in drafters]
    rng = np.random.default_rng(a.seed)
    draws = rng.integers(0, len(prompts), (a.resamples, len(prompts)))
    rows = {}
    for j, name in enumerate(drafters):
        value = counts[:, j, 0].sum() / counts[:, j, 1].sum()
        boot = counts[draws, j, 0].sum(1) / counts[draws, j, 1].sum(1)
        rows[name] = {
            "value": round(float(value), 4),
            "ci": [round(float(x), 4) for x in np.percentile(boot, [2.5, 97.5])],
        }
    hw = hardware("cpu")
    print(f"[MEASURED] tokens per target pass along each drafter's own trajectory, {len(prompts)} pool prompts the head "
          f"never saw, k = {K}, {MAX_NEW} tokens; 95% percentile bootstrap over prompts, {a.resamples} resamples, seed "
          f"{a.seed}; {time.time() - t0:.0f} s on {hw.get('cpu')} ({torch.get_num_threads()} threads)")  # fmt: skip
    print("| drafts | tokens per pass |\n|---|---|")
    for name, f in rows.items():
        print(f"| {name} | {f['value']:.3f} [{f['ci'][0]:.3f}, {f['ci'][1]:.3f}] |")
    out = {"label": "MEASURED", "prompts": [r["prompt_id"] for r in prompts], "k": K, "max_new_tokens": MAX_NEW,
           "head": a.head, "tokens_per_pass": rows, "hardware": hw, "threads": torch.get_num_threads(),
           "ci": "95% percentile bootstrap over prompts", "resamples": a.resamples, "seed": a.seed}  # fmt: skip
    if a.json:
        out["command"] = " ".join(["python bench/tree_width.py", *(sys.argv[1:] if argv is None else argv)])
        limits.write_json(limits.path_value("--json", a.json), out)
        print(f"wrote {show(a.json)}")
    return out


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
