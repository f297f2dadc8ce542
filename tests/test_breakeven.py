"""The cost model against hand computation from docs/DESIGN.md's formula, and the what-if CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from bandit.stats import costmodel
from bandit import breakeven as be


def hand(g, R, K, rho, alpha):
    # docs/DESIGN.md: c0 = 1 + rho_p; c = 1 + rho_p + R (sum_A rho_d + alpha); speedup = (1 + g) c0 / c
    c0 = 1 + rho
    c = 1 + rho + R * (K * rho + alpha)
    return (1 + g) * c0 / c


POINTS = [(0.081, 0.43, 1, 0.0), (0.081, 0.43, 1, 0.25), (0.2, 0.3, 3, 0.0), (0.05, 0.1, 2, 0.1), (0.4, 1.0, 3, 0.0)]


@pytest.mark.parametrize("g,R,K,alpha", POINTS)
def test_whatif_equals_hand_computation(g, R, K, alpha):
    rhos = [0.0, 0.02, 0.05, 0.1, 0.3]
    ans = costmodel.whatif(g, R, K, rhos, alpha)
    for r in rhos:
        assert ans["speedup"][f"{r:g}"] == pytest.approx(hand(g, R, K, r, alpha), abs=1e-6)
    root = ans["breakeven_rho"]
    # brute force: where does hand() cross 1 on a fine grid of rho >= 0?
    grid = np.linspace(0, 50, 500001)
    s = hand(g, R, K, grid, alpha) - 1
    crossings = grid[1:][np.sign(s[1:]) != np.sign(s[:-1])]
    if root is None:
        assert crossings.size == 0
    else:
        assert crossings.size == 1 and root == pytest.approx(crossings[0], abs=2e-4)
        assert hand(g, R, K, root, alpha) == pytest.approx(1.0, abs=1e-6)


def test_research_readme_operating_point():
    # 8.1% gain at 43% redraft with one alternative: wins below rho ~0.23 with union verification, never at alpha 0.25
    assert costmodel.breakeven_rho(0.081, 0.43, 1, 0.0) == pytest.approx(0.081 / (0.43 - 0.081))
    assert costmodel.breakeven_rho(0.081, 0.43, 1, 0.25) is None
    assert costmodel.breakeven_regime(0.081, 0.43, 1, 0.25) == "never"
    assert costmodel.breakeven_regime(0.081, 0.43, 1, 0.0) == "below"
    assert costmodel.breakeven_regime(0.5, 0.1, 1, 0.0) == "always"


def test_general_speedup_matches_equal_rho_form_and_vectorises():
    assert costmodel.speedup(0.1, 0.4, 0.05, [0.05, 0.05, 0.05], 0.2) == pytest.approx(hand(0.1, 0.4, 3, 0.05, 0.2))
    # unequal costs: only the sum over the alternatives matters
    assert costmodel.speedup(0.1, 0.4, 0.02, [0.01, 0.09], 0.0) == pytest.approx(1.1 * 1.02 / (1.02 + 0.4 * 0.10))
    v = costmodel.speedup_equal(0.1, 0.4, 2, np.array([0.0, 0.1]), 0.0)
    assert v.shape == (2,) and v[0] == pytest.approx(1.1)


def test_whatif_cli_json():
    from specbandit_cli import app

    out = CliRunner().invoke(
        app,
        [
            "breakeven",
            "--gain",
            "0.081",
            "--redraft",
            "0.43",
            "--alternatives",
            "1",
            "--rho",
            "0.02,0.05,0.1",
            "--alpha",
            "0",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    ans = json.loads(out.output)
    assert set(ans) == {"speedup", "breakeven_rho"}
    assert ans["speedup"]["0.1"] == pytest.approx(hand(0.081, 0.43, 1, 0.1, 0.0), abs=1e-6)
    assert ans["breakeven_rho"] == pytest.approx(0.232092, abs=1e-6)
    out = CliRunner().invoke(app, ["breakeven", "--gain", "0.081", "--redraft", "0.43", "--alpha", "0.25", "--json"])
    assert json.loads(out.output)["breakeven_rho"] is None


MANIFEST = {
    "run": "r",
    "k": 8,
    "timing": {
        "verify_ms": {"tokens": [1, 2, 4, 8, 9], "ms": [5.1, 5.3, 5.6, 6.0, 6.1]},
        "verify_batch_ms": {"drafts": [1, 2, 3], "ms": [6.1, 7.0, 7.9]},
        "drafter_ms": {"ngram": 0.04, "draft": 2.9},
    },
}


def test_rho_alpha_from_manifest():
    rho, alpha = costmodel.rho_alpha_from_manifest(MANIFEST)
    assert rho["ngram"] == pytest.approx(0.04 / 6.1) and rho["draft"] == pytest.approx(2.9 / 6.1)
    assert alpha == pytest.approx(7.0 / 6.1 - 1)
    assert costmodel.rho_alpha_from_manifest({"k": 8}) is None
    bad = {**MANIFEST, "timing": {"verify_ms": {"tokens": [1]}}}
    with pytest.raises(ValueError, match="manifest r: timing"):
        costmodel.rho_alpha_from_manifest(bad)


def test_report_with_one_drafter_has_no_selector(tmp_path):
    from bandit.logs.reader import load_logs
    from bandit.sim.simulate import SimConfig, write_sim_run

    write_sim_run(SimConfig(n_prompts=3, out_len=30), tmp_path / "sim")
    t = load_logs([tmp_path / "sim"])
    r = be.report_from_table(t.select_drafters([t.drafters[0], t.drafters[1]]), 50, 5)
    assert r.selector and len(r.single_gain) == 1
    one = be.report_from_table(t.select_drafters([t.drafters[0]]), 50, 5)
    assert one.selector == {} and one.single_gain == {} and one.bon_gain.value == 0.0


def test_costs_charge_the_union_of_every_draft_verified():
    """alpha(K) = verify_batch(1 + K) / verify_batch(1) - 1: best-of-N over D drafters pays the union of all D."""
    m = {
        **MANIFEST,
        "timing": {
            **MANIFEST["timing"],
            "verify_batch_ms": {"drafts": [1, 2, 3], "ms": [6.1, 7.0, 7.9]},
            "drafter_ms": {"a": 0.61, "b": 0.0, "c": 1.22},
        },
    }
    c = costmodel.costs_for(("a", "b", "c"), m)
    assert c.source == "measured"
    assert c.alpha(1) == pytest.approx(7.0 / 6.1 - 1) and c.alpha(2) == pytest.approx(7.9 / 6.1 - 1)
    assert c.rho == pytest.approx([0.1, 0.0, 0.2])
    # primary a, re-draft 40% with b and c: c = 1.1 + 0.4 (0.0 + 0.2 + alpha(2))
    want = 1.25 * 1.1 / (1.1 + 0.4 * (0.2 + 7.9 / 6.1 - 1))
    assert c.speedup(0, [1, 2], 0.4, 0.25) == pytest.approx(want)
    w = costmodel.costs_for(("a", "b"), None)
    assert w.source == "what-if" and w.rho == pytest.approx([costmodel.WHATIF_RHO] * 2) and w.alpha(1) == 0.0


def test_report_from_logs_labels_and_cis(tmp_path):
    from bandit.logs.reader import load_logs
    from bandit.sim.simulate import SimConfig, write_sim_run

    write_sim_run(SimConfig(n_prompts=6, out_len=48, shared=0.0), tmp_path / "sim")
    text = be.main([tmp_path / "sim"], out=tmp_path / "be.txt", n_resamples=200, n_refit=20)
    assert (tmp_path / "be.txt").read_text() in text and (tmp_path / "be.png").stat().st_size > 0
    assert "[MODEL]" in text and "[SIM]" in text and "[MEASURED]" not in text
    t = load_logs([tmp_path / "sim"])
    r = be.report_from_table(t, 200, 20)
    assert be.render(r) == (tmp_path / "be.txt").read_text().split("\n", 1)[1]  # after its "# made by:" line
    # every gain carries an interval around its value; best-of-N's speedup is its gain mapped through the model
    for band in (r.bon_gain, *r.single_gain.values()):  # smooth ratios: the percentile interval holds the value
        assert band.lo <= band.value <= band.hi
    assert set(r.selector) == {"selector_token_gain", "selector_redraft_rate", "selector_speedup"}
    assert all(b.label == ("MODEL" if k == "selector_speedup" else "SIM") for k, b in r.selector.items())
    # best-of-N gain against a direct computation on the primary's block set
    from bandit.stats import trajectory

    tau = trajectory.block_tokens(t, trajectory.block_mask(t))
    pj = t.drafters.index(r.primary)
    assert r.bon_gain.value == pytest.approx(tau.max(1).sum() / tau[:, pj].sum() - 1)
    p = t.drafters.index(r.primary)
    alts = [j for j in range(len(t.drafters)) if j != p]
    assert r.bon_speedup().value == pytest.approx(r.costs.speedup(p, alts, 1.0, r.bon_gain.value))
    assert r.bon_speedup().lo <= r.bon_speedup().value <= r.bon_speedup().hi
    # given one run as PATHS without --out, the report goes beside that run and nowhere else
    before = set(tmp_path.rglob("*"))
    be.main([tmp_path / "sim"])  # every option at its default (issue 24: else printed only)
    new = set(tmp_path.rglob("*")) - before
    assert {p.name for p in new} == {"breakeven.txt", "breakeven.png", "breakeven.csv"}
    assert all(p.parent == tmp_path / "sim" for p in new)


def test_engine_costs_replace_the_verification_and_name_the_engine():
    from bandit.stats.costmodel import engine_costs
    from bandit.logs.errors import InputError

    manifest = {
        "k": 3,
        "timing": {
            "verify_ms": {"tokens": [1, 4], "ms": [10.0, 16.0]},
            "verify_batch_ms": {"drafts": [1, 2], "ms": [16.0, 20.0]},
            "drafter_ms": {"a": 2.0, "b": 8.0},
        },
    }
    engine = {
        "engine": "vllm 0.32.0 cpu",
        "hardware": {"cpu": "X"},
        "timing": {
            "verify_ms": {"tokens": [1, 4], "ms": [4.0, 5.0]},
            "verify_batch_ms": {"drafts": [1, 2], "ms": [5.0, 7.5]},
            "drafter_ms": {"a": 0.5},
        },
    }
    c = engine_costs(["a", "b"], manifest, engine)
    # by hand: verify(k + 1 = 4) is the engine's 5.0 ms; a timed by the engine, b keeps the harness's 8.0 ms
    assert c.rho.tolist() == pytest.approx([0.5 / 5.0, 8.0 / 5.0])
    assert c.alpha(1) == pytest.approx(7.5 / 5.0 - 1)
    assert "vllm 0.32.0 cpu" in c.hardware and "b: the harness's call times" in c.hardware
    with pytest.raises(InputError, match="engine"):
        engine_costs(["a", "b"], manifest, {"timing": {}})
    with pytest.raises(InputError, match="lacks drafter_ms for b"):
        engine_costs(["a", "b"], {"k": 3}, engine)
