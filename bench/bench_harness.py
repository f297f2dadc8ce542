"""Harness speed, measured side by side in one run (CPU; ratios, not absolute numbers).

    python bench/bench_harness.py [--zoo] [--max-new-tokens 96] [--k 8] [--reps 3]

1. Live speculative decoding, tokens/s: ours vs transformers' own assisted generation
   (`generate(assistant_model=...)`, constant k) and prompt lookup
   (`prompt_lookup_num_tokens=k`), same models, same prompts. Target: >= 1.0x.
2. Dense logging of 4 drafters (ngram, suffix, draft, eagle) over every output position
   vs one plain greedy `generate()` of the same tokens (target: <= 3x), and vs a naive
   loop that drafts k steps at every position (the base `Drafter.dense`; target: >= 5x).

Equal work in every comparison: both sides decode greedily with the same eos ids (the
target's) and the same max_new_tokens, both stop at EOS (nothing forces generation past
it), and each side's tokens/s counts the tokens it produced itself. A ratio is printed only
when both sides produced the same tokens for every prompt (checked, `equal_work`; naive vs
batched dense logging must also produce the same drafts); otherwise the row prints
`refused: ...` and says at which prompt and position the two first differ.

Models: the trained zoo (`--zoo`, needs zoo/target and zoo/draft) or, by default, tiny
random-init ones built here (target hidden 128 x 4 layers, draft hidden 32 x 1 layer; the
draft is trained for a few seconds on the target's own greedy outputs so that it is
accepted often enough for assisted decoding to be worth timing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.models import lm
from harness.drafters import Drafter, DrafterEnv, build_drafters, parse_spec
from harness.decode.engine import Engine, RunConfig
from harness.models.heads import EagleHead
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model


def _distil(target, draft, prompts, steps: int = 150, seed: int = 0):
    """A few steps of training the draft (and nothing else) on the target's greedy text."""
    torch.manual_seed(seed)
    texts = [target.generate(torch.tensor([p]), max_new_tokens=96, do_sample=False)[0] for p in prompts]
    opt = torch.optim.Adam(draft.parameters(), lr=3e-3)
    draft.train()
    for i in range(steps):
        ids = texts[i % len(texts)][None]
        loss = draft(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()


def build_models(root: Path, use_zoo: bool):
    if use_zoo:
        t, d = REPO / "zoo/target", REPO / "zoo/draft"
        tok = lm.load_tokenizer(t)
        prompts = [tok(x).input_ids for _, _, x in PROMPTS]
        return t, d, None, prompts
    tok = make_tokenizer()
    target = make_model("llama", len(tok), hidden=128, layers=4, seed=0)
    with torch.no_grad():  # temper the tiny models' decisive logits a little for varied text
        target.lm_head.weight.mul_(0.5)
    draft = make_model("llama", len(tok), hidden=32, layers=1, seed=1)
    prompts = [tok(x).input_ids for _, _, x in PROMPTS]
    _distil(target, draft, prompts)
    t = save_model(target, tok, root / "target")
    d = save_model(draft, tok, root / "draft")
    torch.manual_seed(3)
    EagleHead.from_target(target).save(root / "eagle")
    return t, d, root / "eagle", prompts


def timed(fn, reps: int, setup=None):
    """(last output, fastest wall time): on a shared machine the minimum is the least noisy."""
    out, ts = None, []
    for _ in range(reps):
        if setup:
            setup()
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, min(ts)


def timed_pair(fa, fb, reps: int):
    """Two contenders alternated rep by rep, so that load changes hit both alike."""
    res = [timed(f, 1) for _ in range(reps) for f in (fa, fb)]
    a, b = res[0::2], res[1::2]
    return (a[-1][0], min(x[1] for x in a)), (b[-1][0], min(x[1] for x in b))


def equal_work(ours: list[list[int]], theirs: list[list[int]], what: str = "outputs") -> tuple[bool, str]:
    """(same tokens for every prompt, why not): the condition for a speed ratio to mean anything."""
    if len(ours) != len(theirs):
        return False, f"{what} for {len(ours)} vs {len(theirs)} prompts"
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    if not bad:
        return True, ""
    a, b = ours[bad[0]], theirs[bad[0]]
    pos = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))  # else: one is a prefix
    return False, f"{what} differ on {len(bad)} of {len(ours)} prompts (first at prompt {bad[0]}, position {pos})"


def ratio_cell(num: float, den: float, *checks: tuple[list[list[int]], list[list[int]], str]) -> tuple[bool, str]:
    """(equal work, num / den as `1.23x` or the refusal): checks are (ours, theirs, what) triples,
    all of which must hold; the first that fails names the refusal."""
    for ours, theirs, what in checks:
        ok, why = equal_work(ours, theirs, what)
        if not ok:
            return False, f"refused: {why}"
    return True, f"{num / den:.2f}x"


