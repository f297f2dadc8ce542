"""Generate the paper draft, RESULTS.md and the README's results block from runs/ alone.

No number in README.md, RESULTS.md, paper/draft.md or NEGATIVE_RESULTS.md is typed by hand: they are rendered here
from the published campaign's derived outputs (`<run>/ci.json`, `breakeven.txt`, `core.txt`, `selector.txt`,
`wallclock.json`, `coverage.json`; the campaign is named in `paper/campaign.txt`). The results open with the
live verdicts' one table (bandit/live/verdicts.py renders it from ci.json: does choosing pay, measured?); the
token proxies follow, each saying what it stands in for,
with each number's label and CI (NEGATIVE_RESULTS.md from the template paper/negative_results.md, whose
figures are {{ci:NAME}} / {{ci%:NAME}} / {{line:FILE:WORDS}} quotes and {{CAMPAIGN}} its path). The blocks are
rendered by paper/sections.py. README's block is short: the published campaign's "does choosing pay" table
(`summary_section`); RESULTS.md holds every result. RESULTS.md shows, after the published campaign's section, a compact one
(live verdicts, provenance, token proxies) for each further campaign `paper/shown.txt` names, one run directory a
line (a line naming the published campaign is skipped; no file, none); every section's title names its campaign's
target. A shown.txt line may end in an alias after whitespace (`runs/zoo-20261201-134938 zoo`; [a-z0-9_-]+, unique),
and a quote naming it, {{ci@zoo:NAME}}, {{ci%@zoo:NAME}}, {{line@zoo:FILE:WORDS}}, {{CAMPAIGN@zoo}}, quotes that
campaign instead of the published one (still so while it is the published one: its line's alias names it); an
alias no line gives stops the build. So findings about one campaign keep quoting it after another is published.
`tests/test_generated_docs.py` fails when the committed text drifts from what this prints.

    python paper/build.py            # rewrite paper/draft.md, NEGATIVE_RESULTS.md, RESULTS.md and README.md's block
    python paper/build.py --check    # exit 1 if any is stale, or a campaign shown has a file not made by its documented command
    python paper/build.py --campaign runs/RUN --publish   # make another campaign the published one

Only the published campaign feeds the paper and NEGATIVE_RESULTS.md's untagged quotes: `--campaign` naming another
is refused without `--publish`, and outputs computed from logs outside their campaign are refused. A further
campaign is documented by the commands with its path (`python bandit/ci.py runs/RUN`), as bandit/logs/outputs.py
records them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bandit/ and paper/sections.py, imported from the repository root

from bandit.logs import outputs
from paper.sections import (
    fmt_ci,
    fmt_label,
    fmt_value,
    load,
    published_section,
    rel,
    shown_section,
    summary_section,
    verbatim,
)

BEGIN, END = "<!-- specbandit:generated:begin -->", "<!-- specbandit:generated:end -->"
TEMPLATE = ROOT / "paper" / "template.md"
CAMPAIGN_FILE = ROOT / "paper" / "campaign.txt"
SHOWN_FILE = ROOT / "paper" / "shown.txt"
NEG_TEMPLATE = ROOT / "paper" / "negative_results.md"
ALIAS = re.compile(r"[a-z0-9_-]+")  # a campaign's alias in paper/shown.txt, named by {{ci@ALIAS:NAME}} quotes


def published() -> Path:
    return ROOT / CAMPAIGN_FILE.read_text().strip()


def shown_lines() -> list[tuple[int, Path, str | None]]:
    """paper/shown.txt's campaigns: (line number, run directory, alias or None). A line is a run directory relative
    to the repository, optionally followed by whitespace and an alias ([a-z0-9_-]+, unique in the file; a line of
    two fields or more takes its last as the alias); blank and # lines are skipped. A line whose directory or
    ci.json is missing, or whose alias is malformed or repeated, stops the build."""
    if not SHOWN_FILE.is_file():
        return []
    out: list[tuple[int, Path, str | None]] = []
    for n, line in enumerate(SHOWN_FILE.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.rsplit(None, 1)
        path, alias = (fields[0], fields[1]) if len(fields) == 2 else (line, None)
        where = f"error: {rel(SHOWN_FILE)} line {n}: campaign {path}"
        if alias is not None and not ALIAS.fullmatch(alias):
            raise SystemExit(f"{where}: alias {alias!r} is not [a-z0-9_-]+")
        if alias is not None and alias in {a for _, _, a in out}:
            raise SystemExit(f"{where}: alias {alias!r} is already taken")
        run = ROOT / path
        if not (run / "ci.json").is_file():
            why = "no such directory" if not run.is_dir() else f"no ci.json (run `python bandit/ci.py {path}`)"
            raise SystemExit(f"{where}: {why}")
        out.append((n, run, alias))
    return out


def shown(pub: Path) -> list[Path]:
    """The further campaigns README shows after `pub`, in paper/shown.txt's order (shown_lines); `pub`'s own line
    and repeats ignored, so the file can list the campaign published today before another one is."""
    out: list[Path] = []
    for _, run, _ in shown_lines():
        if run.resolve() not in {p.resolve() for p in [pub, *out]}:
            out.append(run)
    return out


def aliases() -> dict[str, Path]:
    """Each alias paper/shown.txt gives to the campaign on its line, the published campaign's line included (its
    section is skipped, its alias still names it): what a {{ci@ALIAS:NAME}} quote resolves against."""
    return {a: run for _, run, a in shown_lines() if a is not None}


def results_block(runs: Path, others: list[Path]) -> str:
    """RESULTS.md's results: the published campaign's section first, then each further one's, in
    paper/shown.txt's order."""
    return "\n\n".join([published_section(runs), *(shown_section(o) for o in others)])


