"""An EAGLE-3 head for a target, trained here on the self-distillation data (zoo/distill.py), in the speculators
layout that vLLM loads and harness.models.eagle3 reads.

    python -m zoo.eagle3_train --data DIR --out DIR [--target NAME] [--models DIR] [--vocab 16384]
        [--steps N] [--batch 4] [--ttt 4] [--layer-ids 2,15,27] [--max-len 512] [--lr 5e-4] [--seed 0] [--threads N]
        [--sizes 4096,8192,16384,0] [--heldout-prompts 8] [--stage all|train|eval]

The model (harness.models.eagle3.Eagle3): fc over the target's states at a low, a middle and a high layer
(speculators' default ids 2, L//2, L-3), one Llama decoder layer over cat(embedding, state), the target's own
lm_head rows for the draft vocabulary (kept frozen, as EAGLE-1 keeps the target's whole head: the head learns to
produce a state that the target's rows read), and the target's embedding (frozen).

Training-time test (EAGLE-3, Li et al. 2025, arXiv 2503.01840): ``--ttt`` unrolled steps. Step 0 runs on the
pairs (target state at j, token j+1) at position j+1, causally; step s >= 1 feeds each index's own output of
step s-1 with the true token j+1+s at position j+1+s, and attends to step 0's keys up to j and to its own
earlier steps (the mask the harness's dense drafting uses, harness.drafters.model.chain_allow). Step s at index
j predicts token j+2+s: cross entropy over the draft vocabulary, only where that token is one the target
generated and lies in the draft vocabulary; step s weighs 0.8^s.

The draft vocabulary (--vocab) is the most frequent generated tokens (zoo.distill_train.draft_vocab). One head
is trained at --vocab; since its lm_head rows are the target's, the heads for every size in --sizes (0: the
full vocabulary) are the same layers with the first rows of that size (or the target's whole lm_head), so the
token coverage, the held-out acceptance and the draft-call time of each size are measured on one training; the
size whose (1 + acceptance) / (verify(k+1) + k draft steps) is best becomes <out>/ (the others lie in
<out>-vocab/<size>/), each with its card.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bandit.logs import limits
from bandit.logs.errors import UsageError
from harness.models import eagle3, lm

from . import distill_train as DT

PUBLISHED = (
    "EAGLE-3 (Li et al. 2025, arXiv 2503.01840) trains on ShareGPT and UltraChat-200K (about 68k and 464k "
    "entries) on GPUs and reports speedups up to 6.5x with tree drafts on 8B-70B targets. On small targets the "
    "figures are far lower: AngelSlim's EAGLE-3 benchmarks give mean accept lengths of 2.17 for Qwen3-1.7B and "
    "1.99 for Qwen3-8B (GSM8K, Alpaca, HumanEval, MT-bench; angelslim.readthedocs.io, performance/speculative_decoding). "
    "Those lengths count the bonus token; the accepted lengths here do not (add 1 to compare)."
)
STEP_WEIGHT = 0.8
ABOUT = (
    "One Llama decoder layer over fc(target states at three layers) and the token embedding, trained with "
    "training-time test on the target's own greedy continuations (zoo/eagle3_train.py); speculators layout "
    "(what vLLM loads); the lm_head rows are the target's for the draft vocabulary (d2t/t2d)."
)


def parser():
    ap = limits.Parser(
        prog="python -m zoo.eagle3_train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="the dataset directory of zoo.distill")
    ap.add_argument("--out", required=True, help="the head's directory (variants beside it in <out>-vocab/)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--models", help="models root (else $SPECBANDIT_MODELS)")
    ap.add_argument(
        "--vocab", type=int, help="draft vocabulary trained (default 16384 or the target's, if smaller; 0: all)"
    )
    ap.add_argument(
        "--sizes", help="draft vocabularies measured (<= --vocab; 0: full; default 4096,8192,16384,0 below it)"
    )
    ap.add_argument("--steps", type=int, default=0, help="optimiser steps (0: one pass over the data)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--ttt", type=int, default=4, help="unrolled training-time-test steps")
    ap.add_argument("--layer-ids", help="the target's hidden_states read, comma-separated (default 2, L//2, L-3)")
    ap.add_argument("--max-len", type=int, default=512, help="positions per sequence (its last ones)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    ap.add_argument("--k", type=int, default=4, help="draft length of the held-out acceptance")
    ap.add_argument("--heldout-prompts", type=int, default=DT.HELDOUT_PROMPTS)
    ap.add_argument("--stage", choices=("all", "train", "eval"), default="all")
    return ap


def ttt_loss(m, g, ids, n_prompt, in_vocab, t2d_index, steps: int):
    """The unrolled loss of one sequence: g (N, 3H) target states, ids (N,) (see the module's doc)."""
    import torch
    import torch.nn.functional as F

    N = ids.shape[0]
    Q = N - 1  # pairs j = 0..N-2
    j = torch.arange(Q)
    h = m.fuse(g[:Q])[None]
    causal = j[None, :] <= j[:, None]
    eye = torch.eye(Q, dtype=torch.bool)
    kv, total, parts = None, 0.0, {}
    pad = torch.zeros(steps + 2, dtype=ids.dtype)
    x = torch.cat([ids, pad])
    for s in range(steps):
        tok = x[j + 1 + s]
        mask = None if s == 0 else torch.cat([causal] + [eye] * s, 1)[None, None]
        h, _, kv = m.step(h, tok[None], (j + 1 + s)[None], kv, mask, logits=False)
        lab_pos = j + 2 + s
        lab = x[lab_pos]
        ok = (lab_pos <= N - 1) & (lab_pos >= n_prompt) & in_vocab[lab]
        if ok.any():
            logits = m.head(h[0, ok])
            loss = F.cross_entropy(logits, t2d_index[lab[ok]])
            total = total + STEP_WEIGHT**s * loss
            parts[f"s{s}"] = float((logits.argmax(-1) == t2d_index[lab[ok]]).float().mean())
    return total, parts


def build(a, target, counts: np.ndarray, out: Path):
    """The untrained head at --vocab, written to `out` (config.json and weights) and loaded from there."""
    import torch

    V = int(target.get_output_embeddings().weight.shape[0])
    Vd = a.vocab or V
    L = int(target.config.num_hidden_layers)
    ids = [int(x) for x in a.layer_ids.split(",")] if getattr(a, "layer_ids", None) else [2, L // 2, L - 3]
    eagle3.write_random(out, target, ids, draft_vocab=Vd if Vd < V else None, seed=a.seed,
                        verifier=Path(target.name_or_path), speculative_tokens=a.k)  # fmt: skip
    m = eagle3.load(out, target, "--out")
    keep, cover = DT.draft_vocab(counts, Vd)
    torch.manual_seed(a.seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and not name.startswith(("lm_head", "embed_tokens")):
                torch.nn.init.normal_(p, std=0.02)
        m.lm_head.weight.copy_(target.get_output_embeddings().weight[torch.as_tensor(keep)])
        if m.d2t is not None:
            m.d2t.copy_(torch.as_tensor(keep) - torch.arange(Vd))
    m.lm_head.weight.requires_grad_(False)
    if m.embed_tokens is not None:
        m.embed_tokens.weight.requires_grad_(False)
    return m, keep, cover


def save(m, path: Path, keep: np.ndarray, V: int) -> None:
    """The head's weights in the speculators layout (config.json written by `build` / `variant`)."""
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().float().contiguous() for k, v in m.state_dict().items() if v is not None}
    if len(keep) < V:
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[torch.as_tensor(keep)] = True
        state["t2d"] = t2d
    else:
        state.pop("d2t", None)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def variant(m, target, path: Path, base: Path, trained: np.ndarray, counts: np.ndarray, size: int) -> float:
    """The trained head with the draft vocabulary of `size` (0: all) written to `path`; returns its coverage.
    Its layers are the trained ones; its lm_head rows the target's rows of that vocabulary."""
    import torch
    from safetensors.torch import save_file

    V = int(target.get_output_embeddings().weight.shape[0])
    n = size or V
    keep, cover = DT.draft_vocab(counts, n) if n < V else (np.arange(V), 1.0)
    if n <= len(trained) and not np.isin(keep, trained).all():
        raise UsageError(f"draft vocabulary {n}: not within the trained {len(trained)}")
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((base / "config.json").read_text())
    cfg["draft_vocab_size"] = n
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    sd = {k: v.detach().float().contiguous() for k, v in m.state_dict().items() if k != "d2t" and v is not None}
    sd["lm_head.weight"] = target.get_output_embeddings().weight.detach().float()[torch.as_tensor(keep)].contiguous()
    if n < V:
        sd["d2t"] = torch.as_tensor(keep) - torch.arange(n)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[torch.as_tensor(keep)] = True
        sd["t2d"] = t2d
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    return cover


def verify_ms(target, q: int, reps: int = 9) -> float:
    """Median ms of one target forward of q tokens after 300 cached positions (the live loop's verify)."""
    import torch

    ts = []
    for r in range(reps):
        cache = lm.new_cache()
        lm.forward(target, torch.zeros(300, dtype=torch.long), cache, last_logits=True)
        t0 = time.perf_counter()
        lm.forward(target, torch.zeros(q, dtype=torch.long), cache, causal=True)
        ts.append((time.perf_counter() - t0) * 1000)
    return float(np.median(ts))


def draft_ms(path: Path, target, k: int, reps: int = 20) -> float:
    """Median ms of one chained draft step (batch 1, after 300 cached pairs) of the head at `path`."""
    import torch

    m = eagle3.load(path, target)
    H = int(target.get_output_embeddings().weight.shape[1])
    with torch.no_grad():
        _, _, kv = m.step(torch.zeros(1, 300, H), torch.zeros(1, 300, dtype=torch.long), torch.arange(300)[None])
        ts = []
        for r in range(reps):
            t0 = time.perf_counter()
            h, lg, _ = m.step(torch.zeros(1, 1, H), torch.zeros(1, 1, dtype=torch.long), torch.tensor([[300]]), kv)
            m.to_target(lg[0, -1].argmax())
            ts.append((time.perf_counter() - t0) * 1000)
    return float(np.median(ts))


def main(argv=None) -> int:
    return DT.cli("zoo.eagle3_train", parser, run, argv)


def run(a, argv) -> int:
    import torch

    from harness.models import kernels

    out, path, target, tok, data = DT.setup(a)

    V = int(target.get_output_embeddings().weight.shape[0])
    if a.vocab is None:
        a.vocab = 16384 if V > 16384 else 0
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s.strip()] if a.sizes else None
    except ValueError:
        raise UsageError(f"--sizes {a.sizes}: expected comma-separated integers") from None
    if sizes is None:
        sizes = [s for s in (4096, 8192, 16384) if s <= (a.vocab or V) and s < V] + [0]  # (the trained size too)
    if not 0 <= a.vocab <= V:
        raise UsageError(f"--vocab {a.vocab}: the target has {V} tokens (0: all of them)")
    if not sizes or any(not 0 <= s <= (a.vocab or V) for s in sizes):
        raise UsageError(f"--sizes {a.sizes}: sizes in 0..--vocab ({a.vocab or V}; 0: the full vocabulary)")
    counts = data.token_counts(V)
    out.mkdir(parents=True, exist_ok=True)
    m, keep, cover = build(a, target, counts, out)
    if set(m.keys) - set(data.keys):
        raise UsageError(f"--data {a.data}: holds the states {data.keys}, not {sorted(set(m.keys) - set(data.keys))}"
                         " (zoo.distill --layers)")  # fmt: skip
    n = len(data)
    steps = a.steps or -(-n // a.batch)
    keys = m.keys
    in_vocab = torch.zeros(V, dtype=torch.bool)
    in_vocab[torch.as_tensor(keep)] = True
    t2d_index = torch.full((V,), -1, dtype=torch.long)
    t2d_index[torch.as_tensor(keep)] = torch.arange(len(keep))
    torch.manual_seed(a.seed)

    def loss_at(step):
        tot, acc = 0.0, {}
        for i in DT.batch_order(n, a.seed, step, a.batch):
            ids, npr, f = data.sequence(i, keys, a.max_len)
            l_, parts = ttt_loss(m, torch.from_numpy(f.reshape(len(ids), -1)), torch.from_numpy(ids), npr,
                                 in_vocab, t2d_index, a.ttt)  # fmt: skip
            tot = tot + l_ / a.batch
            for k_, v in parts.items():
                acc[k_] = acc.get(k_, 0.0) + v / a.batch
        return tot, acc

    meta = {"data_sha256": data.sha256(), "vocab": a.vocab, "steps": steps, "batch": a.batch, "ttt": a.ttt,
            "max_len": a.max_len, "lr": a.lr, "seed": a.seed}  # fmt: skip
    ckpt = out.parent / f"{out.name}.checkpoint.safetensors"  # beside: the harness reads every file inside
    res = {"steps": steps, "wall_s": 0.0, "resumed_at": steps}
    if a.stage in ("all", "train"):
        res = DT.fit(m, loss_at, steps, a.lr, ckpt, meta, "eagle3")
    else:
        DT.load_checkpoint(ckpt, m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad]), meta)
    save(m, out, keep, V)
    if a.stage == "train":
        return 0
    kernels.apply_kernels(target, "mkldnn")
    variants = {}
    for s in sizes:
        d = out.parent / f"{out.name}-vocab" / str(s or V)
        variants[s or V] = (d, variant(m, target, d, out, keep, counts, s))
    specs = [f"v{s}=eagle3:path={d}" for s, (d, _) in variants.items()]
    acc = DT.heldout(specs, target, tok, path, out.parent / "heldout-greedy", a.k, a.heldout_prompts)
    t_verify = verify_ms(target, a.k + 1)
    rows = {}
    for s_, (d, cov) in variants.items():
        r = acc[f"v{s_}"]
        step_ms = draft_ms(d, target, a.k)
        rows[s_] = {"coverage": round(cov, 4), "draft_step_ms": round(step_ms, 3), "acceptance": r["mean"],
                    "per_workload": r["per_workload"],
                    "tokens_per_ms": round((1 + r["mean"]) / (t_verify + a.k * step_ms), 5)}  # fmt: skip
    best = max(rows, key=lambda s_: rows[s_]["tokens_per_ms"])
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(variants[best][0] / f, out / f)
    info = {"kind": "eagle3", "target": {"path": DT.portable(path, a.models), "sha256": lm.weights_sha256(path)},
            "data": {"path": DT.portable(Path(a.data), a.models), "sha256": data.sha256(), "sequences": n,
                     "generated_tokens": data.card["generated_tokens"], "prompt_tokens": data.card["prompt_tokens"]},
            "trained_vocab": len(keep), "trained_vocab_coverage": round(cover, 4), "layer_ids": m.layer_ids,
            **meta, "train_wall_s": res["wall_s"], "resumed_at": res["resumed_at"], "last_step": res.get("last"),
            "threads": torch.get_num_threads(), "verify_ms": {str(a.k + 1): round(t_verify, 3)},
            "vocab_sizes": {str(s_): r for s_, r in rows.items()}, "chosen_vocab": best,
            "heldout_prompts": a.heldout_prompts, "heldout_acceptance": {f"draft vocabulary {s_}": acc[f"v{s_}"] for s_ in rows},
            "path": DT.portable(out, a.models),
            "command": DT.command("zoo.eagle3_train", list(sys.argv[1:] if argv is None else argv), a.models)}  # fmt: skip
    info["sha256"] = {"weights": lm.weights_sha256(out)}
    DT.write_card(out, info, f"EAGLE-3 head for {info['target']['path']} (draft vocabulary {best})", ABOUT, PUBLISHED)
    for s_, (d, _) in variants.items():
        DT.write_card(d, {**info, "chosen_vocab": s_, "path": DT.portable(d, a.models), "sha256": {"weights": lm.weights_sha256(d)}},
                      f"EAGLE-3 head, draft vocabulary {s_}", ABOUT, PUBLISHED)  # fmt: skip
    DT.log(f"eagle3: vocab {best} chosen; " + "; ".join(f"{s_}: acc {r['acceptance']} cover {r['coverage']} "
           f"step {r['draft_step_ms']} ms" for s_, r in rows.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
