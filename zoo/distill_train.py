"""What the drafters trained on the self-distillation data share: the data reader, a resumable training loop,
the draft vocabulary, the held-out acceptance on the campaign's own prompts, and the card.

* ``Distilled``: the chunks of zoo/distill.py, read lazily (memory-mapped safetensors): sequence i is its token
  ids, its prompt length and the target's states at the stored keys (float16 on disk).
* ``fit``: AdamW, warmup then cosine (zoo.lm.lr_at), gradients clipped at 1; the batch of step s is a function of
  (seed, s) alone, so a run killed and resumed from its checkpoint (model and optimiser state in one safetensors
  file, rewritten atomically every CKPT_EVERY_S) makes the same steps as one that never stopped.
* ``draft_vocab``: the most frequent target tokens of the generated text (VocabTrim, arXiv 2506.22694; FR-Spec,
  arXiv 2502.14856), as EAGLE-3's d2t (draft id -> target id offset) and t2d (target id -> in the vocabulary).
* ``heldout``: the mean accepted length at k through the harness's own drafter (zoo/heads_eval.py's definition)
  on the first prompts of each campaign workload's ``campaign`` part: prompts the data never contains.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from bandit.logs.errors import UsageError
from bandit.logs.safeio import write_file, write_text

from .distill import FORMAT, chunk_path, read_chunk_meta
from .lm import lr_at

CKPT_EVERY_S = 120.0  # the training checkpoint is rewritten at most this often (and at the end)
HELDOUT_PROMPTS = 8  # campaign-part prompts per workload for the held-out acceptance
WORKLOADS = ("humaneval-chat", "stdlib-edit", "chat-open", "math-word")


def portable(path: Path, models: str | None = None) -> str:
    """A path as the cards write it: under the models root as $SPECBANDIT_MODELS/..., else as given."""
    from harness.models import lm

    from .heads import portable as portable_text

    return portable_text(str(Path(path).resolve()), lm.models_root(models))


def command(module: str, argv: list[str], models: str | None) -> str:
    """The command a card records: every path option's value absolute, then written relative to the models root
    ($SPECBANDIT_MODELS) or the repository (zoo.heads.portable), so it names no machine's path."""
    import shlex

    from harness.models import lm

    from .heads import portable as portable_text

    paths = ("--models", "--out", "--data", "--target")
    out = [str(Path(x).resolve()) if i and argv[i - 1] in paths and Path(x).exists() else x for i, x in enumerate(argv)]
    return portable_text(f"python -m {module} " + shlex.join(out), lm.models_root(models))


def setup(a):
    """What every trainer starts with: --threads applied, --out checked, the target (frozen) and its tokenizer
    loaded, the data opened. Returns (out, target path, target, tokenizer, data)."""
    import os

    import torch

    from bandit.logs import limits
    from harness.models import lm

    limits.threads("--threads", a.threads)
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    out = limits.out_dir("--out", a.out)
    path = lm.resolve_model_dir(a.target, a.models, "--target")
    target, tok = lm.load_lm(path), lm.load_tokenizer(path)
    for p in target.parameters():
        p.requires_grad_(False)
    return out, path, target, tok, Distilled(Path(a.data))


