"""Self-distillation data at scale: the target's own greedy continuations and its states, made here, offline.

    python -m zoo.distill [--models DIR] [--target smollm2-135m-instruct] [--out DIR] [--tokens 1000000]
        [--batch 64] [--max-new-tokens 256] [--magpie 2200] [--magpie-reserve 1200] [--seed 0] [--threads N] [--layers I,J,..] [--stage all|prompts|generate|pack]

1. prompts: the four sources of zoo/distill_prompts.py (self-written Magpie instructions, sampled in batches and
   kept in <out>/magpie/; edit tasks on other stdlib files; HumanEval's train part; templates), every prompt's
   hashes checked against the campaign's; the pool, shuffled by --seed, in <out>/prompts.jsonl.
2. generate: the pool in chunks of --batch prompts (near-equal lengths within each group of 8 chunks), each
   continued greedily by zoo/distill_gen.py on the oneDNN forward (harness/models/kernels.py) and written
   atomically as <out>/chunks/chunk-NNNNN.safetensors (token ids, offsets, prompt lengths, and the target's
   states at FEATURE layers as float16) until --tokens generated tokens are there. A killed run resumes at its
   first missing chunk. Before the first chunk, the first prompts are decoded one at a time by the same code
   (batch 1): the throughput ratio and the token-for-token agreement with the batched outputs go in the card.
3. pack: <out>/tokens.parquet (one row per sequence: source, prompt id, prompt hashes, chunk, row, lengths,
   ids) and the card, <out>/card.json and <out>/README.md: sources, counts per source, token counts, the
   disjointness check, throughput, and the sha256 of every file.

The data is not committed; this one command rebuilds it (the default --out is <models>/smollm2-distill).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bandit.logs import limits
from bandit.logs.errors import HANDLED, UsageError, exit_code, message
from bandit.logs.safeio import write_file, write_text
from harness.models import lm
from harness.models.gguf import file_sha256
from workloads import PromptItem

from . import distill_prompts as DP
from .heads import portable

FORMAT = "specbandit-distill-v1"
STAGES = ("all", "prompts", "generate", "pack")
MAGPIE_BATCH, MAGPIE_MAX_NEW = 96, 64  # instruction samples per batch, and their length limit
MAGPIE_TEMPERATURE, MAGPIE_TOP_P = 1.0, 0.995
SINGLE_PROMPTS = 3  # prompts decoded one at a time for the throughput ratio and the agreement check
GROUP = 8  # chunks whose prompts are sorted by length together (less padding, same mix per group)


def feature_layers(n_layers: int) -> list[int]:
    """hidden_states indices stored: EAGLE-3's low/middle/high default (speculators': 2, L//2, L-3; DFlash
    reads the same as target_layer_ids 1, L//2-1, L-4) and the final state (EAGLE-1 and Medusa's input)."""
    return sorted({min(2, n_layers), n_layers // 2, max(n_layers - 3, 0), n_layers})


def parser() -> argparse.ArgumentParser:
    ap = limits.Parser(
        prog="python -m zoo.distill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", help="models root (else $SPECBANDIT_MODELS)")
    ap.add_argument("--target", default="smollm2-135m-instruct", help="the target's directory or a name under --models")
    ap.add_argument("--out", help="the dataset directory (default <models>/smollm2-distill)")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="generated tokens to reach")
    ap.add_argument("--batch", type=int, default=64, help="sequences per batch")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="tokens per continuation")
    ap.add_argument("--magpie", type=int, default=2200, help="self-written instructions to keep (0: none)")
    ap.add_argument("--magpie-reserve", type=int, default=1200, help="more of them, used only when --tokens needs them")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="CPU threads (default: every core)")
    ap.add_argument("--layers", help="hidden_states indices to store, comma-separated (default: 2, L//2, L-3, L)")
    ap.add_argument("--stage", choices=STAGES, default="all")
    return ap


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bar(total: int, initial: int, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, file=sys.stderr)


# ------------------------------------------------------------------------------------------ prompts


