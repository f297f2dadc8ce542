"""bench/pass_cost.py: the direct measurement times every size on a tiny target; the fitted
step cost it prints beside it is the wallclock.json's, interpolated between its knots as numpy interpolates."""

import json

import numpy as np
import pytest

from bench import pass_cost
from harness.models.tiny import make_zoo


def test_measure_times_every_size_on_a_tiny_target(tmp_path):
    z = make_zoo(tmp_path)
    got, ran = pass_cost.measure(z["target"], context=12, qs=[1, 3, 5], reps=2)
    assert list(got) == [1, 3, 5] and all(v > 0 for v in got.values())
    assert ran["kernels"] in ("mkldnn", "aten") and ran["requested"] == "default" and ran["dtype"] == "float32"
    assert ran["floor_ms"] > 0 and ran["bandwidth_gbs"] > 0 and ran["threads"] >= 1


def test_the_fitted_column_interpolates_the_runs_knots(tmp_path):
    coef = {"prefill": 1.0, "prompt_token": 0.1, "pass@1": 10.0, "pass@2": 10.0, "pass@3": 11.0, "pass@5": 20.0}
    (tmp_path / "wallclock.json").write_text(json.dumps({"model": {"coef_ms": coef}}))
    got = pass_cost.fitted(tmp_path, [1, 2, 4, 5])
    assert got == pytest.approx(dict(zip([1, 2, 4, 5], np.interp([1, 2, 4, 5], [1, 2, 3, 5], [10, 10, 11, 20]))))
    (tmp_path / "wallclock.json").write_text(json.dumps({"model": {"coef_ms": {"pass": 3.0}}}))
    assert pass_cost.fitted(tmp_path, [1]) is None  # the earlier linear model has no knots
    assert pass_cost.fitted(tmp_path / "none", [1]) is None


def test_a_missing_target_is_one_line(tmp_path):
    from bandit.logs.errors import InputError

    with pytest.raises(InputError, match="no model directory"):
        pass_cost.main(["--target", str(tmp_path / "nope")])
