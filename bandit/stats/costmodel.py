"""The cost model: a block's cost in target verification passes, and the speedup and break-even it implies.

Costs are in units of one target verification pass (docs/DESIGN.md, "Cost model"). The primary
alone pays `c0 = 1 + rho_p` per block; re-drafting a fraction R of blocks with alternatives A pays
`c = 1 + rho_p + R * (sum_{d in A} rho_d + alpha(|A|))`, where alpha(K) is the extra target cost of
verifying the primary's and K alternatives' drafts together: the manifest's union-verify time of
1 + K drafts over one draft's, minus 1 (so best-of-N over D drafters is charged the union of all
D drafts). Speedup = (1 + g) * c0 / c, g the token gain per block. Measured costs come from a run
manifest's `timing` (docs/manifest.md); without one, the documented what-if below.

    python bandit/stats/costmodel.py     # the default campaign's costs, and the what-if break-even table
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/stats/costmodel.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bandit.logs.errors import InputError

REF_RHO = 0.10  # the what-if drafter cost (no timing in the manifest)
TABLE_RHOS = (0.02, 0.05, 0.10, 0.15, 0.20)
PLOT_ALPHAS = (0.0, 0.25)


def speedup(gain, redraft_rate, rho_p, rho_alts: Sequence[float] | float, alpha):
    """Speedup of the selector over the primary alone (docs/DESIGN.md); broadcasts over numpy arrays.

    rho_alts: the alternatives' rho (a sequence; or one float meaning a single alternative).
    """
    alts = np.sum(np.asarray(rho_alts, float), axis=-1) if np.ndim(rho_alts) else rho_alts
    c0 = 1.0 + np.asarray(rho_p, float)
    c = c0 + np.asarray(redraft_rate, float) * (alts + np.asarray(alpha, float))
    out = (1.0 + np.asarray(gain, float)) * c0 / c
    return float(out) if np.ndim(out) == 0 else out


def speedup_equal(gain, redraft_rate, n_alternatives: int, rho, alpha):
    """What-if form: every drafter costs the same rho, K alternatives: c = 1 + rho + R (K rho + alpha)."""
    rho = np.asarray(rho, float)
    out = (1.0 + gain) * (1.0 + rho) / (1.0 + rho + redraft_rate * (n_alternatives * rho + alpha))
    return float(out) if out.ndim == 0 else out


def breakeven_rho(gain: float, redraft_rate: float, n_alternatives: int, alpha: float) -> float | None:
    """The rho at which speedup_equal = 1, or None when no rho >= 0 separates winning from losing.

    speedup > 1  <=>  f(rho) = g (1 + rho) - R (K rho + alpha) > 0, linear in rho:
    root rho* = (g - R alpha) / (R K - g). Returns rho* when it is >= 0 (the selector wins below it
    when f(0) > 0, above it otherwise); None when the sign of f never changes on rho >= 0: "never"
    if f(0) <= 0 (loses at every drafter cost), "always" otherwise; `breakeven_regime` says which.
    """
    slope = gain - redraft_rate * n_alternatives
    f0 = gain - redraft_rate * alpha
    if slope == 0.0:
        return None
    root = -f0 / slope
    return float(root) if root >= 0.0 and not (f0 == 0.0 and slope < 0) else None


def breakeven_regime(gain: float, redraft_rate: float, n_alternatives: int, alpha: float) -> str:
    """'below' (wins for rho < rho*), 'above' (wins for rho > rho*), 'never' or 'always' (on rho >= 0)."""
    root = breakeven_rho(gain, redraft_rate, n_alternatives, alpha)
    f0 = gain - redraft_rate * alpha
    if root is None:
        return "always" if f0 > 0 else "never"
    return "below" if gain - redraft_rate * n_alternatives < 0 else "above"


def whatif(gain: float, redraft_rate: float, n_alternatives: int, rhos: Sequence[float], alpha: float) -> dict:
    """The what-if answer: {"speedup": {rho: value}, "breakeven_rho": value or None}."""
    return {
        "speedup": {fmt_rho(r): round(speedup_equal(gain, redraft_rate, n_alternatives, r, alpha), 6) for r in rhos},
        "breakeven_rho": round_or_none(breakeven_rho(gain, redraft_rate, n_alternatives, alpha)),
    }


def fmt_rho(r: float) -> str:
    return f"{r:g}"


def round_or_none(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


# ---------------------------------------------------------------- measured rho and alpha

WHATIF_RHO = REF_RHO  # without timing: every drafter costs this fraction of a verify pass...
WHATIF_ALPHA_PER_DRAFT = 0.0  # ...and union verification of K more drafts costs K times this (0: free)


@dataclass(frozen=True)
class Costs:
    """Per-block costs in units of one target verification pass (docs/DESIGN.md, cost model).

    `rho[d]` is drafter d's call; `union[n]` the target's time to verify n drafts together over one
    draft's, minus 1 (union[1] = 0), so verifying the primary and K alternatives together charges
    alpha = union[1 + K]. `source` is "measured" (from a manifest's timing) or "what-if" (documented
    constants, no timing in the logs).
    """

    drafters: tuple[str, ...]
    rho: np.ndarray  # (D,) drafter cost / verify(k + 1)
    union: np.ndarray  # (D + 1,) extra target cost of verifying n drafts together, index n; union[0] = union[1] = 0
    source: str  # measured | what-if
    hardware: str = ""
    why: str = ""  # what-if: why the manifest's timing was not used

    def alpha(self, n_alternatives: int) -> float:
        return float(self.union[min(1 + int(n_alternatives), self.union.size - 1)])

    def speedup(self, p: int, alts: Sequence[int], redraft_rate, gain):
        """(1 + g) c0 / c with c0 = 1 + rho_p and c = c0 + R (sum_A rho + alpha(|A|)); broadcasts over R, g."""
        return speedup(
            gain, redraft_rate, self.rho[p], [float(self.rho[j]) for j in alts] or [0.0], self.alpha(len(alts))
        )

    @property
    def source_kind(self) -> str:
        return self.source  # "measured" | "what-if" (TimingModel's is "timing")

    def row_costs(
        self, p: int, alts: Sequence[int], n: int, dlen: np.ndarray | None = None, prefill: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(base (n,), extra (n,)) cost of n blocks in verification passes: the primary alone 1 + rho_p, and what
        re-drafting with `alts` adds, sum rho + alpha(|alts|) (bandit/live/timingmodel.py prices the same in ms).
        Draft lengths and prefill do not enter this model."""
        base = np.full(n, 1.0 + float(self.rho[p]))
        a = list(alts)
        extra = np.full(n, float(self.rho[a].sum()) + self.alpha(len(a))) if a else np.zeros(n)
        return base, extra

    def describe(self) -> str:
        rho = ", ".join(f"{d} {r:.3f}" for d, r in zip(self.drafters, self.rho))
        al = ", ".join(f"{n}: {self.union[n]:.3f}" for n in range(2, self.union.size))
        how = (
            f"the manifest's timing ({self.hardware})"
            if self.source == "measured"
            else f"what-if ({self.why or 'no timing in the logs'}): rho {WHATIF_RHO} for every drafter, union verification "
            f"{WHATIF_ALPHA_PER_DRAFT} per extra draft"
        )
        return f"costs from {how}; rho: {rho}; union-verify alpha by drafts verified: {al}"


