"""Degenerate inputs are reported as such: one prompt has no CI (not a zero-width one), an undefined ratio is
'undefined' (never nan), and the selector's entries on one workload are listed with their reason."""

import json
import re
from pathlib import Path

import pytest

from bandit import breakeven, ci, replay
from bandit.logs.reader import load_logs
from bandit.sim.simulate import SimConfig, write_sim_run

NAN = re.compile(r"\bnan\b|\+nan%", re.I)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("deg")
    write_sim_run(SimConfig(n_prompts=3, out_len=24, seed=1), root / "base", gz=False)
    f = next((root / "base").glob("blocks_*"))
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    man = (root / "base" / "manifest.json").read_text()
    pids = sorted({(r["workload"], r["prompt_id"]) for r in recs})

    def write(name, rs):
        d = root / name
        d.mkdir()
        (d / f.name).write_text("".join(json.dumps(r) + "\n" for r in rs))
        (d / "manifest.json").write_text(man)
        return d

    empty = json.loads(json.dumps(recs))
    for r in empty:
        for d in r["drafts"].values():
            d.update(tokens=[], accepted=0, conf=[], entropy=[])
            d.pop("expected_accepted", None)
    return {
        "one_prompt": write("one", [r for r in recs if (r["workload"], r["prompt_id"]) == pids[0]]),
        "one_workload": write("wl", [r for r in recs if r["workload"] == pids[0][0]]),
        "empty": write("empty", empty),
    }


def test_one_prompt_has_no_interval_rather_than_a_zero_width_one(logs):
    d = logs["one_prompt"]
    text = ci.main([d], d.parent / f"ci_{d.name}.json", n_resamples=40, n_refit=5)  # not its run's ci.json
    assert not NAN.search(text) and "no CI: one prompt per workload" in text
    for e in json.loads((d.parent / f"ci_{d.name}.json").read_text()):
        assert e["ci"] == [None, None] and e.get("warning")
    rep = replay.with_ci(replay.summarize(load_logs([d])), load_logs([d]), 40).summary()
    assert "no CI: one prompt" in rep and "95% CI [" not in rep
    be = breakeven.main([d], n_resamples=40, n_refit=5)
    assert "(no CI)" in be and not re.search(r"\[([+-]?\d+\.\d+)%?, \1%?\]", be)  # no [x, x] interval


def test_undefined_ratios_say_undefined(logs):
    d = logs["empty"]
    text = ci.main([d], d.parent / f"ci_{d.name}.json", n_resamples=40, n_refit=5)  # not its run's ci.json
    assert not NAN.search(text) and "undefined: a ratio with nothing in its denominator" in text
    gap = next(e for e in json.loads((d.parent / f"ci_{d.name}.json").read_text()) if e["name"] == "per_block_gap")
    assert gap["value"] is None and gap["warning"].startswith("undefined")
    t = load_logs([d])
    rep = replay.with_ci(replay.summarize(t), t, 40).summary()
    assert not NAN.search(rep) and "gap undefined" in rep


def test_one_workload_lists_the_selector_with_its_reason(logs):
    d = logs["one_workload"]
    ci.main([d], d.parent / f"ci_{d.name}.json", n_resamples=40, n_refit=5)  # not its run's ci.json
    sel = {
        e["name"]: e
        for e in json.loads((d.parent / f"ci_{d.name}.json").read_text())
        if e["name"].startswith("selector")
    }
    assert set(sel) == set(ci.SELECTOR_HEADLINE)
    assert all(e["value"] is None and "leave-one-workload-out" in e["warning"] for e in sel.values())
    be = breakeven.main([d], n_resamples=40, n_refit=5)
    assert "LOWO selector: undefined" in be and "1 workload(s)" in be


def test_the_shipped_campaign_has_no_degenerate_entries():
    camp = (
        Path(__file__).resolve().parents[1]
        / (Path(__file__).resolve().parents[1] / "paper" / "campaign.txt").read_text().strip()
    )
    for e in json.loads((camp / "ci.json").read_text()):
        if e["value"] is None:  # only where the definition has no value, and then with the reason
            assert e["warning"].startswith("undefined") and e["name"].startswith(("selector_skill", "selector_capture"))
            continue
        assert None not in e["ci"] and e["ci"][0] <= e["value"] <= e["ci"][1], e["name"]
