"""The package's shape (docs/DESIGN.md, "Layout"): no import cycle among bandit/, harness/, zoo/, the top-level
modules (sweep.py, workloads.py, specbandit_cli.py), imports inside functions included; bandit/'s sub-packages
import downward only (logs, stats, policies, live, sim, then the reports at the top) and bandit/ never imports
the collection side; no private name imported across modules; no module of the repository over 500 lines (tests
aside); no hand-written C; every command registered in specbandit_cli.py."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500


PACKAGES = ("bandit", "harness", "zoo")
TOP_MODULES = ("sweep", "workloads", "specbandit_cli")
# bandit/'s layers, lowest first: a module imports from its own layer or below. The top-level modules of
# bandit/ (the reports: ci, replay, selector, breakeven, core, wallclock and their parts) are the top layer.
LAYERS = ("logs", "stats", "policies", "live", "sim")
COLLECTION = ("harness", "sweep", "specbandit_cli", "zoo", "workloads")  # what bandit/ never imports


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Our modules by dotted name, sub-packages included: bandit.*, harness.*, zoo.*, and the top-level ones."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = (pkg, *f.relative_to(root / pkg).with_suffix("").parts)
            if any(p.startswith("_") and p != "__init__" for p in parts[1:]):  # scratch folders
                continue
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    for top in TOP_MODULES:
        if (root / f"{top}.py").is_file():
            out[top] = root / f"{top}.py"
    return out


def layer_of(module: str) -> int:
    """bandit's layer index of a module: its sub-package's place in LAYERS; the package itself 0; a report at
    the top of bandit/ len(LAYERS)."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else len(LAYERS)


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    """Every import of bandit/ that goes up a layer or out to the collection side."""
    bad = []
    for m, deps in g.items():
        if m.split(".")[0] != "bandit":
            continue
        for d in deps:
            if d.split(".")[0] in COLLECTION:
                bad.append(f"{m} imports {d} (collection)")
            elif d.split(".")[0] == "bandit" and layer_of(d) > layer_of(m):
                bad.append(f"{m} imports {d} (a higher layer)")
    return sorted(bad)


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


def test_the_layer_check_finds_planted_upward_imports(tmp_path):
    for d in ("bandit/logs", "bandit/stats", "harness"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "bandit" / "logs" / "schema.py").write_text("def f():\n    from bandit.stats import boot\n")
    (tmp_path / "bandit" / "stats" / "boot.py").write_text("from bandit.logs import schema\n")
    (tmp_path / "bandit" / "ci.py").write_text("from bandit.stats.boot import x\nimport harness.engine\n")
    (tmp_path / "harness" / "engine.py").write_text("from bandit.logs.schema import y\n")
    g = graph(tmp_path)
    assert layer_violations(g) == [
        "bandit.ci imports harness.engine (collection)",
        "bandit.logs.schema imports bandit.stats.boot (a higher layer)",
    ]


def test_bandit_imports_downward_only_and_never_the_collection_side():
    g = graph()
    assert {"bandit.logs.schema", "bandit.stats.bootstrap", "bandit.policies.walk", "bandit.live.primary"} <= set(g)
    assert {"bandit.sim.simulate", "bandit.ci", "specbandit_cli", "zoo.train"} <= set(g)
    assert layer_violations(g) == []


def test_no_import_cycle():
    g = graph()
    assert "bandit.logs.schema" in g and "harness.decode.engine" in g and "sweep" in g
    assert "bandit.logs.schema" in g["harness.decode.engine"]  # the harness reads the shared schema
    c = cycle(g)
    assert c is None, "import cycle: " + " -> ".join(c)


def test_the_bottom_layer_imports_nothing_of_ours_above_it():
    g = graph()
    for low in ("bandit.logs.schema", "bandit.logs.errors", "bandit.logs.progress", "bandit.stats.resample"):
        assert g[low] <= {"bandit", "bandit.logs.errors"}, (low, g[low])
    assert g["bandit.stats.bootstrap"] <= {
        "bandit.stats.resample",
        "bandit.logs.table",
        "bandit.logs.reader",
        "bandit.logs.schema",
        "bandit",
    }
    for m, deps in g.items():  # nothing imports the command table; only it imports the headline report
        assert "specbandit_cli" not in deps, m
        if m != "specbandit_cli":
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


def repository_modules(root: Path = ROOT) -> list[Path]:
    """Every Python module of the repository that is not a test: tracked or not, outside venvs, runs and caches."""
    skip = ("tests", "runs", "build")
    return sorted(
        p
        for p in root.rglob("*.py")
        if not any(
            part.startswith(".") or part in skip or part.endswith(".egg-info") for part in p.relative_to(root).parts
        )
        and "_scratch" not in p.parts
    )


def test_every_package_is_walked():
    found = {p.relative_to(ROOT).parts[0] for p in repository_modules()}
    assert {"bandit", "harness", "zoo", "bench", "paper", "sweep.py", "specbandit_cli.py"} <= found


@pytest.mark.parametrize("path", repository_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)}: {n} lines (at most {MAX_LINES})"


def test_no_hand_written_c():
    assert not [p.name for p in (ROOT / "bandit").iterdir() if p.suffix in (".c", ".h", ".so", ".pyd")]
    assert not (ROOT / "setup.py").exists()


def test_every_command_is_registered_in_cli():
    import specbandit_cli as cli

    names = [c.name for c in cli.app.registered_commands]
    assert {"sweep", "validate", "pack", "replay", "ci", "selector", "breakeven", "wallclock", "policies"} <= set(names)
    assert len(names) == len(set(names))
    for f in module_files().values():  # no other module builds a typer app of its own, except sweep.py's script one
        if f.name not in ("specbandit_cli.py", "sweep.py"):
            assert "typer.Typer(" not in f.read_text(), f
