"""The data of ``python -m zoo.heads``: a target's own greedy outputs on training prompts, its features on them.

Prompts are workloads.py's (a JSONL file or named workloads), rendered and tokenized by
``workloads.PromptItem.token_ids`` exactly as the harness renders them (the tokenizer's chat template when it
has one). The held-out part is a second file, or the prompts whose stable hash (sha256 of workload and
prompt_id) falls below a fraction. The target's greedy output on every prompt is generated once by
``harness.models.target.Target.generate`` (the forwards the live loop makes) and cached in the output directory as
safetensors of token ids (``GreedyCache``), rewritten atomically every few prompts, so a killed or repeated
run resumes. The training features are then computed by teacher forcing (one forward per sequence,
``harness.models.lm.forward``): the target's last hidden state (``hidden_states[-1]``, lm_head's input, what both
Medusa and EAGLE heads read) and its greedy token (argmax) at every position, packed into one ``Stream``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import workloads
from bandit.logs.safeio import write_file
from harness.models import lm
from workloads import PromptItem, WorkloadError

CACHE_FORMAT = "specbandit-zoo-heads-greedy-v1"
SAVE_EVERY_S = 30.0  # the generation cache is rewritten at most this often (and at the end)


@dataclass
class Example:
    """One prompt and the target's greedy output after it."""

    workload: str
    prompt_id: str
    prompt: list[int]
    output: list[int]

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.prompt_id}"

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.output


