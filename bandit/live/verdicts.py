"""Live verdicts: does choosing pay, measured? Every live configuration's tokens/s and speedups, with CIs.

From the live phase alone (`live.jsonl`, bandit/live/livelog.py), per workload and pooled (docs/DESIGN.md,
"Live verdicts"):

- `live_tokens_per_s[<config>]`: measured tokens/s = output tokens summed over the configuration's
  decodes / wall time summed (per workload: `live_tokens_per_s[<workload>][<config>]`);
- `live_speedup_over_plain[<config>]`: its tokens/s over plain decoding's (the target's own greedy loop);
  absent when the live phase has no `plain` decodes;
- `live_speedup_over_fastest_fixed[<config>]`: its tokens/s over the fastest fixed drafter's, the fastest
  (highest measured tokens/s; per workload: within it) re-chosen in every resample and named in the entry;
- `live_fastest_fixed_over_plain`: the fastest fixed drafter's speedup over plain (re-chosen likewise);
- `choosing_pays`: the best adaptive configuration's tokens/s over the fastest fixed drafter's, both
  re-chosen in every resample; adaptive = best-of-N (every drafter drafts, the longest accepted advances:
  not a policy, listed because it adapts per block) and every `policy:<name>`. The entry names the
  configuration and the fastest fixed drafter of the point estimate and its verdict: "yes" when the
  interval lies above 1, "no" when below, "not resolved" when it straddles 1.

Each entry's `n_clusters` counts the live prompts it reads, `n_blocks` the target passes of the decodes it
reads. Intervals: 95% bootstrap over the live prompts resampled within workloads, with the project's stratified
stream (bandit/stats/resample.py; clusters in the dense table's prompt order, so the same resamples as the
measured intervals of bandit/wallclock.py), the seed and resample count of ci.json's other entries.

    python bandit/live/verdicts.py [RUN]      # the live verdict table of a run (default: the default campaign)
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as `python bandit/live/verdicts.py`: import our `bandit`, not a namesake
    import pathlib
    import sys

    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import hashlib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from bandit.stats.bootstrap import Entry, boot_totals, degenerate, interval
from bandit.live.livelog import LIVE_FILE, load_live
from bandit.logs.reader import LogError
from bandit.logs.schema import BEST_OF_N, FIXED, PLAIN, POLICY
from bandit.logs.table import BlockTable

POOLED = "pooled"
LABEL = "MEASURED"
FASTEST_RULE = (
    "the fixed drafter of highest measured tokens/s over the live sample (per workload: within it; first in name "
    "order on ties), re-chosen in every resample"
)
ADAPTIVE_RULE = (
    "adaptive: best_of_n (not a policy: every drafter drafts and the longest accepted advances) and every policy:*"
)


@dataclass(frozen=True)
class LiveEntry(Entry):
    """An Entry of ci.json from the live phase: its inputs add live.jsonl; `extra` names what it compares."""

    extra: Mapping = field(default_factory=dict)
    live_inputs: tuple = ()

    def to_json(self, inputs: list[dict], code_version: str) -> dict:
        return {**super().to_json([*inputs, *self.live_inputs], code_version), **self.extra}


def is_adaptive(config: str) -> bool:
    return config == BEST_OF_N or config.startswith(POLICY)


def verdict(lo, hi) -> str:
    """Did choosing pay? From the interval of a speedup over the fastest fixed drafter."""
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return "not resolved (no CI)"
    return "yes" if lo > 1 else "no" if hi < 1 else "not resolved"


def evaluate(
    t: BlockTable,
    live: Sequence[dict],
    live_path: Path | str = LIVE_FILE,
    n_resamples: int = 2000,
    seed: int = 0,
    method: str = "percentile",
) -> list[LiveEntry]:
    """Every live verdict entry (module docstring) of the decodes `live` (read_live's lines) of table t's prompts."""
    index = {name: i for i, name in enumerate(t.prompt_ids)}
    for r in live:
        if f"{r['workload']}/{r['prompt_id']}" not in index:
            raise LogError(
                live_path, r.get("_line", 0), "prompt_id", f"{r['workload']}/{r['prompt_id']} is not in the log"
            )
    configs = list(dict.fromkeys(r["config"] for r in live))
    fixed = sorted(c for c in configs if c.startswith(FIXED))
    adaptive = [c for c in configs if is_adaptive(c)]
    if not fixed:
        return []  # nothing to be fast against: the verdicts need at least one fixed drafter
    wl_of = np.zeros(t.n_prompts, np.int64)
    wl_of[t.prompt] = t.workload
    clusters = sorted({index[f"{r['workload']}/{r['prompt_id']}"] for r in live})
    col = {p: i for i, p in enumerate(clusters)}
    strata = wl_of[clusters]
    scopes = [None, *sorted(set(strata.tolist()))]  # pooled, then each workload of the sample
    S, C, P = len(scopes), len(configs), len(clusters)
    tot = np.zeros((P, S, C, 3))  # per cluster, scope, configuration: output tokens, wall ms, target passes
    for r in live:
        i, c = col[index[f"{r['workload']}/{r['prompt_id']}"]], configs.index(r["config"])
        v = (r["tokens"], r["wall_ms"], r["passes"])
        tot[i, 0, c] += v
        tot[i, scopes.index(int(strata[i])), c] += v
    ip = configs.index(PLAIN) if PLAIN in configs else None
    jf = [configs.index(c) for c in fixed]
    ja = [configs.index(c) for c in adaptive]

    def stats(T: np.ndarray) -> dict[str, np.ndarray]:
        A = T.reshape(len(T), S, C, 3)
        tps = 1000 * A[..., 0] / A[..., 1]  # (n, S, C)
        fx = tps[..., jf]
        fastest = fx.max(-1)
        out = {"tps": tps, "over_fast": tps / fastest[..., None], "fi": np.argmax(fx, -1).astype(float)}
        if ip is not None:
            out |= {"over_plain": tps / tps[..., ip : ip + 1], "fast_over_plain": fastest / tps[..., ip]}
        if ja:
            ad = tps[..., ja]
            out |= {"choosing": ad.max(-1) / fastest, "bi": np.argmax(ad, -1).astype(float)}
        return out

    shapes = {k: v.shape[1:] for k, v in stats(tot.sum(0).reshape(1, -1)).items()}
    offs = np.cumsum([0] + [int(np.prod(s)) for s in shapes.values()])
    flat = lambda T: np.concatenate([v.reshape(len(T), -1) for v in stats(T).values()], 1)
    value, boot, jack = boot_totals(tot.reshape(P, -1), flat, strata, n_resamples, seed, jackknife=method == "bca")
    part = lambda a, k: a[..., offs[list(shapes).index(k)] : offs[list(shapes).index(k) + 1]].reshape(
        *a.shape[:-1], *shapes[k]
    )
    V = {k: part(value, k) for k in shapes}
    B = {k: part(boot, k) for k in shapes}
    J = {k: part(jack, k) for k in shapes} if jack is not None else {}
    point = tot.sum(0)  # (S, C, 3)
    n_in = [P, *[int((strata == w).sum()) for w in scopes[1:]]]
    live_inputs = ({"path": str(live_path), "sha256": _sha256(live_path)},)
    out: list[LiveEntry] = []

    def add(name, key, s, j, reads, **extra):
        ix = (s,) if j is None else (s, j)
        ci = interval(
            float(V[key][ix]),
            B[key][(slice(None), *ix)],
            J[key][(slice(None), *ix)] if J else None,
            method,
            "prompt",
            seed,
        )
        scope = POOLED if scopes[s] is None else t.workloads[scopes[s]]
        full = name if scopes[s] is None else name.replace("[", f"[{scope}][", 1) if "[" in name else f"{name}[{scope}]"
        e = LiveEntry(
            full,
            ci,
            int(point[s, reads, 2].sum()),  # n_blocks: the target passes of the decodes read
            n_in[s],
            LABEL,
            extra={"workload": scope, "n_decodes": n_in[s] * len(reads), **extra},
            live_inputs=live_inputs,
        )
        alone = max(n_in[1:]) < 2 if s == 0 else n_in[s] < 2  # pooled: every workload of the sample
        e = degenerate(
            e, f"no CI: one live prompt in {scope}, so every resample is the sample itself" if alone else None
        )
        if key == "choosing":
            e = replace(e, extra={**e.extra, "verdict": verdict(e.ci.lo, e.ci.hi)})
        out.append(e)

    for s in range(S):
        f_idx = int(V["fi"][s])
        fast = {
            "fastest_fixed": fixed[f_idx],
            "fastest_fixed_share": round(float(np.mean(B["fi"][:, s] == f_idx)), 4),
            "rule": FASTEST_RULE,
        }
        for c, name in enumerate(configs):
            add(f"live_tokens_per_s[{name}]", "tps", s, c, [c], config=name)
            if ip is not None and c != ip:
                add(f"live_speedup_over_plain[{name}]", "over_plain", s, c, [c, ip], config=name, reference=PLAIN)
            add(f"live_speedup_over_fastest_fixed[{name}]", "over_fast", s, c, sorted({c, *jf}), config=name, **fast)
        if ip is not None:
            add("live_fastest_fixed_over_plain", "fast_over_plain", s, None, [*jf, ip], reference=PLAIN, **fast)
        if ja:
            b_idx = int(V["bi"][s])
            add(
                "choosing_pays",
                "choosing",
                s,
                None,
                [*ja, *jf],
                config=adaptive[b_idx],
                best_share=round(float(np.mean(B["bi"][:, s] == b_idx)), 4),
                adaptive=adaptive,
                adaptive_rule=ADAPTIVE_RULE,
                **fast,
            )
    return out


def _sha256(path: Path | str) -> str:
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""


def live_file(t: BlockTable) -> tuple[Path | None, str]:
    """(the live.jsonl of the one run t was read from, or None and why there is none)."""
    dirs = sorted({Path(s.path).parent for s in t.sources})
    if len(dirs) != 1:
        return None, "the logs read are not one run directory, so there is no one live phase"
    path = dirs[0] / LIVE_FILE
    if not path.is_file():
        return None, f"{dirs[0]} has no {LIVE_FILE} (sweep.py --live-prompts N decodes a live sample)"
    return path, ""


def run_entries(t: BlockTable, n_resamples: int = 2000, seed: int = 0, method: str = "percentile") -> list[LiveEntry]:
    """The live verdicts of the run t was read from ([] when it has no live phase: `note` says why)."""
    path, _ = live_file(t)
    return [] if path is None else evaluate(t, load_live(path.parent, t), path, n_resamples, seed, method)


def note(t: BlockTable, by: Mapping[str, Mapping]) -> str:
    """One line saying which live verdicts are absent and why ("" when none is). by: the entries by name."""
    path, why = live_file(t)
    if path is None:
        return f"live verdicts: none ({why})"
    if not any(n.startswith("live_tokens_per_s[") for n in by):
        return f"live verdicts: none ({path} decodes no fixed drafter to compare with)"
    missing = []
    if not any(n.startswith("live_speedup_over_plain[") for n in by):
        missing.append("no plain decodes, so no speedup over plain (live_speedup_over_plain absent)")
    if "choosing_pays" not in by:
        missing.append("no adaptive configuration decoded, so no choosing_pays")
    return f"live verdicts of {path}: " + "; ".join(missing) if missing else ""


# ---------------------------------------------------------------- tables (from ci.json's entries, as dicts)


def _cell(e: Mapping | None, nd: int = 3) -> str:
    if e is None:
        return "n/a"
    if e["value"] is None:
        return e.get("warning") or "undefined"
    lo, hi = e["ci"]
    ci = f" [{lo:.{nd}f}, {hi:.{nd}f}]" if lo is not None and hi is not None else " (no CI)"
    return f"{e['value']:.{nd}f}{ci}"


def scopes_of(by: Mapping[str, Mapping]) -> list[str]:
    """The workloads of the live verdicts, sorted, then `pooled`; [] when ci.json has none."""
    wls = sorted(
        {e["workload"] for n, e in by.items() if n.startswith("live_tokens_per_s[") and e["workload"] != POOLED}
    )
    return [*wls, POOLED] if any(n.startswith("live_tokens_per_s[") for n in by) else []


def _key(name: str, scope: str, config: str | None = None) -> str:
    return name + ("" if scope == POOLED else f"[{scope}]") + (f"[{config}]" if config else "")


def headline_table(by: Mapping[str, Mapping]) -> str:
    """The one table that answers the question (markdown): per workload and pooled, plain tokens/s, the fastest
    fixed drafter and its speedup over plain, the best adaptive configuration and its speedup over the
    fastest fixed drafter, and whether choosing paid. `by`: ci.json's entries by name."""
    scopes = scopes_of(by)
    if not scopes:
        return ""
    out = [
        "| workload | plain decoding, tokens/s [MEASURED] | fastest fixed drafter | its speedup over plain "
        "[MEASURED] | best adaptive configuration | its speedup over the fastest fixed drafter [MEASURED] | "
        "choosing paid? |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scopes:
        plain = by.get(_key("live_tokens_per_s", s, PLAIN))
        fast_e = by.get(_key("live_fastest_fixed_over_plain", s)) or next(
            e for n, e in by.items() if n.startswith(_key("live_speedup_over_fastest_fixed", s) + "[")
        )
        ch = by.get(_key("choosing_pays", s))
        fast = f"{fast_e['fastest_fixed'][len(FIXED) :]} (in {100 * fast_e['fastest_fixed_share']:.0f}% of resamples)"
        row = [
            s,
            _cell(plain, 1) if plain else "not decoded",
            fast,
            _cell(by.get(_key("live_fastest_fixed_over_plain", s))) if plain else "n/a (no plain decodes)",
            f"{ch['config']} (in {100 * ch['best_share']:.0f}% of resamples)" if ch else "none decoded live",
            _cell(ch) if ch else "n/a",
            ch["verdict"] if ch else "n/a",
        ]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def order(config: str) -> tuple[int, str]:
    """The live phase's order of configurations (plain, fixed, best-of-N, policies), names sorted within each."""
    kinds = (PLAIN, FIXED, BEST_OF_N, POLICY)
    return next(
        (i for i, k in enumerate(kinds) if config == k or (k.endswith(":") and config.startswith(k))), 4
    ), config


def grid(by: Mapping[str, Mapping], name: str, nd: int = 3) -> str:
    """Every live configuration (rows) by workload and pooled (columns) of one family of entries (markdown)."""
    scopes = scopes_of(by)
    configs = sorted({e["config"] for n, e in by.items() if n.startswith(name + "[") and "config" in e}, key=order)
    if not scopes or not configs:
        return ""
    out = ["| configuration | " + " | ".join(scopes) + " |", "|---|" + "---|" * len(scopes)]
    for c in configs:
        out.append(f"| {c} | " + " | ".join(_cell(by.get(_key(name, s, c)), nd) for s in scopes) + " |")
    return "\n".join(out)


def report(by: Mapping[str, Mapping]) -> str:
    """The headline table, then every configuration's tokens/s and speedups (markdown, from ci.json's entries)."""
    head = headline_table(by)
    if not head:
        return ""
    parts = [
        "Does choosing pay, measured? Live phase, 95% CIs over prompts resampled within workloads; the fastest "
        f"fixed drafter: {FASTEST_RULE}; {ADAPTIVE_RULE}; choosing paid: yes when the interval lies above 1, no "
        'when below, not resolved when it straddles 1 (docs/DESIGN.md, "Live verdicts").',
        head,
        "Measured tokens/s (output tokens summed / wall time summed) [MEASURED]:",
        grid(by, "live_tokens_per_s", 1),
        "Speedup over the fastest fixed drafter [MEASURED]:",
        grid(by, "live_speedup_over_fastest_fixed"),
    ]
    over_plain = grid(by, "live_speedup_over_plain")
    if over_plain:
        parts += ["Speedup over plain decoding [MEASURED]:", over_plain]
    return "\n\n".join(parts)


if __name__ == "__main__":
    from bandit.logs.reader import demo, load_logs

    def body(files, said: str) -> None:
        t = load_logs(files)
        by = {e.name: e.to_json([], "") for e in run_entries(t)}
        print("\n\n".join(x for x in (report(by), note(t, by)) if x))

    demo(body, "The live verdicts: does choosing pay, measured? (the tables ci.json's entries make)")
