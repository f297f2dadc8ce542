"""Medusa-1 heads and an EAGLE head retrained on the self-distillation data (zoo/distill.py), each with a draft
vocabulary, in the formats the harness's `medusa` and `eagle` drafters load.

    python -m zoo.heads_distill --data DIR --out DIR [--target NAME] [--models DIR] [--vocab 8192]
        [--heads medusa,eagle] [--steps 400] [--batch 8] [--window 256] [--seed 0] [--threads N]
        [--heldout-prompts 8] [--stage all|train|eval]

The heads are zoo.heads' (harness.models.heads; sized from the target, zoo/heads_fit.py's losses and learning rates),
trained on the target's final state ("last") and greedy tokens of the data; a loss is taken where the label is a
generated token. With --vocab N (0: the full vocabulary) each head scores only the N most frequent generated tokens
(zoo.distill_train.draft_vocab, saved as the head's `draft_ids`): Medusa's projections start as the target's rows of
them; EAGLE reads the target's lm_head rows of them. Labels outside the vocabulary take no loss. Each head trains on
its own through zoo.distill_train.fit (resumable from <out>/<head>.checkpoint.safetensors, the windows of a step a
function of seed and step: zoo.heads_data.window_batch), then the held-out acceptance at k = 4 on the campaign's own
prompts (zoo.distill_train.heldout) goes into each head's card.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bandit.logs import limits
from bandit.logs.errors import UsageError
from harness.models import lm

from . import distill_train as DT
from .heads_data import Stream, window_batch
from .heads_fit import LR, SEED_OFFSET, eagle_config, eagle_masked_loss, medusa_masked_loss

ABOUT = {
    "medusa": "Medusa-1 heads (harness.models.heads.MedusaHeads): head i reads the target's last hidden state at t "
    "and predicts the token at t + 1 + i, over the draft vocabulary; retrained on the self-distillation data.",
    "eagle": "EAGLE-1 style head (harness.models.heads.EagleHead): one Llama decoder layer over fc(cat(feature t, "
    "embedding of token t + 1)) predicts feature t + 1, read by the target's lm_head rows of the draft "
    "vocabulary; retrained on the self-distillation data.",
}
PUBLISHED = (
    "Medusa (Cai et al. 2024, arXiv 2401.10774) and EAGLE (Li et al. 2024, arXiv 2401.15077) train on ShareGPT "
    "(about 68k dialogues) on GPUs for 7B-70B targets; the accepted lengths here are of a 135M target, chains of "
    "k = 4, bonus token not counted."
)


def parser():
    ap = limits.Parser(prog="python -m zoo.heads_distill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--data", required=True, help="the dataset directory of zoo.distill")
    ap.add_argument("--out", required=True, help="directory of the heads (<out>/medusa, <out>/eagle)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--models", help="models root (else $SPECBANDIT_MODELS)")
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary (0: the full vocabulary)")
    ap.add_argument("--heads", default="medusa,eagle")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8, help="windows per step")
    ap.add_argument("--window", type=int, default=256, help="positions per window (+1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    ap.add_argument("--heldout-prompts", type=int, default=DT.HELDOUT_PROMPTS)
    ap.add_argument("--stage", choices=("all", "train", "eval"), default="all")
    return ap


def stream(data: DT.Distilled, t2d: np.ndarray | None, max_len: int = 1 << 30) -> Stream:
    """Every sequence's final states (float16), ids, labels (the next token in draft-vocabulary ids; -100 where
    none is taken: the last position, or a token outside the vocabulary), and loss positions (labels that are
    generated tokens)."""
    import torch

    parts: dict[str, list] = {k: [] for k in ("ids", "feats", "labels", "seg", "pos", "loss")}
    for i in range(len(data)):
        ids, npr, f = data.sequence(i, ["last"], max_len)
        n = len(ids)
        lab = np.full(n, -100, np.int64)
        lab[:-1] = ids[1:] if t2d is None else t2d[ids[1:]]
        t = np.arange(n)
        parts["ids"].append(torch.from_numpy(ids))
        parts["feats"].append(torch.from_numpy(f[:, 0].astype(np.float16)))
        parts["labels"].append(torch.from_numpy(lab))
        parts["seg"].append(torch.full((n,), i, dtype=torch.long))
        parts["pos"].append(torch.from_numpy(t))
        parts["loss"].append(torch.from_numpy((t >= npr - 1) & (t < n - 1) & (lab >= 0)))
    return Stream(**{k: torch.cat(v) for k, v in parts.items()}, disagree=0)


def main(argv=None) -> int:
    return DT.cli("zoo.heads_distill", parser, run, argv)


def run(a, argv) -> int:
    import torch

    from harness.models import kernels

    out, path, target, tok, data = DT.setup(a)
    from harness.models.heads import EagleHead, MedusaHeads

    names = [n for n in a.heads.split(",") if n]
    if not names or set(names) - {"medusa", "eagle"}:
        raise UsageError(f"--heads {a.heads}: medusa and/or eagle")
    if "last" not in data.keys:
        raise UsageError(f"--data {a.data}: holds {data.keys}, not the final state 'last'")
    V = int(target.get_output_embeddings().weight.shape[0])
    counts = data.token_counts(V)
    keep, cover = DT.draft_vocab(counts, a.vocab) if a.vocab and a.vocab < V else (None, 1.0)
    t2d = None
    if keep is not None:
        t2d = np.full(V, -100, np.int64)
        t2d[keep] = np.arange(len(keep))
    st = stream(data, t2d)
    out.mkdir(parents=True, exist_ok=True)
    facts = {}
    for n in names:
        torch.manual_seed(a.seed + SEED_OFFSET[n])
        ids = None if keep is None else torch.as_tensor(keep)
        m = (MedusaHeads.from_target(target, ids) if n == "medusa"
             else EagleHead.from_target(target, ids, **eagle_config(target)))  # fmt: skip

        def loss_at(step, m=m, n=n):
            starts, w = window_batch(st, a.batch, a.window, a.seed, step)
            idx = torch.as_tensor(starts)[:, None] + torch.arange(w)[None]
            f, x, lab, sg, ps, ls = (getattr(st, k)[idx] for k in ("feats", "ids", "labels", "seg", "pos", "loss"))
            f = f.float()
            loss = (
                medusa_masked_loss(m, f, lab, sg, ls) if n == "medusa" else eagle_masked_loss(m, f, x, lab, sg, ps, ls)
            )
            return loss, {"loss": float(loss.detach())}

        meta = {"data_sha256": data.sha256(), "head": n, "vocab": a.vocab, "steps": a.steps, "batch": a.batch,
                "window": a.window, "seed": a.seed}  # fmt: skip
        ckpt = out / f"{n}.checkpoint.safetensors"
        if a.stage in ("all", "train"):
            facts[n] = DT.fit(m, loss_at, a.steps, LR[n], ckpt, meta, n)
        else:
            facts[n] = {
                "wall_s": 0.0,
                "resumed_at": DT.load_checkpoint(ckpt, m, torch.optim.AdamW(m.parameters()), meta),
            }
        m.to(torch.float16).save(out / n)
        facts[n]["params"] = sum(p.numel() for p in m.parameters() if p.requires_grad)
    if a.stage == "train":
        return 0
    kernels.apply_kernels(target, "mkldnn")
    specs = [f"{n}={n}:path={out / n}" for n in names]
    acc = DT.heldout(specs, target, tok, path, out / "heldout-greedy", 4, a.heldout_prompts)
    for n in names:
        d = out / n
        info = {"kind": n, "path": DT.portable(d, a.models),
                "target": {"path": DT.portable(path, a.models), "sha256": lm.weights_sha256(path)},
                "data": {"path": DT.portable(Path(a.data), a.models), "sha256": data.sha256(), "sequences": len(data),
                         "generated_tokens": data.card["generated_tokens"], "prompt_tokens": data.card["prompt_tokens"],
                         "loss_positions": int(st.loss.sum())},
                "draft_vocab": len(keep) if keep is not None else V, "draft_vocab_coverage": round(cover, 4),
                "steps": a.steps, "batch": a.batch, "window": a.window, "lr": LR[n], "seed": a.seed,
                "train_wall_s": facts[n]["wall_s"], "resumed_at": facts[n]["resumed_at"],
                "params": facts[n]["params"], "threads": torch.get_num_threads(), "heldout_prompts": a.heldout_prompts,
                "heldout_acceptance": {"k = 4": acc[n]}, "sha256": {"weights": lm.weights_sha256(d)},
                "command": DT.command("zoo.heads_distill", list(sys.argv[1:] if argv is None else argv), a.models)}  # fmt: skip
        DT.write_card(d, info, f"{n} heads for {info['target']['path']} (draft vocabulary {info['draft_vocab']})",
                      ABOUT[n], PUBLISHED)  # fmt: skip
        DT.log(f"{n}: held-out mean accepted length at k=4 {acc[n]['mean']} {acc[n]['per_workload']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