def draft(runs: Path) -> str:
    text = TEMPLATE.read_text()
    return (
        text.replace("{{RESULTS}}", published_section(runs))
        .replace("{{CAMPAIGN}}", rel(runs))
        .replace("{{BREAKEVEN}}", verbatim(runs, "breakeven.txt", "python bandit/breakeven.py"))
        .replace("{{SELECTOR}}", verbatim(runs, "selector.txt", "python bandit/selector.py"))
        .replace("{{POLICIES}}", verbatim(runs, "core.txt", "python bandit/core.py"))
    )


def quote(runs: Path, text: str, named: dict[str, Path] | None = None) -> str:
    """Fill a hand-written text's quotes from generated files of the published campaign `runs`: {{ci:NAME}} (value,
    CI, label of a ci.json entry; {{ci%:NAME}} as a percentage), {{line:FILE:WORDS}} (the first line of runs/FILE
    containing WORDS) and {{CAMPAIGN}} (its path). Each may name a campaign of paper/shown.txt by its alias instead,
    {{ci@ALIAS:NAME}}, {{ci%@ALIAS:NAME}}, {{line@ALIAS:FILE:WORDS}}, {{CAMPAIGN@ALIAS}} (`named`: alias -> run
    directory, default aliases()); an alias no line gives stops the build."""
    named = aliases() if named is None else named
    loaded: dict[Path, dict[str, dict]] = {}

    def campaign(alias: str | None) -> Path:
        if alias is None:
            return runs
        if alias not in named:
            raise SystemExit(f"{NEG_TEMPLATE.name}: no campaign aliased {alias!r} in {rel(SHOWN_FILE)}")
        return named[alias]

    def ci_entry(m: re.Match) -> str:
        pct, run, name = m[1] == "%", campaign(m[2]), m[3]
        if run not in loaded:
            loaded[run] = load(run)[0]
        by = loaded[run]
        if name not in by:
            raise SystemExit(f"{NEG_TEMPLATE.name}: no entry {name!r} in {rel(run)}/ci.json")
        e = by[name]
        return f"{fmt_value(e['value'], pct)} {fmt_ci(e, pct)} {fmt_label(e)}"

    def line(m: re.Match) -> str:
        run = campaign(m[1])
        path = run / m[2]
        hit = next((x.strip() for x in path.read_text().splitlines() if m[3] in x), None) if path.exists() else None
        if hit is None:
            raise SystemExit(f"{NEG_TEMPLATE.name}: no line with {m[3]!r} in {rel(run)}/{m[2]}")
        return f"`{hit}` (`{rel(run)}/{m[2]}`)"

    at = r"(?:@([^:}]*))?"  # an alias, checked against `named`: a malformed one is unknown, not left unfilled
    text = re.sub(r"\{\{CAMPAIGN" + at + r"\}\}", lambda m: rel(campaign(m[1])), text)
    text = re.sub(r"\{\{ci(%?)" + at + r":([^}]+)\}\}", ci_entry, text)
    return re.sub(r"\{\{line" + at + r":([^:}]+):([^}]+)\}\}", line, text)


