"""vLLM's walk and counting, modelled: what bench/vllm_crosscheck.py compares vLLM's counters with.

No vLLM here (the default suite tests this module on hand-worked streams: tests/test_crosscheck_walk.py); the
harness only where a callable needs the target or a drafter (`Oracle`, `model_walk`).

How vLLM 0.32 walks one greedy request with a drafter and counts it (vllm/v1/core/sched/scheduler.py,
vllm/v1/spec_decode/*):

* the prefill samples output token 0 with no draft; the first draft is made from prompt + y[:1] (position 1);
* a step at output position pos verifies a draft d and keeps its common prefix a with the target's greedy
  continuation plus one bonus token: the next step is at pos + a + 1. A step with no draft (no n-gram match) is a
  plain decode step, which the counters do not count;
* the end effect: the draft length is capped only by max_model_len, never by max_tokens, so near the end of the
  output vLLM still drafts k tokens; and the accepted count of the last step is counted as verified, before the
  scheduler cuts the output at max_tokens (or after an EOS): the tokens accepted past the returned output are
  counted, and the target's continuation past the output's end (through an EOS, which the rejection sampler does
  not stop at) decides them.

A dense block log (sweep.py --mode dense) holds at every output position pos the draft cut to the output budget,
min(k, max_new_tokens - 1 - pos), and its acceptance within the output. Walked from position 1 it gives vLLM's
blocks *within the output*; at the blocks where the cut bites or the draft consumes the rest of the output (only
the last block of a prompt, or a block near the end) the end effect is modelled explicitly: the drafter's
uncut draft (`full_draft`) and the target's tokens past the end (`verify`) give the block *as vLLM counts it*.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

from bandit.logs.schema import common_prefix

Block = tuple[int, int, int]  # (output position, draft length, accepted)


# ------------------------------------------------------------------------------------------------ vLLM's rule
def vllm_ngram_draft(ctx: list[int], n_min: int, n_max: int, k: int, latest: bool = False, overlap: bool = False):
    """vLLM 0.32's ngram proposal (_find_longest_matched_ngram_and_propose_tokens), written plainly: the longest
    n in [n_min, n_max] whose suffix n-gram occurs earlier, its *earliest* occurrence, and the tokens after it,
    at most k and at most up to the end of the context (no overlapping copy). latest / overlap switch to our
    NgramDrafter's default choices (the most recent occurrence; a k-token overlapping copy), one rule at a time."""
    P = len(ctx)
    for n in range(min(n_max, P - 1), n_min - 1, -1):
        pat = ctx[P - n :]
        hits = [s for s in range(0, P - n) if ctx[s : s + n] == pat]  # occurrences ending before the last token
        if hits:
            src = (hits[-1] if latest else hits[0]) + n
            if not overlap:
                return ctx[src : min(P, src + k)]
            seq = list(ctx)
            for j in range(k):  # may read tokens it has just drafted
                seq.append(seq[src + j])
            return seq[P:]
    return []


def replay_vllm_rule(prompt: list[int], y: list[int], y_long: list[int], rule: dict, **how) -> list[tuple[int, int]]:
    """(draft length, accepted) of every draft vLLM makes on output y, greedy: prefill gives y[0] undrafted, then
    each step drafts from prompt + y[:pos] and accepts the common prefix with the target's continuation y_long
    (y and the tokens past its end, through any EOS)."""
    blocks, pos = [], 1
    while pos < len(y):
        d = vllm_ngram_draft(prompt + y[:pos], rule["n_min"], rule["n_max"], rule["k"], **how)
        a = common_prefix(d, y_long[pos:])
        if d:
            blocks.append((len(d), a))
        pos += a + 1
    return blocks


def replay_our_rule(prompt: list[int], y: list[int], rule: dict, max_new: int) -> list[tuple[int, int]]:
    """(draft length, accepted) along our dense trajectory, our default rule (rule=latest): blocks from output
    position 0, k cut to the output budget (min(k, max_new - 1 - pos)), acceptance against the output y."""
    blocks, pos = [], 0
    while pos < len(y):
        k = min(rule["k"], max_new - 1 - pos)
        d = vllm_ngram_draft(prompt + y[:pos], rule["n_min"], rule["n_max"], k, latest=True, overlap=True)
        a = common_prefix(d, y[pos:])
        if d:
            blocks.append((len(d), a))
        pos += a + 1
    return blocks