def drafts_of(results) -> list[list[int]]:
    """A dense run's drafts per prompt as one token list (records, then drafters, in order)."""
    return [[t for rec in r.records for d in rec["drafts"].values() for t in d["tokens"]] for r in results]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", action="store_true", help="use the trained zoo models")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()  # generate()'s deprecation chatter is not a result
    root = Path(tempfile.mkdtemp(prefix="bench_harness_"))
    t_dir, d_dir, e_dir, prompts = build_models(root, a.zoo)
    model, tok = lm.load_lm(t_dir), lm.load_tokenizer(t_dir)
    draft = lm.load_lm(d_dir)
    tgt = Target(model, tok)
    N, k = a.max_new_tokens, a.k
    # Equal work: the same stopping rule as our loop (the target's eos ids, the same budget);
    # no min_new_tokens, which would make generate() run on past EOS where our loop stops.
    eos = sorted(tgt.eos)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else None)
    gen_kw = dict(max_new_tokens=N, do_sample=False, eos_token_id=eos or None, pad_token_id=pad)
    env = DrafterEnv(model, tok, t_dir)
    specs = ["ngram=ngram:n_min=1,n_max=2", "suffix=suffix", f"draft=draft:path={d_dir}"]
    specs.append(f"eagle=eagle:path={e_dir}" if e_dir else f"eagle=eagle:path={REPO / 'zoo/eagle'}")
    drafters = build_drafters([parse_spec(s) for s in specs], env)

    def ours(name):
        eng = Engine(tgt, {name: drafters[name]}, RunConfig("live", k, N))
        return [eng.run_prompt("b", str(i), p).output for i, p in enumerate(prompts)]

    def hf(**kw):
        return [model.generate(torch.tensor([p]), **gen_kw, **kw)[0, len(p) :].tolist() for p in prompts]

    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    ref, t_plain = timed(lambda: hf(), a.reps)
    n_tok = sum(len(r) for r in ref)
    rows = []
    for label, name, kw in [
        ("draft model", "draft", {"assistant_model": draft}),
        ("prompt lookup", "ngram", {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 2}),
    ]:
        (out_o, t_o), (out_h, t_h) = timed_pair(lambda: ours(name), lambda: hf(**kw), a.reps)
        tps_o, tps_h = sum(map(len, out_o)) / t_o, sum(map(len, out_h)) / t_h  # each side's own tokens
        same, cell = ratio_cell(tps_o, tps_h, (out_o, out_h, "outputs"))
        note = "(target >= 1.0x)" if same else ""
        if same and out_o != ref:  # equal work still, but say that greedy decoding drifted from plain generate()
            note += f" (both differ from plain generate: {equal_work(out_o, ref)[1]})"
        rows.append((label, tps_o, tps_h, same, cell, note))

    # dense logging: our batched teacher forcing vs the naive per-position loop
    def dense(naive: bool, generator=None):
        eng = Engine(tgt, drafters, RunConfig("dense", k, N, generator=generator))
        if naive:
            for d in drafters.values():  # the base class's dense: draft() at every position
                d.dense = (lambda dd: lambda seq, done: Drafter.dense(dd, seq, done))(d)
        try:
            return [eng.run_prompt("b", str(i), p) for i, p in enumerate(prompts)]
        finally:
            for d in drafters.values():
                d.__dict__.pop("dense", None)

    def fresh_suffix():  # its corpus of earlier outputs must start empty for every timed run
        drafters["suffix"] = type(drafters["suffix"])("suffix", {}, env)

    res_fast, t_fast = timed(lambda: dense(False), a.reps, fresh_suffix)
    res_gen, t_gen = timed(lambda: dense(False, "ngram"), a.reps, fresh_suffix)
    res_naive, t_naive = timed(lambda: dense(True), max(1, a.reps - 2), fresh_suffix)
    y_fast, y_gen, y_naive = ([r.output for r in res] for res in (res_fast, res_gen, res_naive))
    pairs = [
        (a["drafts"][n], b["drafts"][n])
        for rf, rn in zip(res_fast, res_naive)
        for a, b in zip(rf.records, rn.records)
        for n in a["drafts"]
    ]
    conf_diff = max((abs(u - v) for x, y in pairs for f in ("conf", "entropy") for u, v in zip(x[f], y[f])), default=0)
    n_blocks = sum(len(r.records) for r in res_fast)
    # Dense vs plain generate(): the same y. Naive vs batched: the same y and the same drafts.
    naive_vs = lambda res, y: ((y_naive, y, "outputs"), (drafts_of(res_naive), drafts_of(res), "drafts"))
    dense_rows = [
        (
            "  ours (teacher-forced)",
            t_fast,
            ratio_cell(t_fast, t_plain, (y_fast, ref, "outputs")),
            "vs plain generate (target <= 3x)",
        ),
        (
            "  ours, y by ngram spec.",
            t_gen,
            ratio_cell(t_gen, t_plain, (y_gen, ref, "outputs")),
            "vs plain generate (sweep --generator ngram)",
        ),
        (
            "  naive k steps/position",
            t_naive,
            ratio_cell(t_naive, t_fast, *naive_vs(res_fast, y_fast)),
            "slower than ours (target >= 5x)",
        ),
        (
            "  naive vs y by ngram spec.",
            t_naive,
            ratio_cell(t_naive, t_gen, *naive_vs(res_gen, y_gen)),
            "slower than ours with --generator ngram (target >= 5x)",
        ),
    ]

    print(
        f"\nbench_harness: {len(prompts)} prompts, <= {N} new tokens each (stop at EOS), k={k}, torch threads 1, "
        f"models: {'zoo' if a.zoo else 'tiny random (target 128x4, draft 32x1 distilled)'}"
    )
    print(f"{'live, tokens/s':<28}{'ours':>10}{'transformers':>14}  {'identical output':<18}ratio")
    for label, o, h, same, cell, note in rows:
        print(f"{label:<28}{o:>10.1f}{h:>14.1f}  {same!s:<18}{cell} {note}".rstrip())
    print(f"plain greedy generate(): {n_tok / t_plain:.1f} tokens/s ({n_tok} tokens, {t_plain:.2f} s)")
    print(f"{'dense logging, 4 drafters':<28}{'seconds':>10}{'':>14}  {'identical output':<18}ratio")
    for label, t, (same, cell), note in dense_rows:
        print(f"{label:<28}{t:>10.2f}{'':>14}  {same!s:<18}{cell} {note if same else ''}".rstrip())
    print(f"  {n_blocks} records; naive vs batched conf/entropy within {conf_diff:.1e} (batched float sums)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
