"""sweep.py --verify-pad: a campaign whose live verifies are padded records its table (settings.json, the manifest),
decodes every live output equal to the dense one, refuses a resume with another table, and --verify-pad auto records
the forward times its table came from. Bad values are one line before any model loads."""

import json

import pytest

import sweep
from harness.models import options
from harness.models.lm import HarnessError
from harness.models.tiny import make_zoo, write_workload_file

PROMPTS = [("code", f"c{i}", f"def f{i}(x):\n    return x * {i} + {i}\n") for i in range(3)]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("vp")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl", PROMPTS)
    z["spec"] = f"eagle=eagle:path={root / 'eagle'},stop_below=0.012"  # a random head: about half its drafts cut
    return z


def _sweep(z, out, pad, **kw):
    return sweep.run_sweep(
        target=str(z["target"]), drafter=[z["spec"], "ngram=ngram"], workload_file=str(z["wl"]), out=str(out), k=4,
        max_new_tokens=24, quiet=True, live_prompts=2, live_policies="", verify_pad=pad, **kw,
    )  # fmt: skip


def test_a_padded_campaign_records_its_table_and_keeps_its_outputs(zoo, tmp_path):
    d = _sweep(zoo, tmp_path / "run", "3:5,2:4")
    settings = json.loads((d / "settings.json").read_text())
    manifest = json.loads((d / "manifest.json").read_text())
    assert settings["verify_pad"] == "2:4,3:5"  # normalised
    assert manifest["kernels"]["verify_pad"] == {"2": 4, "3": 5}
    live = [json.loads(x) for x in (d / "live.jsonl").read_text().splitlines()]
    assert live and all(r["same_as_dense"] for r in live)
    with pytest.raises(HarnessError, match="verify_pad"):
        _sweep(zoo, d, "2:5", resume=True)


def test_auto_measures_then_pads(zoo, tmp_path):
    d = _sweep(zoo, tmp_path / "auto", "auto")
    kern = json.loads((d / "manifest.json").read_text())["kernels"]
    assert sorted(kern["pass_ms"], key=int) == ["1", "2", "3", "4", "5"]
    ms = {int(q): v for q, v in kern["pass_ms"].items()}
    for q, to in kern["verify_pad"].items():  # each padded size runs as the cheapest size at or above it
        assert 2 <= int(q) < to <= 5 and to == min(range(int(q), 6), key=ms.get)
    assert json.loads((d / "settings.json").read_text())["verify_pad"] == "auto"


@pytest.mark.parametrize("bad", ["1:3", "3:2", "2:2", "2:x", "2", "2:3,2:4", "2:5000"])
def test_a_bad_table_is_refused_before_any_model(bad):
    with pytest.raises(HarnessError, match="--verify-pad"):
        options.verify_pad(bad)


def test_the_option_is_normalised():
    assert options.verify_pad(None) is None and options.verify_pad("") is None
    assert options.verify_pad("auto") == "auto" and options.verify_pad("4:5,2:5") == "2:5,4:5"


def test_a_resumed_auto_run_keeps_the_table_it_measured(zoo, tmp_path):
    d = _sweep(zoo, tmp_path / "resume", "auto")
    m = json.loads((d / "manifest.json").read_text())
    m["kernels"]["verify_pad"], m["kernels"]["pass_ms"] = {"2": 5}, {"1": 1.0, "2": 9.0, "5": 2.0}  # planted
    m.pop("complete", None)
    (d / "manifest.json").write_text(json.dumps(m))
    lines = (d / "live.jsonl").read_text().splitlines()
    (d / "live.jsonl").write_text("\n".join(lines[:3]) + "\n")  # the live phase cut after its first prompt
    _sweep(zoo, d, "auto", resume=True)
    kern = json.loads((d / "manifest.json").read_text())["kernels"]
    assert kern["verify_pad"] == {"2": 5} and kern["pass_ms"] == {"1": 1.0, "2": 9.0, "5": 2.0}  # not re-measured
    assert all(json.loads(x)["same_as_dense"] for x in (d / "live.jsonl").read_text().splitlines())


@pytest.mark.parametrize(
    "pad, extra, match", [("2:6", {}, "at most k \\+ 1"), ("2:4", {"exact_verify": True}, "exact")]
)
def test_a_pad_that_cannot_apply_is_refused(zoo, tmp_path, pad, extra, match):
    with pytest.raises(HarnessError, match=match):
        _sweep(zoo, tmp_path / "bad", pad, **extra)


def test_a_shard_neither_measures_nor_records_a_table(zoo, tmp_path):
    d = sweep.run_sweep(
        target=str(zoo["target"]), drafter=[zoo["spec"]], workload_file=str(zoo["wl"]), out=str(tmp_path / "sh"),
        k=4, max_new_tokens=24, quiet=True, live_prompts=2, live_policies="", verify_pad="auto", shard="0/2",
    )  # fmt: skip
    kern = json.loads((d / "manifest.json").read_text()).get("kernels") or {}
    assert "verify_pad" not in kern and "pass_ms" not in kern  # the live phase's process measures its own
    assert json.loads((d / "settings.json").read_text())["verify_pad"] == "auto"
