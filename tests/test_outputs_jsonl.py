"""Every run keeps its outputs (harness/campaign/outputs.py): outputs.jsonl holds one line per finished prompt, which an
independent transformers `generate` regenerates token for token from its prompt_ids; a kill and --resume leave
exactly one line per finished prompt; two shards merge into the single run's lines; and a run from before
outputs.jsonl gets the same file reconstructed from its logs."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

import sweep
import workloads
from bandit.logs.errors import boundary
from harness.models import lm
from harness.campaign import merge, outputs, rundir
from harness.models.lm import HarnessError
from harness.campaign.shards import CampaignError
from harness.models.tiny import make_pair, write_workload_file
from test_harness_shards import PROMPTS  # 10 prompts, each of 2 shards holding prompts of both workloads

torch.set_num_threads(1)
MAX_NEW = 24


def _generate(model, ids, max_new, eos):
    """transformers' own greedy decoding: the output tokens after the prompt (EOS included when it stopped on it)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A tiny target whose EOS is a token its greedy outputs reach on some prompts and not on others, so that
    outputs.jsonl holds both endings; a draft model; a workload file; one unsharded run."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("outputs")
    base, draft = make_pair(root / "base")
    wl = write_workload_file(root / "wl.jsonl", PROMPTS)
    tok = lm.load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True).eval()
    outs = [_generate(model, p.token_ids(tok), MAX_NEW, None) for p in workloads.load(None, str(wl))]
    counts = {t: sum(t in o[1:] for o in outs) for o in outs for t in o[1:]}
    eos = min((t for t, c in counts.items() if 0 < c < len(outs)), key=lambda t: (-counts[t], t))
    target = root / "target"
    shutil.copytree(base, target)
    gen = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": eos}))
    z = {"target": target, "draft": draft, "wl": wl, "eos": eos, "root": root}
    z["specs"] = ["ngram=ngram", "suffix=suffix", f"draft=draft:path={draft}"]
    z["single"] = _run(z, root / "single")
    return z