def magpie(model, tok, out: Path, n: int, seed: int, eos: set[int]) -> list[PromptItem]:
    """n distinct self-written instructions, sampled MAGPIE_BATCH at a time; each batch kept as one file."""
    import torch

    from . import distill_gen as G

    mark = "\x00MAGPIE\x00"
    text = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=False)
    pre = tok(text[: text.index(mark)], add_special_tokens=False).input_ids
    d = out / "magpie"
    d.mkdir(parents=True, exist_ok=True)
    kept: dict[str, PromptItem] = {}
    b = 0
    pb = bar(n, 0, "instr")
    while len(kept) < n:
        f = d / f"batch-{b:05d}.json"
        if f.is_file():
            rows = json.loads(f.read_text())
        else:
            g = torch.Generator().manual_seed(
                int.from_bytes(hashlib.sha256(f"{seed}:{b}".encode()).digest()[:8], "big") >> 1
            )
            got = G.generate(model, [pre] * MAGPIE_BATCH, MAGPIE_MAX_NEW, eos, [], tok.pad_token_id or 0,
                             G.Sampling(MAGPIE_TEMPERATURE, MAGPIE_TOP_P, g))  # fmt: skip
            rows = [
                {"text": tok.decode([t for t in r.output if t not in eos]).strip(), "finished": r.finished} for r in got
            ]
            write_text(f, json.dumps(rows, indent=0))
        for i, r in enumerate(rows):
            h = DP.text_hash(r["text"])
            if len(kept) < n and h not in kept and DP.keep_instruction(r["text"], r["finished"]):
                kept[h] = DP.chat("magpie", f"b{b}-{i}", r["text"])
        pb.n = len(kept)
        pb.refresh()
        b += 1
        if b > 50 * max(1, n // MAGPIE_BATCH + 1):
            raise UsageError(f"magpie: only {len(kept)} of {n} instructions kept after {b} batches; lower --magpie")
    pb.close()
    log(f"magpie: {len(kept)} instructions kept of {b * MAGPIE_BATCH} sampled ({b} batches)")
    return list(kept.values())


def build_pool(model, tok, out: Path, a, eos: set[int]) -> list[dict]:
    """The prompts in the order they are generated: the sources shuffled together, then the reserve (more
    self-written instructions) shuffled on its own, used only when the first part gives fewer than --tokens (so
    a larger reserve never changes the chunks made before it)."""
    reserve = getattr(a, "magpie_reserve", 0) if a.magpie else 0
    mag = magpie(model, tok, out, a.magpie + reserve, a.seed, eos) if a.magpie else []
    items = mag[: a.magpie] + DP.stdlib_edits(a.seed) + DP.humaneval_train() + DP.templates(a.seed)
    banned, n_campaign = DP.campaign_hashes(tok)
    first = _checked(tok, items, banned)
    rest = _checked(tok, mag[a.magpie :], banned, {p["ids_sha256"] for p in first[0]})
    order = np.random.default_rng([a.seed, 3]).permutation(len(first[0]))
    pool = [first[0][i] for i in order]
    pool += [rest[0][i] for i in np.random.default_rng([a.seed, 4]).permutation(len(rest[0]))]
    dropped = first[1] + rest[1]
    head = {"campaign_prompts": n_campaign, "dropped_as_campaign": dropped, "seed": a.seed, "reserve": len(rest[0])}
    write_text(out / "prompts.jsonl", "\n".join([json.dumps(head)] + [json.dumps(p) for p in pool]) + "\n")
    log(f"prompts: {len(pool)} in the pool ({len(rest[0])} in reserve), {dropped} dropped as the campaign's "
        f"(of {n_campaign} campaign prompts)")  # fmt: skip
    return pool


def _checked(tok, items: list[PromptItem], banned: set[str], seen: set[str] | None = None) -> tuple[list[dict], int]:
    """(the items as pool entries, how many were dropped as the campaign's); repeats of a rendered prompt dropped."""
    pool, dropped, seen = [], 0, set(seen or ())
    for p in items:
        ids = p.token_ids(tok)
        hi, ht = DP.ids_hash(ids), DP.text_hash(DP.user_text(p))
        if hi in banned or ht in banned:
            dropped += 1
            continue
        if hi in seen:
            continue
        seen.add(hi)
        pool.append({"source": p.workload, "prompt_id": p.prompt_id, "messages": p.messages, "ids_sha256": hi,
                     "text_sha256": ht, "n_prompt": len(ids)})  # fmt: skip
    return pool, dropped


def read_pool(out: Path) -> tuple[dict, list[dict]]:
    lines = (out / "prompts.jsonl").read_text().splitlines()
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


def chunks(pool: list[dict], batch: int) -> list[list[int]]:
    """Pool indices per chunk: each group of GROUP*batch prompts sorted by length, then cut into chunks."""
    out = []
    for g in range(0, len(pool), GROUP * batch):
        idx = sorted(range(g, min(g + GROUP * batch, len(pool))), key=lambda i: (pool[i]["n_prompt"], i))
        out += [idx[i : i + batch] for i in range(0, len(idx), batch)]
    return out


# ------------------------------------------------------------------------------------------ generation


def chunk_path(out: Path, c: int) -> Path:
    return out / "chunks" / f"chunk-{c:05d}.safetensors"


def timing_path(out: Path, c: int) -> Path:
    return out / "chunks" / f"chunk-{c:05d}.timing.json"


def read_chunk_meta(path: Path) -> dict | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np") as f:
            return json.loads(f.metadata()["distill"])
    except Exception:  # a torn or foreign file is made again
        return None


def generate_stage(model, tok, out: Path, a, eos: set[int], keys: list[str], pool: list[dict]) -> None:
    from safetensors.numpy import save

    from . import distill_gen as G

    plan = chunks(pool, a.batch)
    (out / "chunks").mkdir(parents=True, exist_ok=True)
    ids_of = lambda i: PromptItem(pool[i]["source"], pool[i]["prompt_id"], messages=pool[i]["messages"]).token_ids(tok)
    single = out / "single.json"
    if not single.is_file():
        log(f"generate: {SINGLE_PROMPTS} prompts one at a time (the throughput baseline)")
        rows, t0 = [], time.perf_counter()
        for i in plan[0][:SINGLE_PROMPTS]:
            rows += G.generate(model, [ids_of(i)], a.max_new_tokens, eos, keys, tok.pad_token_id or 0, G.Sampling())
        dt = time.perf_counter() - t0
        n = sum(len(r.output) for r in rows)
        write_text(single, json.dumps({"prompts": [pool[i]["ids_sha256"] for i in plan[0][:SINGLE_PROMPTS]],
                                       "outputs": [r.output for r in rows], "tokens": n, "seconds": dt}))  # fmt: skip
    made, c = 0, 0
    for c, idx in enumerate(plan):  # what the earlier chunks hold
        meta = read_chunk_meta(chunk_path(out, c))
        stale = meta is None or meta["prompts"] != [pool[i]["ids_sha256"] for i in idx]
        if stale or not timing_path(out, c).is_file():
            break
        made += int(meta["n_output"])
        if made >= a.tokens:
            log(f"generate: done earlier ({made} tokens in {c + 1} chunks)")
            return
    else:
        raise UsageError(f"the prompt pool ({len(pool)}) gives only {made} tokens; raise --magpie or lower --tokens")
    pb = bar(a.tokens, min(made, a.tokens), "tok")
    start = c
    for c in range(start, len(plan)):
        idx = plan[c]
        t0 = time.perf_counter()
        rows = G.generate(
            model, [ids_of(i) for i in idx], a.max_new_tokens, eos, keys, tok.pad_token_id or 0, G.Sampling()
        )
        dt = time.perf_counter() - t0
        toks = np.concatenate([np.asarray(r.ids, np.int32) for r in rows])
        feats = np.concatenate([r.feats for r in rows])
        if not np.isfinite(feats).all():
            raise UsageError(f"chunk {c}: a target state overflows float16; cannot store it")
        offs = np.cumsum([0] + [len(r.ids) for r in rows]).astype(np.int64)
        n_out = sum(len(r.output) for r in rows)
        meta = {"format": FORMAT, "keys": keys, "prompts": [pool[i]["ids_sha256"] for i in idx], "n_output": n_out}
        blob = save({"ids": toks, "offsets": offs, "n_prompt": np.asarray([len(r.prompt) for r in rows], np.int64),
                     "finished": np.asarray([r.finished for r in rows], np.uint8), "features": feats},
                    {"distill": json.dumps(meta, sort_keys=True)})  # one key: safetensors orders several by a hash  # fmt: skip
        # the timing beside the chunk, written first (a chunk that exists has one), so the chunk's bytes are the
        # same on every run
        write_text(timing_path(out, c), json.dumps({"seconds": round(dt, 3), "threads": a.threads_used}))
        write_file(chunk_path(out, c), lambda f: f.write(blob))
        made += n_out
        pb.update(min(n_out, a.tokens - pb.n))
        if made >= a.tokens:
            break
    pb.close()
    if made < a.tokens:
        raise UsageError(f"the prompt pool ({len(pool)}) gives only {made} tokens; raise --magpie or lower --tokens")
    log(f"generate: {made} tokens in {c + 1} chunks")


# ------------------------------------------------------------------------------------------ pack and card


def pack(out: Path, a, target: Path, target_sha: str) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from safetensors.numpy import load_file

    head, pool = read_pool(out)
    by_hash = {p["ids_sha256"]: p for p in pool}
    cols: dict[str, list] = {k: [] for k in ("source", "prompt_id", "ids_sha256", "text_sha256", "chunk", "row",
                                             "n_prompt", "n_output", "finished", "ids")}  # fmt: skip
    secs, files, c = 0.0, {}, 0
    while chunk_path(out, c).is_file():
        p = chunk_path(out, c)
        meta = read_chunk_meta(p)
        if meta is None:
            raise UsageError(f"{p}: unreadable chunk; rerun --stage generate")
        t = load_file(str(p))
        timing = json.loads(timing_path(out, c).read_text())
        secs += float(timing["seconds"])
        threads = int(timing["threads"])
        for r, h in enumerate(meta["prompts"]):
            lo, hi = int(t["offsets"][r]), int(t["offsets"][r + 1])
            npr = int(t["n_prompt"][r])
            for k, v in (("source", by_hash[h]["source"]), ("prompt_id", by_hash[h]["prompt_id"]), ("ids_sha256", h),
                         ("text_sha256", by_hash[h]["text_sha256"]), ("chunk", c), ("row", r), ("n_prompt", npr),
                         ("n_output", hi - lo - npr), ("finished", bool(t["finished"][r])),
                         ("ids", t["ids"][lo:hi].tolist())):  # fmt: skip
                cols[k].append(v)
        files[str(p.relative_to(out))] = file_sha256(p)
        c += 1
    if not c:
        raise UsageError(f"{out}/chunks: no chunks; run --stage generate first")
    table = pa.table(
        {**{k: v for k, v in cols.items() if k != "ids"}, "ids": pa.array(cols["ids"], pa.list_(pa.int32()))}
    )
    pq.write_table(table, out / "tokens.parquet", compression="zstd")
    files["tokens.parquet"] = file_sha256(out / "tokens.parquet")
    files["prompts.jsonl"] = file_sha256(out / "prompts.jsonl")
    single = json.loads((out / "single.json").read_text())
    first = {h: i for i, h in enumerate(cols["ids_sha256"])}
    agree = [
        cols["ids"][first[h]][cols["n_prompt"][first[h]] :] == o for h, o in zip(single["prompts"], single["outputs"])
    ]
    n_out = int(sum(cols["n_output"]))
    src = {}
    for s, no, npr in zip(cols["source"], cols["n_output"], cols["n_prompt"]):
        d = src.setdefault(s, {"sequences": 0, "generated_tokens": 0, "prompt_tokens": 0})
        d["sequences"] += 1
        d["generated_tokens"] += int(no)
        d["prompt_tokens"] += int(npr)
    meta0 = read_chunk_meta(chunk_path(out, 0))
    card = {
        "format": FORMAT,
        "target": {"path": portable(str(Path(target).resolve()), lm.models_root(a.models)), "sha256": target_sha},
        "feature_keys": meta0["keys"],
        "feature_dtype": "float16",
        "max_new_tokens": a.max_new_tokens,
        "batch": a.batch,
        "seed": a.seed,
        "threads": threads,
        "sequences": len(cols["ids"]),
        "generated_tokens": n_out,
        "prompt_tokens": int(sum(cols["n_prompt"])),
        "sources": src,
        "disjoint": {**head, "rule": "sha256 of the rendered prompt ids and of the normalised user text"},
        "throughput": {
            "batched_tokens_per_s": round(n_out / secs, 1),
            "single_tokens_per_s": round(single["tokens"] / single["seconds"], 1),
            "ratio": round((n_out / secs) / (single["tokens"] / single["seconds"]), 2),
            "single_prompts": len(agree),
            "single_agree_token_for_token": int(sum(agree)),
        },
        "files": files,
        "command": rebuild_command(sys.argv[1:]),
    }
    write_text(out / "card.json", json.dumps(card, indent=1) + "\n")
    write_text(out / "README.md", readme(card))
    return card


def rebuild_command(argv: list[str]) -> str:
    """The command that makes the whole dataset: this one's options but --stage (a stage's run names its options)."""
    out, skip = [], False
    for x in argv:
        if skip or x == "--stage" or x.startswith("--stage="):
            skip = x == "--stage"
            continue
        out.append(x)
    return "python -m zoo.distill " + " ".join(out)


def readme(card: dict) -> str:
    t = card["throughput"]
    lines = [
        "# Self-distillation data (zoo/distill.py)",
        "",
        f"The target's greedy continuations ({card['generated_tokens']:,} generated tokens [MEASURED], "
        f"{card['sequences']:,} sequences, at most {card['max_new_tokens']} new tokens each) with its states at "
        f"{', '.join(card['feature_keys'])} ({card['feature_dtype']}).",
        "",
        "| source | sequences | generated tokens | prompt tokens |",
        "|---|---|---|---|",
        *[
            f"| {s} | {d['sequences']} | {d['generated_tokens']:,} | {d['prompt_tokens']:,} |"
            for s, d in sorted(card["sources"].items())
        ],
        "",
        f"Disjoint from the campaign: {card['disjoint']['dropped_as_campaign']} prompts dropped against "
        f"{card['disjoint']['campaign_prompts']} campaign prompts ({card['disjoint']['rule']}).",
        "",
        f"Throughput [MEASURED, {card['threads']} threads, one run]: {t['batched_tokens_per_s']} tokens/s batched "
        f"(batch {card['batch']}) against {t['single_tokens_per_s']} one sequence at a time: {t['ratio']}x. "
        f"{t['single_agree_token_for_token']} of {t['single_prompts']} sequences decoded one at a time match the "
        "batched outputs token for token.",
        "",
        f"Rebuilt by `{card['command']}`.",
        "",
        "| file | sha256 |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in sorted(card["files"].items())],
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        a = parser().parse_args(argv)
        for flag, v, lo, hi in (("--tokens", a.tokens, 1, 10**10), ("--batch", a.batch, 1, 4096),
                                ("--max-new-tokens", a.max_new_tokens, 1, 1 << 16), ("--magpie", a.magpie, 0, 10**6), ("--magpie-reserve", a.magpie_reserve, 0, 10**6)):  # fmt: skip
            limits.integer(flag, v, lo, hi)
        limits.threads("--threads", a.threads)
        limits.seed("--seed", a.seed)
        if a.out:
            limits.out_dir("--out", a.out)
        import torch

        from harness.models import kernels

        path = lm.resolve_model_dir(a.target, a.models, "--target")
        out = Path(a.out) if a.out else Path(lm.models_root(a.models) or path.parent) / "smollm2-distill"
        if out.is_symlink():
            raise UsageError(f"--out {out}: a symlink; refusing to write through it")
        out.mkdir(parents=True, exist_ok=True)
        a.threads_used = a.threads or os.cpu_count() or 1
        torch.set_num_threads(a.threads_used)
        model, tok = lm.load_lm(path), lm.load_tokenizer(path)
        kernels.apply_kernels(model, "mkldnn")
        eos_id = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        eos = set(eos_id if isinstance(eos_id, (list, tuple)) else [eos_id])
        n = model.config.num_hidden_layers
        try:
            layers = sorted({int(x) for x in a.layers.split(",")}) if a.layers else feature_layers(n)
        except ValueError:
            raise UsageError(f"--layers {a.layers}: expected comma-separated integers") from None
        keys = [lm.hidden_state(i, n) for i in layers]  # (an index outside 0..L: one line naming it)
        if a.stage in ("all", "prompts") or not (out / "prompts.jsonl").is_file():
            pool = build_pool(model, tok, out, a, eos)
        else:
            pool = read_pool(out)[1]
        if a.stage in ("all", "generate"):
            generate_stage(model, tok, out, a, eos, keys, pool)
        if a.stage in ("all", "pack"):
            card = pack(out, a, path, lm.weights_sha256(path))
            log(
                f"pack: {card['generated_tokens']} tokens; throughput {card['throughput']['ratio']}x single; {out}/README.md"
            )
        return 0
    except HANDLED as e:
        print(f"zoo.distill: {message(e)}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("zoo.distill: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
