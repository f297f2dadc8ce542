"""Fault cases of `python -m zoo.heads` (issue 35): every bad option, prompts file, held-out file and output path is
one `error:` line naming where and a nonzero exit, before any expensive work; nothing is written through a symlink;
a truncated, empty or garbage greedy cache is discarded with a note and regenerated; relative --out is the current
directory's. The prompt-file checks are workloads.py's (bandit/logs/jsonlines.py), shared by every workload file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import workloads
from bandit.logs import limits
from harness.models.tiny import PROMPTS, make_model, make_tokenizer, save_model, write_workload_file
from zoo import heads_data
from zoo.heads import main

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)
SMALL = ["--max-new-tokens", "4", "--steps", "1", "--batch", "1", "--window", "8", "--threads", "1", "--k", "2"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("faults_heads")
    tok = make_tokenizer()
    save_model(make_model("llama", len(tok)), tok, r / "target")
    write_workload_file(r / "train.jsonl", PROMPTS)
    return r


def fails(capsys, argv: list[str], code: int | None = None, *words: str) -> str:
    """main(argv) exits nonzero (`code` if given) with one `error: ...` line holding `words`, the last on stderr
    (before it at most transformers' progress bar), and no traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]  # beside it at most transformers' load bar
    assert e.value.code not in (0, None) and (code is None or e.value.code == code), err
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]) and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def base(root: Path, out: Path | str, *more: str) -> list[str]:
    return ["--target", str(root / "target"), "--out", str(out), "--prompts", str(root / "train.jsonl"), *more]


@pytest.mark.parametrize(
    "opt, value, words",
    [
        ("--seed", "-1", ["--seed -1", "2^63"]),
        ("--seed", "99999999999999999999999", ["--seed"]),
        ("--max-new-tokens", "100000000", ["--max-new-tokens"]),
        ("--max-new-tokens", "5000", ["--max-new-tokens 5000", "1024 positions"]),
        ("--max-new-tokens", "0", ["--max-new-tokens 0"]),
        ("--batch", "0", ["--batch 0"]),
        ("--batch", "100000", ["--batch 100000"]),
        ("--medusa-heads", "10000", ["--medusa-heads 10000"]),
        ("--medusa-heads", "-3", ["--medusa-heads"]),
        ("--gen-threads", "100000", ["--gen-threads 100000", "cores"]),
        ("--gen-threads", "0", ["--gen-threads 0"]),
        ("--threads", "-1", ["--threads -1"]),
        ("--k", "0", ["--k 0"]),
        ("--limit", "0", ["--limit 0"]),
        ("--window", "1", ["--window 1"]),
        ("--steps", "x", ["--steps"]),
        ("--heldout-frac", "nan", ["--heldout-frac"]),
        ("--compare", "bogus", ["--compare bogus"]),
        ("--compare", "medusa=ngram", ["--compare", "taken"]),
        ("--out", "", ["--out ''", "empty path"]),
        ("--prompts", "", ["--prompts ''"]),
        ("--heldout", "", ["--heldout ''"]),
        ("--target", "", ["--target ''"]),
    ],
)
def test_an_option_out_of_range_is_one_line_before_any_work(root, tmp_path, capsys, opt, value, words):
    out = tmp_path / "out"
    fails(capsys, base(root, out, opt, value), None, *words)
    assert not out.exists()  # refused before anything was made


