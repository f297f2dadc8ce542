"""A DFlash block drafter for a target, trained here on the self-distillation data (zoo/distill.py), in z-lab's
layout that harness.models.dflash reads (config.json with dflash_config: block_size, mask_token_id,
target_layer_ids; model.safetensors without the target's embedding and lm_head).

    python -m zoo.dflash_train --data DIR --out DIR [--target NAME] [--models DIR] [--layers 2]
        [--blocks 5,9,17] [--anchors 64] [--vocab 16384] [--steps N] [--batch 4] [--max-len 512] [--lr 1e-3] [--seed 0]
        [--target-layers 1,14,26,29]
        [--threads N] [--heldout-prompts 8] [--stage all|train|eval]

The model (harness.models.dflash.DFlash; our reading of DFlash, arXiv 2602.06036, and of its SGLang and vLLM
integrations): `--layers` non-causal Qwen3 layers; the target's states at layers 1, L//2-1, L-4 and L-1 (the
outputs of those layers: hidden_states 2, L//2, L-3, the states EAGLE-3 reads, and L, the final state) are fused
by fc and normed into a context whose keys and values every draft layer makes with its own projections. A block is the last token
and block-1 mask tokens (embedded by the target's embedding); it attends to the whole context before it and to
itself, non-causally; the target's lm_head reads all block-1 drafts in one pass. With `--vocab` N < the target's
vocabulary, only the lm_head's rows of the N most frequent generated tokens (a draft vocabulary, d2t as EAGLE-3
writes it; harness.models.dflash reads it): the loss and every draft then cost N/V of the full head's product.

Training (our choices where the paper leaves them open; DESIGN records them): each sequence's context keys
are made once; `--anchors` block starts are drawn per sequence among the positions whose block drafts
generated tokens (a function of seed, step and sequence), each block seeing the context before it only; cross
entropy against the true next tokens (those in the draft vocabulary), position j of the block weighted exp(-j/4)
(DFlash weighs early positions more: a later token counts only when the earlier ones are accepted). The block size
of each step is drawn from --blocks, so one drafter serves k = 4, 8 and 16 with a block of k+1 (`dflash:block=5`
drafts 4 tokens for the cost of 5 positions); config.json's block_size is the largest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bandit.logs import limits
from bandit.logs.errors import UsageError
from harness.models import dflash, lm

from . import distill_train as DT

PUBLISHED = (
    "Published figures are tokens per verify on 8B-27B targets on GPUs: SGLang's log for "
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat on a Blackwell 6000 Pro shows `accept len: 6.10` "
    "(forums.developer.nvidia.com, 2026-02-07), and a GGUF port of DFlash with a draft tree commits about 8.3 "
    "tokens per step on HumanEval with Qwen3.5-27B on an RTX 3090 (ai-suka.pages.dev, 2026-05-11). Those targets "
    "are 60-200x this one; the accepted lengths here exclude the bonus token (add 1 to compare)."
)
POS_DECAY = 4.0


def parser():
    ap = limits.Parser(
        prog="python -m zoo.dflash_train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="the dataset directory of zoo.distill")
    ap.add_argument("--out", required=True, help="the drafter's directory")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--models", help="models root (else $SPECBANDIT_MODELS)")
    ap.add_argument("--layers", type=int, default=2, help="draft layers")
    ap.add_argument("--target-layers", help="target layer ids read, comma-separated (default 1, L//2-1, L-4, L-1)")
    ap.add_argument("--blocks", default="5,9,17", help="block sizes drawn per step (k + 1 for k = 4, 8, 16)")
    ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence per step")
    ap.add_argument("--vocab", type=int, default=16384, help="draft vocabulary (0: the target's whole vocabulary)")
    ap.add_argument("--steps", type=int, default=0, help="optimiser steps (0: one pass over the data)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--max-len", type=int, default=512, help="positions per sequence (its last ones)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    ap.add_argument("--heldout-prompts", type=int, default=DT.HELDOUT_PROMPTS)
    ap.add_argument("--stage", choices=("all", "train", "eval"), default="all")
    return ap


def block_loss(m, g, ids, n_prompt: int, anchors: int, rng: np.random.Generator, t2d=None):
    """The loss of one sequence: g (N, n*H) target states, ids (N,) (see the module's doc); t2d (V,) the draft
    index of each target id, -1 outside the draft vocabulary (None: the whole vocabulary)."""
    import torch
    import torch.nn.functional as F

    N = ids.shape[0]
    lo = max(n_prompt - 1, 0)
    if N - 1 - lo < 1:
        return None, {}
    a = torch.as_tensor(np.sort(rng.choice(np.arange(lo, N - 1), size=min(anchors, N - 1 - lo), replace=False)))
    ctx = m.context(g[: N - 1], torch.arange(N - 1))
    allow = torch.arange(N - 1)[None, :] < a[:, None]  # block at a sees the context 0..a-1
    logits = m.block(ids[a], a, ctx, allow)  # (M, B-1, V)
    j = torch.arange(1, m.block_size)
    lab_pos = a[:, None] + j[None, :]
    ok = lab_pos <= N - 1
    lab = ids[lab_pos.clamp(max=N - 1)]
    if t2d is not None:
        lab = t2d[lab]
        ok = ok & (lab >= 0)
        if not bool(ok.any()):
            return None, {}
    w = torch.exp(-(j - 1).float() / POS_DECAY)[None, :].expand_as(lab_pos)[ok]
    ce = F.cross_entropy(logits[ok], lab[ok], reduction="none")
    hit = (logits.argmax(-1) == lab) & ok
    acc = float(hit[:, 0].float().mean())
    return (ce * w).sum() / w.sum(), {"acc1": acc}


def mask_token(tok, counts: np.ndarray) -> int:
    """The block's mask token: the first special token (not bos, eos or pad) that the target never generated in
    the data (SmolLM2: 3, <repo_name>), else the lowest id never generated."""
    skip = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    for i in sorted(set(tok.all_special_ids) - skip):
        if 0 <= i < len(counts) and counts[i] == 0:
            return int(i)
    never = np.flatnonzero(counts == 0)
    if not len(never):
        raise UsageError("every token of the vocabulary occurs in the generated data: no free mask token")
    return int(never[0])


def target_layer_ids(a, L: int) -> list[int]:
    """--target-layers, else layers 1, L//2-1, L-4 (the states EAGLE-3 reads) and L-1 (the final state)."""
    if getattr(a, "target_layers", None):
        try:
            return [int(x) for x in a.target_layers.split(",")]
        except ValueError:
            raise UsageError(f"--target-layers {a.target_layers}: expected comma-separated integers") from None
    return [1, L // 2 - 1, L - 4, L - 1]


def build(a, target, out: Path, block_max: int, mask_id: int, rows=None):
    import torch

    L = int(target.config.num_hidden_layers)
    ids = target_layer_ids(a, L)
    dflash.write_random(out, target, ids, block_size=block_max, num_layers=a.layers, mask_token_id=mask_id,
                        seed=a.seed, vocab_rows=None if rows is None else [int(r) for r in rows])  # fmt: skip
    m = dflash.load(out, target, "--out")
    torch.manual_seed(a.seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
    return m


def save(m, out: Path) -> None:
    from safetensors.torch import save_file

    sd = {k: (v.detach().float() if v.is_floating_point() else v).contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv=None) -> int:
    return DT.cli("zoo.dflash_train", parser, run, argv)


def run(a, argv) -> int:
    import torch

    from harness.models import kernels

    out, path, target, tok, data = DT.setup(a)

    blocks_ = sorted({int(b) for b in a.blocks.split(",") if b.strip()})
    if not blocks_ or blocks_[0] < 2:
        raise UsageError(f"--blocks {a.blocks}: block sizes of at least 2")
    V = int(target.get_output_embeddings().weight.shape[0])
    counts = data.token_counts(V)
    mask_id = mask_token(tok, counts)
    if a.vocab < 0:
        raise UsageError(f"--vocab {a.vocab}: a vocabulary size, or 0 for the target's whole vocabulary")
    rows, cover = DT.draft_vocab(counts, a.vocab) if 0 < a.vocab < V else (None, 1.0)
    t2d = None
    if rows is not None:
        t2d = torch.full((V,), -1, dtype=torch.long)
        t2d[torch.as_tensor(rows)] = torch.arange(len(rows))
    out.mkdir(parents=True, exist_ok=True)
    m = build(a, target, out, blocks_[-1], mask_id, rows)
    if set(m.keys) - set(data.keys):
        raise UsageError(f"--data {a.data}: holds the states {data.keys}, not {sorted(set(m.keys) - set(data.keys))}")
    n = len(data)
    steps = a.steps or -(-n // a.batch)

    def loss_at(step):
        m.block_size = blocks_[np.random.default_rng([a.seed, step, 7]).integers(len(blocks_))]
        tot, parts, used = 0.0, {}, 0
        for i in DT.batch_order(n, a.seed, step, a.batch):
            ids, npr, f = data.sequence(i, m.keys, a.max_len)
            l_, p_ = block_loss(m, torch.from_numpy(f.reshape(len(ids), -1)), torch.from_numpy(ids), npr,
                                a.anchors, np.random.default_rng([a.seed, step, i]), t2d)  # fmt: skip
            if l_ is not None:
                tot, used = tot + l_, used + 1
                parts["acc1"] = parts.get("acc1", 0.0) + p_["acc1"]
        parts = {k: v / max(1, used) for k, v in parts.items()}
        return tot / max(1, used), {**parts, "block": float(m.block_size)}

    meta = {"data_sha256": data.sha256(), "layers": a.layers, "vocab": len(rows) if rows is not None else V,
            "target_layers": ",".join(map(str, target_layer_ids(a, int(target.config.num_hidden_layers)))), "blocks": ",".join(map(str, blocks_)), "anchors": a.anchors,
            "steps": steps, "batch": a.batch, "max_len": a.max_len, "lr": a.lr, "seed": a.seed}  # fmt: skip
    ckpt = out.parent / f"{out.name}.checkpoint.safetensors"  # beside: the harness reads every file inside
    res = {"steps": steps, "wall_s": 0.0, "resumed_at": steps}
    if a.stage in ("all", "train"):
        res = DT.fit(m, loss_at, steps, a.lr, ckpt, meta, "dflash")
    else:
        DT.load_checkpoint(ckpt, m, torch.optim.AdamW(m.parameters()), meta)
    m.block_size = blocks_[-1]
    save(m, out)
    if a.stage == "train":
        return 0
    kernels.apply_kernels(target, "mkldnn")
    acc = {}
    for b in blocks_:
        spec = f"k{b - 1}=dflash:block={b},path={out}"
        acc.update(DT.heldout([spec], target, tok, path, out.parent / "heldout-greedy", b - 1, a.heldout_prompts))
    info = {"kind": "dflash", "target": {"path": DT.portable(path, a.models), "sha256": lm.weights_sha256(path)},
            "data": {"path": DT.portable(Path(a.data), a.models), "sha256": data.sha256(), "sequences": n,
                     "generated_tokens": data.card["generated_tokens"], "prompt_tokens": data.card["prompt_tokens"]},
            "target_layer_ids": target_layer_ids(a, int(target.config.num_hidden_layers)),
            "mask_token_id": mask_id, "vocab_coverage": round(cover, 4), **meta, "train_wall_s": res["wall_s"], "resumed_at": res["resumed_at"],
            "last_step": res.get("last"), "threads": torch.get_num_threads(), "heldout_prompts": a.heldout_prompts,
            "heldout_acceptance": {f"k = {b - 1} (block {b})": acc[f"k{b - 1}"] for b in blocks_},
            "sha256": {"weights": lm.weights_sha256(out)},
            "path": DT.portable(out, a.models),
            "command": DT.command("zoo.dflash_train", list(sys.argv[1:] if argv is None else argv), a.models)}  # fmt: skip
    about = ("DFlash block drafter: non-causal Qwen3 layers over [last token, mask tokens] with context keys and "
             "values from the target's states at four layers (zoo/dflash_train.py); z-lab's layout, with a draft "
             "vocabulary (d2t) when --vocab is below the target's.")  # fmt: skip
    DT.write_card(out, info, f"DFlash drafter for {info['target']['path']}", about, PUBLISHED)
    DT.log("dflash: " + "; ".join(f"k={b - 1}: {acc[f'k{b - 1}']['mean']}" for b in blocks_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