# ------------------------------------------------------------------------------------------- counting
def per_position(blocks, k: int) -> dict:
    """acc[j] = drafts accepting >= j / drafts (vLLM's definition), and the conditional one among drafts of >= j
    tokens; drafts, draft tokens, accepted tokens per position, mean accepted. `blocks`: (draft length, accepted)
    or (pos, draft length, accepted); empty drafts are not drafts."""
    pairs = [(b[-2], b[-1]) for b in blocks if b[-2] > 0]
    n = len(pairs)
    acc = [sum(a >= j for _, a in pairs) for j in range(1, k + 1)]
    longer = [sum(dl >= j for dl, _ in pairs) for j in range(1, k + 1)]
    return {
        "drafts": n,
        "draft_tokens": sum(dl for dl, _ in pairs),
        "accepted_per_pos": acc,
        "acc": [c / n if n else float("nan") for c in acc],
        "acc_given_len": [c / m if m else float("nan") for c, m in zip(acc, longer)],
        "mean_accepted": sum(a for _, a in pairs) / n if n else float("nan"),
    }


def counters_gap(a: dict, b: dict) -> dict:
    """a - b for drafts, draft tokens and accepted tokens per position (of per_position dicts)."""
    n = max(len(a["accepted_per_pos"]), len(b["accepted_per_pos"]))
    pa = a["accepted_per_pos"] + [0] * (n - len(a["accepted_per_pos"]))
    pb = b["accepted_per_pos"] + [0] * (n - len(b["accepted_per_pos"]))
    return {
        "drafts": a["drafts"] - b["drafts"],
        "draft_tokens": a["draft_tokens"] - b["draft_tokens"],
        "accepted_per_pos": [x - y for x, y in zip(pa, pb)],
    }


def is_zero(gap: dict) -> bool:
    return gap["drafts"] == 0 and gap["draft_tokens"] == 0 and not any(gap["accepted_per_pos"])


# --------------------------------------------------------------------------------------------- the dense log
def dense_files(run: Path) -> list[Path]:
    """A run's dense block logs: blocks_dense*.jsonl (every part of a sharded campaign), and the .jsonl.gz of any
    not there uncompressed (a finished campaign may be compressed)."""
    plain = sorted(Path(run).glob("blocks_dense*.jsonl"))
    return plain + [p for p in sorted(Path(run).glob("blocks_dense*.jsonl.gz")) if p.with_suffix("") not in plain]


def read_dense(run: Path, drafter: str, keys: set[str] | None = None) -> dict[str, list[tuple[list[int], int]]]:
    """{workload/prompt_id: [(draft tokens, accepted) by output position]} of one drafter, read straight from a
    sweep's dense block logs (no bandit reader: an independent walk); keys: only these prompts (an existing
    campaign's log may end in a prompt a kill left unfinished)."""
    out: dict[str, dict[int, tuple[list[int], int]]] = {}
    for f in dense_files(run):
        with gzip.open(f, "rt") if f.suffix == ".gz" else open(f) as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except ValueError:
                    if keys is None:
                        raise
                    break  # a line torn by a kill: past every finished prompt
                key = f"{r['workload']}/{r['prompt_id']}"
                if keys is not None and key not in keys:
                    continue
                d = r["drafts"][drafter]
                out.setdefault(key, {})[int(r["pos"])] = (d["tokens"], d["accepted"])
    res = {}
    for key, rows in out.items():
        if sorted(rows) != list(range(len(rows))):
            raise ValueError(f"{run}: {key}: dense records are not one per output position")
        res[key] = [rows[p] for p in range(len(rows))]
    return res


def walk_dense(
    rows: list[tuple[list[int], int]],
    y: list[int],
    k: int,
    max_new: int,
    full_draft: Callable[[int], list[int]] | None = None,
    verify: Callable[[int, list[int]], list[int]] | None = None,
    start: int = 1,
) -> tuple[list[Block], list[Block]]:
    """vLLM's walk over one prompt's dense log: (blocks as vLLM counts them, blocks within the output).

    Within the output: the log's (draft length, accepted) at each block start, from `start` (1: vLLM's first draft
    after the prefill's token). As vLLM counts: the same, except at an end block, where the log's draft was cut to
    the budget (min(k, max_new - 1 - pos) < k) or its acceptance consumed the rest of the output: there the
    drafter's uncut draft `full_draft(pos)` (which must agree with the log's within the output) is accepted against
    the output and, once it runs past the end, against `verify(pos, draft)`: the target's greedy tokens at output
    positions pos .. pos + len(draft) given prompt + y[:pos] + draft (through any EOS). Without the callables the
    walk is the within-output one only (both lists equal)."""
    counted: list[Block] = []
    within: list[Block] = []
    pos, n = start, len(y)
    if len(rows) != n:
        raise ValueError(f"dense log has {len(rows)} positions, the output {n} tokens")
    while pos < n:
        toks, a = rows[pos]
        cap = min(k, max_new - 1 - pos)
        if len(toks) > max(cap, 0) or a != common_prefix(toks, y[pos:]):
            raise ValueError(f"position {pos}: the log's draft exceeds the budget or its acceptance is not y's")
        if toks:
            within.append((pos, len(toks), a))
        end = cap < k or a == n - pos
        if not end or full_draft is None:
            if toks:
                counted.append((pos, len(toks), a))
            pos += a + 1
            continue
        d = list(full_draft(pos))
        if d[: len(toks)] != list(toks) or min(len(d), cap) != len(toks):
            raise ValueError(f"position {pos}: the uncut draft {d} does not extend the log's {toks}")
        a_full = common_prefix(d, y[pos:])
        a_counted = a_full
        if a_full == n - pos and len(d) > a_full:  # the draft ran past the output: the target's tokens decide
            if verify is None:
                raise ValueError(f"position {pos}: the draft runs past the output and no verify was given")
            a_counted = common_prefix(d, verify(pos, d))
        if d:
            counted.append((pos, len(d), a_counted))
        pos += a_full + 1
    return counted, within


