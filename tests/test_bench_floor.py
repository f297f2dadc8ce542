"""bench/floor.py on a tiny target: the JSON's schema (the float32 best path at the top level, every record under
"runs", the targets judged), the floor's byte count, and every refused setting as one line and a nonzero exit."""

import json

import pytest

from bandit.logs.errors import guarded
from bench import floor
from harness.models.tiny import make_zoo

FAST = ["--context", "8", "--q", "1,2,5", "--reps", "1", "--bw-mib", "8", "--threads", "1"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_zoo(tmp_path_factory.mktemp("floor"))["target"]


def run(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        guarded(lambda: floor.main(argv))
    got = capsys.readouterr()
    run.out = got.out  # (the printed tables, for the tests that read them)
    return e.value.code, got.err.strip()


def test_the_json_holds_the_float32_best_path_and_every_record(target, tmp_path, capsys):
    out = tmp_path / "floor.json"
    argv = ["--target", str(target), *FAST, "--kernels", "aten,mkldnn", "--drafters", "eagle,layerskip"]
    code, err = run([*argv, "--json", str(out)], capsys)
    assert code == 0, err
    got = json.loads(out.read_text())
    assert {"ms", "floor_ms", "dtype", "threads", "kernels", "host"} <= set(got)
    assert got["dtype"] == "float32" and got["threads"] == 1 and got["kernels"] in ("aten", "mkldnn")
    assert set(got["ms"]) == {"1", "2", "5"} and all(v["median"] > 0 for v in got["ms"].values())
    assert got["ms"]["1"]["ratio_q1"] == 1.0 and got["floor_ms"] > 0 and got["host"]["cores"] >= 1
    assert [(r["dtype"], r["kernels"]) for r in got["runs"]] == [
        ("float32", "aten"),
        ("float32", "mkldnn"),
        ("bfloat16", "aten"),
        ("bfloat16", "mkldnn"),
    ]
    best = min(
        (r for r in got["runs"] if r["dtype"] == "float32"), key=lambda r: sum(v["median"] for v in r["ms"].values())
    )
    assert got["kernels"] == best["kernels"] and got["ms"] == best["ms"]
    assert [t["target"].split()[0] for t in got["targets"]] == ["float32", "float32", "bfloat16"]
    assert set(got["drafters"]["float32/aten"]) == {"eagle", "layerskip"}
    assert got["bandwidth"]["gbs"] > 0
    for r in got["runs"]:  # the profile's parts are the profiled forward's, which runs no faster than unprofiled
        p = r["profile"]
        assert p["linear"] > 0 and p["attention"] > 0 and p["other ops"] > 0
        assert sum(p[k] for k in ("linear", "attention", "other ops", "python and dispatch")) == pytest.approx(
            p["profiled_ms"], abs=0.01
        )
    assert "where a Q=1 forward's time goes" in run.out


def test_the_floor_counts_each_weight_once_and_the_cache(target):
    from harness.models import lm

    model = lm.load_lm(target)
    weights = sum(p.numel() * 4 for p in model.parameters())  # the tiny target is untied: embedding rows only
    emb = model.get_input_embeddings().weight
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert floor.floor_bytes(model, 3, 10) == weights - emb.numel() * 4 + 3 * emb.shape[1] * 4 + kv * 13


@pytest.mark.parametrize(
    "extra,code,said",
    [
        (["--threads", "0"], 2, "--threads 0: expected at least 1"),
        (["--q", "1,2000"], 2, "--q 2000 after --context 8: 2008 positions, past the model's 1024"),
        (["--kernels", "aten,fast"], 2, "--kernels: unknown ['fast']; known: aten, mkldnn-hf, mkldnn, compile"),
        (["--dtypes", "float16"], 2, "--dtypes: unknown ['float16']"),
        (["--drafters", "medusa,ngram"], 2, "--drafters: unknown ['ngram']"),
        (["--json", "{tmp}/no/such/f.json"], 1, "the folder {tmp}/no/such does not exist"),
    ],
)
def test_a_bad_setting_is_one_line(target, tmp_path, capsys, extra, code, said):
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    got, err = run(["--target", str(target), *FAST, *extra], capsys)
    assert got == code, err
    assert err.startswith("error: ") and said.replace("{tmp}", str(tmp_path)) in err and "\n" not in err


def test_a_bad_target_and_a_symlinked_json_are_one_line(tmp_path, target, capsys):
    got, err = run(["--target", str(tmp_path / "nope"), *FAST], capsys)
    assert got == 1 and err == f"error: --target {tmp_path / 'nope'}: no model directory (no config.json there)"
    (tmp_path / "elsewhere").write_text("keep")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere")
    got, err = run(["--target", str(target), *FAST, "--json", str(tmp_path / "link.json")], capsys)
    assert got == 1 and "a symlink stands there" in err and "\n" not in err
    assert (tmp_path / "elsewhere").read_text() == "keep"
