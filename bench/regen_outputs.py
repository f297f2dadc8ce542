"""Cross-check a run's outputs.jsonl with transformers alone: greedy `generate` from each line's prompt_ids must
give its output_ids token for token.

    python bench/regen_outputs.py RUN [--gguf FILE] [--limit N] [--per-workload N [--shortest]] [--threads T]
                                      [--out FILE]

The target is loaded independently of the harness's model code: a run whose manifest has `target.converted_from`
(harness/models/gguf.py) is loaded straight from the GGUF file (the installed package's, or --gguf), after its sha256 is
checked against the one the manifest records; any other from the safetensors directory the manifest names. Each
line is regenerated with `model.generate(do_sample=False)` at float32 under the run's max_new_tokens, stopping on
the generation config's EOS tokens (else the tokenizer's), as the harness does; the checkpoint's other generation
settings (a repetition penalty...) are dropped: the harness decodes by plain argmax. Prints one line per differing
prompt, a per-workload table, and exits 1 when any prompt differs, 0 when all are identical. A run or file it
cannot use is one `error:` line (exit 1, or 3 for a file the system refuses). Writes nothing unless --out FILE (a
JSON summary). Greedy only: a run at temperature > 0 logged coupled samples, which greedy cannot regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bandit.logs.errors import InputError, UsageError
from bandit.logs.outputs import write_all
from bandit.logs.schema import common_prefix
from harness.models import gguf as hgguf
from harness.models.lm import models_root

FIELDS = ("workload", "prompt_id", "prompt_ids", "output_ids")


def read_run(run: Path) -> tuple[dict, dict, list[dict]]:
    """(manifest, settings, outputs lines) of a run directory; any problem is one InputError line."""
    if not run.is_dir():
        raise InputError(f"{run}: no such run directory")
    docs = {}
    for name in ("manifest.json", "settings.json"):
        try:
            docs[name] = json.loads((run / name).read_text())
        except FileNotFoundError:
            raise InputError(f"{run}: no {name} (not a run directory of sweep.py?)") from None
        except ValueError as e:
            raise InputError(f"{run / name}: not JSON ({e})") from None
    m, s = docs["manifest.json"], docs["settings.json"]
    max_new = s.get("max_new_tokens") if isinstance(s, dict) else None
    if not isinstance(m, dict) or not isinstance(max_new, int) or max_new < 1:
        raise InputError(f"{run}: settings.json has no max_new_tokens (or manifest.json is not an object)")
    if (m.get("temperature") or 0) > 0:
        raise InputError(f"{run}: decoded at temperature {m['temperature']}: its outputs are samples, not greedy")
    paths = sorted(run.glob("outputs*.jsonl"))  # outputs.jsonl (one process), outputs-sIofN.jsonl (shard I of N)
    if not paths:
        raise InputError(f"{run}: no outputs.jsonl (a run from before it: python -m harness.outputs {run})")
    lines = []
    for path in paths:
        # after the last newline: nothing, or the line a running (or killed) sweep has not finished writing
        for n, raw in enumerate(path.read_text().split("\n")[:-1], 1):
            try:
                rec = json.loads(raw)
                ok = isinstance(rec, dict) and all(f in rec for f in FIELDS)
                ok = ok and all(isinstance(t, int) for t in rec["prompt_ids"] + rec["output_ids"])
                ok = ok and rec["prompt_ids"]
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise InputError(f"{path}:{n}: malformed line (want JSON with {', '.join(FIELDS)}, token ids as ints)")
            lines.append(rec)
    return m, s, lines


def select(lines: list[dict], per_workload: int | None, shortest: bool, limit: int | None) -> list[dict]:
    """The first `per_workload` lines of each workload (or its `shortest` outputs), then the first `limit`."""
    if per_workload is not None:
        by = defaultdict(list)
        for r in lines:
            by[r["workload"]].append(r)
        keep = set()
        for rs in by.values():
            rs = sorted(rs, key=lambda r: len(r["output_ids"])) if shortest else rs  # stable: ties in file order
            keep |= {id(r) for r in rs[:per_workload]}
        lines = [r for r in lines if id(r) in keep]
    return lines[:limit] if limit is not None else lines


def target_source(manifest: dict, gguf: Path | None) -> tuple[str, Path]:
    """("gguf", file) for a target converted from a GGUF (its sha256 checked), else ("dir", safetensors dir)."""
    t = manifest.get("target") or {}
    src = t.get("converted_from")
    if src:
        if gguf is None:
            known = [p for p in hgguf.PACKAGED.values() if p.file == src.get("file")]
            if not known:
                raise InputError(f"target converted from {src.get('file')!r}, not a packaged GGUF: give --gguf FILE")
            gguf = hgguf.packaged_file(known[0])
        if not gguf.is_file():
            raise InputError(f"{gguf}: no such GGUF file")
        sha = hgguf.file_sha256(gguf)
        if sha != src.get("sha256"):
            raise InputError(
                f"{gguf}: sha256 {sha[:16]}... is not the run's source {str(src.get('sha256'))[:16]}... "
                "(manifest target.converted_from): a different file than the run was converted from"
            )
        return "gguf", gguf
    p, root = Path(str(t.get("path") or "")), models_root()
    tried = [p] if p.is_absolute() else [REPO / p] + ([root / p] if root else [])  # as harness/models/lm.py resolves
    for d in tried:
        if (d / "config.json").is_file() and any(d.glob("*.safetensors")):
            return "dir", d
    raise InputError(f"target {t.get('path')!r}: no safetensors model directory at {', '.join(map(str, tried))}")


def load(kind: str, path: Path):
    """(model, eos ids, pad id) through transformers alone: float32, no network, no checkpoint code."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    dkw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"  # renamed in 5.x
    kw = dict(local_files_only=True, trust_remote_code=False)
    where, kw = (str(path.parent), {**kw, "gguf_file": path.name}) if kind == "gguf" else (str(path), kw)
    model = AutoModelForCausalLM.from_pretrained(where, **kw, **{dkw: torch.float32}).eval()
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = AutoTokenizer.from_pretrained(where, **kw).eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    # plain argmax as the harness decodes: none of the checkpoint's generation settings (a repetition penalty...)
    model.generation_config = GenerationConfig(eos_token_id=eos or None, pad_token_id=pad)
    return model, eos, pad


