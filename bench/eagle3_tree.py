"""What a tree of drafts would give the EAGLE-3 head in tokens per target pass, measured on a campaign's own outputs
(issue 33's missed target: 2.0 tokens per pass pooled at k = 4).

    python bench/eagle3_tree.py [--run RUN] [--drafter eagle3] [--nodes 4,8,12,16,24,32] [--resamples 2000]
        [--seed 0] [--threads N] [--pass-cost bench/pass_cost_smollm2.json] [--json FILE]

Why a tree. The campaign's drafters propose one chain of k tokens, and the head's first token is often wrong;
EAGLE-2/3 and Medusa verify a tree instead (several candidates per depth, each node attending to its ancestors), and
every speedup they publish is a tree's. A tree of N nodes makes the verify pass N + 1 tokens wide: what that costs on
a host is `python bench/pass_cost.py`'s to measure. With `--pass-cost FILE` (its JSON, same target) each row also
gets a [MODEL] time per output token relative to the chain's: (verify(N+1) / verify(k+1) + c) / (1 + c) times the
chain's tokens per pass over the row's, the verify times those FILE measured (linear between its sizes), c the
drafter's call over a (k+1)-token pass in the run's timing model (`wallclock.json`), a tree's draft call taken to
cost the chain's (one head step per depth, the depth's nodes batched). Below 1: the tree would be faster.

What is measured. Under greedy verification a tree accepts the deepest node on the target's own path: a node
accepted at depth d is the target's token there, and the head computed it from the target's tokens above it. So the
head's ranks of the target's tokens along that path decide every tree at once: at each origin of the run's dense
outputs, depth s's rank is the rank of the target's token among the head's draft-vocabulary logits, the head fed
the target's tokens before it (training-time test's teacher forcing: the same mask as the harness's dense chains,
harness/drafters/model.chain_allow). A chain of k accepts the leading run of rank 0; a static tree (a set of rank
paths closed under prefixes, Medusa's and EAGLE-1's kind) accepts the longest prefix of the ranks it contains. Each
tree of N nodes is the N most frequent rank paths of depth <= k, built on half of each workload's prompts and
scored on the other half, both ways (cross-fitted: no prompt scores a tree built on it). Tokens per pass walk each
prompt's own trajectory (one pass, then the accepted tokens and the target's own), as replay.txt counts them; the
chain's figures are printed beside the run's ci.json figures as the check that the ranks are the harness's drafts.
Intervals: 95% percentile bootstrap over prompts within workloads (bandit/stats/bootstrap.py). [MEASURED]: real
outputs and a real head; what is not measured is a tree's own live cost (its wider verify pass, and its draft calls:
one head step per depth, batched over the depth's nodes). A drafter with `stop_below` is refused: its drafts are the
chain cut by its confidence, which the ranks do not see.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError
from bandit.logs.outputs import show
from bandit.logs.reader import published_campaign

DEFAULT_RUN = REPO / (published_campaign() or "runs")
MISS = 1 << 30  # a target token outside the draft vocabulary: no tree holds it
PAST = MISS + 1  # beyond the output's end: the trajectory stops there (not a miss)
NODES = "4,8,12,16,24,32"


def ranks(target, head, ids: list[int], n_prompt: int, k: int):
    """(n_out, k) int64: at output origin p (prefix ids[:n_prompt + p]) the rank of the target's token
    ids[n_prompt + p + s] at depth s (0-based) among the head's logits, the head fed the target's tokens before it;
    MISS where that token is not in the draft vocabulary, PAST where it lies beyond the output."""
    import torch

    from harness.models import lm

    x = torch.tensor(ids)
    N, Q = len(ids), len(ids) - 1
    _, taps = lm.forward(target, x, lm.new_cache(), taps=head.keys)
    g = torch.cat([taps[key] for key in head.keys], -1).float()
    V = int(target.get_output_embeddings().weight.shape[0])
    Vd = int(head.lm_head.weight.shape[0])
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[head.to_target(torch.arange(Vd))] = torch.arange(Vd)
    j = torch.arange(Q)
    causal = j[None, :] <= j[:, None]
    eye = torch.eye(Q, dtype=torch.bool)
    xs = torch.cat([x, torch.zeros(k + 2, dtype=torch.long)])
    out = np.full((Q, k), PAST, dtype=np.int64)
    h, kv = head.fuse(g[:Q])[None], None
    with torch.no_grad():
        for s in range(k):  # pair j = (state j, token j+1) at position j+1; depth s predicts token j+2+s
            mask = None if s == 0 else torch.cat([causal] + [eye] * s, 1)[None, None]
            h, logits, kv = head.step(h, xs[j + 1 + s][None], (j + 1 + s)[None], kv, mask)
            lab = t2d[xs[j + 2 + s]]
            lg = logits[0]
            r = (lg > lg.gather(1, lab.clamp(min=0)[:, None])).sum(1).numpy()
            r = np.where(lab.numpy() < 0, MISS, r)
            out[:, s] = np.where((j + 2 + s <= N - 1).numpy(), r, PAST)
    return out[n_prompt - 2 : N - 2]  # origin p's pair index is n_prompt + p - 2, for p < N - n_prompt


def accepted(r: np.ndarray, tree: set) -> int:
    """Tokens a tree (a prefix-closed set of rank paths) accepts at an origin of ranks r (k,)."""
    a = 0
    for s in range(len(r)):
        if r[s] >= MISS or tuple(int(v) for v in r[: s + 1]) not in tree:
            break
        a += 1
    return a


def chain(k: int) -> set:
    return {(0,) * d for d in range(1, k + 1)}


def build(prompts: list[np.ndarray], n: int) -> set:
    """The n most frequent rank paths (ties: shallower, then smaller ranks) over every origin of `prompts`; closed
    under prefixes, since a path is never more frequent than its prefix (a tie is broken toward the prefix)."""
    c: Counter = Counter()
    for R in prompts:
        for r in R:
            for s in range(len(r)):
                if r[s] >= MISS:
                    break
                c[tuple(int(v) for v in r[: s + 1])] += 1
    tree: set = set()
    for path, _ in sorted(c.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])):
        if len(tree) == n:
            break
        if len(path) == 1 or path[:-1] in tree:
            tree.add(path)
    return tree


def walk(R: np.ndarray, tree: set) -> tuple[int, int]:
    """(output tokens, target passes) along one prompt's trajectory: each pass adds the accepted tokens and one of
    the target's own."""
    n, p, passes = len(R), 0, 0
    while p < n:
        p += accepted(R[p], tree) + 1
        passes += 1
    return n, passes


