"""Retrain the zoo from scratch: ``python -m zoo.train all|data|tokenizer|target|draft|medusa|eagle|workloads|eval``.

Every stage is deterministic for its seed (CPU, ``torch.set_num_threads(2)``), shows a tqdm
progress bar, checkpoints to ``zoo/_scratch/`` (resumed after a kill) and writes its final
weights (safetensors, fp16) and model card into ``zoo/<name>/``. ``all`` runs, in order:
tokenizer, workloads, target, draft, medusa, eagle.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import (DRAFT_DIR, EAGLE_DIR, MEDUSA_DIR, SCRATCH_DIR, TARGET_DIR, TOKENIZER_DIR,
               WORKLOADS, WORKLOADS_DIR, ZOO_DIR)
from .corpus import DEFAULT_SEED, DOMAINS, EOT, build_corpus, source_info, training_stream

SEQ = 512
DOMAIN_WEIGHTS = {"code": 1.0, "prose": 1.5, "math": 0.5, "copy": 0.4, "chat": 0.6}
EVAL_TOKENS = 16384   # held-out tokens per domain for the loss table

TARGET_CFG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2)
DRAFT_CFG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)
STAGE_DEFAULTS = {
    "target": dict(steps=1100, batch=8, lr=2e-3, seed=DEFAULT_SEED),
    "draft": dict(steps=700, batch=8, lr=3e-3, seed=DEFAULT_SEED + 1),
    "medusa": dict(steps=300, batch=8, lr=1e-3, seed=DEFAULT_SEED + 2),
    "eagle": dict(steps=500, batch=8, lr=1e-3, seed=DEFAULT_SEED + 3),
}


def _torch():
    import torch
    torch.set_num_threads(2)
    return torch


def log(msg, path=None):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


# ----------------------------------------------------------------------------- data


_ITEMS = None


def corpus_items(seed=DEFAULT_SEED):
    global _ITEMS
    if _ITEMS is None:
        _ITEMS = build_corpus(seed)
    return _ITEMS


def stage_tokenizer(seed=DEFAULT_SEED):
    from .tokenizer import build_tokenizer
    log("training byte-level BPE tokenizer on the train split")
    build_tokenizer(corpus_items(seed), TOKENIZER_DIR)
    log(f"tokenizer -> {TOKENIZER_DIR}")


def get_tokenizer():
    """The zoo tokenizer: the freshly trained one in zoo/_scratch, else the shipped copy."""
    from .tokenizer import load_tokenizer
    for d in (TOKENIZER_DIR, TARGET_DIR):
        if (d / "tokenizer.json").exists():
            return load_tokenizer(d)
    stage_tokenizer()
    return load_tokenizer(TOKENIZER_DIR)


def train_tokens(seed=DEFAULT_SEED) -> np.ndarray:
    """The training token stream (train split, domain-weighted, shuffled), cached."""
    SCRATCH_DIR.mkdir(parents=True, exist_ok=True)
    cache = SCRATCH_DIR / f"train_tokens_{seed}.npy"
    if cache.exists():
        return np.load(cache)
    tok = get_tokenizer()
    texts = training_stream(corpus_items(seed), seed, DOMAIN_WEIGHTS)
    eot = tok.convert_tokens_to_ids(EOT)
    from tqdm import tqdm
    out = []
    for i in tqdm(range(0, len(texts), 2000), desc="tokenize", unit="kdoc"):
        for ids in tok(texts[i:i + 2000], add_special_tokens=False)["input_ids"]:
            out.extend(ids)
            out.append(eot)
    arr = np.asarray(out, dtype=np.uint16)
    np.save(cache, arr)
    return arr


def heldout_tokens(seed=DEFAULT_SEED, max_tokens=EVAL_TOKENS) -> dict[str, np.ndarray]:
    """Per domain: test-split items (in uid order) tokenized and joined by EOT, capped."""
    tok = get_tokenizer()
    eot = tok.convert_tokens_to_ids(EOT)
    out = {}
    for d in DOMAINS:
        items = sorted((it for it in corpus_items(seed) if it.domain == d and it.split == "test"),
                       key=lambda it: it.uid)
        ids = []
        for it in items:
            ids += tok(it.text, add_special_tokens=False)["input_ids"] + [eot]
            if len(ids) >= max_tokens:
                break
        out[d] = np.asarray(ids[:max_tokens], dtype=np.int64)
    return out


def unigram_baseline(train: np.ndarray, held: dict, vocab: int) -> dict:
    counts = np.bincount(train.astype(np.int64), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return {d: float(-logp[v].mean()) for d, v in held.items()}


def batches(tokens: np.ndarray, batch: int, seq: int, seed: int, step: int):
    """Deterministic random windows: batch for `step` depends only on (seed, step)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    return np.stack([tokens[s:s + seq + 1] for s in starts]).astype(np.int64)


