"""sweep.py end to end on tiny models: bad inputs fail before any work, logs load with
bandit.logs, the manifest has exactly the documented fields, and reruns are byte-identical."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import sweep
from bandit.policies.livepolicies import LIVE_POLICIES
from bandit.logs.reader import load_logs
from harness.campaign import campaign
from harness.decode import livephase
from harness.models.tiny import make_model, make_tokenizer, make_zoo, save_model, write_workload_file

torch.set_num_threads(1)
MANIFEST_KEYS = [
    "v",
    "label",
    "run",
    "created",
    "mode",
    "target",
    "drafters",
    "k",
    "temperature",
    "seed",
    "workloads",
    "hardware",
    "code_version",
]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    z = make_zoo(root)
    z["wl"] = write_workload_file(root / "wl.jsonl")
    tok = make_tokenizer(extra="é")  # one more token: a different vocabulary
    z["other"] = save_model(make_model("llama", len(tok), seed=5), tok, root / "other")
    return z


def _cli(args):
    res = CliRunner().invoke(sweep.app, [str(a) for a in args])
    return res.exit_code, (res.output or "") + (getattr(res, "stderr", "") or "")


def _base(z, out, *extra, drafters=None):
    args = ["--target", z["target"], "--workload-file", z["wl"], "--out", out, "--k", "4", "--max-new-tokens", "24"]
    for d in drafters if drafters is not None else z["specs"]:
        args += ["--drafter", d]
    return args + list(extra)


@pytest.mark.parametrize(
    "change,message",
    [
        (["--drafter", "x=warpdrive"], "unknown drafter kind 'warpdrive'"),
        (["--drafter", "x=ngram:n_mx=3"], "unknown setting"),
        (["--drafter", "x=draft:path=/nonexistent/model"], "/nonexistent/model"),
        (["--drafter", "x=draft"], "missing setting path="),
        (["--drafter", "x=cascade:of=draft+nothing"], "nothing"),
        (["--drafter", "x=medusa:path={eagle}"], "format"),  # an EAGLE head given as Medusa heads
        (["--drafter", "x=eagle:path={draft}"], "not a head"),  # a model directory, not a head
        (["--k", "0"], "--k 0"),
        (["--mode", "turbo"], "--mode 'turbo'"),
        (["--workloads", "nosuchbench", "--workload-file", ""], "unknown workload"),
        (["--workloads", "code"], "not both"),
        (["--workloads", "gsm8k", "--workload-file", ""], "gsm8k/test.jsonl"),
    ],
)
def test_bad_inputs_fail_before_work(zoo, tmp_path, change, message):
    out = tmp_path / "run"
    change = [c.format(eagle=zoo["root"] / "eagle", draft=zoo["draft"]) for c in change]
    code, text = _cli(_base(zoo, out, *change))
    assert code == 1, text  # an input problem (bandit.errors.EXIT_INPUT)
    assert "error:" in text and message in text, text
    assert not out.exists()  # nothing was written


def test_missing_target_and_tokenizer_mismatch(zoo, tmp_path):
    out = tmp_path / "run"
    code, text = _cli(
        ["--target", tmp_path / "nope", "--drafter", "n=ngram", "--workload-file", zoo["wl"], "--out", out]
    )
    assert code == 1 and "no such directory" in text and str(tmp_path / "nope") in text
    code, text = _cli(_base(zoo, out, drafters=["n=ngram", f"d=draft:path={zoo['other']}"]))
    assert code == 1 and "tokenizer mismatch" in text and str(zoo["other"]) in text, text
    assert not out.exists()


def test_models_root_resolution(zoo, tmp_path, monkeypatch):
    monkeypatch.setenv("MACH_MODELS", str(zoo["root"]))
    out = tmp_path / "run"
    code, text = _cli(
        [
            "--target",
            "target",
            "--drafter",
            "d=draft:path=draft",
            "--workload-file",
            zoo["wl"],
            "--out",
            out,
            "--k",
            "3",
            "--max-new-tokens",
            "8",
            "--limit",
            "1",
        ]
    )
    assert code == 0, text
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"]["sha256"] and m["drafters"]["d"]["sha256"]


def test_default_without_zoo_says_what_it_needs(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "REPO", tmp_path)
    code, text = _cli([])
    assert code == 1
    assert "zoo/target/model.safetensors" in text and "python -m zoo.train all" in text


def _strip_times(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        r.pop("target_ms", None)
        for d in r["drafts"].values():
            d.pop("ms", None)
    return recs


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_logs_validate_and_rerun_identically(zoo, tmp_path, mode):
    runs = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        code, text = _cli(_base(zoo, out, "--mode", mode, "--calibrate", "1" if i == 0 else "0"))
        assert code == 0, text
        assert f"python bandit/replay.py {out}" in text and f"python bandit/ci.py {out}" in text
        runs.append(out)
    blocks = runs[0] / f"blocks_{mode}.jsonl"
    table = load_logs([runs[0]])
    assert table.label == "MEASURED" and set(table.drafters) == {s.split("=")[0] for s in zoo["specs"]}
    assert table.dense == (mode == "dense") and table.n_prompts == 4
    if mode == "dense":  # byte-identical, including timing-free fields' layout
        assert blocks.read_bytes() == (runs[1] / blocks.name).read_bytes()
    else:
        assert _strip_times(blocks) == _strip_times(runs[1] / blocks.name)
    m = json.loads((runs[0] / "manifest.json").read_text())
    assert list(m)[: len(MANIFEST_KEYS)] == MANIFEST_KEYS
    assert set(m) <= set(MANIFEST_KEYS) | {
        "timing",
        "complete",
        "target_check",
        "n_prompts",
        "throughput",
        "outputs",
        "kernels",
    }
    assert m["kernels"]["requested"] == "default" and m["kernels"]["kernels"] in ("mkldnn", "aten")
    assert m["outputs"]["prompts"] == 4 and m["outputs"]["problems"] == 0  # outputs.jsonl agrees with the log
    assert m["complete"] is True and m["n_prompts"] == 4
    (w,) = m["throughput"]["workers"].values()  # one process: one worker, every prompt
    assert w["prompts"] == 4 and w["records"] == len(table.pos) and w["records_per_s"] > 0
    tc = m["target_check"]  # float32 on CPU: the verification forward agrees with the run everywhere
    assert tc["prompts_checked"] == 4 and tc["disagreements"] == 0 and tc["dtype"] == "float32"
    assert m["label"] == "MEASURED" and m["mode"] == mode and m["k"] == 4 and m["run"] == "r0"
    if mode == "dense":  # the live calibration phase measured rho and alpha's ingredients
        t = m["timing"]
        assert t["verify_ms"]["tokens"] == [1, 2, 4, 5] and len(t["verify_ms"]["ms"]) == 4
        assert t["verify_batch_ms"]["drafts"] == list(range(1, 7))
        assert set(t["drafter_ms"]) == set(table.drafters) and all(v > 0 for v in t["drafter_ms"].values())
        first = json.loads(blocks.read_text().splitlines()[0])
        assert list(first) == ["v", "workload", "prompt_id", "pos", "drafts"]


def test_threads_mean_what_they_say_and_the_manifest_records_them(zoo, tmp_path):
    import os

    import torch

    before = torch.get_num_threads()
    try:
        for given, want in ((["--threads", "1"], 1), ([], os.cpu_count() or 1)):  # default: every core
            out = tmp_path / f"t{want}{len(given)}"
            code, text = _cli(_base(zoo, out, "--mode", "sparse", *given))
            assert code == 0, text
            assert json.loads((out / "manifest.json").read_text())["hardware"]["threads"] == want
    finally:
        torch.set_num_threads(before)


def test_live_mode_run(zoo, tmp_path):
    out = tmp_path / "live"
    code, text = _cli(_base(zoo, out, "--mode", "live", drafters=[f"d=draft:path={zoo['draft']}"]))
    assert code == 0, text
    table = load_logs([out])
    assert (table.block >= 0).all() and (table.target_ms > 0).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["mode"] == "live" and m["timing"]["drafter_ms"]["d"] > 0
    code, text = _cli(_base(zoo, tmp_path / "live2", "--mode", "live"))
    assert code == 1 and "one drafter" in text
    # a policy from bandit/policies/registry.py chooses among all drafters, one observed per block
    out = tmp_path / "live3"
    code, text = _cli(_base(zoo, out, "--mode", "live", "--policy", "random:random_state=0"))
    assert code == 0, text
    recs = [json.loads(x) for x in (out / "blocks_live.jsonl").read_text().splitlines()]
    assert all(len(r["drafts"]) == 1 for r in recs) and len({n for r in recs for n in r["drafts"]}) > 2
    for bad in ("bandit.policies:Random", "os:system", "nope"):  # never a module:attr named on the command line
        code, text = _cli(_base(zoo, tmp_path / "live4", "--mode", "live", "--policy", bad))
        assert code == 1 and "unknown policy" in text, text


def test_embedded_default_runs_on_a_zoo(zoo, tmp_path, monkeypatch):
    """`python sweep.py` with no model flags: the zoo layout, every default drafter, the live
    phase (every fixed drafter and best-of-N), logs that load. Here the zoo is a tiny stand-in under a fake repo."""
    import shutil

    import workloads

    repo = tmp_path / "repo"
    for name in ("target", "draft", "medusa", "eagle"):
        shutil.copytree(zoo["root"] / name, repo / "zoo" / name)
    (repo / "zoo/workloads").mkdir(parents=True)
    for w in sweep.DEFAULT_WORKLOADS:
        write_workload_file(repo / "zoo/workloads" / f"{w}.jsonl", [(w, f"{w}1", f"{w}: abc abc abc")])
    monkeypatch.setattr(sweep, "REPO", repo)
    monkeypatch.setattr(campaign, "REPO", repo)  # where the manifest records paths relative to
    monkeypatch.setattr(workloads, "ZOO_WORKLOADS", repo / "zoo/workloads")
    monkeypatch.setattr(sweep, "DEFAULT_LIVE_PROMPTS", 1)
    code, text = _cli(["--max-new-tokens", "12"])
    assert code == 0, text
    (run,) = (repo / "runs").iterdir()
    assert run.name.startswith("zoo-") and f"python bandit/replay.py {run}" in text
    table = load_logs([run])
    assert set(table.drafters) == {s.split("=")[0] for s in sweep.DEFAULT_DRAFTERS}
    assert table.workloads == tuple(sorted(sweep.DEFAULT_WORKLOADS)) and table.dense
    m = json.loads((run / "manifest.json").read_text())
    assert m["target"]["path"] == "zoo/target" and m["k"] == sweep.DEFAULT_K and "timing" in m
    assert m["drafters"]["draft"]["settings"]["path"] == "zoo/draft"  # repository-relative: manifests travel
    assert m["drafters"]["cascade"]["settings"]["of"] == "draft+ngram"
    live = [json.loads(x) for x in (run / "live.jsonl").read_text().splitlines()]
    configs = livephase.configurations([s.split("=")[0] for s in sweep.DEFAULT_DRAFTERS], LIVE_POLICIES)
    assert [r["config"] for r in live] == configs * len(sweep.DEFAULT_WORKLOADS)  # one prompt per workload
    assert {"plain", "best_of_n", "fixed:ngram", "policy:selector"} <= set(configs) and m["live"]["prompts"] == 4
