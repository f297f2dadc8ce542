"""README's results block and paper/draft.md are generated from the published campaign's outputs, never typed."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_and_paper_match_runs():
    r = subprocess.run([sys.executable, "paper/build.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_percentage_in_the_readme_block_comes_from_ci_json():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- specbandit:generated:begin -->")[1].split("<!-- specbandit:generated:end -->")[0]
    values = set()
    campaign = ROOT / (ROOT / "paper" / "campaign.txt").read_text().strip()
    for e in json.loads((campaign / "ci.json").read_text()):
        for x in [e["value"], *e["ci"]]:
            if x is not None:
                values.add(f"{100 * x:+.1f}")
    shown = re.findall(r"([+-]\d+\.\d)%", block) + re.findall(r"\[([+-]\d+\.\d), ", block)
    assert shown and all(s in values for s in shown), [s for s in shown if s not in values]


def test_build_refuses_a_campaign_that_is_not_the_published_one(tmp_path):
    r = subprocess.run(
        [sys.executable, "paper/build.py", "--campaign", "runs/sim", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "is not the published campaign" in r.stderr and "--publish" in r.stderr
