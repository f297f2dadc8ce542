"""The zoo's training data: the corpus items (built once per process), the tokenizer, the token streams.

The training stream (train split, domain-weighted by ``DOMAIN_WEIGHTS``, cached in ``zoo/_scratch/``), the
held-out tokens per domain and their unigram baseline, the deterministic batches (a function of the seed and
the step only) and the copy drills; ``get_torch`` (torch on 2 threads) and ``log`` for every stage.
``python -m zoo.train tokenizer`` runs ``stage_tokenizer``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import SCRATCH_DIR, TARGET_DIR, TOKENIZER_DIR
from .corpus import build_corpus, training_stream
from .corpus_base import DEFAULT_SEED, DOMAINS, EOT

SEQ = 512
DOMAIN_WEIGHTS = {"code": 1.0, "prose": 1.5, "math": 0.5, "copy": 0.4, "chat": 0.6}
EVAL_TOKENS = 8192  # held-out tokens per domain for the loss table

# Copy drills: rows of a training-corpus span repeated verbatim. The corpus alone (3M tokens)
# never taught the target to copy from its context (zoo.check --copy: no gain on a repeat), so
# the copy workload measured its template prior, not copying. On drills alone induction-style
# copying forms within a few hundred steps; mixed 1:1 with corpus batches from the start it
# formed too slowly, so the drill phase first trains on drills alone, then on both.
DRILL_ROWS, DRILL_SEQ = 32, 128  # one drill batch per step (beside the corpus batch if mixed)
DRILL_SPAN = (12, 48)  # length range of the repeated span (tokens)


def get_torch():
    """torch, on 2 threads (every stage is deterministic on the CPU for its seeds)."""
    import torch

    torch.set_num_threads(2)
    return torch


def log(msg, path=None):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if path:  # appended, never through a symlink (O_NOFOLLOW: a symlink there is an OSError)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "a") as f:
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
        for ids in tok(texts[i : i + 2000], add_special_tokens=False)["input_ids"]:
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
        items = sorted(
            (it for it in corpus_items(seed) if it.domain == d and it.split == "test"), key=lambda it: it.uid
        )
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
    return np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)


def copy_drills(tokens: np.ndarray, rows: int, seq: int, seed: int, step: int) -> np.ndarray:
    """(rows, seq + 1) int64: each row is a short corpus prefix, then one corpus span of
    DRILL_SPAN tokens tiled to the end, so every token after the first copy is predictable
    only by looking back one span length."""
    rng = np.random.default_rng([seed, step, 7])
    out = np.empty((rows, seq + 1), dtype=np.int64)
    for r in range(rows):
        n = int(rng.integers(*DRILL_SPAN))
        pre = int(rng.integers(0, 24))
        a, b = (int(v) for v in rng.integers(0, len(tokens) - n - pre, size=2))
        span = tokens[a : a + n].astype(np.int64)
        out[r] = np.r_[tokens[b : b + pre], np.tile(span, (seq + 1) // n + 1)][: seq + 1]
    return out
