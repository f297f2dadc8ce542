"""bench/bench_live.py, the harness half (the default environment; vLLM's half is tests/reference/
test_vllm_bench_live.py): on a few prompts of the zoo target its plain decoding and live ngram decoding make
identical outputs, the realised speedup is computed from them, the profile accounts for a live block by part and
puts every function it wrapped back, and a ratio is refused when the work differs."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "bench_live.py"


@pytest.fixture(scope="module")
def bench():
    if not (REPO / "zoo" / "target" / "model.safetensors").exists():
        pytest.fail("zoo/target/model.safetensors missing: run `python -m zoo.train all`")
    spec = importlib.util.spec_from_file_location("bench_live", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run(bench, tmp_path_factory):
    from harness.models import lm
    from harness.models.target import Target

    before = (lm.forward, lm.move_span, lm.crop, Target.verify)
    out = tmp_path_factory.mktemp("bench_live") / "out.json"
    argv = "--limit 1 --reps 1 --max-new-tokens 48 --profile --hf-assist 1 --json".split() + [str(out)]
    assert bench.main(argv) == 0
    assert (lm.forward, lm.move_span, lm.crop, Target.verify) == before  # the profile's clocks are gone again
    return json.loads(out.read_text())


def test_harness_half_is_equal_work_and_computes_the_speedup(run):
    h = run["harness"]
    assert run["settings"]["prompts"] == 2  # code and copy, one each
    assert h["equal_work"] == "yes" and len(h["outputs"]) == 2 and all(h["outputs"])
    assert h["tokens"] == sum(map(len, h["outputs"]))
    assert h["speedup"] == pytest.approx(h["plain_s"] / h["spec_s"])
    assert h["speedup"] > 0 and h["steps_spec"] < h["steps_plain"]  # ngram accepted something on these prompts
    assert h["plain_ms_per_step"] > 0 and h["spec_ms_per_step"] > 0
    assert "vllm" not in run and run.get("ratio") is None  # the vLLM half runs in its tier only


def test_profile_accounts_for_a_block(run):
    p = run["profile"]["live_ms_per_block"]
    assert set(p) == {"draft", "forward", "verify, rest", "cache moves", "prefill", "engine Python", "total"}
    parts = sum(v for k, v in p.items() if k != "total")
    assert parts == pytest.approx(p["total"], rel=1e-6)
    assert p["forward"] > 0 and p["draft"] > 0
    assert run["profile"]["plain_ms_per_token"]["forward"] > 0


def test_assisted_generation_is_compared_on_equal_work(run):
    """transformers' assisted generation (the first layer drafting, as a model of its own and as early exit) makes
    the live loop's outputs, which are plain decoding's: the ratios are computed, the assistant's settings restored."""
    ha = run["hf_assist"]
    assert ha["layers"] == 1 and ha["equal_work"] == {
        "hf_assistant_model": "yes",
        "hf_early_exit": "yes",
        "plain": "yes",
    }
    sec = ha["seconds"]
    assert ha["live_over_hf_early_exit"] == pytest.approx(sec["hf_early_exit"] / sec["live_layerskip"])
    assert ha["live_over_hf_assistant_model"] == pytest.approx(sec["hf_assistant_model"] / sec["live_layerskip"])
    assert ha["tokens"] == run["harness"]["tokens"] and 0 < ha["live_blocks"] <= ha["tokens"]


def test_assistant_settings_are_restored(bench):
    from harness.models import lm

    model = lm.load_lm(REPO / "zoo" / "target")
    gc = model.generation_config
    before = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    with bench._assistant_settings(model, 3):
        assert (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule) == (3, "constant")
        assert gc.assistant_confidence_threshold == 0.0
    assert (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold) == before


def test_a_ratio_needs_identical_outputs(bench):
    assert bench.first_difference([[1, 2], [3]], [[1, 2], [3]]) == ""
    why = bench.first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]])
    assert why == "1 of 2 prompts differ (first: prompt 1, position 1)"
    assert bench.first_difference([[1]], [[1], [2]]) == "1 vs 2 prompts"
    row = bench.side((None, [2.0]), (None, [1.0]), 10, 4, 10, "1 of 2 prompts differ (first: prompt 1, position 1)")
    assert row["speedup"] is None and row["equal_work"].startswith("1 of 2")
    row = bench.side((None, [2.0, 3.0, 2.2]), (None, [1.0, 1.1, 0.9]), 10, 4, 10, "")
    assert row["speedup"] == pytest.approx(2.2 / 1.0) and row["equal_work"] == "yes"
    assert row["plain_ms_per_step"] == pytest.approx(220.0) and row["tokens_per_spec_step"] == 2.5