def halves(keys: list[tuple[str, str]]) -> list[int]:
    """0/1 per prompt: alternate prompts of each workload, in the run's order."""
    seen: Counter = Counter()
    out = []
    for w, _ in keys:
        out.append(seen[w] % 2)
        seen[w] += 1
    return out


def tokens_per_pass(R: list[np.ndarray], keys, trees_by_half: list[set], resamples: int, seed: int) -> dict:
    """Per workload and pooled: tokens per pass with its interval; prompt i is walked with trees_by_half[half]."""
    from bandit.stats.bootstrap import bootstrap_ratio

    half = halves(keys)
    tot = np.array([walk(r, trees_by_half[h]) for r, h in zip(R, half)], float)
    wl = [w for w, _ in keys]
    names = sorted(set(wl))
    strata = np.array([names.index(w) for w in wl])
    res = {}
    for w in [*names, "pooled"]:
        m = np.ones(len(wl), bool) if w == "pooled" else strata == names.index(w)
        ci = bootstrap_ratio(tot[m, 0], tot[m, 1], strata[m], resamples, seed)
        res[w] = {"value": round(ci.value, 4), "ci": [round(ci.lo, 4), round(ci.hi, 4)]}
    return res


def crossfit(R: list[np.ndarray], keys, k: int, sizes: list[int], resamples: int, seed: int) -> tuple[dict, dict]:
    """({"chain" | "tree<N>": tokens_per_pass}, {"tree<N>": [the tree scoring half 0, the one scoring half 1]}): a
    prompt of half b is scored with the tree built on the other half's prompts."""
    half = halves(keys)
    split = [[r for r, h in zip(R, half) if h == b] for b in (0, 1)]
    figures = {"chain": tokens_per_pass(R, keys, [chain(k)] * 2, resamples, seed)}
    trees = {}
    for n in sizes:
        t = [build(split[1], n), build(split[0], n)]
        figures[f"tree{n}"] = tokens_per_pass(R, keys, t, resamples, seed)
        trees[f"tree{n}"] = [sorted(map(list, x)) for x in t]
    return figures, trees


def relative_time(figures: dict, sizes: dict, pass_ms: dict, call: float) -> dict:
    """{row: [MODEL] time per output token over the chain's} (see the module's doc): sizes {row: tokens a verify
    carries}, pass_ms {tokens: measured ms}, call the draft call's ms over a verify of the chain's size (same units)."""
    qs = sorted(pass_ms)
    base = float(np.interp(sizes["chain"], qs, [pass_ms[q] for q in qs]))
    out = {}
    for row, f in figures.items():
        v = float(np.interp(sizes[row], qs, [pass_ms[q] for q in qs])) / base
        out[row] = round((v + call) / (1 + call) * figures["chain"]["pooled"]["value"] / f["pooled"]["value"], 4)
    return out


