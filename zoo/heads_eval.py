"""Held-out acceptance of ``python -m zoo.heads``, and the cards of the heads it trains.

Definition (stated in every card, ``ACCEPTANCE``): on each held-out prompt, the target's greedy output y and
its teacher-forced features; at every output position p (prefix = prompt + y[:p]), the drafter, built by the
harness's registry from its saved directory exactly as a sweep builds it, drafts greedily a chain of
k_p = min(k, len(y) - p) tokens by its dense method (harness/drafters: Medusa head i drafts token P - 1 + i from
the feature at P - 2; EAGLE reads the pairs up to P - 2 and drafts on its own features); the accepted length
is how many leading chain tokens equal y[p:p + k_p] (the target's next tokens; the bonus token is not
counted). The mean accepted length is the mean over every output position of every held-out prompt, pooled
and per workload; ``by_depth[j]`` is the share of positions with at least j + 1 accepted tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bandit.logs.safeio import write_text
from harness.models import lm
from harness.drafters import DrafterEnv, Sequence, build_drafters, common_prefix, parse_spec

from .heads_data import Example, teacher_forced

ACCEPTANCE = (
    "mean accepted length at k = {k}, by teacher forcing against the target's greedy outputs: at every output "
    "position p of every held-out prompt the drafter (built from this directory by the harness's registry) "
    "drafts a greedy chain of min(k, len(y) - p) tokens after prompt + y[:p] (its dense drafting, the target's "
    "teacher-forced features); the accepted length is how many leading chain tokens equal the target's next "
    "tokens y[p:]; bonus token not counted; mean over all output positions"
)


def drafters_for(specs: list[str], target, tok, target_path: Path) -> dict:
    """Drafters (`NAME=KIND:path=DIR`) built by the harness's registry over the loaded target."""
    env = DrafterEnv(target, tok, target_path, temperature=0.0)
    return build_drafters([parse_spec(s) for s in specs], env)


def accepted_lengths(drafter, ex: Example, feats, k: int, hidden: dict | None = None) -> list[int]:
    """Accepted length at each output position of one example (see the module's doc); feats (L, H); hidden: the
    target states at the tap keys the drafter reads ({key: (L, H)}: EAGLE-3, DFlash)."""
    y, ids = ex.output, ex.ids
    ks = [min(k, len(y) - p) for p in range(len(y))]
    n = len(ids) - 1
    seq = Sequence(ids, len(ex.prompt), feats[:n], 0, 0.0, ks, hidden={key: v[:n] for key, v in (hidden or {}).items()})
    getattr(drafter, "start", lambda *a: None)(ex.workload, ex.prompt_id)
    dense = getattr(drafter, "dense", None)
    drafts = dense(seq, {}) if dense else [drafter.draft(seq.prefix(p), kp) for p, kp in enumerate(ks)]
    getattr(drafter, "finish", lambda *a: None)(list(y))
    return [common_prefix(d.tokens[:kp], y[p : p + kp]) for p, (d, kp) in enumerate(zip(drafts, ks))]


def heldout_acceptance(drafters: dict, target, examples: list[Example], k: int) -> dict:
    """{drafter name: {"mean", "positions", "per_workload": {w: mean}, "by_depth": [...]}} on the examples."""
    from tqdm import tqdm

    per: dict[str, dict[str, list[int]]] = {n: {} for n in drafters}
    keys = set().union(*(getattr(d, "feature_layers", frozenset)() for d in drafters.values())) - {lm.LAST}
    for ex in tqdm(examples, desc="held-out acceptance", unit="prompt", dynamic_ncols=True):
        if not ex.output:
            continue
        hidden = None
        if keys:  # one forward gives every tapped state and the last one
            _, hidden = lm.forward(target, torch.tensor(ex.ids), lm.new_cache(), taps=keys | {lm.LAST}, causal=True)
            hidden = {key: v.float().clone() for key, v in hidden.items()}
            feats = hidden[lm.LAST]
        else:
            feats, _ = teacher_forced(target, ex.ids)
        for n, d in drafters.items():
            per[n].setdefault(ex.workload, []).extend(accepted_lengths(d, ex, feats, k, hidden))
    out = {}
    for n, by_wl in per.items():
        every = [a for v in by_wl.values() for a in v]
        out[n] = {
            "k": k,
            "mean": round(sum(every) / len(every), 4) if every else None,
            "positions": len(every),
            "prompts": len([e for e in examples if e.output]),
            "per_workload": {w: round(sum(v) / len(v), 4) for w, v in sorted(by_wl.items())},
            "by_depth": [round(sum(a > j for a in every) / len(every), 4) for j in range(k)] if every else [],
        }
    return out


