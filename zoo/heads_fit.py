"""Training of ``python -m zoo.heads``: Medusa-1 heads and an EAGLE head on a target's own features.

The heads are harness.models.heads' ``MedusaHeads`` and ``EagleHead`` (the classes and on-disk formats the harness's
``medusa`` and ``eagle`` drafters load), sized from the target: hidden size and vocabulary from its lm_head,
EAGLE's attention heads, key/value heads, MLP width, RoPE base and norm epsilon from its config. The losses are
those of zoo/students.py (``medusa_loss``, ``eagle_loss``), restricted to the packed stream's loss positions
and never across two sequences:

  * Medusa head i (1-based) at position t: cross entropy against the target's greedy token at t + i (its
    argmax there, i.e. the token for t + 1 + i), where t is a loss position and t + i is in t's sequence;
    the mean over heads of each head's mean.
  * EAGLE on the pairs (feature t, token t + 1), attending causally within its own sequence (RoPE at t's
    position in it): smooth L1 of the predicted feature against feature t + 1, plus ``EAGLE_W_CE`` x cross
    entropy of lm_head(predicted feature) against the target's greedy token at t + 1, over loss positions t
    whose t + 1 is in the same sequence.

Deterministic for a seed: the heads' initialisation (``torch.manual_seed``) and the windows (a function of the
seed and the step, heads_data.window_batch) depend on nothing else; AdamW, warmup then cosine (zoo.lm.lr_at),
gradients clipped at 1, on torch's CPU threads as zoo.data.get_torch sets them.
"""

from __future__ import annotations

import time

from harness.models.heads import EagleHead, MedusaHeads
from harness.models.head_formats import target_dims

from .data import get_torch
from .heads_data import Stream, window_batch
from .lm import lr_at
from .students import EAGLE_W_CE, MEDUSA_KW, STUDENT_LR

HEADS = ("medusa", "eagle")
LR = {"medusa": STUDENT_LR["medusa"], "eagle": STUDENT_LR["eagle"]}
SEED_OFFSET = {"medusa": 0, "eagle": 1}  # torch.manual_seed(seed + offset) before each head is made
MEDUSA_DEFAULTS = dict(num_heads=MEDUSA_KW["num_heads"], num_layers=MEDUSA_KW["num_layers"], share_lm_head=False)


def eagle_config(target) -> dict:
    """EagleConfig fields from the target's config (attention heads dividing the hidden size, else 1)."""
    c = target.config
    hidden, _ = target_dims(target)
    nh = int(getattr(c, "num_attention_heads", 0) or 0)
    nh = nh if nh and hidden % nh == 0 else 1
    nkv = int(getattr(c, "num_key_value_heads", 0) or nh)
    nkv = nkv if nh % nkv == 0 else nh
    rope = getattr(c, "rope_theta", None)
    params = getattr(c, "rope_parameters", None)
    if rope is None and isinstance(params, dict):
        rope = params.get("rope_theta")
    return dict(
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        intermediate_size=int(getattr(c, "intermediate_size", 0) or 0),
        rope_theta=float(rope or 10000.0),
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6) or 1e-6),
    )


def make_heads(target, names, seed: int, medusa_kw: dict) -> dict:
    """The untrained heads, each made right after torch.manual_seed(seed + its offset)."""
    torch = get_torch()
    out = {}
    for n in names:
        torch.manual_seed(seed + SEED_OFFSET[n])
        if n == "medusa":
            out[n] = MedusaHeads.from_target(target, **medusa_kw)
        else:
            out[n] = EagleHead.from_target(target, **eagle_config(target))
    return out


def medusa_masked_loss(heads, feats, labels, seg, loss):
    """Medusa loss on rows (B, W) of a window: feats (B, W, H), labels/seg (B, W), loss (B, W) bool."""
    import torch.nn.functional as F

    torch = get_torch()
    W = feats.shape[1]
    rows = loss.clone()
    rows[:, W - 1] = False  # no head has a target past the window
    logits = heads(feats[rows])  # (heads, M, V)
    b, t = rows.nonzero(as_tuple=True)
    losses = []
    for i in range(1, heads.cfg.num_heads + 1):
        ti = (t + i).clamp(max=W - 1)
        ok = (t + i < W) & (seg[b, ti] == seg[b, t])
        if bool(ok.any()):
            losses.append(F.cross_entropy(logits[i - 1][ok].float(), labels[b[ok], ti[ok]]))
    return torch.stack(losses).mean() if losses else feats.new_zeros(()).requires_grad_()