def _run(z, out, **over):
    kw = dict(target=str(z["target"]), drafter=z["specs"], workload_file=str(z["wl"]), out=str(out), k=4)
    return sweep.run_sweep(**{**kw, "max_new_tokens": MAX_NEW, "quiet": True, **over})


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_one_line_per_prompt_that_generate_regenerates(zoo):
    from transformers import AutoModelForCausalLM

    run = zoo["single"]
    lines = _lines(run / "outputs.jsonl")
    tok = lm.load_tokenizer(zoo["target"])
    items = workloads.load(None, str(zoo["wl"]))
    assert [(r["workload"], r["prompt_id"]) for r in lines] == [(p.workload, p.prompt_id) for p in items]
    assert all(list(r) == ["workload", "prompt_id", "prompt_ids", "output_ids", "text"] for r in lines)
    progress = [json.loads(x) for x in (run / "progress.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(str(zoo["target"]), local_files_only=True).eval()
    ended = set()
    for r, p, item in zip(lines, progress, items):
        assert r["prompt_ids"] == item.token_ids(tok) and r["output_ids"] == p["output"]
        assert r["text"] == tok.decode(r["output_ids"], skip_special_tokens=False)
        assert _generate(model, r["prompt_ids"], MAX_NEW, zoo["eos"]) == r["output_ids"], r["prompt_id"]
        stopped = r["output_ids"][-1] == zoo["eos"]
        assert stopped or len(r["output_ids"]) == MAX_NEW  # EOS included when it stopped on it
        assert zoo["eos"] not in r["output_ids"][:-1]
        ended.add(stopped)
    assert ended == {True, False}, "the test wants prompts of both endings"
    m = json.loads((run / "manifest.json").read_text())
    assert m["outputs"] == {
        "prompts": len(PROMPTS),
        "tokens": sum(len(r["output_ids"]) for r in lines),
        "logs": ["blocks_dense.jsonl"],
        "problems": 0,
        "first": [],
    }


def test_deterministic_and_the_same_in_every_mode(zoo, tmp_path):
    again = _run(zoo, tmp_path / "again")
    assert (again / "outputs.jsonl").read_bytes() == (zoo["single"] / "outputs.jsonl").read_bytes()
    for mode in ("sparse", "live"):  # the target's own output, whichever mode ran it (greedy, float32)
        spec = zoo["specs"] if mode == "sparse" else zoo["specs"][2:]
        out = _run(zoo, tmp_path / mode, mode=mode, drafter=spec)
        assert (out / "outputs.jsonl").read_bytes() == (zoo["single"] / "outputs.jsonl").read_bytes(), mode
        m = json.loads((out / "manifest.json").read_text())
        assert m["outputs"]["problems"] == 0 and m["outputs"]["logs"] == [f"blocks_{mode}.jsonl"]


def test_a_kill_between_outputs_and_progress_then_resume(zoo, tmp_path, monkeypatch):
    ref = (zoo["single"] / "outputs.jsonl").read_bytes()
    out = tmp_path / "killed"
    real, opened = rundir._open_append, []

    def dies_at_third_progress_line(path):  # the kill lands after a prompt's outputs line, before its progress line
        if path.name == "progress.jsonl":
            opened.append(path)
            if len(opened) == 3:
                raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(rundir, "_open_append", dies_at_third_progress_line)
    with pytest.raises(KeyboardInterrupt):
        _run(zoo, out)
    monkeypatch.undo()
    assert len((out / "progress.jsonl").read_text().splitlines()) == 2
    assert len((out / "outputs.jsonl").read_text().splitlines()) == 3  # the third prompt's line, unfinished
    with open(out / "outputs.jsonl", "ab") as fh:  # and a line torn by the kill
        fh.write(b'{"workload":"code","prompt_id":"x9","prompt_ids":[1,')
    _run(zoo, out, resume=True)
    assert (out / "outputs.jsonl").read_bytes() == ref  # exactly one line per prompt, the uninterrupted bytes
    _run(zoo, out, resume=True)  # resuming a finished run changes nothing
    assert (out / "outputs.jsonl").read_bytes() == ref


def test_a_run_from_before_outputs_gets_them_on_resume(zoo, tmp_path):
    out = tmp_path / "old"
    _run(zoo, out, limit=2)  # two prompts per workload, then the file removed: a run from before outputs.jsonl
    (out / "outputs.jsonl").unlink()
    _run(zoo, out, resume=True)  # with every prompt: the first four's lines made from progress.jsonl, then the rest
    got, single = (out / "outputs.jsonl").read_text(), (zoo["single"] / "outputs.jsonl").read_text()
    assert sorted(got.splitlines()) == sorted(single.splitlines())  # in the block log's order, which --limit grew
    progress = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    keys = [(r["workload"], r["prompt_id"]) for r in _lines(out / "outputs.jsonl")]
    assert keys == [(p["workload"], p["prompt_id"]) for p in progress]
    assert json.loads((out / "manifest.json").read_text())["outputs"]["problems"] == 0


def test_shards_keep_their_outputs_and_merge_into_the_single_runs(zoo, tmp_path):
    s0 = _run(zoo, tmp_path / "s0", shard="0/2")
    s1 = _run(zoo, tmp_path / "s1", shard="1/2")
    parts = [_lines(s0 / "outputs-s0of2.jsonl"), _lines(s1 / "outputs-s1of2.jsonl")]
    assert parts[0] and parts[1] and not (s0 / "outputs.jsonl").exists()
    app = typer.Typer()
    app.command()(boundary(merge.merge))
    res = CliRunner().invoke(app, [str(s0), str(s1), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    merged = [(tmp_path / "m" / f"outputs-s{i}of2.jsonl").read_text().splitlines() for i in range(2)]
    for i, d in enumerate((s0, s1)):  # each part: its shard's lines, byte for byte, in its block log's order
        assert merged[i] == (d / f"outputs-s{i}of2.jsonl").read_text().splitlines()
        progress = [json.loads(x) for x in (d / f"progress-s{i}of2.jsonl").read_text().splitlines()]
        assert [(r["workload"], r["prompt_id"]) for r in parts[i]] == [
            (p["workload"], p["prompt_id"]) for p in progress
        ]
    single = (zoo["single"] / "outputs.jsonl").read_text().splitlines()
    assert sorted(merged[0] + merged[1]) == sorted(single)  # the single run's lines, byte for byte
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert m["outputs"]["prompts"] == len(PROMPTS) and m["outputs"]["problems"] == 0


def _copy_without_outputs(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("outputs*.jsonl"))
    return to


def _cli(*args):
    app = typer.Typer()
    app.command()(boundary(outputs.cli))  # as `python -m harness.outputs` runs it
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res.exit_code, res.output  # stdout and stderr


def test_reconstruction_from_the_logs_equals_what_the_sweep_wrote(zoo, tmp_path):
    old = _copy_without_outputs(zoo["single"], tmp_path / "old")
    code, text = _cli(old)
    assert code == 0 and f"{len(PROMPTS)} prompts" in text and "blocks_dense.jsonl" in text, text
    assert (old / "outputs.jsonl").read_bytes() == (zoo["single"] / "outputs.jsonl").read_bytes()
    code, text = _cli(old, "--check")
    assert code == 0 and "agree with blocks_dense.jsonl" in text, text
    code, text = _cli(old)  # never overwritten
    assert code == 1 and "already has outputs.jsonl" in text, text


def _edit_lines(path: Path, fn) -> None:
    path.write_text(
        "".join(json.dumps(fn(json.loads(x)), separators=(",", ":")) + "\n" for x in path.read_text().splitlines())
    )


def test_reconstruction_refuses_logs_that_lack_what_it_needs(zoo, tmp_path):
    bare = _copy_without_outputs(zoo["single"], tmp_path / "bare")
    _edit_lines(bare / "progress.jsonl", lambda r: {k: v for k, v in r.items() if k != "output"})
    code, text = _cli(bare)
    assert code == 1 and "has no output" in text and len(text.strip().splitlines()) == 1, text
    edited = _copy_without_outputs(zoo["single"], tmp_path / "edited")
    first = (edited / "blocks_dense.jsonl").read_text().splitlines()

    def wrong(r):
        for d in r["drafts"].values():
            d["accepted"] = len(d["tokens"]) + 1
        return r

    (edited / "blocks_dense.jsonl").write_text("\n".join([json.dumps(wrong(json.loads(first[0])))] + first[1:]) + "\n")
    code, text = _cli(edited)
    assert code == 1 and "the logs disagree" in text and not (edited / "outputs.jsonl").exists(), text
    other = _copy_without_outputs(zoo["single"], tmp_path / "other")  # the prompts changed since the run
    _edit_lines(other / "progress.jsonl", lambda r: {**r, "sha": "0" * 16})
    with pytest.raises(CampaignError, match="tokenizes to other ids"):
        outputs.reconstruct(other)
    assert not (other / "outputs.jsonl").exists()


def test_check_finds_an_edited_output(zoo, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(zoo["single"], run)
    assert outputs.check(run)["problems"] == 0
    _edit_lines(run / "outputs.jsonl", lambda r: {**r, "output_ids": r["output_ids"][:-1]})
    res = outputs.check(run)
    assert res["problems"] >= len(PROMPTS) and "output_ids differ from progress.jsonl" in res["first"][0]
    code, text = _cli(run, "--check")
    assert code == 1 and "problems" in text, text


def test_a_planted_outputs_symlink_is_refused(zoo, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "outputs.jsonl").symlink_to(victim)
    with pytest.raises(HarnessError, match="outputs.jsonl: is a symlink"):
        _run(zoo, out, limit=1)
    assert victim.read_text() == "precious\n"
