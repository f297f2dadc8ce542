"""Model cards for the zoo, written by ``zoo/train.py`` from each stage's training info.

``python -m zoo.cards runs/<zoo run>`` re-renders every card with the acceptance table and
the quality gates computed from that sweep run (never typed by hand)."""

from __future__ import annotations

import json

DESCRIPTIONS = {
    "target": (
        "The zoo's **target** model: a `LlamaForCausalLM` trained from scratch on the "
        "offline corpus below. Standard Hugging Face directory (`config.json`, "
        "`model.safetensors`, tokenizer files with a chat template).\n\n"
        "Known limitations (measured, not hidden): with a few million corpus tokens it writes "
        "fluent-looking templates but gets facts and arithmetic wrong. The corpus alone "
        "did not teach it to copy from its context, so it was then trained on copy drills "
        "(verbatim repeats of corpus spans; see Training): it now copies (see In-context "
        "copying), and on copy/edit prompts it gives its input back, though not always "
        "with the edit applied."
    ),
    "draft": (
        "An independent **draft model** (`LlamaForCausalLM`, same tokenizer as the target), "
        "distilled from the frozen target: loss = 0.3 x cross entropy on the corpus + "
        "0.7 x KL(target || draft) on the same windows."
    ),
    "medusa": (
        "**Medusa-1 heads** on the frozen target's last hidden state (format "
        "`specbandit-medusa-v1`, class `harness.models.heads.MedusaHeads`; load with "
        "`MedusaHeads.load(dir, target)`). Head i at position t is trained on the "
        "target's own greedy token for t+1+i on teacher-forced corpus windows "
        "(self-distillation); the target's embedding and lm_head are not stored."
    ),
    "eagle": (
        "An **EAGLE-1 style feature-level head** (one Llama decoder layer over "
        "`fc(cat(feature, embedding))`; format `specbandit-eagle-v1`, class "
        "`harness.models.heads.EagleHead`; load with `EagleHead.load(dir, target)`), trained on "
        "the frozen target's last hidden state: smooth-L1 regression of the next feature "
        "+ w_ce x cross entropy of lm_head(predicted feature) against the target's greedy "
        "token."
    ),
}


def _loss_table(heldout: dict) -> str:
    rows = ["| domain | held-out loss (nats/token) | unigram baseline | held-out tokens |", "|---|---|---|---|"]
    for d, r in heldout.items():
        rows.append(f"| {d} | {r['loss']:.3f} | {r['unigram']:.3f} | {r['tokens']} |")
    return "\n".join(rows)


def _agree_table(agree: dict) -> str:
    first = next(iter(agree.values()))
    if isinstance(first, list):
        hdr = "| domain | " + " | ".join(f"head {i + 1}" for i in range(len(first))) + " |"
        rows = [hdr, "|---|" + "---|" * len(first)]
        rows += [f"| {d} | " + " | ".join(f"{v:.3f}" for v in vals) + " |" for d, vals in agree.items()]
    else:
        rows = ["| domain | first-step top-1 agreement |", "|---|---|"]
        rows += [f"| {d} | {v:.3f} |" for d, v in agree.items()]
    return "\n".join(rows)


def _drills_line(d: dict) -> str:
    a, end = d["steps"]
    return (
        f"- copy drills (`zoo.train.copy_drills`): steps {a}-{end}, {d['rows']} rows x "
        f"{d['seq']} tokens per step, each a corpus span of {d['span'][0]}-{d['span'][1] - 1} "
        f"tokens repeated verbatim to the row's end ({d['tokens_seen']:,} tokens); alone until "
        f"step {d['alone_until']}, beside the corpus batch after it. The corpus alone did not "
        "teach the target to copy from its context (see In-context copying)."
    )