def eval_loss(model, held: dict, seq=SEQ) -> dict:
    torch = _torch()
    import torch.nn.functional as F
    model.eval()
    res = {}
    with torch.no_grad():
        for d, ids in held.items():
            tot, n = 0.0, 0
            for s in range(0, len(ids) - 1, seq):
                x = torch.as_tensor(ids[s:s + seq + 1])[None]
                if x.shape[1] < 2:
                    continue
                logits = model(input_ids=x[:, :-1]).logits
                tot += F.cross_entropy(logits[0].float(), x[0, 1:], reduction="sum").item()
                n += x.shape[1] - 1
            res[d] = tot / max(n, 1)
    return res


# ----------------------------------------------------------------------------- LM training


def make_lm(cfg: dict, vocab: int, tok, seed: int):
    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    eot = tok.convert_tokens_to_ids(EOT)
    conf = LlamaConfig(vocab_size=vocab, max_position_embeddings=1024, tie_word_embeddings=True,
                       rope_theta=10000.0, rms_norm_eps=1e-5, bos_token_id=eot, eos_token_id=eot,
                       pad_token_id=eot, **cfg)
    return LlamaForCausalLM(conf)


def lr_at(step, steps, lr, warmup=50):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def train_lm(name: str, cfg: dict, steps: int, batch: int, lr: float, seed: int,
             teacher=None, kd_weight: float = 0.0, ckpt_every: int = 50):
    """Train a Llama LM on the token stream (optionally distilling from `teacher`)."""
    torch = _torch()
    import torch.nn.functional as F
    from tqdm import tqdm
    tok = get_tokenizer()
    vocab = len(tok)
    data = train_tokens()
    logf = SCRATCH_DIR / f"{name}.log"
    model = make_lm(cfg, vocab, tok, seed)
    nparam = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt = SCRATCH_DIR / f"{name}_ckpt.pt"
    start, elapsed = 0, 0.0
    if ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start, elapsed = st["step"], st["elapsed"]
        log(f"{name}: resumed at step {start}", logf)
    log(f"{name}: {nparam} params, {steps} steps x {batch} x {SEQ} tokens, lr {lr}, seed {seed}"
        + (f", KD from target (weight {kd_weight})" if teacher is not None else ""), logf)
    model.train()
    t0 = time.time() - elapsed
    bar = tqdm(range(start, steps), desc=f"train {name}", initial=start, total=steps, unit="step")
    ema = None
    for step in bar:
        x = torch.as_tensor(batches(data, batch, SEQ, seed, step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr)
        logits = model(input_ids=x[:, :-1]).logits.float()
        ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss = ce
        if teacher is not None:
            with torch.no_grad():
                tl = teacher(input_ids=x[:, :-1]).logits.float()
            kd = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(tl, -1), log_target=True,
                          reduction="batchmean") / logits.shape[1]
            loss = (1 - kd_weight) * ce + kd_weight * kd
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        bar.set_postfix(loss=f"{ema:.3f}")
        if (step + 1) % 25 == 0:
            log(f"{name}: step {step + 1}/{steps} ce {ema:.4f} lr {lr_at(step, steps, lr):.2e} "
                f"elapsed {time.time() - t0:.0f}s", logf)
        if (step + 1) % ckpt_every == 0 or step + 1 == steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                        "elapsed": time.time() - t0}, tmp)
            os.replace(tmp, ckpt)
    wall = time.time() - t0
    model.eval()
    return model, {"params": nparam, "steps": steps, "batch": batch, "seq": SEQ,
                   "tokens_seen": steps * batch * SEQ, "wall_s": round(wall, 1), "lr": lr,
                   "seed": seed}


def save_lm(model, tok, out: Path):
    torch = _torch()
    out.mkdir(parents=True, exist_ok=True)
    m = model.to(torch.float16)
    m.generation_config.do_sample = False
    m.generation_config.eos_token_id = [tok.convert_tokens_to_ids(EOT),
                                        tok.convert_tokens_to_ids("<|end|>")]
    m.generation_config.pad_token_id = tok.convert_tokens_to_ids(EOT)
    m.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # weights are stored in fp16; compute in float32 unless the loader asks otherwise
    cfgp = out / "config.json"
    c = json.loads(cfgp.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in c:
            c[key] = "float32"
    cfgp.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    return model.to(torch.float32)


def load_lm(path: Path):
    torch = _torch()
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                dtype=torch.float32).eval()


def loss_table(model) -> dict:
    held = heldout_tokens()
    tok = get_tokenizer()
    uni = unigram_baseline(train_tokens(), held, len(tok))
    ev = eval_loss(model, held)
    return {d: {"loss": round(ev[d], 4), "unigram": round(uni[d], 4),
                "tokens": int(len(held[d]))} for d in held}