def stable_fraction(workload: str, prompt_id: str) -> float:
    """A prompt's place in [0, 1) by sha256 of its workload and id: the same on every machine and run."""
    h = hashlib.sha256(f"{workload}\0{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def load_prompts(prompts: str | None, names: str | None, limit: int | None) -> list[PromptItem]:
    """The prompts of a JSONL file (a missing workload field is the file's stem) or of named workloads."""
    if bool(prompts) == bool(names):
        raise WorkloadError("give exactly one of --prompts FILE.jsonl or --workload NAME[,NAME...]")
    if prompts:
        items = _limit(workloads.load_workload_file(prompts, Path(prompts).stem), limit)
        if not items:
            raise WorkloadError(f"--prompts {prompts}: no prompts")
        return items
    return workloads.load(names=[n for n in names.split(",") if n], limit=limit)


def _limit(items: list[PromptItem], limit: int | None) -> list[PromptItem]:
    if limit is None:
        return items
    seen: dict[str, int] = {}
    out = []
    for p in items:
        seen[p.workload] = seen.get(p.workload, 0) + 1
        if seen[p.workload] <= limit:
            out.append(p)
    return out


def split_prompts(
    items: list[PromptItem], heldout_file: str | None, frac: float, limit: int | None
) -> tuple[list[PromptItem], list[PromptItem], str]:
    """(training prompts, held-out prompts, how they were split). With a file, its prompts are held out and any
    of them among the training prompts is dropped from training; else the prompts whose stable fraction is below
    `frac` (at least one when frac > 0: the lowest)."""
    if heldout_file:
        held = _limit(workloads.load_workload_file(heldout_file, Path(heldout_file).stem), limit)
        if not held:
            raise WorkloadError(f"--heldout {heldout_file}: no prompts")
        keys = {(p.workload, p.prompt_id) for p in held}
        train = [p for p in items if (p.workload, p.prompt_id) not in keys]
        how = f"held-out file {heldout_file} ({len(items) - len(train)} of its prompts dropped from training)"
    else:
        fr = [stable_fraction(p.workload, p.prompt_id) for p in items]
        held_ix = {i for i, f in enumerate(fr) if f < frac}
        if frac > 0 and not held_ix and len(items) > 1:
            held_ix = {int(np.argmin(fr))}
        held = [p for i, p in enumerate(items) if i in held_ix]
        train = [p for i, p in enumerate(items) if i not in held_ix]
        how = f"sha256(workload, prompt_id) fraction < {frac}"
    if not train:
        raise WorkloadError("no training prompts left after the held-out split")
    return train, held, how


def render(items: list[PromptItem], tok, max_positions: int | None, max_new: int) -> tuple[list, list[str]]:
    """[(item, prompt ids)] with the harness's rendering; prompts too long for the target are skipped (named), a
    prompt that renders to no token is refused."""
    out, skipped = [], []
    for p in items:
        ids = p.token_ids(tok)
        if not ids:
            raise WorkloadError(f"prompt {p.workload}/{p.prompt_id}: renders to no tokens (an empty prompt)")
        if max_positions and len(ids) + max_new > max_positions:
            skipped.append(f"{p.workload}/{p.prompt_id}")
            continue
        out.append((p, ids))
    return out, skipped


class GreedyCache:
    """The target's greedy outputs, by prompt key, in one safetensors file of token ids (atomic rewrites).

    Tensors: ``ids`` (int32, every entry's prompt then output, concatenated), ``n_prompt`` and ``n_output``
    (int64, one per entry); metadata: the format, the target's sha256, max_new_tokens and the entries' keys
    (JSON). The file name carries the target's sha256 and max_new_tokens, so other settings never mix."""

    def __init__(self, out: Path, target_sha: str, max_new: int, vocab: int | None = None):
        self.path = Path(out) / f"greedy-{target_sha[:16]}-n{max_new}.safetensors"
        self.meta = {"format": CACHE_FORMAT, "target_sha256": target_sha, "max_new_tokens": str(max_new)}
        self.vocab, self.max_new = vocab, max_new
        self.entries: dict[str, tuple[list[int], list[int]]] = {}
        if self.path.is_file() and not self.path.is_symlink():
            try:
                self.entries = self._read()
            except Exception as e:  # any unreadable cache (safetensors' own error too) is rebuilt
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"note: the greedy cache {self.path} was discarded ({why}); regenerated", file=sys.stderr)

    def _read(self) -> dict[str, tuple[list[int], list[int]]]:
        """The entries of a valid cache file; any problem (truncated, garbage, other settings) raises."""
        from safetensors import safe_open

        with safe_open(str(self.path), "np") as f:
            meta = f.metadata() or {}
            for k, v in self.meta.items():
                if meta.get(k) != v:
                    raise ValueError(f"metadata {k}={meta.get(k)!r}, expected {v!r}")
            ids, npr, nout = (f.get_tensor(n) for n in ("ids", "n_prompt", "n_output"))
        keys = json.loads(meta["keys"])
        if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys) and len(set(keys)) == len(keys)):
            raise ValueError("keys: not a list of distinct names")
        shapes = (ids.ndim, npr.ndim, nout.ndim, len(npr), len(nout))
        if shapes != (1, 1, 1, len(keys), len(keys)) or (npr < 1).any() or (nout < 0).any():
            raise ValueError("the entries' sizes do not match their keys")
        if (nout > self.max_new).any() or int(npr.sum()) + int(nout.sum()) != len(ids):
            raise ValueError(f"{len(ids)} token ids, the entries' sizes sum to {int(npr.sum()) + int(nout.sum())}")
        if len(ids) and (int(ids.min()) < 0 or (self.vocab is not None and int(ids.max()) >= self.vocab)):
            raise ValueError(f"a token id outside the target's vocabulary of {self.vocab}")
        entries, o = {}, 0
        for key, a, b in zip(keys, npr.tolist(), nout.tolist()):
            seq = ids[o : o + a + b].astype(np.int64).tolist()
            entries[key] = (seq[:a], seq[a:])
            o += a + b
        return entries

    def save(self) -> None:
        """Rewrite the file atomically, never through a symlink (bandit/logs/safeio.py)."""
        from safetensors.numpy import save

        if not self.entries:
            return
        keys = list(self.entries)
        flat = [t for k in keys for part in self.entries[k] for t in part]
        arrays = {
            "ids": np.asarray(flat, dtype=np.int32),
            "n_prompt": np.asarray([len(self.entries[k][0]) for k in keys], dtype=np.int64),
            "n_output": np.asarray([len(self.entries[k][1]) for k in keys], dtype=np.int64),
        }
        data = save(arrays, metadata={**self.meta, "keys": json.dumps(keys)})
        write_file(self.path, lambda f: f.write(data))

    def get(self, key: str, prompt: list[int]) -> list[int] | None:
        hit = self.entries.get(key)
        return hit[1] if hit is not None and hit[0] == prompt else None


