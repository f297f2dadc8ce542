"""README's results block and paper/draft.md are generated from the published campaign's outputs, never typed;
README also shows, after it, each further campaign paper/shown.txt names, every section titled by its target;
NEGATIVE_RESULTS.md's quotes name the published campaign, or a shown one by its alias."""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bandit.logs import outputs

ROOT = Path(__file__).resolve().parents[1]
ZOO = "runs/zoo-20261201-134938"  # the CI-sized campaign the repository ships (and runs/sim, simulated)


@pytest.fixture(scope="module")
def build():
    """paper/build.py as a module (it is a script, not in a package), to call its parts with other files."""
    spec = importlib.util.spec_from_file_location("paper_build_under_test", ROOT / "paper" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def sim_published(build, tmp_path, monkeypatch):
    """runs/sim published, paper/shown.txt naming the zoo campaign (and, skipped, the published one and a repeat)."""
    (tmp_path / "campaign.txt").write_text("runs/sim\n")
    (tmp_path / "shown.txt").write_text(f"# comment\n\n{ZOO}\nruns/sim\n{ZOO}\n")
    monkeypatch.setattr(build, "CAMPAIGN_FILE", tmp_path / "campaign.txt")
    monkeypatch.setattr(build, "SHOWN_FILE", tmp_path / "shown.txt")
    return build


@pytest.fixture
def layout(tmp_path):
    """A copy of the repository's layout (paper/ and README.md copied, bandit/ and runs/ linked), so the real
    paper/ files are not touched; returns a function running `python paper/build.py ARGS` in it."""
    shutil.copytree(ROOT / "paper", tmp_path / "paper", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("bandit", "runs"):
        (tmp_path / d).symlink_to(ROOT / d, target_is_directory=True)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "paper/build.py", *args], cwd=tmp_path, capture_output=True, text=True, env=env
        )

    run.root = tmp_path
    return run


def block_of(text: str) -> str:
    return text.split("<!-- specbandit:generated:begin -->")[1].split("<!-- specbandit:generated:end -->")[0]


