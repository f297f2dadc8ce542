"""The students of the frozen target: the draft model, the Medusa heads and the EAGLE head, distilled together.

``python -m zoo.train students`` trains all three at once (``STUDENT_DEFAULTS``); ``draft``, ``medusa`` and
``eagle`` train one of them alone, to the same weights. Each is saved into ``zoo/<name>/`` with its card and
its held-out top-1 agreement with the target.
"""

from __future__ import annotations

import json
import os
import time

from . import DRAFT_DIR, EAGLE_DIR, MEDUSA_DIR, SCRATCH_DIR, TARGET_DIR
from .corpus_base import DEFAULT_SEED
from .data import SEQ, batches, get_tokenizer, get_torch, heldout_tokens, log, train_tokens
from .lm import load_lm, loss_table, lr_at, make_lm, save_lm, write_card

# The draft model, the Medusa heads and the EAGLE head all learn from the frozen target, so
# they share one target forward per batch (`python -m zoo.train students` trains all three
# at once; `draft`, `medusa`, `eagle` train one). Each student's initialisation and the data
# order depend only on the seeds, so the two ways give the same weights.
DRAFT_CFG = dict(
    hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)
# draft, medusa and eagle: one shared schedule and data order (see train_students)
STUDENT_DEFAULTS = dict(steps=500, batch=8, seed=DEFAULT_SEED + 10)

MEDUSA_KW = dict(num_heads=4, num_layers=2, share_lm_head=False)
EAGLE_KW = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=0)
EAGLE_W_CE = 0.3
DRAFT_KD = 0.7  # draft loss = (1 - DRAFT_KD) * CE(corpus) + DRAFT_KD * KL(target || draft)
MEDUSA_ROWS = 8  # Medusa rows per batch (its 4 vocab heads are costly; 2 rows left it below 0.5 on code)
STUDENT_LR = {"draft": 3e-3, "medusa": 2e-3, "eagle": 1e-3}
STUDENT_SEED = {"draft": DEFAULT_SEED + 1, "medusa": DEFAULT_SEED + 2, "eagle": DEFAULT_SEED + 3}
STUDENTS = ("draft", "medusa", "eagle")


def _frozen_target():
    target = load_lm(TARGET_DIR)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def _target_pass(target, x):
    """Frozen target on x: features (last hidden state, after the final norm), logits, and
    its greedy next-token labels (argmax at every position)."""
    torch = get_torch()
    with torch.no_grad():
        out = target(input_ids=x, output_hidden_states=True)
    return out.hidden_states[-1].detach(), out.logits.float(), out.logits.argmax(-1)


def medusa_loss(heads, feats, labels):
    """Head i (1-based) at position t learns the target's greedy token for t+1+i, i.e. the
    target's argmax at position t+i (self-distillation on the teacher-forced corpus)."""
    import torch.nn.functional as F

    torch = get_torch()
    logits = heads(feats)
    T = feats.shape[1]
    losses = [
        F.cross_entropy(logits[i - 1][:, : T - i].float().flatten(0, 1), labels[:, i:].flatten())
        for i in range(1, heads.cfg.num_heads + 1)
    ]
    return torch.stack(losses).mean(), logits


def eagle_loss(head, feats, x, labels, w_ce=EAGLE_W_CE):
    """EAGLE: regress the next feature (smooth L1) and match the target's greedy token from it."""
    import torch.nn.functional as F

    pred = head(feats[:, :-1], x[:, 1:])
    reg = F.smooth_l1_loss(pred[:, :-1].float(), feats[:, 1:-1].float())
    lg = head.logits(pred[:, :-1]).float()
    ce = F.cross_entropy(lg.flatten(0, 1), labels[:, 1:-1].flatten())
    return reg + w_ce * ce, lg


def draft_loss(draft, x, t_logits):
    import torch.nn.functional as F

    logits = draft(input_ids=x[:, :-1]).logits.float()
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    kd = (
        F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits, -1), log_target=True, reduction="batchmean")
        / logits.shape[1]
    )
    return (1 - DRAFT_KD) * ce + DRAFT_KD * kd, ce


def _make_student(name, target, tok):
    torch = get_torch()
    from harness.models.heads import EagleHead, MedusaHeads

    torch.manual_seed(STUDENT_SEED[name])
    if name == "draft":
        return make_lm(DRAFT_CFG, len(tok), tok, STUDENT_SEED[name])
    if name == "medusa":
        return MedusaHeads.from_target(target, **MEDUSA_KW)
    return EagleHead.from_target(target, **EAGLE_KW)


