"""Medusa-1 heads and an EAGLE head for any local target, trained on CPU on the target's own greedy outputs.

    python -m zoo.heads --target DIR --out DIR [--prompts FILE.jsonl | --workload NAME[,NAME]] [--heldout FILE |
        --heldout-frac F] [--limit N] [--max-new-tokens N] [--steps N] [--batch B] [--window W]
        [--heads medusa,eagle] [--seed S] [--k K] [--compare NAME=KIND:path=DIR ...]

1. Data (zoo/heads_data.py): the prompts rendered as the harness renders them; the target's greedy output on
   each, generated once and cached in DIR (a rerun resumes); its features by teacher forcing.
2. Training (zoo/heads_fit.py): the heads, sized from the target, on the packed features, deterministic for
   --seed, with a progress bar and an ETA; saved as DIR/medusa and DIR/eagle in the formats the harness's
   ``medusa`` and ``eagle`` drafters load (``--drafter m=medusa:path=DIR/medusa``).
3. Held-out acceptance (zoo/heads_eval.py): the mean accepted length at k on the held-out prompts, through the
   harness's own drafters built from the saved directories (and of every --compare drafter on the same
   positions); DIR/heldout.json holds them all.
4. A card per head directory: README.md and training_info.json (kind, settings, sha256 of the weights and of
   the target, times, data sizes, steps, seed, held-out acceptance and its definition).

Only local directories are read (safetensors, no remote code); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

from bandit.logs import limits
from bandit.logs.errors import HANDLED, InputError, UsageError, exit_code, message
from bandit.logs.safeio import write_text
from harness.models import lm
from harness.models.gguf import file_sha256

from . import heads_check
from .data import get_torch, log
from .heads_data import GreedyCache, build_stream, greedy_examples, load_prompts, render, split_prompts
from .heads_eval import drafters_for, heldout_acceptance, write_card
from .heads_fit import HEADS, MEDUSA_DEFAULTS, fit, make_heads

R = heads_check.range_help
DEFAULTS = dict(max_new_tokens=128, steps=300, batch=8, window=256, seed=0, k=4, heldout_frac=0.1)


def parser() -> argparse.ArgumentParser:
    ap = limits.Parser(
        prog="python -m zoo.heads", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--target", required=True, help="the target's directory (or a name under --models)")
    ap.add_argument("--models", help="models root (else $MACH_MODELS, else $SPECBANDIT_MODELS)")
    ap.add_argument("--out", required=True, help="output directory: the cache, medusa/, eagle/, heldout.json")
    ap.add_argument("--prompts", help="a JSONL of prompts in workloads.py's format")
    ap.add_argument("--workload", help="named workloads (workloads.py), comma-separated")
    ap.add_argument("--heldout", help="a JSONL of held-out prompts (else --heldout-frac of the prompts)")
    ap.add_argument(
        "--heldout-frac", type=float, default=DEFAULTS["heldout_frac"], help="held out by a stable hash: in [0, 1)"
    )
    mem = ", within the memory this machine has"
    ap.add_argument("--limit", type=int, help="at most N prompts per workload (file order): " + R("--limit"))
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULTS["max_new_tokens"],
        help=R("--max-new-tokens", ", below the target's positions"),
    )
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"], help=R("--steps"))
    ap.add_argument("--batch", type=int, default=DEFAULTS["batch"], help="windows per step: " + R("--batch", mem))
    ap.add_argument(
        "--window", type=int, default=DEFAULTS["window"], help="positions per window (+1): " + R("--window", mem)
    )
    ap.add_argument("--heads", default=",".join(HEADS), help="which heads: medusa,eagle")
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"], help=f"an integer in {limits.SEED_RANGE}")
    ap.add_argument("--k", type=int, default=DEFAULTS["k"], help="draft length of the held-out acceptance: " + R("--k"))
    ap.add_argument("--medusa-heads", type=int, default=MEDUSA_DEFAULTS["num_heads"], help=R("--medusa-heads", mem))
    ap.add_argument("--medusa-layers", type=int, default=MEDUSA_DEFAULTS["num_layers"], help=R("--medusa-layers", mem))
    ap.add_argument(
        "--medusa-share-lm-head", action="store_true", help="heads end in the target's frozen lm_head (not stored)"
    )
    th = f": {limits.THREADS_RANGE}"
    ap.add_argument("--threads", type=int, default=2, help="torch threads of features, training, evaluation" + th)
    ap.add_argument("--gen-threads", type=int, default=1, help="torch threads of the greedy generation" + th)
    ap.add_argument("--prompt-loss", action="store_true", help="a loss at prompt positions too")
    ap.add_argument(
        "--compare", action="append", default=[], help="a drafter spec measured on the same held-out positions"
    )
    return ap


def check(a) -> list[str]:
    """The options' ranges, paths and --compare specs (UsageError naming the option); returns the heads to train."""
    return heads_check.options(a)


