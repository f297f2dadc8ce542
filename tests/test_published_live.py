"""The published campaign's live phase, read as issue 34 checks it: every engine rule decoded live on every sampled
prompt, ci.json's live figures recomputed from live.jsonl with nothing but json, and each rule's timing-model
prediction within 15% of its measurement in wallclock.json."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from bandit.logs.reader import published_campaign
from bandit.policies import engines

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / published_campaign()  # paper/campaign.txt's run


@pytest.fixture(scope="module")
def live():
    return [json.loads(line) for line in (RUN / "live.jsonl").read_text().splitlines()]


def test_every_rule_is_live_on_every_sampled_prompt(live):
    prompts = {(r["workload"], r["prompt_id"]) for r in live}
    for name in engines.RULE_NAMES:
        mine = [(r["workload"], r["prompt_id"]) for r in live if r["config"] == f"policy:{name}"]
        assert sorted(mine) == sorted(prompts), name
        assert all(r["same_as_dense"] for r in live if r["config"] == f"policy:{name}")


def test_ci_json_live_figures_are_ratios_of_sums_of_live_jsonl(live):
    tokens, ms = defaultdict(float), defaultdict(float)
    for r in live:
        for scope in ("", f"[{r['workload']}]"):
            tokens[scope, r["config"]] += r["tokens"]
            ms[scope, r["config"]] += r["wall_ms"]

    def tps(scope, config):
        return 1000 * tokens[scope, config] / ms[scope, config]

    entries = {e["name"]: e for e in json.loads((RUN / "ci.json").read_text())}
    checked = 0
    for (scope, config), _ in list(tokens.items()):
        e = entries[f"live_tokens_per_s{scope}[{config}]"]
        assert e["value"] == pytest.approx(tps(scope, config), rel=2e-5)
        if config != "plain":
            e = entries[f"live_speedup_over_plain{scope}[{config}]"]
            assert e["value"] == pytest.approx(tps(scope, config) / tps(scope, "plain"), rel=2e-5)
        checked += 1
    assert checked == len({r["config"] for r in live}) * (1 + len({r["workload"] for r in live}))


def test_each_rule_predicted_within_15_percent_of_measured():
    rows = {e["config"]: e for e in json.loads((RUN / "wallclock.json").read_text())["entries"]}
    for name in engines.RULE_NAMES:
        e = rows[f"policy:{name}"]
        assert e["measured_over_predicted"] == pytest.approx(
            e["measured_tokens_per_s"] / e["predicted_tokens_per_s"], rel=1e-3
        )
        assert 0.85 <= e["measured_over_predicted"] <= 1.15, name