def costs_for(drafters: Sequence[str], manifest: dict | None) -> Costs:
    """Costs from a manifest's timing (measured), else the documented what-if."""
    D = len(drafters)
    m = rho_alpha_from_manifest(manifest) if manifest and manifest.get("timing") else None
    if m is None or any(d not in m[0] for d in drafters):
        union = np.r_[0.0, 0.0, WHATIF_ALPHA_PER_DRAFT * np.arange(1, D)]
        why = (
            "no timing in the logs"
            if m is None
            else f"the timing lacks drafter_ms for {', '.join(d for d in drafters if d not in m[0])}"
        )
        return Costs(tuple(drafters), np.full(D, WHATIF_RHO), union, "what-if", why=why)
    rho, _ = m
    vb = manifest["timing"]["verify_batch_ms"]
    nb, mb = np.asarray(vb["drafts"], float), np.asarray(vb["ms"], float)
    union = np.r_[0.0, [max(float(np.interp(n, nb, mb) / np.interp(1, nb, mb) - 1.0), 0.0) for n in range(1, D + 1)]]
    hw = manifest.get("hardware") or {}
    hardware = hw.get("gpu") or hw.get("cpu") or hw.get("device") or "?"
    return Costs(tuple(drafters), np.array([rho[d] for d in drafters]), union, "measured", str(hardware))