def cli(prog: str, parser, body, argv) -> int:
    """Parse, run body(args, argv), and turn a problem in the input into one line and its exit code."""
    from bandit.logs.errors import HANDLED, exit_code, message

    try:
        return body(parser().parse_args(argv), argv)
    except HANDLED as e:
        print(f"{prog}: {message(e)}", file=sys.stderr)
        return exit_code(e)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Distilled:
    """The dataset of zoo/distill.py at `root` (its card must exist: the data is complete)."""

    def __init__(self, root: Path):
        from safetensors import safe_open

        self.root = Path(root)
        card = self.root / "card.json"
        if not card.is_file():
            raise UsageError(f"{self.root}: no card.json; finish the data first (python -m zoo.distill)")
        self.card = json.loads(card.read_text())
        if self.card.get("format") != FORMAT:
            raise UsageError(f"{card}: format {self.card.get('format')!r}, expected {FORMAT}")
        self.keys: list[str] = list(self.card["feature_keys"])
        self.files, self.index = [], []  # (file, lo, hi, n_prompt) per sequence
        c = 0
        while chunk_path(self.root, c).is_file():
            p = chunk_path(self.root, c)
            if read_chunk_meta(p) is None:
                raise UsageError(f"{p}: unreadable chunk")
            f = safe_open(str(p), "np")
            offs, npr = f.get_tensor("offsets"), f.get_tensor("n_prompt")
            self.files.append(f)
            self.index += [(c, int(offs[r]), int(offs[r + 1]), int(npr[r])) for r in range(len(npr))]
            c += 1
        if not self.index:
            raise UsageError(f"{self.root}: no sequences")

    def __len__(self) -> int:
        return len(self.index)

    def sequence(self, i: int, keys: list[str], max_len: int) -> tuple[np.ndarray, int, np.ndarray]:
        """(ids (N,), n_prompt, feats (N, len(keys), H) float32), the last max_len positions of sequence i."""
        c, lo, hi, npr = self.index[i]
        cut = max(0, (hi - lo) - max_len)
        f = self.files[c]
        ids = f.get_slice("ids")[lo + cut : hi].astype(np.int64)
        feats = f.get_slice("features")[lo + cut : hi]
        cols = [self.keys.index(k) for k in keys]
        return ids, max(0, npr - cut), feats[:, cols].astype(np.float32)

    def token_counts(self, vocab: int) -> np.ndarray:
        """How often each token is generated (outputs only: what a draft must predict)."""
        n = np.zeros(vocab, np.int64)
        for c, lo, hi, npr in self.index:
            np.add.at(n, self.files[c].get_slice("ids")[lo + npr : hi].astype(np.int64), 1)
        return n

    def sha256(self) -> str:
        """One hash of the data: the sha256 of the card's sorted file hashes."""
        return hashlib.sha256(json.dumps(self.card["files"], sort_keys=True).encode()).hexdigest()