def regenerate(model, prompt_ids: list[int], max_new: int, eos: list[int], pad: int) -> list[int]:
    import torch

    x = torch.tensor([prompt_ids])
    kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=eos or None, pad_token_id=pad)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)
    return out[0, len(prompt_ids) :].tolist()


def divergence(logged: list[int], made: list[int]) -> int | None:
    """The first position where the two differ (one ending early counts), None when identical."""
    return None if logged == made else common_prefix(logged, made)


def check(model, recs: list[dict], max_new: int, eos: list[int], pad: int) -> list[dict]:
    from tqdm import tqdm

    res = []
    for r in (bar := tqdm(recs, unit="prompt", desc="generate", file=sys.stderr)):
        made = regenerate(model, r["prompt_ids"], max_new, eos, pad)
        pos = divergence(r["output_ids"], made)
        res.append({"workload": r["workload"], "prompt_id": r["prompt_id"], "divergence": pos})
        if pos is not None:
            a, b = (ids[pos] if pos < len(ids) else "(end)" for ids in (r["output_ids"], made))
            bar.write(
                f"DIFFERS {r['workload']} {r['prompt_id']}: at position {pos}: logged {a}, generate {b} "
                f"({len(r['output_ids'])} logged, {len(made)} generated tokens)"
            )
    return res


def table(res: list[dict]) -> tuple[str, dict]:
    """Per workload: prompts, identical, and the earliest position where one of them diverged."""
    by = defaultdict(list)
    for r in res:
        by[r["workload"]].append(r)
    summary = {
        w: {
            "prompts": len(rs),
            "identical": sum(r["divergence"] is None for r in rs),
            "first_divergence": min((r["divergence"] for r in rs if r["divergence"] is not None), default=None),
        }
        for w, rs in by.items()
    }
    rows = [("workload", "prompts", "identical", "first divergence")]
    for w, s in summary.items():
        rows.append((w, str(s["prompts"]), str(s["identical"]), str(s["first_divergence"]).replace("None", "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    text = "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)
    return text, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory of sweep.py (with outputs.jsonl)")
    ap.add_argument("--gguf", type=Path, help="the GGUF file of a converted target (default: the installed package's)")
    ap.add_argument("--limit", type=int, help="at most N prompts in all")
    ap.add_argument("--per-workload", type=int, help="the first N prompts of each workload")
    ap.add_argument("--shortest", action="store_true", help="with --per-workload: the N shortest outputs instead")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    ap.add_argument("--out", type=Path, help="write a JSON summary here")
    a = ap.parse_args(argv)
    if any(v is not None and v < 1 for v in (a.limit, a.per_workload, a.threads)):
        raise UsageError("--limit, --per-workload and --threads take a positive count")
    manifest, settings, lines = read_run(a.run)
    max_new = settings["max_new_tokens"]
    if settings.get("dtype", "float32") != "float32":
        print(f"note: the run decoded in {settings['dtype']}; regenerating in float32 may differ at near-ties")
    recs = select(lines, a.per_workload, a.shortest, a.limit)
    if not recs:
        raise InputError(f"{a.run}: outputs.jsonl has no prompts to check")
    kind, path = target_source(manifest, a.gguf)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"{a.run}: {len(recs)} of {len(lines)} prompts, max_new_tokens {max_new}, target from {kind} {path}")
    model, eos, pad = load(kind, path)
    res = check(model, recs, max_new, eos, pad)
    text, summary = table(res)
    print(text)
    differ = [r for r in res if r["divergence"] is not None]
    print(f"{len(res) - len(differ)} of {len(res)} prompts identical" + (f"; {len(differ)} differ" if differ else ""))
    if a.out:
        rec = {"run": str(a.run), "target": {kind: str(path)}, "max_new_tokens": max_new, "eos": eos}
        write_all([(a.out, json.dumps({**rec, "workloads": summary, "prompts": res}, indent=1) + "\n")])
    return 1 if differ else 0


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
