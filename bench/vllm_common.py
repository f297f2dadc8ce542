"""What the vLLM bridge scripts share (bench/vllm_crosscheck.py, vllm_timing.py, vllm_heads.py): the target (the zoo
target unless a caller passes another model directory, e.g. the converted SmolLM2-135M-Instruct), the prompts
tokenized as the harness does, transformers' greedy outputs, a vLLM LLM on the target, its counters, our sweep on the
same prompts, and the outputs of a sweep's run (a fresh one, or an existing campaign's parts). vLLM itself is imported
only inside the functions that need it (the tier's venv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# vLLM's CPU backend: KV cache size in GiB; no core pinning (the machine is shared)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "zoo" / "target"
ENGINE = "vllm 0.32.0 cpu"


def load_prompts(
    workloads: list[str], limit: int, target: Path = TARGET, models: str | None = None
) -> list[tuple[str, str, list[int]]]:
    """(workload, prompt_id, token ids) tokenized as the harness does (workloads.PromptItem.token_ids), with the
    target's tokenizer (its chat template for chat-form prompts); `models`: the models root, a data root of the
    benchmark files (workloads.py), as the sweep's --models."""
    from transformers import AutoTokenizer

    import workloads as wl

    tok = AutoTokenizer.from_pretrained(target)
    return [(p.workload, p.prompt_id, p.token_ids(tok)) for p in wl.load(workloads, limit=limit, models=models)]


def hf_greedy(prompts: list[list[int]], max_new: int, target: Path = TARGET) -> list[list[int]]:
    """The target's greedy outputs by transformers `generate` at float32 (stops after EOS, kept)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            t = torch.tensor([ids])
            y = model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=max_new)
            outs.append(y[0, len(ids) :].tolist())
    return outs


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First position where two outputs differ (None: equal)."""
    from bandit.logs.schema import common_prefix

    n = common_prefix(a, b)
    return None if n == len(a) == len(b) else n


def hardware() -> dict:
    """The run manifest's hardware record (harness/campaign/manifest.py), with torch's full version and the core count."""
    import torch

    from harness.campaign.manifest import hardware as run_hardware

    cpu = run_hardware("cpu")["cpu"]
    return {"device": "cpu", "torch": torch.__version__, "cpu": cpu, "cores": os.cpu_count(), "gpu": None}


# ------------------------------------------------------------------------------------------------------ vLLM
def make_llm(spec: dict | None, model: str | Path = TARGET, **kw):
    """vLLM on `model` at float32, eager, with `spec` as speculative_config (None: plain decoding); per-request
    spec-decode metrics at the detailed level (each request's ordered (drafted, accepted) per verify step)."""
    from vllm import LLM

    args = dict(model=str(model), dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
    args |= dict(disable_log_stats=False)  # the spec-decode counters are stats
    if spec is not None:
        args |= dict(speculative_config=spec, per_request_spec_decode_metrics="detailed")
    return LLM(**(args | kw))


def ngram_spec(k: int, n_min: int, n_max: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n_max, "prompt_lookup_min": n_min}


def shutdown(llm) -> None:
    """Stop the LLM's engine processes: they would otherwise share the CPU with what follows."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # an in-process engine (the timing run) has no engine processes to stop
        pass


def spec_metrics(llm) -> dict:
    """vLLM's spec-decode counters (cumulative over the LLM's life)."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name.removeprefix("vllm:spec_decode_")] = list(m.values) if hasattr(m, "values") else m.value
    return out


def generate(llm, prompts: list[list[int]], max_new: int, one_at_a_time: bool = False) -> list:
    """vLLM's greedy RequestOutputs for token-id prompts; one_at_a_time: one request after the other (what a
    drafter whose state spans prompts, vLLM's suffix tree, needs for a fixed order)."""
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=max_new)
    if one_at_a_time:
        return [llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0] for p in prompts]
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)


def vllm_per_position(m: dict, k: int) -> dict:
    n = int(m["num_drafts"])
    acc = [int(c) for c in m["num_accepted_tokens_per_pos"]][:k]
    return {
        "drafts": n,
        "draft_tokens": int(m["num_draft_tokens"]),
        "accepted_per_pos": acc,
        "acc": [c / n if n else float("nan") for c in acc],
        "mean_accepted": int(m["num_accepted_tokens"]) / n if n else float("nan"),
    }


# ------------------------------------------------------------------------------------------------------- ours
def run_sweep(
    workloads: list[str],
    limit: int,
    k: int,
    max_new: int,
    drafters: list[str],
    out: Path,
    extra=(),
    target: Path = TARGET,
    models: str | None = None,
):
    """Our dense sweep on the same prompts (a fresh run directory; sweep.py in this interpreter) on `target`;
    `models`: the sweep's --models (a data root of the benchmark files)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(REPO / "sweep.py"), "--target", str(target), "--mode", "dense"]
    cmd += ["--models", str(models)] if models is not None else []
    for d in drafters:
        cmd += ["--drafter", d]
    cmd += ["--workloads", ",".join(workloads), "--limit", str(limit), "--k", str(k)]
    cmd += ["--max-new-tokens", str(max_new), "--dtype", "float32", "--out", str(out), *extra]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def our_outputs(run: Path, sha: bool = False) -> dict:
    """The output of every finished prompt of our run, by workload/prompt_id: the sweep's progress.jsonl keeps it,
    and each shard's progress-sIofN.jsonl in a sharded campaign (harness/campaign/shards.py: a record counts once its line
    is whole). sha: (output, the prompt's token-id hash the line records, or None) instead."""
    from harness.campaign import shards

    out = {}
    for tag in shards.find_parts(run):
        for r, _ in shards.read_progress(run / shards.progress_name(tag)):
            if "output" in r:
                key, y = f"{r['workload']}/{r['prompt_id']}", list(r["output"])
                out[key] = (y, r.get("sha")) if sha else y
    return out