def train_students(names, steps: int, batch: int, seed: int):
    torch = get_torch()
    from tqdm import tqdm

    tok = get_tokenizer()
    target = _frozen_target()
    data = train_tokens()
    tag = "+".join(names)
    logf = SCRATCH_DIR / f"students_{tag}.log"
    ckpt = SCRATCH_DIR / f"students_{tag}_ckpt.pt"
    models = {n: _make_student(n, target, tok) for n in names}
    opts = {}
    for n, m in models.items():
        m.train()
        opts[n] = torch.optim.AdamW(
            [p for p in m.parameters() if p.requires_grad],
            lr=STUDENT_LR[n],
            betas=(0.9, 0.95),
            weight_decay=0.1 if n == "draft" else 0.0,
        )
    start, elapsed = 0, 0.0
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=True)  # tensors and plain containers only: no unpickling
        for n in names:
            models[n].load_state_dict(st["model"][n])
            opts[n].load_state_dict(st["opt"][n])
        start, elapsed = st["step"], st["elapsed"]
        log(f"students {tag}: resumed at step {start}", logf)
    nparams = {n: sum(p.numel() for p in m.parameters() if p.requires_grad) for n, m in models.items()}
    log(f"students {tag}: params {nparams}, {steps} steps x {batch} x {SEQ} tokens, data seed {seed}", logf)
    t0 = time.time() - elapsed
    ema = {}
    bar = tqdm(range(start, steps), desc=f"train {tag}", initial=start, total=steps, unit="step")
    for step in bar:
        x = torch.as_tensor(batches(data, batch, SEQ, seed, step))
        feats, t_logits, labels = _target_pass(target, x[:, :-1])
        xin = x[:, :-1]
        for n in names:
            for g in opts[n].param_groups:
                g["lr"] = lr_at(step, steps, STUDENT_LR[n], warmup=20)
            if n == "draft":
                loss, ce = draft_loss(models[n], x, t_logits)
                val = ce.item()
            elif n == "medusa":
                loss = medusa_loss(models[n], feats[:MEDUSA_ROWS], labels[:MEDUSA_ROWS])[0]
                val = loss.item()
            else:
                loss = eagle_loss(models[n], feats, xin, labels)[0]
                val = loss.item()
            opts[n].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[n].parameters(), 1.0)
            opts[n].step()
            ema[n] = val if n not in ema else 0.95 * ema[n] + 0.05 * val
        bar.set_postfix({n: f"{v:.3f}" for n, v in ema.items()})
        if (step + 1) % 10 == 0:
            log(
                f"students {tag}: step {step + 1}/{steps} "
                + " ".join(f"{n} {v:.4f}" for n, v in ema.items())
                + f" elapsed {time.time() - t0:.0f}s",
                logf,
            )
        if (step + 1) % 25 == 0 or step + 1 == steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {
                    "model": {n: m.state_dict() for n, m in models.items()},
                    "opt": {n: o.state_dict() for n, o in opts.items()},
                    "step": step + 1,
                    "elapsed": time.time() - t0,
                },
                tmp,
            )
            os.replace(tmp, ckpt)
    wall = time.time() - t0
    infos = {}
    for n, m in models.items():
        m.eval()
        infos[n] = {
            "params": nparams[n],
            "steps": steps,
            "batch": MEDUSA_ROWS if n == "medusa" else batch,
            "seq": SEQ,
            "tokens_seen": steps * (MEDUSA_ROWS if n == "medusa" else batch) * SEQ,
            "wall_s": round(wall, 1),
            "lr": STUDENT_LR[n],
            "seed": STUDENT_SEED[n],
            "data_seed": seed,
            "trained_with": list(names),
            "config": {"draft": DRAFT_CFG, "medusa": MEDUSA_KW, "eagle": {**EAGLE_KW, "w_ce": EAGLE_W_CE}}[n],
        }
        if n == "draft":
            infos[n]["kd_weight"] = DRAFT_KD
    return models, target, infos


def head_agreement(name, head, target) -> dict:
    """Teacher-forced top-1 agreement with the target's greedy token on held-out text, per
    domain: Medusa head i vs the target's argmax i steps later; EAGLE's first step; the
    draft model's next token."""
    torch = get_torch()
    held = heldout_tokens(max_tokens=SEQ + 1)
    res = {}
    with torch.no_grad():
        for d, ids in held.items():
            x = torch.as_tensor(ids[: SEQ + 1])[None]
            feats, _, labels = _target_pass(target, x)
            if name == "medusa":
                lg = head(feats)
                T = feats.shape[1]
                res[d] = [
                    round(float((lg[i - 1][:, : T - i].argmax(-1) == labels[:, i:]).float().mean()), 3)
                    for i in range(1, head.cfg.num_heads + 1)
                ]
            elif name == "eagle":
                _, lg = eagle_loss(head, feats, x, labels)
                res[d] = round(float((lg.argmax(-1) == labels[:, 1:-1]).float().mean()), 3)
            else:
                lg = head(input_ids=x).logits
                res[d] = round(float((lg.argmax(-1) == labels).float().mean()), 3)
    return res


def _stage_students(names, **kw):
    torch = get_torch()
    from harness.models.heads import EagleHead, MedusaHeads

    a = {**STUDENT_DEFAULTS, **{k: v for k, v in kw.items() if v is not None}}
    models, target, infos = train_students(list(names), a["steps"], a["batch"], a["seed"])
    tok = get_tokenizer()
    for n, m in models.items():
        info = infos[n]
        if n == "draft":
            save_lm(m, tok, DRAFT_DIR)
            m = load_lm(DRAFT_DIR)  # evaluate exactly what is shipped
            info["heldout"] = loss_table(m)
        else:
            out = MEDUSA_DIR if n == "medusa" else EAGLE_DIR
            m.to(torch.float16).save(out)
            m = (MedusaHeads if n == "medusa" else EagleHead).load(out, target)
        info["heldout_top1_agreement"] = head_agreement(n, m, target)
        write_card(n, info)
        log(f"{n} -> zoo/{n}: {json.dumps(info.get('heldout_top1_agreement'))}")


def stage_students(**kw):
    _stage_students(STUDENTS, **kw)


def stage_draft(**kw):
    _stage_students(["draft"], **kw)


def stage_medusa(**kw):
    _stage_students(["medusa"], **kw)


def stage_eagle(**kw):
    _stage_students(["eagle"], **kw)
