"""Model cards for the zoo, written by ``zoo/train.py`` from each stage's training info."""
from __future__ import annotations

import json

DESCRIPTIONS = {
    "target": ("The zoo's **target** model: a `LlamaForCausalLM` trained from scratch on the "
               "offline corpus below. Standard Hugging Face directory (`config.json`, "
               "`model.safetensors`, tokenizer files with a chat template).\n\n"
               "Known limitations (measured, not hidden): with ~3.3M training tokens it writes "
               "fluent-looking templates but gets facts and arithmetic wrong, and on copy/edit "
               "prompts it emits generic config lines instead of copying its input (it has not "
               "learned to copy from the context), so it often repeats the same output across "
               "prompts. Lookup drafters that index earlier outputs (`suffix`) profit from that."),
    "draft": ("An independent **draft model** (`LlamaForCausalLM`, same tokenizer as the target), "
              "distilled from the frozen target: loss = 0.3 x cross entropy on the corpus + "
              "0.7 x KL(target || draft) on the same windows."),
    "medusa": ("**Medusa-1 heads** on the frozen target's last hidden state (format "
               "`specbandit-medusa-v1`, class `harness.heads.MedusaHeads`; load with "
               "`MedusaHeads.load(dir, target)`). Head i at position t is trained on the "
               "target's own greedy token for t+1+i on teacher-forced corpus windows "
               "(self-distillation); the target's embedding and lm_head are not stored."),
    "eagle": ("An **EAGLE-1 style feature-level head** (one Llama decoder layer over "
              "`fc(cat(feature, embedding))`; format `specbandit-eagle-v1`, class "
              "`harness.heads.EagleHead`; load with `EagleHead.load(dir, target)`), trained on "
              "the frozen target's last hidden state: smooth-L1 regression of the next feature "
              "+ w_ce x cross entropy of lm_head(predicted feature) against the target's greedy "
              "token."),
}


def _loss_table(heldout: dict) -> str:
    rows = ["| domain | held-out loss (nats/token) | unigram baseline | held-out tokens |",
            "|---|---|---|---|"]
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


def render_card(name: str, info: dict, src: dict) -> str:
    lines = [f"# zoo/{name}", "", DESCRIPTIONS.get(name, ""), "",
             "Tiny model for CPU tests and the embedded default campaign of `python sweep.py`; "
             "its numbers say nothing about 8B-class targets.", "",
             "## Training", "",
             f"- parameters: {info['params']:,}",
             f"- architecture: `{json.dumps(info.get('config', {}), sort_keys=True)}`",
             f"- steps: {info['steps']} (batch {info['batch']} x {info['seq']} tokens)",
             f"- tokens seen: {info['tokens_seen']:,}",
             f"- peak learning rate: {info['lr']} (AdamW, warmup then cosine to 10%)"
             + (f"; piecewise plan `{info['lr_schedule']}` ((from step, total steps[, restart "
                "peak]): the budget was cut at step 200 and extended with a warm restart at 480 "
                "because the shared CPU was slower than planned; `zoo.train.lr_at`)"
                if info.get("lr_schedule") else ""),
             f"- seed: {info['seed']}" + (f" (init); data order seed {info['data_seed']}"
                                             if "data_seed" in info else ""),
             *([f"- trained together with {', '.join(x for x in info['trained_with'] if x != name)} "
                "on one shared frozen-target forward per batch (`python -m zoo.train students`)"]
               if len(info.get("trained_with", [])) > 1 else []),
             *([f"- distillation weight: {info['kd_weight']} (KL to the target) + "
                f"{1 - info['kd_weight']:.1f} (corpus cross entropy)"] if "kd_weight" in info else []),
             f"- wall time: {info['wall_s']:.0f} s on 2 CPU threads (`torch.set_num_threads(2)`, "
             "shared machine)",
             "- weights: safetensors, float16 (config says float32: loaders compute in float32 "
             "unless asked otherwise)" if name in ("target", "draft") else
             "- weights: safetensors, float16 (cast to the target's dtype on load)",
             f"- retrain: `python -m zoo.train {'students' if name in ('draft', 'medusa', 'eagle') else name} "
             "--fresh` (after the earlier stages; `python -m zoo.train all --fresh` retrains "
             "everything)",
             ""]
    if "heldout" in info:
        lines += ["## Held-out loss per domain", "",
                  "Test split of each source (never trained on), first tokens in item-id order; "
                  "unigram baseline = add-one-smoothed token frequencies of the training stream.",
                  "", _loss_table(info["heldout"]), ""]
    if "heldout_top1_agreement" in info:
        lines += ["## Held-out agreement with the target", "",
                  "Teacher-forced top-1 agreement with the target's greedy token on held-out "
                  "text (first 512 tokens per domain).", "",
                  _agree_table(info["heldout_top1_agreement"]), ""]
    if "acceptance" in info:
        lines += ["## Mean accepted length at k = 8", "", info["acceptance"], ""]
    lines += ["## Corpus sources and licences", "",
              f"Built offline by `zoo/corpus.py` from Python {src['python']} on this machine; "
              "held-out split: 8% of source units by sha256 hash.", "",
              "| domain | source | licence |", "|---|---|---|"]
    lines += [f"| {s['domain']} | {s['source']} | {s['licence']} |" for s in src["sources"]]
    lines += ["", "The models themselves are released under the project's licence (Apache-2.0).", ""]
    return "\n".join(lines)


def refresh(acceptance_md: str | None = None):
    """Re-render every card from its training_info.json (and an acceptance table, if given)."""
    from . import ZOO_DIR
    from .corpus import source_info
    for name in ("target", "draft", "medusa", "eagle"):
        p = ZOO_DIR / name / "training_info.json"
        if not p.exists():
            continue
        info = json.loads(p.read_text())
        if acceptance_md:
            info["acceptance"] = acceptance_md
        (ZOO_DIR / name / "README.md").write_text(render_card(name, info, source_info()))


if __name__ == "__main__":
    import sys
    refresh(open(sys.argv[1]).read() if len(sys.argv) > 1 else None)