def render_card(name: str, info: dict, src: dict) -> str:
    lines = [
        f"# zoo/{name}",
        "",
        DESCRIPTIONS.get(name, ""),
        "",
        "Tiny model for CPU tests and the embedded default campaign of `python sweep.py`; "
        "its numbers say nothing about 8B-class targets.",
        "",
        "## Training",
        "",
        f"- parameters: {info['params']:,}",
        f"- architecture: `{json.dumps(info.get('config', {}), sort_keys=True)}`",
        f"- steps: {info['steps']} (batch {info['batch']} x {info['seq']} tokens)",
        f"- tokens seen: {info['tokens_seen']:,}" + (" (corpus)" if "copy_drills" in info else ""),
        *([_drills_line(info["copy_drills"])] if "copy_drills" in info else []),
        f"- peak learning rate: {info['lr']} (AdamW, warmup then cosine to 10%)"
        + (
            f"; piecewise plan `{info['lr_schedule']}` ((from step, total steps[, restart "
            "peak]): the budget was cut at step 200 and extended with a warm restart at 480 "
            "because the shared CPU was slower than planned, then restarted at 800 for the "
            "copy drills; `zoo.train.lr_at`)"
            if info.get("lr_schedule")
            else ""
        ),
        f"- seed: {info['seed']}" + (f" (init); data order seed {info['data_seed']}" if "data_seed" in info else ""),
        *(
            [
                f"- trained together with {', '.join(x for x in info['trained_with'] if x != name)} "
                "on one shared frozen-target forward per batch (`python -m zoo.train students`)"
            ]
            if len(info.get("trained_with", [])) > 1
            else []
        ),
        *(
            [
                f"- distillation weight: {info['kd_weight']} (KL to the target) + "
                f"{1 - info['kd_weight']:.1f} (corpus cross entropy)"
            ]
            if "kd_weight" in info
            else []
        ),
        f"- wall time: {info['wall_s']:.0f} s on 2 CPU threads (`torch.set_num_threads(2)`, shared machine)",
        "- weights: safetensors, float16 (config says float32: loaders compute in float32 unless asked otherwise)"
        if name in ("target", "draft")
        else "- weights: safetensors, float16 (cast to the target's dtype on load)",
        f"- retrain: `python -m zoo.train {'students' if name in ('draft', 'medusa', 'eagle') else name} "
        "--fresh` (after the earlier stages; `python -m zoo.train all --fresh` retrains "
        "everything)",
        "",
    ]
    if "heldout" in info:
        lines += [
            "## Held-out loss per domain",
            "",
            "Test split of each source (never trained on), first tokens in item-id order; "
            "unigram baseline = add-one-smoothed token frequencies of the training stream.",
            "",
            _loss_table(info["heldout"]),
            "",
        ]
    if "in_context_copy" in info:
        c = info["in_context_copy"]
        lines += [
            "## In-context copying",
            "",
            f"`python -m zoo.check --copy`: {c['strings']} random strings of {c['length']} "
            f"ordinary tokens (seed {c['seed']}), each followed by itself: mean loss "
            f"{c['first']:.2f} nats/token on the first occurrence and {c['second']:.2f} on "
            f"the repeat (log vocab = {c['log_vocab']:.2f}). A model that copies from its "
            "context gets the repeat nearly free.",
        ]
        h = info.get("in_context_copy_heldout")
        if h:
            lines[-1] += (
                f" The same for {h['strings']} spans of {h['length']} tokens of held-out "
                f"corpus text: {h['first']:.2f} on the first occurrence, {h['second']:.2f} "
                "on the repeat."
            )
        lines += [""]
    if "heldout_top1_agreement" in info:
        lines += [
            "## Held-out agreement with the target",
            "",
            "Teacher-forced top-1 agreement with the target's greedy token on held-out "
            "text (first 512 tokens per domain).",
            "",
            _agree_table(info["heldout_top1_agreement"]),
            "",
        ]
    if "acceptance" in info:
        lines += ["## Mean accepted length at k = 8", "", info["acceptance"], ""]
    lines += [
        "## Corpus sources and licences",
        "",
        f"Built offline by `zoo/corpus.py` from Python {src['python']} on this machine; "
        "held-out split: 8% of source units by sha256 hash.",
        "",
        "| domain | source | licence |",
        "|---|---|---|",
    ]
    lines += [f"| {s['domain']} | {s['source']} | {s['licence']} |" for s in src["sources"]]
    lines += ["", "The models themselves are released under the project's licence (Apache-2.0).", ""]
    return "\n".join(lines)


