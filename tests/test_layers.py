"""The package's shape (docs/DESIGN.md, "Layout"): no import cycle among bandit/, harness/, sweep.py and
workloads.py, imports inside functions included; no private name imported across modules; no module of
bandit/ over 500 lines; no hand-written C; every command registered in bandit/cli.py."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Our modules by dotted name: bandit.*, harness.*, sweep, workloads."""
    out = {}
    for pkg in ("bandit", "harness"):
        for f in sorted((root / pkg).glob("*.py")):
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    for top in ("sweep", "workloads"):
        if (root / f"{top}.py").is_file():
            out[top] = root / f"{top}.py"
    return out


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import statement anywhere in the file."""
    pkg = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:  # `from bandit import trajectory` imports the module bandit.trajectory
                    found.append((sub, [], node.lineno))
                else:
                    found.append((base, [a.name], node.lineno))
    return [(m, names, ln) for m, names, ln in found if m in known]


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {m: {d for d, _, _ in imports_of(m, f, known) if d != m} for m, f in files.items()}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    try:
        list(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_the_walk_finds_a_planted_cycle(tmp_path):
    (tmp_path / "bandit").mkdir()
    (tmp_path / "harness").mkdir()
    (tmp_path / "bandit" / "__init__.py").write_text("")
    (tmp_path / "bandit" / "a.py").write_text("from bandit import b\n")
    (tmp_path / "bandit" / "b.py").write_text("def f():\n    from bandit.a import g  # hidden inside a function\n")
    (tmp_path / "harness" / "c.py").write_text("from . import d\n")
    (tmp_path / "harness" / "d.py").write_text("x = 1\n")
    g = graph(tmp_path)
    assert g["harness.c"] == {"harness.d"}
    assert set(cycle(g)) == {"bandit.a", "bandit.b"}


def test_no_import_cycle():
    g = graph()
    assert "bandit.schema" in g and "harness.engine" in g and "sweep" in g
    assert "bandit.schema" in g["harness.engine"]  # the harness reads the shared schema
    c = cycle(g)
    assert c is None, "import cycle: " + " -> ".join(c)


def test_the_bottom_layer_imports_nothing_of_ours_above_it():
    g = graph()
    for low in ("bandit.schema", "bandit.errors", "bandit.progress", "bandit.resample"):
        assert g[low] <= {"bandit", "bandit.errors"}, (low, g[low])
    assert g["bandit.bootstrap"] <= {"bandit.resample", "bandit.table", "bandit.logs", "bandit.schema", "bandit"}
    for m, deps in g.items():  # only the command registry and the report modules import the reports
        if m not in ("bandit.cli",):
            assert "bandit.cli" not in deps, m
        if m not in ("bandit.cli", "bandit.ci"):
            assert "bandit.ci" not in deps, (m, "imports the headline report")


def test_no_private_name_crosses_modules():
    files = module_files()
    bad = [
        f"{m}:{ln}: from {d} import {n}"
        for m, f in files.items()
        for d, names, ln in imports_of(m, f, set(files))
        for n in names
        if n.startswith("_") and n != "__version__"
    ]
    assert not bad, bad


@pytest.mark.parametrize("path", sorted((ROOT / "bandit").glob("*.py")), ids=lambda p: p.name)
def test_module_is_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name}: {n} lines (at most {MAX_LINES})"


def test_no_hand_written_c():
    assert not [p.name for p in (ROOT / "bandit").iterdir() if p.suffix in (".c", ".h", ".so", ".pyd")]
    assert not (ROOT / "setup.py").exists()


def test_every_command_is_registered_in_cli():
    from bandit import cli

    names = [c.name for c in cli.app.registered_commands]
    assert {"sweep", "validate", "pack", "replay", "ci", "selector", "breakeven", "wallclock", "policies"} <= set(names)
    assert len(names) == len(set(names))
    for f in module_files().values():  # no other module builds a typer app of its own, except sweep.py's script one
        if f.name not in ("cli.py", "sweep.py"):
            assert "typer.Typer(" not in f.read_text(), f
