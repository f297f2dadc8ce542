"""The checks of ``python -m zoo.heads`` before any work: every option in its stated range, the paths it reads and
writes, the --compare specs, and the memory the settings need against what this machine has.

Each refusal is one line naming the option (bandit/logs/errors.py `UsageError`, exit 2). Ranges (RANGES, shown in
--help): counts have fixed bounds; --max-new-tokens is also bounded by the target's positions (its config.json,
read before the model loads); --threads and --gen-threads by the cores (bandit/logs/limits.py); --batch, --window,
--medusa-heads and --medusa-layers by the bytes training needs (`train_bytes`, an estimate from the target's
config), the cached outputs and features by the positions the prompts render to (`stream_bytes`). Every file it
writes (DIR/train.log, heldout.json, the greedy cache, the heads' directories and files) must not be a symlink.
"""

from __future__ import annotations

from pathlib import Path

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError

from .heads_fit import HEADS

RANGES = {  # option -> (lowest, highest)
    "--max-new-tokens": (1, 1 << 20),
    "--steps": (1, 10**7),
    "--batch": (1, 1 << 16),
    "--window": (2, 1 << 16),
    "--k": (1, 4095),
    "--medusa-heads": (1, 1024),
    "--medusa-layers": (1, 256),
    "--limit": (1, 10**9),
}
HEAD_FILES = ("config.json", "model.safetensors", "README.md", "training_info.json")


def range_help(flag: str, more: str = "") -> str:
    lo, hi = RANGES[flag]
    return f"an integer in {lo}..{hi}{more}"


def options(a) -> list[str]:
    """The options' ranges and paths (UsageError naming the option); returns the heads to train."""
    names = [n for n in a.heads.split(",") if n]
    if not names or set(names) - set(HEADS) or len(set(names)) != len(names):
        raise UsageError(f"--heads {a.heads!r}: expected one or both of {', '.join(HEADS)}")
    for flag, (lo, hi) in RANGES.items():
        limits.integer(flag, getattr(a, flag[2:].replace("-", "_")), lo, hi)
    limits.seed("--seed", a.seed)
    limits.threads("--threads", a.threads)
    limits.threads("--gen-threads", a.gen_threads)
    if not 0.0 <= a.heldout_frac < 1.0:
        raise UsageError(f"--heldout-frac {a.heldout_frac}: expected 0 <= F < 1")
    for flag in ("--target", "--models", "--prompts", "--heldout"):
        limits.path_value(flag, getattr(a, flag[2:]))
    limits.out_dir("--out", a.out)
    if "," in str(a.out):
        raise UsageError(f"--out {a.out!r}: a comma cannot be in a drafter spec's path")
    compare_specs(a.compare, names)
    return [n for n in HEADS if n in names]


def compare_specs(specs: list[str], names: list[str]) -> list:
    """The --compare specs parsed (kind, settings and their ranges), their names distinct from the heads'."""
    from harness.drafters import parse_spec

    parsed, seen = [], set(names)
    for s in specs:
        try:
            p = parse_spec(s)
        except InputError as e:
            raise UsageError(str(e).replace("--drafter", "--compare", 1)) from None
        if p.name in seen:
            raise UsageError(f"--compare {s}: the name {p.name!r} is taken (a trained head or another --compare)")
        seen.add(p.name)
        parsed.append(p)
    return parsed


def outputs(out: Path, names: list[str]) -> None:
    """No file the run writes is a symlink (checked before any work; the writes themselves refuse one too)."""
    paths = [out / "train.log", out / "heldout.json", *sorted(out.glob("greedy-*"))]
    for n in names:
        paths += [out / n, *(out / n / f for f in HEAD_FILES)]
    limits.no_symlinks("--out", paths)
    for n in names:
        if (out / n).exists() and not (out / n).is_dir():
            raise UsageError(f"--out: {out / n} is a file, where the {n} heads' directory goes")


def _dims(cfg: dict) -> tuple[int, int, int, int, int, int]:
    """(hidden, vocab, intermediate, attention heads, layers, positions) from a config.json (text_config too)."""
    c = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg

    def num(key: str, default: int) -> int:
        v = c.get(key, cfg.get(key))
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default

    h = num("hidden_size", num("n_embd", 0))
    return (
        h,
        num("vocab_size", 0),
        num("intermediate_size", 4 * h),
        num("num_attention_heads", 1),
        (num("num_hidden_layers", num("n_layer", 1))),
        num("max_position_embeddings", num("n_positions", 0)),
    )


def target(a, cfg: dict, names: list[str]) -> int | None:
    """The options bounded by the target (its config.json): --max-new-tokens by its positions, and the training's
    memory. Returns the target's positions (None when its config does not say)."""
    npos = _dims(cfg)[5] or None
    if npos is not None:
        limits.integer("--max-new-tokens", a.max_new_tokens, 1, npos - 1, f" (the target has {npos} positions)")
    limits.fits(
        f"--batch {a.batch} x --window {a.window}"
        + (f", --medusa-heads {a.medusa_heads} x --medusa-layers {a.medusa_layers}" if "medusa" in names else ""),
        train_bytes(cfg, names, a),
    )
    return npos


def train_bytes(cfg: dict, names: list[str], a) -> int:
    """An estimate of the bytes training needs at its peak (float32): the target, the heads' weights with their
    gradients and AdamW's moments, one window batch's activations and logits."""
    H, V, I, nh, L, _ = _dims(cfg)
    f = 4
    rows, W = a.batch * (a.window + 1), a.window + 1
    need = (2 * V * H + L * (4 * H * H + 3 * H * I)) * f  # the target (untied embeddings, the larger case)
    need += rows * (H * f + 5 * 8)  # the batch gathered from the stream
    if "medusa" in names:
        per = a.medusa_layers * (H * H + H) + (0 if a.medusa_share_lm_head else H * V)
        need += 4 * a.medusa_heads * per * f  # weights, gradients, AdamW's two moments
        need += 3 * a.medusa_heads * rows * V * f  # logits, their float copy and their gradient
        need += 2 * a.medusa_heads * a.medusa_layers * rows * H * f
    if "eagle" in names:
        need += 4 * (6 * H * H + 3 * H * I) * f
        need += 3 * rows * V * f + 20 * rows * H * f + 3 * a.batch * nh * W * W * f + a.batch * W * W
    return need


def stream_bytes(cfg: dict, rendered: list, max_new: int) -> int:
    """The packed training stream's bytes at most (every position's feature, float32, and five columns), with the
    longest sequence's teacher-forced forward (its logits, twice)."""
    H, V = _dims(cfg)[:2]
    positions = sum(len(ids) + max_new for _, ids in rendered)
    longest = max((len(ids) + max_new for _, ids in rendered), default=0)
    return positions * (2 * H * 4 + 5 * 8) + longest * V * 4 * 2