def costs(run: Path, drafter: str, k: int, path: Path) -> tuple[dict, float]:
    """(pass_ms {tokens: ms} from a bench/pass_cost.py JSON, the drafter's call over a (k+1)-token pass in the run's
    timing model)."""
    from harness.campaign.shards import read_json

    pc, wc = read_json(path) or {}, read_json(run / "wallclock.json") or {}
    mine = Path(str(((read_json(run / "manifest.json") or {}).get("target") or {}).get("path"))).name
    if Path(str(pc.get("target"))).name != mine:
        raise InputError(f"--pass-cost {path}: timed target {pc.get('target')!r}, not the run's ({mine})")
    ms = {int(q): float(v) for q, v in (pc.get("measured_ms") or {}).items()}
    coef = (wc.get("model") or {}).get("coef_ms") or {}
    knots = {int(n[5:]): v for n, v in coef.items() if n.startswith("pass@")}
    if len(ms) < 2 or not knots or f"call:{drafter}" not in coef:
        raise InputError(f"--pass-cost {path}: no measured_ms, or {show(run)}/wallclock.json has no call:{drafter}")
    qs = sorted(knots)
    return ms, coef[f"call:{drafter}"] / float(np.interp(k + 1, qs, [knots[q] for q in qs]))


def read(run: Path, drafter: str) -> tuple[dict, list]:
    """(the run's manifest, [(workload, prompt_id, prompt ids, output ids)] from outputs*.jsonl in its order)."""
    from harness.campaign.outputs import read_lines
    from harness.campaign.shards import read_json

    manifest = read_json(run / "manifest.json") or {}
    d = (manifest.get("drafters") or {}).get(drafter)
    if not isinstance(d, dict) or d.get("kind") != "eagle3":
        have = [
            n for n, x in (manifest.get("drafters") or {}).items() if isinstance(x, dict) and x.get("kind") == "eagle3"
        ]
        raise UsageError(f"--drafter {drafter}: not an eagle3 drafter of {show(run)} ({', '.join(have) or 'none'})")
    if (d.get("settings") or {}).get("stop_below"):
        raise UsageError(f"--drafter {drafter}: its drafts are cut by stop_below, which the ranks do not see; "
                         "name the same head without it")  # fmt: skip
    rows = []
    for path in sorted(run.glob("outputs*.jsonl")):
        for rec, _ in read_lines(path):
            try:
                rows.append((rec["workload"], rec["prompt_id"], [int(t) for t in rec["prompt_ids"]],
                             [int(t) for t in rec["output_ids"]]))  # fmt: skip
            except (KeyError, TypeError, ValueError):
                raise InputError(f"{path}: a line without workload, prompt_id, prompt_ids or output_ids") from None
    if not rows:
        raise InputError(f"{show(run)}: no outputs*.jsonl lines")
    return manifest, rows


def ci_figures(run: Path, drafter: str) -> dict:
    """{workload: tokens per pass of `drafter` along its own trajectory} from the run's ci.json (the chain's check)."""
    import json

    pre, end = "tokens_per_pass[", f"][{drafter}]"
    p = run / "ci.json"
    try:
        entries = json.loads(p.read_text()) if p.exists() else []
    except (OSError, ValueError):
        raise InputError(f"{p}: unreadable") from None
    return {
        e["name"][len(pre) : -len(end)]: e["value"]
        for e in entries
        if e["name"].startswith(pre) and e["name"].endswith(end)
    }


def resolve(path: str, models: str | None, what: str) -> Path:
    from harness.models import lm

    p = REPO / path
    return p if not Path(path).is_absolute() and p.is_dir() else lm.resolve_model_dir(path, models, what)