def negative_results(runs: Path, named: dict[str, Path] | None = None) -> str:
    head = (
        "<!-- generated by `python paper/build.py` from paper/negative_results.md: every figure is quoted "
        "from runs/ with its label; edit the template -->\n"
    )
    return head + quote(runs, NEG_TEMPLATE.read_text(), named)


def readme(runs: Path, current: str) -> str:
    """README with its generated block (between the markers) the published campaign's short answer."""
    if BEGIN not in current or END not in current:
        raise SystemExit(f"README.md lacks the markers {BEGIN} ... {END}")
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{summary_section(runs)}\n{END}{tail}"


def results(runs: Path, others: list[Path]) -> str:
    """RESULTS.md: every result of the published campaign, then each further one's, all generated."""
    head = (
        "<!-- generated by `python paper/build.py` from runs/ alone: every number is quoted from a campaign's "
        "outputs with its label; edit nothing here -->\n# Results\n\n"
    )
    return head + results_block(runs, others) + "\n"


def check(runs: Path, others: list[Path], stale: list[Path]) -> int:
    """Exit status of --check: 1 if a text is stale or a campaign's output records any command but its documented
    one (bandit/logs/outputs.py; a further campaign's names its path), each said in a line."""
    bad = [f"{p.relative_to(ROOT)} (regenerate with `python paper/build.py`)" for p in stale]
    bad += outputs.check_commands(runs)
    for o in others:
        bad += outputs.check_commands(o, published=False)
    also = f" (and {', '.join(rel(o) for o in others)}, shown)" if others else ""
    done = f"match {rel(runs)}{also}, each of its outputs made by its documented command"
    print("\n".join(f"stale: {x}" for x in bad) or f"up to date: README, RESULTS, paper, NEGATIVE_RESULTS {done}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--campaign",
        type=Path,
        default=None,
        help="the campaign directory whose outputs feed README and paper (default: paper/campaign.txt)",
    )
    ap.add_argument("--publish", action="store_true", help="with --campaign: make it the published campaign")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a generated text is stale or an output's command is not the documented one",
    )
    a = ap.parse_args(argv)
    pinned = published()
    runs = Path(a.campaign) if a.campaign is not None else pinned
    if a.campaign is not None and runs.resolve() != pinned.resolve() and not a.publish:
        print(
            f"error: {a.campaign} is not the published campaign ({rel(pinned)}, named in paper/campaign.txt); "
            "add --publish to make it the one README and paper describe",
            file=sys.stderr,
        )
        return 2
    if not runs.is_dir():
        print(f"error: campaign {rel(runs)}: no such directory", file=sys.stderr)
        return 2
    others = shown(runs)  # before publishing: a broken paper/shown.txt changes nothing
    if runs.resolve() != pinned.resolve():
        outputs.write_all([(CAMPAIGN_FILE, rel(runs) + "\n")])
        print(f"published: {rel(runs)} (paper/campaign.txt)")
    targets = {
        ROOT / "README.md": readme(runs, (ROOT / "README.md").read_text()),
        ROOT / "RESULTS.md": results(runs, others),
        ROOT / "paper" / "draft.md": draft(runs),
        ROOT / "NEGATIVE_RESULTS.md": negative_results(runs),
    }
    stale = [p for p, text in targets.items() if not p.exists() or p.read_text() != text]
    if a.check:
        return check(runs, others, stale)
    # every stale text is written whole: unlike an analysis output, a text quotes the code-version stamps of the
    # outputs it reads, so a stamp-only change is a change (outputs.write_all keeps such a file, and --check would
    # call it stale for ever)
    for p in outputs.write_all([(p, text) for p, text in targets.items() if p in stale], stamps=True):
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    from bandit.logs.errors import guarded

    guarded(main)
