"""A chain drafter that stops its draft at its own low confidence (`stop_below`), decoded live beside the same
drafter without the rule and beside plain decoding, on a campaign's live sample (issue 33).

    python bench/early_stop.py [--run RUN] [--drafter eagle3] [--stop 0.4] [--workloads W1,W2]
        [--per-workload N] [--resamples 2000] [--seed 0] [--json FILE]

An EAGLE-style drafter pays one head step per drafted token, and on open chat its later tokens are rarely accepted.
`stop_below=c` (harness/drafters/model.py) ends the chain after the first token whose confidence is below c, as
transformers' assisted generation does with `assistant_confidence_threshold`. The default c = 0.4 is transformers'
own default for it, fixed before any measurement here, so that nothing is tuned on the prompts it is judged on.

What runs: the run's target and drafter `--drafter` as its manifest records them (path and batch; the kernel path
and thread count of the run's forwards), and the same drafter with `stop_below`. Three configurations take turns on
each prompt (harness/decode/livephase.decode, without best-of-N): `plain`, `fixed:<drafter>` and
`fixed:<drafter>_stop`. The prompts are the run's live sample (the prompts of live.jsonl's plain rows), the first
`--per-workload` of each workload in `--workloads`; each decode's output must equal the run's dense output (greedy),
else the bench stops. Speedups are ratios of tokens per second (output tokens summed over wall time summed), with
95% percentile bootstrap intervals over prompts resampled within workloads. Every figure is [MEASURED] on this host
in this one run; the run's own live figures come from another session and are not mixed in. Nothing else may run
beside it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs import limits
from bandit.logs.errors import InputError, UsageError
from bandit.logs.outputs import show
from bandit.logs.reader import published_campaign

TRANSFORMERS_DEFAULT = 0.4  # transformers' GenerationConfig assistant_confidence_threshold
CHAIN_KINDS = ("draft", "layerskip", "eagle", "eagle3")
# the settings a manifest records that are the drafter's own (eagle3's info adds its layer ids as "layers")
KEEP = {"layerskip": ("layers", "batch")}
DEFAULT_RUN = REPO / (published_campaign() or "runs")
STATS = ("speedup", "speedup_stop", "stop_over_full", "tokens_per_pass", "tokens_per_pass_stop")


def read_run(run: Path) -> tuple[dict, list[tuple[str, str]], dict]:
    """(manifest with the run's settings.json under "settings", the live sample in decode order,
    {(workload, prompt_id): (prompt ids, dense output ids)})."""
    from harness.campaign.shards import read_json

    manifest = read_json(run / "manifest.json") or {}
    if not isinstance(manifest.get("drafters"), dict):
        raise InputError(f"{run}/manifest.json: no drafters")
    manifest["settings"] = read_json(run / "settings.json") or {}
    for key in ("k", "max_new_tokens", "temperature", "seed", "dtype", "device"):
        if key not in manifest["settings"]:
            raise InputError(f"{run}/settings.json: no {key}")
    from bandit.live.livelog import read_live
    from harness.campaign.outputs import read_lines

    sample = [(r["workload"], r["prompt_id"]) for r in read_live(run) if r["config"] == "plain"]
    texts = {}
    for path in sorted(run.glob("outputs*.jsonl")):
        for rec, _ in read_lines(path):
            try:
                texts[(rec["workload"], rec["prompt_id"])] = ([int(x) for x in rec["prompt_ids"]], rec["output_ids"])
            except (KeyError, TypeError, ValueError):
                raise InputError(f"{path}: a line without prompt_ids") from None
    missing = [k for k in sample if k not in texts]
    if missing:
        raise InputError(f"{run}: live prompt {missing[0][0]}/{missing[0][1]} has no line in outputs*.jsonl")
    return manifest, sample, texts


def chosen(sample, workloads: list[str] | None, per_workload: int | None) -> list[tuple[str, str]]:
    """The first per_workload sampled prompts of each named workload (all workloads: None), in decode order."""
    have = sorted({w for w, _ in sample})
    if workloads:
        unknown = [w for w in workloads if w not in have]
        if unknown:
            raise UsageError(f"--workloads {unknown[0]}: not in the live sample ({', '.join(have)})")
    seen: dict[str, int] = {}
    out = []
    for w, p in sample:
        if (workloads and w not in workloads) or seen.get(w, 0) >= (per_workload or 1 << 30):
            continue
        seen[w] = seen.get(w, 0) + 1
        out.append((w, p))
    return out


def parse_pad(text: str | None) -> dict[int, int]:
    """--pad Q:Q'[,...] -> {Q: Q'} (harness.models.options.pad_of), a bad one a UsageError."""
    from harness.models import options
    from harness.models.lm import HarnessError

    try:
        return options.pad_of(text, "--pad")
    except HarnessError as e:
        raise UsageError(str(e)) from None


def spec_of(manifest: dict, name: str, stop: float | None) -> str:
    d = manifest["drafters"].get(name)
    if not isinstance(d, dict):
        raise UsageError(f"--drafter {name}: not a drafter of the run ({', '.join(sorted(manifest['drafters']))})")
    if d.get("kind") not in CHAIN_KINDS:
        raise UsageError(
            f"--drafter {name}: kind {d.get('kind')!r} drafts in one forward; stop_below is for {', '.join(CHAIN_KINDS)}"
        )
    settings = {k: v for k, v in (d.get("settings") or {}).items() if k in KEEP.get(d["kind"], ("path", "batch"))}
    if isinstance(settings.get("path"), str) and not Path(settings["path"]).is_absolute():
        settings["path"] = str(REPO / settings["path"])  # as the run named it, from the repository
    if stop is not None:
        settings["stop_below"] = stop
    body = ",".join(f"{k}={v}" for k, v in settings.items())
    return f"{name}{'_stop' if stop is not None else ''}={d['kind']}" + (f":{body}" if body else "")


def decode(
    manifest: dict,
    specs: list[str],
    prompts,
    outputs: dict,
    threads: int | None,
    progress=None,
    verify_pad: str | None = None,
):
    """(live.jsonl-shaped lines of plain and each spec's fixed configuration, taking turns on every prompt; the
    worker's info: hardware and kernels). The run's settings: k, output length, temperature, seed, dtype, device;
    `verify_pad`: the worker's padding (harness/campaign/worker.py: a table, or "auto", measured by the worker)."""
    from harness.campaign.worker import Plan, Worker
    from harness.decode import livephase
    from harness.drafters import parse_spec

    target = manifest.get("target", {}).get("path")
    if not isinstance(target, str):
        raise InputError("manifest.json: no target.path")
    hw, kern, st = manifest.get("hardware") or {}, manifest.get("kernels") or {}, manifest["settings"]
    plan = Plan(
        str(REPO / target) if not Path(target).is_absolute() else target,
        [parse_spec(s) for s in specs],
        mode="dense",  # the worker's own engine holds every drafter; the decodes run on live engines of their own
        k=int(st["k"]),
        max_new_tokens=int(st["max_new_tokens"]),
        temperature=float(st["temperature"]),
        seed=int(st["seed"]),
        device=str(st["device"]),
        dtype=str(st["dtype"]),
        threads=threads or hw.get("threads"),
        kernels=kern.get("requested") or "default",
        verify_pad=verify_pad,
    )
    w = Worker(plan)
    kern = w.info["kernels"]
    w.info["verify_pad"], w.info["pass_ms"] = kern.get("verify_pad", {}), kern.get("pass_ms")
    lines = []
    keys = {(wl, pid) for wl, pid, _ in prompts}
    for _, _, got in livephase.decode(
        w.target, w.drafters, prompts, outputs, w.plan.config(), keys, set(), best_of_n=False
    ):
        lines += got
        if progress:
            progress()
    return lines, w.info


def summarize(lines: list[dict], name: str, workloads: list[str], resamples: int, seed: int) -> dict:
    """Per workload and pooled: each statistic with its 95% bootstrap interval over prompts within workloads."""
    import numpy as np

    from bandit.stats.bootstrap import boot_totals, interval

    full, stop = f"fixed:{name}", f"fixed:{name}_stop"
    by = {}
    for rec in lines:
        by.setdefault((rec["workload"], rec["prompt_id"]), {})[rec["config"]] = rec
    keys = [k for k in by if k[0] in workloads]

    def cols(c):
        return [[by[k][c][f] for k in keys] for f in ("tokens", "wall_ms", "passes")]

    tp, wp, _ = cols("plain")
    tf, wf, pf = cols(full)
    ts, ws, ps = cols(stop)
    totals = np.array([tp, wp, tf, wf, pf, ts, ws, ps], float).T

    def stat(T):
        tp, wp, tf, wf, pf, ts, ws, ps = T.T
        rp, rf, rs = tp / wp, tf / wf, ts / ws
        return np.stack([rf / rp, rs / rp, rs / rf, tf / pf, ts / ps], 1)

    out = {}
    for w in [*workloads, "pooled"]:
        rows = [i for i, k in enumerate(keys) if w == "pooled" or k[0] == w]
        strata = np.array([sorted(workloads).index(keys[i][0]) for i in rows])
        value, boot, _ = boot_totals(totals[rows], stat, strata, resamples, seed, jackknife=False)
        calls = lambda c: sum(sum(by[keys[i]][c]["calls"].values()) for i in rows)
        dms = lambda c: sum(sum(by[keys[i]][c]["draft_ms"].values()) for i in rows)
        drafted = lambda c: sum(by[keys[i]][c]["verified"] - by[keys[i]][c]["passes"] for i in rows)  # beyond the trunk
        passes = lambda c: max(1, sum(by[keys[i]][c]["passes"] for i in rows))
        out[w] = {
            "prompts": len(rows),
            **{s: _iv(interval(value[j], boot[:, j], None, "percentile", "prompt", seed)) for j, s in enumerate(STATS)},
            "drafted_per_pass": round(drafted(full) / passes(full), 3),
            "drafted_per_pass_stop": round(drafted(stop) / passes(stop), 3),
            "ms_per_call": round(dms(full) / max(1, calls(full)), 3),
            "ms_per_call_stop": round(dms(stop) / max(1, calls(stop)), 3),
            "tokens_per_s_plain": round(1000 * totals[rows, 0].sum() / totals[rows, 1].sum(), 2),
        }
    return out


def dense_drafts(run: Path, name: str, keys) -> dict:
    """{(workload, prompt_id): {pos: the drafter's dense record}} for the sampled prompts, from the run's dense logs."""
    import gzip

    from harness.decode.livephase import dense_logs

    want, out = set(keys), {}
    for path in dense_logs(run):
        with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
            for i, raw in enumerate(f, 1):
                try:
                    rec = json.loads(raw)
                    key = (rec["workload"], rec["prompt_id"])
                    if key in want:
                        out.setdefault(key, {})[int(rec["pos"])] = rec["drafts"][name]
                except (ValueError, KeyError, TypeError):
                    raise InputError(f"{path}:{i}: not a dense record with the drafter {name}") from None
    missing = [k for k in keys if k not in out]
    if missing:
        raise InputError(f"{run}: no dense records of {missing[0][0]}/{missing[0][1]}")
    return out


def predict(run: Path, name: str, stop: float, keys, prompt_len: dict, workloads: list[str]) -> dict | None:
    """[MODEL] each workload's speedup over plain, with and without the rule, walked on the dense log with the run's
    timing model (wallclock.json: prefill, per prompt token, pass cost by tokens verified, the drafter's call). A
    stopped call is priced at its share of drafted tokens (call ms x tokens / k): the catch-up step is counted as
    one step. The rule is applied to the log's confidences, rounded to 6 decimals, where live compares unrounded
    ones: a confidence within 5e-7 under the threshold may be walked differently. None when the run has no fitted
    timing model."""
    from bench.pass_cost import fitted

    try:
        coef = json.loads((run / "wallclock.json").read_bytes().decode("utf-8"))["model"]["coef_ms"]
        call = float(coef[f"call:{name}"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    recs = dense_drafts(run, name, keys)
    k = max(len(d["tokens"]) for r in recs.values() for d in r.values())
    cost = fitted(run, list(range(1, k + 2)))
    if cost is None:
        return None
    fixed_ms = lambda key: float(coef.get("prefill", 0.0)) + float(coef.get("prompt_token", 0.0)) * prompt_len[key]
    walls: dict = {}
    for key in keys:
        pos, n = recs[key], max(recs[key]) + 1
        row = walls.setdefault(key[0], [0.0, 0.0, 0.0])
        row[0] += fixed_ms(key) + n * cost[1]
        for j, c in ((1, 0.0), (2, stop)):
            p, ms = 0, fixed_ms(key)
            while p < n:
                d = pos[p]
                L = next((i + 1 for i, x in enumerate(d["conf"]) if x < c), len(d["tokens"])) if c else len(d["tokens"])
                ms += cost[1 + L] + call * L / k
                p += min(d["accepted"], L) + 1
            row[j] += ms
    tot = [sum(walls[w][j] for w in workloads) for j in range(3)]
    out = {w: {"speedup": walls[w][0] / walls[w][1], "speedup_stop": walls[w][0] / walls[w][2]} for w in workloads}
    out["pooled"] = {"speedup": tot[0] / tot[1], "speedup_stop": tot[0] / tot[2]}
    return {w: {s: round(v, 4) for s, v in r.items()} for w, r in out.items()}


def _iv(iv) -> dict:
    return {"value": round(float(iv.value), 4), "lo": round(float(iv.lo), 4), "hi": round(float(iv.hi), 4)}


def render(summary: dict, name: str, stop: float, head: str, predicted: dict | None = None) -> str:
    f = lambda d: f"{d['value']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"
    lines = [
        head,
        f"| workload | prompts | plain tok/s | {name} over plain | {name} stop_below={stop} over plain | stop over "
        f"{name} | tokens/pass {name} | with stop | draft tokens/pass {name} | with stop | ms/call {name} | with stop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if predicted:
        lines[1] += " predicted [MODEL], without / with stop |"
        lines[2] += "---|"
    for w, r in summary.items():
        tail = f" {predicted[w]['speedup']:.3f} / {predicted[w]['speedup_stop']:.3f} |" if predicted else ""
        lines.append(
            f"| {w} | {r['prompts']} | {r['tokens_per_s_plain']} | {f(r['speedup'])} | {f(r['speedup_stop'])} | "
            f"{f(r['stop_over_full'])} | {r['tokens_per_pass']['value']:.3f} | {r['tokens_per_pass_stop']['value']:.3f} "
            f"| {r['drafted_per_pass']} | {r['drafted_per_pass_stop']} | {r['ms_per_call']} | {r['ms_per_call_stop']} |"
            + tail
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = limits.Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None, help=f"a run with a live phase (default {show(DEFAULT_RUN)})")
    ap.add_argument("--drafter", default="eagle3", help=f"a chain drafter of the run ({', '.join(CHAIN_KINDS)})")
    ap.add_argument(
        "--stop", type=float, default=TRANSFORMERS_DEFAULT, help="stop_below, in (0, 1] (default 0.4: transformers')"
    )
    ap.add_argument("--workloads", default=None, help="comma-separated (default: every workload of the live sample)")
    ap.add_argument("--per-workload", type=int, default=None, help="the first N sampled prompts of each (default all)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples, 100..100000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=None, help=f"torch threads, {limits.THREADS_RANGE} (default: the run's)"
    )
    ap.add_argument(
        "--pad",
        default=None,
        help="Q:Q'[,...]: run every one-chain verify of Q tokens as Q' (harness/models/target.py), for both drafters; "
        "auto: time the forwards of 1..k+1 tokens first and pad each size to the cheapest at or above it (pad_table)",
    )
    ap.add_argument("--json", help="write the table, the settings and the host to this file (its folder must exist)")
    a = ap.parse_args(argv)
    if not 0.0 < a.stop <= 1.0:
        raise UsageError(f"--stop {a.stop}: expected a number in (0, 1]")
    limits.integer("--resamples", a.resamples, 100, 100_000)
    limits.threads("--threads", a.threads)
    if a.per_workload is not None:
        limits.integer("--per-workload", a.per_workload, 1, 1 << 20)
    out = limits.out_file("--json", a.json)
    pad = {} if a.pad == "auto" else parse_pad(a.pad)
    run = DEFAULT_RUN if a.run is None else limits.path_value("--run", a.run)
    if not run.is_dir():
        raise UsageError(f"--run {run}: no such run directory")
    manifest, sample, texts = read_run(run)
    if pad and max(pad.values()) > int(manifest["settings"]["k"]) + 1:
        raise UsageError(f"--pad {a.pad}: a verify is at most k + 1 = {int(manifest['settings']['k']) + 1} tokens")
    workloads = [w for w in a.workloads.split(",") if w.strip()] if a.workloads else None
    keys = chosen(sample, workloads, a.per_workload)
    workloads = sorted({w for w, _ in keys})
    specs = [spec_of(manifest, a.drafter, None), spec_of(manifest, a.drafter, a.stop)]
    prompts = [(w, p, texts[(w, p)][0]) for w, p in keys]
    outputs = {(w, p): texts[(w, p)][1] for w, p in keys}
    predicted = predict(run, a.drafter, a.stop, keys, {(w, p): len(texts[(w, p)][0]) for w, p in keys}, workloads)
    if predicted is not None:  # before the decodes: the prediction they can falsify
        print(f"predicted from the dense log by {show(run)}'s timing model [MODEL]: speedup over plain, without / "
              f"with stop_below={a.stop}: " + "; ".join(f"{w} {r['speedup']:.3f} / {r['speedup_stop']:.3f}" for w, r in predicted.items()))  # fmt: skip
    from tqdm import tqdm

    t0 = time.time()
    with tqdm(total=len(prompts), desc="early stop, live", unit="prompt", file=sys.stderr) as bar:
        lines, info = decode(manifest, specs, prompts, outputs, a.threads, bar.update, a.pad)
    pad = {int(q): v for q, v in info["verify_pad"].items()}
    bad = [r for r in lines if not r["same_as_dense"]]
    if bad:
        raise InputError(
            f"{show(run)}: {bad[0]['config']} on {bad[0]['workload']}/{bad[0]['prompt_id']} decoded another output "
            "than the dense phase (greedy must not): no ratio is given"
        )
    summary = summarize(lines, a.drafter, workloads, a.resamples, a.seed)
    hw = info["hardware"]
    head = (
        f"# {a.drafter} with and without stop_below={a.stop}, and plain decoding, decoded live side by side on "
        f"{show(run)}'s live sample ({len(prompts)} prompts) [MEASURED]; {hw['cpu']}, {hw['threads']} threads, "
        f"torch {hw['torch']}, kernels {info['kernels'].get('kernels')}"
        + (f", verify padded {', '.join(f'{q}->{v}' for q, v in pad.items())}" if pad else "")
        + (f" (forward ms by tokens, measured first: {info['pass_ms']})" if info.get("pass_ms") else "")
        + f"; 95% percentile bootstrap over prompts "
        f"within workloads, {a.resamples} resamples, seed {a.seed}; {time.time() - t0:.0f} s"
    )
    print(render(summary, a.drafter, a.stop, head, predicted))
    if out is not None:
        cmd = " ".join(["python bench/early_stop.py", *(sys.argv[1:] if argv is None else argv)])
        obj = {
            "command": cmd,
            "label": "MEASURED",
            "run": show(run),
            "drafter": a.drafter,
            "stop_below": a.stop,
            "verify_pad": info["verify_pad"],
            "verify_pad_from": "measured before the decodes (pass_ms)" if a.pad == "auto" else "--pad",
            "pass_ms": info.get("pass_ms"),
            "specs": [s.replace(str(REPO) + "/", "") for s in specs],
            "prompts": [f"{w}/{p}" for w, p in keys],
            "hardware": hw,
            "kernels": info["kernels"],
            "resamples": a.resamples,
            "seed": a.seed,
            "ci": "95% percentile bootstrap over prompts within workloads",
            "wall_s": round(time.time() - t0, 1),
            "by_workload": summary,
            "predicted": predicted,
            "predicted_label": "MODEL: the dense log walked with the run's timing model (wallclock.json)",
        }
        limits.write_json(out, obj)
        print(f"wrote {out}")


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