def portable(text: str, models: Path | None) -> str:
    """`text` (a path or a command) with the models root written `$SPECBANDIT_MODELS` and the repository's own
    prefix dropped: a card records no machine's absolute path, and its command runs anywhere the variable is set."""
    repo = str(Path(__file__).resolve().parents[1])
    if models is not None and Path(models).resolve() != Path("/"):
        root = re.escape(str(Path(models).resolve()))
        text = re.sub(root + r"(?=/|$|['\"\s])", "$SPECBANDIT_MODELS", text)  # a path's whole component only
    return re.sub(re.escape(repo) + "/", "", text)


PATH_OPTIONS = ("--models", "--out", "--prompts", "--heldout", "--target")


def abs_argv(argv: list[str]) -> list[str]:
    """argv with each path option's value absolute (as it resolved, against the current directory), so that
    `portable` can write it relative to the models root or the repository; a --target name is left a name."""

    def absolute(flag: str, val: str) -> str:
        return str(Path(val).resolve()) if flag != "--target" or Path(val).exists() else val

    out: list[str] = []
    for i, x in enumerate(argv):
        flag, eq, val = x.partition("=")
        if eq and flag in PATH_OPTIONS:
            x = f"{flag}={absolute(flag, val)}"
        elif i and argv[i - 1] in PATH_OPTIONS:
            x = absolute(argv[i - 1], x)
        out.append(x)
    return out


