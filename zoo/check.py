"""Quality gate: greedy live speculative decoding with every zoo drafter reproduces the target's
own greedy output exactly, on held-out prompts of every CPU workload.

    python -m zoo.check [--prompts 2] [--max-new-tokens 64] [--k 8]

Uses the harness engine (``harness/``) in ``live`` mode, one drafter at a time, and compares
with ``target.generate(do_sample=False)``. Prints one line per drafter and workload with the
mean accepted length of the live run; exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import sys

from . import DRAFT_DIR, EAGLE_DIR, MEDUSA_DIR, TARGET_DIR, WORKLOADS

SPECS = ["ngram=ngram", "suffix=suffix", f"draft=draft:path={DRAFT_DIR}",
         f"medusa=medusa:path={MEDUSA_DIR}", f"eagle=eagle:path={EAGLE_DIR}",
         "cascade=cascade:of=draft+ngram"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args(argv)
    import torch

    import workloads as wlmod
    from harness import lm
    from harness.drafters import DrafterEnv, build_drafters, parse_spec
    from harness.engine import Engine, RunConfig
    from harness.target import Target
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
                ref = model.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens,
                                     do_sample=False)[0, len(prompt):].tolist()
                eng = Engine(Target(model, tok), {name: d}, RunConfig("live", args.k, args.max_new_tokens, 0.0))
                res = eng.run_prompt(wl, it.prompt_id, prompt)
                ok &= res.output == ref
                acc += sum(r["drafts"][name]["accepted"] for r in res.records)
                blocks += len(res.records)
            bad += not ok
            print(f"{wl:6s} {name:8s} {'exact' if ok else 'MISMATCH'}  mean accepted {acc / max(blocks, 1):.2f} "
                  f"over {blocks} blocks", flush=True)
    print("all exact" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