DESCRIPTION = {
    "medusa": "Medusa-1 heads (harness.models.heads.MedusaHeads, format specbandit-medusa-v1): head i reads the target's "
    "last hidden state at t and predicts the token at t + 1 + i; trained on the target's own greedy outputs.",
    "eagle": "EAGLE-1 style head (harness.models.heads.EagleHead, format specbandit-eagle-v1): one Llama decoder layer over "
    "fc(cat(feature t, embedding of token t + 1)) predicts feature t + 1, read by the target's lm_head; trained on "
    "the target's own greedy outputs and features.",
}


def write_card(d: Path, kind: str, info: dict, json_file: Path | None = None, md_file: Path | None = None) -> None:
    """training_info.json (every field) and README.md (the same, for a reader) in the head's directory (or at
    `json_file` and `md_file`: a run's copy, zoo/runcard.py)."""
    write_text(json_file or d / "training_info.json", json.dumps(info, indent=2, sort_keys=True) + "\n")
    acc, data = info["heldout_acceptance"], info["data"]
    lines = [
        f"# {kind} heads for {info['target']['path']}",
        "",
        DESCRIPTION[kind],
        "",
        f"Load: `--drafter {kind}={kind}:path={info.get('path', d)}` (the target's embedding and lm_head are not stored).",
        "",
        "## Training",
        "",
        f"- kind: {kind}; config `{json.dumps(info['config'], sort_keys=True)}`; {info['params']:,} trained parameters",
        f"- target: `{info['target']['path']}`, sha256 `{info['target']['sha256']}` (harness.models.lm.weights_sha256)",
        f"- weights: `model.safetensors` sha256 `{info['sha256']['model.safetensors']}`; directory "
        + (
            f"({info['identity']}: the earlier hash of its files, harness.models.identity.legacy_sha256) "
            if info.get("identity")
            else "(harness.models.lm.weights_sha256) "
        )
        + f"`{info['sha256']['weights']}`; float16",
        f"- data: {data['train_prompts']} training prompts ({data['source']}), {data['train_tokens']:,} tokens "
        f"({data['train_output_tokens']:,} of them the target's greedy output, max {data['max_new_tokens']} new), "
        f"{data['loss_positions']:,} loss positions; held out: {data['heldout_prompts']} prompts ({data['split']})",
        f"- steps: {info['steps']} x batch {info['batch']} windows of {info['window'] + 1} positions; lr {info['lr']} "
        f"(AdamW, warmup {info['warmup']}, cosine to 10%); seed {info['seed']}",
        f"- time: greedy outputs {info['time_s']['generate']:.0f} s, features {info['time_s']['features']:.0f} s, "
        f"training {info['train_wall_s']:.0f} s (trained with {', '.join(info['trained_with'])}), "
        f"held-out {info['time_s']['heldout']:.0f} s; {info['threads']} torch threads ({info['gen_threads']} for the "
        "greedy outputs)",
        f"- command: `{info['command']}`",
        "",
        "## Held-out acceptance",
        "",
        ACCEPTANCE.format(k=acc["k"]) + ".",
        "",
        "| workload | mean accepted length |",
        "|---|---|",
        *[f"| {w} | {v:.3f} |" for w, v in acc["per_workload"].items()],
        f"| pooled ({acc['prompts']} prompts, {acc['positions']} positions) | {acc['mean']:.3f} |"
        if acc["mean"] is not None
        else "| pooled | (no held-out positions) |",
        "",
        "Share of positions with at least j accepted tokens: "
        + ", ".join(f"j={j + 1}: {v:.3f}" for j, v in enumerate(acc["by_depth"])),
        "",
    ]
    if info.get("compared"):
        lines += ["On the same held-out positions:", "", "| drafter | mean accepted length |", "|---|---|"]
        lines += [f"| {n} | {r['mean']:.3f} |" for n, r in info["compared"].items() if r["mean"] is not None]
        lines += [""]
    write_text(md_file or d / "README.md", "\n".join(lines))