def main(argv=None) -> None:
    ap = limits.Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None, help=f"a run with a dense phase (default {show(DEFAULT_RUN)})")
    ap.add_argument("--drafter", default="eagle3", help="an eagle3 drafter of the run (default eagle3)")
    ap.add_argument("--nodes", default=NODES, help=f"tree sizes, comma-separated, each 1..64 (default {NODES})")
    ap.add_argument("--models", default=None, help="models root (else $SPECBANDIT_MODELS, else the repository)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples, 100..100000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help=f"torch threads, {limits.THREADS_RANGE}")
    ap.add_argument("--pass-cost", help="a bench/pass_cost.py JSON of the run's target: adds [MODEL] relative times")
    ap.add_argument("--json", help="write the figures, the settings and the host to this file (its folder must exist)")
    a = ap.parse_args(argv)
    limits.integer("--resamples", a.resamples, 100, 100_000)
    limits.threads("--threads", a.threads)
    try:
        sizes = [int(s) for s in a.nodes.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--nodes {a.nodes}: expected comma-separated integers") from None
    if not sizes or any(not 1 <= s <= 64 for s in sizes):
        raise UsageError(f"--nodes {a.nodes}: each size in 1..64")
    out = limits.out_file("--json", a.json)
    run = DEFAULT_RUN if a.run is None else limits.path_value("--run", a.run)
    if not run.is_dir():
        raise UsageError(f"--run {run}: no such run directory")
    manifest, rows = read(run, a.drafter)
    k = int(manifest.get("k") or 4)
    check = ci_figures(run, a.drafter)
    cost = None if not a.pass_cost else costs(run, a.drafter, k, limits.path_value("--pass-cost", a.pass_cost))

    import torch
    from tqdm import tqdm

    from harness.campaign.manifest import hardware as manifest_hw
    from harness.models import eagle3, kernels, lm

    if a.threads:
        torch.set_num_threads(a.threads)
    tpath = resolve(str((manifest.get("target") or {}).get("path")), a.models, "the run's target")
    target = lm.load_lm(tpath)
    kern = (manifest.get("kernels") or {}).get("kernels")
    if kern and kern != "default":
        kernels.apply_kernels(target, kern)  # the run's forwards: the ranks are of its states
    hpath = resolve(str(manifest["drafters"][a.drafter]["settings"]["path"]), a.models, f"--drafter {a.drafter}")
    head = eagle3.load(hpath, target, f"--drafter {a.drafter}")
    t0 = time.time()
    R, keys = [], []
    for w, p, pids, oids in tqdm(rows, desc="ranks along the target's path", unit="prompt", file=sys.stderr):
        R.append(ranks(target, head, pids + oids, len(pids), k))
        keys.append((w, p))
    figures, trees = crossfit(R, keys, k, sizes, a.resamples, a.seed)
    rel = None if cost is None else relative_time(figures, {"chain": k + 1} | {f"tree{n}": n + 1 for n in sizes}, *cost)
    hw = manifest.get("hardware") or {}
    workloads = [w for w in figures["chain"] if w != "pooled"] + ["pooled"]
    print(
        f"# {a.drafter}'s head on {show(run)}'s {len(R)} dense outputs, k = {k}: tokens per target pass along each "
        f"prompt's trajectory [MEASURED], a chain and static trees of N nodes (cross-fitted halves); 95% percentile "
        f"bootstrap over prompts within workloads, {a.resamples} resamples, seed {a.seed}; {time.time() - t0:.0f} s on "
        f"this host ({torch.get_num_threads()} threads)"
    )
    print(
        "chain check, here / ci.json: "
        + "; ".join(f"{w} {figures['chain'][w]['value']:.3f} / {v:.3f}" for w, v in check.items())
    )
    extra = [] if rel is None else [f"time per token over the chain's [MODEL, {a.pass_cost}]"]
    print("| drafts | " + " | ".join(workloads + extra) + " |")
    print("|---|" + "---|" * len(workloads + extra))
    for name, f in figures.items():
        cells = [f"{f[w]['value']:.3f} [{f[w]['ci'][0]:.3f}, {f[w]['ci'][1]:.3f}]" for w in workloads]
        print(f"| {name} | " + " | ".join(cells + ([] if rel is None else [f"{rel[name]:.3f}"])) + " |")
    if out is not None:
        cmd = " ".join(["python bench/eagle3_tree.py", *(sys.argv[1:] if argv is None else argv)])
        limits.write_json(out, {
            "command": cmd, "label": "MEASURED", "run": show(run), "drafter": a.drafter, "k": k,
            "head_sha256": lm.weights_sha256(hpath), "prompts": len(R), "ci_chain": check,
            "ci": "95% percentile bootstrap over prompts within workloads", "resamples": a.resamples,
            "seed": a.seed, "run_hardware": hw, "hardware": manifest_hw("cpu"), "threads": torch.get_num_threads(),
            "wall_s": round(time.time() - t0, 1), "tokens_per_pass": figures, "trees": trees,
            "relative_time": rel, "relative_time_label": None if rel is None else "MODEL", "pass_cost": a.pass_cost,
        })  # fmt: skip
        print(f"wrote {out}")


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
