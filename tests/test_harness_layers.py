"""harness/'s rooms (docs/DESIGN.md, "Layout"): models (loading, formats, the target's forward) at the bottom, then
drafters, then decode (the engine, the live phase), then campaign (run directory, shards, Ray, merge) on top. A
module imports from its own room or a lower one, never a higher one, imports inside functions included; no cycle;
the top level of harness/ holds its __init__ and `python -m` shims only, which nothing imports."""

import ast

from test_layers import ROOT, cycle, graph

ROOMS = ("models", "drafters", "decode", "campaign")  # lowest first
SHIMS = ("gguf", "smollm2", "outputs")  # python -m harness.<name>: the moved module's main, nothing else
MAX_TOP = 8  # modules at harness/'s top level, __init__.py included


def rank(module: str) -> int | None:
    """A harness module's room by its place in ROOMS; a top-level shim above every room; the package itself None."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return ROOMS.index(parts[1]) if parts[1] in ROOMS else len(ROOMS)


def room_violations(g: dict[str, set[str]]) -> list[str]:
    """Every import of a harness module that goes up a room (a shim counts as the top), or a room that is not one."""
    bad = []
    for m, deps in g.items():
        if m.split(".")[0] != "harness" or rank(m) is None:
            continue
        for d in deps:
            if d.split(".")[0] == "harness" and rank(d) is not None and rank(d) > rank(m):
                where = "a shim" if rank(d) == len(ROOMS) else f"harness/{ROOMS[rank(d)]}/"
                bad.append(f"{m} imports {d} ({where}, above {m.split('.')[1]})")
    return sorted(bad)


def room_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the rooms its modules import (its own left out)."""
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        if m.split(".")[0] == "harness" and rank(m) is not None and rank(m) < len(ROOMS):
            room = m.split(".")[1]
            out.setdefault(room, set()).update(
                d.split(".")[1]
                for d in deps
                if d.split(".")[0] == "harness" and rank(d) is not None and d.split(".")[1] != room
            )
    return out


def harness_only(g: dict[str, set[str]]) -> dict[str, set[str]]:
    return {
        m: {d for d in deps if d.split(".")[0] == "harness"} for m, deps in g.items() if m.split(".")[0] == "harness"
    }


def plant(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for room in ROOMS:
        (tmp_path / "harness" / room).mkdir(parents=True, exist_ok=True)
        (tmp_path / "harness" / room / "__init__.py").write_text("")
    (tmp_path / "harness" / "__init__.py").write_text("")
    return graph(tmp_path)


def test_the_room_check_finds_planted_upward_imports(tmp_path):
    g = plant(
        tmp_path,
        {
            "harness/models/lm.py": "def f():\n    from harness.campaign import shards  # hidden inside a function\n",
            "harness/drafters/base.py": "from ..models import lm\nfrom ..decode.engine import Engine\n",
            "harness/decode/engine.py": "from harness.drafters import base\nimport harness.gguf\n",
            "harness/campaign/shards.py": "from harness.decode import engine\nfrom harness.models.lm import f\n",
            "harness/gguf.py": "from harness.models.lm import f\n",
        },
    )
    assert room_violations(g) == [
        "harness.decode.engine imports harness.gguf (a shim, above decode)",
        "harness.drafters.base imports harness.decode.engine (harness/decode/, above drafters)",
        "harness.models.lm imports harness.campaign.shards (harness/campaign/, above models)",
    ]
    assert set(cycle(room_graph(g))) >= {"models", "campaign"}


def test_the_cycle_check_finds_a_planted_cycle_inside_a_room(tmp_path):
    g = plant(tmp_path, {"harness/models/a.py": "from . import b\n", "harness/models/b.py": "from .a import x\n"})
    assert room_violations(g) == []
    assert set(cycle(harness_only(g))) == {"harness.models.a", "harness.models.b"}


def test_harness_imports_downward_only():
    g = graph()
    assert {"harness.models.lm", "harness.drafters.base", "harness.decode.engine", "harness.campaign.rundir"} <= set(g)
    assert "harness.models.lm" in g["harness.drafters.base"]  # the check sees the imports it rules on
    assert "harness.drafters" in g["harness.decode.engine"]
    assert room_violations(g) == []


def test_no_cycle_in_harness_between_rooms_or_modules():
    g = graph()
    c = cycle(room_graph(g))
    assert c is None, "rooms in a cycle: " + " -> ".join(c)
    c = cycle(harness_only(g))
    assert c is None, "import cycle: " + " -> ".join(c)


def test_the_top_level_holds_init_and_shims_only():
    top = sorted(p.stem for p in (ROOT / "harness").glob("*.py"))
    assert len(top) <= MAX_TOP, top
    assert set(top) <= {"__init__", *SHIMS}, top
    rooms = sorted(p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(ROOMS), rooms


def test_a_shim_holds_no_logic():
    """harness/<name>.py: a docstring, `from harness.<room>.<name> import main`, and `if __name__ == "__main__": main()`."""
    for name in SHIMS:
        body = ast.parse((ROOT / "harness" / f"{name}.py").read_text()).body
        kinds = [type(n).__name__ for n in body]
        assert kinds == ["Expr", "ImportFrom", "If"], (name, kinds)
        imp = body[1]
        assert imp.module in {f"harness.{room}.{name}" for room in ROOMS} and [a.name for a in imp.names] == ["main"]
        assert ast.unparse(body[2]) == "if __name__ == '__main__':\n    main()", name