LOOKUP = ("ngram", "suffix")
MODEL_BASED = ("draft", "medusa", "eagle")
WELL_ABOVE_ZERO = 0.3  # mean accepted tokens per block a model-based drafter must exceed
MIN_OUTPUT = 16  # output tokens an output needs to count as one a researcher would read
MIN_LONG_SHARE = 0.95  # share of each workload's prompts that must reach MIN_OUTPUT
MAX_LOOP_SHARE = 0.10  # pooled share of outputs that may end in a short loop (must stay below)
LOOP_PERIOD, LOOP_REPEATS = 4, 4


def ends_in_loop(tokens, max_period: int = LOOP_PERIOD, min_repeats: int = LOOP_REPEATS) -> bool:
    """Whether `tokens` ends in a short loop: for some period p in 1..max_period, its last
    min_repeats * p tokens are one block of p tokens repeated min_repeats times."""
    o = list(tokens)
    for p in range(1, max_period + 1):
        if len(o) >= min_repeats * p and all(o[-i - 1] == o[-i - 1 - p] for i in range((min_repeats - 1) * p)):
            return True
    return False


def output_stats(progress_path) -> dict[str, dict[str, int]]:
    """Per workload (in order of first appearance) of a run's progress.jsonl: n (outputs),
    ge16 (outputs of at least MIN_OUTPUT tokens), loop (outputs ending in a short loop, see
    `ends_in_loop`), tokens (output tokens in all) and missing (progress lines without an
    "output", skipped). Blank lines are skipped; any other line that is not a JSON object with
    a workload raises ValueError naming the file and line."""
    from pathlib import Path

    path = Path(progress_path)
    stats: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: malformed progress line ({e})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("workload"), str):
                raise ValueError(f"{path}:{lineno}: progress line is not an object with a workload")
            s = stats.setdefault(rec["workload"], dict(n=0, ge16=0, loop=0, tokens=0, missing=0))
            out = rec.get("output")
            if out is None:
                s["missing"] += 1
                continue
            if not isinstance(out, list):
                raise ValueError(f"{path}:{lineno}: output is not a list of token ids")
            count_output(s, out)
    return stats


def count_output(s: dict[str, int], out: list) -> None:
    """Add one output's counts to a workload's stats (n, ge16, loop, tokens; see `output_stats`)."""
    s["n"] += 1
    s["ge16"] += len(out) >= MIN_OUTPUT
    s["loop"] += ends_in_loop(out)
    s["tokens"] += len(out)


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}%" if n else "no outputs"


def _at_least(k: int, n: int, share: float) -> bool:
    """k / n >= share, in integer percent (no float rounding at the boundary)."""
    return k * 100 >= round(100 * share) * n