def stage_target(**kw):
    a = {**STAGE_DEFAULTS["target"], **{k: v for k, v in kw.items() if v is not None}}
    model, info = train_lm("target", TARGET_CFG, a["steps"], a["batch"], a["lr"], a["seed"])
    tok = get_tokenizer()
    model = save_lm(model, tok, TARGET_DIR)
    model = load_lm(TARGET_DIR)   # evaluate exactly what is shipped (fp16 weights)
    info["heldout"] = loss_table(model)
    info["config"] = TARGET_CFG
    write_card("target", info)
    log(f"target -> {TARGET_DIR}: {json.dumps(info['heldout'])}")


def stage_draft(**kw):
    a = {**STAGE_DEFAULTS["draft"], **{k: v for k, v in kw.items() if v is not None}}
    teacher = load_lm(TARGET_DIR)
    for p in teacher.parameters():
        p.requires_grad_(False)
    model, info = train_lm("draft", DRAFT_CFG, a["steps"], a["batch"], a["lr"], a["seed"],
                           teacher=teacher, kd_weight=0.7)
    tok = get_tokenizer()
    model = save_lm(model, tok, DRAFT_DIR)
    model = load_lm(DRAFT_DIR)
    info["heldout"] = loss_table(model)
    info["config"] = DRAFT_CFG
    write_card("draft", info)
    log(f"draft -> {DRAFT_DIR}: {json.dumps(info['heldout'])}")


# ----------------------------------------------------------------------------- workloads

N_PROMPTS = 300


def _order(uid: str) -> str:
    import hashlib
    return hashlib.sha256(("workload:" + uid).encode()).hexdigest()


def workload_records(seed=DEFAULT_SEED, n=N_PROMPTS) -> dict[str, list[dict]]:
    """The CPU workloads, from held-out (test split) items only, in a stable hashed order."""
    items = [it for it in corpus_items(seed) if it.split == "test"]
    out = {w: [] for w in WORKLOADS}
    # code: the opening lines of a held-out stdlib chunk, to be continued
    code = sorted((it for it in items if it.domain == "code"), key=lambda it: _order(it.uid))
    for frac in (0.35, 0.65):
        for it in code:
            lines = it.text.splitlines(keepends=True)
            if len(lines) < 12:
                continue
            cut = max(4, int(len(lines) * frac))
            out["code"].append({"workload": "code", "prompt_id": f"{it.uid}@{cut}",
                                "prompt": "".join(lines[:cut])})
    for it in sorted((it for it in items if it.domain == "math"), key=lambda it: _order(it.uid)):
        out["math"].append({"workload": "math", "prompt_id": it.uid, "prompt": it.prompt})
    for it in sorted((it for it in items if it.domain == "chat"), key=lambda it: _order(it.uid)):
        out["chat"].append({"workload": "chat", "prompt_id": it.uid,
                            "messages": [{"role": r, "content": c} for r, c in it.messages]})
    for it in sorted((it for it in items if it.domain == "copy"), key=lambda it: _order(it.uid)):
        out["copy"].append({"workload": "copy", "prompt_id": it.uid, "prompt": it.prompt})
    for w in out:
        seen, recs = set(), []
        for r in out[w]:
            if r["prompt_id"] not in seen:
                seen.add(r["prompt_id"])
                recs.append(r)
        out[w] = recs[:n]
    return out


def stage_workloads(seed=DEFAULT_SEED):
    WORKLOADS_DIR.mkdir(parents=True, exist_ok=True)
    for w, recs in workload_records(seed).items():
        p = WORKLOADS_DIR / f"{w}.jsonl"
        p.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in recs))
        log(f"workload {w}: {len(recs)} prompts -> {p}")


# ----------------------------------------------------------------------------- cards


def write_card(name: str, info: dict):
    out = ZOO_DIR / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "training_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    from .cards import render_card
    (out / "README.md").write_text(render_card(name, info, source_info()))


# ----------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m zoo.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["all", "tokenizer", "workloads", "target", "draft",
                                      "medusa", "eagle"])
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--fresh", action="store_true", help="ignore checkpoints in zoo/_scratch")
    args = ap.parse_args(argv)
    _torch()
    kw = dict(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed)
    stages = (["tokenizer", "workloads", "target", "draft", "medusa", "eagle"]
              if args.stage == "all" else [args.stage])
    for st in stages:
        if args.fresh and st in STAGE_DEFAULTS:
            (SCRATCH_DIR / f"{st}_ckpt.pt").unlink(missing_ok=True)
        t = time.time()
        log(f"=== stage {st}")
        globals()[f"stage_{st}"](**(kw if st in STAGE_DEFAULTS else {}))
        log(f"=== stage {st} done in {time.time() - t:.0f}s")


if __name__ == "__main__":
    main()
