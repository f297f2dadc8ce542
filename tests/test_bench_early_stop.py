"""bench/early_stop.py: the ratios and intervals against a hand count on planted lines, the live sample and the
drafter's settings read from a run, refusals as one line, and a whole bench on a planted tiny run whose stopped
drafter drafts one token per call."""

import json

import pytest
import torch

from bandit.logs.errors import InputError, UsageError
from bench import early_stop
from harness.decode import calibrate
from harness.models import lm
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_zoo


def _line(config, wl, pid, tokens, wall_ms, passes, verified, calls=0, draft_ms=0.0):
    name = config.split(":", 1)[1] if ":" in config else None
    return dict(config=config, workload=wl, prompt_id=pid, prompt_len=5, tokens=tokens, wall_ms=wall_ms, passes=passes,
                verified=verified, calls={name: calls} if name else {}, draft_ms={name: draft_ms} if name else {},
                same_as_dense=True)  # fmt: skip


def test_summary_is_a_ratio_of_sums_with_its_interval():
    lines = []
    rows = [("a", "p1", 100, 1000, 800, 700), ("a", "p2", 50, 600, 500, 400), ("b", "p3", 80, 900, 600, 650)]
    for wl, pid, n, wp, wf, ws in rows:
        lines += [
            _line("plain", wl, pid, n, wp, n, n),
            _line("fixed:e", wl, pid, n, wf, n // 2, n // 2 + 4 * (n // 2), n // 2, 10.0 * (n // 2)),
            _line(
                "fixed:e_stop", wl, pid, n, ws, n // 2 + 1, n // 2 + 1 + (n // 2 + 1), n // 2 + 1, 3.0 * (n // 2 + 1)
            ),
        ]
    s = early_stop.summarize(lines, "e", ["a", "b"], 500, 0)
    a = s["a"]
    assert a["speedup"]["value"] == pytest.approx(round((150 / 1300) / (150 / 1600), 4))
    assert a["speedup_stop"]["value"] == pytest.approx(round((150 / 1100) / (150 / 1600), 4))
    assert a["stop_over_full"]["value"] == pytest.approx(round(1300 / 1100, 4))
    assert a["tokens_per_pass"]["value"] == pytest.approx(round(150 / 75, 4))
    assert a["drafted_per_pass"] == 4.0 and a["drafted_per_pass_stop"] == 1.0 and a["ms_per_call"] == 10.0
    pooled = s["pooled"]
    assert pooled["prompts"] == 3 and pooled["speedup"]["value"] == pytest.approx(round(2500 / 1900, 4))
    for r in s.values():
        for k in early_stop.STATS:
            assert r[k]["lo"] <= r[k]["value"] <= r[k]["hi"]
    assert s["b"]["speedup"]["lo"] == s["b"]["speedup"]["hi"]  # one prompt: nothing to resample
    assert s["pooled"]["speedup"]["lo"] < s["pooled"]["speedup"]["hi"]


def _planted(tmp_path, z, model, tok, n=2):
    run = tmp_path / "run"
    run.mkdir()
    target = Target(model, tok)
    prompts = [(w, p, tok(t).input_ids) for w, p, t in PROMPTS[:n]]
    outs = [target.generate(list(ids), 12, 0)[0] for _, _, ids in prompts]
    manifest = {
        "target": {"path": str(z["target"])},
        "hardware": {"threads": 1},
        "kernels": {"requested": "default"},
        "drafters": {
            "eagle": {"kind": "eagle", "settings": {"path": str(z["root"] / "eagle"), "batch": 256}},
            "medusa": {"kind": "medusa", "settings": {"path": str(z["root"] / "medusa")}},
        },
    }
    settings = {"k": 4, "max_new_tokens": 12, "temperature": 0.0, "seed": 0, "dtype": "float32", "device": "cpu"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "settings.json").write_text(json.dumps(settings))
    lines = [_line(c, w, p, len(o), 10.0, len(o), len(o)) for (w, p, _), o in zip(prompts, outs) for c in ("plain",)]
    (run / "live.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "outputs-s0of1.jsonl").write_text(
        "".join(
            json.dumps({"workload": w, "prompt_id": p, "prompt_ids": list(ids), "output_ids": list(o)}) + "\n"
            for (w, p, ids), o in zip(prompts, outs)
        )
    )
    return run, prompts


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    z = make_zoo(tmp_path_factory.mktemp("es"))
    return z, lm.load_lm(z["target"]), lm.load_tokenizer(z["target"])


def _bench(tmp_path, zoo, *args) -> tuple[dict, list]:
    """The bench on a planted run of the tiny zoo: (its JSON, the run's prompts)."""
    z, model, tok = zoo
    torch.set_num_threads(1)
    run, prompts = _planted(tmp_path, z, model, tok)
    out = tmp_path / "es.json"
    early_stop.main(["--run", str(run), "--drafter", "eagle", "--resamples", "100", "--json", str(out), *args])
    return json.loads(out.read_text()), prompts


def test_the_whole_bench_on_a_planted_run(tmp_path, zoo):
    # a random head's confidences are all below 0.05: every stopped draft is its first token
    got, prompts = _bench(tmp_path, zoo, "--stop", "0.05")
    assert got["label"] == "MEASURED" and got["prompts"] == [f"{w}/{p}" for w, p, _ in prompts]
    pooled = got["by_workload"]["pooled"]
    assert pooled["drafted_per_pass_stop"] <= 1.0 and pooled["drafted_per_pass"] > 2.0
    assert pooled["prompts"] == len(prompts)
    assert got["specs"][1].endswith("stop_below=0.05") and "layers" not in got["specs"][0]


def test_the_sample_and_its_cut(tmp_path, zoo):
    z, model, tok = zoo
    run, prompts = _planted(tmp_path, z, model, tok, n=4)
    manifest, sample, texts = early_stop.read_run(run)
    assert sample == [(w, p) for w, p, _ in prompts] and set(texts) == set(sample)
    first = sample[0][0]
    assert early_stop.chosen(sample, [first], 1) == [sample[0]]
    with pytest.raises(UsageError, match="--workloads nope: not in the live sample"):
        early_stop.chosen(sample, ["nope"], None)
    with pytest.raises(UsageError, match="drafts in one forward"):
        early_stop.spec_of(manifest, "medusa", 0.4)
    with pytest.raises(UsageError, match="not a drafter of the run"):
        early_stop.spec_of(manifest, "eagle3", 0.4)
    assert early_stop.spec_of(manifest, "eagle", 0.4).startswith("eagle_stop=eagle:path=")


@pytest.mark.parametrize("fault", ["no live", "bad line", "no settings", "missing output"])
def test_a_bad_run_is_one_line(tmp_path, zoo, fault):
    z, model, tok = zoo
    run, _ = _planted(tmp_path, z, model, tok)
    if fault == "no live":
        (run / "live.jsonl").unlink()
    elif fault == "bad line":
        (run / "live.jsonl").write_text('{"config": "plain"\n')
    elif fault == "no settings":
        (run / "settings.json").write_text("{}")
    else:
        (run / "outputs-s0of1.jsonl").write_text("")
    with pytest.raises(InputError) as e:
        early_stop.read_run(run)
    assert "\n" not in str(e.value) and str(run) in str(e.value)


def test_bad_options_are_refused_before_any_model(tmp_path):
    for argv, msg in (
        (["--stop", "0"], "--stop"),
        (["--stop", "1.5"], "--stop"),
        (["--resamples", "5"], "--resamples"),
    ):
        with pytest.raises(UsageError, match=msg):
            early_stop.main([*argv, "--run", str(tmp_path)])


def test_the_default_threshold_is_transformers():
    import transformers

    defaults = transformers.GenerationConfig._get_default_generation_params()
    assert early_stop.TRANSFORMERS_DEFAULT == defaults["assistant_confidence_threshold"]


def test_the_prediction_walks_the_dense_log_by_hand(tmp_path):
    recs = [
        {"workload": "w", "prompt_id": "p", "pos": i,
         "drafts": {"e": {"tokens": [1, 2, 3, 4], "conf": [0.9, 0.3, 0.9, 0.9], "accepted": 3}}}
        for i in range(6)
    ]  # fmt: skip
    (tmp_path / "blocks_dense-s0of1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    coef = {"prefill": 0.0, "prompt_token": 0.0, "pass@1": 10.0, "pass@5": 10.0, "call:e": 4.0}
    (tmp_path / "wallclock.json").write_text(json.dumps({"model": {"coef_ms": coef}}))
    got = early_stop.predict(tmp_path, "e", 0.4, [("w", "p")], {("w", "p"): 7}, ["w"])
    # plain: 6 passes of 10 ms; unstopped: blocks at 0 and 4, each a 5-token pass and a 4 ms call; stopped after the
    # 0.3 token: blocks at 0 and 3, each a 3-token pass and half a call
    assert got["w"] == {"speedup": round(60 / 28, 4), "speedup_stop": round(60 / 24, 4)} == got["pooled"]
    (tmp_path / "wallclock.json").unlink()
    assert early_stop.predict(tmp_path, "e", 0.4, [("w", "p")], {("w", "p"): 7}, ["w"]) is None


def test_the_pad_table_takes_the_cheapest_size_at_or_above():
    ms = {1: 38.0, 2: 45.0, 3: 38.0, 4: 37.9, 5: 36.9}
    assert calibrate.pad_table(ms) == {2: 5}  # 3 and 4 would save under 5%
    assert calibrate.pad_table(ms, gain=0.02) == {2: 5, 3: 5, 4: 5}
    assert calibrate.pad_table({1: 10.0, 2: 50.0, 3: 5.0}) == {2: 3}  # never a size below, never Q = 1
    assert calibrate.pad_table({1: 1.0, 2: 2.0, 3: 3.0}) == {}


def test_auto_padding_runs_and_is_recorded(tmp_path, zoo):
    got, _ = _bench(tmp_path, zoo, "--pad", "auto")
    assert sorted(got["pass_ms"]) == ["1", "2", "3", "4", "5"] and got["verify_pad_from"].startswith("measured")
    ms = {int(q): v for q, v in got["pass_ms"].items()}
    for q, to in got["verify_pad"].items():  # each padded size runs as the cheapest size at or above it
        assert 2 <= int(q) < to <= 5 and to == min(range(int(q), 6), key=ms.get)
