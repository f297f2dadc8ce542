"""The vllm tier: draft heads written by the project, decoded by vLLM 0.32 (bench/vllm_heads.py).

* an EAGLE-3 head written by harness.models.eagle3.write_random in the speculators layout, given to vLLM as
  speculative_config and as the model itself (vLLM then reads the verifier and the draft length from
  `speculators_config` and serves the verifier), and one in the original (SpecForge) layout;
* zoo/medusa converted to the Medusa-1 layout (medusa-llm's), which our own loader reads back to the same heads, and
  whose vLLM counters equal our MedusaDrafter's on those heads walked as vLLM walks, prompt by prompt;

each decoding the zoo target's prompts greedily with outputs equal to transformers' greedy outputs. (zoo/eagle is not
decoded: vLLM's EAGLE-1 model has no fc bias and no input norm, and zoo/eagle has both; see bench/vllm_heads.py.)

Run with `bash .ci/tiers.sh vllm`.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import upstream

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "vllm_heads.py"
pytestmark = pytest.mark.tier_vllm


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    upstream("vllm", "vllm")
    out = tmp_path_factory.mktemp("heads") / "heads.json"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_head_decodes_in_vllm_as_greedy(heads):
    assert len(heads["variants"]) == 4
    for name, v in heads["variants"].items():
        assert "refused" not in v, (name, v.get("refused"))
        assert v["outputs_equal"] == heads["prompts"] == 6, name
        assert v["served"] == str(REPO / "zoo" / "target"), name  # the verifier, also when given the head alone
        assert v["metrics"]["num_drafts"] > 0, name  # the head drafted: speculative decoding ran
    eagle = [v for n, v in heads["variants"].items() if n.startswith("eagle3")]
    assert {v["method"] for v in eagle} == {"eagle3"} and {v["num_speculative_tokens"] for v in eagle} == {4}
    med = heads["variants"]["medusa (zoo/medusa in the Medusa-1 layout)"]
    assert med["method"] == "medusa" and med["metrics"]["num_accepted_tokens"] > 0  # trained heads: accepted
    # and our MedusaDrafter on the converted heads, walked as vLLM walks, drafts and accepts exactly what vLLM did
    assert med["by_prompt"]["zero_gap"] == med["by_prompt"]["prompts"] == 6


def test_a_head_trained_by_zoo_eagle3_train_decodes_in_vllm_as_greedy(tmp_path):
    """The trainer's own output (speculators layout, a draft vocabulary smaller than the target's: d2t/t2d), on the
    zoo target: data by zoo.distill, a few steps of zoo.eagle3_train, then vLLM decodes with it."""
    upstream("vllm", "vllm")
    target = REPO / "zoo" / "target"
    run = lambda *a: subprocess.run([sys.executable, "-m", *a], cwd=REPO, capture_output=True, text=True, timeout=900)
    r = run("zoo.distill", "--target", str(target), "--out", str(tmp_path / "data"), "--tokens", "300", "--batch", "4",
            "--magpie", "0", "--max-new-tokens", "24", "--threads", "1", "--layers", "1,2,3,4")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("zoo.eagle3_train", "--data", str(tmp_path / "data"), "--target", str(target), "--out", str(tmp_path / "e3"),
            "--layer-ids", "1,2,3", "--vocab", "2048", "--sizes", "2048", "--steps", "4", "--batch", "2",
            "--heldout-prompts", "1", "--max-len", "96", "--threads", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "trained.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--trained", str(tmp_path / "e3"), "--target", str(target),
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert "refused" not in got, got.get("refused")
    assert got["draft_vocab_size"] == 2048 and got["outputs_equal"] == got["prompts"] == 6
    assert got["metrics"]["num_drafts"] > 0


def test_medusa1_layout_reads_back_to_the_same_heads(tmp_path):
    upstream("vllm", "vllm")
    spec = importlib.util.spec_from_file_location("vllm_heads", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from harness.models import lm
    from harness.models.heads import MedusaHeads

    target = lm.load_lm(REPO / "zoo" / "target", dtype="float32")
    out = mod.medusa1_layout(REPO / "zoo" / "medusa", tmp_path / "m1", target)
    a, b = MedusaHeads.load(REPO / "zoo" / "medusa", target), MedusaHeads.load(out, target)
    feats = torch.randn(3, 5, target.config.hidden_size)
    assert torch.equal(a(feats), b(feats))