def run(a, argv: list[str]) -> dict:
    """Everything the module's doc lists; returns {head or compared drafter: held-out acceptance}."""
    names = check(a)
    out = Path(a.out)
    heads_check.outputs(out, names)
    tpath = lm.resolve_model_dir(a.target, a.models, "--target")
    root = lm.models_root(a.models)
    cfg = lm.read_config(tpath)
    npos = heads_check.target(a, cfg, names)
    items = load_prompts(a.prompts, a.workload, a.limit)
    train_items, held_items, how = split_prompts(items, a.heldout, a.heldout_frac, a.limit)
    torch = get_torch()
    torch.set_num_threads(a.threads)
    out.mkdir(parents=True, exist_ok=True)
    logf = out / "train.log"
    say = lambda m: log(m, logf)
    target = lm.load_lm(tpath, "cpu", "float32", "--target")
    for p in target.parameters():
        p.requires_grad_(False)
    tok = lm.load_tokenizer(tpath)
    early = [s for s in a.compare if heads_check.compare_specs([s], names)[0].kind != "cascade"]
    try:  # a --compare that cannot load is refused before the generation and the training
        drafters_for(early, target, tok, tpath)
    except InputError as e:
        raise InputError(str(e).replace("--drafter", "--compare", 1)) from None
    tsha = lm.weights_sha256(tpath)
    npos = npos or getattr(target.config, "max_position_embeddings", None)
    train_r, skip_t = render(train_items, tok, npos, a.max_new_tokens)
    held_r, skip_h = render(held_items, tok, npos, a.max_new_tokens)
    if skip_t or skip_h:
        say(f"skipped {len(skip_t) + len(skip_h)} prompts longer than the target's {npos} positions allow")
    if not train_r:
        raise UsageError(
            f"--max-new-tokens {a.max_new_tokens}: no training prompt fits the target's {npos} positions with it"
        )
    limits.fits(
        f"--max-new-tokens {a.max_new_tokens} on {len(train_r)} prompts",
        heads_check.stream_bytes(cfg, train_r, a.max_new_tokens),
    )
    say(f"target {tpath} (sha256 {tsha[:16]}): {len(train_r)} training, {len(held_r)} held-out prompts ({how})")
    t0 = time.time()
    cache = GreedyCache(out, tsha, a.max_new_tokens, int(target.config.vocab_size))
    train_ex = greedy_examples(target, tok, cache, train_r, "greedy train", say, a.gen_threads)
    held_ex = greedy_examples(target, tok, cache, held_r, "greedy held-out", say, a.gen_threads)
    t_gen = time.time() - t0
    t0 = time.time()
    stream = build_stream(target, train_ex, a.prompt_loss)
    t_feat = time.time() - t0
    n_loss = int(stream.loss.sum())
    say(f"stream: {len(stream):,} tokens, {n_loss:,} loss positions, {stream.disagree} teacher-forced disagreements")
    medusa_kw = dict(num_heads=a.medusa_heads, num_layers=a.medusa_layers, share_lm_head=a.medusa_share_lm_head)
    models = make_heads(target, names, a.seed, medusa_kw)
    facts = fit(models, stream, a.steps, a.batch, a.window, a.seed, say)
    for n, m in models.items():
        m.to(torch.float16).save(out / n)
    t0 = time.time()
    specs = [f"{n}={n}:path={out / n}" for n in names] + list(a.compare)
    acc = heldout_acceptance(drafters_for(specs, target, tok, tpath), target, held_ex, a.k)
    t_held = time.time() - t0
    data = {
        "source": a.prompts or f"workloads {a.workload}",
        "split": how,
        "train_prompts": len(train_ex),
        "heldout_prompts": len(held_ex),
        "skipped_prompts": skip_t + skip_h,
        "max_new_tokens": a.max_new_tokens,
        "train_tokens": len(stream),
        "train_output_tokens": sum(len(e.output) for e in train_ex),
        "loss_positions": n_loss,
        "prompt_loss": a.prompt_loss,
        "teacher_forced_disagreements": stream.disagree,
        "greedy_cache": cache.path.name,
    }
    compared = {s.split("=", 1)[0]: acc[s.split("=", 1)[0]] for s in a.compare}
    for n in names:
        d = out / n
        info = {
            "kind": n,
            "path": portable(str(d.resolve()), root),  # where it loads from, as --drafter's path= names it
            **facts[n],
            "config": json.loads((d / "config.json").read_text()),
            "sha256": {"model.safetensors": file_sha256(d / "model.safetensors"), "weights": lm.weights_sha256(d)},
            "target": {"path": portable(str(tpath.resolve()), root), "sha256": tsha},
            "seed": a.seed,
            "data": data,
            "time_s": {"generate": round(t_gen, 1), "features": round(t_feat, 1), "heldout": round(t_held, 1)},
            "threads": a.threads,
            "gen_threads": a.gen_threads,
            "heldout_acceptance": acc[n],
            "compared": compared,
            "command": portable("python -m zoo.heads " + shlex.join(abs_argv(argv)), root),
        }
        write_card(d, n, info)
    write_text(out / "heldout.json", json.dumps(acc, indent=2, sort_keys=True) + "\n")
    for n, r in acc.items():
        say(
            f"held-out mean accepted length at k={a.k}: {n} {r['mean']} ({r['positions']} positions) {r['per_workload']}"
        )
    return acc


def main(argv=None) -> None:
    """The command: a problem in the input (bandit/logs/errors.py HANDLED) is one `error: ...` line and its code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    try:
        run(parser().parse_args(argv), argv)
    except HANDLED as e:
        print(f"error: {message(e)}", file=sys.stderr)
        sys.exit(exit_code(e))


if __name__ == "__main__":
    main()
