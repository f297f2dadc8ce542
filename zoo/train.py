"""Retrain the zoo: ``python -m zoo.train all|tokenizer|workloads|target|students|draft|medusa|eagle [--fresh]``.

Every stage is deterministic for its seeds (CPU, ``torch.set_num_threads(2)``), shows tqdm
progress bars, checkpoints to ``zoo/_scratch/`` (a killed stage resumes where it stopped;
``--fresh`` discards checkpoints) and writes its final weights (safetensors, fp16) and model
card into ``zoo/<name>/``. ``all`` runs, in order: tokenizer, workloads, target, students
(the draft model, the Medusa heads and the EAGLE head, trained together on one shared frozen
target forward per batch; ``draft``, ``medusa``, ``eagle`` train one of them alone).
"""

from __future__ import annotations

import argparse
import time

from . import SCRATCH_DIR
from .data import copy_drills, get_torch, log, stage_tokenizer
from .lm import TARGET_DEFAULTS, lr_at, stage_eval, stage_target
from .prompts import stage_workloads, token_boundary_prompt
from .students import STUDENT_DEFAULTS, STUDENTS, stage_draft, stage_eagle, stage_medusa, stage_students

# documented as zoo.train.<name> (the model cards, zoo/README.md, NEGATIVE_RESULTS.md): they live in zoo/data.py,
# zoo/lm.py and zoo/prompts.py
__all__ = ["STAGES", "STAGE_DEFAULTS", "copy_drills", "lr_at", "main", "token_boundary_prompt"]

STAGE_DEFAULTS = {"target": TARGET_DEFAULTS, "students": STUDENT_DEFAULTS}
STAGES = {
    "tokenizer": stage_tokenizer,
    "workloads": stage_workloads,
    "target": stage_target,
    "students": stage_students,
    "draft": stage_draft,
    "medusa": stage_medusa,
    "eagle": stage_eagle,
    "eval": stage_eval,
}


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m zoo.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "stage", choices=["all", "tokenizer", "workloads", "target", "students", "draft", "medusa", "eagle", "eval"]
    )
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--fresh", action="store_true", help="ignore checkpoints in zoo/_scratch")
    args = ap.parse_args(argv)
    get_torch()
    kw = dict(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed)
    stages = ["tokenizer", "workloads", "target", "students"] if args.stage == "all" else [args.stage]
    for st in stages:
        if args.fresh:
            pat = "target_ckpt.pt" if st == "target" else "students_*_ckpt.pt"
            for p in SCRATCH_DIR.glob(pat):
                p.unlink()
        t = time.time()
        log(f"=== stage {st}")
        STAGES[st](**(kw if st in STAGE_DEFAULTS or st in STUDENTS else {}))
        log(f"=== stage {st} done in {time.time() - t:.0f}s")


if __name__ == "__main__":
    main()