def engine_costs(drafters: Sequence[str], manifest: dict | None, engine: dict) -> Costs:
    """Costs with the target's verification (and the drafters it timed) measured inside a production engine.

    `engine` is a timing file in the manifest's form plus `engine` (its name and version), e.g. what
    bench/vllm_crosscheck.py writes: its `verify_ms`, `verify_batch_ms` and `drafter_ms` replace the
    campaign's; a drafter the engine did not time keeps the harness's call time, so its rho is the
    harness's call over the engine's verification (said in `hardware`).
    """
    name = engine.get("engine")
    if not isinstance(name, str) or not isinstance(engine.get("timing"), dict):
        raise InputError("engine timing: expected an object with 'engine' (name and version) and 'timing'")
    own = dict((manifest or {}).get("timing") or {})
    et = engine["timing"]
    timing = {**own, **{k: et[k] for k in ("verify_ms", "verify_batch_ms") if k in et}}
    timing["drafter_ms"] = {**(own.get("drafter_ms") or {}), **(et.get("drafter_ms") or {})}
    merged = {**(manifest or {}), "timing": timing, "run": f"{name} timing", "hardware": engine.get("hardware") or {}}
    c = costs_for(drafters, merged)
    if c.source != "measured":
        raise InputError(f"engine timing ({name}): {c.why}; the campaign's manifest must time the other drafters")
    kept = [d for d in drafters if d not in (et.get("drafter_ms") or {})]
    note = f"; {', '.join(kept)}: the harness's call times" if kept else ""
    return Costs(c.drafters, c.rho, c.union, "measured", f"{name} on {c.hardware}{note}")


def read_engine_timing(path) -> dict:
    """A production engine's timing file (`--engine-timing`), read and checked as one JSON object."""
    try:
        obj = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a JSON object (a timing file in the manifest's form)")
    return obj


def rho_alpha_from_manifest(manifest: dict | None) -> tuple[dict[str, float], float] | None:
    """(rho per drafter, alpha of union verification of two drafts) from a manifest's `timing`, or None.

    rho_d = drafter_ms[d] / verify_ms(k + 1); alpha = verify_batch_ms(2) / verify_batch_ms(1) - 1
    (docs/manifest.md); both curves are interpolated linearly between their measured points. The
    alpha of verifying more drafts together is `costs_for(...).alpha(K)`.
    """
    timing = (manifest or {}).get("timing")
    if not timing:
        return None
    where = f"manifest {manifest.get('run', '?')}: timing"
    try:
        k = int(manifest["k"])
        v = timing["verify_ms"]
        verify = float(np.interp(k + 1, np.asarray(v["tokens"], float), np.asarray(v["ms"], float)))
        b = timing["verify_batch_ms"]
        nb, mb = np.asarray(b["drafts"], float), np.asarray(b["ms"], float)
        alpha = float(np.interp(2, nb, mb) / np.interp(1, nb, mb) - 1.0)
        rho = {str(d): float(ms) / verify for d, ms in timing["drafter_ms"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: incomplete or malformed ({type(e).__name__}: {e}); see docs/manifest.md") from None
    if verify <= 0 or not all(math.isfinite(r) and r >= 0 for r in rho.values()):
        raise InputError(f"{where}: verify_ms must be > 0 and drafter_ms >= 0")
    return rho, max(alpha, 0.0)


# ---------------------------------------------------------------- from logs


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        print(said)
        print(costs_for(t.drafters, t.manifests[0] if t.manifests else None).describe())
        print(
            "what-if break-even drafter cost rho* (every drafter costing rho, one alternative, alpha 0), "
            "by token gain g and redraft rate R:"
        )
        for g in (0.02, 0.05, 0.10):
            rs = (0.1, 0.3, 0.5)
            print(
                f"  g {g:.2f}: "
                + ", ".join(f"R {r:.2f} -> {breakeven_rho(g, r, 1, 0.0) or float('nan'):.3f}" for r in rs)
            )

    demo(body, "The campaign's costs (rho, alpha) and the what-if break-even drafter cost.")