def output_gates(stats: dict) -> list[tuple[str, bool, str]]:
    """The output-quality gates from `output_stats`: every workload has at least MIN_OUTPUT
    tokens on MIN_LONG_SHARE of its prompts, and fewer than MAX_LOOP_SHARE of all outputs end
    in a short loop (the detail gives each workload's share too, naming those over it). A
    workload without outputs fails the first gate (nothing to show); so does a run without any."""

    def short(s):
        return not (s["n"] and _at_least(s["ge16"], s["n"], MIN_LONG_SHARE))

    def loopy(s):
        return bool(s["n"]) and _at_least(s["loop"], s["n"], MAX_LOOP_SHARE)

    long_ok = bool(stats) and not any(short(s) for s in stats.values())
    long_detail = (
        ", ".join(
            f"{w} {_pct(s['ge16'], s['n'])}" + (f" (under {100 * MIN_LONG_SHARE:.0f}%)" if s["n"] and short(s) else "")
            for w, s in stats.items()
        )
        or "no outputs"
    )
    pooled = {k: sum(s[k] for s in stats.values()) for k in ("n", "loop")}
    loop_ok = bool(pooled["n"]) and not loopy(pooled)
    loop_detail = f"pooled {_pct(pooled['loop'], pooled['n'])}" + "".join(
        f"{'; ' if i == 0 else ', '}{w} {_pct(s['loop'], s['n'])}"
        + (f" (over {100 * MAX_LOOP_SHARE:.0f}%)" if loopy(s) else "")
        for i, (w, s) in enumerate(stats.items())
    )
    return [
        (
            f"at least {MIN_OUTPUT} output tokens on >= {100 * MIN_LONG_SHARE:.0f}% of the prompts of every workload",
            long_ok,
            long_detail,
        ),
        (
            f"fewer than {100 * MAX_LOOP_SHARE:.0f}% of all outputs end in a short loop (period <= "
            f"{LOOP_PERIOD}, >= {LOOP_REPEATS} repeats)",
            loop_ok,
            loop_detail,
        ),
    ]


def output_table(stats: dict) -> str:
    rows = [
        f"| workload | prompts | >= {MIN_OUTPUT} output tokens | ends in a loop | mean output length |",
        "|---|---|---|---|---|",
    ]
    pooled = {k: sum(s[k] for s in stats.values()) for k in ("n", "ge16", "loop", "tokens")}
    for w, s in [*stats.items(), ("pooled", pooled)]:
        mean = f"{s['tokens'] / s['n']:.1f}" if s["n"] else "-"
        rows.append(f"| {w} | {s['n']:,} | {_pct(s['ge16'], s['n'])} | {_pct(s['loop'], s['n'])} | {mean} |")
    return "\n".join(rows)