def test_readme_and_paper_match_runs():
    r = subprocess.run([sys.executable, "paper/build.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_percentage_in_the_results_comes_from_ci_json(build):
    block = (ROOT / "RESULTS.md").read_text()
    values = set()
    campaign = build.published()
    for run in [campaign, *build.shown(campaign)]:  # each section's numbers from its own campaign
        for e in json.loads((run / "ci.json").read_text()):
            for x in [e["value"], *e["ci"]]:
                if x is not None:
                    values.add(f"{100 * x:+.1f}")
    shown = re.findall(r"([+-]\d+\.\d)%", block) + re.findall(r"\[([+-]\d+\.\d), ", block)
    assert shown and all(s in values for s in shown), [s for s in shown if s not in values]


def test_the_readme_and_results_title_the_published_campaign_by_its_target():
    campaign = (ROOT / "paper" / "campaign.txt").read_text().strip()
    target = json.loads((ROOT / campaign / "manifest.json").read_text())["target"]["name"]
    title = block_of((ROOT / "README.md").read_text()).lstrip().splitlines()[0]
    assert title.startswith(f"## What the published campaign says: target {target}") and f"({campaign})" in title
    title = next(x for x in (ROOT / "RESULTS.md").read_text().splitlines() if x.startswith("## "))
    assert title.startswith(f"## Results on the published campaign: target {target}") and f"({campaign})" in title


def test_the_readme_is_short_and_its_table_is_the_live_verdicts(build):
    from bandit.live import verdicts

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120  # a newcomer reads it in two minutes; RESULTS.md holds the rest
    by, _ = sys.modules["paper.sections"].load(build.published())
    assert verdicts.headline_table(by) in block_of(text)


def test_build_refuses_a_campaign_that_is_not_the_published_one(tmp_path):
    r = subprocess.run(
        [sys.executable, "paper/build.py", "--campaign", "runs/sim", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "is not the published campaign" in r.stderr and "--publish" in r.stderr


def test_readme_shows_the_published_campaign_then_each_shown_one_titled_by_target(sim_published):
    b = sim_published
    pub = b.published()
    others = b.shown(pub)
    assert others == [ROOT / ZOO]  # the published campaign's line and the repeat skipped
    block = b.results(pub, others)
    titles = re.findall(r"^## .*$", block, flags=re.M)
    assert titles == [
        "## Results on the published campaign: target sim-target (runs/sim)",
        f"## Results on a further campaign: target zoo-target ({ZOO})",
    ]
    first, second = block.split(titles[1])
    assert "Selector frontier area per held-out" in first and "coverage.json" in first
    assert "Token proxies:" in second and "Does choosing pay, measured?" in second  # the compact section
    assert "Selector frontier area" not in second and "Wall clock:" not in second and "coverage.json" not in second
    assert f"`python bandit/ci.py {ZOO}`" in second and "`python bandit/ci.py`" not in second  # its own command
    assert "further campaign" not in b.draft(pub)  # the paper describes the published campaign only


def test_a_converted_target_is_titled_with_its_gguf_source(build, tmp_path):
    target = {
        "name": "smollm2-135m-instruct",
        "converted_from": {"file": "M.Q4_1.gguf", "package": "p", "version": "1"},
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"target": target}))
    sections = sys.modules["paper.sections"]
    assert sections.target_said(tmp_path) == "target smollm2-135m-instruct, converted from M.Q4_1.gguf of p 1"
    assert "no `" in sections.target_said(tmp_path / "none")  # no manifest: said, not guessed


def test_a_shown_line_naming_a_missing_campaign_stops_the_build_in_one_line(layout):
    (layout.root / "paper" / "shown.txt").write_text(f"{ZOO}\nruns/no-such-run\n")
    r = layout("--check")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: paper/shown.txt line 2: campaign runs/no-such-run: no such directory"
    ]


def test_a_shown_campaign_without_ci_json_is_refused(build, tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "shown.txt").write_text(f"{tmp_path / 'run'}\n")
    monkeypatch.setattr(build, "SHOWN_FILE", tmp_path / "shown.txt")
    with pytest.raises(SystemExit, match=r"line 1: campaign .*: no ci.json \(run `python bandit/ci.py"):
        build.shown(build.published())


def test_a_further_campaigns_files_are_checked_against_the_commands_with_its_path(build, tmp_path, capsys):
    run = tmp_path / "a run"  # a space: the path is quoted as the recorded command quotes it
    run.mkdir()
    path = shlex.quote(outputs.show(run))
    (run / "ci.json").write_text(json.dumps([{"command": "python bandit/ci.py"}]))  # the published campaign's
    (run / "replay.txt").write_text(f"# made by: python bandit/replay.py {path}\n")
    bad = outputs.check_commands(run, published=False)
    assert len(bad) == 1 and "ci.json was made by `python bandit/ci.py`" in bad[0], bad
    assert f"its documented command is `python bandit/ci.py {path}`" in bad[0]
    as_published = outputs.check_commands(run)  # the published campaign's commands name no path
    assert len(as_published) == 1 and as_published[0].startswith(f"{outputs.show(run / 'replay.txt')} was made by")
    assert outputs.check_commands(ROOT / "runs" / "sim", published=False) == []  # records `... runs/sim`
    assert build.check(build.published(), [run], []) == 1  # --check reports it, as a stale text
    assert f"stale: {bad[0]}" in capsys.readouterr().out.splitlines()


def test_a_shown_line_with_an_alias_renders_its_section_titled_as_before(sim_published):
    b = sim_published
    b.SHOWN_FILE.write_text(f"{ZOO}\tzoo\nruns/sim sim\n")
    pub = b.published()
    assert b.shown(pub) == [ROOT / ZOO] and b.aliases() == {"zoo": ROOT / ZOO, "sim": ROOT / "runs" / "sim"}
    block = b.results(pub, b.shown(pub))
    assert re.findall(r"^## .*$", block, flags=re.M) == [
        "## Results on the published campaign: target sim-target (runs/sim)",
        f"## Results on a further campaign: target zoo-target ({ZOO})",
    ]


def test_aliased_quotes_keep_quoting_their_campaign_when_another_is_published(sim_published, tmp_path, monkeypatch):
    b = sim_published
    b.SHOWN_FILE.write_text(f"{ZOO} zoo\n")
    pub = b.published()
    zoo, sim = ({e["name"]: e for e in json.loads((ROOT / r / "ci.json").read_text())} for r in (ZOO, "runs/sim"))
    assert zoo["per_block_gap"]["value"] != sim["per_block_gap"]["value"]
    template = tmp_path / "negative_results.md"
    template.write_text(
        "{{CAMPAIGN}} {{CAMPAIGN@zoo}}\n{{ci:per_block_gap}}\n{{ci@zoo:per_block_gap}}\n{{ci%@zoo:per_block_gap}}\n"
        "{{line@zoo:core.txt:(c) replay on the logs}}\n"
    )
    monkeypatch.setattr(b, "NEG_TEMPLATE", template)
    lines = b.negative_results(pub).splitlines()[1:]
    fmt = sys.modules["paper.sections"]
    quoted = [
        f"{fmt.fmt_value(e['value'], p)} {fmt.fmt_ci(e, p)} {fmt.fmt_label(e)}"
        for e, p in [(sim["per_block_gap"], False), (zoo["per_block_gap"], False), (zoo["per_block_gap"], True)]
    ]
    assert lines[:4] == [f"runs/sim {ZOO}", *quoted]
    assert lines[4].startswith("`") and lines[4].endswith(f"(`{ZOO}/core.txt`)") and "(c) replay" in lines[4]
    # the real template's zoo findings (those before the published campaign's own section): whichever campaign
    # is published, they quote the zoo; only the published path in the intro changes
    cut = "## The real model"
    real = (ROOT / "paper" / "negative_results.md").read_text()
    template.write_text(real.split(cut)[0])
    monkeypatch.setattr(b, "NEG_TEMPLATE", template)
    now = (ROOT / "NEGATIVE_RESULTS.md").read_text().split(cut)[0]
    published = (ROOT / "paper" / "campaign.txt").read_text().strip()
    said = f"The published campaign is `{published}`;"
    assert now.count(said) == 1 and now.count(ZOO) > 10
    assert b.negative_results(pub) == now.replace(said, "The published campaign is `runs/sim`;")


def test_an_unknown_alias_stops_the_build_in_one_line(layout):
    template = layout.root / "paper" / "negative_results.md"
    template.write_text(template.read_text() + "\nAnd {{ci@nosuch:per_block_gap}}.\n")
    r = layout("--check")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["negative_results.md: no campaign aliased 'nosuch' in paper/shown.txt"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (f"{ZOO} Zoo\n", "alias 'Zoo' is not"),
        (f"{ZOO} zoo\nruns/sim zoo\n", "line 2: campaign runs/sim: alias 'zoo' is"),
    ],
)
def test_a_malformed_or_repeated_alias_is_refused(build, tmp_path, monkeypatch, text, why):
    (tmp_path / "shown.txt").write_text(text)
    monkeypatch.setattr(build, "SHOWN_FILE", tmp_path / "shown.txt")
    with pytest.raises(SystemExit, match=re.escape(why)):
        build.aliases()


def test_a_stamp_only_change_is_written_so_check_then_passes(layout):
    """The texts quote the code-version stamps of the outputs they read: a RESULTS.md whose only difference from
    the generated one is such a stamp is rewritten by the build, and --check then passes (it did not: the build
    kept stamp-only changes, as analysis outputs do, and --check called the file stale for ever)."""
    assert layout().returncode == 0
    results = layout.root / "RESULTS.md"
    text = results.read_text()
    stamp = re.search(r"\(code (0\.1\.0\+g[0-9a-f]{12})\)", text).group(1)
    results.write_text(text.replace(stamp, "0.1.0+g000000000000", 1))
    assert "stale: RESULTS.md" in layout("--check").stdout
    r = layout()
    assert r.returncode == 0 and "wrote RESULTS.md" in r.stdout, r.stdout + r.stderr
    assert results.read_text() == text
    assert "stale: RESULTS.md" not in layout("--check").stdout  # (the copy's command paths differ: not its exit)
