"""Quality gate: greedy live speculative decoding with every zoo drafter reproduces the target's
own greedy output exactly, on held-out prompts of every CPU workload.

    python -m zoo.check [--prompts 2] [--max-new-tokens 64] [--k 8]
    python -m zoo.check --copy      # in-context copying probe of the target, into its card

Uses the harness engine (``harness/``) in ``live`` mode, one drafter at a time, and compares
with ``target.generate(do_sample=False)``. Prints one line per drafter and workload with the
mean accepted length of the live run; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys

from . import DRAFT_DIR, EAGLE_DIR, MEDUSA_DIR, TARGET_DIR, WORKLOADS

SPECS = [
    "ngram=ngram",
    "suffix=suffix",
    f"draft=draft:path={DRAFT_DIR}",
    f"medusa=medusa:path={MEDUSA_DIR}",
    f"eagle=eagle:path={EAGLE_DIR}",
    "cascade=cascade:of=draft+ngram",
]


def copy_probe(model, n: int = 16, length: int = 40, seed: int = 0, pool=None) -> dict:
    """Does the model copy from its context? Mean loss (nats/token) on the first and on the
    second occurrence of `n` strings of `length` tokens, each repeated once (the classic
    induction test): a model that copies gets the second nearly free, one that does not scores
    both alike. The strings are uniform random ordinary tokens, or, with `pool` (a 1-D token
    array, e.g. held-out text), contiguous spans of it at random offsets."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    first, second = [], []
    with torch.no_grad():
        for _ in range(n):
            if pool is None:
                s = rng.integers(5, V, size=length)  # ids 0-4 are the special tokens
            else:
                a = int(rng.integers(0, len(pool) - length))
                s = np.asarray(pool[a : a + length], dtype=np.int64)
            x = torch.as_tensor(np.r_[s, s])[None]
            lp = F.cross_entropy(model(input_ids=x).logits[0, :-1].float(), x[0, 1:], reduction="none")
            first.append(lp[: length - 1].mean().item())
            second.append(lp[length:].mean().item())
    return {
        "first": round(float(np.mean(first)), 3),
        "second": round(float(np.mean(second)), 3),
        "log_vocab": round(float(np.log(V)), 3),
        "strings": n,
        "length": length,
        "seed": seed,
        "source": "uniform random tokens" if pool is None else "held-out corpus spans",
    }


def record_copy_probe() -> tuple[dict, dict]:
    """Both probes of the shipped target (random strings, held-out spans), into its card."""
    import json

    import numpy as np

    from harness.models import lm
    from .cards import refresh
    from .data import heldout_tokens

    model = lm.load_lm(TARGET_DIR)
    held = np.concatenate([v for _, v in sorted(heldout_tokens().items())])
    res, res_held = copy_probe(model), copy_probe(model, pool=held)
    p = TARGET_DIR / "training_info.json"
    info = json.loads(p.read_text())
    info["in_context_copy"], info["in_context_copy_heldout"] = res, res_held
    p.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    refresh()
    return res, res_held


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zoo.check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument(
        "--copy",
        action="store_true",
        help="run the in-context copying probe on the target and record it in its model card instead",
    )
    args = ap.parse_args(argv)
    if args.copy:
        r, h = record_copy_probe()
        print(
            f"target: loss on the first occurrence of a random {r['length']}-token string "
            f"{r['first']:.2f}, on its repeat {r['second']:.2f} (log vocab {r['log_vocab']:.2f})"
        )
        print(
            f"target: the same for {h['strings']} held-out corpus spans: {h['first']:.2f} first, "
            f"{h['second']:.2f} on the repeat"
        )
        return 0
    import torch

    import workloads as wlmod
    from harness.models import lm
    from harness.drafters import DrafterEnv, build_drafters, parse_spec
    from harness.decode.engine import Engine, RunConfig
    from harness.models.target import Target

    torch.set_num_threads(1)
    tok = lm.load_tokenizer(TARGET_DIR)
    model = lm.load_lm(TARGET_DIR)
    drafters = build_drafters([parse_spec(s) for s in SPECS], DrafterEnv(model, tok, TARGET_DIR))
    items = wlmod.load(list(WORKLOADS), None, args.prompts)
    bad = 0
    for wl in WORKLOADS:
        for name, d in drafters.items():
            acc, blocks, ok = 0, 0, True
            for it in [i for i in items if i.workload == wl]:
                prompt = it.token_ids(tok)
                # both stop at the end-of-text / end-of-turn tokens (generation_config.eos_token_id)
                ref = model.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=False)[
                    0, len(prompt) :
                ].tolist()
                eng = Engine(Target(model, tok), {name: d}, RunConfig("live", args.k, args.max_new_tokens, 0.0))
                res = eng.run_prompt(wl, it.prompt_id, prompt)
                ok &= res.output == ref
                acc += sum(r["drafts"][name]["accepted"] for r in res.records)
                blocks += len(res.records)
            bad += not ok
            print(
                f"{wl:6s} {name:8s} {'exact' if ok else 'MISMATCH'}  mean accepted {acc / max(blocks, 1):.2f} "
                f"over {blocks} blocks",
                flush=True,
            )
    print("all exact" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
