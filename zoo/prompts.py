"""The zoo's CPU workload prompts (``zoo/workloads/{code,math,chat,copy}.jsonl``), from held-out items only.

``python -m zoo.train workloads`` runs ``stage_workloads``; ``workload_records`` makes the same records.
"""

from __future__ import annotations

import json

from . import WORKLOADS, WORKLOADS_DIR
from .corpus_base import DEFAULT_SEED
from .data import corpus_items, log

# ----------------------------------------------------------------------------- workloads

N_PROMPTS = 300


def _order(uid: str) -> str:
    import hashlib

    return hashlib.sha256(("workload:" + uid).encode()).hexdigest()


def token_boundary_prompt(text: str, prompt: str) -> str:
    """`prompt` (a prefix of the item `text`) cut back to a token boundary of `text`.

    The byte-level pre-tokenizer attaches a whitespace run to the word after it ("\\n    return"
    becomes "\\n   " + " return"), so a prompt that ends in whitespace ends in a token the
    target never saw in that place: before an indented line, a lone newline token occurs in
    training only at an item's end, and the target answered it with end-of-text (most code
    prompts ended after one token). The whitespace belongs to the continuation."""
    if not text.startswith(prompt):
        raise ValueError("the prompt is not a prefix of its item's text")
    return prompt.rstrip()


def workload_records(seed=DEFAULT_SEED, n=N_PROMPTS) -> dict[str, list[dict]]:
    """The CPU workloads, from held-out (test split) items only, in a stable hashed order."""
    items = [it for it in corpus_items(seed) if it.split == "test"]
    out = {w: [] for w in WORKLOADS}
    # code: the opening lines of a held-out stdlib chunk, to be continued
    code = sorted((it for it in items if it.domain == "code"), key=lambda it: _order(it.uid))
    for frac in (0.35, 0.65):
        for it in code:
            lines = it.text.splitlines(keepends=True)
            if len(lines) < 12:
                continue
            cut = max(4, int(len(lines) * frac))
            out["code"].append(
                {
                    "workload": "code",
                    "prompt_id": f"{it.uid}@{cut}",
                    "prompt": token_boundary_prompt(it.text, "".join(lines[:cut])),
                }
            )
    for it in sorted((it for it in items if it.domain == "math"), key=lambda it: _order(it.uid)):
        out["math"].append({"workload": "math", "prompt_id": it.uid, "prompt": it.prompt})
    for it in sorted((it for it in items if it.domain == "chat"), key=lambda it: _order(it.uid)):
        out["chat"].append(
            {"workload": "chat", "prompt_id": it.uid, "messages": [{"role": r, "content": c} for r, c in it.messages]}
        )
    for it in sorted((it for it in items if it.domain == "copy"), key=lambda it: _order(it.uid)):
        out["copy"].append(
            {"workload": "copy", "prompt_id": it.uid, "prompt": token_boundary_prompt(it.text, it.prompt)}
        )
    for w in out:
        seen, recs = set(), []
        for r in out[w]:
            if r["prompt_id"] not in seen:
                seen.add(r["prompt_id"])
                recs.append(r)
        out[w] = recs[:n]
    return out


def stage_workloads(seed=DEFAULT_SEED):
    WORKLOADS_DIR.mkdir(parents=True, exist_ok=True)
    for w, recs in workload_records(seed).items():
        p = WORKLOADS_DIR / f"{w}.jsonl"
        p.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in recs))
        log(f"workload {w}: {len(recs)} prompts -> {p}")
