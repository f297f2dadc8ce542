"""README's results block and paper/draft.md are generated from runs/, never typed by hand."""
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
    for e in json.loads((ROOT / "runs" / "ci.json").read_text()):
        for x in [e["value"], *e["ci"]]:
            if x is not None:
                values.add(f"{100 * x:+.1f}")
    shown = re.findall(r"([+-]\d+\.\d)%", block) + re.findall(r"\[([+-]\d+\.\d), ", block)
    assert shown and all(s in values for s in shown), [s for s in shown if s not in values]
