"""Adding a drafter touches one new module and one line of the registry (harness/drafters/registry.py): a
drafter class in a module of its own, registered either by one BUILTIN line ("kind": "module:Class") or by an
installed package's entry point, is parsed, built and run on a tiny target like a built-in kind."""

import textwrap
import uuid
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from harness.models import lm
from harness.drafters import DrafterEnv, build_drafters, parse_spec, registry
from harness.decode.engine import Engine, RunConfig
from harness.models.lm import HarnessError
from harness.models.target import Target
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model

torch.set_num_threads(1)
K, MAX_NEW = 4, 12

PLUGIN = '''
from harness.drafters import Draft, Drafter


class StrideDrafter(Drafter):
    """Proposes last + step, last + 2 step, ... (mod 100), each with conf 0.5."""

    kind = "stride"

    def __init__(self, name, settings, env):
        super().__init__(name, settings, env)
        self.step = int(self.settings.get("step", 1))

    def draft(self, pre, k):
        last = pre.ids[-1]
        return Draft([(last + self.step * (j + 1)) % 100 for j in range(k)], [0.5] * k, [0.0] * k)
'''


def stride(prefix: list[int], step: int, k: int) -> list[int]:
    return [(prefix[-1] + step * (j + 1)) % 100 for j in range(k)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = make_tokenizer()
    path = save_model(make_model("llama", len(tok)), tok, tmp_path_factory.mktemp("plugin") / "target")
    return {"path": path, "model": lm.load_lm(path), "tok": lm.load_tokenizer(path)}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module of its own on sys.path, holding the drafter class: 'module:Class'."""
    name = f"specbandit_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:StrideDrafter"


def _run(tiny, specs: list[str]):
    """Dense records of every drafter in `specs` over two prompts; (drafters, [(prompt ids, result)])."""
    env = DrafterEnv(tiny["model"], tiny["tok"], tiny["path"])
    drafters = build_drafters([parse_spec(s) for s in specs], env)
    engine = Engine(Target(tiny["model"], tiny["tok"]), drafters, RunConfig("dense", K, MAX_NEW))
    runs = []
    for w, p, text in PROMPTS[:2]:
        ids = tiny["tok"](text).input_ids
        runs.append((ids, engine.run_prompt(w, p, ids)))
    return drafters, runs


def _check_drafts(runs, name: str, step: int) -> None:
    """At every origin the plug-in's draft is its rule applied to the prefix, and it was verified."""
    n = 0
    for ids, res in runs:
        assert res.records
        for r in res.records:
            d = r["drafts"][name]
            prefix = ids + res.output[: r["pos"]]
            k = min(K, MAX_NEW - 1 - r["pos"])  # the engine's draft length at this origin
            assert d["tokens"] == stride(prefix, step, k), r["pos"]
            assert d["conf"] == [0.5] * k
            assert 0 <= d["accepted"] <= len(d["tokens"])
            n += 1
    assert n >= MAX_NEW


def test_an_unregistered_kind_is_refused(plugin):
    with pytest.raises(HarnessError, match="unknown drafter kind 'stride'"):
        parse_spec("s=stride:step=3")
    with pytest.raises(HarnessError, match="neither built in nor an installed plug-in"):
        registry.resolve_class("stride")


def test_one_registry_line_adds_a_kind(tiny, plugin, monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "stride", plugin)  # the one line
    assert parse_spec("s=stride:step=3").settings == {"step": 3}
    drafters, runs = _run(tiny, ["s=stride:step=3", "ng=ngram"])
    assert type(drafters["s"]).__module__ == plugin.split(":")[0] and drafters["s"].kind == "stride"
    _check_drafts(runs, "s", 3)
    assert any(r["drafts"]["ng"]["tokens"] for _, res in runs for r in res.records)  # beside a built-in kind


def test_an_entry_point_adds_a_kind(tiny, plugin, monkeypatch):
    def entry_points(group):  # what an installed package declaring the plug-in would give
        return [EntryPoint("stride", plugin, group)] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", entry_points)
    assert "stride" not in registry.BUILTIN
    drafters, runs = _run(tiny, ["s=stride:step=7"])
    assert type(drafters["s"]).__module__ == plugin.split(":")[0]
    _check_drafts(runs, "s", 7)


def test_a_registry_line_that_does_not_import_is_named(plugin, monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "stride", plugin.replace("StrideDrafter", "Missing"))
    with pytest.raises(HarnessError, match="drafter kind 'stride' .*Missing.*: cannot import"):
        build_drafters([parse_spec("s=stride")], DrafterEnv(None, None))


def test_every_built_in_kind_is_one_line_naming_its_module():
    """BUILTIN holds "module:Class" lines; each class lives in a family module of harness/drafters/ and says its
    kind; every family module holds a kind (the shared ones: base, model, registry, suffix_tree)."""
    families = set()
    for kind, ref in registry.BUILTIN.items():
        assert isinstance(ref, str) and ref.startswith("harness.drafters."), (kind, ref)
        cls = registry.resolve_class(kind)
        assert cls.kind == kind and cls.__module__ == ref.split(":")[0], (kind, ref)
        families.add(cls.__module__.rsplit(".", 1)[1])
    modules = {p.stem for p in Path(registry.__file__).parent.glob("*.py")}
    assert families | {"__init__", "base", "model", "registry", "suffix_tree"} == modules