def model_walk(
    draft: Callable[[int], list[int]], y: list[int], verify: Callable[[int, list[int]], list[int]], start: int = 1
) -> tuple[list[Block], list[int]]:
    """vLLM's walk with a drafter called at each block start (`draft(pos)`: its uncut draft from prompt + y[:pos]):
    the blocks as vLLM counts them, and the tokens vLLM's last step verified past the output's end (accepted ones
    and the bonus token: what vLLM's suffix proposer adds to its global tree)."""
    blocks: list[Block] = []
    pos, n = start, len(y)
    tail: list[int] = []
    while pos < n:
        d = list(draft(pos))
        a = common_prefix(d, y[pos:])
        if a == n - pos:  # consumed the output: the step's tokens past the end are the target's
            pred = verify(pos, d) if d else []
            a_c = common_prefix(d, pred)
            if d:
                blocks.append((pos, len(d), a_c))
            tail = list(pred[a : a_c + 1])
            break
        if d:
            blocks.append((pos, len(d), a))
        pos += a + 1
    return blocks, tail


# ------------------------------------------------------------------------------------------------ vLLM's side
def request_steps(metrics) -> list[tuple[int, int]]:
    """(drafted, accepted) of every verify step of one request, from vLLM's per-request spec-decode metrics
    (LLM(per_request_spec_decode_metrics="detailed"): CompletionOutput.spec_decode_metrics), steps with a draft."""
    if metrics is None:
        raise ValueError("no per-request spec-decode metrics (per_request_spec_decode_metrics='detailed')")
    get = metrics.get if isinstance(metrics, dict) else lambda k, d=None: getattr(metrics, k, d)
    drafted, accepted = list(get("per_step_drafted", []) or []), list(get("per_step_accepted", []) or [])
    if len(drafted) != len(accepted):
        raise ValueError("per-step drafted and accepted counts differ in length")
    return [(int(d), int(a)) for d, a in zip(drafted, accepted) if d > 0]


def compare_prompts(vllm_steps: dict[str, list[tuple[int, int]]], modelled: dict[str, list[Block]], k: int) -> dict:
    """Per prompt: vLLM's steps against the modelled blocks; the gap of their counters (must be zero) and the first
    step where the sequences differ."""
    rows, zero = {}, 0
    for key, steps in vllm_steps.items():
        mine = [(dl, a) for _, dl, a in modelled.get(key, [])]
        gap = counters_gap(per_position(steps, k), per_position(mine, k))
        first = common_prefix(steps, mine)  # the first step that differs (one ending early counts)
        first = None if first == len(steps) == len(mine) else first
        at = None
        if first is not None and first < len(modelled.get(key, [])):
            at = modelled[key][first][0]
        rows[key] = {"gap": gap, "first_different_step": first, "at_output_position": at}
        zero += is_zero(gap) and first is None
    return {"prompts": len(vllm_steps), "zero_gap": zero, "by_prompt": rows}


# ------------------------------------------------------------------------------------------------ the target
class Oracle:
    """The target's greedy tokens past any prefix, teacher-forced at float32 (the harness's model loader): what
    vLLM's rejection sampler compares a draft with, through EOS."""

    def __init__(self, target: Path):
        import torch

        from harness.models import lm

        self.torch = torch
        self.model = lm.load_lm(Path(target), dtype="float32")

    def after(self, ids: list[int], n: int) -> list[int]:
        """The target's token after each of the last n + 1 prefixes of ids (ids[:len - n], ..., ids)."""
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0]
        return logits[len(ids) - n - 1 :].argmax(-1).tolist()

    def verifier(self, prompt: list[int], y: list[int]) -> Callable[[int, list[int]], list[int]]:
        return lambda pos, d: self.after(prompt + y[:pos] + list(d), len(d))
