"""Same inputs and seed, same bytes (issue 24): ci.json does not depend on the BLAS thread count, nor on
which reader (cache or not) saw the log."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_limits

from bandit import ci
from bandit.sim.simulate import SimConfig, write_sim_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("det") / "run"
    write_sim_run(SimConfig(n_prompts=24, out_len=48, seed=5), d)
    return d


def _ci_bytes(run, tmp_path, name, threads, cache):
    out = tmp_path / name
    with threadpool_limits(limits=threads):
        ci.main([run], out=out, n_resamples=200, n_refit=20)
    return out.read_bytes()


def test_ci_json_identical_across_blas_thread_counts_and_readers(run, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBANDIT_CACHE", "off")
    one = _ci_bytes(run, tmp_path, "one.json", 1, False)
    monkeypatch.setenv("SPECBANDIT_CACHE", str(tmp_path / "cache"))
    two = _ci_bytes(run, tmp_path, "two.json", 2, True)
    again = _ci_bytes(run, tmp_path, "again.json", 4, True)  # read from the cached copy this time
    assert one == two == again