def acceptance(run) -> tuple[str, list[tuple[str, bool, str]]]:
    """The card's acceptance and output tables and the quality gates, computed from a sweep run.

    Returns (markdown, gates); each gate is (name, passed, what was measured)."""
    from pathlib import Path

    import numpy as np

    from bandit.stats import trajectory
    from bandit.logs.reader import load_logs

    run = Path(run)
    man = json.loads((run / "manifest.json").read_text())
    t = load_logs([run])
    W, D = list(t.workloads), list(t.drafters)
    # each drafter at its own block starts (its own trajectory), not at every position: a mean over
    # positions counts a position inside a long accepted run once per position
    starts = trajectory.fixed_starts(t)
    table = np.array(
        [[t.accepted[starts[:, j] & (t.workload == i), j].mean() for j in range(len(D))] for i in range(len(W))]
    )
    pooled = np.array([t.accepted[starts[:, j], j].mean() for j in range(len(D))])
    hdr = "| workload | " + " | ".join(D) + " |"
    rows = [hdr, "|---|" + "---|" * len(D)]
    for name, vals in [*zip(W, table), ("pooled", pooled)]:
        best = int(np.nanargmax(vals))
        rows.append(
            f"| {name} | " + " | ".join(f"**{v:.2f}**" if j == best else f"{v:.2f}" for j, v in enumerate(vals)) + " |"
        )
    md = (
        f"[{man['label']}] `runs/{run.name}/` from `python sweep.py` (dense, greedy, k = {man['k']}, "
        f"{t.n_prompts:,} prompts over {', '.join(W)}, {t.n_records:,} positions), read by "
        "`bandit.stats.trajectory`: mean accepted draft tokens per block, each drafter at its own block "
        "starts along its own trajectory (bonus token excluded; Medusa drafts at most 4). Best per "
        "row in bold. Regenerate with "
        f"`python -m zoo.cards runs/{run.name}`.\n\n"
        + "\n".join(rows)
        + "\n\n`ngram` looks up the prompt and the output so far; `suffix` also indexes the "
        "earlier outputs of the run, so it profits when the target repeats itself across "
        "prompts. Prompt lookup wins on `copy` only when the target copies its context: see "
        "the target card's in-context copying probe."
    )
    stats = output_stats(run / "progress.jsonl")
    stats = {**{w: stats[w] for w in W if w in stats}, **{w: s for w, s in stats.items() if w not in W}}
    missing = sum(s["missing"] for s in stats.values())
    md += (
        f"\n\n[{man['label']}] Outputs of the same run (`runs/{run.name}/progress.jsonl`), per "
        f"workload: prompts, share with at least {MIN_OUTPUT} output tokens, share ending in a "
        f"short loop (the last {LOOP_REPEATS}p tokens are one block of p <= {LOOP_PERIOD} tokens "
        f"repeated {LOOP_REPEATS} times; `zoo.cards.ends_in_loop`), mean output length in tokens"
        + (f" ({missing:,} progress lines without outputs skipped)" if missing else "")
        + ".\n\n"
        + output_table(stats)
    )
    tab = {w: dict(zip(D, row)) for w, row in zip(W, table)}
    gates = []
    distinct = len({round(float(v), 2) for v in pooled}) == len(D)
    gates.append(("drafters differ", distinct, "pooled means " + ", ".join(f"{d} {v:.2f}" for d, v in zip(D, pooled))))
    models = [d for d in MODEL_BASED if d in D]
    low = min((tab[w][d], w, d) for w in W for d in models) if models else (float("nan"), "", "")
    gates.append(
        (
            f"model-based drafters accept > {WELL_ABOVE_ZERO} on every workload",
            bool(low[0] > WELL_ABOVE_ZERO),
            f"lowest: {low[2]} on {low[1]} {low[0]:.2f}",
        )
    )
    if "copy" in tab:
        lookups = [d for d in LOOKUP if d in D]
        worst_lookup = min(lookups, key=lambda d: tab["copy"][d])
        best_model = max(models, key=lambda d: tab["copy"][d])
        ok = tab["copy"][worst_lookup] > tab["copy"][best_model]
        hybrid = "".join(
            f"; {d} (a model drafter extended by lookup) {tab['copy'][d]:.2f}"
            for d in D
            if d not in LOOKUP and d not in MODEL_BASED
        )
        gates.append(
            (
                "every lookup drafter beats every model-based drafter on copy",
                bool(ok),
                f"weakest lookup {worst_lookup} {tab['copy'][worst_lookup]:.2f} vs strongest "
                f"model-based {best_model} {tab['copy'][best_model]:.2f}{hybrid}",
            )
        )
    gates += output_gates(stats)
    return md, gates


def render_gates(gates) -> str:
    return "\n".join(f"- [{'pass' if ok else 'FAIL'}] {name}: {detail}" for name, ok, detail in gates)


def refresh(run=None):
    """Re-render every card from its training_info.json (and the acceptance table of `run`)."""
    from . import ZOO_DIR
    from .corpus import source_info

    md = None
    if run is not None:
        md, gates = acceptance(run)
        md += "\n\nQuality gates, from the same run:\n\n" + render_gates(gates)
    for name in ("target", "draft", "medusa", "eagle"):
        p = ZOO_DIR / name / "training_info.json"
        if not p.exists():
            continue
        info = json.loads(p.read_text())
        if md is not None:
            info["acceptance"] = md
            p.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        (ZOO_DIR / name / "README.md").write_text(render_card(name, info, source_info()))


if __name__ == "__main__":
    import sys

    refresh(sys.argv[1] if len(sys.argv) > 1 else None)
