"""What one target pass costs by how many tokens it verifies, measured directly, beside the timing model's fit.

    python bench/pass_cost.py [--target DIR] [--context 300] [--q 1,2,3,4,5,8,9,17,33] [--reps 9]
        [--run RUN] [--json FILE]

The timing model (bandit/live/timingmodel.py) prices a pass of Q tokens by a step cost fitted on a run's live
decodes at knots (bandit/stats/steps.py), because on a CPU the matrix kernels change regime with the row count and
a line in Q misprices both ends. This bench measures that function directly: a prefill of `--context` tokens, then
one cached forward of Q tokens (the verify forward's shape: `harness.lm.forward`, causal mask after the cache),
timed `--reps` times per Q with the cache cropped back between reps; it prints the median ms per Q and its ratio
to Q = 1, and beside them the fitted step cost of `--run`'s wallclock.json at the same Q (linear between its knots)
and its ratio to its own Q = 1. The two are measured differently (a bare forward here; the live loop's whole pass,
its own Python included, in the fit), so compare the ratios, not the milliseconds. Nothing else may run beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def measure(target: Path, context: int, qs: list[int], reps: int, seed: int = 0) -> dict[int, float]:
    """Median ms of one cached forward of q tokens after `context` positions, for each q."""
    import torch

    from harness import lm

    torch.manual_seed(seed)
    model = lm.load_lm(target)
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (context,))
    cache = lm.new_cache()
    lm.forward(model, prompt, cache, last_logits=True)
    out = {}
    for q in qs:
        ids = torch.randint(0, vocab, (q,))
        lm.forward(model, ids, cache, causal=True)  # one unmeasured: first-call allocations
        lm.crop(cache, context)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            lm.forward(model, ids, cache, causal=True)
            times.append(1000 * (time.perf_counter() - t0))
            lm.crop(cache, context)
        out[q] = statistics.median(times)
    return out


def fitted(run: Path, qs: list[int]) -> dict[int, float] | None:
    """The step cost at each q from run's wallclock.json (pass@<knot> coefficients, linear between), or None."""
    import numpy as np

    from bandit.stats.steps import basis

    path = run / "wallclock.json"
    if not path.is_file():
        return None
    coef = json.loads(path.read_text())["model"]["coef_ms"]
    knots = [int(k.split("@", 1)[1]) for k in coef if k.startswith("pass@")]
    if not knots:
        return None  # a wallclock.json of the earlier linear model
    values = np.array([coef[f"pass@{k}"] for k in knots])
    return {q: float(basis([q], knots)[0] @ values) for q in qs}


def render(measured: dict[int, float], fit: dict[int, float] | None, run: Path, args) -> str:
    lines = [
        f"# one cached forward of Q tokens after {args.context} positions, {args.target}, median of {args.reps} "
        f"[MEASURED]; beside it the step cost fitted on {run}'s live phase [MODEL]",
        "| Q | ms [MEASURED] | / Q=1 | fitted pass ms [MODEL] | / Q=1 |",
        "|---|---|---|---|---|",
    ]
    m1 = measured[min(measured)]
    f1 = fit[min(fit)] if fit else None
    for q, ms in measured.items():
        f = "- | -" if not fit else f"{fit[q]:.2f} | {fit[q] / f1:.3f}"
        lines.append(f"| {q} | {ms:.2f} | {ms / m1:.3f} | {f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="models/smollm2-135m-instruct", help="a model directory (safetensors)")
    ap.add_argument("--context", type=int, default=300, help="cached positions before the measured forward")
    ap.add_argument("--q", default="1,2,3,4,5,8,9,17,33", help="forward sizes (tokens), comma-separated")
    ap.add_argument("--reps", type=int, default=9, help="timed forwards per size (the median is printed)")
    ap.add_argument("--run", default="runs/smollm2-20261203", help="a run whose wallclock.json's fit is shown beside")
    ap.add_argument("--json", help="write the table and the command to this file")
    a = ap.parse_args(argv)
    try:
        qs = sorted({int(x) for x in a.q.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"error: --q {a.q!r}: expected comma-separated token counts") from None
    if not qs or qs[0] < 1 or a.context < 1 or a.reps < 1:
        raise SystemExit("error: --q, --context and --reps must be positive")
    target = Path(a.target)
    if not (target / "config.json").is_file():
        raise SystemExit(f"error: {target}: no model directory (python -m harness.smollm2 --stage setup makes it)")
    measured = measure(target, a.context, qs, a.reps)
    run = Path(a.run)
    fit = fitted(run, qs)
    print(render(measured, fit, run, a))
    if a.json:
        cmd = " ".join(["python bench/pass_cost.py", *(sys.argv[1:] if argv is None else argv)])
        obj = {
            "command": cmd,
            "target": str(target),
            "context": a.context,
            "reps": a.reps,
            "measured_ms": {str(q): round(v, 3) for q, v in measured.items()},
            "fitted_ms": None if fit is None else {str(q): round(v, 3) for q, v in fit.items()},
            "fitted_on": str(run),
        }
        Path(a.json).write_text(json.dumps(obj, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