def draft_vocab(counts: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """(the `size` most frequent target ids, ascending; their share of the generated tokens). Ties go to the
    lower id (a stable order)."""
    order = np.lexsort((np.arange(len(counts)), -counts))[:size]
    keep = np.sort(order)
    return keep, float(counts[keep].sum() / max(1, counts.sum()))


# ------------------------------------------------------------------------------------------ the loop


def _state(model, opt) -> dict:
    import torch

    out = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                out[f"adam.m.{names[id(p)]}"] = st["exp_avg"].contiguous()
                out[f"adam.v.{names[id(p)]}"] = st["exp_avg_sq"].contiguous()
                out[f"adam.step.{names[id(p)]}"] = torch.as_tensor(st["step"], dtype=torch.float64).reshape(1)
    return out


def save_checkpoint(path: Path, model, opt, step: int, meta: dict) -> None:
    from safetensors.torch import save

    blob = save(_state(model, opt), {"step": str(step), **{k: str(v) for k, v in meta.items()}})
    write_file(path, lambda f: f.write(blob))


def load_checkpoint(path: Path, model, opt, meta: dict) -> int:
    """The step a checkpoint at `path` reached (0 without one); refused when it was made with other settings."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return 0
    with safe_open(str(path), "pt") as f:
        got = f.metadata()
    want = {k: str(v) for k, v in meta.items()}
    diff = [k for k in want if got.get(k) != want[k]]
    if diff:
        raise UsageError(f"{path}: a checkpoint of other settings ({', '.join(diff)}); remove it or use those settings")
    t = load_file(str(path))
    model.load_state_dict({k[6:]: v for k, v in t.items() if k.startswith("model.")})
    params = dict(model.named_parameters())
    for n, p in params.items():
        if f"adam.m.{n}" in t:
            opt.state[p] = {"exp_avg": t[f"adam.m.{n}"], "exp_avg_sq": t[f"adam.v.{n}"],
                            "step": torch.tensor(float(t[f"adam.step.{n}"][0]))}  # fmt: skip
    return int(got["step"])


def fit(model, loss_at, steps: int, lr: float, ckpt: Path, meta: dict, desc: str) -> dict:
    """Train `model` (its trainable parameters) for `steps` steps of `loss_at(step) -> (loss, parts dict)`,
    resuming from `ckpt`; returns {"steps", "wall_s" (this process), "resumed_at", "last": parts}."""
    import torch
    from tqdm import tqdm

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    start = load_checkpoint(ckpt, model, opt, meta)
    if start:
        log(f"{desc}: resuming at step {start} of {steps} from {ckpt}")
    warmup = max(1, min(100, steps // 20))
    t0 = last = time.time()
    parts: dict = {}
    bar = tqdm(total=steps, initial=start, desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr)
    model.train()
    for step in range(start, steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=warmup)
        loss, parts = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix({k: f"{v:.3f}" for k, v in parts.items()}, refresh=False)
        if time.time() - last > CKPT_EVERY_S or step + 1 == steps:
            save_checkpoint(ckpt, model, opt, step + 1, meta)
            last = time.time()
    bar.close()
    model.eval()
    return {"steps": steps, "wall_s": round(time.time() - t0, 1), "resumed_at": start, "last": parts}


def batch_order(n: int, seed: int, step: int, batch: int) -> list[int]:
    """The sequences of step `step`: epochs of seeded permutations, read in order (a function of seed and step)."""
    return [int(_epoch(n, seed, j // n)[j % n]) for j in range(step * batch, (step + 1) * batch)]


@functools.lru_cache(maxsize=2)
def _epoch(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


# ------------------------------------------------------------------------------------------ evaluation


def heldout(specs: list[str], target, tok, target_path: Path, cache_dir: Path, k: int, prompts: int) -> dict:
    """{spec name: heads_eval's acceptance record} on the first `prompts` campaign-part prompts per workload."""
    import workloads

    from .heads_data import GreedyCache, greedy_examples, render
    from .heads_eval import drafters_for, heldout_acceptance
    from harness.models import lm

    items = [p for w in WORKLOADS for p in workloads.load_named(f"{w}:campaign")[:prompts]]
    rendered, _ = render(items, tok, None, 128)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache = GreedyCache(cache_dir, lm.weights_sha256(target_path), 128)
    examples = greedy_examples(target, tok, cache, rendered, "held-out greedy outputs", log, threads=1)
    return heldout_acceptance(drafters_for(specs, target, tok, target_path), target, examples, k)


def write_card(d: Path, info: dict, title: str, about: str, published: str, json_file: Path | None = None,
               md_file: Path | None = None) -> None:  # fmt: skip
    """training_info.json and README.md in the drafter's directory (or at json_file and md_file: a run's copy,
    zoo/runcard.py, which renders it again from the json's own `card` texts)."""
    info = {**info, "card": {"title": title, "about": about, "published": published}}
    write_text(json_file or d / "training_info.json", json.dumps(info, indent=2, sort_keys=True) + "\n")
    acc = info["heldout_acceptance"]
    lines = [f"# {title}", "", about, "", "## Training", ""]
    lines += [
        f"- {k}: `{json.dumps(v, sort_keys=True)}`"
        for k, v in sorted(info.items())
        if k not in ("heldout_acceptance", "card", "vocab_sizes")
    ]
    if info.get("vocab_sizes"):
        lines += ["", "## Draft vocabulary [MEASURED]", "", "| size | coverage of generated tokens | held-out acceptance "
                  "| draft step ms | (1 + acceptance) / (verify + k steps), per ms |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {n} | {r['coverage']:.4f} | {r['acceptance']:.3f} | {r['draft_step_ms']:.2f} | {r['tokens_per_ms']:.5f} |"
                  for n, r in info["vocab_sizes"].items()]  # fmt: skip
        lines += ["", f"Chosen: {info['chosen_vocab']} (verify of k+1 tokens: {info['verify_ms']} ms; "
                  f"{info['threads']} threads; one run on one host)."]  # fmt: skip
    lines += ["", "## Held-out acceptance [MEASURED]", ""]
    lines += [f"Mean accepted length (zoo/heads_eval.py's definition) on the first {info['heldout_prompts']} "
              "campaign-part prompts of each workload (never in the training data):", ""]  # fmt: skip
    for name, r in acc.items():
        lines += [f"### {name} (k = {r['k']})", "", "| workload | mean accepted length |", "|---|---|"]
        lines += [f"| {w} | {v:.3f} |" for w, v in r["per_workload"].items()]
        lines += [f"| pooled ({r['prompts']} prompts, {r['positions']} positions) | {r['mean']:.3f} |", ""]
    lines += ["## For scale", "", published, ""]
    write_text(md_file or d / "README.md", "\n".join(lines))


def summary(info: dict, k: int) -> tuple[str, float | None, int | None]:
    """(what the drafter is, its held-out mean accepted length at k, prompts) from a card of these trainers."""
    if info["kind"] == "eagle3":
        best = info["heldout_acceptance"].get(f"draft vocabulary {info['chosen_vocab']}", {})
        return f"draft vocabulary {info['chosen_vocab']}", best.get("mean"), best.get("prompts")
    r = next((v for n, v in info["heldout_acceptance"].items() if n == f"k = {k}" or n.startswith(f"k = {k} ")), {})
    what = f"blocks {info.get('blocks')}" if info["kind"] == "dflash" else f"draft vocabulary {info.get('draft_vocab')}"
    return what, r.get("mean"), r.get("prompts")
