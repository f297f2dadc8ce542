"""The regret view (bandit/regret.py) on the published campaign: every policy and rule is there, its files are
written, and the oracle agreement of a fixed drafter is counted independently."""

import json
from pathlib import Path

import numpy as np

from bandit import regret
from bandit.live.livelog import policy_timing
from bandit.live.primary import attach
from bandit.logs.reader import load_logs, published_campaign
from bandit.policies import engines
from bandit.policies.walk import FixedPolicy
from bandit.stats import trajectory

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / published_campaign()  # paper/campaign.txt's run


def test_regret_files_hold_every_rule_with_intervals(tmp_path):
    regret.main([str(RUN)], str(tmp_path / "regret.json"), 20, 0, False)
    r = json.loads((tmp_path / "regret.json").read_text())
    rows = r["model"]["all"]
    for name in engines.RULE_NAMES:
        v, lo, hi = rows[f"policy:{name}"]["over_best_fixed"]
        assert 0 < lo <= v <= hi and 0 <= rows[f"policy:{name}"]["oracle_agreement"][0] <= 1
    assert set(r["model"]) == {"all", "chat-open", "humaneval-chat", "math-word", "stdlib-edit"}
    assert "policy:selector" in r["measured"]["all"]  # decoded live: measured too
    assert (tmp_path / "regret.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "regret.txt").read_text().startswith("# made by: python bandit/regret.py")


def test_oracle_agreement_of_a_fixed_drafter_counted_independently():
    t = attach(load_logs([RUN]), RUN)
    d = t.drafters.index("eagle")
    X = regret.policy_totals(t, FixedPolicy(d), policy_timing(t))
    n = trajectory.output_lengths(t)
    start = np.searchsorted(t.prompt, np.arange(t.n_prompts))
    agree = blocks = 0
    lost = 0.0
    for p in range(t.n_prompts):
        pos = 0
        while pos < n[p]:
            r = start[p] + pos
            tau = np.minimum(t.accepted[r] + 1, n[p] - pos)
            blocks += 1
            agree += tau[d] >= tau.max()
            lost += tau.max() - tau[d]
            pos += int(t.accepted[r, d]) + 1
    assert X[:, 1].sum() == blocks and X[:, 2].sum() == agree and X[:, 4].sum() == lost


def test_a_non_default_option_writes_nothing_beside_the_run(tmp_path, capsys):
    before = sorted(p.name for p in RUN.iterdir())
    regret.main([str(RUN)], None, 20, 0, False)  # --resamples 20: a report, not the run's regret.json
    assert sorted(p.name for p in RUN.iterdir()) == before
    assert "not written: --resamples not at the default" in capsys.readouterr().out