def eagle_masked_loss(head, feats, ids, labels, seg, pos, loss, w_ce: float = EAGLE_W_CE):
    """EAGLE loss on rows (B, W): pairs (feats[:, t], ids[:, t + 1]) for t < W - 1, causal within a sequence."""
    import torch.nn.functional as F

    torch = get_torch()
    s = seg[:, :-1]
    causal = torch.ones(s.shape[1], s.shape[1], dtype=torch.bool).tril()
    mask = (causal[None] & (s[:, :, None] == s[:, None, :]))[:, None]  # (B, 1, Q, Q)
    pred = head.step(feats[:, :-1], ids[:, 1:], pos[:, :-1], None, mask)[0]
    ok = loss[:, :-1] & (seg[:, 1:] == s)
    if not bool(ok.any()):
        return pred.sum() * 0.0
    reg = F.smooth_l1_loss(pred[ok].float(), feats[:, 1:][ok].float())
    ce = F.cross_entropy(head.logits(pred[ok]).float(), labels[:, 1:][ok])
    return reg + w_ce * ce


def fit(models: dict, stream: Stream, steps: int, batch: int, seq: int, seed: int, log) -> dict:
    """Train the heads together on one shared window batch per step. Returns per head its training facts."""
    torch = get_torch()
    from tqdm import tqdm

    opts = {}
    for n, m in models.items():
        m.train()
        opts[n] = torch.optim.AdamW(
            [p for p in m.parameters() if p.requires_grad], lr=LR[n], betas=(0.9, 0.95), weight_decay=0.0
        )
    warmup = max(1, min(20, steps // 10))
    ema: dict[str, float] = {}
    every = max(1, steps // 20)
    t0 = time.time()
    bar = tqdm(range(steps), desc="train " + "+".join(models), unit="step", dynamic_ncols=True)
    for step in bar:
        starts, w = window_batch(stream, batch, seq, seed, step)
        idx = torch.as_tensor(starts)[:, None] + torch.arange(w)[None]
        f, x, lab, sg, ps, ls = (getattr(stream, k)[idx] for k in ("feats", "ids", "labels", "seg", "pos", "loss"))
        for n, m in models.items():
            for g in opts[n].param_groups:
                g["lr"] = lr_at(step, steps, LR[n], warmup=warmup)
            if n == "medusa":
                loss = medusa_masked_loss(m, f, lab, sg, ls)
            else:
                loss = eagle_masked_loss(m, f, x, lab, sg, ps, ls)
            opts[n].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opts[n].step()
            v = float(loss.item())
            ema[n] = v if n not in ema else 0.95 * ema[n] + 0.05 * v
        bar.set_postfix({n: f"{v:.3f}" for n, v in ema.items()})
        if (step + 1) % every == 0 or step + 1 == steps:
            el = time.time() - t0
            eta = el / (step + 1) * (steps - step - 1)
            log(
                f"step {step + 1}/{steps} "
                + " ".join(f"{n} {v:.4f}" for n, v in ema.items())
                + f" elapsed {el:.0f}s eta {eta:.0f}s"
            )
    wall = time.time() - t0
    out = {}
    for n, m in models.items():
        m.eval()
        out[n] = {
            "params": sum(p.numel() for p in m.parameters() if p.requires_grad),
            "steps": steps,
            "batch": batch,
            "window": seq,
            "lr": LR[n],
            "warmup": warmup,
            "final_loss_ema": round(ema[n], 4),
            "train_wall_s": round(wall, 1),
            "trained_with": list(models),
        }
        if n == "eagle":
            out[n]["w_ce"] = EAGLE_W_CE
    return out
