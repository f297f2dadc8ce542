"""Workload sources (zoo files, benchmark files, --workload-file) and the drafter plug-in point."""

import json
import sys

import pytest

import workloads as W
from harness.drafters import Draft, Drafter, DrafterEnv, build_drafters, parse_spec
from harness.models.lm import HarnessError
from harness.models.tiny import make_tokenizer


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_workload_file_and_errors(tmp_path):
    f = _jsonl(
        tmp_path / "w.jsonl",
        [
            {"workload": "a", "prompt_id": "1", "prompt": "hi"},
            {"workload": "b", "prompt_id": 2, "messages": [{"role": "user", "content": "yo"}]},
            {"workload": "a", "prompt_id": "3", "prompt": "ho"},
        ],
    )
    items = W.load(workload_file=str(f), limit=1)
    assert [(i.workload, i.prompt_id) for i in items] == [("a", "1"), ("b", "2")]
    tok = make_tokenizer()
    assert tok.decode(items[1].token_ids(tok)) == "user: yo\nassistant: "  # no chat template: plain turns
    for bad, msg in [
        ({"workload": "a", "prompt_id": "1"}, "exactly one of prompt"),
        ({"workload": "a", "prompt": "x"}, "prompt_id"),
        ({"workload": "a", "prompt_id": "1", "messages": [{"text": "x"}]}, "role and content"),
    ]:
        g = _jsonl(tmp_path / "bad.jsonl", [{"workload": "a", "prompt_id": "0", "prompt": "ok"}, bad])
        with pytest.raises(W.WorkloadError, match=f"bad.jsonl:2: .*{msg}"):
            W.load_workload_file(g)
    g = _jsonl(tmp_path / "dup.jsonl", [{"workload": "a", "prompt_id": "1", "prompt": "x"}] * 2)
    with pytest.raises(W.WorkloadError, match="dup.jsonl:2: prompt_id '1' repeats"):
        W.load_workload_file(g)


def test_benchmark_files(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECBANDIT_DATA", raising=False)
    monkeypatch.delenv("MACH_MODELS", raising=False)
    monkeypatch.delenv("SPECBANDIT_MODELS", raising=False)
    with pytest.raises(W.WorkloadError, match=r"gsm8k/test.jsonl not found; looked in: .*mine/gsm8k/test.jsonl"):
        W.load(["gsm8k"], data=str(tmp_path / "mine"))
    models = tmp_path / "models"
    _jsonl(
        models / "data/spec_bench/question.jsonl",
        [
            {"question_id": 1, "category": "translation", "turns": ["Translate: bonjour", "again"]},
            {"question_id": 2, "category": "math_reasoning", "turns": ["2+2?"]},
        ],
    )
    monkeypatch.setenv("MACH_MODELS", str(models))  # the models-root convention
    items = W.load(["specbench:math_reasoning"])
    assert [(i.workload, i.prompt_id, i.messages[0]["content"]) for i in items] == [
        ("specbench:math_reasoning", "2", "2+2?")
    ]
    assert len(W.load(["specbench"])) == 2
    with pytest.raises(W.WorkloadError, match="unknown category"):
        W.load(["specbench:poetry"])
    _jsonl(tmp_path / "gsm.jsonl", [{"question": "How many?", "answer": "4"}])
    _jsonl(tmp_path / "he.jsonl", [{"task_id": "HumanEval/0", "prompt": "def f():\n"}])
    _jsonl(tmp_path / "mt.jsonl", [{"question_id": 81, "turns": ["Write a poem"]}])
    src = tmp_path / "src.py"
    src.write_text("def value_of(x):\n    return value_of_inner(x)\n" * 30)
    paths = {
        "gsm8k": tmp_path / "gsm.jsonl",
        "humaneval": tmp_path / "he.jsonl",
        "mtbench": tmp_path / "mt.jsonl",
        "copyedit": src,
    }
    items = W.load(["gsm8k", "humaneval", "mtbench", "copyedit"], paths=paths)
    assert [i.workload for i in items] == ["gsm8k", "humaneval", "mtbench", "copyedit", "copyedit"]
    assert items[1].prompt == "def f():\n" and items[1].prompt_id == "HumanEval/0"
    assert "renamed to `value_of_v2`" in items[3].messages[0]["content"]
    with pytest.raises(W.WorkloadError, match="--workload-path gsm8k=.*nope.jsonl: file not found"):
        W.load(["gsm8k"], paths={"gsm8k": tmp_path / "nope.jsonl"})


def test_zoo_workloads_named():
    if not (W.ZOO_WORKLOADS / "code.jsonl").is_file():
        pytest.skip("zoo workloads not built yet")
    items = W.load(["code", "chat"], limit=2)
    assert [i.workload for i in items] == ["code", "code", "chat", "chat"]


class EchoDrafter(Drafter):
    """A plug-in: proposes the last token `n` times."""

    kind = "echo"

    def draft(self, pre, k):
        n = min(k, int(self.settings.get("n", 2)))
        return Draft([pre.ids[-1]] * n, [0.5] * n, [0.1] * n)


@pytest.mark.parametrize("spec", ["e=my_plugins:EchoDrafter:n=3", "x=os:system", "x=builtins:eval", "e=warp"])
def test_no_import_path_is_a_drafter_kind(monkeypatch, spec):
    """A command line never names code to import: only built-in kinds and installed plug-ins (entry points)."""
    monkeypatch.setitem(sys.modules, "my_plugins", sys.modules[__name__])
    with pytest.raises(HarnessError, match="unknown drafter kind .*known kinds: .*ngram.*installed plug-ins"):
        parse_spec(spec)


def test_plugin_by_entry_point(tmp_path, monkeypatch):
    """A package declaring [project.entry-points."specbandit.drafters"] echo = ... is found."""
    dist = tmp_path / "fakeplug-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[specbandit.drafters]\necho = my_plugins:EchoDrafter\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "my_plugins", sys.modules[__name__])
    spec = parse_spec("e=echo:n=1")
    assert spec.kind == "echo"
    d = build_drafters([spec], DrafterEnv(None, None))["e"]
    from harness.drafters import Prefix

    assert d.draft(Prefix([3, 4], 1, None, 0, 0.0), 8).tokens == [4]
