"""`specbandit export` (bandit/live/export.py) on the published campaign: the files read back, an independent count
over the dense log reproduces vLLM's per-position counts, import-vllm round-trips them, and bad input is refused."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bandit.live import export
from bandit.live.livelog import load_live, live_order
from bandit.logs.errors import InputError
from bandit.logs.observed import import_vllm, load_observed
from bandit.logs.reader import load_logs, published_campaign
from bandit.stats import trajectory

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / published_campaign()  # paper/campaign.txt's run


@pytest.fixture(scope="module")
def vllm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm")
    export.export(RUN, "vllm", out)
    return out


def independent(t, prompts, d, k):
    """A fixed drafter's own trajectory counted position by position, with nothing of the export's code."""
    n = trajectory.output_lengths(t)
    start = np.searchsorted(t.prompt, np.arange(t.n_prompts))
    drafts = tokens = 0
    per_pos = [0] * k
    for p in prompts:
        pos = 0
        while pos < n[p]:
            r = start[p] + pos
            a, L = int(t.accepted[r, d]), int(t.draft_len[r, d])
            if L > 0:
                drafts, tokens = drafts + 1, tokens + L
                for i in range(a):
                    per_pos[i] += 1
            pos += a + 1
    return drafts, tokens, per_pos


def test_vllm_export_reads_back_and_an_independent_count_reproduces_it(vllm_dir):
    body = json.loads((vllm_dir / export.VLLM_FILE).read_text())
    t = load_logs([RUN])
    live = load_live(RUN, t)
    k = body["k"]
    for d, name in enumerate(t.drafters):
        e = body["configs"][f"fixed:{name}"]
        drafts, tokens, per_pos = independent(t, live_order(t, live, f"fixed:{name}"), d, k)
        assert (e["num_drafts"], e["num_draft_tokens"], e["num_accepted_tokens_per_pos"]) == (drafts, tokens, per_pos)
        assert e["num_accepted_tokens"] == sum(per_pos) == e["llama_cpp"]["n_accept"]
        assert e["mean_acceptance_length"] == pytest.approx(1 + sum(per_pos) / drafts, abs=1e-6)
        assert sum(e["acceptance_histogram"]) == drafts and e["acceptance_histogram"][k] == per_pos[k - 1]
        assert sum(sum(r["acceptance_histogram"]) for r in e["per_request"]) == drafts
    assert any(c.startswith("policy:") for c in body["configs"]) and "plain" not in body["configs"]


def test_import_vllm_round_trips_the_per_position_counts(vllm_dir, tmp_path):
    body = json.loads((vllm_dir / export.VLLM_FILE).read_text())
    for config in ("fixed:eagle", "fixed:suffix_arctic", "policy:selector"):
        src = vllm_dir / "vllm_metrics" / f"{export.safe_name(config)}.json"
        rec = load_observed(import_vllm(src, tmp_path / export.safe_name(config), {"engine": "specbandit export"}))
        e = body["configs"][config]
        assert rec["accepted_per_pos"] == e["num_accepted_tokens_per_pos"]
        assert (rec["num_drafts"], rec["num_draft_tokens"]) == (e["num_drafts"], e["num_draft_tokens"])


def test_specbench_table_reads_back_with_plain_at_one(tmp_path):
    export.export(RUN, "specbench", tmp_path)
    tab = json.loads((tmp_path / export.SPECBENCH_FILE).read_text())["scopes"]
    t = load_logs([RUN])
    live = load_live(RUN, t)
    assert set(tab) == {"all", *t.workloads}
    for scope, rows in tab.items():
        assert rows["plain"]["speedup"] == 1.0 and rows["plain"]["mat"] == 1.0
        mine = [r for r in live if r["config"] == "fixed:eagle" and (scope == "all" or r["workload"] == scope)]
        mat = sum(r["tokens"] for r in mine) / sum(r["passes"] for r in mine)
        assert rows["fixed:eagle"]["mat"] == pytest.approx(mat, abs=1e-4)
        lo, hi = rows["fixed:eagle"]["speedup_ci"]
        assert lo <= rows["fixed:eagle"]["speedup"] <= hi
    assert "| plain | 1.00x" in (tmp_path / "specbench.md").read_text()


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path):
    import specbandit_cli

    runner = CliRunner()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    for args, code in (
        (["export", "--format", "csv", str(RUN)], 2),
        (["export", "--format", "vllm", ""], 2),
        (["export", "--format", "vllm", str(RUN), "--out", ""], 2),
        (["export", "--format", "vllm", str(RUN), "--out", str(link)], 1),
        (["export", "--format", "vllm", str(tmp_path / "nope")], 1),
    ):
        r = runner.invoke(specbandit_cli.app, args)
        assert r.exit_code == code, (args, r.output)
        assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1
    with pytest.raises(InputError, match="no live phase"):
        (tmp_path / "run").mkdir()
        for f in RUN.glob("blocks_*"):
            (tmp_path / "run" / f.name).symlink_to(f)
        (tmp_path / "run" / "manifest.json").write_bytes((RUN / "manifest.json").read_bytes())
        export.export(tmp_path / "run", "vllm", tmp_path / "o")