def greedy_examples(target, tok, cache: GreedyCache, rendered: list, desc: str, log, threads: int = 1):
    """Every rendered prompt's greedy output (a list of Example): from the cache, else generated (and cached) on
    `threads` torch threads (one-token forwards gain little from threads and lose much on a shared CPU)."""
    import torch

    from harness.models.target import Target

    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _generate(Target(target, tok), cache, rendered, desc, log)
    finally:
        torch.set_num_threads(was)


def _generate(gen, cache: GreedyCache, rendered: list, desc: str, log) -> list[Example]:
    from tqdm import tqdm

    out, made, last = [], 0, time.time()
    bar = tqdm(rendered, desc=desc, unit="prompt", dynamic_ncols=True)
    for p, ids in bar:
        key = f"{p.workload}/{p.prompt_id}"
        y = cache.get(key, ids)
        if y is None:
            y, _, _ = gen.generate(ids, int(cache.meta["max_new_tokens"]), 0)  # greedy: the prompt key is unused
            y = [int(t) for t in y]
            cache.entries[key] = (list(ids), y)
            made += 1
            if time.time() - last > SAVE_EVERY_S:
                cache.save()
                last = time.time()
        out.append(Example(p.workload, p.prompt_id, list(ids), y))
    cache.save()
    log(f"{desc}: {len(out)} prompts ({made} generated, {len(out) - made} from {cache.path.name})")
    return out


def teacher_forced(target, ids: list[int]):
    """The target's last hidden state (L, H) and greedy token (L,) at every position of ids, one forward."""
    import torch

    logits, feats = lm.forward(target, torch.tensor(ids), lm.new_cache(), hidden=True, causal=True)
    return feats.float().clone(), logits.argmax(-1).clone()


@dataclass
class Stream:
    """The training sequences packed end to end: per position its token, target feature, target greedy token,
    sequence index, position within its sequence, and whether a loss is taken there."""

    ids: object  # (N,) int64
    feats: object  # (N, H) float32
    labels: object  # (N,) int64: the target's argmax at the position (its greedy next token)
    seg: object  # (N,) int64
    pos: object  # (N,) int64
    loss: object  # (N,) bool
    disagree: int  # output positions where the teacher-forced argmax is not the generated token

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def build_stream(target, examples: list[Example], prompt_loss: bool) -> Stream:
    """Teacher-forced features of every example, packed. Loss positions: every position with --prompt-loss,
    else t >= n_prompt - 2, the features the drafters read when they draft the output (harness.heads)."""
    import torch
    from tqdm import tqdm

    parts: dict[str, list] = {k: [] for k in ("ids", "feats", "labels", "seg", "pos", "loss")}
    disagree = 0
    for i, ex in enumerate(tqdm(examples, desc="features", unit="seq", dynamic_ncols=True)):
        ids = ex.ids
        f, lab = teacher_forced(target, ids)
        L, npr = len(ids), len(ex.prompt)
        t = torch.arange(L)
        parts["ids"].append(torch.tensor(ids, dtype=torch.long))
        parts["feats"].append(f)
        parts["labels"].append(lab)
        parts["seg"].append(torch.full((L,), i, dtype=torch.long))
        parts["pos"].append(t)
        parts["loss"].append(torch.ones(L, dtype=torch.bool) if prompt_loss else t >= npr - 2)
        disagree += int((lab[npr - 1 : L - 1] != parts["ids"][-1][npr:]).sum())
    cat = {k: torch.cat(v) for k, v in parts.items()}
    return Stream(**cat, disagree=disagree)


def window_batch(stream: Stream, batch: int, seq: int, seed: int, step: int):
    """Row start offsets (batch,) of windows of seq + 1 positions: a function of (seed, step) only. Each row is
    centred on a loss position drawn uniformly, placed at a uniform offset inside the window."""
    rng = np.random.default_rng([seed, step])
    n = len(stream)
    w = min(seq + 1, n)
    cand = np.flatnonzero(stream.loss.numpy())
    u = cand[rng.integers(0, len(cand), size=batch)]
    r = rng.integers(0, w, size=batch)
    return np.clip(u - r, 0, n - w), w
