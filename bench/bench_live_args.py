"""The options of bench/bench_live.py and their checks, all made before any model loads.

Each option in its range (stated in --help) or one `error: ...` line naming it (bandit/logs/errors.py): counts
(--limit, --reps, --k), --threads against the cores, --max-new-tokens and --hf-assist against the target's config,
the --ngram spec parsed, the target a model directory, --vllm only where vLLM is installed (the vllm tier), --json
not a symlink and in an existing folder.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError

LIMIT_MAX, REPS_MAX, K_MAX = 100_000, 10_000, 4095


def parser(doc: str, ngram: str, target: Path) -> argparse.ArgumentParser:
    ap = limits.Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", type=lambda x: x.split(","), default=["code", "copy"])
    ap.add_argument("--ngram", default=ngram, help=f"the live loop's drafter spec (default {ngram}; --vllm needs it)")
    ap.add_argument("--target", default=str(target), help="a local target directory (default: the zoo's)")
    ap.add_argument("--limit", type=int, default=20, help=f"prompts per workload: 1..{LIMIT_MAX}")
    ap.add_argument("--k", type=int, default=4, help=f"draft length: 1..{K_MAX}")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="1..the target's positions - 1")
    ap.add_argument("--reps", type=int, default=5, help=f"repetitions: 1..{REPS_MAX}")
    ap.add_argument(
        "--threads", type=int, default=None, help=f"torch threads for both halves: {limits.THREADS_RANGE} "
        "(default: torch's)"
    )  # fmt: skip
    ap.add_argument("--vllm", action="store_true", help="also vLLM's half (the vllm tier's venv)")
    ap.add_argument("--vllm-engine", choices=("inproc", "mp"), default="inproc",
                    help="vLLM's engine in this process (default), or LLM's default engine-core process")  # fmt: skip
    ap.add_argument("--hf", action="store_true", help="also transformers' prompt lookup")
    ap.add_argument("--hf-assist", type=int, metavar="L", default=None,
                    help="also transformers' assisted generation with the target's first L layers drafting, against "
                    "the live loop with layerskip:layers=L: 1..the target's layers - 1")  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="also ms per live block by part")
    ap.add_argument("--json", default=None, help="write the results here (its folder must exist)")
    return ap


def check(a, default_ngram: str, default_target: Path) -> None:
    """Every option before any model loads (module doc); a.json becomes the checked path."""
    from harness.drafters import parse_spec
    from harness.models import lm

    limits.integer("--limit", a.limit, 1, LIMIT_MAX)
    limits.integer("--reps", a.reps, 1, REPS_MAX)
    limits.integer("--k", a.k, 1, K_MAX)
    limits.threads("--threads", a.threads)
    a.json = limits.out_file("--json", a.json)
    try:
        parse_spec(a.ngram)
    except InputError as e:
        raise UsageError(str(e).replace("--drafter", "--ngram", 1)) from None
    a.target = target = limits.path_value("--target", a.target)
    if not (target / "config.json").is_file():
        raise UsageError(f"--target {target}: no model directory (no config.json)")
    lm.refuse_drafter_dir(target, "--target")
    cfg = lm.read_config(target)
    npos, layers = cfg.get("max_position_embeddings"), cfg.get("num_hidden_layers")
    hi = npos - 1 if isinstance(npos, int) and npos > 1 else 1 << 20
    limits.integer("--max-new-tokens", a.max_new_tokens, 1, hi, f" (the target has {npos} positions)" if npos else "")
    if a.hf_assist is not None:
        top = layers - 1 if isinstance(layers, int) and layers > 1 else 0
        limits.integer("--hf-assist", a.hf_assist, 1, max(top, 1), f" (the target has {layers} layers)")
        if top < 1:
            raise UsageError(f"--hf-assist: the target has {layers} layers, none to skip")
    if a.vllm:
        if a.target != default_target or a.ngram != default_ngram:
            raise UsageError(
                "--vllm compares the default --ngram on the zoo target only (the tier's model, vLLM's rule)"
            )
        if importlib.util.find_spec("vllm") is None:
            raise UsageError("--vllm: vLLM is not installed in this environment (run it with the vllm tier's python)")
