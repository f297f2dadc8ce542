"""Every relative link and file reference in the README, the docs and the code's docstrings names a file that
is in the repository (a reference to something not shipped is a broken promise to the reader)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    "README.md",
    "RESULTS.md",
    "NEGATIVE_RESULTS.md",
    "docs/DESIGN.md",
    "docs/GUIDE.md",
    "docs/manifest.md",
    "zoo/README.md",
]
# a path into the repository, as written in prose or code: a top-level folder, then a file with an extension
PATH = re.compile(
    r"(?<![\w/.<-])((?:bandit|harness|docs|bench|zoo|paper|tests|\.ci)/[\w./-]*\w|sweep\.py|workloads\.py)"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def references(text: str, markdown: bool = True) -> set[str]:
    refs = {m.group(1) for m in LINK.finditer(text) if not re.match(r"[a-z]+:|#", m.group(1))} if markdown else set()
    for m in PATH.finditer(text):
        tail = text[m.end() : m.end() + 1]
        if tail in ("<", "*", "{"):  # a pattern (runs/<run>/..., blocks_*.jsonl), not one file
            continue
        refs.add(m.group(1))
    return {r.split("#")[0].rstrip(".,:;)") for r in refs}


def missing(refs: set[str], base: Path) -> list[str]:
    out = []
    for r in sorted(refs):
        if "*" in r or "<" in r or r.endswith(("/_scratch", "/out")):
            continue
        if not ((base / r).exists() or (ROOT / r).exists()):
            out.append(r)
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_reference_in_the_docs_resolves(doc):
    path = ROOT / doc
    refs = references(path.read_text())
    assert refs, f"{doc}: no references found (the pattern is broken)"
    assert not missing(refs, path.parent), (
        f"{doc} names files that are not in the repository: {missing(refs, path.parent)}"
    )


def test_every_file_named_in_the_code_exists():
    bad = {}
    for f in sorted([*ROOT.glob("bandit/*.py"), *ROOT.glob("harness/*.py"), ROOT / "sweep.py", ROOT / "workloads.py"]):
        m = missing(references(f.read_text(), markdown=False), ROOT)
        if m:
            bad[f.name] = m
    assert not bad, bad


def test_the_check_catches_a_broken_reference(tmp_path):
    assert missing(references("see [the design](docs/NOPE.md) and `bandit/gone.py`"), ROOT) == [
        "bandit/gone.py",
        "docs/NOPE.md",
    ]
    assert missing(references("see [the design](docs/DESIGN.md), runs/<run>/ci.json and `bandit/ci.py`"), ROOT) == []