def test_memory_bounds_are_what_the_machine_has(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(limits, "available_bytes", lambda: 1 << 10)
    fails(capsys, base(root, tmp_path / "out", *SMALL), 2, "--batch 1 x --window 8", "memory", "available")
    assert not (tmp_path / "out").exists()


def _prompts(tmp_path: Path, lines: list) -> Path:
    f = tmp_path / "p.jsonl"
    f.write_bytes(b"".join(x if isinstance(x, bytes) else (json.dumps(x) + "\n").encode() for x in lines))
    return f


def _chat(content, role="user"):
    return {"workload": "chat", "prompt_id": "a", "messages": [{"role": role, "content": content}]}


@pytest.mark.parametrize(
    "lines, words",
    [
        ([b'{"workload": "w", "prompt_id": "a", "prompt": "caf\xe9"}\n'], ["p.jsonl:1", "not UTF-8"]),
        ([b"[" * 100_000 + b"]" * 100_000 + b"\n"], ["p.jsonl:1", "nested deeper"]),
        ([b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"], ["p.jsonl:1", "nested deeper"]),
        ([_chat("hi", role="wizard")], ["p.jsonl:1", "role 'wizard'", "system, user, assistant"]),
        ([_chat(7)], ["p.jsonl:1", "content is int"]),
        ([_chat("")], ["p.jsonl:1", "empty"]),
        ([{"workload": "w", "prompt_id": "a", "prompt": ""}] * 1, ["p.jsonl:1", "prompt: empty"]),
        ([{"workload": "w", "prompt_id": "a", "messages": []}], ["p.jsonl:1", "messages: empty"]),
        ([{"workload": "w", "prompt_id": True, "prompt": "x"}], ["p.jsonl:1", "prompt_id"]),
        ([b"{not json\n"], ["p.jsonl:1", "not valid JSON"]),
    ],
)
def test_a_bad_prompts_file_is_one_line_naming_the_file_and_line(root, tmp_path, capsys, lines, words):
    f = _prompts(tmp_path, lines)
    with pytest.raises(workloads.WorkloadError):
        workloads.load_workload_file(f)
    argv = ["--target", str(root / "target"), "--out", str(tmp_path / "out"), "--prompts", str(f)]
    fails(capsys, argv, 1, *words)
    held = ["--heldout", str(f)]  # the held-out file goes through the same reader
    fails(capsys, base(root, tmp_path / "out2", *held), 1, *words)


def test_an_empty_heldout_file_is_refused(root, tmp_path, capsys):
    (tmp_path / "held.jsonl").write_text("\n")
    fails(capsys, base(root, tmp_path / "out", "--heldout", str(tmp_path / "held.jsonl")), 1, "--heldout", "no prompts")


@pytest.mark.parametrize("where", ["heldout.json", "train.log", "medusa", "medusa/config.json", "eagle/README.md"])
def test_no_output_is_written_through_a_symlink(root, tmp_path, capsys, where):
    out = tmp_path / "out"
    (out / "medusa").mkdir(parents=True)
    (out / "eagle").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = out / where
    if link.is_dir():
        link.rmdir()
    link.symlink_to(victim)
    fails(capsys, base(root, out), 2, "symlink")
    assert victim.read_text() == "precious\n"


def test_a_symlinked_out_is_refused(root, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "out").symlink_to(real)
    fails(capsys, base(root, tmp_path / "out"), 2, "--out", "symlink")
    assert list(real.iterdir()) == []


def test_a_log_append_never_follows_a_symlink(tmp_path):
    from zoo.data import log

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "train.log").symlink_to(victim)
    with pytest.raises(OSError):
        log("hello", tmp_path / "train.log")
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("bad", [b"", b"garbage, not safetensors", "truncated"])
def test_a_bad_greedy_cache_is_discarded_with_a_note(tmp_path, capsys, bad):
    good = heads_data.GreedyCache(tmp_path, "ab" * 32, 4, vocab=50)
    good.entries = {"w/a": ([1, 2, 3], [4, 5]), "w/b": ([6], [7, 8, 9, 10])}
    good.save()
    data = good.path.read_bytes()
    again = heads_data.GreedyCache(tmp_path, "ab" * 32, 4, vocab=50)
    assert again.entries == good.entries and capsys.readouterr().err == ""
    good.path.write_bytes(data[: len(data) // 2] if bad == "truncated" else bad)
    c = heads_data.GreedyCache(tmp_path, "ab" * 32, 4, vocab=50)
    err = capsys.readouterr().err
    assert c.entries == {} and err.startswith("note: the greedy cache") and "regenerated" in err
    c.entries = good.entries
    c.save()
    assert heads_data.GreedyCache(tmp_path, "ab" * 32, 4, vocab=50).entries == good.entries


def test_a_cache_of_token_ids_outside_the_vocabulary_is_discarded(tmp_path, capsys):
    c = heads_data.GreedyCache(tmp_path, "cd" * 32, 4)
    c.entries = {"w/a": ([1, 2], [999])}
    c.save()
    assert heads_data.GreedyCache(tmp_path, "cd" * 32, 4, vocab=50).entries == {}
    assert "vocabulary" in capsys.readouterr().err


def test_a_run_regenerates_a_garbage_cache_under_a_relative_out(root, tmp_path, capsys, monkeypatch):
    """--out relative to the current directory (not the repository); the garbage cache there is noted and remade."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    from harness.models import lm

    sha = lm.weights_sha256(root / "target")
    (tmp_path / "rel" / f"greedy-{sha[:16]}-n4.safetensors").write_bytes(b"\0" * 40)
    main(base(root, "rel", *SMALL, "--heads", "medusa", "--limit", "1"))
    err = capsys.readouterr().err
    assert "note: the greedy cache" in err and "Traceback" not in err
    assert (tmp_path / "rel" / "heldout.json").is_file() and (
        tmp_path / "rel" / "medusa" / "model.safetensors"
    ).is_file()
    assert not (ROOT / "rel").exists()
    c = heads_data.GreedyCache(tmp_path / "rel", sha, 4)
    assert c.entries and capsys.readouterr().err == ""


def test_the_module_entry_point_is_one_line(root, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "zoo.heads", *base(root, tmp_path / "out", "--seed", "-1")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == ["error: --seed -1: expected a seed in 0..2^63-1"]


def test_a_compare_drafter_that_cannot_load_is_refused_before_the_generation(root, tmp_path, capsys):
    out = tmp_path / "out"
    fails(capsys, base(root, out, *SMALL, "--compare", f"m2=medusa:path={tmp_path / 'none'}"), 1, "--compare m2")
    assert not list(out.glob("greedy-*")) and not (out / "medusa").exists()


def test_brackets_inside_a_prompts_text_are_not_nesting(tmp_path):
    text = "[" * 1000 + '\\"{' * 100
    f = _prompts(tmp_path, [{"workload": "w", "prompt_id": "a", "prompt": text}])
    assert workloads.load_workload_file(f)[0].prompt == text
