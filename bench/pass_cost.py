"""What one target pass costs by how many tokens it verifies, measured directly, beside the timing model's fit.

    python bench/pass_cost.py [--target DIR] [--context 300] [--q 1,2,3,4,5,8,9,17,33] [--reps 9]
        [--run RUN] [--json FILE]

The timing model (bandit/live/timingmodel.py) prices a pass of Q tokens by a step cost fitted on a run's live
decodes at knots (bandit/stats/steps.py), because on a CPU the matrix kernels change regime with the row count and
a line in Q misprices both ends. This bench measures that function directly: a prefill of `--context` tokens, then
one cached forward of Q tokens (the verify forward's shape: `harness.models.lm.forward`, causal mask after the cache),
timed `--reps` times per Q with the cache cropped back between reps; it prints the median ms per Q and its ratio
to Q = 1, and beside them the fitted step cost of `--run`'s wallclock.json at the same Q (linear between its knots)
and its ratio to its own Q = 1. The two are measured differently (a bare forward here; the live loop's whole pass,
its own Python included, in the fit), so compare the ratios, not the milliseconds. Nothing else may run beside it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError
from bandit.logs.outputs import show
from bandit.logs.reader import published_campaign
from harness.models.options import CORES, KERNEL_CHOICES


def measure(
    target: Path, context: int, qs: list[int], reps: int, kernels: str = "default", seed: int = 0
) -> tuple[dict[int, float], dict]:
    """Median ms of one cached forward of q tokens after `context` positions, for each q, on the kernel path a run
    takes (harness/models/kernels.py `choose`: `--kernels` as sweep.py's); and what ran, with the bandwidth floor
    of a 1-token forward (bench/floor.py: bytes it must read over this host's read bandwidth)."""
    import torch

    from bench.floor import floor_bytes
    from bench.floor_probe import bandwidth, timed_forwards
    from harness.models import kernels as kern
    from harness.models import lm

    torch.manual_seed(seed)
    model = lm.load_lm(target)
    ran = kern.choose(model, kernels, "cpu")
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (context,))
    cache = lm.new_cache()
    lm.forward(model, prompt, cache, last_logits=True)
    out = {}
    for q in qs:
        ids = torch.randint(0, vocab, (q,))
        timed_forwards(model, ids, cache, context, 1)  # one unmeasured: first-call allocations
        out[q] = statistics.median(timed_forwards(model, ids, cache, context, reps))
    bw = bandwidth()
    ran["floor_ms"] = 1000 * floor_bytes(model, 1, context) / (bw["gbs"] * 1e9)
    ran["bandwidth_gbs"] = bw["gbs"]
    return out, ran


def fitted(run: Path, qs: list[int]) -> dict[int, float] | None:
    """The step cost at each q from run's wallclock.json (pass@<knot> coefficients, linear between), or None when
    the run has none (or one of the earlier linear model); an InputError naming the file when it is not one."""
    import numpy as np

    from bandit.stats.steps import basis

    path = run / "wallclock.json"
    if not path.is_file():
        return None
    try:
        coef = json.loads(path.read_bytes().decode("utf-8"))["model"]["coef_ms"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputError(f"{path}: not a wallclock.json with model.coef_ms ({type(e).__name__}: {e})") from None
    if not isinstance(coef, dict):
        raise InputError(f"{path}: model.coef_ms is not an object")
    fit = {}
    for key, v in coef.items():
        if isinstance(key, str) and key.startswith("pass@"):
            k = key.split("@", 1)[1]
            ok = k.isdigit() and int(k) >= 1 and isinstance(v, (int, float)) and not isinstance(v, bool)
            if not ok or not math.isfinite(v):
                raise InputError(f"{path}: model.coef_ms.{key} = {v!r}: expected pass@<tokens> with a finite ms")
            fit[int(k)] = float(v)
    if not fit:
        return None  # a wallclock.json of the earlier linear model
    knots = sorted(fit)
    values = np.array([fit[k] for k in knots])
    return {q: float(basis([q], knots)[0] @ values) for q in qs}


def run_settings(run: Path) -> tuple:
    """(threads, kernel path) a run's forwards ran with, as its manifest records them (None where it does not: a
    run made before they were recorded ran on aten, one thread on CPU)."""
    try:
        m = json.loads((run / "manifest.json").read_bytes().decode("utf-8"))
        hw = m.get("hardware") or {}
        cpu_default = 1 if hw.get("device") == "cpu" else None  # before --threads meant N, a CPU run took 1
        return hw.get("threads") or cpu_default, (m.get("kernels") or {}).get("kernels") or "aten"
    except (OSError, ValueError, AttributeError):
        return None, None


def run_target(run: Path) -> str | None:
    """The sha256 of the target a run measured (its manifest.json's target.sha256), or None when it does not say."""
    try:
        m = json.loads((run / "manifest.json").read_bytes().decode("utf-8"))
        sha = m["target"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return sha if isinstance(sha, str) else None


def render(measured: dict[int, float], fit: dict[int, float] | None, run: Path, args, other: str = "") -> str:
    """The table; `other` (non-empty: why) marks the fit as another target's."""
    model = "MODEL, ANOTHER TARGET" if other else "MODEL"
    lines = [
        f"# one cached forward of Q tokens after {args.context} positions, {args.target}, median of {args.reps} "
        f"[MEASURED]; beside it the step cost fitted on {run}'s live phase [{model}]"
        + (f"\n# note: that fit is of another target: {other}" if other else ""),
        f"| Q | ms [MEASURED] | / Q=1 | fitted pass ms [{model}] | / Q=1 |",
        "|---|---|---|---|---|",
    ]
    m1 = measured[min(measured)]
    f1 = fit[min(fit)] if fit else None
    for q, ms in measured.items():
        f = "- | -" if not fit else f"{fit[q]:.2f} | {fit[q] / f1:.3f}"
        lines.append(f"| {q} | {ms:.2f} | {ms / m1:.3f} | {f} |")
    return "\n".join(lines)


DEFAULT_RUN = REPO / (published_campaign() or "runs")  # the published campaign (none: no fitted column)
MAX_REPS = 10_000
MAX_Q = 1 << 16


def checked(a) -> tuple[list[int], Path, Path | None, Path | None]:
    """(sizes, target, run or None, json file or None): every option in its range before any forward."""
    from harness.models import lm

    try:
        qs = sorted({int(x) for x in a.q.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--q {a.q!r}: expected comma-separated token counts") from None
    if not qs or qs[0] < 1 or qs[-1] > MAX_Q:
        raise UsageError(f"--q {a.q!r}: expected token counts in 1..{MAX_Q}")
    limits.integer("--reps", a.reps, 1, MAX_REPS)
    limits.threads("--threads", a.threads)
    limits.integer("--context", a.context, 1, 1 << 30)
    out = limits.out_file("--json", a.json)
    target = limits.path_value("--target", a.target)
    if not (target / "config.json").is_file():
        raise InputError(f"--target {target}: no model directory (python -m harness.smollm2 --stage setup makes it)")
    lm.refuse_drafter_dir(target, "--target")
    npos = lm.read_config(target).get("max_position_embeddings")
    if isinstance(npos, int) and npos > 1:
        limits.integer("--context", a.context, 1, npos - 1, f" (the target has {npos} positions)")
        hi = npos - a.context
        if qs[-1] > hi:
            raise UsageError(f"--q {qs[-1]}: expected at most {hi} (--context {a.context} of the target's {npos})")
    run = DEFAULT_RUN if a.run is None else limits.path_value("--run", a.run)
    if a.run is not None and not (run / "wallclock.json").is_file():
        why = "no such run directory" if not run.is_dir() else "no wallclock.json (python bandit/wallclock.py RUN)"
        raise UsageError(f"--run {run}: {why}")
    return qs, target, run if (run / "wallclock.json").is_file() else None, out


def main(argv=None) -> None:
    ap = limits.Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="models/smollm2-135m-instruct", help="a model directory (safetensors)")
    ap.add_argument(
        "--context", type=int, default=300, help="cached positions before the measured forward: 1..the target's - Q"
    )
    ap.add_argument("--q", default="1,2,3,4,5,8,9,17,33", help="forward sizes (tokens), comma-separated, >= 1")
    ap.add_argument(
        "--reps", type=int, default=9, help=f"timed forwards per size (the median is printed): 1..{MAX_REPS}"
    )
    ap.add_argument(
        "--run", default=None, help=f"a run whose wallclock.json's fit is shown beside (default {show(DEFAULT_RUN)})"
    )
    ap.add_argument("--json", help="write the table and the command to this file (its folder must exist)")
    ap.add_argument(
        "--kernels",
        default="default",
        choices=KERNEL_CHOICES,
        help="the linears' path, as sweep.py --kernels (default: prepacked oneDNN where the CPU has it)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads, {limits.THREADS_RANGE} (default: every core, as a run)",
    )
    a = ap.parse_args(argv)
    qs, target, run, out = checked(a)
    fit = None if run is None else fitted(run, qs)
    other = ""
    if fit is not None:
        from harness.models import lm

        theirs, ours = run_target(run), lm.weights_sha256(target)
        if theirs != ours:
            named = "no target sha256" if theirs is None else f"target sha256 {theirs[:16]}"
            other = f"{show(run)}/manifest.json names {named}, {target} is {ours[:16]}"
            print(f"note: the fitted column is another target's ({other})", file=sys.stderr)
    import torch

    torch.set_num_threads(a.threads or CORES)  # the settings a run's live phase uses (sweep.py's defaults)
    measured, ran = measure(target, a.context, qs, a.reps, a.kernels)
    if fit is not None:
        theirs = run_settings(run)
        same = theirs == (ran["threads"], ran["kernels"])
        said = (
            "the same settings"
            if same
            else f"other settings: {theirs[0] or '?'} threads, kernels {theirs[1] or 'aten'}"
        )
        print(f"note: the fitted column's run ran at {said}; this bench at {ran['threads']} threads, {ran['kernels']}")
    print(
        f"ran: {ran['dtype']}, kernels {ran['kernels']}, {ran['threads']} threads; 1-token bandwidth floor "
        f"{ran['floor_ms']:.3f} ms ({ran['bandwidth_gbs']} GB/s)"
        + (f", Q = 1 at {measured[1] / ran['floor_ms']:.2f}x it" if 1 in measured else "")
    )
    shown = run or DEFAULT_RUN
    print(render(measured, fit, show(shown), a, other))
    if out is not None:
        cmd = " ".join(["python bench/pass_cost.py", *(sys.argv[1:] if argv is None else argv)])
        obj = {
            "command": cmd,
            "target": str(target),
            "context": a.context,
            "reps": a.reps,
            "measured_ms": {str(q): round(v, 3) for q, v in measured.items()},
            "ms": {str(q): {"median": round(v, 3)} for q, v in measured.items()},
            "floor_ms": round(ran["floor_ms"], 4),
            "bandwidth_gbs": ran["bandwidth_gbs"],
            "dtype": ran["dtype"],
            "threads": ran["threads"],
            "kernels": ran["kernels"],
            "fitted_ms": None if fit is None else {str(q): round(v, 3) for q, v in fit.items()},
            "fitted_on": show(shown),
        }
        if other:
            obj["fitted_on_another_target"] = other
        limits.write_json(out, obj)
        print(f"wrote {out}")


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
